"""ptopt.core.search: the loops every search runs (ranking, the float-layer ladder, dropping the
layers not needed, the catalogue, held-out acceptance that feeds back)."""

from __future__ import annotations

import pytest

from ptopt.core.choice import closest, fastest_within
from ptopt.core.search import accept, catalogue, drop_unneeded, ladder, rank


@pytest.mark.parametrize(
    ("smallest", "n_max", "start", "tries"),
    [
        (5, 10, 1, [1, 2, 4, 8, 6, 5]),  # doubling to 8, then the gap (4, 8) halved
        (1, 10, 1, [1]),
        (None, 4, 1, [1, 2, 4]),  # the largest fails: none holds
        (2, 6, 2, [2]),  # starting at 2 with floor 1: 1 is known not to hold
        (3, 6, 2, [2, 4, 3]),
    ],
    ids=["doubling-then-bisection", "first", "none", "start-2", "start-2-gap"],
)
def test_ladder_finds_the_smallest_k_that_holds(smallest, n_max, start, tries):
    tried = []

    def holds(k):
        tried.append(k)
        return smallest is not None and k >= smallest

    assert ladder(holds, n_max, start=start) == smallest
    assert tried == tries


def test_ladder_below_the_start_with_a_floor_and_a_budget():
    tried = []
    # floor 0: 1 may hold although the search starts at 2 (NNCF's float layers do)
    assert ladder(lambda k: tried.append(k) or k >= 1, 8, start=2, floor=0) == 1 and tried == [2, 1]
    calls = []

    def spent_after_two(k):
        calls.append(k)
        return None if len(calls) > 2 else False

    assert ladder(spent_after_two, 10) is None and calls == [1, 2, 4]
    assert ladder(lambda k: k >= 3, 10, room=lambda: False) is None  # no room: nothing tried


def test_drop_unneeded_keeps_what_is_needed_last_first():
    needed = {"a", "c"}
    order = []

    def holds(rest, dropped):
        order.append(dropped)
        return needed <= set(rest)

    assert drop_unneeded(["a", "b", "c", "d"], holds) == ["a", "c"]
    assert order == ["d", "c", "b", "a"]


def test_rank_most_harmful_first_ties_in_order():
    errors = {"a": 0.1, "b": 0.5, "c": 0.1, "d": 0.3}
    assert rank(errors, errors.get, lambda e: e) == [("b", 0.5), ("d", 0.3), ("a", 0.1), ("c", 0.1)]


def test_catalogue_skips_with_a_reason_and_runs_the_rest():
    log = []
    catalogue(
        [1, 2, 3, 4],
        lambda c: "odd" if c % 2 else None,
        lambda c: log.append(("run", c)),
        lambda c, why: log.append((why, c)),
        lambda c: log.append(("after", c)),
    )
    assert log == [("odd", 1), ("after", 1), ("run", 2), ("after", 2), ("odd", 3), ("after", 3),
                   ("run", 4), ("after", 4)]  # fmt: skip


def test_accept_rejects_on_held_out_and_extends_until_one_holds():
    """The fastest that holds on the search's samples fails on the held-out ones: it is rejected, the
    search tries the next rung (a slower, more accurate candidate), and the choice is made again."""
    ms = {"k1": 1.0, "k2": 2.0}
    holds = {"k1": True, "k2": False}
    unseen = {"k1": False, "k2": True, "k3": True}

    def choose():
        return fastest_within(ms, ms.get, lambda c: holds[c])[0]

    def extend(c):
        holds[c] = False
        if "k3" not in ms:  # the next rung: one more layer float
            ms["k3"], holds["k3"] = 3.0, True

    chosen, rejected = accept(choose, unseen.get, extend)
    assert (chosen, rejected) == ("k3", ["k1"])


def test_accept_ends_without_an_answer_when_nothing_is_left():
    holds = {"a": True}
    chosen, rejected = accept(
        lambda: next((c for c, ok in holds.items() if ok), None),
        lambda c: False,
        lambda c: holds.update({c: False}),
    )
    assert chosen is None and rejected == ["a"]


def test_the_choice_rule_ties_within_a_band_and_falls_back_to_the_closest():
    ms = {"a": 1.00, "b": 1.05, "c": 1.30}
    macs = {"a": 0.5, "b": 0.1, "c": 0.0}
    assert fastest_within(ms, ms.get, lambda c: True, macs.get, tie=0.10) == ("b", True)
    assert fastest_within(ms, ms.get, lambda c: True, macs.get) == ("a", True)
    err = {"a": 0.3, "b": 0.2, "c": 0.2}
    assert closest(ms, err.get, ms.get) == "b" and closest([], err.get, ms.get) is None
