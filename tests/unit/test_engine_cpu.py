"""The engine on a tiny CPU plan with a 12-page pool: preemption by recompute gives the tokens each request
gives alone (greedy), a step that fails ends only its own requests and frees their pages, aborts free pages,
and requests the plan cannot hold are refused with the numbers."""
import pytest

from graphc.cli import main
from graphc.errors import InvalidInput
from graphc.runtime.engine import Engine
from graphc.runtime.sampler import SamplingParams

SETS = ["resources.thinker_kv.pages=12", "resources.thinker_kv.max_seq_len=192", "resources.talker_kv.pages=4",
        "resources.talker_kv.max_seq_len=64"]


def small_plan(path):
    """The tiny Qwen3-Omni cpu plan with a 12-page thinker pool, written to path."""
    args = ["plan", "models/qwen3_omni.py", "--preset", "tiny", "--gpu", "cpu", "-o", str(path), "-q"]
    for s in SETS:
        args += ["--set", s]
    assert main(args) == 0
    return path


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = small_plan(tmp_path_factory.mktemp("small") / "small.plan")
    # a cold engine's page counts: repeated prompts would be served from the prefix cache (test_prefix_cache.py)
    return Engine(path, random_weights=True, prefix_cache=False)


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)


PROMPTS = [list(range(3, 3 + n)) for n in (40, 50, 30, 60)]     # 4 x (prompt + 60) rows: 2 to 3 times the pool


def run(engine, prompts, n):
    reqs = [engine.add(prompt_token_ids=p, params=greedy(n)) for p in prompts]
    while engine.has_work():
        engine.step()
    assert engine.scheduler.idle() and engine.scheduler.pool_full()
    return [r.output for r in reqs]


def test_preemption_by_recompute_gives_the_tokens_of_an_uncrowded_run(engine):
    alone = [run(engine, [p], 60)[0] for p in PROMPTS]
    before = engine.scheduler.stats.preemptions
    assert run(engine, PROMPTS, 60) == alone
    assert engine.scheduler.stats.preemptions > before          # the pool was too small for all four


def test_a_failing_step_ends_its_requests_only_and_frees_their_pages(engine, monkeypatch):
    real = engine.executor.run
    calls = {"n": 0}

    def flaky(plan, **kw):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("device fault (planted)")
        return real(plan, **kw)
    monkeypatch.setattr(engine.executor, "run", flaky)
    reqs = [engine.add(prompt_token_ids=p, params=greedy(8)) for p in PROMPTS[:2]]
    released = set()
    while engine.has_work():
        events = engine.step()
        for r in reqs:                         # a failed request is released by the very step that failed
            if r.finish_reason == "error" and r.id not in released:
                assert not r.pages and r not in engine.scheduler.running
                assert any(e.request is r and e.finished for e in events)
                released.add(r.id)
    assert engine.scheduler.pool_full() and engine.scheduler.idle()
    failed = [r for r in reqs if r.finish_reason == "error"]
    assert failed and all("device fault (planted)" in r.error for r in failed)
    assert all(r.finish_reason == "length" for r in reqs if r not in failed)


def test_aborts_free_pages_whether_waiting_or_running(engine, leak_oracle):
    leak_oracle.watch(engine)
    reqs = [engine.add(prompt_token_ids=p, params=greedy(50)) for p in PROMPTS]
    engine.step()
    engine.step()
    assert any(r.pages for r in reqs) and engine.scheduler.waiting
    for r in reqs:
        engine.abort(r.id)
    assert engine.scheduler.idle() and engine.scheduler.pool_full() and not engine.has_work()
    assert all(r.finish_reason == "abort" for r in reqs)


def test_what_the_plan_cannot_hold_is_refused_with_the_numbers(engine):
    with pytest.raises(InvalidInput, match=r"asks for 200 tokens \(150 prompt \+ 50 to generate\); the plan allows 192"):
        engine.add(prompt_token_ids=[5] * 150, params=greedy(50))
    with pytest.raises(InvalidInput, match="outside the vocabulary"):
        engine.add(prompt_token_ids=[10**6], params=greedy(5))
    with pytest.raises(InvalidInput, match="exactly one of prompt_token_ids, messages and prompt"):
        engine.add(params=greedy(5))
    assert engine.scheduler.idle() and engine.scheduler.pool_full()
