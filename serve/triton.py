"""``ptopt package --format triton``: a Triton Inference Server model repository.

    OUT/                       (the repository: point tritonserver --model-repository at it)
      NAME/config.pbtxt        inputs/outputs (names, dims, data types), max_batch_size, dynamic batching
      NAME/1/model.onnx        platform onnxruntime_onnx, or
      NAME/1/model.pt          platform pytorch_libtorch (inputs NAME__i, outputs output__i), or
      NAME/1/model.pt2         an AOTInductor package: backend pytorch, platform torch_aoti
                               (inputs INPUT__i, outputs OUTPUT__i; max_batch_size 0)

Dims and the batch come from the InputSpec: a dynamic batch dimension becomes ``max_batch_size``
(the spec's max batch) and leaves the dims; other dynamic dimensions become -1. For ONNX the graph's
own inputs and outputs decide names and dims, so the config always matches the model file.

AOTInductor packages: Triton's PyTorch backend loads them with ``platform: "torch_aoti"`` since
Triton 26.03 (beta; ordinal ``INPUT__i``/``OUTPUT__i`` names resolved from the package's call spec
since 26.05), and its README says request batching (batch sizes above 1, sequence batching) is not
done for them yet. So the repository sets ``max_batch_size: 0`` (the batch is the first of the
dims, -1 when dynamic: a client sends whole batches) and ``--batch-size`` above 1 is refused. An
ExportedProgram ``.pt2`` is not a format Triton loads; it is exported to TorchScript first.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

from ptopt.core.artifact import Artifact, staged_dir
from ptopt.core.formats import get_format
from ptopt.core.inputspec import InputSpec, make_inputs

TRITON_DTYPES = {
    "float32": "TYPE_FP32",
    "float16": "TYPE_FP16",
    "bfloat16": "TYPE_BF16",
    "float64": "TYPE_FP64",
    "int64": "TYPE_INT64",
    "int32": "TYPE_INT32",
    "int16": "TYPE_INT16",
    "int8": "TYPE_INT8",
    "uint8": "TYPE_UINT8",
    "bool": "TYPE_BOOL",
}
#: ONNX files up to this size are rewritten with their weights inside (one self-contained model.onnx)
_INLINE_ONNX_LIMIT = 1 << 30


def _tensor(name: str, dtype: str, dims: list[int]) -> dict[str, Any]:
    return {"name": name, "data_type": TRITON_DTYPES.get(dtype, "TYPE_FP32"), "dims": dims}


def _spec_io(spec: InputSpec, batched: bool) -> list[int]:
    dims = [lo if lo == hi else -1 for lo, hi in zip(spec.min_shape, spec.max_shape, strict=False)]
    return dims[1:] if batched else dims


def _batched(specs: list[InputSpec]) -> bool:
    return all(s.rank >= 1 and s.min_shape[0] != s.max_shape[0] for s in specs)


def _onnx_io(path: Path, specs: list[InputSpec]) -> tuple[list[dict], list[dict], int]:
    """Inputs, outputs and max_batch_size from the ONNX graph itself."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    inits = {i.name for i in model.graph.initializer}

    def dims_of(vi: Any) -> tuple[list[int], str]:
        t = vi.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim]
        return dims, onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name

    graph_inputs = [(vi.name, *dims_of(vi)) for vi in model.graph.input if vi.name not in inits]
    graph_outputs = [(vi.name, *dims_of(vi)) for vi in model.graph.output]
    batched = all(d and d[0] == -1 for _, d, _ in graph_inputs) and _batched(specs)
    max_batch = min(s.max_shape[0] for s in specs) if batched else 0
    cut = 1 if batched else 0
    inputs = [_tensor(n, dt, d[cut:]) for n, d, dt in graph_inputs]
    outputs = [_tensor(n, dt, d[cut:]) for n, d, dt in graph_outputs]
    return inputs, outputs, max_batch


def _torchscript_io(
    path: Path, specs: list[InputSpec], style: str, aoti: bool = False
) -> tuple[list[dict], list[dict], int]:
    """Inputs from the specs; outputs (count, dims, dtypes) from running the model once.

    ``aoti``: an AOTInductor package (torch_aoti): no server-side batching, ordinal names."""
    import torch

    from ptopt.core.inputspec import call_model

    batched = _batched(specs) and not aoti
    max_batch = min(s.max_shape[0] for s in specs) if batched else 0
    names = [f"INPUT__{i}" if aoti else f"{s.name}__{i}" for i, s in enumerate(specs)]
    inputs = [_tensor(n, s.dtype, _spec_io(s, batched)) for n, s in zip(names, specs, strict=True)]
    if aoti:
        # trusted: prepare() asked for allow_pickle; the format's loader checks the torch version (and, under
        # an untested torch, that the package loads without crashing this process)
        model = get_format("aoti_package").reload(Path(path))
    else:
        model = torch.jit.load(str(path), map_location="cpu").eval()
    x = make_inputs(specs, style, which="opt")
    with torch.inference_mode():
        out = call_model(model, x)
    flat = (
        list(out.values())
        if isinstance(out, dict)
        else list(out)
        if isinstance(out, (tuple, list))
        else [out]
    )
    outputs = []
    for i, t in enumerate(flat):
        if t.is_quantized:
            t = t.dequantize()
        dims = list(t.shape)
        if batched:
            dims = dims[1:]
        elif aoti and _batched(specs) and dims:
            dims[0] = -1  # the package's batch is dynamic: so is its output's
        name = f"OUTPUT__{i}" if aoti else f"output__{i}"
        outputs.append(_tensor(name, str(t.dtype).replace("torch.", ""), dims))
    return inputs, outputs, max_batch


def config_pbtxt(
    name: str,
    platform: str,
    max_batch_size: int,
    inputs: list[dict],
    outputs: list[dict],
    *,
    preferred_batch: int | None,
    max_delay_us: int,
    instances: int,
    threads: int | None,
    backend_param: str,
) -> str:
    def block(kind: str, items: list[dict]) -> list[str]:
        lines = [f"{kind} ["]
        for j, t in enumerate(items):
            lines += [
                "  {",
                f'    name: "{t["name"]}"',
                f"    data_type: {t['data_type']}",
                f"    dims: [ {', '.join(str(d) for d in t['dims'])} ]",
                "  }" + ("," if j < len(items) - 1 else ""),
            ]
        return lines + ["]"]

    lines = [f'name: "{name}"']
    if platform == "torch_aoti":  # the PyTorch backend's AOTInductor loader
        lines.append('backend: "pytorch"')
    lines += [f'platform: "{platform}"', f"max_batch_size: {max_batch_size}"]
    lines += block("input", inputs) + block("output", outputs)
    if max_batch_size > 0:
        lines += ["dynamic_batching {"]
        if preferred_batch and preferred_batch > 1:
            lines += [f"  preferred_batch_size: [ {min(preferred_batch, max_batch_size)} ]"]
        lines += [f"  max_queue_delay_microseconds: {max_delay_us}", "}"]
    lines += ["instance_group [", "  {", f"    count: {instances}", "    kind: KIND_CPU", "  }", "]"]
    if threads:
        lines += [
            "parameters {",
            f'  key: "{backend_param}"',
            f'  value: {{ string_value: "{threads}" }}',
            "}",
        ]
    return "\n".join(lines) + "\n"


def write_repository(prep: Any, output: Path, name: str, config: dict[str, Any]) -> Artifact:
    """Write the repository for a prepared model (see ``ptopt.serve.prepare.prepare``)."""
    row = get_format(prep.format)
    platform, filename = row.triton_platform, "model" + row.suffix
    if row.runtime == "onnxruntime":
        inputs, outputs, max_batch = _onnx_io(prep.path, prep.inputs)
        param = "intra_op_thread_count"
    else:
        aoti = platform == "torch_aoti"  # no server-side batching, ordinal names
        inputs, outputs, max_batch = _torchscript_io(prep.path, prep.inputs, prep.input_style, aoti)
        param = "INTRA_OP_THREAD_COUNT"
    text = config_pbtxt(
        name,
        platform,
        max_batch,
        inputs,
        outputs,
        preferred_batch=config["batch_size"],
        max_delay_us=int(config["max_batch_delay_ms"]) * 1000,
        instances=config["workers"],
        threads=config["threads"],
        backend_param=param,
    )
    output = Path(output)
    with staged_dir(output) as stage:
        (stage / name / "1").mkdir(parents=True)
        (stage / name / "config.pbtxt").write_text(text, encoding="utf-8")
        dest = stage / name / "1" / filename
        if row.runtime == "onnxruntime" and sum(f.stat().st_size for f in prep.files) < _INLINE_ONNX_LIMIT:
            import onnx

            from ptopt.formats.onnx_export import save_onnx

            save_onnx(
                onnx.load(str(prep.path)), dest, external=False
            )  # weights inline: one self-contained file
        else:
            shutil.copy2(prep.path, dest)
            for f in prep.files:  # external data keeps the name the graph refers to
                if f != prep.path:
                    shutil.copy2(f, dest.parent / f.name)
        written = sorted(p.relative_to(stage) for p in stage.rglob("*") if p.is_file())
    files = [f"{output.name}/{p.as_posix()}" for p in written]
    config = dict(config, platform=platform, max_batch_size=max_batch)
    art = Artifact(
        output,
        "triton",
        inputs=list(prep.inputs),
        input_style=prep.input_style,
        config=config,
        parent=prep.parent,
        precision=prep.precision,
        files=files,
        outputs=[{"name": o["name"], "dtype": o["data_type"], "dims": o["dims"]} for o in outputs],
        extra={"model_name": name, "model_format": prep.format, "inputs": inputs},
    )
    return art.finalize()


# -- reading config.pbtxt back (the subset ptopt writes) ---------------------------------------

_TOKEN = re.compile(r'\s*(?:(#[^\n]*)|("(?:[^"\\]|\\.)*")|([\[\]{}:,])|([^\s\[\]{}:,"]+))')


def read_config(path: str | Path) -> dict[str, Any]:
    """Parse a config.pbtxt (protobuf text format) into dicts; repeated fields become lists."""
    text = Path(path).read_text(encoding="utf-8")
    tokens = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            if text[pos:].strip():
                raise ValueError(f"{path}: cannot parse at {text[pos : pos + 20]!r}")
            break
        pos = m.end()
        if m.group(1):
            continue
        tokens.append(m.group(2) or m.group(3) or m.group(4))
    value, _ = _parse_fields(tokens, 0, end=None)
    return value


def _scalar(tok: str) -> Any:
    if tok.startswith('"'):
        return bytes(tok[1:-1], "utf-8").decode("unicode_escape")
    for cast in (int, float):
        try:
            return cast(tok)
        except ValueError:
            pass
    return tok


def _parse_value(tokens: list[str], i: int) -> tuple[Any, int]:
    tok = tokens[i]
    if tok == "{":
        return _parse_fields(tokens, i + 1, end="}")
    if tok == "[":
        items, i = [], i + 1
        while tokens[i] != "]":
            if tokens[i] == ",":
                i += 1
                continue
            v, i = _parse_value(tokens, i)
            items.append(v)
        return items, i + 1
    return _scalar(tok), i + 1


def _parse_fields(tokens: list[str], i: int, end: str | None) -> tuple[dict[str, Any], int]:
    out: dict[str, Any] = {}
    while i < len(tokens) and tokens[i] != end:
        if tokens[i] == ",":
            i += 1
            continue
        key = tokens[i]
        i += 1
        if tokens[i] == ":":
            i += 1
        value, i = _parse_value(tokens, i)
        if key in out:
            prev = out[key]
            out[key] = (prev if isinstance(prev, list) else [prev]) + (
                value if isinstance(value, list) else [value]
            )
        else:
            out[key] = value
    return out, i + 1
