"""Distillation of causal language models in one process: the token-level loss and its padding mask,
the Python twin and the CLI writing a Hugging Face folder that ``from_pretrained`` loads, its
perplexity as validate scores it, and the bad inputs. Tiny seeded Llama folders (mechanics, not
quality: benchmarks/bench_distill.py measures SmolLM2-135M). Several processes:
``test_distill_processes.py``."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from ptopt.compress.distill import distill
from ptopt.compress.distill_lm import LMDistillLoss, windows
from ptopt.core.data import Batch
from ptopt.core.errors import ShapeMismatchError, UsageError
from ptopt.core.lm import EVAL_TOKENS
from tests.compress.lm_pair import make_pair
from tests.helpers import assert_refused

FAST = dict(epochs=1, batch_size=4, seq_len=16, lr=3e-3, device="cpu", progress=False)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return make_pair(tmp_path_factory.mktemp("lm-pair"))


def _args(pair, out, *extra):
    return [
        "distill", "--teacher", f"hf:{pair['teacher']}", "--student", f"hf:{pair['student']}",
        "--train-data", pair["train.txt"], "--epochs", "1", "--batch-size", "4", "--seq-len", "16",
        "--max-steps", "2", "--device", "cpu", "--no-progress", "-o", out, *extra,
    ]  # fmt: skip


# -- the loss ------------------------------------------------------------------------------------


def _lm(vocab: int, seed: int):
    torch.manual_seed(seed)
    emb = torch.nn.Embedding(vocab, vocab)

    class LM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = emb

        def forward(self, input_ids, attention_mask=None, use_cache=False):
            return type("Out", (), {"logits": self.emb(input_ids)})()

    return LM()


def test_loss_is_the_documented_mix_over_real_tokens_only():
    teacher, student = _lm(11, 0), _lm(11, 1)
    ids = torch.tensor([[1, 2, 3, 4, 5], [6, 7, 8, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    batch = Batch({"input_ids": ids, "attention_mask": mask})
    T, a = 2.0, 0.3
    loss = LMDistillLoss(teacher, T, a)
    got, _ = loss(student, batch)
    keep = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]]).bool()  # positions whose next token is real
    with torch.no_grad():
        s, t = student.emb(ids)[:, :-1][keep], teacher.emb(ids)[:, :-1][keep]
        ce = F.cross_entropy(s, ids[:, 1:][keep])
        kl = F.kl_div(F.log_softmax(s / T, -1), F.softmax(t / T, -1), reduction="batchmean")
    assert torch.allclose(got, a * ce + (1 - a) * T * T * kl, atol=1e-6)
    assert loss.weight(batch) == 6
    for alpha in (0.0, a, 1.0):  # the gradient it computes in its forward is autograd's
        grad = torch.autograd.grad(
            LMDistillLoss(teacher, T, alpha)(student, batch)[0] * 3, student.emb.weight
        )
        s = student.emb(ids)[:, :-1][keep]
        ce = F.cross_entropy(s, ids[:, 1:][keep])
        kl = F.kl_div(F.log_softmax(s / T, -1), F.softmax(t / T, -1), reduction="batchmean")
        want = torch.autograd.grad((alpha * ce + (1 - alpha) * T * T * kl) * 3, student.emb.weight)
        assert torch.allclose(grad[0], want[0], atol=1e-6)
    padded = Batch({"input_ids": ids.masked_fill(mask == 0, 9), "attention_mask": mask})
    assert torch.equal(loss(student, padded)[0], got)  # what padding holds never counts


def test_lm_loss_alone_never_runs_the_teacher():
    class Refuses(torch.nn.Module):
        def forward(self, *a, **k):
            raise AssertionError("the teacher ran")

    ids = torch.tensor([[1, 2, 3]])
    loss = LMDistillLoss(Refuses(), 4.0, 1.0)
    value, _ = loss(_lm(5, 0), Batch({"input_ids": ids, "attention_mask": torch.ones_like(ids)}))
    assert value > 0 and loss.frozen_modules() == []


def test_windows_pad_and_mask_the_last_one():
    ds = windows(torch.arange(1, 12), 4, 0, "t")
    assert ds.x["input_ids"].tolist() == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 0]]
    assert ds.x["attention_mask"][-1].tolist() == [1, 1, 1, 0]
    assert len(windows(torch.arange(1, 10), 4, 0, "t")) == 2  # a last window of one token scores nothing


# -- the twin and the CLI ------------------------------------------------------------------------


def test_api_writes_a_folder_from_pretrained_loads_with_validates_perplexity(pair, tmp_path):
    from transformers import AutoModelForCausalLM

    from ptopt.core.lm import perplexity, token_ids

    out = tmp_path / "student"
    res = distill(
        f"hf:{pair['teacher']}", f"hf:{pair['student']}", pair["train.txt"], out,
        eval_data=pair["eval.txt"], temperature=2.0, alpha=0.5, **FAST,
    )  # fmt: skip
    side = json.loads((tmp_path / "student.ptopt.json").read_text())
    assert side["format"] == "hf" and side["parent"]["path"] == str(pair["teacher"])
    assert side["config"]["seq_len"] == 16 and side["config"]["temperature"] == 2.0
    record = side["extra"]["history"][0]
    assert record["tokens_per_s"] > 0 and len(record["peak_rss_mb"]) == 1 and side["extra"]["steps"] == 5
    loaded = AutoModelForCausalLM.from_pretrained(out)  # plain transformers, no ptopt
    ids = token_ids(pair["eval.txt"], 64, out)[:EVAL_TOKENS]
    assert perplexity(loaded, ids)["perplexity"] == pytest.approx(res.metrics["perplexity"], rel=1e-5)
    assert (
        res.metrics["teacher_perplexity"] > 0
        and res.metrics["student_parameters"] < res.metrics["teacher_parameters"]
    )
    assert (out / "tokenizer.json").is_file()  # the teacher's tokenizer travels with the student


def test_cli_token_ids_lm_loss_bf16_and_accumulation(cli, pair, tmp_path):
    out = tmp_path / "lm"
    args = _args(pair, out, "--alpha", "1", "--precision", "bf16", "--grad-accum-steps", "2")
    args[args.index(pair["train.txt"])] = pair["train.pt"]
    code, stdout, stderr = cli(*args, "--eval-data", pair["eval.txt"], "--log-dir", tmp_path / "logs")
    assert code == 0, stderr
    assert "student:" in stdout and "held-out perplexity:" in stdout and "tokens/s" in stdout
    side = json.loads((tmp_path / "lm.ptopt.json").read_text())
    assert side["config"]["alpha"] == 1.0 and side["config"]["train"]["precision"] == "bf16"
    assert side["extra"]["steps"] == 2 and side["config"]["train"]["max_steps"] == 2
    assert list((tmp_path / "logs").glob("events.out.tfevents.*"))


def test_cli_qat_of_a_language_model_writes_its_quantized_folder(cli, pair, tmp_path):
    """QAT of an LM is distillation from its own float weights; the folder loads in both loaders."""
    from transformers import AutoModelForCausalLM

    import ptopt

    out = tmp_path / "lm.8da4w"
    args = _args(pair, out, "--qat", "8da4w", "--alpha", "0", "--temperature", "1", "--lr", "1e-4")
    args[args.index(f"hf:{pair['student']}")] = f"hf:{pair['teacher']}"
    code, stdout, stderr = cli(*args, "--eval-data", pair["eval.txt"])
    assert code == 0, stderr
    side = json.loads((tmp_path / "lm.8da4w.ptopt.json").read_text())
    assert (side["format"], side["precision"], side["config"]["qat"]) == ("hf_weight_only", "int4", "8da4w")
    assert side["extra"]["weight_only"]["activations"].startswith("int8 dynamic")
    assert "held-out perplexity" in stdout
    loaded = ptopt.load_model(out).module
    assert type(loaded.model.layers[0].mlp.up_proj.weight).__name__ == "IntxUnpackedToInt8Tensor"
    assert type(AutoModelForCausalLM.from_pretrained(out).lm_head.weight).__name__ == "Parameter"  # float


def test_resume_of_a_killed_run_ends_where_the_whole_run_does(pair, tmp_path):
    """A checkpoint after each epoch (2 steps); a run killed after its first epoch resumes to the same
    weights and last loss."""

    class Killed(Exception):
        pass

    def kill(epoch, model):
        if epoch == 1:
            raise Killed

    from ptopt.compress.trainer import TrainConfig

    tcfg = TrainConfig(epochs=2, batch_size=16, lr=3e-3, device="cpu")
    run = dict(train_config=tcfg, seq_len=16, progress=False)
    whole = distill(f"hf:{pair['teacher']}", f"hf:{pair['student']}", pair["train.pt"], **run)
    with pytest.raises(Killed):
        distill(
            f"hf:{pair['teacher']}", f"hf:{pair['student']}", pair["train.pt"],
            checkpoint_dir=tmp_path / "ck", epoch_hooks=[kill], **run,
        )  # fmt: skip
    # as written before --output-loss (which language models refuse) was in DistillConfig: it resumes
    state_file = next((tmp_path / "ck").rglob("trainer.pt"))
    state = torch.load(state_file, weights_only=True)
    state["fingerprint"]["loss"].pop("output_loss", None)
    torch.save(state, state_file)
    resumed = distill(
        f"hf:{pair['teacher']}", f"hf:{pair['student']}", pair["train.pt"],
        checkpoint_dir=tmp_path / "ck", resume=True, **run,
    )  # fmt: skip
    assert resumed.extra["resumed_from_step"] == 2 and resumed.extra["steps"] == whole.extra["steps"] == 4
    assert resumed.extra["final_step_loss"] == whole.extra["final_step_loss"]
    a, b = whole.model.state_dict(), resumed.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


# -- bad input: exit 2, one line, nothing written --------------------------------------------------


@pytest.mark.parametrize(
    "extra,fragments",
    [
        (("--student", "OTHER"), ("vocabulary differs", "expected vocabulary 64", "student vocabulary 128")),
        (("--feature-pair", "a=b"), ("token by token",)),
        (("--seq-len", "1"), ("--seq-len must be >= 2",)),
        (("--strategy", "fsdp"), ("this is one", "torchrun --nproc-per-node 2")),
        (("--nproc", "2", "--batch-size", "3"), ("--batch-size 3 is the global batch", "multiple of 2")),
        (("--student-weights", "w.pt"), ("pkg.module:factory",)),
    ],
    ids=["vocabulary", "feature-pair", "seq-len", "fsdp-without-torchrun", "world-vs-batch", "weights"],
)
def test_cli_refuses(cli, pair, tmp_path, extra, fragments):
    out = tmp_path / "out"
    args = _args(pair, out)
    extra = tuple(f"hf:{pair['other']}" if e == "OTHER" else e for e in extra)
    if extra[0] == "--student":
        args[args.index(f"hf:{pair['student']}")] = extra[1]
        extra = ()
    assert_refused(cli, *args, *extra, match=fragments, where=tmp_path)


def test_cli_refuses_another_models_or_configs_checkpoint_and_a_full_output(cli, pair, tmp_path):
    code, _, stderr = cli(*_args(pair, tmp_path / "first", "--checkpoint-dir", tmp_path / "ck"))
    assert code == 0, stderr
    before = sorted(p.name for p in (tmp_path / "ck").iterdir())
    resume = ("--checkpoint-dir", tmp_path / "ck", "--resume")
    assert_refused(
        cli, *_args(pair, tmp_path / "o1", *resume, "--lr", "0.01"), match=["another configuration", "lr:"]
    )
    other = _args(pair, tmp_path / "o2", *resume)
    other[other.index(f"hf:{pair['student']}")] = f"hf:{pair['teacher']}"  # another student model
    assert_refused(cli, *other, match=["another configuration", "model:"])
    assert_refused(cli, *_args(pair, tmp_path / "o3", "--checkpoint-dir", tmp_path / "ck"), match="--resume")
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == before
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    assert_refused(cli, *_args(pair, tmp_path / "full"), match="not empty")


def test_quantize_qat_of_a_language_model_points_to_distill(cli, pair, tmp_path):
    args = [
        "quantize",
        f"hf:{pair['teacher']}",
        "--mode",
        "qat",
        "--train-data",
        pair["train.pt"],
        "-o",
        tmp_path / "q.pt",
    ]
    assert_refused(cli, *args, match=["ptopt distill --teacher hf:M --student hf:M --qat"], where=tmp_path)


def test_api_errors_are_typed(pair, tmp_path):
    assert_refused(
        distill, f"hf:{pair['teacher']}", f"hf:{pair['other']}", pair["train.txt"], tmp_path / "o",
        error=ShapeMismatchError, where=tmp_path, **FAST,
    )  # fmt: skip
    assert_refused(
        distill, "tests.helpers:tiny_cnn", "tests.compress.distill_helpers:tiny_student", "builtin:digits:test",
        error=UsageError, match="--seq-len applies only to a causal language model", seq_len=8,
    )  # fmt: skip
    assert_refused(
        distill, f"hf:{pair['teacher']}", f"hf:{pair['student']}", pair["train.txt"], tmp_path / "o",
        error=UsageError, match=("nproc=2 starts processes", "torchrun --nproc-per-node 2"), nproc=2,
    )  # fmt: skip


def test_an_output_over_the_teacher_or_student_folder_is_refused(cli, pair, tmp_path):
    """-o naming the folder of hf:TEACHER or hf:STUDENT (an earlier ptopt student, so the folder check
    let it through) wrote the new student over it; refused now, before loading (CLI) and on save (API),
    the folder left as it was."""
    first = tmp_path / "first"
    code, _, err = cli(*_args(pair, first))
    assert code == 0, err
    before = {p.name: p.read_bytes() for p in first.iterdir()}
    teacher_over = _args(pair, first)
    teacher_over[teacher_over.index(f"hf:{pair['teacher']}")] = f"hf:{first}"
    assert_refused(cli, *teacher_over, match=["-o", "would overwrite", "first"])
    student_over = _args(pair, first)
    student_over[student_over.index(f"hf:{pair['student']}")] = f"hf:{first}"
    assert_refused(cli, *student_over, match=["-o", "would overwrite", "first"])
    with pytest.raises(UsageError, match="would overwrite"):
        distill(f"hf:{first}", f"hf:{pair['student']}", pair["train.txt"], first, max_steps=1, **FAST)
    assert {p.name: p.read_bytes() for p in first.iterdir()} == before
