"""ptopt.cli."""
