"""ptopt.serve."""
