"""The handler files of the technique table: each module registers its row(s) with
``ptopt.compress.quantize.registry.register_technique``. The table imports every module of this
package the first time it is read, so a new technique is a new file here (plus its config): no list
names them. A handler file imports its engine inside its functions only (reading the table must not
import torch)."""
