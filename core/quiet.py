"""Upstream noise stops at ptopt's boundary: the one helper that silences a library's loggers,
warnings and (optionally) its prints while ptopt calls it and reports the outcome itself.

C++ warnings (``TORCH_WARN``: ``[W1123 03:12:18.29 Quantizer.cpp:111] Warning: ...``) are written
by libtorch straight to file descriptor 2, past Python's ``warnings`` filters and ``sys.stderr``;
``silenced(native=True)`` catches them at the descriptor and drops only those warning lines, so a
genuine error printed there in the meantime still reaches the user.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

#: one line of a C++ warning from c10 (``TORCH_WARN`` / ``TORCH_WARN_ONCE``), or of an absl log that a
#: library's native code writes while it probes (OpenVINO's TensorFlow frontend trying an IR it cannot
#: parse: ``E0000 00:00:17957.. 14470 text_format.cc:417] Error parsing text-format ...``)
NATIVE_WARNING = re.compile(
    r"^(\[W\d{4} [0-9:.]+ [^\]]*\] Warning: |[EWI]\d{4} [0-9:.]+ +\d+ [\w.]+:\d+\] "
    r"|WARNING: All log messages before absl::InitializeLog\(\))"
)


@contextlib.contextmanager
def silenced(
    loggers: Iterable[str],
    *,
    streams: bool = False,
    level: int = logging.ERROR,
    native: bool = False,
    native_stdout: bool = False,
) -> Iterator[None]:
    """Raise ``loggers`` to ``level``, ignore warnings and, with ``streams``, swallow stdout/stderr
    for the block; with ``native``, drop C++ warning lines written to file descriptor 2 too (see the
    module docstring); with ``native_stdout``, drop all that native code writes to descriptor 1 (the
    TorchScript ONNX exporter's C++ log: its whole graph when it fails). Every logger gets its own level
    back afterwards."""
    saved = [(lg, lg.level) for lg in map(logging.getLogger, loggers)]
    sink = io.StringIO()
    try:
        for lg, _ in saved:
            lg.setLevel(level)
        with warnings.catch_warnings(), contextlib.ExitStack() as stack:
            warnings.simplefilter("ignore")
            if native:
                stack.enter_context(_descriptor_filtered(sys.__stderr__, NATIVE_WARNING.match))
            if native_stdout:
                stack.enter_context(_descriptor_filtered(sys.__stdout__, lambda line: True))
            if streams:
                stack.enter_context(contextlib.redirect_stdout(sink))
                stack.enter_context(contextlib.redirect_stderr(sink))
            yield
    finally:
        for lg, lv in saved:
            lg.setLevel(lv)


@contextlib.contextmanager
def _descriptor_filtered(stream: Any, drop: Callable[[str], Any]) -> Iterator[None]:
    """The file descriptor of ``stream`` (``sys.__stderr__``, ``sys.__stdout__``) into a temporary file
    for the block; afterwards every line ``drop`` does not match goes on to it. A no-op where the
    stream is no file descriptor (a test runner's captured stream): nothing native reaches it there
    anyway."""
    try:
        fd = stream.fileno() if stream is not None else -1
    except (AttributeError, ValueError, io.UnsupportedOperation):
        fd = -1
    if fd < 0:
        yield
        return
    _flush(stream)
    saved = os.dup(fd)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), fd)
        try:
            yield
        finally:
            _flush(stream)
            os.dup2(saved, fd)
            os.close(saved)
            tmp.seek(0)
            text = tmp.read().decode("utf-8", "replace")
            kept = [ln for ln in text.splitlines(keepends=True) if not drop(ln)]
            if kept:
                os.write(fd, "".join(kept).encode("utf-8"))


def _flush(stream: Any) -> None:
    """``stream`` and the current ``sys.stdout`` / ``sys.stderr`` (which may buffer onto its descriptor)."""
    for s in (stream, sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            s.flush()


#: loggers of the libraries whose import prints notices that are not the user's business: torchao
#: (``Failed to load ..._C_mxfp8...so`` on a machine without CUDA; ``Skipping import of cpp
#: extensions``), torch's pytree (``register_constant() on Enum subclasses is deprecated``, as torchao
#: registers its Enums) and transformers
IMPORT_NOISE = ("torchao", "torch.utils._pytree", "transformers")
#: torchao reads it once, at its import: don't try to load the CUDA kernels
TORCHAO_SKIP_SO = "TORCHAO_FORCE_SKIP_LOADING_SO_FILES"


@contextlib.contextmanager
def quiet_imports() -> Iterator[None]:
    """Around an import ptopt makes that may import torchao (the PT2E engine; a user's model factory
    that builds a transformers model): their import notices are dropped (the loggers of
    ``IMPORT_NOISE`` raised to ERROR, their warnings ignored) and, on a machine without CUDA only,
    torchao is told not to load its CUDA kernels (``TORCHAO_FORCE_SKIP_LOADING_SO_FILES=1``, unless
    it is set already). The loggers and the environment are as they were afterwards; on a CUDA
    machine the environment is never touched (torchao's kernels load there as they should)."""
    import torch

    skip = TORCHAO_SKIP_SO not in os.environ and not torch.cuda.is_available()
    saved = [(lg, lg.level) for lg in map(logging.getLogger, IMPORT_NOISE)]
    if skip:
        os.environ[TORCHAO_SKIP_SO] = "1"
    try:
        for lg, _ in saved:
            lg.setLevel(logging.ERROR)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", module=r"(torchao|transformers|torch\.utils\._pytree)(\.|$)")
            yield
    finally:
        for lg, lv in saved:
            lg.setLevel(lv)
        if skip:
            os.environ.pop(TORCHAO_SKIP_SO, None)
