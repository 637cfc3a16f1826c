"""ptopt's reference model zoo (``zoo:NAME``): see ``ptopt.models.zoo``."""

from ptopt.models.zoo import ZOO, get_entry, load_zoo_model, train_zoo_model, zoo_info

__all__ = ["ZOO", "get_entry", "load_zoo_model", "train_zoo_model", "zoo_info"]
