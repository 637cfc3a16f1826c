"""``ptopt.export``: a model in, an artifact that runs here out, checked for parity at creation.

    res = ptopt.export(model, "onnx", input_shapes="1x3x32x32")   # an nn.Module or a MODEL reference
    res.model(x)              # the reloaded artifact: ScriptModule, ExportedProgram module, AOTInductor
                              # package (aoti_load_package), or ORT
    res.metrics["parity"]     # how far it is from the source at the min/opt/max shapes
    res.save("model.onnx")    # exactly the files that were checked, plus the sidecar, atomically
    ptopt.export("zoo:resnet", "onnx", "resnet.onnx", dynamic_batch="1:8:64")   # output= : and save

Order of work, so that bad input fails fast and nothing is half-written:

1. the options become one :class:`~ptopt.export.config.ExportConfig` (validated there); TensorRT's
   availability is checked before the model loads;
2. the model loads, its precision is settled, calibration data is loaded (finite values only);
3. the InputSpecs are settled (``shapes.settle_specs``) and the source runs at the min and max
   shapes (a wrong rank is a ShapeMismatchError naming expected vs got);
4. ``writers.write_model`` writes the artifact into a temporary folder and reloads it in its own
   runtime against the source at min/opt/max; past tolerance ParityError (exit 2) is raised, and
   with ``output=`` the files are kept aside as ``OUT.failed``;
5. ``.model`` is that reloaded file; ``.save(path)`` copies the checked files into place and writes
   the sidecar.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ptopt.core import progress as _progress
from ptopt.core.artifact import Artifact
from ptopt.core.atomic import ScratchDir
from ptopt.core.data import refuse_missing_file
from ptopt.core.errors import UnsupportedModelError, UsageError
from ptopt.core.inputspec import InputSpec
from ptopt.core.result import Result
from ptopt.export.config import HALF, OPTIONS, PRECISIONS, ExportConfig, settle_config
from ptopt.export.parity import INT8_VS_FP32_RTOL
from ptopt.formats.shapes import settle_specs

__all__ = ["PRECISIONS", "ExportConfig", "export"]


@OPTIONS.twin
@_progress.reported
def export(
    model: Any,
    target: str | None = None,
    output: str | os.PathLike | None = None,
    *,
    config: ExportConfig | None = None,
    data: Any = None,
    validation_data: Any = None,
    input_shapes: Any = None,
    input_specs: Sequence[InputSpec | dict] | None = None,
    weights: Any = None,
    allow_pickle: bool = False,
    external_data: bool | None = None,
    progress: Any = True,
    **options: Any,
) -> Result:
    """Export ``model`` to ``target``; returns a Result (``.model`` runs the checked artifact here,
    ``.save(path)`` writes it with its sidecar); ``output=`` also saves it there.

    - ``model``: an ``nn.Module`` or a MODEL reference (``model.pt``, ``pkg.module:factory`` with
      ``weights=``, ``zoo:NAME``); ``target``: torchscript | onnx | openvino | exported_program |
      aoti (an AOTInductor package, compiled for this CPU) | tensorrt (the targets of the format table).
    - ``config``: an ExportConfig instead of ``target`` and the loose ``options`` (its fields, listed
      below; a loose option contradicting it is refused, one another target takes too).
    - ``input_shapes``: ``"1x3x32x32"`` (or one NAME=SHAPE per input; batch dynamic in [1, 64]: the
      CLI's ``--input-shape``; as shapes, not with ``min/opt/max_shape``), InputSpecs, or an example
      batch (tensor, tuple or dict of tensors).
      ``min_shape/opt_shape/max_shape``: ``"1x1x32x32"``, ``["input_ids=1x16", ...]`` or
      ``{"input_ids": (1, 16)}``; ``dynamic_batch``: ``"1:8:64"`` (dimension 0 of every input).
      Without any, the model's declared inputs (or ``data``'s) are used, batch dynamic in [1, 64].
    - ``precision``: default the source's (an int8 artifact stays int8). ``onnx`` converts fp32 →
      int8 with ``data`` as calibration; ``tensorrt`` builds fp16/int8 engines.
    - ``data``: a DATA reference or in-memory data (tensor, tuple/dict of tensors, Dataset,
      DataLoader, list of batches): input shapes when the model declares none, and int8 calibration
      (overrides what an int8 source's sidecar records).
    - ``atol/rtol``: parity tolerance (defaults in ``ptopt.export.parity.DEFAULT_TOLERANCES``);
      ``min_cosine``: the worst sample's cosine the artifact must keep (your budget; default by precision,
      ``ptopt.export.parity.MIN_COSINE``); ``int8_method``: auto | ort_static | ort_dynamic | qdq_export
      (``formats.onnx_int8``).
    - ``precision="fp16"|"bf16"``: half-precision weights and activations (fp16 needs ``device="cuda"``);
      ``device``: ``cpu`` or ``cuda[:N]``; ``cuda_graphs``: aoti on CUDA. See docs/gpu.md.
    - ``static_batches``: aoti, ``(1, 32)`` or ``"1,32"``: fixed-batch models in the same package (docs/export.md).
    - ``accuracy_control``: openvino int8 through ``nncf.quantize_with_accuracy_control``: the ops that cost
      the most stay float until ``min_cosine`` (worst-sample cosine with the fp32 model) or
      ``accuracy_budget`` (points of top-1) holds on ``validation_data`` (default ``data``);
      ``float_modules``: the modules (``"layers.0.ff2"``, ...) whose ops NNCF leaves float.
    - A causal language model (``hf:DIR``, a transformers causal LM) exports as a folder with its KV cache
      as inputs and outputs (``ptopt.export.lm``): onnx, openvino, exported_program, aoti; ``new_tokens``:
      the greedy tokens it is checked on against transformers (default 32), after a prompt from ``data``.
    - ``progress``: the long steps on stderr (``True``), to a callable (each plain line), or none (``False``)."""
    config, shape_options = settle_config(target, config, options)
    shapes = dataclasses.asdict(shape_options)
    _one_shape_source(input_shapes, shapes)
    if _lm_export(model, config, output):
        from ptopt.export.lm import export_lm

        refuse_missing_file(data=data, validation_data=validation_data)  # before the model loads
        lm = dict(shapes, data=data, input_shapes=input_shapes, input_specs=input_specs)
        result = export_lm(_load_source(model, weights, allow_pickle, config), config, output, lm)
        return _saved(result, output)
    _check_target(config, output)  # a missing runtime first: it is about the target, whatever the data
    refuse_missing_file(data=data, validation_data=validation_data)  # before the model loads
    source = _load_source(model, weights, allow_pickle, config)
    if config.new_tokens is not None:
        raise UsageError(
            "--new-tokens applies to a causal language model (hf:DIR or a transformers causal LM)"
        )
    want = _resolve_precision(source, config)
    calib, calib_ref = _calibration(data, config, source, want)
    specs, style = _input_specs(source, calib, input_shapes, input_specs, shapes)
    config = config.replace(calib_data=calib_ref)
    validation = _validation(validation_data, config, source.loaded)
    built = _build(source, config, specs, style, calib, external_data, allow_pickle, output, validation)
    result = Result(
        built.model, built.template(source, config, want), built.save_to, inputs_paths=(source.path,)
    )
    return _saved(result, output)


def _saved(result: Result, output: Any) -> Result:
    if output is not None:
        result.save(output)
        _stale_failed_removed(result.artifact)
    return result


def _stale_failed_removed(art: Artifact) -> None:
    """A failed export's files kept aside as ``OUT.failed`` (``writers._keep_failed``; a folder's, by
    ``export.lm``) go once an export to OUT succeeds: only those names, each of the artifact's files'."""
    import shutil

    names = dict.fromkeys([art.path.name, *art.files])
    for stale in (art.path.parent / f"{name}.failed" for name in names):
        if stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)
        elif stale.is_file() or stale.is_symlink():
            stale.unlink(missing_ok=True)
        else:
            continue
        _progress.note(f"removed {stale}: a failed export's files, kept aside for inspection")


def _lm_export(model: Any, config: ExportConfig, output: Any) -> bool:
    """Whether this is a causal language model's export (``ptopt.export.lm``): a Hugging Face folder or a
    transformers causal LM (its target checked first: it must take the model with its cache)."""
    from ptopt.export.lm import is_lm_reference

    if not is_lm_reference(model):
        return False
    from ptopt.core.device import resolve_device

    resolve_device(config.device, allow_auto=False)
    config.row.check_available(config)
    return True


def _one_shape_source(input_shapes: Any, shapes: dict[str, Any]) -> None:
    """``input_shapes`` as shapes (``--input-shape``: each a shape whose batch is dynamic) and a
    ``--min/--opt/--max-shape`` range both say what the inputs are: refused together, rather than one
    silently redrawing the other."""
    strings = isinstance(input_shapes, str) or (
        isinstance(input_shapes, (list, tuple))
        and bool(input_shapes)
        and all(isinstance(v, str) for v in input_shapes)
    )
    ranged = [f"--{k.replace('_', '-')}" for k in ("min_shape", "opt_shape", "max_shape") if shapes[k]]
    if strings and ranged:
        raise UsageError(
            f"--input-shape and {'/'.join(ranged)} both give the input shapes: give --input-shape (its first "
            "dimension the batch, dynamic from 1 to 64; --dynamic-batch MIN:OPT:MAX sets that range) or the "
            "--min/--opt/--max-shape range (--opt-shape alone: a static shape), not both"
        )


def _input_specs(
    source: Any, calib: Any, input_shapes: Any, input_specs: Any, shapes: dict[str, Any]
) -> tuple[list[InputSpec], str]:
    """The InputSpecs and calling style of the export: given, from the data or the model's declared
    inputs, then ``shapes`` (min/opt/max, dynamic batch) applied; checked to run on the source."""
    base, style = _settle(source.loaded, calib, input_shapes, input_specs)
    if not base and not any(shapes[k] for k in ("min_shape", "opt_shape", "max_shape")):
        from ptopt.core.modelref import require_input_specs

        base, style = (
            list(require_input_specs(source.loaded, "--data", "--opt-shape")),
            source.loaded.input_style,
        )
    specs = settle_specs(base, **shapes)
    if not base:
        style = _infer_style(source.module, specs, style)
        specs = _typed(source.module, specs, style, shapes)
    if style == "keyword":
        specs = _forward_order(source.module, specs)
    _source_runs(source.loaded, specs, style)
    return specs, style


# -- 1. options and the model ------------------------------------------------------------------


def _check_target(config: ExportConfig, output: Any) -> None:
    from ptopt.core.device import resolve_device

    resolve_device(config.device, allow_auto=False)  # CUDA asked for and absent: refused before any work
    config.row.check_available(config)
    if output is not None and Path(output).is_dir():
        out = Path(output)
        raise UsageError(
            f"output {out} is a folder; give a file path, e.g. {out / ('model' + config.suffix)}"
        )
    if output is not None and not config.row.folder:
        from ptopt.core.result import check_suffix

        check_suffix(Path(output), config.row.name)  # before any work


@dataclasses.dataclass
class _Source:
    loaded: Any
    module: Any
    precision: str
    #: why a file made from a model ptopt can make again exports as it is (``core.modelref.rebuilt_eager``)
    not_rebuilt: str = ""

    @property
    def path(self) -> Path | None:
        return self.loaded.path


def _load_source(model: Any, weights: Any, allow_pickle: bool, config: ExportConfig) -> _Source:
    from ptopt.core.formats import find_format, with_article
    from ptopt.core.modelref import as_loaded, rebuilt_eager
    from ptopt.formats.onnx_int8 import is_int8_source

    loaded = as_loaded(model, weights, allow_pickle)
    row = find_format(loaded.format)
    if row is not None and not row.reexportable:
        raise UsageError(
            f"{loaded.ref} is already {with_article(row.label)}; export starts from a PyTorch model"
        )
    # a pruned file exports from its eager module (TorchScript's dict outputs, say, no ONNX exporter takes)
    loaded, not_rebuilt = rebuilt_eager(loaded, allow_pickle, "export")
    module = loaded.require_module(f"--target {config.target}")
    if is_int8_source(loaded):
        precision = "int8"
    else:
        precision = loaded.artifact.precision if loaded.artifact is not None else "fp32"
    return _Source(loaded, module, precision, not_rebuilt)


def _resolve_precision(source: _Source, config: ExportConfig) -> str:
    want = config.precision or source.precision
    if want != source.precision and want not in config.row.converts:
        raise UsageError(
            f"--precision {want}: the source is {source.precision} and --target {config.target} cannot "
            f"convert it; export its fp32 parent instead"
        )
    if want in HALF and want != source.precision and source.precision != "fp32":
        raise UsageError(
            f"--precision {want}: the source is {source.precision}; half precision starts from an fp32 "
            f"model: export its fp32 parent instead"
        )
    if source.precision == "int8" and "int8" in config.row.converts and not config.row.requantizes_int8:
        raise UsageError(
            f"--target {config.target} takes an fp32 model: export the int8 artifact's fp32 parent with "
            "--precision int8 --data CALIB"
        )
    return want


def _calibration(data: Any, config: ExportConfig, source: _Source, want: str) -> tuple[Any, str | None]:
    """The Dataset given or needed for calibration (None when neither) and its reference string."""
    from ptopt.formats.onnx_int8 import recorded_calib_data

    needs = want == "int8" and (source.precision != "int8" or config.row.requantizes_int8)
    needs = needs and config.row.needs_calibration(config)
    ref = data if isinstance(data, (str, os.PathLike)) else None
    if data is None and needs:
        # a replayed config names its calibration data; an int8 source's sidecar records its own
        ref = data = config.calib_data or (
            recorded_calib_data(source.loaded) if source.precision == "int8" else None
        )
    if needs and data is None and source.precision != "int8":
        raise UsageError(
            f"--precision int8 for --target {config.target} needs calibration data: pass --data CALIB "
            f"(e.g. builtin:digits32:train)"
        )
    ds = _dataset(data, source.loaded) if data is not None else None
    return ds, (str(ref) if ref is not None else None)


def _validation(data: Any, config: ExportConfig, loaded: Any = None) -> Any:
    """The Dataset ``--accuracy-control`` validates on (None: its calibration data)."""
    if data is not None and not config.accuracy_control:
        raise UsageError("--validation-data is what --accuracy-control validates on: add --accuracy-control")
    return _dataset(data, loaded) if data is not None else None


def _dataset(data: Any, loaded: Any = None) -> Any:
    """A DATA reference or in-memory data → a Dataset with finite values (NaN/inf is a DataError);
    ``loaded``: the model it is for (a Hugging Face encoder reads text one sentence per line)."""
    import torch

    from ptopt.core.data import Dataset, from_batches, load_data

    if isinstance(data, (str, os.PathLike, Dataset)):
        ds = load_data(data, model=loaded)
    elif isinstance(data, (torch.Tensor, dict, tuple)):
        ds = Dataset(data, name="data")
    else:
        ds = from_batches(data, "data")  # a DataLoader, a list of batches
    ds.check_finite()
    return ds


# -- 2. input specs ----------------------------------------------------------------------------------


def _settle(loaded: Any, data: Any, input_shapes: Any, input_specs: Any) -> tuple[list[InputSpec], str]:
    """The base specs before min/opt/max: given specs, ``input_shapes``, the model's own, the data's."""
    from ptopt.core.input_infer import token_ranges
    from ptopt.core.inputspec import input_style, specs_from_example

    specs_arg, example = _split_input_shapes(input_shapes, input_specs)
    if example is not None:
        style = input_style(example)
        return token_ranges(loaded.module, specs_from_example(example), style), style
    if specs_arg:
        base = [s if isinstance(s, InputSpec) else InputSpec.from_dict(s) for s in specs_arg]
        return base, _infer_style(loaded.module, base, loaded.input_style)
    if isinstance(input_shapes, (str, list, tuple)) and input_shapes:
        from ptopt.core.inputspec import parse_named_shapes
        from ptopt.core.modelref import resolve_inputs

        shapes = [input_shapes] if isinstance(input_shapes, str) else list(input_shapes)
        resolve_inputs(loaded, input_shapes=parse_named_shapes(shapes))
    if loaded.input_specs:
        return list(loaded.input_specs), loaded.input_style
    if data is not None:
        style = input_style(data.first_batch(1).x)
        return token_ranges(loaded.module, data.input_specs(), style), style
    return [], loaded.input_style


def _split_input_shapes(input_shapes: Any, input_specs: Any) -> tuple[Any, Any]:
    """(InputSpecs, example batch) from ``input_shapes``/``input_specs``; shape strings are neither."""
    import torch

    if input_shapes is not None and input_specs is not None:
        raise UsageError("give input_shapes or input_specs, not both")
    value = input_shapes if input_specs is None else input_specs
    if isinstance(value, tuple) and value and all(isinstance(v, str) for v in value):
        value = list(value)  # ("1x3x32x32",), as the other stages take it
    if isinstance(value, InputSpec):
        return [value], None
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, (InputSpec, dict)) for v in value):
        return list(value), None
    tensors = value.values() if isinstance(value, dict) else (value if isinstance(value, tuple) else [value])
    if value is not None and all(isinstance(t, torch.Tensor) for t in tensors):
        return None, value
    if value is not None and not isinstance(value, (str, list)):
        raise UsageError(
            f"input_shapes: expected '1x3x32x32', a list of NAME=SHAPE, InputSpecs or an example tensor, "
            f"got {type(value).__name__}"
        )
    return None, None


def _typed(module: Any, specs: list[InputSpec], style: str, shapes: dict[str, Any]) -> list[InputSpec]:
    """Specs built from shapes alone: token inputs typed as every stage types them (int64 ids for an
    ``nn.Embedding``, int64 masks), unless a shape wrote its dtype (``input_ids=1x8:int64``)."""
    from ptopt.core.inputspec import dtype_of, parse_named_shapes
    from ptopt.core.modelref import typed_token_inputs

    given = []
    for k in ("min_shape", "opt_shape", "max_shape"):
        value = shapes[k] or []
        given += [value] if isinstance(value, str) else [v for v in value if isinstance(v, str)]
    written = {n for n, shape in parse_named_shapes(list(given)) if n and dtype_of(shape)}
    untyped = {s.name for s in specs if s.name not in written}
    return typed_token_inputs(module, specs, style, untyped)


def _forward_order(module: Any, specs: list[InputSpec]) -> list[InputSpec]:
    """Keyword inputs in ``forward``'s parameter order: exporters name graph inputs in that order."""
    import inspect

    try:
        order = list(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError, AttributeError):
        return specs
    return sorted(specs, key=lambda s: order.index(s.name) if s.name in order else len(order))


def _infer_style(module: Any, specs: Sequence[InputSpec], default: str) -> str:
    """Keyword when several inputs are named after ``forward``'s parameters (``input_ids=...``)."""
    import inspect

    if len(specs) < 2:
        return default
    try:
        params = set(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError, AttributeError):
        return default
    return "keyword" if all(s.name in params for s in specs) else default


def _source_runs(loaded: Any, specs: list[InputSpec], style: str) -> None:
    """The source must accept the min and max shapes, and return tensors, before any export work."""
    from ptopt.core.inputspec import make_inputs
    from ptopt.core.modelref import run_checked
    from ptopt.core.tensors import flatten_outputs

    for which in ("min", "max"):
        # outputs must be tensors (or nested tuples/lists/dicts of them): every format carries only those
        flatten_outputs(
            run_checked(loaded, make_inputs(specs, style, which=which), what=f"the {which} shape")
        )


# -- 3. write, check, reload ---------------------------------------------------------------------------


@dataclasses.dataclass
class _Built:
    """The checked artifact in a temporary folder (kept while the Result lives) and its reload."""

    folder: ScratchDir
    path: Path
    facts: dict[str, Any]
    model: Any
    specs: list[InputSpec]
    style: str
    quantized_from: dict | None = None
    format: str = ""

    def template(self, source: _Source, config: ExportConfig, precision: str) -> Artifact:
        from ptopt.core.device import half_specs

        extra = dict(self.facts["extra"])
        if self.quantized_from is not None:
            extra["quantized_from"] = self.quantized_from
        return Artifact(
            path=self.path,
            format=config.format,
            # a half-precision artifact takes half-precision floats (TensorRT keeps fp32 inputs)
            inputs=half_specs(self.specs, precision) if config.row.half_weights else self.specs,
            input_style=self.style,
            outputs=self.facts["outputs"],
            # the sidecar records what was resolved: the precision kept or made, the int8 method used
            config={**config.to_dict(), "precision": precision, "int8_method": extra.get("int8_method")},
            parent=source.loaded.parent_record(),
            precision=precision,
            files=self.facts["files"],
            metrics=self.facts.get("metrics", {}),
            extra=extra,
        )

    def save_to(self, dest: Path) -> dict[str, Any]:
        """``Result``'s writer: the checked files under ``dest``'s name (ONNX external data is
        re-pointed at the new name; its bytes are the checked ones)."""
        files = self.facts["files"]
        from ptopt.core.formats import get_format

        return {"files": get_format(self.format).relocate(self.path, dest, files)}


def _build(
    source: _Source,
    config: ExportConfig,
    specs: list[InputSpec],
    style: str,
    calib: Any,
    external_data: Any,
    allow_pickle: bool,
    output: Any,
    validation: Any = None,
) -> _Built:
    from ptopt.core.device import resolve_device

    options, quantized_from = _format_options(source, config, calib, external_data, allow_pickle, validation)
    device = str(resolve_device(config.device or (None if "cpu" in config.row.devices else "cuda")))
    folder = ScratchDir(prefix="ptopt-export-")
    # absolute: ORT's quantization tools run in a temporary working directory
    path = Path(folder.name).resolve() / (
        Path(output).name if output is not None else "model" + config.suffix
    )
    try:
        with _attention(source, config) as attention:
            facts, model = _write_and_check(
                source, config, specs, style, calib, path, options, output, device
            )
        if attention:
            facts["extra"]["attention"] = (
                f"{attention} (the source's sdpa masks fully padded rows unlike ONNX)"
            )
    except UnsupportedModelError as e:
        folder.cleanup()
        if not source.not_rebuilt:
            raise
        raise UnsupportedModelError(
            f"{e}; {source.loaded.ref} was exported as it is: {source.not_rebuilt}"
        ) from None
    except BaseException:
        folder.cleanup()
        raise
    return _Built(folder, path, facts, model, specs, style, quantized_from, config.format)


def _attention(source: _Source, config: ExportConfig) -> Any:
    """The context the format exports and checks in (ONNX: a Hugging Face model's attention as eager)."""
    return config.row.export_context(source.module)


def _write_and_check(
    source: _Source,
    config: ExportConfig,
    specs: list[InputSpec],
    style: str,
    calib: Any,
    path: Path,
    options: dict[str, Any],
    output: Any,
    device: str,
) -> tuple[dict[str, Any], Any]:
    """Write the artifact, reload it and check it against the source on ``device``: (facts, reloaded
    model)."""
    from ptopt.core.device import half_dtype
    from ptopt.export.writers import Check, check_reload, reload, write_model

    precision = config.precision or source.precision
    facts = write_model(
        source.module,
        config.format,
        path,
        specs=specs,
        style=style,
        source_format=source.loaded.format,
        precision=precision,
        check=False,
        device=device,
        **options,
    )
    # the check runs on the very object .model returns (one reload, not two)
    model = reload(path, config.format, style=style, device=device, cuda_graphs=config.cuda_graphs)
    rtol = config.rtol
    if (
        precision == "int8"
        and source.precision != "int8"
        and (config.atol, rtol, config.min_cosine) == (None,) * 3
    ):
        rtol = INT8_VS_FP32_RTOL  # quantized here from fp32: quantize's int8 rule (export.parity)
    rule = Check(source.module, calib, config.atol, rtol, config.min_cosine, keep_failed_as=output)
    check = dict(
        precision=precision,
        files=facts["files"],
        model=model,
        device=device,
        dtype=half_dtype(precision) if config.row.half_weights else None,
    )
    parity = check_reload(path, config.format, specs, style, rule, **check)
    for b in config.static_batches:  # each fixed-batch model of an AOTInductor package, at its batch
        fixed = [s.with_batch(b, b, b) for s in specs]
        at_b = check_reload(path, config.format, fixed, style, rule, **check)
        parity.setdefault("static_batches", {})[str(b)] = {
            k: at_b[k] for k in ("cosine", "max_abs_diff", "passed") if k in at_b
        }
    facts["metrics"] = {"parity": parity}
    return facts, model


def _format_options(
    source: _Source,
    config: ExportConfig,
    calib: Any,
    external_data: Any,
    allow_pickle: bool,
    validation: Any = None,
) -> tuple[dict[str, Any], dict | None]:
    """The writer's per-format options; for int8 ONNX also the record of what ORT quantized."""
    return config.row.export_options(
        source, config, calib, external_data=external_data, allow_pickle=allow_pickle, validation=validation
    )
