"""The compatibility matrix: real-world models × ptopt stages, each cell run through the Python API.

A cell either **passes** (its artifact runs and its outputs are compared with the fp32 model's:
cosine of the logits and top-1 agreement) or **refuses** with one line that names what ptopt
cannot handle and the way out. ``tests/compat/test_matrix.py`` asserts every cell against
``EXPECTED``; ``python -m tests.compat.matrix > docs/compat.md`` writes the table from a real run.

Models (random weights, built from their libraries' configs, see ``tests.compat.models``):
torchvision ResNet-18, MobileNetV3-Small, EfficientNet-B0 at 32×32; timm ViT-Tiny (32×32, patch 8,
2 blocks); Hugging Face BERT classifier and GPT-2 LM (2 layers, hidden 64, 16 tokens, padded
batches with an attention mask).
"""

from __future__ import annotations

import dataclasses
import math
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tests.compat import models as M

#: samples per batch of every cell (calibration, comparison)
BATCH = 8


@dataclasses.dataclass(frozen=True)
class Model:
    name: str
    library: str
    factory: Callable[[], Any]
    kind: str  # image | text (ids + attention mask) | tokens (one tensor of ids)
    image: int = M.IMAGE
    #: in the pytest suite (tests/compat/test_matrix.py); the others only in this script
    ci: bool = True


MODELS = [
    Model("resnet18", "torchvision", M.resnet18, "image"),
    Model("mobilenet_v3_small", "torchvision", M.mobilenet_v3_small, "image"),
    Model("efficientnet_b0", "torchvision", M.efficientnet_b0, "image"),
    Model("vit_tiny", "timm", M.vit_tiny, "image"),
    Model("bert", "transformers", M.bert, "text"),
    Model("gpt2", "transformers", M.gpt2, "text"),
    Model("lstm", "torch", M.lstm_classifier, "tokens"),
    Model("gru", "torch", M.gru_classifier, "tokens"),
    Model("convnext_tiny", "torchvision", M.convnext_tiny, "image", M.LARGE_IMAGE, ci=False),
    Model("resnet50", "torchvision", M.resnet50, "image", M.LARGE_IMAGE, ci=False),
]
BY_NAME = {m.name: m for m in MODELS}


@dataclasses.dataclass
class Cell:
    """What one stage did to one model: ``passes`` with measurements, or ``refuses`` with a message."""

    model: str
    stage: str
    status: str  # passes | refuses
    detail: str
    seconds: float
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    result: Any = None  # the Result (or path) a later cell may reuse
    #: a refusal's suggested way out, run: "what was run → what it did" ("" when none is named)
    suggestion: str = ""


# -- inputs and outputs ------------------------------------------------------------------------------


def inputs(
    kind: str, batch: int = BATCH, seq: int = M.SEQ, seed: int = 0, left: bool = False, image: int = M.IMAGE
) -> Any:
    """A batch: images, token ids alone (``tokens``), or token ids with an attention mask (row i has
    i % 4 padded positions, at the end, or at the start with ``left``: how decoder models are batched
    for generation)."""
    g = torch.Generator().manual_seed(seed)
    if kind == "image":
        return torch.randn(batch, 3, image, image, generator=g)
    ids = torch.randint(1, M.VOCAB, (batch, seq), generator=g)
    if kind == "tokens":
        return ids
    mask = torch.ones(batch, seq, dtype=torch.long)
    for i in range(batch):
        if i % 4:
            mask[i, seq - i % 4 :] = 0
    if left:
        mask = mask.flip(1)
    return {"input_ids": ids * mask, "attention_mask": mask}


def logits(out: Any) -> torch.Tensor:
    """The logits of a model's output: a tensor, a Hugging Face ModelOutput / dict, or a tuple."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict):
        return out["logits"] if "logits" in out else next(iter(out.values()))
    if isinstance(out, (tuple, list)):
        return logits(out[0])
    if hasattr(out, "logits"):
        return out.logits
    raise TypeError(f"no logits in a {type(out).__name__}")


def run(model: Any, x: Any) -> torch.Tensor:
    with torch.inference_mode():
        out = model(**x) if isinstance(x, dict) else model(x)
    return logits(out).float()


def compare(ref: torch.Tensor, out: torch.Tensor, x: Any = None) -> dict[str, float]:
    """Minimum cosine over positions and top-1 agreement (text: over unmasked tokens only for GPT-2's
    per-token logits; a classifier's one row per sample)."""
    a, b = ref.reshape(-1, ref.shape[-1]), out.reshape(-1, out.shape[-1])
    keep = torch.ones(a.shape[0], dtype=torch.bool)
    if isinstance(x, dict) and ref.dim() == 3:
        keep = x["attention_mask"].reshape(-1).bool()
    a, b = a[keep], b[keep]
    cos = torch.nn.functional.cosine_similarity(a, b, dim=-1)
    return {"cosine": float(cos.min()), "top1": float((a.argmax(-1) == b.argmax(-1)).float().mean())}


def onnx_outputs(path: Path, x: Any) -> torch.Tensor:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    feeds = x if isinstance(x, dict) else {sess.get_inputs()[0].name: x}
    names = {i.name for i in sess.get_inputs()}
    out = sess.run(None, {k: v.numpy() for k, v in feeds.items() if k in names})
    return torch.from_numpy(out[0]).float()


def _fmt(metrics: dict[str, float]) -> str:
    parts = []
    for k, v in metrics.items():
        parts.append(f"{k} {v:.4f}" if k == "cosine" else f"{k} {v:.2f}")
    return ", ".join(parts)


def _size(res: Any) -> str:
    """The int8 file against the fp32 TorchScript, and the share of parameters that is int8."""
    ratio = res.metrics.get("size_ratio_vs_fp32_torchscript")
    share = (res.extra.get("int8_share") or {}).get("parameters")
    parts = [
        f"{ratio:.2f}× the fp32 file" if ratio else "",
        f"{100 * share:.0f}% of parameters int8" if share is not None else "",
    ]
    return "".join(f"; {p}" for p in parts if p)


# -- the stages ---------------------------------------------------------------------------------------


class Matrix:
    """Runs cells lazily and remembers them (validate reuses the artifacts of the cells before it)."""

    STAGES = (
        "quantize dynamic",
        "quantize static",
        "prune structured",
        "prune global",
        "export torchscript",
        "export onnx",
        "validate",
    )

    def __init__(self, workdir: Path, follow: bool = False):
        self.workdir = Path(workdir)
        self.follow = follow  # run each refusal's suggested way out (``Cell.suggestion``)
        self.cells: dict[tuple[str, str], Cell] = {}
        self._models: dict[str, tuple[Any, Any, torch.Tensor]] = {}

    def fp32(self, name: str) -> tuple[Any, Any, torch.Tensor]:
        """(model, batch, fp32 logits), built once."""
        if name not in self._models:
            spec = BY_NAME[name]
            model, x = spec.factory(), inputs(spec.kind, image=spec.image)
            self._models[name] = (model, x, run(model, x))
        return self._models[name]

    def release(self, name: str) -> None:
        """Forget a model's weights and results once its row is done (memory, not correctness)."""
        self._models.pop(name, None)
        for key, cell in self.cells.items():
            if key[0] == name and not isinstance(cell.result, os.PathLike):  # a file's path costs nothing
                cell.result = None

    def cell(self, name: str, stage: str) -> Cell:
        from ptopt.core.errors import PtoptError

        key = (name, stage)
        if key not in self.cells:
            fn = getattr(self, "_" + stage.replace(" ", "_"))
            t0 = time.perf_counter()
            try:
                metrics, detail, result = fn(BY_NAME[name])
                status = "passes"
            except PtoptError as e:
                metrics, result, status = {}, None, "refuses"
                detail = str(e).replace(str(self.workdir), "WORKDIR")
            self.cells[key] = Cell(name, stage, status, detail, time.perf_counter() - t0, metrics, result)
            if status == "refuses" and self.follow:
                self.cells[key].suggestion = self.follow_suggestion(self.cells[key])
        return self.cells[key]

    def follow_suggestion(self, cell: Cell) -> str:
        """Run the way out a refusal names, as its CLI flags' keyword arguments in the Python API
        (``--exclude A`` → ``exclude=["A"]``...): ``"what was run → passes (numbers) | refuses: ..."``,
        or "" when the message names nothing this knows how to run."""
        import re

        import ptopt
        from ptopt.core.errors import PtoptError

        name, stage, d = cell.model, cell.stage, cell.detail
        m, x, ref = self.fp32(name)
        excludes = [e.strip("'\"").rstrip(";,)") for e in re.findall(r"--exclude ('[^']+'|\S+)", d)]
        mode = stage.split()[-1]
        data = {"calib_data": x, "engine": "fx"} if mode == "static" else {}  # the cell's engine
        model = m if mode == "static" else self.loaded(name)
        if stage.startswith("quantize") and "--min-cosine" in d:
            what = "--eval-data (the batch) --min-cosine 0.99"
            fn, args, kw = ptopt.quantize, (model, mode), {**data, "eval_data": x, "min_cosine": 0.99}
        elif stage.startswith("quantize") and excludes:
            what = " ".join(f"--exclude {e}" for e in excludes)
            fn, args, kw = ptopt.quantize, (model, mode), {**data, "exclude": excludes}
        elif stage == "prune structured" and excludes:
            what = " ".join(f"--exclude {e}" for e in excludes)
            fn, args, kw = ptopt.prune, (self.loaded(name), "structured", 0.3), {"exclude": excludes}
        elif "--mode dynamic" in d:
            return self._cell_outcome("--mode dynamic", self.cell(name, "quantize dynamic"))
        elif "global pruning need no graph" in d or "use --method global" in d:
            return self._cell_outcome("--method global", self.cell(name, "prune global"))
        else:
            return ""
        if fn is ptopt.quantize:
            kw["progress"] = False
        try:
            res = fn(*args, **kw)
        except PtoptError as e:
            return f"`{what}` → refuses: {str(e).replace(str(self.workdir), 'WORKDIR')}"
        return f"`{what}` → passes ({_fmt(compare(ref, run(res.model, x), x))})"

    @staticmethod
    def _cell_outcome(what: str, other: Cell) -> str:
        if other.status == "passes":
            return f"`{what}` → passes ({other.detail})"
        return f"`{what}` → refuses: {other.detail}"

    def loaded(self, name: str) -> Any:
        """The fp32 model with input specs of batch [1, BATCH] from the batch (not [1, 64]): the
        stages' parity checks run at the largest batch, which is not what this suite measures."""
        from ptopt.core.inputspec import input_style, specs_from_example
        from ptopt.core.modelref import as_loaded

        m, x, _ = self.fp32(name)
        loaded = as_loaded(m)
        loaded.input_specs, loaded.input_style = specs_from_example(x, max_batch=BATCH), input_style(x)
        return loaded

    def _out(self, model: Model, stage: str) -> Path:
        path = self.workdir / model.name / stage.replace(" ", "-")
        path.mkdir(parents=True, exist_ok=True)
        return path

    # each returns (metrics, detail, result)
    def _quantize_dynamic(self, model: Model):
        import ptopt

        _, x, ref = self.fp32(model.name)
        res = ptopt.quantize(self.loaded(model.name), "dynamic", progress=False)
        res.save(self._out(model, "quantize dynamic") / "model.int8.pt")
        metrics = compare(ref, run(res.model, x), x)
        detail = _fmt(metrics) + _size(res)
        metrics["size"] = res.metrics["size_ratio_vs_fp32_torchscript"]  # the int8 file / the fp32 one
        return metrics, detail, res

    def _quantize_static(self, model: Model):
        """torch.fx graph mode; transformers (fx cannot trace them) through the PT2E engine, as fx's
        refusal advises: its int8 ExportedProgram (``compile=False``, ``--no-compile``), whose outputs
        the AOTInductor package reproduces; compiling BERT's package is tests/compress/test_pt2e_hf.py's
        (30-70 s of C++ compile per model, not repeated here)."""
        import ptopt

        m, x, ref = self.fp32(model.name)
        # fx named: the default engine, auto, would search float layers where fx's refusal is the cell
        engine = {"engine": "pt2e", "compile": False} if model.kind == "text" else {"engine": "fx"}
        res = ptopt.quantize(m, "static", calib_data=x, progress=False, **engine)
        metrics = compare(ref, run(res.model, x), x)
        return metrics, _fmt(metrics) + _size(res), res

    def _prune(self, model: Model, method: str, amount: float):
        import ptopt
        from ptopt.compress.stage import count_nonzero_parameters, count_parameters

        m, x, ref = self.fp32(model.name)
        res = ptopt.prune(self.loaded(model.name), method, amount)
        before = count_parameters(m)
        kept = count_parameters(res.model) if method == "structured" else count_nonzero_parameters(res.model)
        metrics = {"kept": kept / before} | compare(ref, run(res.model, x), x)
        return (
            metrics,
            f"keeps {kept / before:.2f} of the parameters; "
            + _fmt({k: v for k, v in metrics.items() if k != "kept"}),
            res,
        )

    def _prune_structured(self, model: Model):
        return self._prune(model, "structured", 0.3)

    def _prune_global(self, model: Model):
        return self._prune(model, "global", 0.5)

    def _export_torchscript(self, model: Model):
        import ptopt

        _, x, ref = self.fp32(model.name)
        res = ptopt.export(self.loaded(model.name), "torchscript")
        metrics = compare(ref, run(res.model, x), x)
        return metrics, _fmt(metrics), res

    def _export_onnx(self, model: Model):
        """Dynamic batch (and sequence for text): ORT runs two other shapes than the export's."""
        import ptopt
        from ptopt.core.hf import is_causal_lm

        m, x, _ = self.fp32(model.name)
        if is_causal_lm(m):
            return self._export_onnx_lm(model)
        path = self._out(model, "export onnx") / "model.onnx"
        if model.kind == "image":
            side = f"3x{model.image}x{model.image}"
            shapes = dict(min_shape=f"1x{side}", opt_shape=f"2x{side}", max_shape=f"{BATCH}x{side}")
        elif model.kind == "tokens":
            shapes = dict(
                min_shape="1x4:int64", opt_shape=f"2x{M.SEQ}:int64", max_shape=f"{BATCH}x{2 * M.SEQ}:int64"
            )
        else:
            names = ("input_ids", "attention_mask")
            shapes = {
                f"{w}_shape": [f"{n}={b}x{s}:int64" for n in names]
                for w, b, s in (("min", 1, 4), ("opt", 2, M.SEQ), ("max", BATCH, 2 * M.SEQ))
            }
        ptopt.export(m, "onnx", path, **shapes)
        worst: dict[str, float] = {}
        for batch, seq, left in ((3, M.SEQ, False), (BATCH, 2 * M.SEQ - 5, True)):
            y = inputs(model.kind, batch=batch, seq=seq, seed=batch, left=left, image=model.image)
            got = compare(run(m, y), onnx_outputs(path, y), y)
            worst = {k: min(v, worst.get(k, math.inf)) for k, v in got.items()}
        shown = {
            "image": "batch 3 and 8",
            "tokens": f"batch×tokens 3×{M.SEQ} and 8×{2 * M.SEQ - 5}",
        }.get(model.kind, f"batch×tokens 3×{M.SEQ} (right-padded) and 8×{2 * M.SEQ - 5} (left-padded)")
        return worst, f"ORT at {shown}: " + _fmt(worst), path

    def _export_onnx_lm(self, model: Model):
        """A causal LM exports with its KV cache (docs/export.md): the folder's model, run as transformers
        is, at two batches; both sides get the positions generation gives a padded row."""
        import ptopt

        m, _, _ = self.fp32(model.name)
        folder = self._out(model, "export onnx") / "lm"
        res = ptopt.export(m, "onnx", folder, dynamic_batch=f"1:2:{BATCH}")
        worst: dict[str, float] = {}
        for batch, seq, left in ((3, M.SEQ, False), (BATCH, 2 * M.SEQ - 5, True)):
            y = inputs(model.kind, batch=batch, seq=seq, seed=batch, left=left)
            mask = y["attention_mask"]
            y["position_ids"] = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
            got = compare(run(m, y), run(res.model, y), y)
            worst = {k: min(v, worst.get(k, math.inf)) for k, v in got.items()}
        shown = f"batch×tokens 3×{M.SEQ} (right-padded) and {BATCH}×{2 * M.SEQ - 5} (left-padded)"
        return worst, f"ORT, with its KV cache, at {shown}: " + _fmt(worst), folder

    def _validate(self, model: Model):
        """The reference and the artifacts of the cells before (those that passed), at batch 1 and 8. A
        causal LM's ONNX folder (with its KV cache) is not among them: validate scores such a folder on
        text (perplexity, tokens/s), not on this batch."""
        import ptopt

        m, x, _ = self.fp32(model.name)
        paths = [self._out(model, "export onnx") / "model.onnx"]
        paths.append(self._out(model, "quantize dynamic") / "model.int8.pt")
        for stage in ("export onnx", "quantize dynamic"):
            self.cell(model.name, stage)
        paths = [p for p in paths if p.is_file()]
        res = ptopt.validate(m, paths, x, batch_sizes=(BATCH,), min_iters=3, min_seconds=0.05, rounds=1)
        agreements = [e["agreement"] or {} for e in res.entries]
        metrics = {"cosine": min(a.get("cosine") or 0.0 for a in agreements)}
        top1 = [a["top1_agreement"] for a in agreements if a.get("top1_agreement") is not None]
        if top1:
            metrics["top1"] = min(top1)
        names = ", ".join(e["name"] for e in res.entries)
        return metrics, f"{names} at batch {BATCH}: worst " + _fmt(metrics), res


def run_matrix(
    names: list[str] | None = None,
    workdir: Path | None = None,
    follow: bool = True,
    after_row: Callable[[list[Cell]], None] | None = None,
) -> list[Cell]:
    """Every cell of the models ``names`` (default: all), in stage order; with ``follow``, each
    refusal's suggested way out is run too (``Cell.suggestion``)."""
    own = None
    if workdir is None:
        own = tempfile.TemporaryDirectory(prefix="ptopt-compat-")
        workdir = Path(own.name)
    matrix = Matrix(workdir, follow=follow)
    cells = []
    for name in names or list(BY_NAME):
        for stage in Matrix.STAGES:
            cells.append(matrix.cell(name, stage))
        matrix.release(name)
        if after_row is not None:
            after_row(cells)
    if own is not None:
        own.cleanup()
    return cells


# -- the report ---------------------------------------------------------------------------------------

_DOC_HEAD = """# Compatibility: real-world models through every stage

Written by `{command}` from an actual run ({when}, {seconds:.0f} s; do not edit by hand; `--models
a,b` re-runs single rows). `tests/compat/test_matrix.py` asserts the same cells in CI, except the
rows of ConvNeXt-Tiny and ResNet-50 (too slow for CI's 2 cores: this script only). Models have
random weights and are built from their libraries' configs at small sizes (see
`tests/compat/models.py`): torchvision ResNet-18, MobileNetV3-Small and EfficientNet-B0 at
3×{image}×{image}, ResNet-50 and ConvNeXt-Tiny at 3×{large}×{large} (BatchNorm statistics taken
from 64 random images, as training would set them); timm ViT-Tiny at {image}×{image}
(patch 8, 2 blocks); Hugging Face `BertForSequenceClassification` and `GPT2LMHeadModel` (2 layers,
hidden 64, {seq} tokens, padded batches with an attention mask); LSTM and GRU classifiers
(embedding 32 → one LSTM / GRU layer of 64 → Linear-ReLU-Linear head, {seq} token ids, no mask).
Every cell runs through the Python
API on a batch of {batch} and compares with the fp32 model: **cosine** is the minimum over samples
(tokens for GPT-2, padding excluded), **top1** the arg-max agreement. A cell either passes or refuses
with one line naming what ptopt cannot handle and the way out; that way out is then run (its
CLI flags as the Python API's keyword arguments) and what it did is listed under
[Refusals and their way out](#refusals-and-their-way-out). Pruning is shown without
fine-tuning: on random weights it moves the outputs a lot, so its cosine is reported, not bounded
(ptopt records it as `vs_source` in the sidecar and prints it, never as a faithful copy).

| stage | what runs |
| --- | --- |
| quantize dynamic | `ptopt.quantize(model, "dynamic")`, saved as TorchScript |
| quantize static | `ptopt.quantize(model, "static", calib_data=batch, engine="fx")` \
(torch.fx; transformers: `engine="pt2e", compile=False`, int8 ExportedProgram) |
| prune structured | `ptopt.prune(model, "structured", 0.3)`; *kept*: parameters left |
| prune global | `ptopt.prune(model, "global", 0.5)`; *kept*: non-zero parameters left |
| export torchscript | `ptopt.export(model, "torchscript")` (its own parity check, then ours) |
| export onnx | `ptopt.export(model, "onnx")`, dynamic batch (and sequence): ONNX Runtime at other shapes |
| validate | `ptopt.validate` of the fp32 model, the ONNX and the dynamic int8 artifacts at batch {batch} |

## torchvision beside the CPU torch

PyPI's torchvision 0.28.0 (the release for torch 2.13) is a CUDA build: its C++ ops cannot load
beside the CPU torch and `import torchvision` fails (`operator torchvision::nms does not exist`);
transformers and timm import torchvision when it is installed, so they fail too. The
classification models need none of those ops. Install it without letting pip touch torch
(`pip install --no-deps torchvision==0.28.0`), then define the two op names before the first import:

```python
import torch

lib = torch.library.Library("torchvision", "DEF")  # keep a reference: the ops live as long as it
lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
lib.define("qnms(Tensor qdets, Tensor scores, float iou_threshold) -> Tensor")
import torchvision  # now imports; detection ops (nms) are not usable
```

`tests.compat.models.ensure_torchvision_ops()` does this only when the extension does not load.

## torch versions: 2.11 to 2.13

ptopt installs with `torch>=2.11,<2.14`. **2.13** (the CPU wheel) is the release every test runs on;
**2.11** is what GPU machines ship (the lent H100 and H200 images have 2.11.0+cu130), and CI's second
job (`.ci/run`) runs a subset on it: the layout and format table, the zoo CNN through quantize, the
export targets of `tests/export/test_export_targets.py` and validate's API (AOTInductor under 2.11 was
checked by `benchmarks/probe_aoti_load.py` here, below, but its tests are not in that job: their package
fixture could not be timed under 2.11 on this loaded machine). What differs by version:

- **Loading an AOTInductor package** (validate, export's parity check, `load_model`, Triton). On 2.13:
  `torch._inductor.aoti_load_package` in the process. On any other release (2.11): each package is first
  loaded in a child process (`formats/aoti_files.py`, `TESTED_TORCH`); if torch's package loader crashes
  there, torch's model-container runner (`formats/aoti_container.py`) is tried in a child and, when it
  loads, used; else one line, exit 2.
- **A package built by another torch** is refused before loading, on every release (the version is in
  the package metadata).
- **torchvision** (the compat extra): 0.28.0 for 2.13, installed with `--no-deps` (section above); 0.26.0
  is 2.11's release, and CI's 2.11 job installs no extras.
- **torchao** (PT2E int8, weight-only LLM int8/int4): tested with 0.18 on 2.13; not tested on 2.11 (it is
  not on the GPU image either).

`PTOPT_AOTI_LOAD_CHECK=1|0` forces the child check on or off, `PTOPT_AOTI_LOADER=package|container` picks a
loader. Measured on this project's CPU machine (AMD EPYC, avx2, 2 cores, other jobs running) with PyPI's
torch 2.11.0 x86_64 wheel (the CUDA build, 531 MB, plus 1.2 GB of nvidia-* wheels: a 5.0 GB venv with
ptopt's dependencies; it imports and runs without a GPU): the download took 36 s, the installs 8 minutes on
the loaded machine, and 336 tests (`tests/core`, the zoo, every export target, static int8, validate's API)
passed in 549 s. AOTInductor packages compile and load there with torch 2.11 (`benchmarks/probe_aoti_load.py`:
plain, with ptopt's options, and through `ptopt.export`), so the crash seen on the H100 image comes from that
image, not from torch 2.11 itself ([gpu.md](gpu.md)). No CPU-only torch 2.11 wheel is reachable (PyPI has
none for x86_64; the PyTorch CPU index is not reachable from here or CI).
"""


def markdown(
    cells: list[Cell], seconds: float, command: str = "python -m tests.compat.matrix", when: str = ""
) -> str:
    """The matrix as Markdown: one summary table, then every cell's measurement or message."""
    import platform

    import ptopt

    stages = list(Matrix.STAGES)
    rows = {}
    for c in cells:
        rows.setdefault(c.model, {})[c.stage] = c
    head = _DOC_HEAD.format(
        image=M.IMAGE,
        large=M.LARGE_IMAGE,
        seq=M.SEQ,
        batch=BATCH,
        command=command,
        when=when,
        seconds=seconds,
    )
    out = [head.rstrip(), "", "## The matrix", ""]
    out.append("| model | library | " + " | ".join(stages) + " |")
    out.append("| --- | --- | " + " | ".join("---" for _ in stages) + " |")
    for name, row in rows.items():
        marks = [
            ("passes" if row[s].status == "passes" else "**refuses**") if s in row else "" for s in stages
        ]
        out.append(f"| {name} | {BY_NAME[name].library} | " + " | ".join(marks) + " |")
    out += ["", "## Every cell", ""]
    for name, row in rows.items():
        out += [f"### {name}", ""]
        for s in stages:
            if s in row:
                c = row[s]
                detail = c.detail.replace("|", "/")
                out.append(f"- **{s}** {c.status} ({c.seconds:.1f} s): {detail}")
        out.append("")
    out += _suggestions(cells)
    versions = {"ptopt": ptopt.__version__, "torch": torch.__version__}
    for lib in ("torchvision", "timm", "transformers", "onnxruntime"):
        try:
            versions[lib] = __import__(lib).__version__
        except ImportError:
            versions[lib] = "not installed"
    out += [
        "## Matrix re-run",
        "",
        f"Last re-run {when or 'at an unrecorded time'} with `{command}` ({seconds:.0f} s for the rows above). "
        f"{platform.machine()}, {_machine()}, torch at {torch.get_num_threads()} threads; the machine is "
        "shared with other jobs (other agents' builds and tests), so the seconds per cell are those of a "
        "loaded machine, not a benchmark. Python "
        + platform.python_version()
        + "; "
        + ", ".join(f"{k} {v}" for k, v in versions.items())
        + ".",
        "",
    ]
    return "\n".join(out)


def _suggestions(cells: list[Cell]) -> list[str]:
    """The refusals, each with the way out its message names and what running it did."""
    refused = [c for c in cells if c.status == "refuses"]
    if not refused:
        return []
    out = ["## Refusals and their way out", "", "| model | stage | the suggestion, run | its result |"]
    out.append("| --- | --- | --- | --- |")
    for c in refused:
        what, _, result = c.suggestion.partition(" → ")
        out.append(
            f"| {c.model} | {c.stage} | {what or 'none runnable'} | {result.replace('|', '/') or '-'} |"
        )
    return [*out, ""]


def _machine() -> str:
    """The CPU's vector extensions and the load while it ran (other jobs share the machine)."""
    import os

    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        pass
    isa = [f for f in ("avx512f", "avx2") if f" {f}" in flags]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return f"{os.cpu_count()} cores ({', '.join(isa) or 'no AVX2'}; load average {load:.1f} at the end)"


def main(argv: list[str] | None = None) -> int:
    import os
    import sys
    import warnings

    os.environ.setdefault("TORCHAO_FORCE_SKIP_LOADING_SO_FILES", "1")
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tests.compat.matrix", description=__doc__.split("\n")[0])
    parser.add_argument("--models", help=f"comma-separated rows to run (default all: {','.join(BY_NAME)})")
    parser.add_argument("--no-follow", action="store_true", help="do not run the refusals' suggestions")
    parser.add_argument(
        "--out", help="write the page there after every row (a long run leaves the rows done)"
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    names = [n.strip() for n in args.models.split(",") if n.strip()] if args.models else None
    unknown = sorted(set(names or ()) - set(BY_NAME))
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(BY_NAME)}")
    M.ensure_torchvision_ops()
    torch.set_num_threads(2)  # the CI machine's cores
    warnings.simplefilter("ignore")  # the deprecations listed in pyproject's filterwarnings
    t0 = time.perf_counter()
    nice = os.nice(0) if hasattr(os, "nice") else 0
    command = (
        (f"nice -n {nice} " if nice else "")
        + "python -m tests.compat.matrix"
        + "".join(f" {a}" for a in (sys.argv[1:] if argv is None else argv))
        + ("" if args.out else " > docs/compat.md")
    )

    def page(cells: list[Cell]) -> str:
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        return markdown(cells, time.perf_counter() - t0, command, when)

    def write(cells: list[Cell]) -> None:
        if args.out:
            Path(args.out).write_text(page(cells), encoding="utf-8")

    cells = run_matrix(names, follow=not args.no_follow, after_row=write)
    if not args.out:
        sys.stdout.write(page(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
