"""validate's own numbers: the worst per-sample cosine, per-token agreement of language-model logits,
and latency gates that refuse to decide on timing noise."""

import copy
import io

import pytest
import torch

from ptopt.core.data import load_data
from ptopt.validate import api as validate_api
from ptopt.validate.api import validate
from ptopt.validate.gates import EXIT_INCONCLUSIVE, GateInconclusiveError
from ptopt.validate.latency import LatencyOptions
from tests.helpers import tiny_cnn

QUICK = LatencyOptions(min_iters=3, min_seconds=0.01, warmup_iters=1, warmup_seconds=0.0, rounds=2)


def _perturbed(model: torch.nn.Module, scale: float) -> torch.nn.Module:
    torch.manual_seed(1)
    other = copy.deepcopy(model)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn_like(p) * scale * p.abs().mean())
    return other


def _terminal(data) -> str:
    from rich.console import Console

    from ptopt.validate.reports import terminal

    buf = io.StringIO()
    Console(file=buf, width=250, soft_wrap=False).print(terminal.render(data))
    return buf.getvalue()


def test_min_cosine_is_the_worst_sample_of_a_perturbed_artifact(artifacts):
    ds = load_data(artifacts["data"])
    ref = tiny_cnn().eval()
    bad = _perturbed(ref, 0.5).eval()
    res = validate(ref, [bad], artifacts["data"], batch_sizes=(1,), threads=1, latency=QUICK)
    with torch.no_grad():
        a, b = ref(ds.x).double(), bad(ds.x).double()
    cos = (a * b).sum(1) / (a.norm(dim=1) * b.norm(dim=1))
    agr = res.entries[0]["agreement"]
    assert agr["min_cosine"] == pytest.approx(float(cos.min()), abs=1e-9)
    assert agr["min_cosine"] < 0.999 and agr["min_cosine"] < agr["cosine"]
    out = _terminal(res.data)
    assert "cos min" in out and f"{float(cos.min()):.6f}" in out
    ref_row = next(line for line in out.splitlines() if " ref " in line)
    assert "—" in ref_row


class TinyLM(torch.nn.Module):
    """[batch, tokens] ids -> [batch, tokens, vocab] logits."""

    def __init__(self, vocab: int = 11, dim: int = 8):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(vocab, dim)
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, ids):
        return self.head(torch.tanh(self.emb(ids)))


def test_language_model_logits_get_per_token_top1_agreement(tmp_path):
    torch.manual_seed(3)
    ids = torch.randint(0, 11, (24, 6))
    labels = torch.randint(0, 11, (24, 6))
    ref = TinyLM().eval()
    bad = _perturbed(ref, 0.8).eval()
    res = validate(
        ref, [bad], {"x": ids, "y": labels}, batch_sizes=(1,), threads=1, latency=QUICK, min_agreement=0.0
    )
    with torch.no_grad():
        want = float((ref(ids).argmax(-1) == bad(ids).argmax(-1)).double().mean())
        acc = float((bad(ids).argmax(-1) == labels).double().mean())
    agr = res.entries[0]["agreement"]
    assert agr["top1_agreement"] == pytest.approx(want) and agr["top1_per"] == "token"
    assert 0 < want < 1  # the perturbation moved some tokens, not all
    assert res.entries[0]["metric"] == pytest.approx(acc)  # top-1 over every token position
    assert res.passed


def _fake_latency(spreads: dict[int, float], p50s: dict[int, float]):
    """measure_runners that reports p50s[i] ms with round spread spreads[i] % for runner i."""

    def fake(runners, data, batch_sizes, options, guard=None):
        return [
            {
                bs: {
                    "p50_ms": p50s[i],
                    "p90_ms": p50s[i],
                    "p99_ms": p50s[i],
                    "iterations": 3,
                    "round_spread_pct": spreads[i],
                }
                for bs in batch_sizes
            }
            for i in range(len(runners))
        ]

    return fake


@pytest.mark.parametrize(
    "gate, spreads, p50s, want",
    [
        ({"min_speedup": 1.2}, {0: 300.0, 1: 300.0}, {0: 10.0, 1: 5.0}, "inconclusive"),
        ({"min_speedup": 1.2}, {0: 2.0, 1: 2.0}, {0: 10.0, 1: 5.0}, "pass"),
        ({"min_speedup": 3.0}, {0: 2.0, 1: 2.0}, {0: 10.0, 1: 5.0}, "fail"),
        ({"max_latency_ms": ["6"]}, {0: 1.0, 1: 60.0}, {0: 10.0, 1: 5.0}, "inconclusive"),
        ({"max_latency_ms": ["6"]}, {0: 1.0, 1: 5.0}, {0: 10.0, 1: 5.0}, "pass"),
    ],
    ids=["speedup-noisy", "speedup-quiet-pass", "speedup-quiet-fail", "latency-noisy", "latency-quiet"],
)
def test_latency_gates_never_decide_on_noise(artifacts, monkeypatch, tmp_path, gate, spreads, p50s, want):
    monkeypatch.setattr(validate_api, "measure_runners", _fake_latency(spreads, p50s))
    ref = tiny_cnn().eval()
    res = validate(
        ref, [copy.deepcopy(ref)], artifacts["data"], batch_sizes=(1,), threads=1, latency=QUICK,
        junit_path=tmp_path / "r.xml", markdown_path=tmp_path / "r.md", **gate,
    )  # fmt: skip
    g = res.entries[0]["gates"][0]
    assert g["inconclusive"] == (want == "inconclusive") and g["passed"] == (want == "pass")
    assert res.passed == (want == "pass")
    out = _terminal(res.data)
    if want == "inconclusive":
        assert not res.failed_gates and res.inconclusive_gates == [g]
        assert "INCONCLUSIVE" in out and "~ noisy:" in out and "spread" in g["message"]
        assert "<skipped" in (tmp_path / "r.xml").read_text()
        assert "⚠️" in (tmp_path / "r.md").read_text()
        with pytest.raises(GateInconclusiveError) as info:
            validate_api.raise_for_status(res)
        assert info.value.exit_code == EXIT_INCONCLUSIVE == 4
    elif want == "fail":
        assert res.failed_gates == [g] and "INCONCLUSIVE" not in out
    else:
        assert "INCONCLUSIVE" not in out
        validate_api.raise_for_status(res)


def test_cli_exit_status_of_an_inconclusive_gate(artifacts, monkeypatch, cli):
    monkeypatch.setattr(
        validate_api, "measure_runners", _fake_latency({0: 500.0, 1: 500.0}, {0: 4.0, 1: 4.0})
    )
    code, out, err = cli(
        "validate", "tests.helpers:tiny_cnn", str(artifacts["torchscript"]), "--data", str(artifacts["data"]),
        "--batch-sizes", "1", "--threads", "1", "--min-speedup", "1.1",
    )  # fmt: skip
    assert code == 4, out + err
    assert "INCONCLUSIVE" in out and "inconclusive" in err and "Traceback" not in err


def test_median_stable_needs_half_the_rounds_and_a_steady_median():
    from ptopt.validate.latency import median_stable, min_stable_rounds

    opts = LatencyOptions(min_iters=4, rounds=12, stable_pct=2.0)
    steady = [[1.0, 1.01]] * 12
    assert min_stable_rounds(12) == 6
    assert not median_stable(steady[:5], opts) and median_stable(steady[:6], opts)
    drifting = [[1.0 + 0.1 * r, 1.0 + 0.1 * r] for r in range(8)]
    assert not median_stable(drifting, opts)
    assert not median_stable(steady[:6], dataclasses_replace(opts, stable_pct=0.0))
    assert not median_stable(steady[:6], dataclasses_replace(opts, min_iters=100))


def dataclasses_replace(obj, **kw):
    import dataclasses

    return dataclasses.replace(obj, **kw)


def test_a_stopped_key_leaves_the_others_interleaved():
    from ptopt.core.timing import measure_interleaved

    calls = []
    fns = {k: (lambda k=k: calls.append(k)) for k in "abc"}
    stats = measure_interleaved(
        fns, rounds=6, min_iters=6, min_seconds=0.0, warmup_iters=0, warmup_seconds=0.0,
        stop=lambda key, slices: key == "a" and len(slices) == 2,
    )  # fmt: skip
    assert stats["a"]["rounds"] == 2 and len(stats["a"]["round_p50_ms"]) == 2
    assert stats["b"]["rounds"] == stats["c"]["rounds"] == 6
    assert stats["a"]["iterations"] == 2 and stats["b"]["iterations"] == stats["c"]["iterations"] == 6
    # a's calls (warm-up and timed) all come in the first two rounds; b and c take turns to the end
    last_a = max(i for i, k in enumerate(calls) if k == "a")
    assert last_a < len(calls) // 2 and {"b", "c"} <= set(calls[last_a + 1 :])


@pytest.mark.parametrize(
    "given, warm",
    [({}, 0.2), ({"min_seconds": 0.01}, 0.01), ({"min_seconds": 0.0, "warmup_seconds": 0.5}, 0.0)],
)
def test_the_warm_up_is_never_longer_than_the_timing(monkeypatch, given, warm):
    """A quick look (--min-seconds 0.01) spends no 0.2 s warming up each (artifact, batch size); the defaults
    keep theirs (0.2 s before 3 s); the warm-up's calls run whatever the seconds."""
    from ptopt.core.data import Dataset
    from ptopt.validate import latency

    seen = {}
    monkeypatch.setattr(
        latency,
        "measure_interleaved",
        lambda fns, sizes, **kw: seen.update(kw) or {k: {"round_spread_pct": 0.0} for k in fns},
    )
    runner = type("R", (), {"accepts_batch": lambda self, bs: True, "timed_call": lambda self, x: x,
                            "timer_device": None})()  # fmt: skip
    latency.measure_runners([runner], Dataset(torch.zeros(2, 3)), [1], LatencyOptions(**given))
    assert seen["warmup_seconds"] == warm and seen["warmup_iters"] == LatencyOptions().warmup_iters


def test_validate_stops_stable_rounds_early_and_evaluates_once_at_the_largest_batch(artifacts, monkeypatch):
    monkeypatch.setattr("ptopt.validate.noise.NOISY_SPREAD_PCT", 1e9)  # no cell noisy on a busy machine
    said = []
    ref = tiny_cnn().eval()
    common = dict(batch_sizes=(1, 100), threads=1, progress=said.append)
    quick = LatencyOptions(min_iters=3, min_seconds=0.01, warmup_iters=1, warmup_seconds=0.0, rounds=12)
    loose = dataclasses_replace(quick, stable_pct=1000.0)  # any median is "stable": stops at the minimum
    res = validate(ref, [copy.deepcopy(ref)], artifacts["data"], latency=loose, **common)
    for e in [res.reference, *res.entries]:
        assert e["eval_batch_size"] == 100
        for st in e["latency"].values():
            assert st["rounds"] == 6 == len(st["round_p50_ms"]) and st["iterations"] >= 3
    assert any(m.startswith("stopped early, stable") for m in said)
    said.clear()
    never = dataclasses_replace(quick, stable_pct=0.0)
    res = validate(ref, [copy.deepcopy(ref)], artifacts["data"], latency=never, eval_batch_size=7, **common)
    assert res.reference["eval_batch_size"] == 7
    assert all(st["rounds"] == 12 for st in res.entries[0]["latency"].values())
    assert not any(m.startswith("stopped early, stable") for m in said)


@pytest.mark.parametrize(
    "kind, spread, want", [("latency", 40.0, True), ("latency", 1.0, False), ("speedup", 40.0, True)],
    ids=["latency-noisy", "latency-quiet", "speedup-noisy"],
)  # fmt: skip
def test_regression_gates_within_the_noise_are_inconclusive(
    artifacts, monkeypatch, tmp_path, kind, spread, want
):
    ref = tiny_cnn().eval()
    run = dict(batch_sizes=(1,), threads=1, latency=QUICK)
    monkeypatch.setattr(validate_api, "measure_runners", _fake_latency({0: 1.0, 1: 1.0}, {0: 10.0, 1: 5.0}))
    validate(ref, [copy.deepcopy(ref)], artifacts["data"], json_path=tmp_path / "base.json", **run)
    # 5 -> 6 ms: +20% against a 10% limit, a failure unless the rounds spread more than the margin
    monkeypatch.setattr(
        validate_api, "measure_runners", _fake_latency({0: 1.0, 1: spread}, {0: 10.0, 1: 6.0})
    )
    res = validate(
        ref, [copy.deepcopy(ref)], artifacts["data"], baseline=tmp_path / "base.json", max_regression=10,
        regression_on=kind, **run,
    )  # fmt: skip
    (g,) = res.entries[0]["gates"]
    assert g["gate"] == f"max-regression:{kind}@bs1" and g["inconclusive"] is want and not g["passed"]
    assert bool(res.failed_gates) is not want
