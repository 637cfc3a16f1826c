"""Knowledge distillation: the loss, the Python twin, the CLI, and its bad inputs."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from ptopt.compress.distill import distill, make_distill_loss
from ptopt.compress.trainer import TrainConfig, train
from ptopt.core.data import Batch, Dataset, load_data
from ptopt.core.errors import DataError, ShapeMismatchError, UsageError
from tests.compress.distill_helpers import tiny_student
from tests.helpers import assert_refused, tiny_cnn

TEACHER = "tests.helpers:tiny_cnn"
STUDENT = "tests.compress.distill_helpers:tiny_student"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("distill-data")
    load_data("builtin:digits:train").take(96).save(d / "train.pt")
    load_data("builtin:digits:test").take(48).save(d / "eval.pt")
    Dataset(load_data("builtin:digits:train").take(64).x).save(d / "unlabeled.pt")
    torch.save({"x": torch.zeros(0, 1, 8, 8), "y": torch.zeros(0, dtype=torch.long)}, d / "empty.pt")
    return d


def _args(files, out, *extra):
    return [
        "distill",
        "--teacher",
        TEACHER,
        "--student",
        STUDENT,
        "--train-data",
        files / "train.pt",
        "--eval-data",
        files / "eval.pt",
        "--epochs",
        "2",
        "--batch-size",
        "16",
        "--no-progress",
        "-o",
        out,
        *extra,
    ]


# -- the loss ------------------------------------------------------------------------------------


def test_loss_is_the_documented_mix():
    teacher, student = tiny_cnn().eval(), tiny_student()
    x = load_data("builtin:digits:test").take(8)
    b = Batch(x.x, x.y)
    T, a = 3.0, 0.3
    with torch.no_grad():
        t_logits, s_logits = teacher(b.x), student(b.x)
        kl = F.kl_div(F.log_softmax(s_logits / T, -1), F.softmax(t_logits / T, -1), reduction="batchmean")
        want = a * F.cross_entropy(s_logits, b.y) + (1 - a) * T * T * kl
        got, logits = make_distill_loss(teacher, T, a)(student, b)
        soft_only, _ = make_distill_loss(teacher, T, a)(student, Batch(b.x, None))  # no labels: soft targets
    assert torch.allclose(got, want, atol=1e-6) and torch.equal(logits, s_logits)
    assert torch.allclose(soft_only, T * T * kl, atol=1e-6)


def test_teacher_stays_frozen_and_in_eval_mode():
    teacher, student = tiny_cnn(), tiny_student()
    teacher.train()
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    data = load_data("builtin:digits:train").take(64)
    # the call the pruning fine-tuner makes: make_distill_loss(teacher, T, alpha) as train(loss_fn=...)
    train(
        student,
        data,
        TrainConfig(epochs=1, batch_size=16),
        loss_fn=make_distill_loss(teacher, 4.0, 0.5),
        progress=False,
    )
    assert not teacher.training
    assert all(torch.equal(before[k], v) for k, v in teacher.state_dict().items())  # BN stats did not move
    assert all(p.grad is None for p in teacher.parameters())


def test_bad_loss_options():
    with pytest.raises(UsageError, match="alpha"):
        make_distill_loss(tiny_cnn(), 4.0, 1.5)
    with pytest.raises(UsageError, match="temperature"):
        make_distill_loss(tiny_cnn(), 0.0, 0.5)
    with pytest.raises(UsageError, match="no layer 'nope'"):
        make_distill_loss(
            tiny_cnn(),
            4.0,
            0.5,
            [("nope", "conv1")],
            student=tiny_student(),
            example_inputs=torch.zeros(2, 1, 8, 8),
        )


# -- the CLI and the Python twin -----------------------------------------------------------------


def test_cli_distills_to_torchscript_naming_the_teacher(cli, files, tmp_path):
    out = tmp_path / "student.pt"
    code, stdout, stderr = cli(
        *_args(
            files,
            out,
            "--temperature",
            "3",
            "--alpha",
            "0.7",
            "--log-dir",
            tmp_path / "logs",
            "--save-recipe",
            tmp_path / "r.yaml",
        )
    )
    assert code == 0, stderr
    assert "1/2." in stdout
    # the held-out figure names the data it was measured on, as quantize and prune do
    assert f"eval accuracy on {files / 'eval.pt'} (48 samples): " in stdout
    side = json.loads((tmp_path / "student.pt.ptopt.json").read_text())
    assert side["format"] == "torchscript" and side["parent"]["path"] == TEACHER
    assert side["extra"]["teacher"]["path"] == TEACHER and side["config"]["temperature"] == 3.0
    assert side["config"]["alpha"] == 0.7 and side["config"]["train"]["epochs"] == 2
    assert len(side["extra"]["history"]) == 2 and side["metrics"]["eval_accuracy"] is not None
    assert side["metrics"]["student_parameters"] < side["metrics"]["teacher_parameters"]
    model = torch.jit.load(str(out))  # plain torch, no ptopt
    assert model(torch.zeros(3, 1, 8, 8)).shape == (3, 10)
    assert len((tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()) == 2
    assert "distill:" in (tmp_path / "r.yaml").read_text()


def test_cli_feature_pair_with_projection(cli, files, tmp_path):
    out = tmp_path / "student.pt"
    code, _, stderr = cli(*_args(files, out, "--feature-pair", "bn2=bn2", "--precision", "bf16"))
    assert code == 0, stderr
    side = json.loads((tmp_path / "student.pt.ptopt.json").read_text())
    assert (
        side["config"]["feature_pairs"] == [["bn2", "bn2"]] and side["config"]["train"]["precision"] == "bf16"
    )
    # the 4→8 channel projection is trained but not part of the student
    assert not any("projection" in k for k in torch.jit.load(str(out)).state_dict())


def test_python_twin_soft_targets_only_to_exported_program(tmp_path, files):
    """Unlabelled data with alpha=0; modules and a TorchScript teacher; output .pt2."""
    teacher = torch.jit.trace(tiny_cnn().eval(), torch.zeros(2, 1, 8, 8))
    torch.jit.save(teacher, str(tmp_path / "teacher.pt"))
    art = distill(
        tmp_path / "teacher.pt",
        tiny_student(),
        files / "unlabeled.pt",
        tmp_path / "s.pt2",
        alpha=0.0,
        epochs=1,
        batch_size=16,
        progress=False,
    )
    assert art.format == "exported_program" and art.parent["path"] == str(tmp_path / "teacher.pt")
    assert "sha256" in art.parent
    ep = torch.export.load(str(tmp_path / "s.pt2"))
    assert ep.module()(torch.zeros(5, 1, 8, 8)).shape == (5, 10)  # dynamic batch


def test_python_twin_resume_with_feature_projection_is_exact(tmp_path, files):
    """A killed distillation resumed from its checkpoint ends with the uninterrupted run's weights."""
    kw = dict(
        eval_data=files / "eval.pt", epochs=2, batch_size=16, feature_pairs=["conv2=conv2"], progress=False
    )

    def kill(epoch, model):
        if epoch == 1:
            raise KeyboardInterrupt

    distill(TEACHER, STUDENT, files / "train.pt", tmp_path / "a.pt", checkpoint_dir=tmp_path / "ca", **kw)
    with pytest.raises(KeyboardInterrupt):
        distill(
            TEACHER,
            STUDENT,
            files / "train.pt",
            tmp_path / "b.pt",
            checkpoint_dir=tmp_path / "cb",
            epoch_hooks=[kill],
            **kw,
        )
    assert not (tmp_path / "b.pt").exists()
    art = distill(
        TEACHER,
        STUDENT,
        files / "train.pt",
        tmp_path / "b.pt",
        checkpoint_dir=tmp_path / "cb",
        resume=True,
        **kw,
    )
    assert art.extra["resumed_from_epoch"] == 1
    assert art.metrics["eval_data"] == str(files / "eval.pt") and art.metrics["eval_samples"] == 48
    a, b = (
        torch.jit.load(str(tmp_path / "a.pt")).state_dict(),
        torch.jit.load(str(tmp_path / "b.pt")).state_dict(),
    )
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_cli_resume_with_a_larger_max_steps_trains_on_to_it(cli, files, tmp_path):
    """A finished run (--max-steps 4 of the 12 steps of 2 epochs) resumed with --max-steps 8 trains steps
    5-8 from its checkpoint; resumed with --max-steps 6, below the 8 it reached, it trains nothing and
    writes the checkpoint's model, saying so (exit 0). Before, any other --max-steps was refused as
    'another configuration'."""
    from ptopt.core.artifact import Artifact

    ck, first, longer, shorter = tmp_path / "ck", tmp_path / "a.pt", tmp_path / "b.pt", tmp_path / "c.pt"
    code, _, err = cli(*_args(files, first, "--checkpoint-dir", ck, "--max-steps", "4"))
    assert code == 0, err
    code, _, err = cli(*_args(files, longer, "--checkpoint-dir", ck, "--max-steps", "8", "--resume"))
    assert code == 0, err
    assert (
        "training on from step 4 to 8 (--max-steps 8; the checkpoint's run had epochs 2, max_steps 4)" in err
    )
    extra = Artifact.load(longer).extra
    assert (extra["steps"], extra["resumed_from_step"]) == (8, 4) and len(extra["step_losses"]) == 8
    a, b = (torch.jit.load(str(p)).state_dict() for p in (first, longer))
    assert any(not torch.equal(a[k], b[k]) for k in a)
    code, _, err = cli(*_args(files, shorter, "--checkpoint-dir", ck, "--max-steps", "6", "--resume"))
    assert code == 0, err
    assert (
        "already reached step 8, and --max-steps 6 (6 optimizer steps) asks for no more: nothing is trained"
        in err
    )
    c = torch.jit.load(str(shorter)).state_dict()
    assert all(torch.equal(b[k], c[k]) for k in b) and Artifact.load(shorter).extra["steps"] == 8


# -- bad input: exit 2, a clear message, nothing written ---------------------------------------


def _assert_refused(cli, args, out, *fragments):
    """exit 2, one ``error:`` line naming ``fragments``, nothing new beside ``out``."""
    return assert_refused(cli, *args, match=fragments, where=out.parent)


def test_cli_refuses_teacher_and_student_of_different_output_shapes(cli, files, tmp_path):
    out = tmp_path / "s.pt"
    args = _args(files, out)
    args[args.index(STUDENT)] = "tests.compress.distill_helpers:five_class_student"
    _assert_refused(cli, args, out, "outputs differ in shape", "teacher 8x10", "student 8x5")


def test_cli_refuses_unlabeled_data_with_alpha(cli, files, tmp_path):
    out = tmp_path / "s.pt"
    args = _args(files, out, "--alpha", "0.5")
    args[args.index(files / "train.pt")] = files / "unlabeled.pt"
    _assert_refused(cli, args, out, "no labels", "--alpha 0")


def test_cli_refuses_empty_data(cli, files, tmp_path):
    out = tmp_path / "s.pt"
    args = _args(files, out)
    args[args.index(files / "train.pt")] = files / "empty.pt"
    _assert_refused(cli, args, out, "empty")


def test_cli_refuses_checkpoint_of_another_configuration(cli, files, tmp_path):
    first = tmp_path / "first.pt"
    code, _, stderr = cli(*_args(files, first, "--epochs", "1", "--checkpoint-dir", tmp_path / "ck"))
    assert code == 0, stderr
    out = tmp_path / "s.pt"
    args = _args(
        files, out, "--epochs", "1", "--checkpoint-dir", tmp_path / "ck", "--resume", "--temperature", "2"
    )
    _assert_refused(cli, args, out, "another configuration", "temperature: checkpoint 4.0, now 2.0")
    # another student and another teacher are said in words, not as two hashes alone
    args = _args(files, out, "--epochs", "1", "--checkpoint-dir", tmp_path / "ck", "--resume")
    args[args.index(STUDENT)] = "tests.compress.distill_helpers:dropout_mlp"
    args[args.index(TEACHER)] = STUDENT  # 10 class scores, other weights
    _assert_refused(
        cli,
        args,
        out,
        "model: another model to train (its layers' names",
        "teacher: another teacher (its weights",
    )


def test_cli_refuses_bad_options(cli, files, tmp_path):
    out = tmp_path / "s.txt"
    _assert_refused(cli, _args(files, out), out, ".pt (TorchScript) or .pt2")
    out = tmp_path / "s.pt"
    _assert_refused(cli, _args(files, out, "--resume"), out, "--resume needs --checkpoint-dir")
    _assert_refused(cli, _args(files, out, "--feature-pair", "conv1"), out, "TEACHER_LAYER=STUDENT_LAYER")


@pytest.mark.parametrize(
    "student,data,error",
    [
        (
            lambda: torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 3)),
            "train.pt",
            ShapeMismatchError,
        ),
        (tiny_student, lambda: Dataset(torch.zeros(4, 1, 8, 8)), DataError),
    ],
    ids=["output-shapes-differ", "no-labels-with-alpha"],
)
def test_python_twin_errors_are_typed(tmp_path, files, student, data, error):
    data = files / data if isinstance(data, str) else data()
    assert_refused(
        distill, tiny_cnn(), student(), data, tmp_path / "s.pt", progress=False, where=tmp_path, error=error
    )


# -- the output loss: kl for class scores, cosine for features -------------------------------------


def test_the_output_loss_follows_what_the_teacher_outputs(cli, files, tmp_path):
    """A sentence encoder's output is features: softening it into a distribution over 32 (384) feature
    dimensions (kl) is not what its users judge. ``--output-loss auto`` reads the teacher's last layer
    (``core.scores``) and matches features by cosine; a classifier keeps kl."""
    from ptopt.compress.distill_loss import make_distill_loss
    from ptopt.models.minilm import minilm_tiny, tuning_sentences

    teacher, student = minilm_tiny().eval(), minilm_tiny()
    batch = tuning_sentences().first_batch(8)
    loss = make_distill_loss(teacher, alpha=0.0, example_inputs=batch.x)
    assert loss.output_loss == "cosine" and "normalization (LayerNorm)" in loss.output_loss_why
    got, _ = loss(student, Batch(batch.x, None))
    with torch.no_grad():
        t, s = teacher(**batch.x), student(**batch.x)
    assert torch.allclose(got, (1 - F.cosine_similarity(s, t, dim=1)).mean(), atol=1e-6)
    assert make_distill_loss(teacher, alpha=0.0, example_inputs=batch.x, output_loss="kl").output_loss == "kl"
    x = load_data("builtin:digits:test").take(8)
    assert make_distill_loss(tiny_cnn().eval(), example_inputs=x.x, labels=True).output_loss == "kl"
    assert make_distill_loss(tiny_cnn().eval(), example_inputs=x.x).output_loss == "kl"  # a Linear head
    code, out, err = cli("distill", "--teacher", "ptopt.models.minilm:minilm_tiny", "--student",
                         "ptopt.models.minilm:minilm_tiny", "--train-data", "ptopt.models.minilm:tuning_sentences",
                         "--alpha", "0", "--epochs", "1", "--no-progress", "-o", tmp_path / "e.pt")  # fmt: skip
    assert code == 0, err
    assert "output loss: cosine, the teacher's outputs are not class scores" in out
    side = json.loads((tmp_path / "e.pt.ptopt.json").read_text())
    assert side["extra"]["output_loss"]["loss"] == "cosine" and side["config"]["output_loss"] == "auto"
    code, out, err = cli(*_args(files, tmp_path / "c.pt"))
    assert code == 0 and "output loss" not in out
    assert json.loads((tmp_path / "c.pt.ptopt.json").read_text())["extra"]["output_loss"]["loss"] == "kl"
    _assert_refused(
        cli, _args(files, tmp_path / "b.pt", "--output-loss", "mse"), tmp_path / "b.pt", "--output-loss"
    )


def test_tokens_are_counted_when_the_batch_carries_the_teachers_logits():
    """tokens/s showed for a text classifier under FSDP only: cached teacher logits repack the inputs."""
    from ptopt.compress.distill_loss import with_teacher_logits
    from ptopt.compress.trainer import _tokens
    from ptopt.models.minilm import minilm_tiny, tuning_sentences

    data = tuning_sentences().take(8)
    packed = with_teacher_logits(data, minilm_tiny().eval())
    assert _tokens(packed.first_batch(8).x) == _tokens(data.first_batch(8).x) > 0


class _Squeezed(torch.nn.Module):
    """One value per sample ([N]): a regression's output."""

    def __init__(self) -> None:
        super().__init__()
        self.head = torch.nn.Linear(4, 1)

    def forward(self, x):
        return self.head(x).squeeze(-1)


def test_the_cosine_loss_takes_one_value_per_sample_as_one_vector():
    """A regression teacher ([N] outputs) is not class scores, so auto chose cosine, whose
    ``flatten(1)`` of [N] was an IndexError: an internal error where kl had trained. One value per
    sample is one vector, as ``export.parity.sample_cosines`` judges it; [N, T, H] is one row a sample."""
    torch.manual_seed(0)
    teacher, student, x = _Squeezed().eval(), _Squeezed(), torch.randn(8, 4)
    loss = make_distill_loss(teacher, alpha=0.0, example_inputs=x)
    assert loss.output_loss == "cosine"
    got, _ = loss(student, Batch(x, None))
    with torch.no_grad():
        t, s = teacher(x), student(x)
    assert torch.allclose(got, 1 - F.cosine_similarity(s, t, dim=0), atol=1e-6)
    teacher, student, x = torch.nn.Linear(4, 4).eval(), torch.nn.Linear(4, 4), torch.randn(2, 3, 4)
    got, _ = make_distill_loss(teacher, alpha=0.0, output_loss="cosine")(student, Batch(x, None))
    with torch.no_grad():
        t, s = teacher(x), student(x)
    assert torch.allclose(got, (1 - F.cosine_similarity(s.flatten(1), t.flatten(1))).mean(), atol=1e-6)


def test_a_checkpoint_resumes_under_the_output_loss_it_trained_with(tmp_path, files):
    """The fingerprint holds the loss used: a checkpoint of ``auto`` (kl, a classifier) resumes with
    ``--output-loss kl``, and one written before the option existed (no such field, kl) resumes; one
    that trained by cosine does not resume by kl."""
    kw = dict(epochs=1, batch_size=32, max_steps=1, progress=False, checkpoint_dir=tmp_path / "ck")
    distill(TEACHER, STUDENT, files / "train.pt", tmp_path / "a.pt", **kw)
    state_file = next((tmp_path / "ck").rglob("trainer.pt"))
    state = torch.load(state_file, weights_only=True)
    state["fingerprint"]["loss"].pop("output_loss", None)  # as a checkpoint of the earlier version
    torch.save(state, state_file)
    kw |= dict(resume=True, max_steps=2)
    art = distill(TEACHER, STUDENT, files / "train.pt", tmp_path / "b.pt", output_loss="kl", **kw)
    assert art.extra["output_loss"]["loss"] == "kl"
    assert_refused(
        distill, TEACHER, STUDENT, files / "train.pt", tmp_path / "c.pt", output_loss="cosine", **kw,
        where=tmp_path, match="output_loss",
    )  # fmt: skip
