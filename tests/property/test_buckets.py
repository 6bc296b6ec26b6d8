"""Bucket ladders: coverage, no dead rungs, monotone in the budget."""
from hypothesis import given
from hypothesis import strategies as st

from graphc.passes.choose_buckets import default_ladder, rung_for, rungs_for

budgets = st.integers(min_value=1, max_value=20000)
ladders = st.one_of(st.none(), st.lists(st.integers(1, 30000), min_size=1, max_size=12, unique=True).map(sorted))


@given(budgets, ladders)
def test_every_step_size_has_a_rung_and_the_largest_is_the_first_that_holds_the_budget(budget, ladder):
    rungs = rungs_for(budget, ladder)
    assert rungs == sorted(set(rungs))
    assert rungs[-1] == budget                      # the first rung that holds the budget ...
    assert all(r < budget for r in rungs[:-1])      # ... and nothing past it
    for size in range(1, budget + 1, max(1, budget // 97)):
        r = rung_for(size, rungs)
        assert r is not None and r >= size
        assert all(x < size for x in rungs if x < r)   # the smallest rung that holds it


@given(budgets, budgets, ladders)
def test_a_bigger_budget_never_loses_rungs_below_it(b1, b2, ladder):
    small, big = sorted((b1, b2))
    below = {r for r in rungs_for(small, ladder) if r < small}
    assert below <= set(rungs_for(big, ladder))


@given(st.integers(1, 100000))
def test_default_ladder_is_geometric(limit):
    lad = default_ladder(limit)
    assert lad[0] == 1 and lad[-1] <= limit and lad == sorted(set(lad))
    assert all(b <= 2 * a for a, b in zip(lad, lad[1:]))   # no rung wastes more than half its step
