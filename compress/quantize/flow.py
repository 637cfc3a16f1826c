"""The engine-neutral flow of int8 quantization, shared by ``quantize`` and accuracy-aware search.

load the model and the data (:func:`prepare`) → the technique table's row for ``(mode, engine)``
makes the int8 artifact in memory (its handler returns a ``base.Quantized``) → measure it against
fp32 (accuracy, fidelity, sizes: all in memory) and build the
:class:`~ptopt.core.result.Result` once (:func:`quantize_prepared`) → the row's gates
(:func:`judged`: too little int8, or not faithful to fp32, is refused with advice).

Nothing here names an engine: what differs between engines is in their rows
(``ptopt.compress.quantize.table``) and the handler files.
"""

from __future__ import annotations

import os
from typing import Any

from ptopt.compress.quantize import table
from ptopt.compress.quantize.base import Prepared, Quantized
from ptopt.compress.quantize.config import MIN_STATIC_SHARE, QuantConfig
from ptopt.compress.stage import (
    UNSAVED,
    check_fits,
    input_files,
    load_dataset,
    load_eager,
    refuse_if_unfaithful,
    settle_inputs,
)
from ptopt.core import progress
from ptopt.core.data import refuse_missing_file

#: layer kinds dynamic int8 quantizes, for pointing there
_DYNAMIC_KINDS = ("Linear", "LSTM", "GRU", "Embedding", "Conv1D")


def prepare(
    config: QuantConfig,
    model: Any,
    weights: Any,
    allow_pickle: bool,
    input_shapes: Any,
    calib_data: Any = None,
    train_data: Any = None,
    eval_data: Any = None,
) -> Prepared:
    """Load the eager model and the data, check they fit (typed errors), settle the input specs."""
    name = model if isinstance(model, (str, os.PathLike)) else type(model).__name__
    refuse_missing_file(calib_data=calib_data, train_data=train_data, eval_data=eval_data)  # before the model
    with progress.step(f"loading {name}", announce=False):  # heartbeats name what they wait for
        loaded = _logits_of_lm(load_eager(model, weights, allow_pickle, "quantization"))
    row = table.technique(config.mode, config.engine)
    if row.requires is not None:
        row.requires(config)
    if config.float_modules:
        from ptopt.compress.quantize.layers import check_module_names

        check_module_names(loaded.module, config.float_modules)
    with progress.step("reading the data", announce=False):
        calib = load_dataset(calib_data, "calibration", model=loaded)
        train = load_dataset(train_data, "training", model=loaded)
        evald = load_dataset(eval_data, "evaluation", model=loaded)
    fit = calib or train
    example = settle_inputs(loaded, fit or evald, input_shapes, "data (--calib-data / --eval-data)")
    for ds in (calib, train, evald):
        if ds is not None and ds is not (fit or evald):
            check_fits(loaded, ds)
    refs = {"calib_data": calib_data, "train_data": train_data, "eval_data": eval_data}
    return Prepared(loaded, loaded.module, calib, train, evald, example, refs)


def _logits_of_lm(loaded: Any) -> Any:
    """A transformers causal LM is quantized as the function from token ids to logits (``core.hf.
    logits_view``): its forward returns a KV cache object that no graph or TorchScript carries. The
    int8 artifact computes the logits of a whole sequence (no cache); for generation with a cache,
    ``ptopt quantize --mode weight-only`` or ``ptopt export --target onnx`` then ORT's int8."""
    import dataclasses

    from ptopt.core.hf import is_causal_lm, logits_view

    if not is_causal_lm(loaded.module):
        return loaded
    view = logits_view(loaded.module)
    # the view takes input_ids and attention_mask: specs the model came with that name only these are
    # kept (an artifact must take the inputs its sidecar records); any others are guessed anew
    specs = loaded.input_specs
    keep = bool(specs) and {s.name for s in specs} <= {"input_ids", "attention_mask"}
    return dataclasses.replace(
        loaded, module=view, input_specs=list(specs) if keep else [], input_style="keyword"
    )


def quantize_prepared(config: QuantConfig, prep: Prepared, progress: bool) -> Any:
    """The unsaved Result of ``config``'s row for the prepared model and data: the handler makes the
    int8 artifact in memory, the flow measures it and describes it (its sidecar-to-be) once."""
    from ptopt.core import progress as steps

    with steps.step(f"quantizing to int8 ({config.mode}, engine {config.engine})", announce=False):
        made = table.technique(config.mode, config.engine).handler(config, prep, progress)
    return build_result(config, prep, made)


def build_result(config: QuantConfig, prep: Prepared, q: Quantized) -> Any:
    """``q`` measured against the fp32 model (accuracy with eval data, fidelity, sizes against the
    fp32 TorchScript's, all in memory) and wrapped in a Result whose ``save`` runs ``q.write``."""
    from ptopt.compress.quantize import measure
    from ptopt.compress.quantize.scripted import torchscript_bytes
    from ptopt.core.artifact import Artifact
    from ptopt.core.result import Result

    with q.context(), progress.step("measuring int8 against fp32", announce=False):
        metrics = measure.accuracy(prep.module, q.model, prep.evald, prep.refs.get("eval_data"), q.eval_batch)
        metrics |= measure.sizes(q.size, torchscript_bytes(prep.module, prep.example, prep.style))
        metrics |= q.metrics
        # a chooser that judged its pick as written on check_data (auto) hands its record on
        metrics |= measure.vs_fp32(prep.module, q.model, prep, q.metrics.get("vs_fp32"))
    share = measure.int8_share(prep.module, prep.example, q.float_layers)
    template = Artifact(
        path=UNSAVED,
        format=q.format,
        inputs=list(q.specs or prep.specs),
        input_style=prep.style,
        config=q.config.to_dict() | {"mode": config.mode} | prep.ref_names(),
        parent=prep.loaded.parent_record(),
        precision="int8",
        metrics=metrics,
        extra={"float_layers": q.float_layers, "int8_share": share, **q.summary, **_source_layer(prep)},
    )
    sources = input_files(prep.loaded.path, prep.loaded.info.get("weights"), *prep.refs.values())
    return Result(q.model, template, q.write, inputs_paths=sources, source=prep.loaded)


def _source_layer(prep: Prepared) -> dict[str, str]:
    """``{"output_layer": ...}`` read on the fp32 model (``core.scores``): the int8 graph may have lost
    what says its outputs are features (an ``nn.Identity`` classifier); empty where it cannot be read."""
    from ptopt.core.data import Dataset
    from ptopt.core.scores import output_layer

    layer = output_layer(prep.module, Dataset(prep.example, name="example").take(1).x)
    return {"output_layer": layer} if layer is not None else {}


def judged(result: Any, config: QuantConfig, prep: Prepared, output: Any, advice: bool = True) -> None:
    """The gates of ``config``'s row: too small an int8 share is refused (UnsupportedModelError), and
    an int8 model that breaks export's parity rule against fp32 (ParityError, the file kept aside as
    ``<output>.failed``) with the advice of the engine that made it (the layers to keep float; with
    ``advice=False`` without it: finding them is a search)."""
    row = table.technique(config.mode, config.engine)
    if row.min_int8_share:
        refuse_if_mostly_float(result, prep, row.min_int8_share)
    if not row.gated:
        return
    made_by = config
    if row.advise is None:  # a chooser without advice of its own: the advice of the engine it chose
        made_by = config.replace(engine=result.config.get("engine", config.engine))
    advise = table.technique(made_by.mode, made_by.engine).advise if advice else None
    refuse_if_unfaithful(result, output, (lambda: advise(made_by, prep)) if advise else None)


def winner_output(result: Any, engine: str, output: Any) -> Any:
    """The path an ``engine`` result is saved at. On ``auto`` the engine that won decides the file:
    an output named for the other engine (``.pt`` when PT2E's ``.pt2`` package won, ``.pt2`` when fx's
    TorchScript did) takes the winner's suffix, said in a note (``wrote`` prints the path). The output
    of a named engine is left as given (``Result.save`` refuses a suffix that does not fit)."""
    from pathlib import Path

    from ptopt.core.formats import find_format, targets

    if output is None or engine != "auto":
        return output
    path, row = Path(output), find_format(result.template.format)
    allowed = result.suffixes or (row.suffixes if row is not None else ())
    if not allowed or path.suffix.lower() in allowed:
        return output
    # the suffixes of the torch formats (the engines' files): replaced; any other suffix is part of the name
    torch_suffixes = {s for r in targets().values() if r.runtime == "torch" for s in r.suffixes}
    new = (
        path.with_suffix(allowed[0]) if path.suffix.lower() in torch_suffixes else Path(f"{path}{allowed[0]}")
    )
    chosen = result.template.config.get("engine", "?")
    progress.note(f"engine {chosen} won: its {row.label if row else 'file'} is written as {new}")
    return new


def refuse_if_mostly_float(result: Any, prep: Prepared, minimum: float = MIN_STATIC_SHARE) -> None:
    """Int8 that leaves (nearly) every weight float is refused before anything is written, pointing
    to ``--mode dynamic`` when that quantizes the layers this mode cannot."""
    from ptopt.core.errors import UnsupportedModelError

    share = result.extra["int8_share"]
    if share["parameters"] >= minimum:
        return
    floats = result.extra["float_layers"]
    kinds = {n: type(prep.module.get_submodule(n)).__name__ for n in floats}
    movable = [n for n, k in kinds.items() if k in _DYNAMIC_KINDS]
    why = "; ".join(f"{n}: {floats[n]}" for n in list(floats)[:3])
    todo = (
        f" Use --mode dynamic (the same command with --mode dynamic): it quantizes {', '.join(movable[:4])}"
        if movable
        else " int8 does not apply to this model's layers"
    )
    raise UnsupportedModelError(
        f"{result.config['mode']} int8 would quantize only {100 * share['parameters']:.1f}% of the parameters "
        f"({share['layers']} of {share['of_layers']} layers with weights): the file would be about as "
        f"large as fp32 and no faster ({why}).{todo}"
    )
