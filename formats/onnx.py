"""ONNX models (``.onnx``, plus ``.onnx.data`` for external weights), run in ONNX Runtime.

Written by the dynamo exporter (``ptopt.formats.onnx_export``: symbolic dims named after the specs,
external data for large weights, ``optimize``) or, for int8, by ``ptopt.formats.onnx_int8``
(``ort_static``: ONNX Runtime's static quantization of the fp32 model with the calibration data;
``qdq_export``: the TorchScript exporter path of an eager/FX int8 module). Reloaded as an
:class:`~ptopt.formats.onnx_session.OnnxModel` (torch tensors in and out) for the parity check.

Run by validate as deployed: an ``InferenceSession`` with full graph optimization,
``intra_op_num_threads = threads`` (the same count torch runners get), sequential execution, and
numpy in/out. The CPU provider always; the CUDA and TensorRT providers too when this onnxruntime
build has them (or exactly the ``providers`` asked for). With ``--device cuda:N`` the GPU providers
get that device id; an onnxruntime build without them (the CPU-only ``onnxruntime`` wheel) runs the
model on the CPU and says so in one line (``info["device_note"]``). Half-precision graphs take their
inputs in the graph's dtype (fp16; bf16 through ``ml_dtypes``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ptopt.core.errors import MissingDependencyError, ModelLoadError, UsageError
from ptopt.core.inputspec import InputSpec, flatten_inputs
from ptopt.formats.base import Format, loaded_model
from ptopt.formats.runner import Runner


class Onnx(Format):
    name = "onnx"
    label = "ONNX"
    suffixes = (".onnx",)
    target = "onnx"
    runtime = "onnxruntime"
    converts = ("int8", "fp16", "bf16")
    servers = ("torchserve", "triton", "ray")
    triton_platform = "onnxruntime_onnx"
    captured_on_cpu = True
    requantizes_int8 = True
    reexportable = False
    write_options = frozenset(
        {"opset", "optimize", "external_data", "int8_method", "calib", "fp32_module", "fp32_source_format"}
    )
    packages = ("onnx", "onnxruntime", "onnxscript")
    #: ONNX Runtime's CPU kernels (MLAS) pick their code from the CPU themselves: no variable caps them
    isa_libraries = ("mlas",)
    sniff_rank = 1
    target_order = 20

    def sniff(self, path: Path) -> bool:
        return path.suffix.lower() == ".onnx"

    def load(self, path: Path, art: Any, allow_pickle: bool) -> Any:
        import onnx

        try:
            model = onnx.load(str(path), load_external_data=False)
        except Exception as e:  # noqa: BLE001 - protobuf decode errors
            raise ModelLoadError(f"{path}: not a readable ONNX model: {str(e).splitlines()[0]}") from None
        from ptopt.formats.onnx_export import default_opset

        info = {"onnx_opset": default_opset(model)}
        return loaded_model(path, self.name, None, path, art, specs=specs_from_onnx(model), info=info)

    def files(self, path: Path) -> list[Path]:
        return onnx_files(path)

    def describe(self, loaded: Any) -> dict[str, Any]:
        from ptopt.formats.graph_facts import onnx_facts

        return onnx_facts(loaded.path, loaded.input_specs)

    def write(self, module: Any, path: Path, **kw: Any) -> dict[str, Any]:
        return write_onnx(module, path, **kw)

    def extra_facts(self, info: dict[str, Any], specs: Any) -> dict[str, Any]:
        from ptopt.formats.shapes import trtexec_shapes

        return {"trtexec_shapes": trtexec_shapes(specs, info.get("input_names"))}

    def reload(self, path: Path, *, style: str = "positional", device: str = "cpu", **kw: Any) -> Any:
        from ptopt.formats.onnx_session import OnnxModel

        return OnnxModel(path, style=style, device=device)

    def relocate(self, path: Path, dest: Path, files: list[str]) -> list[str]:
        if len(files) > 1 and dest.name != path.name:
            from ptopt.formats.onnx_export import relocate_external_data

            return relocate_external_data(path, dest)  # the location inside points at the new name
        return super().relocate(path, dest, files)

    def runner(self, name: str, loaded: Any, **kw: Any) -> Any:
        return OnnxRuntimeRunner.create(name, loaded, providers=kw.get("providers"))

    def check_config(self, config: Any) -> None:
        super().check_config(config)
        if config.precision == "bf16" and not config.on_cuda:
            raise UsageError(
                "--target onnx --precision bf16 on the CPU: ONNX Runtime's CPU provider has no bfloat16 "
                "kernels (MatMul, Conv, Add), so the artifact cannot be checked or run here; use "
                "--target torchscript/exported_program/aoti for bf16 on the CPU, or --device cuda with "
                "onnxruntime-gpu"
            )

    def check_available(self, config: Any) -> None:
        if config.on_cuda:
            from ptopt.formats.onnx_session import providers_for

            providers_for(str(config.device))

    def export_options(self, source: Any, config: Any, calib: Any, **kw: Any) -> tuple[dict, dict | None]:
        from ptopt.formats.onnx_int8 import int8_options

        options: dict[str, Any] = {"opset": config.opset}
        if (config.precision or source.precision) != "int8":
            return {**options, "optimize": config.optimize, "external_data": kw.get("external_data")}, None
        return int8_options(options, source, config, calib, kw.get("allow_pickle", False))

    def needs_calibration(self, config: Any) -> bool:
        return config.int8_method != "ort_dynamic"

    def export_context(self, module: Any) -> Any:
        """A Hugging Face model's attention as eager while exported and checked (``onnx_attention``)."""
        from ptopt.formats.onnx_export import onnx_attention

        return super().export_context(module) if module is None else onnx_attention(module)


FORMAT = Onnx()


def write_onnx(
    module: Any,
    path: Path,
    *,
    specs: Sequence[InputSpec],
    style: str,
    source_format: str = "eager",
    opset: int | None = None,
    optimize: bool = False,
    external_data: bool | None = None,
    int8_method: str | None = None,
    calib: Any = None,
    fp32_module: Any = None,
    fp32_source_format: str | None = None,
    **_: Any,
) -> dict[str, Any]:
    from ptopt.formats import onnx_export, onnx_int8

    if int8_method == "qdq_export":
        return onnx_int8.qdq_export(module, specs, style, path, opset=opset, source_format=source_format)
    if int8_method == "ort_dynamic":
        parent = module if fp32_module is None else fp32_module
        fmt = fp32_source_format or source_format_of(parent)
        return onnx_int8.ort_dynamic_quantize(parent, specs, style, path, opset=opset, source_format=fmt)
    if int8_method == "ort_static":
        parent = module if fp32_module is None else fp32_module
        fmt = fp32_source_format or source_format_of(parent)
        return onnx_int8.ort_static_quantize(
            parent, specs, style, path, calib, opset=opset, source_format=fmt
        )
    if int8_method is not None:
        raise UsageError(
            f"unknown int8 ONNX method {int8_method!r} (choose from {', '.join(onnx_int8.METHODS[1:])})"
        )
    return onnx_export.export_onnx(
        module,
        specs,
        style,
        path,
        opset=opset,
        optimize=optimize,
        external_data=external_data,
        source_format=source_format,
    )


def source_format_of(module: Any) -> str:
    import torch

    return "torchscript" if isinstance(module, torch.jit.ScriptModule) else "eager"


def specs_from_onnx(model: Any) -> list[InputSpec]:
    """Input specs read from an ONNX graph's inputs (symbolic dims: 1 at min/opt, 64 at max)."""
    import onnx

    inits = {i.name for i in model.graph.initializer}
    specs = []
    for inp in model.graph.input:
        if inp.name in inits:
            continue
        t = inp.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name
        lo = tuple(d if d > 0 else 1 for d in dims)
        hi = tuple(d if d > 0 else 64 for d in dims)
        specs.append(InputSpec(inp.name, lo, lo, hi, dtype))
    return specs


#: providers used when present, best first
PREFERRED_PROVIDERS = ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider")

_NP_TYPES = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(bfloat16)": "bfloat16",
    "tensor(double)": "float64",
    "tensor(int64)": "int64",
    "tensor(int32)": "int32",
    "tensor(int8)": "int8",
    "tensor(uint8)": "uint8",
    "tensor(bool)": "bool",
}


def onnx_files(path: Path) -> list[Path]:
    """The model file and every external-data file it references (``x.onnx.data``)."""
    import onnx

    files = [path]
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # noqa: BLE001 - unreadable files are reported when the session is created
        return files
    for init in model.graph.initializer:
        if init.data_location == onnx.TensorProto.EXTERNAL:
            for entry in init.external_data:
                if entry.key == "location":
                    p = path.parent / entry.value
                    if p not in files and p.is_file():
                        files.append(p)
    return files


@dataclasses.dataclass
class OnnxRuntimeRunner(Runner):
    providers: Sequence[str] | None = None
    session: Any = None
    input_names: list[str] = dataclasses.field(default_factory=list)
    input_types: list[str] = dataclasses.field(default_factory=list)
    placed: bool = False

    @classmethod
    def create(cls, name: str, loaded: Any, providers: Sequence[str] | None = None) -> OnnxRuntimeRunner:
        art = loaded.artifact
        files = art.file_paths if art else onnx_files(loaded.path)
        return cls(
            name=name,
            ref=loaded.ref,
            format="onnx",
            runtime="onnxruntime",
            input_specs=list(loaded.input_specs),
            input_style=loaded.input_style,
            path=loaded.path,
            files=list(files),
            precision=art.precision if art else "fp32",
            info=dict(loaded.info),
            providers=providers,
        )

    def output_layer(self, x: Any) -> str | None:
        from ptopt.core.scores import onnx_output_layer

        return onnx_output_layer(self.path) if self.path is not None else None

    def prepare(self, threads: int) -> None:
        try:
            import onnxruntime as ort
        except ImportError:
            raise MissingDependencyError(
                "onnxruntime is needed to validate an ONNX artifact: pip install onnxruntime"
            ) from None
        super().prepare(threads)
        available = ort.get_available_providers()
        if self.providers:
            missing = [p for p in self.providers if p not in available]
            if missing:
                raise MissingDependencyError(
                    f"{self.name}: ONNX Runtime provider(s) {', '.join(missing)} not available "
                    f"here (available: {', '.join(available)})"
                )
            providers = list(self.providers)
        else:
            providers = [p for p in PREFERRED_PROVIDERS if p in available]
        providers = self._on_device(providers, available)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.log_severity_level = 3
        try:
            self.session = ort.InferenceSession(str(self.path), sess_options=opts, providers=providers)
        except Exception as e:  # noqa: BLE001 - ORT raises its own exception types for bad models
            raise ModelLoadError(
                f"{self.name}: ONNX Runtime cannot load it: {str(e).strip().splitlines()[0][:300]}"
            ) from None
        used = self.session.get_providers()
        self.runtime = f"onnxruntime ({used[0].replace('ExecutionProvider', '')})"
        self.info["providers"] = used
        inputs = self.session.get_inputs()
        self.input_names = [i.name for i in inputs]
        self.input_types = [_NP_TYPES.get(i.type, "float32") for i in inputs]
        d0 = inputs[0].shape[0] if inputs and inputs[0].shape else None
        if isinstance(d0, int) and d0 > 0:
            self.batch_range = (d0, d0)

    def place(self, device: str) -> None:
        """ORT places the session's work itself (called before ``prepare``, which picks the providers):
        ``cpu`` keeps it on the CPU provider; a GPU device gives the GPU providers its index, or, where
        this build has none, a note that it runs on the CPU. Without ``place`` every provider this
        build has is used, best first."""
        self.device = device
        self.placed = True

    @property
    def timer_device(self) -> str:
        # session.run returns once the outputs are numpy arrays on the host (its GPU work runs on
        # ORT's own stream, which torch's CUDA events would not see): host time is the call's time
        return "cpu"

    def _on_device(self, providers: list[Any], available: list[str]) -> list[Any]:
        gpu = ("TensorrtExecutionProvider", "CUDAExecutionProvider")
        if not self.placed:
            return providers
        if self.device == "cpu":
            return [p for p in providers if p not in gpu] or ["CPUExecutionProvider"]
        if not any(p in available for p in gpu):
            import onnxruntime as ort

            self.info["device_note"] = (
                f"{self.name}: onnxruntime {ort.__version__} here has no CUDA/TensorRT execution provider "
                f"(only {', '.join(available)}): it runs on the CPU, not {self.device}; "
                f"pip install onnxruntime-gpu for the GPU"
            )
            return providers
        index = int(self.device.partition(":")[2] or 0)
        return [(p, {"device_id": index}) if p in gpu else p for p in providers]

    def feed(self, x: Any) -> dict[str, Any]:
        """torch batch → ORT feed: by name for keyword inputs, by position otherwise; cast to the graph's types."""
        pairs = flatten_inputs(x)
        if isinstance(x, dict) and set(x) == set(self.input_names):
            arrays = [x[n] for n in self.input_names]
        else:
            if len(pairs) != len(self.input_names):
                raise ValueError(
                    f"the model takes {len(self.input_names)} input(s) ({', '.join(self.input_names)}), "
                    f"the data has {len(pairs)}"
                )
            arrays = [t for _, t in pairs]
        return {
            n: _as_numpy(t, dt) for n, t, dt in zip(self.input_names, arrays, self.input_types, strict=False)
        }

    def call(self, x: Any) -> Any:
        import torch

        out = self.session.run(None, self.feed(x))[0]
        if out.dtype.name == "bfloat16":  # numpy has no bfloat16: ml_dtypes' type, which torch can't take
            out = out.astype("float32")
        return torch.from_numpy(out)

    def named_outputs(self, x: Any) -> list[tuple[str, Any]]:
        import torch

        outs = self.session.run(None, self.feed(x))
        names = [o.name for o in self.session.get_outputs()]
        # numpy has no bfloat16 (ml_dtypes' type, which torch can't take): float32, as call() does
        return [
            (n, torch.from_numpy(o.astype("float32") if o.dtype.name == "bfloat16" else o))
            for n, o in zip(names, outs, strict=True)
        ]

    def timed_call(self, x: Any) -> Callable[[], Any]:
        # the conversion to numpy is part of what a deployment pays per request
        session, feed = self.session, self.feed

        def run() -> Any:
            return session.run(None, feed(x))

        return run

    def close(self) -> None:
        self.session = None


def _as_numpy(t: Any, dtype: str) -> Any:
    """A torch input as the numpy array the graph input takes (bf16 through ``ml_dtypes``)."""
    if dtype == "bfloat16":
        import ml_dtypes

        return t.detach().cpu().float().numpy().astype(ml_dtypes.bfloat16)
    return t.detach().cpu().numpy().astype(dtype, copy=False)
