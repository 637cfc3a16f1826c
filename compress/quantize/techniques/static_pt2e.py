"""Row ``("static", "pt2e")``: torchao PT2E post-training int8 (X86InductorQuantizer), calibrated,
compiled by AOTInductor into a ``.pt2`` package (or kept as the int8 ExportedProgram); see
``ptopt.compress.quantize.pt2e``."""

from __future__ import annotations

from ptopt.compress.quantize import pt2e
from ptopt.compress.quantize.base import Prepared, Quantized
from ptopt.compress.quantize.config import MIN_STATIC_SHARE, StaticQuantConfig
from ptopt.compress.quantize.registry import register_technique


@register_technique(
    StaticQuantConfig,
    "pt2e",
    help="torchao PT2E (X86InductorQuantizer), calibrated; AOTInductor package (.pt2)",
    check=pt2e.check_x86,
    min_int8_share=MIN_STATIC_SHARE,
    advise=pt2e.advise,
    captures=pt2e.captures,
    captures_hint=pt2e.CAPTURES_HINT,
    tracer="torch.export",
    candidate=pt2e.candidate,
)
def static_pt2e(config: StaticQuantConfig, prep: Prepared, progress: bool) -> Quantized:
    from ptopt.compress.quantize import engine_pt2e
    from ptopt.core.inputspec import batch_size_of

    config = config.observed()
    specs = pt2e.specs_of(prep)
    batches = pt2e.calibration_batches(config, prep.calib)
    module, swapped = pt2e.linearized(prep.module, config.float_modules)
    converted = engine_pt2e.quantize_static(module, specs, prep.style, config, batches)
    calibration = {
        "data": prep.calib.name,
        "batches": len(batches),
        "samples": sum(batch_size_of(x) for x in batches),
        "batch_size": config.batch_size,
        "observer": config.observer,
        "per_channel": True,
        "engine": "pt2e",
    }
    summary = {"calibration": calibration, "conv1d_as_linear": swapped}
    return pt2e.artifact(config, prep, converted, summary, specs)
