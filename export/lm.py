"""``ptopt export`` of a causal language model (a Hugging Face folder, ``hf:DIR``, or a transformers causal
LM in memory): the decoder with its KV cache as explicit inputs and outputs, as optimum exports it.

    ptopt export hf:smollm2 --target onnx|openvino|exported_program|aoti -o smol-onnx/

The artifact is a folder (``ptopt.formats.onnx_lm``, ``torch_lm``, ``openvino_lm``): the graph, the
source's ``config.json`` and tokenizer, and ``ptopt_lm.json``. Its inputs are ``input_ids``,
``attention_mask``, ``position_ids`` and one ``past_key_values.N.key/value`` pair per layer, its outputs
``logits`` and ``present.N.key/value`` (``ptopt.formats.lm_graph``); the sequence and the past are
dynamic, up to the model's positions, and the batch ranges over ``--dynamic-batch`` (default 1..8).
OpenVINO's IR is stateful instead (the cache lives in the CPU plugin between calls, as optimum-intel
makes it; inputs ``input_ids`` and ``attention_mask``, batch 1).

Before anything is written where asked, the folder is read back and checked against transformers
(``ptopt.export.lm_check``): greedy generation of ``--new-tokens`` tokens (default 32) after a prompt
(the first 16 tokens of ``--data`` text or token ids, or seeded random ids), the teacher-forced logits,
and a left-padded batch of two. ``.model`` is the folder's model (a ``CachedLM`` / ``OpenVINOLM``:
called like a transformers model, with a greedy ``generate``), which ``ptopt validate`` scores and times.
fp32 only: int8 / int4 weights come from ``ptopt quantize --mode weight-only`` (``--engine openvino``
for OpenVINO).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from ptopt.core.atomic import ScratchDir
from ptopt.core.errors import ParityError, UsageError

#: greedy tokens the export is checked on unless told
NEW_TOKENS = 32
#: prompt tokens of the check
PROMPT_TOKENS = 16
#: what a causal LM exports to (``--target`` -> the LM folder's format)
LM_TARGETS = {"onnx": "onnx_lm", "openvino": "openvino_lm", "exported_program": "exported_program_lm",
              "aoti": "aoti_lm"}  # fmt: skip
#: ExportConfig fields that have no meaning for a causal LM's export (-> the flag that set them)
_NOT_FOR_LM = {"script": "--script", "optimize": "--optimize", "int8_method": "--int8-method",
               "static_batches": "--static-batch", "cuda_graphs": "--cuda-graphs",
               "accuracy_control": "--accuracy-control", "float_modules": "--exclude"}  # fmt: skip


def is_lm_reference(model: Any) -> bool:
    """Whether ``model`` names a Hugging Face folder (``hf:DIR`` or a folder with ``config.json``) or is a
    transformers causal LM, without loading a file."""
    from ptopt.core.hf import is_causal_lm, names_lm_folder

    if isinstance(model, (str, os.PathLike)):
        return names_lm_folder(model)
    return is_causal_lm(model)


def export_lm(source: Any, config: Any, output: Any, options: dict[str, Any]) -> Any:
    """The causal-LM export of the module docstring. ``source``: the loaded model (``export.api``'s
    ``_Source``); ``options``: ``export``'s shape keywords and ``data``. Returns the Result (a folder)."""
    from ptopt.core.result import Result, check_folder_output
    from ptopt.formats.lm_graph import check_cache

    row = _row(config)
    _refuse(config, options)
    if output is not None:
        check_folder_output(Path(output), row.name)
    module = source.module
    check_cache(module)
    record = _record(module, config, row, options.get("dynamic_batch"))
    prompt = _prompt(options.get("data"), module, source.loaded.info.get("hf_dir"), config, record)
    folder = ScratchDir(prefix="ptopt-export-lm-")
    path = Path(folder.name) / (Path(output).name if output is not None else "model")
    path.mkdir()
    try:
        model, record = _write_and_check(row, module, path, record, prompt, config, source, output)
    except BaseException:
        folder.cleanup()
        raise
    template = _template(row, config, source, record, path)
    writer = lambda dest: {"files": _copy(path, dest, folder)}  # noqa: E731 - keeps the folder alive
    return Result(model, template, writer, inputs_paths=(source.path,), source=source.loaded, folder=True)


def _row(config: Any) -> Any:
    from ptopt.core.formats import get_format

    if config.target not in LM_TARGETS:
        raise UsageError(
            f"--target {config.target} does not take a causal language model with its KV cache: use "
            f"--target {' | '.join(LM_TARGETS)} (a folder with the decoder, its cache as inputs and outputs)"
        )
    return get_format(LM_TARGETS[config.target])


def _refuse(config: Any, options: dict[str, Any]) -> None:
    """Options that do not apply to a causal LM's export: one line naming the flag."""
    if config.precision not in (None, "fp32"):
        raise UsageError(
            f"--precision {config.precision}: a causal language model exports in fp32; for int8 / int4 weights "
            "run ptopt quantize hf:DIR --mode weight-only (--engine openvino for OpenVINO)"
        )
    for field, flag in _NOT_FOR_LM.items():
        if getattr(config, field):
            raise UsageError(f"{flag} does not apply to a causal language model's export")
    if config.on_cuda:
        raise UsageError("--device cuda: a causal language model exports and is checked on the CPU here")
    for key in ("min_shape", "opt_shape", "max_shape", "input_shapes", "input_specs"):
        if options.get(key):
            raise UsageError(
                "a causal language model's inputs are fixed by its cache (input_ids, attention_mask, "
                "position_ids, past_key_values.N.key/value); give the batch range with --dynamic-batch MIN:OPT:MAX"
            )


def _record(module: Any, config: Any, row: Any, dynamic_batch: Any) -> dict[str, Any]:
    """What ``ptopt_lm.json`` says about the graph before it is written."""
    import torch

    from ptopt.core.lm import max_positions, weight_bytes
    from ptopt.core.system import package_version
    from ptopt.formats.lm_experts import experts_record
    from ptopt.formats.lm_graph import DEFAULT_BATCH, io_names, layout

    batch = _batch(dynamic_batch, config.target)
    longest = max_positions(module)
    if longest is None or longest < 8:
        raise UsageError(
            f"{type(module).__name__}: its config states no position limit (max_position_embeddings)"
        )
    lay = layout(module.config)
    inputs, outputs = io_names(lay["layers"], position_ids=config.target != "openvino")
    return {
        "target": config.target, "format": row.name, "precision": "fp32", "layout": lay,
        "batch": list(batch or DEFAULT_BATCH), "max_positions": longest, "weight_bytes": weight_bytes(module),
        "inputs": inputs if config.target != "openvino" else ["input_ids", "attention_mask"],
        "outputs": outputs if config.target != "openvino" else ["logits"],
        "stateful": config.target == "openvino", "opset": config.opset,
        "versions": {"torch": torch.__version__, "transformers": package_version("transformers")},
        **experts_record(module),
    }  # fmt: skip


def _batch(value: Any, target: str) -> tuple[int, int] | None:
    """``--dynamic-batch MIN:OPT:MAX`` as (min, max); OpenVINO's stateful IR runs batch 1."""
    if value is None:
        return (1, 1) if target == "openvino" else None
    parts = str(value).split(":")
    try:
        nums = [int(p) for p in parts]
    except ValueError:
        raise UsageError(f"--dynamic-batch {value!r}: give MIN:OPT:MAX, e.g. 1:1:8") from None
    lo, hi = nums[0], nums[-1]
    if len(nums) not in (1, 3) or lo < 1 or hi < lo:
        raise UsageError(f"--dynamic-batch {value!r}: give MIN:OPT:MAX with 1 <= MIN <= MAX, e.g. 1:1:8")
    if target == "openvino" and hi > 1:
        raise UsageError(
            "--target openvino writes a stateful IR (the KV cache kept in the plugin): batch 1 only"
        )
    return (lo, hi)


def _prompt(data: Any, module: Any, hf_dir: Any, config: Any, record: dict[str, Any]) -> Any:
    """The check's prompt: the first tokens of ``data`` (text or token ids), or seeded random ids."""
    import torch

    from ptopt.core.lm import token_ids

    new = config.new_tokens or NEW_TOKENS
    vocab = record["layout"]["vocab"]
    ids = token_ids(data, vocab, hf_dir, "--data") if data is not None else None
    if ids is None:
        ids = torch.randint(0, vocab, (PROMPT_TOKENS,), generator=torch.Generator().manual_seed(0))
    ids = ids.reshape(-1)[:PROMPT_TOKENS]
    if ids.numel() < 2:
        raise UsageError("--data holds fewer than 2 tokens: the check needs a prompt")
    if ids.numel() + new > record["max_positions"]:
        raise UsageError(
            f"the check's {ids.numel()}-token prompt + --new-tokens {new} = {ids.numel() + new} tokens, and "
            f"the model covers {record['max_positions']} positions"
        )
    return ids


def _write_and_check(
    row: Any, module: Any, path: Path, record: dict, prompt: Any, config: Any, source: Any, output: Any
) -> tuple[Any, dict]:
    """Write the folder, read it back as a user does, check it (``lm_check``); the read-back model and the
    final record. A failed check keeps the folder aside as ``OUT.failed``."""
    from ptopt.core import progress
    from ptopt.core.formats import with_article
    from ptopt.export.lm_check import check_lm
    from ptopt.export.parity import min_cosine_for, tolerances
    from ptopt.formats.lm_folder import write_companions, write_record

    hf_dir = source.loaded.info.get("hf_dir")
    new = config.new_tokens or NEW_TOKENS
    with progress.step(f"writing {with_article(row.label)}", announce=False):  # each long part says its step
        row.write_lm(module, path, record)
        write_companions(path, module, record, hf_dir, row.record_file)
        loaded = row.load(path, None, allow_pickle=True)  # ptopt wrote it in this call: trusted
    rule = (*tolerances("fp32", config.atol, config.rtol), min_cosine_for("fp32", config.min_cosine))
    what = f"checking it against transformers ({new} greedy tokens, the logits, a padded batch)"
    try:
        with progress.step(what, announce=False):
            record["check"] = check_lm(
                module, loaded.module, prompt, new, rule, batched=record["batch"][1] > 1
            )
    except ParityError as e:
        if output is not None:
            failed = Path(str(output) + ".failed")
            shutil.rmtree(failed, ignore_errors=True)
            shutil.copytree(path, failed)
            raise ParityError(f"{e}; kept aside for inspection as {failed}") from None
        raise
    write_record(path, record, row.record_file)
    return loaded.module, record


def _template(row: Any, config: Any, source: Any, record: dict[str, Any], path: Path) -> Any:
    from ptopt.core.artifact import Artifact

    check = record["check"]
    metrics = {k: check[k] for k in ("parity", "greedy", "batch") if k in check}
    lm = {k: record[k] for k in ("inputs", "outputs", "layout", "batch", "max_positions", "stateful",
                                 "weight_bytes", "experts") if k in record}  # fmt: skip
    facts = {k: record[k] for k in ("opset", "exporter", "method", "compile_seconds", "compile_cache", "compiler", "cpu_isa",
                                    "torch_version", "inference_precision") if record.get(k) is not None}  # fmt: skip
    return Artifact(
        path=path, format=row.name, precision="fp32", parent=source.loaded.parent_record(),
        config={**config.to_dict(), "precision": "fp32", "new_tokens": check["greedy"]["new_tokens"]},
        metrics=metrics,
        extra={"lm": lm, **facts},
    )  # fmt: skip


def _copy(src: Path, dest: Path, keep: Any) -> list[str]:
    """The checked folder's files into ``dest`` (``keep``: the temporary folder, alive while the Result
    is); returns them relative to ``dest``'s parent."""
    dest.mkdir(parents=True, exist_ok=True)
    for p in sorted(src.rglob("*")):
        if p.is_file():
            target = dest / p.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(p, target)
    return sorted(p.relative_to(dest.parent).as_posix() for p in dest.rglob("*") if p.is_file())
