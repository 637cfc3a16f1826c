"""The NNCF ``compress_weights`` + OpenVINO peer of ``bench_llm.py`` (issue 28), on files.

The conversion (the KV cache as explicit tensors, then optimum-intel's stateful transformation), NNCF's
data-free weight compression and the runner are ptopt's own (``ptopt.formats.openvino_lm``, what
``ptopt quantize --mode weight-only --engine openvino`` runs). The peer is what a user writes with
OpenVINO and NNCF alone: ``nncf.compress_weights(ov_model, mode=...)`` of the IR with the defaults
(int8 asymmetric per channel; int4 symmetric, group 64, ratio 1.0), compiled with the plugin's
defaults or a stated inference precision. This module keeps those steps on IR files, as the peer writes
them; ``convert`` writes the IR once for every peer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ptopt.formats import openvino_lm
from ptopt.formats.openvino_lm import Output, cache_shape  # noqa: F401 - the peer's names


def convert(model: Any, path: Path) -> Path:
    """``model`` (an HF causal LM) as a stateful OpenVINO IR at ``path`` (.xml + .bin); returns ``path``."""
    import openvino as ov

    ov.save_model(openvino_lm.convert(model), path, compress_to_fp16=False)
    return path


def compress(src: Path, dst: Path, mode: str, group_size: int = -1) -> Path:
    """``nncf.compress_weights`` of the IR at ``src`` (``mode``: ``int8_asym`` / ``int4_sym`` ...)."""
    import nncf
    import openvino as ov

    ov_model = ov.Core().read_model(src)
    kwargs = {"group_size": group_size, "ratio": 1.0} if mode.startswith("int4") else {}
    ov_model = nncf.compress_weights(ov_model, mode=nncf.CompressWeightsMode(mode), **kwargs)
    ov.save_model(ov_model, dst, compress_to_fp16=False)
    return dst


def constant_bytes(path: Path) -> int:
    """Bytes of the IR's constants (its weights as stored)."""
    import openvino as ov

    return openvino_lm.constant_bytes(ov.Core().read_model(path))


class OpenVINOLM(openvino_lm.OpenVINOLM):
    """The runner of ``ptopt.formats.openvino_lm`` on an IR file (``precision``: the inference precision
    hint, None for the plugin's default)."""

    def __init__(self, path: Path, config: Any, threads: int, precision: str | None = None) -> None:
        import openvino as ov

        super().__init__(ov.Core().read_model(path), config, threads, precision)
        self.path = Path(path)

    def file_bytes(self) -> int:
        return self.path.stat().st_size + self.path.with_suffix(".bin").stat().st_size
