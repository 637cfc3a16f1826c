"""The pruner files of the pruning table: each module registers its pruner(s) with
``ptopt.compress.prune.registry.register_pruner``. The table imports every module of this package the
first time it is read, so a new method is a new file here (plus its config): no list names them."""
