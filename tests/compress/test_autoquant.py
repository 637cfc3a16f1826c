"""Accuracy-aware quantization: sensitivity ranking, search, always-an-answer, CLI and Python twin."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ptopt.core.artifact import Artifact

FRAGILE = "tests.compress.autoquant_models:fragile_mlp"
DIGITS = "builtin:digits:test"


def _files(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir())


def test_sensitivity_ranks_fragile_layer_first_and_writes_nothing(tmp_path: Path) -> None:
    from ptopt.compress.quantize.autoquant import autoquantize

    res = autoquantize(
        FRAGILE,
        "dynamic",
        tmp_path / "never.pt",
        eval_data=DIGITS,
        min_cosine=0.99,
        analyze=True,
        threads=1,
        progress=False,
    )
    assert res.artifact is None and res.candidates == []
    assert [r["layer"] for r in res.sensitivity][0] == "fragile"
    assert {r["layer"] for r in res.sensitivity} == {"fc1", "fragile", "fc3"}
    top = res.sensitivity[0]
    assert top["breaks_budget"] and top["min_cosine"] < 0.99
    assert not any(r["breaks_budget"] for r in res.sensitivity[1:])
    assert _files(tmp_path) == []


def test_cli_analyze_prints_ranked_table_and_writes_nothing(cli, tmp_path: Path) -> None:
    code, out, err = cli(
        "quantize",
        FRAGILE,
        "--mode",
        "dynamic",
        "--eval-data",
        DIGITS,
        "--analyze",
        "--threads",
        "1",
        "--no-progress",
    )
    assert code == 0, err
    assert "Layer sensitivity" in out and "fragile" in out
    assert out.index("fragile") < out.index("fc1")
    assert _files(tmp_path) == []


def test_cli_budget_that_holds_keeps_fragile_float(cli, tmp_path: Path) -> None:
    out_file = tmp_path / "m.int8.pt"
    code, out, err = cli(
        "quantize",
        FRAGILE,
        "--mode",
        "dynamic",
        "--eval-data",
        DIGITS,
        "--min-cosine",
        "0.99",
        "--threads",
        "1",
        "-o",
        out_file,
    )
    assert code == 0, err
    assert "Candidates tried" in out and "meets min cosine >= 0.99" in out
    # each search message is one line (it was a rich console of its own, wrapped at 80 columns in a log)
    line = next(x for x in err.splitlines() if x.startswith("autoquant: candidate 1 (all int8)"))
    assert line.rstrip().endswith(("holds", "fails")), err
    art = Artifact.load(out_file)
    aq = art.extra["autoquant"]
    assert aq["met"] is True and aq["goal"]["min_cosine"] == 0.99
    chosen = aq["candidates"][aq["chosen"]]
    assert chosen["holds"] and chosen["measurement"]["min_cosine"] >= 0.99
    # fragile's trouble is an activation outlier channel: keeping it float or SmoothQuant both fix it
    if chosen["smooth"]:
        assert art.extra["smoothquant"]["alpha"] == chosen["smooth"]
        assert set(art.extra["smoothquant"]["layers"]) == {"fc1", "fragile", "fc3"} - set(
            chosen["float_layers"]
        )
    else:
        assert chosen["float_layers"] == ["fragile"]
        assert "excluded" in art.extra["float_layers"]["fragile"]
    # every candidate tried is recorded with its error, latency and float layers
    assert len(aq["candidates"]) >= 2 and all(
        "latency_ms" in c and "float_layers" in c for c in aq["candidates"]
    )
    assert aq["candidates"][0]["float_layers"] == [] and not aq["candidates"][0]["holds"]
    assert aq["sensitivity"][0]["layer"] == "fragile"
    assert art.config["accuracy_goal"]["type"] == "accuracy-goal"
    assert art.metrics["goal_met"] is True and art.metrics["min_cosine"] >= 0.99
    # the search fitted on one half of the eval data; the headline is the other half, never seen
    split = aq["split"]
    assert split["seed"] == 0 and split["search_samples"] + split["heldout_samples"] == 359
    assert aq["unseen"]["samples"] == split["heldout_samples"]
    assert art.metrics["min_cosine"] == aq["unseen"]["min_cosine"]
    assert art.metrics["search_min_cosine"] == chosen["measurement"]["min_cosine"]
    assert aq["fp32"]["eval_samples"] == split["search_samples"]
    assert f"held out: min cosine {aq['unseen']['min_cosine']:.4f} on {split['heldout_samples']}" in out
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        m = torch.jit.load(str(out_file))
    assert m(torch.rand(3, 1, 8, 8)).shape == (3, 10)


def test_cli_impossible_budget_writes_best_names_layers_exit_1(cli, tmp_path: Path) -> None:
    out_file = tmp_path / "m.int8.pt"
    code, out, err = cli(
        "quantize",
        FRAGILE,
        "--mode",
        "dynamic",
        "--eval-data",
        DIGITS,
        "--min-cosine",
        "0.9999999",
        "--tuning-budget",
        "6",
        "--threads",
        "1",
        "--no-progress",
        "-o",
        out_file,
    )
    assert code == 1, err
    assert out_file.is_file()  # always an answer
    assert "no candidate meets min cosine >= 0.9999999" in err
    assert "break the budget" in err and "fragile" in err
    aq = Artifact.load(out_file).extra["autoquant"]
    assert aq["met"] is False and "fragile" in aq["breaking_layers"]
    best = aq["candidates"][aq["chosen"]]
    assert best["measurement"]["min_cosine"] == max(c["measurement"]["min_cosine"] for c in aq["candidates"])


def test_python_twin_raises_gate_failed_after_writing(tmp_path: Path) -> None:
    from ptopt.compress.quantize import quantize
    from ptopt.core.errors import GateFailedError

    out = tmp_path / "m.pt"
    with pytest.raises(GateFailedError) as e:
        quantize(
            FRAGILE, "dynamic", out, eval_data=DIGITS, min_cosine=0.9999999, tuning_budget=2, progress=False
        )
    assert e.value.exit_code == 1 and out.is_file()
    assert e.value.result.artifact.path == out  # type: ignore[attr-defined]


def test_static_accuracy_budget_python_api(tmp_path: Path) -> None:
    from ptopt.compress.quantize import quantize

    art = quantize(
        "tests.helpers:tiny_cnn",
        "static",
        tmp_path / "s.pt",
        engine="fx",  # the search on one engine (static's default, auto, runs it on fx and on PT2E)
        calib_data="builtin:digits:train",
        eval_data=DIGITS,
        accuracy_budget=5.0,
        calibration_batches=2,
        tuning_budget=1,
        progress=False,
    )
    aq = art.extra["autoquant"]
    assert aq["met"] and aq["mode"] == "static"
    assert {r["layer"] for r in aq["sensitivity"]} == {"conv1", "conv2", "fc"}
    assert all(r["accuracy_drop"] is not None for r in aq["sensitivity"])
    c = aq["candidates"][aq["chosen"]]
    assert c["measurement"]["accuracy_drop"] <= 5.0 and c["observer"] in ("histogram", "minmax", "percentile")
    assert art.config["type"] == "quantize-static" and art.metrics["goal_met"]


def test_multi_input_encoder_min_cosine_without_labels(tmp_path: Path) -> None:
    from ptopt.compress.quantize.autoquant import autoquantize
    from ptopt.core.data import Dataset
    from tests.compress.autoquant_models import tokens

    data = Dataset(tokens(), name="tokens")
    res = autoquantize(
        "ptopt.models.minilm:minilm_tiny",
        "dynamic",
        tmp_path / "enc.pt",
        eval_data=data,
        min_cosine=0.999,
        tuning_budget="4",
        threads=1,
        latency_batch_size=8,
        progress=False,
    )
    assert len(res.sensitivity) == 12  # q, k, v, o, ff1, ff2 in 2 blocks
    assert res.sensitivity[0]["accuracy_drop"] is None
    art = res.artifact
    assert art.input_style == "keyword" and [s.name for s in art.inputs] == ["input_ids", "attention_mask"]
    assert len(res.candidates) <= 4
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        m = torch.jit.load(str(art.path))
    x = tokens(3)
    assert m(**x).shape == (3, 32)


def test_lstm_dynamic_with_seconds_budget(tmp_path: Path) -> None:
    from ptopt.compress.quantize.autoquant import autoquantize

    res = autoquantize(
        "tests.compress.quant_models:tiny_lstm",
        "dynamic",
        tmp_path / "l.pt",
        eval_data=DIGITS,
        accuracy_budget=100.0,
        tuning_budget="1s",
        threads=1,
        progress=False,
    )
    assert res.met and {"lstm", "gru", "fc"} == {r["layer"] for r in res.sensitivity}
    assert res.best.float_layers == ()


def test_tuning_budget_parsing() -> None:
    from ptopt.compress.quantize.autoquant import DEFAULT_TRIALS, parse_tuning_budget
    from ptopt.core.errors import UsageError

    assert parse_tuning_budget(None) == (DEFAULT_TRIALS, None)
    assert parse_tuning_budget("12") == (12, None)
    assert parse_tuning_budget("90s") == (None, 90.0)
    assert parse_tuning_budget("2m") == (None, 120.0)
    with pytest.raises(UsageError):
        parse_tuning_budget("soon")


@pytest.mark.parametrize(
    "args,message",
    [
        (["--mode", "dynamic", "--accuracy-budget", "1", "--eval-data", "UNLABELLED"], "has no labels"),
        (
            ["--mode", "qat", "--min-cosine", "0.9", "--eval-data", DIGITS],
            "--min-cosine applies to --mode dynamic, static",
        ),
        (["--mode", "dynamic", "--min-cosine", "0.9"], "--eval-data"),
        (["--mode", "dynamic", "--accuracy-budget", "-1", "--eval-data", DIGITS], ">= 0"),
        (
            ["--mode", "dynamic", "--min-cosine", "0.9", "--eval-data", DIGITS, "--tuning-budget", "soon"],
            "tuning-budget",
        ),
        (["--mode", "static", "--min-cosine", "0.9", "--eval-data", DIGITS], "--calib-data"),
    ],
    ids=["no-labels", "qat", "no-eval-data", "negative-drop", "bad-budget", "static-no-calib"],
)
def test_bad_input_exit_2_nothing_written(cli, tmp_path: Path, args: list[str], message: str) -> None:
    if "UNLABELLED" in args:
        path = tmp_path / "unlabelled.pt"
        torch.save({"x": torch.rand(20, 1, 8, 8)}, path)
        args = [str(path) if a == "UNLABELLED" else a for a in args]
    before = set(_files(tmp_path))
    code, out, err = cli("quantize", FRAGILE, *args, "--no-progress", "-o", tmp_path / "bad.pt")
    assert code == 2, (out, err)
    assert message in err
    assert set(_files(tmp_path)) == before


def test_json_output_of_analyze(cli) -> None:
    code, out, err = cli(
        "quantize",
        FRAGILE,
        "--mode",
        "dynamic",
        "--eval-data",
        DIGITS,
        "--analyze",
        "--min-cosine",
        "0.99",
        "--threads",
        "1",
        "--no-progress",
        "--json",
    )
    assert code == 0, err
    data = json.loads(out)
    assert data["sensitivity"][0]["layer"] == "fragile" and data["candidates"] == []


def test_smoothquant_is_exact_in_float_and_traceable() -> None:
    from ptopt.compress.quantize.smoothquant import SmoothedLinear, activation_absmax, smooth
    from ptopt.core.data import load_data
    from tests.compress.autoquant_models import fragile_mlp

    model = fragile_mlp().eval()
    data = load_data(DIGITS).take(64)
    stats = activation_absmax(model, data, ["fc1", "fragile", "fc3"])
    assert stats["fragile"][0] > 100 * stats["fragile"][1:].max()  # the outlier channel
    sm = smooth(model, stats, 0.75, ["fragile"])
    assert isinstance(sm.fragile, SmoothedLinear) and isinstance(model.fragile, torch.nn.Linear)
    with torch.no_grad():
        torch.testing.assert_close(sm(data.x), model(data.x), rtol=1e-4, atol=1e-4)


def test_output_still_required_without_analyze(cli, tmp_path: Path) -> None:
    code, out, err = cli(
        "quantize",
        FRAGILE,
        "--mode",
        "dynamic",
        "--min-cosine",
        "0.9",
        "--eval-data",
        DIGITS,
        "--no-progress",
    )
    assert code == 2 and "--output" in err
    code, out, err = cli("quantize", FRAGILE, "--mode", "dynamic")
    assert code == 2 and "--output" in err
    assert _files(tmp_path) == []


def test_search_lines_name_the_data_and_note_labels_on_features(cli) -> None:
    """The fp32 line names the eval data; labels on a feature output (an nn.Identity head) get the note
    that the budget's top-1 may mean nothing there; -q silences the search's lines."""
    data = "tests.helpers:digits8_xy"
    args = ("quantize", "tests.helpers:tiny_cnn_features", "--mode", "static", "--engine", "fx")
    code, out, err = cli(*args, "--calib-data", data, "--eval-data", data, "--analyze", "-q")
    assert code == 0, err
    assert f"eval samples of {data};" in out, out
    assert "note: labels were given, but the outputs look like features" in out
    assert "autoquant:" not in err
