"""``quantize``: the Python twin of ``ptopt quantize``.

=========  ==============================================================  ==========================
mode       what                                                            needs
=========  ==============================================================  ==========================
dynamic    int8 weights of Linear / LSTM / GRU (and transformers' Conv1D,  no calibration; a shape or
           as the Linear it is), int8 Embedding rows, activations          data when the model
           quantized on the fly (never convolutions: ConvInteger is        declares no input shape
           slower than fp32)
static     graph-mode (FX) post-training int8: conv-bn(-relu) and          ``calib_data``
           linear-relu fused, observers calibrated on data
qat        fake-quant fine-tuning with the shared trainer, then convert    ``train_data``
=========  ==============================================================  ==========================

In memory (the notebook form)::

    res = ptopt.quantize(model, "static", calib_data=calib_tensor)
    res.model(x)                 # the int8 model as the artifact holds it, in this process
    res.metrics                  # accuracy (with eval_data) and sizes, before any save
    res.save("model.int8.pt")    # the same module written with its sidecar (or pass output=)

``res.model`` is exactly what the artifact holds. With ``engine="fx"`` (the default) that is a
frozen TorchScript module traced from the int8 model, serialized once in memory and loaded back from
those bytes, checked against the int8 model at three batch sizes, so it runs without any
quantization context (e.g. the MHA fast path, which int8 transformers must not take) and loads with
plain ``torch.jit.load`` once saved. The sidecar records the config, the calibration, which layers
stayed float and why, and what ``ptopt export`` needs to redo the quantization in ONNX Runtime. With
``engine="pt2e"`` it is the AOTInductor package's loaded model (``.pt2``), or with ``compile=False``
the int8 ExportedProgram's module.

Before the Result is returned, the int8 model is judged against its fp32 source by export's parity
rule (``ptopt.compress.fidelity``); a static or dynamic model that breaks it raises ParityError
(with ``output``, the file is kept aside as ``<output>.failed``) naming the layers to keep float.

Which engine makes the model is a row of the technique table (``table.py``); the steps around it
are the engine-neutral flow (``flow.py``).
"""

from __future__ import annotations

import os
from typing import Any

from ptopt.compress.distributed import is_main_process
from ptopt.compress.quantize import auto_int8
from ptopt.compress.quantize.config import OPTIONS, QuantConfig, SearchOptions, require_data
from ptopt.compress.quantize.flow import judged, prepare, quantize_prepared, winner_output
from ptopt.compress.quantize.resolve import resolve_config
from ptopt.compress.quantize.table import technique
from ptopt.compress.stage import check_output, finish
from ptopt.core import progress as _progress
from ptopt.core.errors import UsageError


def _refuse_lm_qat(model: Any) -> None:
    """QAT here is the classifiers' (torch.ao FX / PT2E graphs); a language model's is distillation."""
    from ptopt.compress.distill_lm import is_lm_request

    if is_lm_request(model):
        raise UsageError(
            "--mode qat trains classifiers through torch.ao/PT2E graphs; QAT of a language model is "
            "ptopt distill --teacher hf:M --student hf:M --qat 8da4w|8da8w --train-data TEXT (docs/distill.md)"
        )


@_progress.reported
@OPTIONS.twin
def quantize(
    model: Any,
    mode: str | None = None,
    output: str | os.PathLike | None = None,
    *,
    config: QuantConfig | None = None,
    calib_data: Any = None,
    train_data: Any = None,
    eval_data: Any = None,
    input_shapes: Any = (),
    weights: Any = None,
    allow_pickle: bool = False,
    progress: bool = True,
    advice: bool = True,
    **options: Any,
) -> Any:
    """Quantize ``model`` to int8; returns a :class:`~ptopt.core.result.Result` (see the module doc).

    ``model``: an nn.Module, a MODEL reference or a LoadedModel (never modified). ``calib_data``
    (static), ``train_data`` (QAT) and ``eval_data`` (fp32 vs int8 accuracy, in ``metrics``): DATA
    references or in-memory data (tensor, (x, y), dict, Dataset, DataLoader, list of batches).
    ``output``: also save there. ``config`` (a ``StaticQuantConfig`` / ``DynamicQuantConfig`` /
    ``QATConfig`` / ``WeightOnlyConfig``) replaces the loose ``options`` (the fields of the mode's
    config, listed below); a loose option that contradicts it, or does not apply to the mode, is a
    UsageError. ``accuracy_budget`` / ``min_cosine`` (with ``eval_data``; ``SearchOptions``):
    accuracy-aware search (``ptopt.compress.quantize.autoquant``): returns the chosen model's Result
    (``.search``: the search), or raises GateFailedError (after saving the closest model when
    ``output`` is given; ``.result``: the search) when no candidate holds; ``analyze=True`` returns the
    search's layer ranking and writes nothing. ``engine``: fx (int8 TorchScript; dynamic's default) |
    pt2e (torchao PT2E, an AOTInductor ``.pt2`` package) | openvino (static: NNCF int8 of the OpenVINO
    IR, ``.xml``) | auto (static's default: fx, then pt2e, then openvino, the first whose int8 holds the
    int8 rule, whole or with the most sensitive layers float; qat: both timed, the faster within 0.5
    accuracy points): the rows of ``ptopt.compress.quantize.table``. ``compile=False`` (pt2e): the int8
    ExportedProgram ``.pt2`` instead of an AOTInductor package. ``mode="weight-only"`` (language
    models): ``bits`` 8 | 4, ``group_size``, ``method`` rtn | hqq | awq | gptq (awq, gptq fitted on
    ``calib_data`` text), perplexity on ``eval_data`` text; a folder (``lm_flow``); ``decode_step=N``
    adds the decode step as an ExportedProgram with an N-token static KV cache. ``advice=False``: an int8
    model that breaks the int8 rule is refused without the advice that names the layers to keep float
    (a search: minutes on a transformer), as ``optimize`` does, whose own float-layer candidates run
    under its time budget.
    """
    config, search = resolve_config(mode, config, options)
    common = dict(input_shapes=input_shapes, weights=weights, allow_pickle=allow_pickle, progress=progress)
    if search.active:
        if train_data is not None:
            raise UsageError("--train-data does not apply to accuracy-aware quantization (it trains nothing)")
        return _accuracy_aware(model, config, search, output, calib_data, eval_data, common)
    flow = technique(config.mode, config.engine).flow
    if flow is not None:  # the row runs the whole stage (language models)
        common.pop("input_shapes")
        return flow(
            config, model, output, calib_data=calib_data, eval_data=eval_data, train_data=train_data, **common
        )
    check_output(output, hint=" such as model.int8.pt")
    if config.mode == "qat":
        _refuse_lm_qat(model)
    _check_suffix(output, config)
    require_data(config, calib_data=calib_data, train_data=train_data)
    prep = prepare(config, model, weights, allow_pickle, input_shapes, calib_data, train_data, eval_data)
    with auto_int8.writing(output):
        result = quantize_prepared(config, prep, progress)
    if config.mode == "qat" and not is_main_process():
        return None  # under torchrun every process trained (the trainer's DDP); rank 0 judges and writes
    output = winner_output(result, config.engine, output)
    judged(result, config, prep, output, advice)
    return finish(result, output)


def _check_suffix(output: Any, config: Any) -> None:
    """Before any work: quantize writes int8 TorchScript (``.pt``) or a PT2E ``.pt2``; static int8 also an
    OpenVINO IR (``.xml``: ``--engine openvino``, or ``auto`` asked for that file); an int8 file of another
    runtime (``.onnx``) is ``ptopt export --precision int8``'s, which the error says."""
    from pathlib import Path

    from ptopt.core.formats import targets

    if output is None:
        return
    suffix = Path(output).suffix.lower()
    torch_rows = [row for row in targets().values() if row.runtime == "torch"]
    only = auto_int8.ONLY_FOR_SUFFIX.get(suffix)
    if config.mode == "static" and only is not None and config.engine in ("auto", only):
        return
    if any(suffix in row.suffixes for row in torch_rows):
        if config.mode == "static" and config.engine in auto_int8.ONLY_FOR_SUFFIX.values():
            fmt = next(s for s, e in auto_int8.ONLY_FOR_SUFFIX.items() if e == config.engine)
            raise UsageError(f"output {output}: --engine {config.engine} writes a {fmt} file (-o NAME{fmt})")
        return
    other = next((row for row in targets().values() if suffix in row.suffixes), None)
    hint = "int8 TorchScript (.pt) or a PT2E .pt2 (--engine pt2e)"
    if config.mode == "static":
        hint += ", or an OpenVINO IR (.xml: --engine openvino or auto)"
    if other is not None and "int8" in other.converts:
        hint += (
            f"; an int8 {other.label} file is made by ptopt export MODEL --target {other.target} "
            "--precision int8 --data CALIB"
        )
    raise UsageError(f"output {output}: quantize writes {hint}")


def _accuracy_aware(
    model: Any,
    config: QuantConfig,
    search: SearchOptions,
    output: Any,
    calib_data: Any,
    eval_data: Any,
    common: dict[str, Any],
) -> Any:
    """``autoquantize`` for ``quantize(accuracy_budget=... | min_cosine=... | analyze=True)``: the
    chosen model's Result (saved at ``output`` when given; ``.search`` the search), the ranking alone
    with ``analyze``; GateFailedError (``.result``: the search) when no candidate met the goal."""
    from ptopt.compress.quantize.autoquant import run_search

    found = run_search(model, config, search, output, calib_data=calib_data, eval_data=eval_data, **common)
    if search.analyze:
        return found
    found.raise_if_missed()
    found.result.search = found
    return found.result
