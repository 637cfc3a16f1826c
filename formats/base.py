"""What a format module defines: one :class:`Format` row, everything ptopt knows about that format.

A row says what the format is (sidecar ``format`` name, file suffixes, the ``export --target`` that
writes it, the precisions export converts to, the devices it builds on, the servers that run it as it
is, whether loading it runs native code) and does the format's work:

- ``sniff(path)``: whether a file without a sidecar is this format (suffix and contents);
- ``load(path, artifact, allow_pickle)``: a MODEL file as a ``core.modelref.LoadedModel``;
- ``write(module, path, ...)``: an in-memory model as this format's file(s) (``export.writers``);
- ``reload(path, ...)``: the written file loaded back the way a user loads it (for the parity check);
- ``runner(name, loaded)``: the validate runner that runs it in its own runtime;
- ``describe(loaded)``: what its graph says without running it (``ptopt inspect`` of a file without a
  torch module: outputs, weight count and bytes, the precision its weights say);
- ``check_config`` / ``check_available`` / ``export_options``: what ``ptopt export`` asks of it.

The table itself lives in ``ptopt.core.formats`` (core reads it without importing this package);
``ptopt.formats`` registers every module's row at ``import ptopt``. Rows import torch and their
runtime lazily: the table is read by ``ptopt --help``.
"""

from __future__ import annotations

import contextlib
import zipfile
from pathlib import Path
from typing import Any, ClassVar

from ptopt.core.errors import ModelLoadError, UsageError
from ptopt.core.formats import with_article

#: half precisions: weights and floating-point activations in float16 / bfloat16
HALF = ("fp16", "bf16")
#: every precision an artifact may have
PRECISIONS = ("fp32", "fp16", "bf16", "int8")


class Format:
    """One artifact format (see the module docstring). Subclasses set the class attributes and
    override what the format does; the defaults refuse."""

    #: the sidecar's ``format``
    name: ClassVar[str] = ""
    #: how docs and reports name it
    label: ClassVar[str] = ""
    #: file suffixes it conventionally has (the first is what ptopt writes)
    suffixes: ClassVar[tuple[str, ...]] = ()
    #: ``ptopt export --target`` name (None: ptopt does not write it through export)
    target: ClassVar[str | None] = None
    #: runtime family, what ``optimize --runtime`` filters on: torch | onnxruntime | openvino | tensorrt
    runtime: ClassVar[str] = "torch"
    #: the runtime as reports name it (default: the family; AOTInductor says ``aoti``)
    runtime_label: ClassVar[str] = ""
    #: precisions ``export`` converts an fp32 model to (besides keeping the source's)
    converts: ClassVar[tuple[str, ...]] = ()
    #: device kinds ``export`` builds it on
    devices: ClassVar[tuple[str, ...]] = ("cpu", "cuda")
    #: servers that run the file as it is (``torchserve``, ``triton``, ``ray``); others get TorchScript first
    servers: ClassVar[tuple[str, ...]] = ()
    #: a causal language model: a server generates text with it (tokenizer in, text out), not tensors
    generates_text: ClassVar[bool] = False
    #: the Python distributions its runtime needs (their versions go into every sidecar and report)
    packages: ClassVar[tuple[str, ...]] = ()
    #: the Triton Inference Server platform that runs it (when ``triton`` is among ``servers``)
    triton_platform: ClassVar[str | None] = None
    #: the artifact is a folder (``sniff`` is asked about folders only for these)
    folder: ClassVar[bool] = False
    #: load() gives a model (False: a package or weights, never run)
    loadable: ClassVar[bool] = True
    #: why it cannot be run by validate (None: it can)
    not_runnable: ClassVar[str | None] = None
    #: export may start from a model loaded from it (it holds a PyTorch module to capture again)
    reexportable: ClassVar[bool] = True
    #: its loaded model is a Python-callable graph ``torch.compile`` can take (``validate --compile``)
    compilable: ClassVar[bool] = False
    #: loading it runs native code from the file: only with ``allow_pickle`` (trust)
    trusted_load: ClassVar[bool] = False
    #: half precision means half-precision weights (False: the runtime enables half kernels itself)
    half_weights: ClassVar[bool] = True
    #: captured from the model on the CPU whatever ``--device`` is (it runs there through its runtime)
    captured_on_cpu: ClassVar[bool] = False
    #: int8 from an int8 PyTorch source is made by quantizing its fp32 parent again with this format's
    #: own quantizer (calibration data needed); False with int8 in ``converts``: export an fp32 model
    requantizes_int8: ClassVar[bool] = False
    #: keyword options ``write`` takes
    write_options: ClassVar[frozenset[str]] = frozenset()
    #: the kernel libraries its runtime dispatches into on the CPU (``ptopt.core.isa.LIBRARIES``): which of
    #: them a CPU level caps decides whether ``validate --isa`` can emulate that level for it
    isa_libraries: ClassVar[tuple[str, ...]] = ("aten", "onednn", "mkl", "fbgemm")
    #: sniffing order (lower first): formats whose test is stricter go first
    sniff_rank: ClassVar[int] = 50
    #: where the target is listed among ``export --target`` choices (lower first)
    target_order: ClassVar[int] = 100

    @property
    def suffix(self) -> str:
        return self.suffixes[0] if self.suffixes else ""

    @property
    def runs_on(self) -> str:
        """The runtime as reports name it."""
        return self.runtime_label or self.runtime

    def __repr__(self) -> str:
        return f"<format {self.name}>"

    # -- reading -----------------------------------------------------------------------------------
    def sniff(self, path: Path) -> bool:
        """Whether ``path`` (no trusted sidecar) is this format."""
        return False

    def load(self, path: Path, art: Any, allow_pickle: bool) -> Any:
        """``path`` as a ``ptopt.core.modelref.LoadedModel`` (``art``: its trusted sidecar or None)."""
        raise ModelLoadError(f"{path}: {with_article(self.kind_of(path))} is not a model ptopt loads")

    def kind_of(self, path: Path) -> str:
        """What ``path`` is, for messages: "TorchServe .mar file", "Ray Serve application folder"
        (a folder is never called a file; a label that names its container is not repeated)."""
        label = self.label or self.name
        noun = "folder" if path.is_dir() else "file"
        last = label.rsplit(" ", 1)[-1].lower()
        return label if last in ("folder", "repository", "directory", "file", noun) else f"{label} {noun}"

    def check_file(self, path: Path) -> None:
        """A quick check that ``path`` loads (ModelLoadError), made before anything is measured."""

    def files(self, path: Path) -> list[Path]:
        """Every file of the artifact at ``path`` (the main one first), for its size."""
        return [path]

    def describe(self, loaded: Any) -> dict[str, Any]:
        """What the file's graph says without running it, for ``ptopt inspect`` of a model without a torch
        module: ``outputs`` (``name``, ``shape``: ints, a dynamic dim as text, ``dtype``), ``parameters``
        and ``parameter_bytes`` (its weights), ``weights`` (counts and bytes by kind), ``weight_dtypes``
        (dtype -> element count) and ``precision`` (the one its graph records, else None: inspect
        reads the weights' dtypes then, and says so).
        Empty: nothing is read (a format ptopt runs as a torch module)."""
        return {}

    # -- writing -----------------------------------------------------------------------------------
    def write(self, module: Any, path: Path, **kw: Any) -> dict[str, Any]:
        """Write ``module`` at ``path``; returns the writer's info (``files``, and facts for ``extra``).
        Keywords: ``specs``, ``style``, ``example``, ``source_format``, ``precision``, ``device`` and
        the format's own ``write_options``."""
        raise UsageError(f"ptopt does not write {self.label or self.name} files")

    def extra_facts(self, info: dict[str, Any], specs: Any) -> dict[str, Any]:
        """Sidecar ``extra`` entries derived from the writer's info (beyond the info itself)."""
        return {}

    def reload(self, path: Path, *, style: str = "positional", device: str = "cpu", **kw: Any) -> Any:
        """The written file loaded the way a user loads it, callable like its source."""
        raise UsageError(f"cannot load {self.label or self.name} files back")

    def relocate(self, path: Path, dest: Path, files: list[str]) -> list[str]:
        """Copy the checked files at ``path`` to ``dest`` (another name); the new file names."""
        import shutil

        renamed = [dest.name + f[len(path.name) :] for f in files]
        for old, new in zip(files, renamed, strict=True):
            shutil.copyfile(path.parent / old, dest.parent / new)
        return renamed

    # -- running -----------------------------------------------------------------------------------
    def runner(self, name: str, loaded: Any, **kw: Any) -> Any:
        """The validate runner for a model loaded from this format."""
        raise ModelLoadError(f"{name}: cannot be run: it is {self.not_runnable or self.name}")

    # -- export ------------------------------------------------------------------------------------
    def check_config(self, config: Any) -> None:
        """What this target refuses in an ExportConfig (precision, device); raises UsageError."""
        on_cuda = config.on_cuda
        if config.device is not None and ("cuda" if on_cuda else "cpu") not in self.devices:
            raise UsageError(f"--device {config.device} is not available for --target {self.target}")
        if config.precision == "fp16" and not on_cuda:
            raise UsageError(
                "--precision fp16 on the CPU: CPU kernels for float16 are missing or slow and nothing "
                "deploys fp16 there; use --precision bf16 on the CPU, or fp16 with --device cuda"
            )

    def check_available(self, config: Any) -> None:
        """What must be installed for this export, checked before the model loads."""

    def export_options(self, source: Any, config: Any, calib: Any, **kw: Any) -> tuple[dict, dict | None]:
        """The writer's options for this export, and for int8 the record of the model quantized."""
        return {}, None

    def needs_calibration(self, config: Any) -> bool:
        """Whether an int8 export to this format needs calibration data (``--data``)."""
        return True

    def export_context(self, module: Any) -> Any:
        """A context the export and its check run in (None as its value: nothing to record)."""
        return contextlib.nullcontext(None)


def zip_names(path: Path) -> list[str]:
    """The member names of a zip archive (empty when ``path`` is not one)."""
    try:
        with zipfile.ZipFile(path) as z:
            return z.namelist()
    except (OSError, zipfile.BadZipFile):
        return []


def loaded_model(ref: Any, fmt: str, module: Any, path: Path, art: Any, **kw: Any) -> Any:
    """A ``LoadedModel`` for a file, its input specs from the sidecar (``specs``/``style`` defaults)."""
    from ptopt.core.modelref import LoadedModel

    specs, style = kw.pop("specs", []), kw.pop("style", "positional")
    if art is not None:
        specs, style = list(art.inputs) or specs, art.input_style if art.inputs else style
        if module is not None and isinstance(art.extra.get("output_layer"), str):
            from ptopt.core.scores import remember_layer

            remember_layer(module, art.extra["output_layer"])
    return LoadedModel(str(ref), fmt, module, path, art, list(specs), style, kw.pop("info", {}))
