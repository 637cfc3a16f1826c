"""The options of ``ptopt validate`` / ``ptopt.validate``: each declared once, as a field of the
config it belongs to (``ptopt.core.options``):

=================  ==============================================================================
class              fields
=================  ==============================================================================
``Settings``       batch sizes, threads, metric, samples, device, providers, torch.compile, baseline
``Gates``          the pass/fail rules (``ptopt.validate.gates``)
``LatencyOptions`` how long each model is timed (``ptopt.validate.latency``)
``ReportPaths``    where the JSON / JUnit / Markdown / HTML reports go
``LMOptions``      perplexity window and generation timing of a language model (``ptopt.validate.lm``)
``LMGates``        a language model's gates (``ptopt.validate.gates``)
=================  ==============================================================================

Which of them apply depends on what is validated (``KIND``): a causal language model REFERENCE with
text data (``lm``) takes its own path, everything else is ``model``. :func:`resolve` turns the
twin's keywords into one :class:`Validation`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ptopt.core.errors import MissingDependencyError, UsageError
from ptopt.core.options import Options, Selector, drop_without_partner, option
from ptopt.validate.gates import Gates, LMGates
from ptopt.validate.latency import LatencyOptions
from ptopt.validate.lm import LMOptions

DEFAULT_BATCH_SIZES = (1, 32)
_MODEL = ("model",)


def parse_batch_sizes(value: Any) -> tuple[int, ...]:
    """``"1,32"``, ``32`` or ``(1, 32)`` → sorted unique positive ints."""
    items = str(value).split(",") if isinstance(value, (str, int)) else list(value)
    try:
        sizes = sorted({int(str(v).strip()) for v in items if str(v).strip()})
    except ValueError:
        raise UsageError(f"--batch-sizes {value!r}: write comma-separated integers, e.g. 1,32") from None
    if not sizes or sizes[0] < 1:
        raise UsageError(f"--batch-sizes {value!r}: batch sizes must be positive integers")
    return tuple(sizes)


@dataclasses.dataclass(frozen=True)
class Settings:
    """What every model runs with (None: each one's default, see the help)."""

    batch_sizes: tuple[int, ...] = option(
        DEFAULT_BATCH_SIZES, help="Batch sizes to time, comma-separated.", csv=True, applies=_MODEL
    )
    threads: int | None = option(
        None, help="Intra-op threads for every runtime (torch and ONNX Runtime). Default: all usable cores."
    )
    metric: Any = option(
        "top1",
        help="Task metric on the labels: top1, top5, mse, mae, or a function pkg.module:fn(outputs, labels).",
        applies=_MODEL,
    )
    max_samples: int | None = option(None, help="Use only the first N samples of the data.", applies=_MODEL)
    eval_batch_size: int | None = option(
        None,
        help="Batch size for the accuracy pass (one pass per artifact; default: the larger of 64 and the "
        "largest --batch-sizes).",
        applies=_MODEL,
    )
    device: str | None = option(
        None,
        help="cpu | cuda | cuda:N: run every artifact there (models moved once, each batch moved once, latency "
        "from CUDA events, peak GPU memory). Default: each runtime's own (the CPU; TensorRT a GPU).",
        applies=_MODEL,
    )
    providers: tuple[str, ...] = option(
        (),
        help="ONNX Runtime execution provider(s) to use, in order (default: TensorRT, CUDA when present, then "
        "CPU).",
        flag="--provider",
        repeat=True,
        applies=_MODEL,
    )
    compile: bool = option(
        False,
        help="Also run every eager / ExportedProgram model (the reference too) through torch.compile, as an "
        "extra row 'NAME (torch.compile)'; its compile time is reported. Needs a C++ compiler.",
        applies=_MODEL,
    )
    baseline: Any = option(
        None, help="A --json report of an earlier run to compare with.", path="in", applies=_MODEL
    )
    isa: tuple[str, ...] = option(
        (),
        help="Also judge every model at these CPU levels, comma-separated (native, sse41, avx, avx2, avx2_vnni, "
        "avx512, avx512_vnni, avx512_bf16, amx), each in a child process with the kernel libraries capped "
        "there: accuracy, and latency marked emulated; gates apply at every level. Levels above this CPU are "
        "refused.",
        csv=True,
        metavar="LEVELS",
        applies=_MODEL,
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "batch_sizes", parse_batch_sizes(self.batch_sizes or DEFAULT_BATCH_SIZES))
        for name in ("threads", "max_samples", "eval_batch_size"):
            value = getattr(self, name)
            if value is not None and int(value) < 1:
                raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
        object.__setattr__(self, "metric", self.metric or "top1")
        object.__setattr__(self, "compile", bool(self.compile))
        if self.isa:
            from ptopt.core.isa import check_levels

            if self.device is not None and not str(self.device).startswith("cpu"):
                raise UsageError(f"--isa emulates CPU levels; it does not apply to --device {self.device}")
            object.__setattr__(self, "isa", tuple(check_levels(self.isa)))


@dataclasses.dataclass(frozen=True)
class ReportPaths:
    """Where the reports go (None: not written)."""

    json_path: Any = option(None, help="Write the JSON report here.", flag="--json", path="out")
    junit_path: Any = option(
        None, help="Write JUnit XML (a test case per artifact x gate).", flag="--junit", path="out"
    )
    markdown_path: Any = option(
        None, help="Write Markdown for a pull-request comment.", flag="--markdown", path="out"
    )
    report_path: Any = option(
        None, help="Write a self-contained HTML report with plots.", flag="--report", path="out"
    )

    def check(self) -> None:
        """Every path writable, and matplotlib there for the HTML plots, before anything is measured."""
        for label, p in (
            ("json", self.json_path),
            ("junit", self.junit_path),
            ("markdown", self.markdown_path),
        ):
            if p is not None:
                _check_writable(label, Path(p))
        if self.report_path is not None:
            _check_writable("report", Path(self.report_path))
            import importlib.util

            if importlib.util.find_spec("matplotlib") is None:
                raise MissingDependencyError(
                    "--report draws its plots with matplotlib: pip install 'ptopt[report]'"
                )


def _check_writable(label: str, path: Path) -> None:
    """A report path must be writable before the measurements start (it is only written at the end)."""
    if path.is_dir():
        raise UsageError(f"--{label} {path} is a folder; give a file path")
    parent = path.parent.resolve()
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise UsageError(f"--{label} {path}: cannot write there ({parent} is not a writable folder)")


_KINDS = {"model": "a model on tensor data", "lm": "a causal language model with text --data"}

#: the options of ``ptopt validate``; the "selector" is what is validated, worked out from the
#: REFERENCE and the data (not an option of its own)
OPTIONS = Options(
    "validate",
    lambda: (Settings, Gates, LatencyOptions, ReportPaths, LMOptions, LMGates),
    Selector(
        "kind",
        "what is validated",
        lambda: tuple(_KINDS),
        label=lambda c: "language models" if c is LMOptions else "",
        describe=_KINDS.__getitem__,
        cli=False,
    ),
)


@dataclasses.dataclass(frozen=True)
class Validation:
    """Everything ``validate`` was asked, resolved: one typed object per concern."""

    kind: str
    settings: Settings
    gates: Gates
    latency: LatencyOptions
    reports: ReportPaths
    lm: LMOptions
    lm_gates: LMGates


def resolve(kind: str, gates: Any, latency: Any, options: Mapping[str, Any]) -> Validation:
    """The options of a ``kind`` validation (``model`` or ``lm``) from the twin's keywords: ``gates`` /
    ``latency`` objects (or mappings of their fields) or their fields as options, not both."""
    given = OPTIONS.check(options, kind)
    if kind == "lm" and gates is not None:
        raise UsageError("gates= does not apply to a causal language model on text (its gates: "
                         "--max-perplexity-increase, --min-tokens-per-s, --max-size-mb)")  # fmt: skip
    if kind == "lm" and latency is not None:
        raise UsageError("latency= does not apply to a causal language model on text (--rounds does)")
    settings, gates = _partnered(OPTIONS.build(Settings, given), OPTIONS.merge(Gates, gates, given, "gates"))
    return Validation(
        kind,
        settings,
        gates,
        OPTIONS.merge(LatencyOptions, latency, given, "latency"),
        OPTIONS.build(ReportPaths, given),
        OPTIONS.build(LMOptions, given),
        OPTIONS.build(LMGates, given),
    )


def _partnered(settings: Settings, gates: Gates) -> tuple[Settings, Gates]:
    """``--max-regression`` and ``--baseline`` need each other: one without the other is refused, or left
    out with a note where it is a soft default (set in the environment: ``drop_without_partner``)."""
    if gates.max_regression is not None and settings.baseline is None:
        drop_without_partner(
            "max_regression",
            "--max-regression needs --baseline previous.json (a --json report of an earlier run)",
        )
        return settings, dataclasses.replace(gates, max_regression=None)
    if settings.baseline is not None and gates.max_regression is None:
        drop_without_partner(
            "baseline", "--baseline needs --max-regression PCT (the regression that fails the run)"
        )
        return dataclasses.replace(settings, baseline=None), gates
    return settings, gates
