"""Typed errors. Every problem a user can cause is a ``PtoptError``: the CLI prints its message on
one line (no traceback unless ``--debug``) and exits with its ``exit_code``.

Exit codes: 0 success, 1 a gate failed, 2 bad usage or input.
"""

from __future__ import annotations

EXIT_GATE_FAILED = 1
EXIT_BAD_INPUT = 2
#: validate: no gate failed, but a latency gate was within the timing noise (3 is an internal error)
EXIT_INCONCLUSIVE = 4


class PtoptError(Exception):
    """A problem the user can fix: bad input, bad options, a missing optional dependency."""

    exit_code = EXIT_BAD_INPUT


class UsageError(PtoptError):
    """Options that contradict each other or are out of range."""


class ModelLoadError(PtoptError):
    """A MODEL reference that cannot be loaded (missing file, unknown format, bad factory...)."""


class WeightsMismatchError(ModelLoadError):
    """A state_dict that does not fit the factory's model."""


class UnsafePickleError(ModelLoadError):
    """A pickled nn.Module given without ``--allow-pickle``."""


class DataError(PtoptError):
    """A DATA reference that cannot be loaded, or data that is unusable (empty, NaN, no labels...)."""


class ShapeMismatchError(DataError):
    """Data that does not fit the model: says what was expected and what was given."""

    def __init__(self, message: str, expected: object = None, got: object = None):
        details = []
        if expected is not None:
            details.append(f"expected {expected}")
        if got is not None:
            details.append(f"got {got}")
        super().__init__(message + (f" ({', '.join(details)})" if details else ""))
        self.expected = expected
        self.got = got


class UnsupportedModelError(PtoptError):
    """A model a technique cannot handle (e.g. graph mode cannot trace it). Says what to do instead."""


class MissingDependencyError(PtoptError):
    """An optional backend that is not installed here; the message says how to get it."""


class ParityError(PtoptError):
    """An exported artifact whose outputs drift from its source beyond tolerance."""


class OptionRenamed(FutureWarning):
    """An option given by an old spelling that still works (``ptopt.core.options``): the CLI prints it
    as one ``note:`` line."""


class OptionIgnored(UserWarning):
    """A soft default (an option set in the environment, ``ptopt.core.options.soft_options``) left out
    because the option it needs was not given: the CLI prints it as one ``note:`` line."""


class GateFailedError(PtoptError):
    """A validation gate failed (exit 1, reports are still written)."""

    exit_code = EXIT_GATE_FAILED


def clip(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters for a one-line message: cut at a word boundary, with "…"
    where something was cut (never mid-word)."""
    text = " ".join(text.split())
    if len(text) <= width:
        return text
    cut = text[: width - 1]
    return (cut.rsplit(" ", 1)[0] if " " in cut[width // 2 :] else cut).rstrip(" ,;:(") + "…"
