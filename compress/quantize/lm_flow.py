"""The flow of weight-only quantization (language models): load the model and its text, quantize
a copy (``techniques/weight_only.py``), measure it against the source (weight bytes; perplexity on
``eval_data`` when given, which the calibration never read), and build the Result once; ``save``
writes the folder (``ptopt.formats.hf``).

Text data (``ptopt.core.text``): a ``.txt`` file tokenized with the model folder's tokenizer, token
ids in a ``.pt``/``.npy``, or ``builtin:pydoc-text:calib|eval``. Calibration (awq, gptq) reads
``calibration_samples`` windows of ``calibration_length`` tokens, spread over the calibration text.
"""

from __future__ import annotations

import copy
from typing import Any

from ptopt.compress.quantize.config import WeightOnlyConfig, require_data
from ptopt.compress.stage import UNSAVED, input_files, load_eager
from ptopt.core import progress
from ptopt.core.errors import UsageError


def quantize_lm(
    config: WeightOnlyConfig,
    model: Any,
    output: Any,
    *,
    calib_data: Any = None,
    eval_data: Any = None,
    build: Any = None,
    fmt: str = "hf_weight_only",
    **options: Any,
) -> Any:
    """``ptopt.quantize(model, "weight-only", ...)`` (see ``ptopt.compress.quantize.api``). ``build(config,
    loaded, calib) -> (model, record, writer)``: the engine's step (default: torchao's,
    :func:`torchao_build`); ``fmt``: the sidecar format its writer writes."""
    from ptopt.compress.stage import finish
    from ptopt.core.result import check_folder_output

    if options.get("train_data") is not None:
        raise UsageError("--train-data does not apply to weight-only quantization (it trains nothing)")
    if output is not None:
        from pathlib import Path

        check_folder_output(Path(output), fmt)
    require_data(config, calib_data=calib_data)
    loaded = load_eager(
        model, options.get("weights"), options.get("allow_pickle", False), "weight-only quantization"
    )
    source = loaded.module
    from ptopt.compress.quantize.layers import check_module_names

    check_module_names(source, config.float_modules)  # a misspelt --exclude is no silent full quantization
    hf_dir = loaded.info.get("hf_dir")
    calib = _token_ids(calib_data, source, hf_dir, "calibration text") if config.needs is not None else None
    if calib_data is not None and calib is None:  # nor is it checked against the evaluation text
        from ptopt.core import progress

        progress.note(f"--calib-data unused: --method {config.method} reads no calibration text")
    evald = _token_ids(eval_data, source, hf_dir, "evaluation text")
    if calib is not None and evald is not None and _overlap(calib, evald):
        raise UsageError("--calib-data and --eval-data hold the same text: perplexity must be measured on "
                         "text the calibration never read (e.g. builtin:pydoc-text:calib and :eval)")  # fmt: skip
    q, record, writer = (build or torchao_build)(config, loaded, calib)
    record["calibration"] = _calib_record(calib, calib_data, config)
    metrics = _measure(source, q, evald, eval_data)
    result = _result(config, loaded, q, record, metrics, (calib_data, eval_data), writer, fmt)
    return finish(result, output)


def torchao_build(config: WeightOnlyConfig, loaded: Any, calib: Any) -> tuple[Any, dict, Any]:
    """The torchao row's step: a quantized copy of the module, its record, its folder's writer."""
    from ptopt.compress.quantize.weight_only import quantize_module
    from ptopt.formats.hf import write_weight_only

    q = copy.deepcopy(loaded.module).eval()
    with progress.step(f"quantizing the weights to int{config.bits} ({config.method})"):
        record = quantize_module(q, config, _calibrator(calib, config))
    files = {}
    if config.decode_step:  # checked in memory before anything is written
        from ptopt.formats.hf_decode import DECODE_FILE, capture

        with progress.step(
            f"capturing the decode step ({config.decode_step}-token KV cache) with torch.export"
        ):
            files[DECODE_FILE], record["decode_step"] = capture(q, config.decode_step)
    hf_dir = loaded.info.get("hf_dir")
    return q, record, lambda path: write_weight_only(q, path, record, hf_dir, files)


def _token_ids(ref: Any, model: Any, hf_dir: Any, name: str) -> Any:
    from ptopt.core.lm import token_ids

    return token_ids(ref, getattr(getattr(model, "config", None), "vocab_size", None), hf_dir, name)


def _overlap(a: Any, b: Any) -> bool:
    """Whether the two streams are the same text (equal, or one's first window inside the other)."""
    n = min(64, a.numel(), b.numel())
    return a.numel() == b.numel() and bool((a == b).all()) or bool((a[:n] == b[:n]).all())


def _windows(ids: Any, config: WeightOnlyConfig) -> list[Any]:
    """Up to ``calibration_samples`` windows of ``calibration_length`` tokens, evenly spread."""
    length = min(config.calibration_length, ids.numel())
    starts = max(1, ids.numel() - length + 1)
    k = min(config.calibration_samples, starts)
    step = max(1, starts // k)
    return [ids[i * step : i * step + length].unsqueeze(0) for i in range(k)]


def _calibrator(ids: Any, config: WeightOnlyConfig) -> Any:
    def calibrate(model: Any) -> None:
        import torch

        if ids is None:
            raise UsageError(config.needs[1] if config.needs else "calibration text is missing")
        with torch.inference_mode():
            for window in _windows(ids, config):
                model(input_ids=window, use_cache=False)

    return calibrate


def _calib_record(ids: Any, ref: Any, config: WeightOnlyConfig) -> dict[str, Any] | None:
    if ids is None or config.needs is None:
        return None
    windows = _windows(ids, config)
    return {"data": _name(ref), "windows": len(windows), "tokens_per_window": int(windows[0].shape[1])}


def _name(ref: Any) -> str:
    return str(ref) if isinstance(ref, str) or hasattr(ref, "__fspath__") else "in-memory token ids"


def _measure(source: Any, q: Any, ids: Any, ref: Any) -> dict[str, Any]:
    from ptopt.core.hf import is_causal_lm
    from ptopt.core.lm import eval_window, perplexity_change, weight_bytes

    fp, qb = weight_bytes(source), weight_bytes(q)
    metrics: dict[str, Any] = {"fp32_weight_bytes": fp, "weight_bytes": qb, "weight_bytes_ratio": qb / fp}
    if ids is not None and is_causal_lm(source):
        ids, of = eval_window(ids)
        ppl = perplexity_change(source, q, ids, ("fp32 perplexity", "quantized perplexity"))
        metrics |= {
            "eval_data": _name(ref),
            "perplexity_window": ppl["window"] | ({"of_tokens": of} if of else {}),
            "fp32_perplexity": ppl["before"],
            "perplexity": ppl["after"],
            "perplexity_increase_pct": ppl["increase_pct"],
        }
    return metrics


def _result(
    config: WeightOnlyConfig,
    loaded: Any,
    q: Any,
    record: dict,
    metrics: dict,
    refs: tuple,
    writer: Any,
    fmt: str,
) -> Any:
    from ptopt.core.artifact import Artifact
    from ptopt.core.result import Result

    refs_cfg = {
        k: str(v) for k, v in zip(("calib_data", "eval_data"), refs, strict=True) if isinstance(v, str)
    }
    template = Artifact(
        path=UNSAVED,
        format=fmt,
        config=config.to_dict() | {"mode": config.mode} | refs_cfg,
        parent=loaded.parent_record(),
        precision=f"int{config.bits}",
        metrics=metrics,
        extra={"weight_only": record, "float_layers": record.get("float_layers", {})},
    )
    sources = input_files(loaded.path, loaded.info.get("weights"), *refs)
    return Result(q, template, _writing(writer, config), inputs_paths=sources, source=loaded, folder=True)


def _writing(writer: Any, config: WeightOnlyConfig) -> Any:
    """``writer`` as a progress step: SmolLM2's int8 folder with its decode step takes ~50 s to write."""

    def write(path: Any) -> Any:
        with progress.step(f"writing the int{config.bits} folder"):
            return writer(path)

    return write
