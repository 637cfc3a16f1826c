"""Accuracy-aware quantization's held-out acceptance feeds back into its search: a candidate that holds
on the search's samples but not on the held-out ones is rejected and the next rung (one more of the
most sensitive layers float) is tried, instead of the search ending on a model known to miss the goal.

A stand-in tuner makes the measurements exact and instant (no model is quantized): the worst cosine is
0.90 + 0.02 per float layer on the search's samples and 0.035 lower on the held-out ones, so the goal
0.955 holds from 3 float layers on the search's samples and from 5 on the held-out ones."""

from __future__ import annotations

from ptopt.compress.quantize.autoquant import _accept_unseen
from ptopt.compress.quantize.autoquant_result import AccuracyGoal, Measurement
from ptopt.compress.quantize.autoquant_search import Search
from ptopt.compress.quantize.config import DynamicQuantConfig

LAYERS = [f"l{i}" for i in range(8)]
HELDOUT_GAP = 0.035


class Tuner:
    def __init__(self) -> None:
        self.base = DynamicQuantConfig()
        self.smoothable: list[str] = []
        self.params = dict.fromkeys(LAYERS, 10)
        self.cost = dict.fromkeys(LAYERS, 1.0)
        self.by_accuracy = False
        self.eval = "search"
        self.quantized = 0

    def log(self, msg: str) -> None:
        pass

    def elapsed(self) -> float:
        return 0.0

    def quantize(self, config, smooth=None):
        self.quantized += 1
        return tuple(config.float_modules)

    def measure(self, floats, ds, ref=None) -> Measurement:
        cos = 0.90 + 0.02 * len(floats) - (HELDOUT_GAP if ds == "heldout" else 0.0)
        return Measurement(16, cos, cos)

    def latency(self, floats) -> float:
        return 1.0 + 0.1 * len(floats)

    def fp32_outputs(self, ds):
        return None


def _search(trials: int = 24) -> Search:
    goal = AccuracyGoal(min_cosine=0.955, trials=trials)
    sens = [{"layer": n, "min_cosine": 0.9 - 0.01 * i, "mean_cosine": 0.95} for i, n in enumerate(LAYERS)]
    search = Search(Tuner(), LAYERS, sens, goal)
    search.run()
    return search


def test_a_rung_that_fails_held_out_leads_to_the_next():
    search = _search()
    chosen_on_search = search.choose()
    assert len(chosen_on_search.float_layers) == 3  # what the search alone would write
    rejected = _accept_unseen(search, search.t, "heldout", search.goal)
    chosen = search.choose()
    assert chosen.holds and len(chosen.float_layers) == 5
    assert chosen.heldout is not None and chosen.heldout.holds(search.goal)
    assert rejected and all(c.heldout_failed and not c.holds for c in rejected)
    assert {len(c.float_layers) for c in rejected} == {3, 4}
    assert any(c.step.endswith("after held-out") for c in search.candidates)


def test_the_rungs_past_the_budget_are_few_and_the_answer_is_then_the_closest():
    """A spent tuning budget still gets a few rungs (acceptance is not tuning); past them, nothing
    holds and the closest is chosen, not claimed to meet the goal."""
    search = _search(trials=6)
    assert search.exhausted
    rejected = _accept_unseen(search, search.t, "heldout", search.goal)
    assert len(rejected) >= 1 and search.rungs <= 4
    chosen = search.choose()
    assert chosen is not None
    if not chosen.holds:
        assert not search.holding()
