"""``--mode static --engine auto`` (``compress/quantize/auto_int8.py``): the engines in
order, the whole model first, then the most sensitive layers kept float until the int8 rule holds; one
refusal naming what each engine reached when nothing holds. Real quantization of tiny models: a
"massive activation" MLP (``quant_models.OutlierMLP``) whose whole-model int8 breaks on every engine."""

from __future__ import annotations

import json

import torch

import ptopt
from tests.compress.quant_models import outlier_data, outlier_mlp
from tests.helpers import assert_refused

MODEL = "tests.compress.quant_models:outlier_mlp"
DATA = "tests.compress.quant_models:outlier_calib"
#: what the outlier block needs float in graph mode: the layer that writes the massive channel, and the
#: one that reads it
NEEDED = {"block.0", "block.2"}


def _heldout() -> torch.Tensor:
    return torch.randn(64, 16, generator=torch.Generator().manual_seed(5))


def test_auto_keeps_the_most_sensitive_layers_float_until_int8_holds():
    res = ptopt.quantize(
        outlier_mlp(),
        "static",
        calib_data=outlier_data(),
        eval_data=_heldout(),
        engine="auto",
        progress=False,
    )
    assert res.format == "torchscript" and res.config["engine"] == "fx"
    kept = {n: why for n, why in res.extra["float_layers"].items() if "kept float by --engine auto" in why}
    assert set(kept) == NEEDED, res.extra["float_layers"]
    assert all("by int8 sensitivity" in why and "the int8 rule holds" in why for why in kept.values())
    fid = res.metrics["vs_fp32"]
    assert fid["passed"] and fid["data"] == "in-memory evaluation data" and fid["min_cosine"] >= 0.99
    rec = res.extra["auto_int8"]
    assert (
        rec["float_modules"] == ["block.0", "block.2"] and rec["accepted_on"] == "in-memory evaluation data"
    )
    fx, pt2e = rec["engines"]
    assert (fx["engine"], fx["holds"]) == ("fx", True) and fx["trials"][0].startswith("0 float")
    assert (
        pt2e["engine"] == "pt2e" and not pt2e["holds"]
    )  # its whole model missed too; fx's search held first
    assert "with 2 module(s) kept float" in res.extra["engine_choice"]["why"]
    assert res.extra["int8_share"]["parameters"] > 0.1


def test_cli_auto_names_what_stayed_float_and_why(cli, tmp_path):
    out = tmp_path / "o.int8.pt"
    code, stdout, err = cli(
        "quantize", MODEL, "--mode", "static", "--engine", "auto", "--calib-data", DATA, "-o", out
    )
    assert code == 0, err
    assert "engine: fx (" in stdout and "kept float by --engine auto" in stdout
    assert "whole model int8: 0 float: min cosine" in err  # the search's progress, on stderr
    side = json.loads(out.with_name(out.name + ".ptopt.json").read_text())
    assert side["format"] == "torchscript" and side["metrics"]["vs_fp32"]["passed"]
    assert set(side["extra"]["auto_int8"]["float_modules"]) == NEEDED
    assert side["extra"]["auto_int8"]["accepted_on"] is None  # no --eval-data: judged on the calibration data


def test_nothing_holds_is_one_refusal_naming_what_each_engine_reached(cli, tmp_path):
    msg = assert_refused(
        cli, "quantize", "tests.compress.quant_models:gated_one_layer", "--mode", "static", "--engine", "auto",
        "--calib-data", "tests.compress.quant_models:features16", "-o", tmp_path / "g.pt", "--no-progress",
        match=("holds the int8 rule on no engine", "fx: no set of float layers", "torch.export cannot trace"),
        where=tmp_path,
    )  # fmt: skip
    assert "best: 0 float: min cosine" in msg and "--min-cosine" in msg


def _fx_static(model, data, floats=()):
    from ptopt.compress.quantize.config import StaticQuantConfig
    from ptopt.compress.quantize.techniques.static_fx import quantize_static
    from ptopt.core.data import Dataset

    cfg = StaticQuantConfig(float_modules=floats, observer="minmax")
    return quantize_static(model, cfg, Dataset(data), data[:32], progress=False).module


def test_observers_calibrated_once_are_reused_only_for_the_same_tensors(monkeypatch):
    """A candidate with a block float reuses the whole model's calibration (its observers saw the same fp32
    tensors) and converts to exactly what calibrating it again makes; other data is calibrated for real."""
    from ptopt.compress.quantize import observed
    from ptopt.compress.quantize.techniques import static_fx

    real = []
    calibrate = static_fx._calibrate
    monkeypatch.setattr(static_fx, "_calibrate", lambda *a: real.append(1) or calibrate(*a))
    torch.manual_seed(0)
    model, data = outlier_mlp(), outlier_data(64)
    other = data * 2
    store: dict = {}
    with observed.reused(store):
        _fx_static(model, data)
        reused = _fx_static(model, data, ("block.2",))
        assert len(real) == 1  # the candidate's observers found what the first calibration saw
        _fx_static(model, other, ("block.2",))
        assert len(real) == 2  # other tensors: calibrated for real
    fresh = _fx_static(model, data, ("block.2",))
    x = outlier_data(16) * 0.5
    assert torch.equal(reused(x), fresh(x))


class _Ladder:
    """A trial whose int8 model holds with ``need`` or more of the ranked units float."""

    def __init__(self, need):
        self.need, self.tried, self.seconds, self.plain = need, [], [], set()

    def holds(self, floats):
        self.tried.append(len(floats))
        return len(floats) >= self.need, ""


def test_the_float_search_starts_at_the_simulation_and_doubles_to_the_most_float():
    from ptopt.compress.quantize.auto_int8 import MAX_BUILDS, _fewest

    ranked = [f"u{i}" for i in range(12)]
    t = _Ladder(need=3)
    assert _fewest(t, ranked, 4, 12, lambda: 100.0) == 3 and t.tried == [4, 2, 3]  # predicted, then halved
    t = _Ladder(need=7)
    assert _fewest(t, ranked, 4, 12, lambda: 100.0) == 7 and t.tried == [4, 8, 6, 7]
    t = _Ladder(need=13)  # nothing the share allows holds
    assert _fewest(t, ranked, 4, 12, lambda: 100.0) is None and t.tried == [4, 8, 12]
    t = _Ladder(need=12)
    assert _fewest(t, ranked, 1, 12, lambda: 100.0) is None and len(t.tried) == MAX_BUILDS  # 1, 2, 4, 8
    t = _Ladder(need=3)  # the ranking used up the time: its prediction is still built, once
    assert _fewest(t, ranked, 4, 12, lambda: 0.0) == 4 and t.tried == [4]
    t = _Ladder(need=5)
    assert _fewest(t, ranked, 4, 12, lambda: 0.0) is None and t.tried == [4]


class _Spared(_Ladder):
    """Holds the int8 rule with ``need`` or more float, the search's headroom with ``spare`` or more."""

    def __init__(self, need, spare):
        super().__init__(need)
        self.spare = spare

    def holds(self, floats):
        self.tried.append(len(floats))
        if self.need <= len(floats) < self.spare:
            self.plain.add(tuple(floats))
        return len(floats) >= self.spare, ""


def test_a_kept_float_set_needs_the_headroom_else_the_fewest_that_hold_the_rule():
    from ptopt.compress.quantize.auto_int8 import _fewest, spared

    assert round(spared(), 6) == 0.9925  # a quarter of the rule's 0.01 to spare
    ranked = [f"u{i}" for i in range(12)]
    t = _Spared(need=2, spare=5)  # 2 and 4 hold the rule only: the ladder goes on to more float
    assert _fewest(t, ranked, 2, 12, lambda: 100.0) == 6 and t.tried == [2, 4, 8, 6]
    t = _Spared(need=3, spare=13)  # none has the headroom: the fewest that held the rule
    assert _fewest(t, ranked, 2, 12, lambda: 100.0) == 4 and t.tried == [2, 4, 8, 12]


def test_a_pt2e_package_that_fails_to_compile_is_written_as_its_int8_program(monkeypatch):
    """LeViT's int8 graph held the rule and its AOTInductor package failed to compile (a torch bug): auto
    writes the graph that held as the int8 ExportedProgram (``--no-compile``'s artifact) and says why."""
    from ptopt.compress.quantize import pt2e_package
    from ptopt.core.errors import UnsupportedModelError
    from tests.compress.quant_models import features16, rank_branch

    def fails(*args, **kwargs):
        raise UnsupportedModelError("AOTInductor cannot compile the model: TypeError: torch.Size() takes ...")

    monkeypatch.setattr(pt2e_package, "compile_int8", fails)
    res = ptopt.quantize(rank_branch(), "static", calib_data=features16()["x"], engine="auto", progress=False)
    assert res.format == "exported_program" and res.config["engine"] == "pt2e"
    assert res.config["compile"] is False and res.metrics["vs_fp32"]["passed"]
    assert "its AOTInductor package fails (AOTInductor cannot compile" in res.extra["engine_choice"]["why"]


def test_a_whole_model_that_holds_on_eval_is_judged_on_the_calibration_data_too(monkeypatch):
    """ResNet-18 (random weights, PT2E, 512 calibration samples): its whole int8 model held at 0.9909 on the
    64 eval samples, was written, and measured 0.982-0.988 on six unseen draws; on 256 calibration samples
    it reached 0.9783. A whole model that misses there goes on to the next engine, as a float set would."""
    from ptopt.compress import fidelity
    from tests.helpers import tiny_cnn

    real, seen = fidelity.measure_fidelity, []

    def judged(source, model, data, **kw):
        rec = real(source, model, data, **kw)
        seen.append(data.name)
        if data.name == "builtin:digits:train" and seen.count(data.name) == 1:  # fx's whole model, on it
            rec = rec | {"passed": False, "min_cosine": 0.98}
        return rec

    monkeypatch.setattr(fidelity, "measure_fidelity", judged)
    res = ptopt.quantize(
        tiny_cnn(), "static", calib_data="builtin:digits:train", eval_data="builtin:digits:test",
        calibration_batches=2, engine="auto", compile=False, progress=False,
    )  # fmt: skip
    fx, pt2e = res.extra["auto_int8"]["engines"][:2]
    assert seen[:2] == ["builtin:digits:test", "builtin:digits:train"]  # eval first: the flow's record
    assert not fx["holds"] and fx["trials"][0].endswith(
        "0.9800 on 256 samples of builtin:digits:train (misses)"
    )
    assert pt2e["holds"] and res.config["engine"] == "pt2e" and res.format == "exported_program"
    assert "samples of builtin:digits:test; min cosine" in pt2e["trials"][0]  # both data sets, both held


def test_layers_that_share_a_reason_share_one_line():
    """``--engine auto``'s 51 float layers of a ShuffleNet are one line of their shared reason and their
    names wrapped below, most sensitive first; a layer with a reason of its own keeps its line."""
    from ptopt.cli.quantize import float_lines

    why = "kept float by --engine auto ({}: #{} of 9 by int8 sensitivity); with 4 kept float the int8 rule holds: x"
    floats = {f"layer.{i}": why.format(f"layer.{i}", i + 1) for i in range(4)}
    floats["head"] = "in --exclude"
    lines = float_lines(floats, width=40)
    assert lines[0] == (
        "  4 layers, the most int8-sensitive first: kept float by --engine auto; with 4 kept float the int8 "
        "rule holds: x"
    )
    assert " ".join(lines[1:-1]).split() == ["layer.0,", "layer.1,", "layer.2,", "layer.3"]
    assert lines[-1] == "  head: in --exclude" and all(len(ln) <= 40 for ln in lines[1:-1])


def test_the_same_data_to_search_and_accept_on_is_one_figure(cli, tmp_path):
    """--eval-data the calibration data: the search data (its first 256 samples) and the acceptance data are
    the same samples, and each figure said the same clause twice ("min cosine 0.9982 on 64 samples of D;
    min cosine 0.9982 on 64 samples of D")."""
    code, out, err = cli("quantize", MODEL, "--mode", "static", "--engine", "auto", "--calib-data", DATA,
                         "--eval-data", DATA, "-o", tmp_path / "o.pt")  # fmt: skip
    assert code == 0, err
    clause = f"samples of {DATA}; min cosine"
    assert "min cosine" in err and clause not in " ".join((out + err).split())
    res = ptopt.quantize(MODEL, "static", calib_data=DATA, eval_data=DATA, engine="auto", progress=False)
    trials = [t for e in res.extra["auto_int8"]["engines"] for t in e["trials"]]
    assert trials and not any(clause in t for t in trials), trials
