"""Compression techniques: quantization, pruning, distillation, and the shared trainer.

Importing the package quiets upstream noise that loading a model for compression triggers (before
any of it can be imported): torchao's attempts to load its CUDA kernels on a CPU machine
(``Failed to load ..._C_mxfp8...so``), skipped with ``TORCHAO_FORCE_SKIP_LOADING_SO_FILES=1`` (and
its note that it skipped them), and
torch's ``_pytree`` notice about torchao registering Enums (``register_constant() on Enum
subclasses is deprecated``): neither is the user's business, both printed before ptopt's own output.
Imports no torch.
"""

from __future__ import annotations

import logging
import os

# before torchao can be imported (transformers imports it while building a model)
os.environ.setdefault("TORCHAO_FORCE_SKIP_LOADING_SO_FILES", "1")

#: (logger, what its upstream notice says) silenced here
_UPSTREAM_NOISE = (
    ("torchao", "Failed to load"),
    ("torchao", "Skipping import of cpp extensions"),
    ("torch.utils._pytree", "is an Enum subclass and is now natively supported"),
)


class _DropNotice(logging.Filter):
    def __init__(self, text: str):
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in str(record.msg)


def _quiet_upstream() -> None:
    for name, text in _UPSTREAM_NOISE:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropNotice) and f.text == text for f in logger.filters):
            logger.addFilter(_DropNotice(text))


_quiet_upstream()
