"""Row ``("static", "openvino")``: NNCF post-training int8 of the model's OpenVINO IR (``nncf.quantize``
calibrated on --calib-data; the Linear / Conv layers of ``--exclude``, or of the blocks it names, left
float through an ``nncf.IgnoredScope``), run by OpenVINO's CPU plugin: the artifact is an OpenVINO IR
(``.xml`` + ``.bin``), what ``ptopt export --target openvino --precision int8 [--exclude]`` writes
(``ptopt.formats.openvino``). It is a row of quantize so that ``--engine auto`` goes on to it when the
torch engines miss the int8 rule, with its float-layer search (``auto_int8``) over this row's candidates.
"""

from __future__ import annotations

import weakref
from pathlib import Path
from typing import Any

from ptopt.compress.quantize.base import Prepared, Quantized
from ptopt.compress.quantize.config import MIN_STATIC_SHARE, StaticQuantConfig, refuse_no_compile
from ptopt.compress.quantize.registry import register_technique
from ptopt.core.atomic import ScratchDir
from ptopt.core.errors import UnsupportedModelError

#: model -> {(its input specs, calling style): its fp32 IR}, while the model lives (the search's
#: candidates quantize copies of one conversion)
_CONVERTED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _check(config: Any) -> None:
    from ptopt.core.errors import UsageError

    refuse_no_compile(config)
    if not config.per_channel or config.backend == "qnnpack":
        raise UsageError(
            "--engine openvino: NNCF makes per-channel int8 weights for OpenVINO's CPU plugin; drop "
            "--per-tensor / --backend qnnpack"
        )


def _requires(config: Any) -> None:
    from ptopt.formats.openvino import require_openvino

    require_openvino(nncf=True)


def _fp32_ir(prep: Prepared) -> tuple[Any, str]:
    """A copy of the model's fp32 IR (converted once per model and input specs) and what it came from."""
    from ptopt.formats.openvino import convert_ir

    key = (tuple(s.describe() for s in prep.specs), prep.style)
    irs = _CONVERTED.setdefault(prep.module, {})
    if key not in irs:
        irs[key] = convert_ir(prep.module, prep.specs, prep.style)
    ir, how = irs[key]
    return ir.clone(), how


def float_layer_names(module: Any, float_modules: Any) -> list[str]:
    """The Linear / Conv layers of ``float_modules`` (a layer, or a block: the layers it holds)."""
    from ptopt.optimize.float_layers import layer_kinds

    inside = lambda n: any(n == f or n.startswith(f + ".") for f in float_modules)  # noqa: E731
    return [n for n, m in module.named_modules() if isinstance(m, layer_kinds()) and inside(n)]


def _int8_ir(config: Any, prep: Prepared) -> tuple[Any, dict[str, Any]]:
    """NNCF's int8 IR of the model with ``config.float_modules`` float, and what NNCF was asked."""
    from ptopt.formats.openvino import HINT_KEY, ignored_scope, quantize_ir

    ir, how = _fp32_ir(prep)
    floats = float_layer_names(prep.module, config.float_modules)
    ignored = ignored_scope(ir, prep.module, floats)
    try:
        q, record = quantize_ir(ir, prep.calib, None, ignored)
    except Exception as e:  # noqa: BLE001 - NNCF and OpenVINO raise many kinds
        text = str(e).strip().splitlines()[0][:240] if str(e).strip() else type(e).__name__
        raise UnsupportedModelError(f"NNCF cannot quantize the model's OpenVINO IR: {text}") from None
    q.set_rt_info("int8", list(HINT_KEY))  # compiled as the artifact is (its float ops in f32)
    record |= {"converted_from": how, "float_modules": floats}
    return q, record


def candidate(config: Any, prep: Prepared) -> Any:
    """The int8 IR compiled in memory (no file): what ``--engine auto`` judges a float set with."""
    from ptopt.formats.openvino import OpenVINOModel

    return OpenVINOModel.of(_int8_ir(config, prep)[0], style=prep.style)


def _float_layers(prep: Prepared, q: Any, config: Any) -> dict[str, str]:
    """Every module with weights that is not int8 in ``q`` (its ops' weights are not 8-bit), and why."""
    from ptopt.formats.openvino import int8_ops, weight_ops
    from ptopt.optimize.float_layers import layer_kinds

    module = prep.module
    layers = [n for n, m in module.named_modules() if isinstance(m, layer_kinds())]
    excluded = set(float_layer_names(module, config.float_modules))
    quantized = int8_ops(q)
    ops = weight_ops(_fp32_ir(prep)[0], module, [n for n in layers if n not in excluded])
    int8 = {n for n, names in ops.items() if any(o in quantized for o in names)}
    out: dict[str, str] = {}
    for name, m in module.named_modules():
        if not name or not any(True for _ in m.parameters(recurse=False)) or name in int8:
            continue
        if name in excluded:
            out[name] = "--exclude (an nncf.IgnoredScope op)"
        elif name in layers:
            out[name] = (
                "NNCF left its op float"
                if ops.get(name)
                else "its weight is not found in the IR (an OpenVINO fusion changed it): not counted int8"
            )
        else:
            out[name] = f"{type(m).__name__}: not a Linear / Conv (OpenVINO folds it or runs it in float)"
    return out


@register_technique(
    StaticQuantConfig,
    "openvino",
    help="NNCF int8 of the OpenVINO IR (calibrated; --exclude left float); an OpenVINO IR (.xml + .bin)",
    check=_check,
    requires=_requires,
    min_int8_share=MIN_STATIC_SHARE,
    tracer="torch.export (for the OpenVINO IR)",
    candidate=candidate,
)
def static_openvino(config: StaticQuantConfig, prep: Prepared, progress: bool) -> Quantized:
    from ptopt.core import progress as steps
    from ptopt.formats.openvino import CALIB_BATCH, FORMAT, OpenVINOModel, imported, quiet

    ov = imported("openvino")
    with steps.step("NNCF int8 of the OpenVINO IR", announce=progress):
        q, record = _int8_ir(config, prep)
    folder = ScratchDir(prefix="ptopt-ov-int8-")
    path = Path(folder.name) / "model.int8.xml"
    with quiet():
        ov.save_model(q, str(path), compress_to_fp16=False)

    def write(dest: Path) -> dict[str, Any]:
        _ = folder  # the IR lives as long as the Result
        return {"files": FORMAT.relocate(path, dest, [])}

    specs = prep.specs
    samples = record.get("calibration_samples") or 0
    calibration = {
        "data": prep.calib.name, "samples": samples, "batches": -(-samples // CALIB_BATCH),
        "observer": "NNCF's range", "per_channel": True, "engine": "openvino",
    }  # fmt: skip
    return Quantized(
        model=OpenVINOModel(path, style=prep.style),
        format="openvino",
        size=sum(f.stat().st_size for f in FORMAT.files(path)),
        write=write,
        config=config.replace(engine="openvino"),
        float_layers=_float_layers(prep, q, config),
        summary={"calibration": calibration, "nncf": record, "openvino": ov.__version__},
        specs=specs,
        eval_batch=min(256, specs[0].max_shape[0]) if specs else 256,
    )
