"""Bucket ladders against brute force (DESIGN.md "Buckets").

The reference, written from the rule and not from the code: a step of size s (1 <= s <= budget)
runs at the smallest ladder rung that holds it, unless that rung is past the budget (or there
is none), in which case it runs at the budget itself. The rungs are exactly the rungs some step
size runs at: that is coverage, no dead rungs and no rung past the budget in one statement.
"""
from hypothesis import example, given, settings
from hypothesis import strategies as st

from graphc.passes.choose_buckets import default_ladder, rung_for, rungs_for

MAX_BUDGET = 3000          # every size 1..budget is checked, so keep budgets sweepable


def reference_rung(size: int, budget: int, ladder: list[int]) -> int:
    holding = [r for r in ladder if r >= size]
    return min(min(holding), budget) if holding else budget


def reference_default_ladder(limit: int) -> list[int]:
    """Powers of two, and 3 x 2^k from 12 on (1, 2, 4, 8, 12, 16, 24, 32, 48, ...), up to limit."""
    def on(n):
        pow2 = n & (n - 1) == 0
        return pow2 or (n % 3 == 0 and n >= 12 and (n // 3) & (n // 3 - 1) == 0)
    return [n for n in range(1, limit + 1) if on(n)]


@st.composite
def budget_and_ladder(draw):
    """A ladder (or None: the default one) and a budget that is often on a rung or next to one."""
    ladder = draw(st.one_of(st.none(), st.lists(st.integers(1, MAX_BUDGET + 50), min_size=1, max_size=12,
                                                unique=True).map(sorted)))
    rungs = ladder if ladder is not None else reference_default_ladder(MAX_BUDGET + 50)
    budget = draw(st.one_of(
        st.integers(1, MAX_BUDGET),
        st.tuples(st.sampled_from(rungs), st.sampled_from([-1, 0, 1])).map(lambda t: t[0] + t[1]),
    ).filter(lambda b: 1 <= b <= MAX_BUDGET + 51))
    return budget, ladder


@settings(max_examples=150, deadline=None)
@given(budget_and_ladder())
@example((16, None))                 # on the default ladder
@example((17, None))                 # one above a rung
@example((23, None))                 # one below a rung (24)
@example((1, None))
@example((8, [2, 8, 32]))            # on a custom rung
@example((9, [2, 8, 32]))            # one above it: 32 is past the budget, the budget is the top
@example((7, [2, 8, 32]))            # one below it
@example((40, [2, 8, 32]))           # past the whole ladder
@example((1, [5]))                   # below the whole ladder: one rung, the budget
@example((2048, None))
def test_rungs_and_the_rung_of_every_step_size_match_brute_force(case):
    budget, ladder = case
    lad = ladder if ladder is not None else reference_default_ladder(budget)
    expected = {s: reference_rung(s, budget, lad) for s in range(1, budget + 1)}
    rungs = rungs_for(budget, ladder)
    assert rungs == sorted(set(expected.values()))      # exactly the rungs some step size uses
    for s, r in expected.items():
        assert rung_for(s, rungs) == r, s
    assert rung_for(budget + 1, rungs) is None          # nothing past the budget


@given(st.integers(1, 100), st.integers(1, 100), st.one_of(st.none(), st.lists(st.integers(1, 120), min_size=1,
                                                                                  max_size=8, unique=True)))
def test_a_bigger_budget_never_loses_rungs_below_it(b1, b2, ladder):
    small, big = sorted((b1, b2))
    ladder = sorted(ladder) if ladder else ladder
    below = {r for r in rungs_for(small, ladder) if r < small}
    assert below <= set(rungs_for(big, ladder))


@settings(max_examples=50)
@given(st.integers(1, 5000))
@example(1)
@example(11)
@example(12)
@example(13)
@example(4096)
@example(6143)
@example(6144)
def test_default_ladder_matches_brute_force(limit):
    assert default_ladder(limit) == reference_default_ladder(limit)


def test_default_ladder_by_hand():
    assert default_ladder(100) == [1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96]
    assert default_ladder(7) == [1, 2, 4]


def test_default_ladder_rungs_are_ints():
    """Midpoints are 1.5 x 2^k computed in integers: a plan's rungs are step sizes, never 12.0."""
    for limit in (7, 12, 100, 6144):
        ladder = default_ladder(limit)
        assert all(type(r) is int for r in ladder), ladder
        assert all(type(r) is int for r in rungs_for(limit + 5))


# ------------------------------------------------------------------ why each walk has its rungs

def _why(gpu: str, overrides: dict | None = None) -> dict[str, str]:
    """choose_buckets' why per walk of the oracle model's one node (tests/oracle_model.py)."""
    from graphc.overrides import apply_overrides
    from graphc.passes.choose_buckets import choose_buckets
    from graphc.verify import verify_graph
    from graphc.targets import get_target
    from tests import oracle_model

    model = apply_overrides(oracle_model.declare(), overrides or {})
    return {w: text for (_, w), text in choose_buckets(verify_graph(model, get_target(gpu), 1)).why.items()}


DEFAULT = "the default ladder (1,2,4,8 then 2^k and 1.5x2^k)"
RUNGS = {"prefill": "tokens budget 24 on walk prefill: rungs of ladder [8] below it, then 24 itself",
         "mixed": "tokens budget 32 on walk mixed: rungs of ladder [8, 16] below it, then 32 itself",
         "decode": f"seqs budget 4 on walk decode: rungs of {DEFAULT} below it, then 4 itself"}
EAGER = "; not captured (the walk or target runs eagerly)"


def test_why_of_captured_walks():
    """On a GPU prefill and decode capture every rung; mixed is cut by its capture_limit of 16."""
    assert _why("h100") == {"prefill": RUNGS["prefill"], "decode": RUNGS["decode"],
                            "mixed": RUNGS["mixed"] + "; captured up to 16 (capture_limit), larger steps run eagerly"}


def test_why_of_walks_that_are_not_captured():
    """The cpu target captures nothing; on a GPU a walk declared capture=False neither (and its
    capture_limit no longer matters)."""
    assert _why("cpu") == {w: text + EAGER for w, text in RUNGS.items()}
    uncaptured = _why("h100", {"walks": {"mixed": {"capture": False}, "decode": {"capture": False}}})
    assert uncaptured == {"prefill": RUNGS["prefill"], "mixed": RUNGS["mixed"] + EAGER,
                          "decode": RUNGS["decode"] + EAGER}


def test_check_refuses_rungs_out_of_order_repeated_short_or_past_the_budget():
    """Buckets.check, the pass's own guard, on the oracle model's chosen rungs with one walk's
    rungs broken at a time (prefill's budget is 24)."""
    import dataclasses

    import pytest

    from graphc.passes.choose_buckets import choose_buckets
    from graphc.verify import verify_graph
    from graphc.targets import get_target
    from tests import oracle_model

    ir = verify_graph(oracle_model.declare(), get_target("h100"), 1)
    b = choose_buckets(ir)
    key = next(k for k in b.walk_rungs if k[1] == "prefill")
    assert b.walk_rungs[key] == [8, 24]
    b.check(ir)
    for bad, why in (([24, 8], "bad rungs"), ([8, 8, 24], "bad rungs"), ([8, 16], "bad rungs"),
                     ([8, 24, 32], "rungs past the budget")):
        broken = dataclasses.replace(b, walk_rungs=b.walk_rungs | {key: bad})
        with pytest.raises(AssertionError, match=why):
            broken.check(ir)
