"""Structured pruning: channels really removed, dependencies (BN, depthwise, residual, flatten→linear)
followed from the traced graph, and the bad inputs of issue 4."""

from __future__ import annotations

import json

import pytest
import torch

from ptopt.compress.prune import prune
from ptopt.compress.prune.techniques.structured import structured_prune
from tests.compress import prune_models

TINY = "tests.compress.prune_models:tiny_mobile"


def _zero_half(model: torch.nn.Module) -> torch.nn.Module:
    """Make channels [0, C/2) of every layer but the classifier exactly zero after BN, so removing
    them (they rank lowest) must leave the outputs unchanged."""
    with torch.no_grad():
        for name, m in model.named_modules():
            if name == "fc2":
                continue
            if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)):
                c = m.weight.shape[0] // 2
                m.weight[:c] = 0
                if m.bias is not None:
                    m.bias[:c] = 0
            if isinstance(m, torch.nn.BatchNorm2d):
                c = m.num_features // 2
                m.bias[:c] = 0
                m.running_mean[:c] = 0
    return model


def test_structured_removes_channels_exactly():
    model = _zero_half(prune_models.tiny_mobile())
    x = model.example_inputs(4)
    pruned, report = structured_prune(model, x, 0.5, prune_first_last=True)
    # the module class is kept: an ordinary dense nn.Module, physically smaller
    assert type(pruned) is prune_models.TinyMobile
    assert pruned.stem.out_channels == pruned.project.out_channels == pruned.bn0.num_features == 4
    assert pruned.expand.out_channels == pruned.depthwise.groups == pruned.bn2.num_features == 8
    assert pruned.depthwise.weight.shape == (8, 1, 3, 3)
    assert pruned.fc1.in_features == 4 * 4 * 4 and pruned.fc1.out_features == 8
    assert pruned.fc2.out_features == 10  # classifier outputs are never pruned
    assert report["layers"]["stem"]["group"] == ["stem", "project"]  # joined by the residual add
    torch.testing.assert_close(pruned(x), model(x))
    # the original model is left alone
    assert model.expand.out_channels == 16


def test_structured_defaults_keep_first_and_last():
    model = prune_models.tiny_mobile()
    pruned, report = structured_prune(model, model.example_inputs(), 0.5)
    assert set(report["default_excluded"]) == {"stem", "fc2"}
    # stem's channels are tied to project's by the residual add: both kept
    assert pruned.stem.out_channels == pruned.project.out_channels == 8
    assert "first layer" in report["layers"]["project"]["kept_reason"]
    assert pruned.expand.out_channels == 8 and pruned.conv.out_channels == 4 and pruned.fc1.out_features == 8


def test_structured_exclude_and_l2():
    model = prune_models.tiny_mobile()
    pruned, report = structured_prune(model, model.example_inputs(), 0.75, criterion="l2", exclude=("conv",))
    assert pruned.conv.out_channels == 8
    assert pruned.expand.out_channels == 4
    assert report["layers"]["conv"]["kept_reason"] == "conv excluded"


def test_never_removes_every_channel():
    model = prune_models.tiny_mobile()
    pruned, _ = structured_prune(model, model.example_inputs(), 0.99)
    assert pruned.conv.out_channels == 1 and pruned.expand.out_channels == 1
    assert pruned(model.example_inputs()).shape == (2, 10)


def test_hard_coded_flatten_size_is_rewritten(tmp_path):
    model = prune_models.lenet()
    pruned, _ = structured_prune(model, model.example_inputs(), 0.5)
    assert isinstance(pruned, torch.fx.GraphModule)  # the class's forward hard-codes 16*2*2
    assert pruned.conv2.out_channels == 8 and pruned.fc1.in_features == 8 * 2 * 2
    assert pruned(torch.randn(3, 1, 8, 8)).shape == (3, 10)
    art = prune("tests.compress.prune_models:lenet", "structured", 0.5, tmp_path / "l.pt")
    assert torch.jit.load(str(tmp_path / "l.pt"))(torch.randn(3, 1, 8, 8)).shape == (3, 10)
    assert art.metrics["parameters_after"] < art.metrics["parameters_before"]


@pytest.mark.parametrize("suffix", [".pt", ".pt2"])
def test_python_api_artifact_loads_with_plain_torch(tmp_path, suffix):
    out = tmp_path / f"small{suffix}"
    art = prune(TINY, "structured", 0.5, out)
    assert art.format == ("torchscript" if suffix == ".pt" else "exported_program")
    loaded = torch.jit.load(str(out)) if suffix == ".pt" else torch.export.load(str(out)).module()
    assert loaded(torch.randn(5, 1, 8, 8)).shape == (5, 10)  # dynamic batch
    side = json.loads((tmp_path / f"small{suffix}.ptopt.json").read_text())
    assert side["config"]["type"] == "prune-structured" and side["config"]["amount"] == 0.5
    assert side["parent"]["path"] == TINY
    assert side["metrics"]["parameters_after"] < side["metrics"]["parameters_before"]
    rows = {r["layer"]: r for r in side["extra"]["layers"]}
    assert (rows["expand"]["channels_before"], rows["expand"]["channels_after"]) == (16, 8)
    assert rows["expand"]["pruned_with"] == []
    assert side["extra"]["gzip_bytes"] > 0


def test_cli_structured(cli, tmp_path):
    code, out, err = cli(
        "prune",
        TINY,
        "--method",
        "structured",
        "--amount",
        "0.5",
        "--criterion",
        "l2",
        "-o",
        tmp_path / "s.pt",
    )
    assert code == 0, err
    assert "expand" in out and "16 → 8" in out and "parameters:" in out and "gzip" in out
    assert (tmp_path / "s.pt.ptopt.json").is_file()


def test_gradual_steps_with_fine_tuning(tmp_path):
    from ptopt.core.data import load_data

    digits = load_data("builtin:digits:test").first_batch(96)  # 96 digits: 2 rounds in seconds
    art = prune(
        TINY,
        "structured",
        0.5,
        tmp_path / "g.pt",
        steps=2,
        epochs=1,
        fine_tune_data=(digits.x, digits.y),
        eval_data=(digits.x, digits.y),
    )
    rows = {r["layer"]: r for r in art.extra["layers"]}
    # two rounds (to 0.25, then 0.5 of the original channels) end where one round would
    assert rows["expand"]["channels_after"] == 8 and rows["conv"]["channels_after"] == 4
    assert [h["round"] for h in art.extra["fine_tune_history"]] == [1, 2]
    assert 0 <= art.metrics["accuracy_after"] <= 1


# -- bad input: exit 2, a clear message, nothing written ---------------------------------------------


@pytest.mark.parametrize("amount", ["0", "1", "1.5", "-0.2"])
def test_cli_amount_out_of_range(cli, tmp_path, amount):
    code, out, err = cli("prune", TINY, "--method", "structured", "--amount", amount, "-o", tmp_path / "x.pt")
    assert code == 2
    assert "--amount must be a fraction strictly between 0 and 1" in err
    assert list(tmp_path.iterdir()) == []


def test_cli_untraceable_model(cli, tmp_path):
    code, out, err = cli(
        "prune",
        "tests.compress.prune_models:untraceable",
        "--method",
        "structured",
        "--amount",
        "0.5",
        "-o",
        tmp_path / "x.pt",
    )
    assert code == 2
    assert "torch.fx cannot trace Untraceable" in err and "l1-unstructured" in err
    assert list(tmp_path.iterdir()) == []


def test_cli_unknown_op_keeps_the_layer_and_prunes_the_rest(cli, tmp_path):
    """Channels that reach an op the analysis does not follow (``channel_shuffle``) are kept, named
    in a warning; the rest of the model is pruned."""
    ref = "tests.compress.prune_models:unresolvable"
    code, out, err = cli("prune", ref, "--method", "structured", "--amount", "0.5", "-o", tmp_path / "x.pt")
    assert code == 0, err
    assert (
        "warning: kept the output channels of 1 layer group(s)" in err and "expand: 'channel_shuffle'" in err
    )
    pruned = torch.jit.load(str(tmp_path / "x.pt"))
    assert pruned.expand.weight.shape[0] == 16  # kept
    assert pruned.conv.weight.shape[0] == 4 and pruned.fc1.weight.shape[0] == 8  # pruned


def test_channels_an_op_mixes_are_kept_with_the_reason():
    """A roll along the channels mixes them: the expand conv keeps its channels (the reason in the
    report), the rest is pruned."""
    model = prune_models.tiny_mobile()

    class Rolled(type(model)):
        def forward(self, x):
            x = torch.nn.functional.relu6(self.bn0(self.stem(x)))
            out = torch.roll(torch.nn.functional.relu6(self.bn1(self.expand(x))), 1, dims=1)
            out = torch.nn.functional.relu6(self.bn2(self.depthwise(out)))
            x = x + self.bn3(self.project(out))
            x = torch.nn.functional.relu(self.bn4(self.conv(x)))
            return self.fc2(torch.nn.functional.relu(self.fc1(torch.flatten(x, 1))))

    model.__class__ = Rolled
    pruned, report = structured_prune(model, model.example_inputs(), 0.5)
    assert pruned.expand.out_channels == 16 and "mixed at roll" in report["layers"]["expand"]["kept_reason"]
    assert pruned.conv.out_channels == 4


def test_cli_exclude_matching_nothing_is_a_warning(cli, tmp_path):
    code, out, err = cli(
        "prune",
        TINY,
        "--method",
        "structured",
        "--amount",
        "0.5",
        "--exclude",
        "nope*",
        "-o",
        tmp_path / "x.pt",
    )
    assert code == 0
    assert "warning: --exclude 'nope*' matches no layer" in err
    assert (tmp_path / "x.pt").is_file()


def test_python_exclude_matching_nothing_warns(tmp_path):
    from ptopt.compress.prune import PruneWarning

    with pytest.warns(PruneWarning, match="matches no layer"):
        prune(TINY, "structured", 0.5, tmp_path / "x.pt", exclude=("nope",))


def test_cli_nothing_prunable(cli, tmp_path):
    # the helpers' TinyCNN: its two convs are tied by a residual add to the (default-excluded) first conv
    code, out, err = cli(
        "prune",
        "tests.helpers:tiny_cnn",
        "--method",
        "structured",
        "--amount",
        "0.5",
        "-o",
        tmp_path / "x.pt",
    )
    assert code == 2 and "no layer whose output channels can be removed" in err
    code, out, err = cli(
        "prune",
        "tests.helpers:tiny_cnn",
        "--method",
        "structured",
        "--amount",
        "0.5",
        "--prune-first-last",
        "-o",
        tmp_path / "x.pt",
    )
    assert code == 0, err


def test_cli_exclude_warning_comes_before_the_work(cli, tmp_path, monkeypatch):
    """The pruning warnings were held and printed after the work (8-17 s into a run on a real model): an
    --exclude that matches nothing is said before pruning starts."""
    import sys

    from ptopt.compress.prune import api

    said_before: list[str] = []
    pruned = api._pruned

    def spying(*args, **kwargs):
        said_before.append(sys.stderr.buffer.getvalue().decode())  # what the CLI printed so far
        return pruned(*args, **kwargs)

    monkeypatch.setattr(api, "_pruned", spying)
    args = ("prune", TINY, "--method", "structured", "--amount", "0.5", "--exclude", "nope*", "-q")
    code, _, err = cli(*args, "-o", tmp_path / "x.pt")
    assert code == 0, err
    assert "warning: --exclude 'nope*' matches no layer" in said_before[0]
