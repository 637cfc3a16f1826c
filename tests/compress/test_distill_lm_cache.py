"""A language-model distillation reads the teacher's held-out perplexity from ptopt's cache when the
same weights scored the same text before (``compress.distill_lm.teacher_perplexity``,
``core.figure_cache``): a second run does not run the teacher on the evaluation text and says the
figure is cached; other weights, another text or the cache turned off compute it again."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from ptopt.compress.distill import distill
from ptopt.compress.distill_lm import perplexity_facts
from ptopt.core.modelref import LoadedModel
from tests.compress.lm_pair import make_pair

FAST = dict(epochs=1, batch_size=4, seq_len=16, lr=3e-3, device="cpu", max_steps=1)
CACHED = "(cached, same weights and data)"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return make_pair(tmp_path_factory.mktemp("lm-pair"))


@pytest.fixture
def scored(monkeypatch, tmp_path):
    """The perplexity passes run (their progress names), in a cache folder of this test's own."""
    import ptopt.core.lm as lm

    monkeypatch.setenv("PTOPT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("PTOPT_FIGURE_CACHE", raising=False)
    calls: list[str] = []
    real = lm.perplexity

    def counting(module, ids, *args, **kwargs):
        calls.append(kwargs.get("what", "perplexity"))
        return real(module, ids, *args, **kwargs)

    monkeypatch.setattr(lm, "perplexity", counting)
    return calls


def _run(teacher, pair, out, lines=None):
    progress = lines.append if lines is not None else False
    return distill(
        teacher, f"hf:{pair['student']}", pair["train.txt"], out, eval_data=pair["eval.txt"],
        progress=progress, **FAST,
    )  # fmt: skip


def _changed_copy(folder, dst):
    """The teacher folder with one weight changed by a little."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(folder, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    name = next(k for k in sorted(tensors) if k.endswith("norm.weight"))
    tensors[name] = tensors[name] + 0.25
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def test_second_run_reads_the_teacher_perplexity_and_a_changed_weight_recomputes_it(
    pair, tmp_path, scored, cli
):
    first = _run(f"hf:{pair['teacher']}", pair, tmp_path / "a")
    assert scored == ["teacher perplexity", "student perplexity"]
    assert "teacher_perplexity_cached" not in first.artifact.extra

    scored.clear()  # the CLI, the same weights and text: the teacher is not run on the text again
    code, out, err = cli(
        "distill", "--teacher", f"hf:{pair['teacher']}", "--student", f"hf:{pair['student']}",
        "--train-data", pair["train.txt"], "--eval-data", pair["eval.txt"], "--epochs", "1",
        "--batch-size", "4", "--seq-len", "16", "--max-steps", "1", "--device", "cpu", "-o", tmp_path / "b",
    )  # fmt: skip
    assert code == 0, err
    assert scored == ["student perplexity"]
    want = f"teacher perplexity {first.metrics['teacher_perplexity']:.3f} {CACHED}"
    assert want in err
    assert f"(teacher {first.metrics['teacher_perplexity']:.3f}, cached;" in out

    scored.clear()  # one weight changed: computed again, and a different figure
    changed = _changed_copy(pair["teacher"], tmp_path / "teacher2")
    lines: list[str] = []
    third = _run(f"hf:{changed}", pair, tmp_path / "c", lines)
    assert scored == ["teacher perplexity", "student perplexity"]
    assert not any(CACHED in line for line in lines)
    assert third.metrics["teacher_perplexity"] != pytest.approx(first.metrics["teacher_perplexity"], rel=1e-6)


def test_the_cache_turned_off_computes_it_every_time(pair, tmp_path, scored, monkeypatch):
    monkeypatch.setenv("PTOPT_FIGURE_CACHE", "0")
    _run(f"hf:{pair['teacher']}", pair, tmp_path / "a")
    _run(f"hf:{pair['teacher']}", pair, tmp_path / "b")
    assert scored.count("teacher perplexity") == 2


def test_facts_follow_a_model_in_memory_its_text_and_window(pair):
    from ptopt.core.hf import load_causal_lm

    module = load_causal_lm(pair["teacher"])
    loaded = LoadedModel("<mem>", "hf", module, None, None, info={"hf_dir": str(pair["teacher"])})
    ids = torch.arange(1, 40)
    base = perplexity_facts(loaded, ids, "eval.txt", from_files=False)
    assert base["weights"].startswith("tensors ")  # in memory: its tensors, whatever folder it came from
    assert perplexity_facts(loaded, ids, "eval.txt", from_files=True)["weights"].startswith("files ")
    assert perplexity_facts(loaded, ids.flip(0), "eval.txt", False)["eval_ids"] != base["eval_ids"]
    with torch.no_grad():
        next(module.parameters()).add_(1e-3)
    assert perplexity_facts(loaded, ids, "eval.txt", False)["weights"] != base["weights"]


def test_facts_follow_the_scoring_code(pair, monkeypatch, tmp_path):
    """A development tree whose perplexity code changed under the same version reads no stale figure:
    the facts hold the scoring module's source digest."""
    from ptopt.compress import distill_lm
    from ptopt.core import lm
    from ptopt.core.hf import load_causal_lm

    loaded = LoadedModel("<mem>", "hf", load_causal_lm(pair["teacher"]), None, None, info={})
    ids = torch.arange(1, 40)
    base = perplexity_facts(loaded, ids, "eval.txt", from_files=False)
    assert base["scoring"] == distill_lm.scoring_digest() != "unknown"
    changed = tmp_path / "lm.py"
    changed.write_bytes(Path(lm.__file__).read_bytes() + b"\n# scoring changed\n")
    monkeypatch.setattr(lm, "__file__", str(changed))
    assert perplexity_facts(loaded, ids, "eval.txt", from_files=False)["scoring"] != base["scoring"]


def test_a_sharded_teachers_digest_covers_every_shard(tmp_path):
    """The index of a sharded folder names tensors, not their values: a changed shard changes the digest
    (the checkpoint fingerprint and the perplexity cache both read it)."""
    import json

    from ptopt.compress.distill_lm import teacher_digest, weight_files

    index = {"weight_map": {"a.weight": "model-1.safetensors", "b.weight": "model-2.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    (tmp_path / "model-1.safetensors").write_bytes(b"one")
    (tmp_path / "model-2.safetensors").write_bytes(b"two")
    loaded = LoadedModel("hf:x", "hf", None, None, None, info={"hf_dir": str(tmp_path)})
    assert [f.name for f in weight_files(tmp_path)] == [
        "model.safetensors.index.json", "model-1.safetensors", "model-2.safetensors",
    ]  # fmt: skip
    before = teacher_digest(loaded)
    (tmp_path / "model-2.safetensors").write_bytes(b"other")
    assert teacher_digest(loaded) != before
