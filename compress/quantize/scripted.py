"""The fx engine's artifact, made in memory: the int8 model as frozen TorchScript, serialized once.

``torch.jit.trace`` (``ptopt.formats.capture``) + ``torch.jit.freeze`` (keeping the tied int8 table
as it is, ``ptopt.formats.torchscript.self_serializing``), saved into memory: its bytes are the
size the metrics report, the module loaded back from them is what ``Result.model`` runs, and it is
checked against the int8 module it was traced from (export's reload check, on the loaded-back module)
before anything is written. ``Result.save`` writes that module once, through the one writer
(``ptopt.export.writers.write_model``). The fp32 model's TorchScript size, for the ratio, is
measured in memory the same way (:func:`torchscript_bytes`).
"""

from __future__ import annotations

import contextlib
import functools
import io
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ptopt.compress.quantize.base import Prepared, Quantized, QuantResult
from ptopt.compress.quantize.config import ORT_CALIBRATION

#: parity of the int8 TorchScript against the int8 module it was traced from
TRACE_ATOL = 1e-3
#: ... and relative to the output scale. The traced file is not bit-equal to the module: dynamic int8
#: re-quantizes activations per batch, so a float summation order that differs (threads, ops fused by
#: freezing) moves a scale and the rounding with it (0.11 % of the output scale on random-weight
#: EfficientNet-B0 at 1 thread); in static int8 with float modules, freezing folds their BatchNorms in
#: float, and a value that lands on the other side of an int8 rounding boundary downstream moves the
#: output by a quantization step, which the layers after it amplify (5.5 % on one sample of a
#: random-weight ResNet-18 with 4 blocks float; the other samples bit-equal). A broken trace is off by
#: far more, and the file itself is judged against fp32 afterwards by the int8 rule.
TRACE_RTOL = 0.1


@contextlib.contextmanager
def _eval_mode(module: Any) -> Iterator[None]:
    """``module`` in eval mode inside the block; each submodule's training flag back afterwards."""
    flags = {m: m.training for m in module.modules()}
    module.eval()
    try:
        yield
    finally:
        for m, was in flags.items():
            m.training = was


#: what quantize says when torch.jit.trace cannot take the int8 model (it has no --script)
TRACE_HINT = (
    "quantize writes its int8 TorchScript by tracing: keep the module that fails in float (--exclude MODULE), "
    "or let ONNX Runtime quantize the fp32 model instead (ptopt export MODEL --target onnx --precision int8 "
    "--data DATA)"
)


#: what quantize says when the traced TorchScript does not compute what the int8 model computes
TRACED_ADVICE = (
    " (compared with the int8 model it was traced from: the tracer records one path through data-dependent "
    "code; keep that module in float with --exclude MODULE, or use --engine pt2e)"
)


def frozen_torchscript(module: Any, example: Any, style: str) -> tuple[Any, dict[str, Any]]:
    """``module`` traced on ``example`` and frozen (as ``ptopt.formats.torchscript`` writes it);
    returns the ScriptModule and how it was made (method, frozen, the tracer's warnings)."""
    import torch

    from ptopt.formats import capture
    from ptopt.formats.torchscript import self_serializing

    with _eval_mode(module):
        sm, notes = capture.trace(module, example, style, "; " + TRACE_HINT)
    sm, frozen = sm.eval(), False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            sm, frozen = torch.jit.freeze(sm, preserved_attrs=self_serializing(sm)), True
        except (RuntimeError, AttributeError) as e:
            notes = [*notes, f"not frozen: {str(e).splitlines()[0][:200]}"]
    return sm, {"method": "torch.jit.trace", "frozen": frozen, "trace_warnings": notes}


def saved_bytes(scripted: Any) -> bytes:
    """A ScriptModule as ``torch.jit.save`` writes it, in memory."""
    import torch

    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.save(scripted, buf)
    return buf.getvalue()


def torchscript_bytes(module: Any, example: Any, style: str) -> int:
    """Bytes of ``module`` as frozen TorchScript (the fp32 size int8 is compared with), in memory."""
    return len(saved_bytes(frozen_torchscript(module, example, style)[0]))


def int8_torchscript(config: Any, prep: Prepared, qres: QuantResult) -> Quantized:
    """``qres.module`` (an fx engine's int8 model) as its TorchScript artifact, in memory: traced,
    frozen, serialized once, loaded back from those bytes and checked against ``qres.module`` at the
    input specs' min/opt/max shapes (ParityError past ``TRACE_ATOL`` / ``TRACE_RTOL``)."""
    import torch

    from ptopt.compress.quantize.engine_fx import quantize_context
    from ptopt.core.inputspec import specs_from_example
    from ptopt.export.writers import Check, check_reload

    specs = prep.specs or specs_from_example(prep.example)
    # under the backend the model was built with: loading repacks int8 weights for the engine in use
    with quantize_context(config.backend):
        scripted, made = frozen_torchscript(qres.module, prep.example, prep.style)
        data = saved_bytes(scripted)
        model = torch.jit.load(io.BytesIO(data), map_location="cpu").eval()
        rule = Check(qres.module, prep.example, atol=TRACE_ATOL, rtol=TRACE_RTOL, what="the traced int8 TorchScript",
                     advice=TRACED_ADVICE)  # fmt: skip
        parity = check_reload(
            Path("model.int8.pt"), "torchscript", specs, prep.style, rule, precision="int8", model=model
        )
    write = functools.partial(_write, model, specs, prep, config.backend, made)
    summary = {**qres.summary, "onnx_quantization": onnx_recipe(config, prep)}
    return Quantized(
        model=model,
        format="torchscript",
        size=len(data),
        write=write,
        config=config,
        float_layers=qres.float_layers,
        summary=summary,
        metrics={"parity": parity},
        context=functools.partial(quantize_context, config.backend),
    )


def _write(
    model: Any, specs: list[Any], prep: Prepared, backend: str, made: dict[str, Any], path: Path
) -> dict[str, Any]:
    """The Result's writer: the checked TorchScript, saved once at ``path`` by the one writer; the
    sidecar says how it was made (traced, frozen), not "re-saved"."""
    from ptopt.compress.quantize.engine_fx import quantize_context
    from ptopt.export.writers import write_model

    with quantize_context(backend):
        facts = write_model(
            model, "torchscript", path, specs=specs, style=prep.style, example=prep.example,
            precision="int8", check=False, freeze=False,
        )  # fmt: skip
    method = made["method"] + (" + torch.jit.freeze" if made["frozen"] else "")
    facts["extra"].update(made, method=f"{method} of the int8 model")
    return facts


def onnx_recipe(config: Any, prep: Prepared) -> dict[str, Any]:
    """What ``ptopt export --target onnx`` needs to quantize the fp32 parent with ONNX Runtime instead
    of exporting this TorchScript (int8 TorchScript does not export with the dynamo exporter)."""
    rec: dict[str, Any] = {
        "fp32_parent": prep.loaded.parent_record(),
        "method": "quantize_dynamic" if config.mode == "dynamic" else "quantize_static",
        "per_channel": config.per_channel,
        "exclude_modules": list(config.float_modules),
        "weight_type": "QInt8",
        "activation_type": "QUInt8",
        "reduce_range": config.backend in ("x86", "fbgemm"),
    }
    if config.mode == "dynamic":
        rec["layers"] = list(config.layers)
        return rec
    rec["calib_data"] = prep.ref_names().get(config.needs[0]) if config.needs else None
    rec["calibrate_method"] = ORT_CALIBRATION[config.observer]
    rec["calibration_batches"] = getattr(config, "calibration_batches", None)
    rec["batch_size"] = config.batch_size
    rec["quant_format"] = "QDQ"
    if config.mode == "qat":
        rec["note"] = (
            "re-quantizes the fp32 parent by calibration on train_data: QAT fine-tuning is not carried over"
        )
    return rec
