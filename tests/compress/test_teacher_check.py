"""A factory teacher given without ``--teacher-weights`` (``distill --teacher pkg.module:factory``,
``prune --teacher pkg.module:factory``) trained the student from whatever the factory returned, random
weights for most, and only the teacher's accuracy line showed it. Now one warning naming
``--teacher-weights`` comes before the training when its accuracy is chance level (or no labelled
data can tell); a factory that builds a trained model, and weights from a file, say nothing."""

from __future__ import annotations

import warnings

import pytest
import torch

from ptopt.compress.distill import distill
from ptopt.compress.prune import prune
from ptopt.compress.teacher_check import UntrainedTeacherWarning, chance_accuracy
from ptopt.core.data import Dataset, load_data

RANDOM = "tests.helpers:tiny_cnn"
FITTED = "tests.compress.test_teacher_check:fitted_teacher"
STUDENT = "tests.compress.distill_helpers:tiny_student"
FAST = dict(epochs=1, batch_size=32, progress=False)


def fitted_teacher() -> torch.nn.Module:
    """A factory that builds a trained model itself: a linear classifier of the digits, fitted by ridge
    regression on their training split (no file, far above chance)."""
    data = load_data("builtin:digits:train")
    x = data.x.reshape(len(data), -1).double()
    x1 = torch.cat([x, torch.ones(len(x), 1, dtype=torch.float64)], 1)
    gram = x1.T @ x1 + 1e-2 * torch.eye(x1.shape[1], dtype=torch.float64)
    w = torch.linalg.solve(gram, x1.T @ torch.nn.functional.one_hot(data.y, 10).double()).float()
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
    with torch.no_grad():
        model[1].weight.copy_(w[:-1].T)
        model[1].bias.copy_(w[-1])
    return model


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("teacher-check")
    load_data("builtin:digits:train").take(96).save(d / "train.pt")
    load_data("builtin:digits:test").take(64).save(d / "eval.pt")
    Dataset(load_data("builtin:digits:train").take(64).x).save(d / "unlabeled.pt")
    torch.save(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10)).state_dict(), d / "w.pt")
    return d


def _silent(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("error", UntrainedTeacherWarning)  # any such warning fails the test
        return fn(*args, **kwargs)


def test_api_distill_warns_of_a_random_factory_teacher_and_not_of_a_trained_one(files, tmp_path):
    with pytest.warns(UntrainedTeacherWarning, match="no --teacher-weights") as seen:
        distill(RANDOM, STUDENT, files / "train.pt", eval_data=files / "eval.pt", **FAST)
    (message,) = [str(w.message) for w in seen if w.category is UntrainedTeacherWarning]
    assert f"teacher {RANDOM} was built by its factory" in message
    assert "on 64 samples of" in message and "chance level for 10 classes" in message
    # a factory that builds a trained model: above chance, nothing said
    _silent(distill, FITTED, STUDENT, files / "train.pt", eval_data=files / "eval.pt", **FAST)
    # weights from a file: they are the user's choice, nothing said (the same untrained architecture)
    flat = "tests.compress.test_teacher_check:flat_linear"
    _silent(distill, flat, flat, files / "train.pt", teacher_weights=files / "w.pt", **FAST)


def flat_linear() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))


def test_api_without_labels_says_nothing_can_tell(files):
    with pytest.warns(UntrainedTeacherWarning, match="no labelled data shows whether it is trained"):
        distill(RANDOM, STUDENT, files / "unlabeled.pt", alpha=0.0, **FAST)


def test_cli_distill_prints_one_warning_line_and_trains(cli, files, tmp_path):
    out = tmp_path / "s.pt"
    code, stdout, err = cli(
        "distill", "--teacher", RANDOM, "--student", STUDENT, "--train-data", files / "train.pt",
        "--eval-data", files / "eval.pt", "--epochs", "1", "--no-progress", "-o", out,
    )  # fmt: skip
    assert code == 0, err
    lines = [line for line in err.splitlines() if line.startswith("warning: ")]
    assert len(lines) == 1 and "--teacher-weights FILE" in lines[0] and "chance level" in lines[0]
    assert out.is_file() and "student:" in stdout
    code, _, err = cli(
        "distill", "--teacher", FITTED, "--student", STUDENT, "--train-data", files / "train.pt",
        "--eval-data", files / "eval.pt", "--epochs", "1", "--no-progress", "-o", tmp_path / "f.pt",
    )  # fmt: skip
    assert code == 0, err
    assert "warning:" not in err


def test_prune_warns_of_a_random_factory_teacher(cli, files, tmp_path):
    tune = dict(fine_tune_data=files / "train.pt", epochs=1, progress=False)
    with pytest.warns(UntrainedTeacherWarning, match="--teacher-weights"):
        prune(RANDOM, "l1-unstructured", 0.5, teacher=RANDOM, **tune)
    _silent(prune, FITTED, "l1-unstructured", 0.5, teacher=FITTED, **tune)
    base = ["prune", RANDOM, "--method", "l1-unstructured", "--amount", "0.5", "-o", tmp_path / "p.pt"]
    code, _, err = cli(*base, "--fine-tune-data", files / "train.pt", "--epochs", "1", "--teacher", RANDOM)
    assert code == 0, err
    lines = [line for line in err.splitlines() if line.startswith("warning: ")]
    assert (
        len(lines) == 1 and f"teacher {RANDOM} was built by its factory with no --teacher-weights" in lines[0]
    )


def test_chance_accuracy_bounds_a_constant_guess():
    """A model that always answers one class scores the share of that class: never above the bound."""
    y = torch.tensor([0] * 30 + [1] * 10 + [2] * 24)
    data = Dataset(torch.zeros(len(y), 3), y)

    class Always(torch.nn.Module):
        def forward(self, x):
            return torch.tensor([0.0, 0.0, 1.0]).expand(len(x), 3)

    judged = chance_accuracy(Always(), data)
    assert judged["accuracy"] == pytest.approx(24 / 64) and judged["chance"] == pytest.approx(30 / 64)
    assert judged["accuracy"] <= judged["bound"] and judged["classes"] == 3
    regression = Dataset(torch.zeros(8, 3), torch.zeros(8))  # float labels: not classes, nothing judged
    assert chance_accuracy(Always(), regression) is None


def test_the_cli_shows_it_as_one_line_wherever_it_comes_from(capsys):
    """A pipeline's distill (``ptopt run``) warns outside distill's own block: one line, not Python's
    ``file:line: UntrainedTeacherWarning: ...`` with the source line under it."""
    from ptopt.cli.main import _show_warning

    _show_warning(UntrainedTeacherWarning("teacher m:f looks untrained"), UntrainedTeacherWarning, "x.py", 3)
    assert capsys.readouterr().err == "warning: teacher m:f looks untrained\n"


def _factory_built(module):
    from ptopt.core.modelref import LoadedModel

    return LoadedModel(FITTED, "eager", module, None, None, info={"factory": FITTED})


def test_a_label_sorted_file_is_judged_on_samples_drawn_over_it():
    """The check read the first 512 samples: in a file sorted by label those are one class, on which a
    constant guess scores 1.0, so a trained teacher (accuracy 1.0) was called "chance level, looks
    untrained". The samples are drawn over the whole file now; where one class is (nearly) every
    sample the warning says the data cannot tell, not that the teacher is at chance."""
    from ptopt.compress.teacher_check import CHECK_SAMPLES, check_factory_teacher

    digits = load_data("builtin:digits:train")
    zeros = torch.nonzero(digits.y == 0).flatten()
    first = zeros.repeat(CHECK_SAMPLES // len(zeros) + 1)[: CHECK_SAMPLES + 8]  # class 0 past the 512th
    rest = torch.nonzero(digits.y != 0).flatten()
    rest = rest[digits.y[rest].argsort(stable=True)]
    ordered = digits.select(torch.cat([first, rest]))
    assert ordered.y[:CHECK_SAMPLES].unique().tolist() == [0]
    teacher = _factory_built(fitted_teacher())
    assert _silent(check_factory_teacher, teacher, (ordered,)) is None

    only_zeros = digits.select(first)
    with pytest.warns(UntrainedTeacherWarning, match="cannot show whether it is trained") as seen:
        message = check_factory_teacher(teacher, (only_zeros,))
    assert "chance level" not in message and len(seen) == 1


def misfit_teacher() -> torch.nn.Module:
    """A teacher for 3 features, given 64-pixel digits."""
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3, 10))


def test_prune_refuses_a_teacher_that_does_not_take_the_data(cli, files, tmp_path):
    """prune never ran its teacher on the data before the fine-tune: a teacher that does not take it was
    ``internal error: RuntimeError: mat1 and mat2 shapes cannot be multiplied`` (exit 3, "a bug in
    ptopt"); it is one clear message naming the teacher and the data now, exit 2 (as distill's probe)."""
    from ptopt.core.errors import ShapeMismatchError

    misfit = "tests.compress.test_teacher_check:misfit_teacher"
    with pytest.raises(ShapeMismatchError, match=r"fine-tune data .*\(teacher\)"):
        prune(RANDOM, "l1-unstructured", 0.5, teacher=misfit, fine_tune_data=files / "train.pt", epochs=1)
    base = ["prune", RANDOM, "--method", "l1-unstructured", "--amount", "0.5", "-o", tmp_path / "p.pt"]
    code, _, err = cli(*base, "--fine-tune-data", files / "train.pt", "--epochs", "1", "--teacher", misfit)
    assert code == 2 and "internal error" not in err and "(teacher)" in err, err
    assert not (tmp_path / "p.pt").exists()


def test_a_trained_teacher_is_judged_on_one_batch_and_a_guess_on_all():
    """The check stops once the accuracy so far is above chance at that count: a trained teacher after
    one batch (not 512 samples of a large model), a constant guess only after every sample. The sample is
    shuffled even when the data is small: a label-sorted file's first batch is one class, on which a
    constant guess of that class would have read as trained."""
    from ptopt.compress.teacher_check import BATCH, CHECK_SAMPLES, check_factory_teacher, spread_sample

    digits = load_data("builtin:digits:train")
    seen: list[int] = []

    class Counted(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            seen.append(len(x))
            return self.inner(x)

    judged = chance_accuracy(Counted(fitted_teacher()), spread_sample(digits))
    assert seen == [BATCH] and judged["samples"] == BATCH and judged["accuracy"] > judged["bound"]

    class AlwaysZero(torch.nn.Module):
        def forward(self, x):
            seen.append(len(x))
            return torch.nn.functional.one_hot(torch.zeros(len(x), dtype=torch.long), 10).float()

    seen.clear()
    judged = chance_accuracy(AlwaysZero(), spread_sample(digits))
    assert sum(seen) == CHECK_SAMPLES and judged["accuracy"] <= judged["bound"]

    small = digits.select(digits.y.argsort(stable=True)[:300])  # label-sorted, under CHECK_SAMPLES
    assert small.y[:BATCH].unique().tolist() == [0]
    with pytest.warns(UntrainedTeacherWarning, match="chance level"):
        check_factory_teacher(_factory_built(AlwaysZero()), (small,))


def test_a_teacher_whose_outputs_are_not_class_scores_is_not_said_to_lack_labelled_data():
    """A one-output (regression) teacher on labelled data: the warning says its outputs cannot be judged
    by those labels, not that no labelled data was given."""
    from ptopt.compress.teacher_check import check_factory_teacher

    one_logit = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 1))
    with pytest.warns(UntrainedTeacherWarning, match="not class scores that") as seen:
        message = check_factory_teacher(_factory_built(one_logit), (load_data("builtin:digits:test"),))
    assert "no labelled data" not in message and len(seen) == 1
