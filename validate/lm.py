"""``ptopt validate`` for causal language models on text: the path ``api.validate`` takes when the
REFERENCE is a causal language model (a Hugging Face folder, ``hf:DIR``, a transformers causal LM in
memory or a weight-only ``Result``) and ``--data`` is text (``ptopt.core.text``: a ``.txt`` file,
``builtin:pydoc-text:...``, token ids in a ``.pt``/``.npy``, or a 1-D tensor of ids).

For the reference and every artifact (weight-only folders of ``quantize --mode weight-only``, those
of ``--engine openvino`` run by OpenVINO, other Hugging Face folders, models in memory), one at a
time: load it, its perplexity on the whole text (``core.lm.perplexity``: sliding window, ``context``
tokens of history moving by ``stride``), its weight bytes in memory (``core.lm.weight_bytes``), its
bytes on disk (every file of the folder) and the process's peak resident memory while it was loaded
and scored (``metrics.PeakMemory``). Then all of them, loaded together, generate in interleaved
rounds (``core.lm.interleaved_generation``: batch 1, KV cache, greedy, a ``prompt_tokens`` prompt
from the start of the text and ``new_tokens`` new ones): prefill and decode tokens/s, the median of
the rounds and their spread.

The report is validate's (schema ``ptopt.validate/1``, ``"task": "causal-lm"``): ``metric`` is
perplexity (lower is better), each artifact's ``accuracy_drop`` its perplexity increase in %, and every
entry has an ``lm`` object (docs/validate.md, "Language models"); every report format renders it.
Bad input (no tokenizer for text, ids outside the vocabulary, an artifact of another vocabulary, an
artifact that is no language model, options of the other path) is refused before anything is measured.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ptopt.core.errors import UsageError
from ptopt.core.lm import CONTEXT, STRIDE
from ptopt.core.options import option
from ptopt.validate import gates as _gates
from ptopt.validate import lineage as _lineage
from ptopt.validate import noise as _noise
from ptopt.validate.entry import Entry

SCHEMA = "ptopt.validate/1"
TASK = "causal-lm"
DEFAULT_PROMPT_TOKENS = 128
DEFAULT_NEW_TOKENS = 32
DEFAULT_ROUNDS = 5
#: without a perplexity gate, an artifact whose perplexity rose more than this (%) is not "best"
BEST_MAX_INCREASE_PCT = 1.0
BEST_RULE = (
    "best = the fastest decode (tokens/s at batch 1) among the artifacts that pass every gate; without "
    f"--max-perplexity-increase, among those whose perplexity rose at most {BEST_MAX_INCREASE_PCT:g}%"
)
RUNTIME = "torch eager"
#: what this path validates, as messages name it
KIND = "a causal language model on text"


@dataclasses.dataclass(frozen=True)
class LMOptions:
    """How perplexity is scored and generation timed (``rounds``: ``LatencyOptions``' option, here the
    generations per model)."""

    context: int = option(
        CONTEXT,
        help="Tokens of history per perplexity window (at most the model's positions).",
        applies=("lm",),
    )
    stride: int = option(STRIDE, help="Tokens the perplexity window moves by.", applies=("lm",))
    prompt_tokens: int = option(
        DEFAULT_PROMPT_TOKENS, help="Prompt length for the timed generations.", applies=("lm",)
    )
    new_tokens: int = option(
        DEFAULT_NEW_TOKENS, help="Tokens generated per timed generation.", applies=("lm",)
    )
    rounds: int = DEFAULT_ROUNDS

    def __post_init__(self) -> None:
        if self.context < 2 or not 0 < self.stride <= self.context:
            raise UsageError(
                f"--context must be >= 2 and --stride in 1..context, got {self.context} and {self.stride}"
            )
        for name, low in (("prompt_tokens", 1), ("new_tokens", 2), ("rounds", 1)):
            if getattr(self, name) < low:
                raise UsageError(f"--{name.replace('_', '-')} must be >= {low}, got {getattr(self, name)}")


# -- which path: the model and the data ------------------------------------------------------------


def _strip_scheme(ref: Any) -> Any:
    text = str(ref)
    return text[3:] if text.startswith("hf:") else ref


def is_lm_model(obj: Any) -> bool:
    """Whether ``obj`` (a MODEL reference, a module, a LoadedModel or a Result) is a causal language
    model, without loading a file: ``hf:DIR`` and Hugging Face folders are."""
    from ptopt.core.hf import is_causal_lm, names_lm_folder

    if isinstance(obj, (str, os.PathLike)):
        return names_lm_folder(obj)
    module = _module_of(obj)
    return is_causal_lm(module) or _runs_elsewhere(module)


def _runs_elsewhere(module: Any) -> bool:
    """A language model another runtime runs (an exported decoder with its KV cache, an OpenVINO LM: what
    ``ptopt.export(lm, "onnx")`` returns in memory): a config, a greedy ``generate`` and its folder's record."""
    return (
        getattr(module, "config", None) is not None
        and hasattr(module, "generate")
        and hasattr(module, "record")
    )


def _module_of(obj: Any) -> Any:
    """The module of a Result or a LoadedModel; anything else as it is."""
    from ptopt.core.modelref import LoadedModel
    from ptopt.core.result import Result

    if isinstance(obj, Result):
        return obj.model
    return obj.module if isinstance(obj, LoadedModel) else obj


def is_lm_data(data: Any) -> bool:
    """Whether ``data`` is text for a language model (module docstring); a ``.pt`` holding a dataset
    (a dict or tuple of batches) is not."""
    from ptopt.core.text import ID_SUFFIXES, is_text_ref

    if not isinstance(data, (str, os.PathLike)):
        import torch

        return isinstance(data, torch.Tensor) and data.dim() == 1 and not data.is_floating_point()
    if is_text_ref(data):
        return True
    path = Path(data)
    if path.suffix.lower() not in ID_SUFFIXES:
        return False
    if path.suffix.lower() == ".npy" or not path.is_file():
        return True
    import torch

    try:
        return isinstance(torch.load(path, weights_only=True, map_location="cpu"), torch.Tensor)
    except Exception:  # noqa: BLE001 - unreadable: read_token_ids says so in one line
        return True


def refuse_text_data(reference: Any, data: Any) -> None:
    """UsageError for text data with a REFERENCE that is neither a causal language model nor a Hugging
    Face encoder's folder (which reads it one sentence per line: ``ptopt.core.sentences``)."""
    from ptopt.core.sentences import sentence_folder
    from ptopt.core.text import is_text_ref

    if not is_text_ref(data) or is_lm_model(reference):
        return
    if str(data).startswith("builtin:") or sentence_folder(reference) is None:
        raise UsageError(
            f"--data {data} is text, which a causal language model reads as one stream and a Hugging Face "
            f"encoder or classifier folder (hf:DIR, with its tokenizer) as one sentence per line; REFERENCE "
            f"{reference} is neither"
        )


def check_generic_data(reference: Any, ds: Any, data_name: str) -> None:
    """A causal language model REFERENCE with float samples (images, features): refused in one line."""
    from ptopt.core.inputspec import flatten_inputs

    if is_lm_model(reference) and any(t.is_floating_point() for _, t in flatten_inputs(ds.x)):
        raise UsageError(
            f"REFERENCE {reference} is a causal language model and --data {data_name} holds float inputs "
            "(images?): give text (a .txt, builtin:pydoc-text:eval) or token ids (.pt/.npy of int64)"
        )


# -- the models: named and checked before anything is measured ----------------------------------------


@dataclasses.dataclass
class _Model:
    role: str
    obj: Any  # what loads it: a folder path, a module, a LoadedModel, a Result
    name: str
    folder: Path | None
    config: Any


def _describe(role: str, obj: Any, allow_pickle: bool) -> _Model:
    from ptopt.core.formats import sniff_file
    from ptopt.core.hf import check_causal_config, config_of, is_hf_dir
    from ptopt.core.result import Result
    from ptopt.validate.runners import display_name

    if isinstance(obj, Result) and obj.artifact is not None:
        obj = obj.artifact.path
    if isinstance(obj, (str, os.PathLike)):
        folder = Path(_strip_scheme(obj))
        if not is_hf_dir(folder):
            raise UsageError(
                f"{'REFERENCE' if role == 'reference' else 'ARTIFACT'} {obj} is not a causal language model "
                "folder (a Hugging Face folder with config.json, or a `ptopt quantize --mode weight-only` "
                "folder); a language model is validated against language models only"
            )
        fmt = sniff_file(folder)
        if fmt is not None:
            fmt.check_file(folder)  # an unreadable artifact is refused before anything is measured
            if fmt.trusted_load and not allow_pickle:  # so is one that runs native code, untrusted (aoti)
                fmt.load(folder, None, allow_pickle=False)
        check_causal_config(folder)  # so is a classifier's or an encoder's folder (from its config.json)
        return _Model(role, obj, display_name(folder), folder, config_of(folder))
    module = _module_of(obj)
    name = display_name(module) if hasattr(module, "parameters") else type(module).__name__  # not its repr
    if isinstance(obj, Result):  # what it is and how it was made, not LlamaForCausalLM (2), (3)
        name = obj.label
    if not is_lm_model(module):
        raise UsageError(f"{name} is not a causal language model (a transformers model)")
    return _Model(role, obj, name, None, module.config)


def _models(reference: Any, artifacts: Any, allow_pickle: bool = False) -> list[_Model]:
    """The reference and the artifacts, each a language model of the reference's vocabulary."""
    import torch

    from ptopt.core.result import Result

    many = not isinstance(artifacts, (str, os.PathLike, torch.nn.Module, Result))
    models = [_describe("reference", reference, allow_pickle)]
    models += [_describe("artifact", a, allow_pickle) for a in (artifacts if many else [artifacts])]
    vocab = getattr(models[0].config, "vocab_size", None)
    for m in models[1:]:
        if getattr(m.config, "vocab_size", None) != vocab:
            raise UsageError(
                f"{m.name}: a vocabulary of {getattr(m.config, 'vocab_size', None)} tokens, the reference's "
                f"{vocab}: not the same base model (an artifact must be made from the reference's architecture)"
            )
    seen: dict[str, int] = {}
    for m in models:  # names unique in the reports
        seen[m.name] = seen.get(m.name, 0) + 1
        m.name = m.name if seen[m.name] == 1 else f"{m.name} ({seen[m.name]})"
    return models


def _token_ids(data: Any, models: list[_Model], opts: LMOptions) -> Any:
    """The text as token ids (the tokenizer of the first folder that has one), checked against the
    vocabulary and the reference's positions."""
    from ptopt.core.hf import has_tokenizer
    from ptopt.core.lm import max_positions, token_ids

    folders = [m.folder for m in models if m.folder is not None]
    tok_dir = next((f for f in folders if has_tokenizer(f)), folders[0] if folders else None)
    ids = token_ids(
        data, getattr(models[0].config, "vocab_size", None), tok_dir, f"--data {_data_name(data)}"
    )
    longest = max_positions(type("M", (), {"config": models[0].config})())
    prompt = min(opts.prompt_tokens, int(ids.numel()))
    need = prompt + opts.new_tokens
    if longest is not None and need > longest:
        given = f"--prompt-tokens {opts.prompt_tokens}" + (
            f" (the data holds {prompt} tokens)" if prompt < opts.prompt_tokens else ""
        )
        raise UsageError(
            f"{given} + --new-tokens {opts.new_tokens} = {need} tokens, and {models[0].name} covers {longest} "
            "positions"
        )
    return ids


def _data_name(data: Any) -> str:
    return str(data) if isinstance(data, (str, os.PathLike)) else "in-memory token ids"


# -- measuring: one model at a time, then all of them timed together ----------------------------------


def _precision(loaded: Any, module: Any) -> str:
    art = loaded.artifact
    if art is not None and getattr(art, "precision", None):
        return str(art.precision)
    record = getattr(module, "record", None)
    if record:  # a folder of another runtime, without its sidecar
        return str(record.get("precision") or f"int{record['bits']}")
    import torch

    dtype = next((p.dtype for p in module.parameters()), torch.float32)
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, str(dtype))


def _runtime(fmt_name: str) -> str:
    """What runs the model: torch eager, or the runtime of its format (``openvino``)."""
    from ptopt.core.formats import find_format

    fmt = find_format(fmt_name)
    return fmt.runs_on if fmt is not None and (fmt.runtime != "torch" or fmt.runtime_label) else RUNTIME


def _evaluate_one(m: _Model, ids: Any, opts: LMOptions, allow_pickle: bool) -> tuple[Entry, Any]:
    """Load, score and size one model inside ``PeakMemory``; returns its entry and its module."""
    from ptopt.core.lm import perplexity, weight_bytes
    from ptopt.core.modelref import as_loaded
    from ptopt.validate.metrics import PeakMemory, size_info

    t0 = time.perf_counter()
    with PeakMemory() as mem:
        loaded = as_loaded(m.obj, None, allow_pickle)
        module = loaded.module
        ppl = perplexity(module, ids, opts.context, opts.stride, what=f"perplexity of {m.name}")
    files = sorted(p for p in m.folder.rglob("*") if p.is_file()) if m.folder is not None else []
    art = loaded.artifact
    entry = Entry(
        name=m.name, ref=str(m.obj) if m.folder is not None else loaded.ref, role=m.role,
        format=loaded.format, runtime=_runtime(loaded.format), precision=_precision(loaded, module),
        parent=getattr(art, "parent", None), config=getattr(art, "config", None), batch_range=[1, 1],
        eval_batch_size=1, size=size_info(files, module, gzip=False),
        peak_memory_mb=None if mem.peak_mb is None else round(mem.peak_mb, 1),
        peak_memory_delta_mb=None if mem.delta_mb is None else round(mem.delta_mb, 1),
        metric=ppl["perplexity"],
    )  # fmt: skip
    entry.lm = {"perplexity": ppl["perplexity"], "nll": ppl["nll"], "tokens": ppl["tokens"],
                "context": ppl["context"], "stride": ppl["stride"], "weight_bytes": weight_bytes(module)}  # fmt: skip
    entry.elapsed_s = {"load_and_evaluate": round(time.perf_counter() - t0, 2)}
    return entry, module


def timed_generation(modules: list[Any], prompt: Any, new_tokens: int, rounds: int, say: Callable) -> tuple:
    """``(speeds, timing)``: ``core.lm.interleaved_generation`` of ``modules`` (per module
    ``{"decode": [...], "prefill": [...]}`` tokens/s per round), timed again on a busy machine
    (``noise.retime_while_busy``: its decode timings are the cells). Shared by validate and ``optimize
    --max-perplexity-increase``."""
    from ptopt.core.lm import interleaved_generation, speed_summary

    def count(speeds: list[dict]) -> tuple[int, int]:
        noisy = sum(_noise.latency_noisy(speed_summary(sp["decode"])["spread_pct"]) for sp in speeds)
        return noisy, len(speeds)

    return _noise.retime_while_busy(
        lambda: interleaved_generation(modules, prompt, new_tokens, rounds), count, say
    )


def _time(entries: list[Entry], modules: list[Any], prompt: Any, opts: LMOptions, say: Callable) -> dict:
    from ptopt.core.lm import speed_summary

    t0 = time.perf_counter()
    speeds, timing = timed_generation(modules, prompt, opts.new_tokens, opts.rounds, say)
    for e, sp in zip(entries, speeds, strict=True):
        dec, pre = speed_summary(sp["decode"]), speed_summary(sp["prefill"])
        e.lm |= {
            "prefill_tokens_per_s": pre["median"], "prefill_spread_pct": pre["spread_pct"],
            "decode_tokens_per_s": dec["median"], "decode_spread_pct": dec["spread_pct"],
            "round_decode_tokens_per_s": sp["decode"], "round_prefill_tokens_per_s": sp["prefill"],
            "rounds": len(sp["decode"]),
        }  # fmt: skip
        e.elapsed_s["generation"] = round((time.perf_counter() - t0) / len(entries), 2)
    return timing


def _measure(
    models: list[_Model], ids: Any, opts: LMOptions, threads: int, allow_pickle: bool, say: Callable
) -> tuple[list[Entry], dict[str, Any]]:
    from ptopt.core.timing import torch_threads
    from ptopt.validate.metrics import older_objects_frozen

    entries, modules = [], []
    with torch_threads(threads):
        with older_objects_frozen():  # each model's gc.collect() scans only what was made since
            for i, m in enumerate(models):
                say(f"evaluating {m.name} ({i + 1}/{len(models)}): perplexity on {ids.numel()} tokens")
                entry, module = _evaluate_one(m, ids, opts, allow_pickle)
                entries.append(entry)
                modules.append(module)
        prompt = ids[: opts.prompt_tokens]
        say(
            f"timing {len(models)} models: {opts.rounds} interleaved rounds of one generation each "
            f"(batch 1, KV cache, {prompt.numel()}-token prompt, {opts.new_tokens} new tokens)"
        )
        timing = _time(entries, modules, prompt, opts, say)
    return entries, timing


# -- comparing, gating, the report --------------------------------------------------------------------


def _compare(
    entries: list[Entry], lm_gates: _gates.LMGates, gates: _gates.Gates, reference: Any
) -> tuple[list[_gates.GateResult], tuple[Entry | None, str | None]]:
    """The gate results, and (the fastest eligible artifact, why the timing cannot tell it from the
    next, or None: ``noise.clear_lead``)."""
    ref = entries[0]
    ref.lm["decode_speedup"] = None
    results: list[_gates.GateResult] = []
    for e in entries[1:]:
        e.accuracy_drop = _gates.perplexity_increase(ref.lm["perplexity"], e.lm["perplexity"])
        e.lm["perplexity_increase_pct"] = e.accuracy_drop
        dec, ref_dec = e.lm["decode_tokens_per_s"], ref.lm["decode_tokens_per_s"]
        e.lm["decode_speedup"] = dec / ref_dec if dec and ref_dec else None
        mine = _gates.evaluate_lm(lm_gates, gates, e.to_dict(), ref.to_dict())
        e.gates = [r.to_dict() for r in mine]
        e.passed = all(r.passed for r in mine)
        results += mine
    results += _lineage.check_entries(entries, reference, None, gates.strict_lineage)
    budget = lm_gates.max_perplexity_increase
    eligible = [
        e for e in entries[1:]
        if e.passed and not _lineage.flagged(e.to_dict())
        and (budget is not None or e.accuracy_drop <= BEST_MAX_INCREASE_PCT)
    ]  # fmt: skip
    ranked = sorted(eligible, key=lambda e: -(e.lm["decode_tokens_per_s"] or 0.0))
    best = ranked[0] if ranked else None
    why = _noise.clear_lead(*(_as_latency(e) for e in ranked[:2])) if len(ranked) > 1 else None
    if best is not None and why is None:  # alone: its own rounds' spread still decides
        why = _noise.clear_lead(_as_latency(best), None)
    for e in entries[1:]:  # crowned (★) only when the timing can tell it from the next (validate.noise)
        e.best = e is best and why is None
    return results, (best, why)


def _as_latency(e: Entry) -> dict[str, Any]:
    """A decode rate as the latency stats ``noise.clear_lead`` reads (ms per token, the rounds' spread)."""
    tps = e.lm.get("decode_tokens_per_s")
    return {"p50_ms": 1000.0 / tps, "round_spread_pct": e.lm.get("decode_spread_pct")} if tps else {}


@dataclasses.dataclass(frozen=True)
class _LMRun:
    """One language-model validation: when it started, its options and gates, its threads."""

    t_start: float
    options: LMOptions
    lm_gates: _gates.LMGates
    gates: _gates.Gates
    threads: int
    #: what REFERENCE was given as (the lineage check compares each artifact's sidecar chain with it)
    reference: Any = None


def _report(entries: list[Entry], ids: Any, data: Any, run: _LMRun) -> dict[str, Any]:
    """The JSON report (schema ``SCHEMA``, ``task`` ``causal-lm``; docs/validate.md)."""
    from ptopt.core.system import machine_summary

    results, (crowned, why) = _compare(entries, run.lm_gates, run.gates, run.reference)
    opts, ref = run.options, entries[0]
    best = crowned.name if crowned is not None else None
    lm = {"context": ref.lm["context"], "stride": ref.lm["stride"], "tokens": int(ids.numel()),
          "scored_tokens": ref.lm["tokens"], "prompt_tokens": int(min(opts.prompt_tokens, ids.numel())),
          "new_tokens": opts.new_tokens, "rounds": opts.rounds, "batch_size": 1, "kv_cache": True}  # fmt: skip
    return {
        "schema": SCHEMA, "task": TASK,
        "created": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        "passed": all(r.passed for r in results), "inconclusive": sum(1 for r in results if r.inconclusive),
        "best": best, "best_rule": BEST_RULE, "machine": machine_summary(), "threads": run.threads,
        "best_verdict": None if best is None else ("noisy" if why else "clear"), "best_why": why,
        "device": "cpu", "batch_sizes": [1], "lm": lm,
        "data": {"ref": _data_name(data), "samples": int(ids.numel()), "labels": False,
                 "inputs": {"input_ids": f"{int(ids.numel())} tokens"}},
        "metric": {"name": "perplexity", "higher_is_better": False, "unit": "", "needs_labels": False,
                   "measured": True},
        "accuracy_drop": {"relative": True, "unit": "%",
                          "definition": " ".join((_gates.perplexity_increase.__doc__ or "").split())},
        "gates": run.gates.to_dict() | dataclasses.asdict(run.lm_gates),
        "baseline": None, "latency_options": {"rounds": opts.rounds},
        "reference": ref.to_dict(), "artifacts": [e.to_dict() for e in entries[1:]],
        "gate_results": [r.to_dict() for r in results],
        "notes": _lineage.notes(entries, run.gates.strict_lineage),
        "elapsed_s": round(time.perf_counter() - run.t_start, 2),
    }  # fmt: skip


def validate_lm(
    reference: Any, artifacts: Any, data: Any, asked: Any, allow_pickle: bool, progress: Callable | None
) -> dict[str, Any]:
    """The language-model path of ``ptopt.validate`` (module docstring); ``asked``: ``validate``'s
    options resolved (``ptopt.validate.options.Validation``). Returns the JSON report;
    ``api.validate`` writes the reports and gates."""
    t_start = time.perf_counter()
    threads = asked.settings.threads
    if threads is None:
        from ptopt.core.system import cpu_info

        threads = int(cpu_info()["usable_cores"])
    gates = _gates.Gates(max_size_mb=asked.gates.max_size_mb, strict_lineage=asked.gates.strict_lineage)
    run = _LMRun(t_start, asked.lm, asked.lm_gates, gates, int(threads), reference)
    models = _models(reference, artifacts, allow_pickle)
    ids = _token_ids(data, models, run.options)
    entries, timing = _measure(
        models, ids, run.options, run.threads, allow_pickle, progress or (lambda msg: None)
    )
    return _report(entries, ids, data, run) | {"timing_noise": timing}
