"""ptopt's TorchServe handler: runs a TorchScript (fp32 or int8), ONNX, AOTInductor package (``.pt2``,
``torch._inductor.aoti_load_package``) or ExportedProgram (``.pt2``, fp32 or PT2E int8,
``torch.export.load``) artifact inside a worker.

Self-contained on purpose: it is copied into the .mar and runs where ptopt is not installed, so it
imports only the standard library, numpy, torch and (for ONNX) onnxruntime. What the model takes
comes from the artifact's sidecar (``<model file>.ptopt.json``), packaged next to it. An
AOTInductor package runs only on the torch that compiled it: a worker on another torch refuses to
load it, naming both versions.

Requests (one per HTTP call; TorchServe may hand several to one ``handle`` call when batching):

- JSON ``{"inputs": X}``: X is one sample (the input shape without the batch dimension) or a batch;
  for a keyword-input model (or several inputs) ``{"inputs": {"input_ids": ..., "attention_mask": ...}}``.
- raw ``.npy`` bytes (``Content-Type: application/octet-stream``), or ``.npz`` bytes with one array
  per input name for several inputs.

Response ``{"outputs": Y}``: the model's output for that sample (batch dimension dropped) or batch.
A request that doesn't fit the input spec answers 400 with ``{"error": ..., "expected": ...}`` (422
when it fits the spec but the model itself rejects it); the other requests of the same batch are
answered normally: the status is set per request, never by raising (TorchServe answers 503 then).
NaN and infinities are refused in inputs (400) and never written as JSON (an output holding one
answers 422). With ``PTOPT_SERVE_MAX_REQUEST_BYTES`` set (``ptopt serve --max-request-size``), a
bigger body answers 413 with the limit.

Devices: TorchServe gives each worker a GPU (``context.system_properties["gpu_id"]``, when the
server has GPUs). Where torch sees CUDA the model is loaded onto ``cuda:<gpu_id>`` and each batch is
moved there once; where it does not (a CPU-only torch, no driver), the worker runs on the CPU and
logs one line saying so. A half-precision artifact (the sidecar's ``precision`` fp16 / bf16) gets
its floating-point inputs cast to that dtype; outputs come back as float32.
"""

import importlib
import io
import json
import logging
import os

import numpy as np

logger = logging.getLogger(__name__)

SIDECAR_SUFFIX = ".ptopt.json"
_NPY_MAGIC = b"\x93NUMPY"
_ZIP_MAGIC = b"PK\x03\x04"
_FLOAT = {"float32", "float16", "bfloat16", "float64"}
#: set by ``ptopt serve``: the largest request body answered (bigger ones get 413 with this limit)
MAX_REQUEST_BYTES_ENV = "PTOPT_SERVE_MAX_REQUEST_BYTES"


def _max_request_bytes():
    try:
        return int(os.environ.get(MAX_REQUEST_BYTES_ENV, "")) or None
    except ValueError:
        return None


def _body_size(row):
    value = row.get("body")
    if value is None:
        value = row.get("data")
    if isinstance(value, (bytes, bytearray)):
        return len(value)
    if isinstance(value, str):
        return len(value.encode("utf-8", "replace"))
    return None


#: the CPU flags that decide which int8 / bf16 kernels run (``ptopt.core.system.ISA_FLAGS``: the sidecar's
#: ``cpu.int8_flags`` lists those the CPU it was checked on had)
INT8_FLAGS = (
    "avx2",
    "fma",
    "avx512f",
    "avx512_vnni",
    "avx512_bf16",
    "avx_vnni",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
)


def _cpu_flags(cpuinfo="/proc/cpuinfo"):
    try:
        with open(cpuinfo, encoding="utf-8") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return set(value.split())
    except OSError:
        pass
    return None


def cpu_moved(meta, name, cpuinfo="/proc/cpuinfo"):
    """One line when the artifact (its sidecar ``meta``) was checked on a CPU whose int8-relevant flags
    differ from this worker's, for an artifact whose numbers depend on them (int8 / half precisions,
    AOTInductor kernels); else None."""
    recorded = meta.get("cpu") or {}
    sensitive = (
        meta.get("precision") in ("int8", "int4", "bf16", "fp16") or meta.get("format") == "aoti_package"
    )
    flags = _cpu_flags(cpuinfo)
    if not sensitive or "int8_flags" not in recorded or flags is None:
        return None
    theirs, mine = set(recorded["int8_flags"]), {f for f in INT8_FLAGS if f in flags}
    if theirs == mine:
        return None
    lacks = ", ".join(f for f in INT8_FLAGS if f in theirs - mine)
    extra = ", ".join(f for f in INT8_FLAGS if f in mine - theirs)
    why = "; ".join(p for p in (lacks and f"this CPU lacks {lacks}", extra and f"it has {extra}, which that one "
                                                                               "had not") if p)  # fmt: skip
    return (
        f"{name} was checked on {recorded.get('model') or 'another CPU'} (level {recorded.get('level') or '?'}); "
        f"{why}: its int8/bf16 kernels differ here. Re-check it for this CPU: ptopt validate REFERENCE {name} "
        "--data DATA --isa LEVEL (this CPU's level, on any CPU that has it)"
    )


def _describe(spec, sample=False):
    """``input: [1..64]x1x8x8 float32`` (or without the batch dim for one sample); an integer input
    with the values it takes: ``input_ids: [1..64]x16 int64 in [0, 1000)``."""
    dims = []
    for lo, hi in zip(spec["min_shape"], spec["max_shape"], strict=False):
        dims.append(str(lo) if lo == hi else f"[{lo}..{hi}]")
    if sample:
        dims = dims[1:]
    text = "{}: {} {}".format(spec["name"], "x".join(dims) or "scalar", spec["dtype"])
    vr = spec.get("value_range")
    if vr is not None and spec["dtype"] not in _FLOAT and spec["dtype"] != "bool":
        text += f" in [{_num(vr[0])}, {_num(vr[1])})"
    return text


def _num(v):
    """A range bound as written: ``2`` for 2.0 (a sidecar's JSON may hold either)."""
    return int(v) if float(v).is_integer() else v


def _expected(specs):
    one = ", ".join(_describe(s, sample=True) for s in specs)
    batch = ", ".join(_describe(s) for s in specs)
    return f"one sample ({one}) or a batch ({batch})"


def _request_error(message, specs):
    """A client error: (message, expected) for the 400 answer."""
    return {"error": message, "expected": _expected(specs)}


#: what a request that TorchServe decoded as a form (no body left) is told
_FORM_BODY = (
    "no JSON body arrived: it was sent as form data (Content-Type application/x-www-form-urlencoded, what "
    "curl -d sends unless told otherwise), which TorchServe decodes into form fields, dropping a JSON body; "
    "send it with -H 'Content-Type: application/json' (any other type but a form's works), or .npy bytes"
)


def _decode_body(row):
    """The request payload: a parsed JSON value, or raw bytes; raises ValueError on malformed JSON.

    The body is read whatever its content type (JSON, text, none, octet-stream). A form body (curl -d's
    default type) reaches the handler as TorchServe's form fields, not as a body: see ``_form_body``."""
    value = row.get("body")
    if value is None:
        value = row.get("data")
    if value is None:
        return _form_body(row)
    if isinstance(value, (bytes, bytearray)):
        raw = bytes(value)
        if raw.startswith(_NPY_MAGIC) or raw.startswith(_ZIP_MAGIC):
            return raw
        try:
            return json.loads(raw.decode("utf-8"))  # NaN / Infinity parse; _check_array refuses them
        except (UnicodeDecodeError, ValueError) as e:
            raise ValueError(f'malformed JSON body ({e}); send {{"inputs": ...}} or .npy bytes') from None
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError as e:
            raise ValueError(f'malformed JSON body ({e}); send {{"inputs": ...}} or .npy bytes') from None
    return value


def _form_body(row):
    """A request TorchServe decoded as a form (its frontend parses an x-www-form-urlencoded or multipart
    body into fields and passes no body): one uploaded file (``curl -F f=@x.npy``), or a JSON text that
    held a ``=`` (split there into a field's name and value); else ValueError saying what to send."""
    if len(row) == 1:
        ((name, value),) = row.items()
        raw = bytes(value) if isinstance(value, (bytes, bytearray)) else str(value).encode("utf-8")
        if raw.startswith(_NPY_MAGIC) or raw.startswith(_ZIP_MAGIC):
            return raw
        for text in (raw.decode("utf-8", "replace"), f"{name}={raw.decode('utf-8', 'replace')}"):
            try:
                payload = json.loads(text)
            except ValueError:
                continue
            if isinstance(payload, dict):
                return payload
    raise ValueError(_FORM_BODY)


def _arrays_from_payload(payload, specs, style):
    """{name: np.ndarray} for one request, from a JSON value or .npy/.npz bytes."""
    names = [s["name"] for s in specs]
    if isinstance(payload, bytes):
        loaded = np.load(io.BytesIO(payload), allow_pickle=False)
        if isinstance(loaded, np.ndarray):
            if len(specs) != 1:
                raise ValueError(
                    f"the model takes {len(specs)} inputs ({', '.join(names)}): "
                    "send them as .npz with one array per name"
                )
            return {names[0]: loaded}
        with loaded:
            missing = [n for n in names if n not in loaded.files]
            if missing:
                raise ValueError(
                    ".npz is missing input(s) {} (has {})".format(", ".join(missing), ", ".join(loaded.files))
                )
            return {n: loaded[n] for n in names}
    if not isinstance(payload, dict):
        raise ValueError('the JSON body must be an object {"inputs": ...}')
    if "inputs" not in payload:
        keys = ", ".join(sorted(map(str, payload))[:5]) or "none"
        raise ValueError(f'the JSON body has no "inputs" key (its keys: {keys}); send {{"inputs": ...}}')
    inputs = payload["inputs"]
    if isinstance(inputs, dict):
        unknown = sorted(set(inputs) - set(names))
        missing = [n for n in names if n not in inputs]
        if unknown or missing:
            raise ValueError(
                "input names don't match the model's: expected {}, got {}".format(
                    ", ".join(names), ", ".join(sorted(inputs)) or "none"
                )
            )
        values = {n: inputs[n] for n in names}
    elif len(specs) == 1:
        values = {names[0]: inputs}
    else:
        raise ValueError(
            f"the model takes {len(specs)} inputs: send "
            + '{"inputs": {'
            + ", ".join(f'"{n}": ...' for n in names)
            + "}}"
        )
    out = {}
    for spec in specs:
        v = values[spec["name"]]
        try:
            arr = np.asarray(v)
        except ValueError:
            raise ValueError(
                "input {!r} is not a rectangular array of numbers".format(spec["name"])
            ) from None
        if arr.dtype == object or arr.dtype.kind not in "biuf":
            raise ValueError("input {!r} is not a rectangular array of numbers".format(spec["name"]))
        out[spec["name"]] = arr
    return out


def _check_array(arr, spec):
    """Validate one input against its spec; return (batch array in the spec dtype, was_one_sample)."""
    rank = len(spec["opt_shape"])
    one = arr.ndim == rank - 1
    if one:
        arr = arr[None, ...]
    if arr.ndim != rank:
        raise ValueError(
            "input {!r} has shape {}".format(
                spec["name"], "x".join(map(str, arr.shape[int(one) :])) or "scalar"
            )
        )
    for i, (d, lo, hi) in enumerate(zip(arr.shape, spec["min_shape"], spec["max_shape"], strict=False)):
        if i == 0:
            if d < 1:
                raise ValueError("input {!r} has an empty batch".format(spec["name"]))
            if d > hi:  # what the metadata and Triton's config promise (max_batch_size)
                raise ValueError(
                    "input {!r} has a batch of {} rows, over the model's {}".format(spec["name"], d, hi)
                )
            continue
        if not lo <= d <= hi:
            raise ValueError(
                "input {!r} has shape {}".format(spec["name"], "x".join(map(str, arr.shape[int(one) :])))
            )
    want = spec["dtype"]
    if want in _FLOAT:
        if arr.dtype.kind not in "biuf":
            raise ValueError("input {!r} has dtype {}".format(spec["name"], arr.dtype))
        arr = arr.astype(np.float32 if want == "bfloat16" else want, copy=False)
        if not np.isfinite(arr).all():
            raise ValueError(
                "input {!r} has NaN or infinite values: inputs must be finite".format(spec["name"])
            )
    elif want == "bool":
        if arr.dtype.kind not in "bi":
            raise ValueError("input {!r} has dtype {}, not bool/integer".format(spec["name"], arr.dtype))
        arr = arr.astype(bool, copy=False)
    else:
        if arr.dtype.kind not in "biu":
            raise ValueError(
                "input {!r} has dtype {}, not an integer type ({})".format(spec["name"], arr.dtype, want)
            )
        vr = spec.get("value_range")
        if vr is not None and arr.size and (arr.min() < vr[0] or arr.max() >= vr[1]):
            raise ValueError(f"input {spec['name']!r} has values outside [{_num(vr[0])}, {_num(vr[1])})")
        arr = arr.astype(want, copy=False)
    return np.ascontiguousarray(arr), one


def _to_list(x, lo, hi, one):
    """Rows [lo, hi) of a model output (array, or nested tuple/list/dict of arrays) as JSON values."""
    if isinstance(x, dict):
        return {k: _to_list(v, lo, hi, one) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_to_list(v, lo, hi, one) for v in x]
    part = x[lo:hi]
    return (part[0] if one else part).tolist()


class PtoptHandler:
    """Loads the artifact once per worker; ``handle`` validates, batches, runs and splits."""

    def __init__(self):
        self.initialized = False
        self.specs = []
        self.style = "positional"
        self.format = None
        self.model = None
        self.session = None
        self.max_batch = None
        self.device = "cpu"
        self.half = None  # "float16" / "bfloat16" for a half-precision artifact

    # -- loading ---------------------------------------------------------------------------
    def initialize(self, context):
        props = context.system_properties
        model_dir = props.get("model_dir")
        serialized = context.manifest["model"]["serializedFile"]
        model_path = os.path.join(model_dir, serialized)
        sidecar = model_path + SIDECAR_SUFFIX
        if not os.path.isfile(sidecar):
            raise RuntimeError(f"no sidecar {sidecar} in the .mar: package it with `ptopt package`")
        with open(sidecar, encoding="utf-8") as fh:
            meta = json.load(fh)
        self.specs = meta.get("inputs") or []
        if not self.specs:
            raise RuntimeError(f"the sidecar {sidecar} records no input specs")
        self.style = meta.get("input_style", "positional")
        self.format = meta.get("format")
        self.max_batch = min(s["max_shape"][0] for s in self.specs)
        options = (getattr(context, "model_yaml_config", None) or {}).get("handler") or {}
        threads = options.get("threads")
        self.device = _worker_device(props.get("gpu_id"))
        self.half = {"fp16": "float16", "bf16": "bfloat16"}.get(meta.get("precision"))
        if self.format == "onnx":
            self._load_onnx(model_path, threads)
        elif self.format == "openvino":
            self.session, self.onnx_inputs = _openvino_session(model_path, threads)
        else:
            import torch

            if threads:
                torch.set_num_threads(int(threads))
            self.model = _load_torch(model_path, self.format, meta, self.device)
        self.initialized = True
        moved = cpu_moved(meta, serialized)
        if moved:
            logger.warning(moved)
        logger.info(
            "ptopt handler ready: %s %s on %s%s, inputs %s",
            self.format,
            serialized,
            self.device,
            f" ({self.half})" if self.half else "",
            "; ".join(_describe(s) for s in self.specs),
        )

    def _load_onnx(self, model_path, threads):
        import onnxruntime as ort

        so = ort.SessionOptions()
        if threads:
            so.intra_op_num_threads = int(threads)
            so.inter_op_num_threads = 1
        providers = ["CPUExecutionProvider"]
        if self.device != "cpu":
            if "CUDAExecutionProvider" in ort.get_available_providers():
                index = int(self.device.partition(":")[2] or 0)
                providers = [("CUDAExecutionProvider", {"device_id": index}), "CPUExecutionProvider"]
            else:
                logger.info("onnxruntime here has no CUDA provider: the ONNX model runs on the CPU")
                self.device = "cpu"
        session = ort.InferenceSession(model_path, so, providers=providers)
        self.session = lambda feed: session.run(None, feed)  # the runtime's call, as for openvino
        self.onnx_inputs = [i.name for i in session.get_inputs()]

    # -- running ---------------------------------------------------------------------------
    def _run(self, arrays):
        """Model outputs (numpy, nested like the model's) for {name: batch array}."""
        if self.session is not None:
            if len(self.onnx_inputs) == len(self.specs):
                feed = {o: arrays[s["name"]] for o, s in zip(self.onnx_inputs, self.specs, strict=False)}
            else:
                feed = {n: arrays[n] for n in self.onnx_inputs}
            outs = self.session(feed)
            return outs[0] if len(outs) == 1 else list(outs)
        import torch

        tensors = {}
        for s in self.specs:
            t = torch.from_numpy(arrays[s["name"]])
            if t.is_floating_point() and (self.half or s["dtype"] == "bfloat16"):
                t = t.to(getattr(torch, self.half or "bfloat16"))
            tensors[s["name"]] = t.to(self.device)  # once per batch
        with torch.inference_mode():
            if self.style == "keyword":
                out = self.model(**tensors)
            else:
                out = self.model(*[tensors[s["name"]] for s in self.specs])
        return _outputs_to_numpy(out)

    def handle(self, data, context):
        if data is None:  # TorchServe's function-style init call; not used by the class entry point
            return None
        answers = [None] * len(data)
        good = []  # (idx, {name: batch array}, batch size, one sample?)
        limit = _max_request_bytes()
        for idx, row in enumerate(data):
            size = _body_size(row or {})
            if limit and size is not None and size > limit:
                message = (
                    f"the request body is {size} bytes, over the limit of {limit} bytes "
                    "(ptopt serve --max-request-size)"
                )
                self._reject(context, idx, answers, message, code=413, limit_bytes=limit)
                continue
            try:
                payload = _decode_body(row or {})
                arrays = _arrays_from_payload(payload, self.specs, self.style)
                checked = {}
                ones = set()
                for spec in self.specs:
                    arr, one = _check_array(arrays[spec["name"]], spec)
                    checked[spec["name"]] = arr
                    ones.add(one)
                sizes = {a.shape[0] for a in checked.values()}
                if len(ones) != 1 or len(sizes) != 1:
                    raise ValueError("inputs disagree on the batch size")
                good.append((idx, checked, sizes.pop(), ones.pop()))
            except Exception as e:  # noqa: BLE001 - anything wrong with one request is that client's error
                self._reject(context, idx, answers, str(e))
        # run the good requests together: same non-batch shapes, at most the spec's max batch per run
        groups = {}
        for item in good:
            key = tuple(item[1][s["name"]].shape[1:] for s in self.specs)
            groups.setdefault(key, []).append(item)
        for items in groups.values():
            chunk, rows = [], 0
            for item in items:
                if chunk and rows + item[2] > self.max_batch:
                    self._run_chunk(chunk, answers, context)
                    chunk, rows = [], 0
                chunk.append(item)
                rows += item[2]
            if chunk:
                self._run_chunk(chunk, answers, context)
        return answers

    def _run_chunk(self, chunk, answers, context):
        names = [s["name"] for s in self.specs]
        try:
            if len(chunk) == 1:
                out = self._run(chunk[0][1])
            else:
                out = self._run({n: np.concatenate([c[1][n] for c in chunk]) for n in names})
        except Exception as e:  # noqa: BLE001 - the model rejected the inputs
            if len(chunk) > 1:  # find the request it fails on; the others still get their answer
                for item in chunk:
                    self._run_chunk([item], answers, context)
                return
            logger.warning("model failed on request %d: %s", chunk[0][0], e)
            reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
            self._reject(context, chunk[0][0], answers, "the model failed on this input: " + reason, code=422)
            return
        pos = 0
        for idx, _, n, one in chunk:
            try:
                answers[idx] = json.dumps({"outputs": _to_list(out, pos, pos + n, one)}, allow_nan=False)
                context.set_response_content_type(idx, "application/json")
            except ValueError:  # NaN / inf: JSON has no such numbers
                message = (
                    "the model's output for this input has NaN or infinite values, which JSON cannot carry"
                )
                self._reject(context, idx, answers, message, code=422)
            pos += n

    def _reject(self, context, idx, answers, message, code=400, **extra):
        body = dict(_request_error(message, self.specs), **extra)
        answers[idx] = json.dumps(body)
        context.set_response_content_type(idx, "application/json")
        context.set_response_status(code, message[:200], idx)


def _worker_device(gpu_id):
    """``cuda:<gpu_id>`` when TorchServe gave this worker a GPU and torch sees CUDA, else ``cpu`` (with
    a log line when a GPU was given but CUDA is not available here)."""
    if gpu_id is None or gpu_id == "":
        return "cpu"
    import torch

    if not torch.cuda.is_available():
        logger.info(
            "TorchServe gave this worker gpu_id %s, but torch %s sees no CUDA "
            "(torch.cuda.is_available() is False): running on the CPU",
            gpu_id,
            torch.__version__,
        )
        return "cpu"
    return f"cuda:{int(gpu_id)}"


#: the formats this handler loads (``ptopt.serve.package`` puts no other in a .mar); a test checks it
#: against the format table (the rows whose servers include torchserve)
LOADED_FORMATS = ("torchscript", "exported_program", "aoti_package", "onnx", "openvino")


def _openvino_session(model_path, threads=None):
    """An OpenVINO IR (``model.xml`` + ``model.bin`` beside it) compiled for the worker's CPU at the
    inference precision ptopt checked it at (its ``rt_info``): ``(run(feed) -> outputs, input names)``.
    Needs ``openvino`` where TorchServe runs (``pip install openvino``)."""
    import openvino as ov

    core = ov.Core()
    model = core.read_model(model_path)
    try:
        precision = str(model.get_rt_info(["ptopt", "inference_precision"]).astype(str))
    except Exception:  # noqa: BLE001 - an IR without ptopt's entry: fp32
        precision = "fp32"
    config = {"PERFORMANCE_HINT": "LATENCY"}
    # int8: the ops left float in f32, as ptopt checked it (the plugin's default is bf16 on bf16 CPUs)
    config["INFERENCE_PRECISION_HINT"] = "bf16" if precision == "bf16" else "f32"
    if threads:
        config["INFERENCE_NUM_THREADS"] = int(threads)
    compiled = core.compile_model(model, "CPU", config)

    def run(feed):
        outs = compiled(feed)
        return [outs[o] for o in compiled.outputs]

    return run, [p.get_any_name() for p in model.inputs]


#: the name of an AOTInductor package's fixed-batch model (``ptopt.formats.aoti_files.static_model_name``)
STATIC_MODEL = "batch_{}"


def _by_batch(default, fixed):
    """A package with fixed-batch models (``--static-batch``): a batch of one of their sizes (dimension
    0 of the first tensor) runs there, any other on the dynamic-batch model."""
    import torch

    def run(*args, **kwargs):
        # the rule of ptopt.formats.aoti_files.FixedBatchDispatch: dimension 0 of the first tensor with one
        first = next((t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor) and t.dim()), None)
        return fixed.get(int(first.shape[0]) if first is not None else -1, default)(*args, **kwargs)

    return run


def _load_torch(model_path, fmt, meta, device="cpu"):
    """A callable torch model for a TorchScript file, an AOTInductor package or an ExportedProgram."""
    import torch

    if fmt == "aoti_package":
        built = (meta.get("extra") or {}).get("torch_version")
        if built and built != torch.__version__:
            raise RuntimeError(
                f"{os.path.basename(model_path)}: AOTInductor package built by torch {built}, but this "
                f"worker has torch {torch.__version__}; a package runs only on the torch that compiled it"
            )
        model = torch._inductor.aoti_load_package(model_path)
        batches = (meta.get("extra") or {}).get("static_batches") or ()
        if not batches:
            return model
        from torch._inductor.package import load_package

        return _by_batch(
            model, {int(b): load_package(model_path, STATIC_MODEL.format(int(b))) for b in batches}
        )
    if fmt == "exported_program":
        # a PT2E int8 program calls quantized_decomposed.* ops, defined by this module of torch
        importlib.import_module("torch.ao.quantization.fx._decomposed")
        module = torch.export.load(model_path).module()
        return module if device == "cpu" else module.to(device)
    return torch.jit.load(model_path, map_location=device).eval()


def _outputs_to_numpy(out):
    if isinstance(out, dict):
        return {k: _outputs_to_numpy(v) for k, v in out.items()}
    if isinstance(out, (list, tuple)):
        return [_outputs_to_numpy(v) for v in out]
    if hasattr(out, "detach"):
        t = out.detach()
        if t.is_quantized:
            t = t.dequantize()
        if str(t.dtype) in ("torch.bfloat16", "torch.float16"):
            t = t.float()
        return t.cpu().numpy()
    return np.asarray(out)
