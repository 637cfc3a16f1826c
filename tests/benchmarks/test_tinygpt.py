"""benchmarks/tinygpt.py and bench_llm_g128.py on a tiny recipe and a few docstrings: the text is kept
apart from builtin:pydoc-text, training is reproducible and cached, the folder loads through ptopt,
and the targets are computed from the rows."""

from __future__ import annotations

import hashlib
import sys

import pytest
import torch

from tests.benchmarks import bench_script
from tests.conftest import REPO

TINY = {"vocab": 300, "hidden": 64, "intermediate": 128, "layers": 1, "heads": 2, "kv_heads": 1,
        "context": 32, "batch": 2, "steps": 3, "warmup": 1}  # fmt: skip


@pytest.fixture(scope="module")
def tinygpt():
    with bench_script("tinygpt") as module:
        yield module


def _docstrings(_min_chars):
    from ptopt.core.text import builtin_text

    borrowed = " ".join(builtin_text("eval").split()[:30])  # shares a 12-word run with the eval split
    made_up = [f"Return the {w} of the queue, or raise an error when item {i} is missing." for i, w in
               enumerate(["length", "first item", "last item", "size", "head", "tail"] * 8)]  # fmt: skip
    return [*made_up, borrowed]


def test_tiny_recipe_is_kept_apart_reproducible_cached_and_loads(tinygpt, tmp_path, monkeypatch):
    import ptopt

    monkeypatch.setattr(tinygpt, "stdlib_docstrings", _docstrings)
    recipe = tinygpt.RECIPE | TINY
    text, record = tinygpt.training_text(recipe)
    assert record["dropped_sharing_text_with_pydoc_text"] == 1 and record["docstrings"] == 48
    from ptopt.core.text import builtin_text

    assert tinygpt.shared_runs(text, builtin_text("all"), recipe["shingle"]) == 0
    sums = []
    for run in ("a", "b"):
        monkeypatch.setenv("PTOPT_CACHE_DIR", str(tmp_path / run))
        said: list[str] = []
        folder = tinygpt.tinygpt_dir(recipe, progress=said.append)
        assert any("trained in" in s for s in said)
        sums.append(hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest())
    assert sums[0] == sums[1]  # seeded and deterministic: the same weights
    assert not torch.are_deterministic_algorithms_enabled()  # restored: quantized ops refuse it
    said.clear()
    assert tinygpt.tinygpt_dir(recipe, progress=said.append) == folder and not said  # cached
    rec = tinygpt.info(folder)
    assert rec["recipe"] == recipe and rec["tokens_seen"] == 3 * 2 * 32 and "isa" in rec
    model = ptopt.load_model(f"hf:{folder}").module
    assert model.config.hidden_size == 64 and model.lm_head.weight is model.model.embed_tokens.weight


def test_learning_rate_warms_up_then_decays_to_its_floor(tinygpt):
    r = tinygpt.RECIPE
    lrs = [tinygpt.lr_at(s, r) for s in range(r["steps"])]
    assert lrs[r["warmup"] - 1] == pytest.approx(r["lr"]) and lrs[0] < lrs[1]
    assert lrs[-1] == pytest.approx(r["lr"] * r["min_lr_ratio"])
    assert all(a >= b for a, b in zip(lrs[r["warmup"] :], lrs[r["warmup"] + 1 :], strict=False))


def test_g128_targets_are_computed_from_the_rows(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    row = lambda name, pct: {"name": name, "increase_pct": pct}  # noqa: E731
    rows = [row("fp32 eager", 0.0), row("ptopt int8", 0.2), row("ptopt int4 g128 rtn", 8.0),
            row("ptopt int4 g128 hqq", 5.0), row("ptopt int4 g128 gptq", 3.9)]  # fmt: skip
    with bench_script("bench_llm_g128") as bench:
        assert [v["verdict"] for v in bench.verdicts(rows)] == ["met", "met", "met"]
        rows[-1]["increase_pct"] = 4.1
        v = bench.verdicts(rows)
    assert v[2]["verdict"] == "NOT met" and "gptq: +4.10% vs rtn +8.00%" in v[2]["measured"]
    sys.modules.pop("bench_llm", None)
