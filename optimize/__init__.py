"""ptopt optimize: the fastest deployable artifact within an accuracy budget, across techniques,
formats and runtimes."""
