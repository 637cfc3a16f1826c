"""core.choice.fastest_within: the one rule optimize, quantize --engine auto and autoquant pick by."""

from ptopt.core.choice import fastest_within

MS = {"a": 3.0, "b": 2.0, "c": 2.0, "d": None}
SIZE = {"a": 1, "b": 9, "c": 5, "d": 0}


def test_fastest_within_the_budget_ties_to_the_tiebreak():
    assert fastest_within(MS, MS.get, lambda k: True, SIZE.get) == ("c", True)
    assert fastest_within(MS, MS.get, lambda k: k != "c", SIZE.get) == ("b", True)
    assert fastest_within(MS, MS.get, lambda k: k in ("a", "d")) == ("a", True)  # no latency: slowest


def test_none_within_the_budget():
    assert fastest_within(MS, MS.get, lambda k: False) == (None, False)
    assert fastest_within([], MS.get, lambda k: True) == (None, False)
