"""Row ``("weight-only", "openvino")``: NNCF's data-free weight compression of the model's OpenVINO IR
(int8 asymmetric per output channel; int4 symmetric per group), run by OpenVINO's CPU plugin with the
KV cache kept as plugin state; the artifact is an OpenVINO language-model folder
(``ptopt.formats.openvino_lm``). The flow around it (text data, perplexity, the Result) is the torchao
row's (``compress/quantize/lm_flow.py``).
"""

from __future__ import annotations

from typing import Any

from ptopt.compress.quantize.config import WeightOnlyConfig
from ptopt.compress.quantize.registry import register_technique
from ptopt.core.errors import UsageError


def _check(config: WeightOnlyConfig) -> None:
    if config.method != "rtn":
        raise UsageError(
            f"--engine openvino compresses weights data-free (round to nearest): use --method rtn, or "
            f"--engine torchao for --method {config.method}"
        )
    if config.bits == 8 and config.group_size is not None:
        raise UsageError(
            "--engine openvino: int8 weights have one scale per output channel; drop --group-size"
        )
    if config.decode_step:
        raise UsageError("--decode-step writes a torch.export program: it is --engine torchao's")


def _requires(config: WeightOnlyConfig) -> None:
    from ptopt.formats.openvino import require_openvino

    require_openvino(nncf=True)


def _check_groups(module: Any, config: WeightOnlyConfig) -> None:
    """int4: the group must divide the inputs of every matrix NNCF makes int4 (all Linear layers but the
    output layer, which it keeps int8, and those --exclude keeps float)."""
    import torch

    if config.bits != 4:
        return
    head = module.get_output_embeddings()
    skip = lambda n: any(n == e or n.startswith(e + ".") for e in config.float_modules)  # noqa: E731
    bad = [
        (n, m.in_features)
        for n, m in module.named_modules()
        if isinstance(m, torch.nn.Linear) and m is not head and not skip(n) and m.in_features % config.groups
    ]
    if bad:
        name, width = bad[0]
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise UsageError(
            f"{config.group_flag} does not divide the {width} inputs of {name}{more}: choose a "
            f"divisor of {width}"
        )


def _build(config: WeightOnlyConfig, loaded: Any, calib: Any) -> tuple[Any, dict, Any]:
    """Convert, make stateful, compress; the runner, the record and the folder's writer."""
    import torch

    from ptopt.core.hf import is_causal_lm
    from ptopt.formats import openvino_lm
    from ptopt.formats.openvino import ignored_scope, imported

    nncf, ov = imported("nncf"), imported("openvino")

    module = loaded.module
    if not is_causal_lm(module):
        raise UsageError(
            "--engine openvino quantizes transformers causal language models (config + generate)"
        )
    _check_groups(module, config)
    ov_model = openvino_lm.convert(module)
    ignored = ignored_scope(ov_model, module, config.float_modules)
    ov_model, files = openvino_lm.as_saved(
        openvino_lm.compress_weights(ov_model, config.bits, config.groups, ignored)
    )
    runner = openvino_lm.OpenVINOLM(ov_model, module.config, torch.get_num_threads())
    runner.files = files  # the IR's files live as long as the model
    record = {
        "bits": config.bits, "group_size": config.groups, "method": "rtn", "engine": "openvino",
        "nncf_mode": openvino_lm.MODES[config.bits], "ratio": 1.0 if config.bits == 4 else None,
        "inference_precision": runner.precision, "nncf": nncf.__version__, "openvino": ov.__version__,
        "compressed_matrices": openvino_lm.compressed_matrices(ov_model),
        "float_layers": {name: "--exclude" for name in config.float_modules},
    }  # fmt: skip
    hf_dir = loaded.info.get("hf_dir")
    writer = lambda path: openvino_lm.write_folder(files.name, path, record, module.config, hf_dir)  # noqa: E731
    return runner, record, writer


def _flow(config: WeightOnlyConfig, model: Any, output: Any, **options: Any) -> Any:
    from ptopt.compress.quantize.lm_flow import quantize_lm

    _requires(config)  # a flow row runs the whole stage: its requirements are checked here
    return quantize_lm(config, model, output, build=_build, fmt="openvino_lm", **options)


@register_technique(
    WeightOnlyConfig,
    "openvino",
    help="NNCF weight compression (int8 per channel, int4 per group, data-free) run by OpenVINO; "
    "an OpenVINO language-model folder",
    gated=False,
    check=_check,
    requires=_requires,
    flow=_flow,
)
def weight_only_openvino(config: WeightOnlyConfig, prep: Any, progress: bool) -> Any:
    raise UsageError("weight-only quantization runs through ptopt.quantize(mode='weight-only')")
