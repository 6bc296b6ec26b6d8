"""The LLM's steps overlap the host's work (graphc/runtime/flight.py), on a tiny CPU plan with a 12-page pool:
the next step's inputs are built before the step in flight's tokens are read back; and the tokens, finish
reasons and logprobs of a mixed load equal an engine's that reads every step before the next (each request
stops on its own: a stop token read while its next row is in flight, max_tokens, penalties that keep a
step from staying in flight, seeded sampling, logprobs, preemption in a pool too small for all). Aborting a
request whose token is in flight leaves the others' tokens as they were and the pool whole; the prefix cache
registers only pages whose tokens were read (a repeat of a prompt that stopped in flight answers the same)."""
import pytest

from graphc.runtime.engine import Engine
from graphc.runtime.flight import Flight
from graphc.runtime.sampler import SamplingParams
from tests.unit.test_engine_cpu import small_plan

PROMPTS = [list(range(3, 3 + n)) for n in (40, 50, 30, 60)]


@pytest.fixture(scope="module")
def plan_path(tmp_path_factory):
    return small_plan(tmp_path_factory.mktemp("overlap") / "small.plan")


@pytest.fixture(scope="module")
def engines(plan_path):
    return {o: Engine(plan_path, random_weights=True, prefix_cache=False, overlap=o) for o in (True, False)}


def greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, **kw)


def first_new(out: list[int], at_least: int) -> int:
    """The first index from at_least whose token is not among the tokens before it (a stop token's index)."""
    return next(k for k in range(at_least, len(out)) if out[k] not in out[:k])


def drain(engine, items) -> list:
    reqs = [engine.add(prompt_token_ids=p, params=sp) for p, sp in items]
    while engine.has_work():
        engine.step()
    assert engine.scheduler.idle() and engine.scheduler.pool_full() and engine.inflight is None
    return reqs


def test_the_next_step_is_built_before_the_tokens_in_flight_are_read(engines, monkeypatch):
    engine, log = engines[True], []
    real_run, real_read = engine.executor.run, Flight.read

    def run(plan, **kw):
        log.append(("run", [c.req.id for c in plan.chunks]))
        return real_run(plan, **kw)

    def read(flight):
        log.append(("read", [r.id for r, _ in flight.rows]))
        return real_read(flight)
    monkeypatch.setattr(engine.executor, "run", run)
    monkeypatch.setattr(Flight, "read", read)
    drain(engine, [(PROMPTS[0], greedy(6))])
    kinds = [k for k, _ in log]
    # prefill samples the first token; each decode step launches before the step before it is read
    assert kinds == ["run", "run", "read", "run", "read", "run", "read", "run", "read", "run", "read", "read"]


def test_a_mixed_load_gives_what_reading_every_step_first_gives(engines):
    solo = drain(engines[False], [(PROMPTS[0], greedy(40))])[0].output
    k = first_new(solo, 3)
    stop = solo[k]                                 # stops at its first occurrence, its next row in flight
    load = [(PROMPTS[0], greedy(40, stop_token_ids=(stop,))), (PROMPTS[1], greedy(25, logprobs=True, top_logprobs=3)),
            (PROMPTS[2], SamplingParams(temperature=0.8, seed=3, max_tokens=30, ignore_eos=True)),
            (PROMPTS[3], greedy(35, repetition_penalty=1.3)), (PROMPTS[0][:20], greedy(33))]
    got = {o: drain(engines[o], load) for o in (True, False)}
    assert engines[True].scheduler.stats.preemptions > 0          # the pool holds fewer than all five
    for a, b in zip(got[True], got[False]):
        assert (a.output, a.finish_reason) == (b.output, b.finish_reason), a.id
        assert all(t >= 0 for t in a.output)
    assert got[True][0].output == solo[:k + 1] and got[True][0].finish_reason == "stop"
    assert [e["token_id"] for e in got[True][1].logprobs] == got[True][1].output
    for x, y in zip(got[True][1].logprobs, got[False][1].logprobs):
        assert x["top"] == y["top"] and x["logprob"] == pytest.approx(y["logprob"], abs=1e-5)


def test_an_abort_while_its_token_is_in_flight_leaves_the_others_as_they_were(engines, leak_oracle):
    engine = leak_oracle.watch(engines[True])
    alone = drain(engines[False], [(PROMPTS[1], greedy(20))])[0].output
    a, b = (engine.add(prompt_token_ids=p, params=greedy(20)) for p in (PROMPTS[0], PROMPTS[1]))
    while not (engine.inflight is not None and any(r is a for r, _ in engine.inflight.rows) and len(a.output) > 3):
        engine.step()
    engine.abort(a.id)
    assert a.finish_reason == "abort" and all(t >= 0 for t in a.output)
    while engine.has_work():
        engine.step()
    assert b.output == alone and engine.scheduler.pool_full()


def test_the_prefix_cache_keeps_only_tokens_read_back(plan_path):
    engine = Engine(plan_path, random_weights=True, prefix_cache=True, overlap=True)
    first = drain(engine, [(PROMPTS[3], greedy(40))])[0].output
    k = first_new(first, 15)
    stop = first[k]
    cut = drain(engine, [(PROMPTS[3], greedy(40, stop_token_ids=(stop,)))])[0]
    again = drain(engine, [(PROMPTS[3] + cut.output, greedy(12))])[0]
    cold = drain(Engine(plan_path, random_weights=True, prefix_cache=False, overlap=False),
                 [(PROMPTS[3] + cut.output, greedy(12))])[0]
    assert cut.output == first[:k + 1] and engine.scheduler.shared.hit_rows > 0
    assert again.output == cold.output


def test_a_request_naming_no_max_tokens_gets_the_servers_default_and_never_past_the_context(plan_path):
    """--default-max-tokens (issue 38): 3 where the request names none; its own max_tokens where it names one;
    and no more than the context leaves after a prompt that nearly fills it (the plan's max_seq_len)."""
    from graphc.errors import InvalidInput

    engine = Engine(plan_path, random_weights=True, default_max_tokens=3)
    most = engine.executor.kv_spec.max_seq_len
    free = SamplingParams(temperature=0, ignore_eos=True)
    reqs = drain(engine, [(PROMPTS[0], free), (PROMPTS[1], greedy(5)), (list(range(3, most + 1)), free)])
    assert [len(engine.output(r).token_ids) for r in reqs] == [3, 5, 2]          # by hand: most - (most - 2)
    with pytest.raises(InvalidInput, match="default max_tokens 0"):
        Engine(plan_path, random_weights=True, default_max_tokens=0)


def test_a_token_read_back_comes_after_its_logprob(engines):
    """The server's thread sends the logprobs of the output tokens it sees (graphc/serve/completions.py): a
    token is written over its placeholder only once its logprob entry is there, else a stream can skip one."""
    engine = engines[True]
    req = engine.add(prompt_token_ids=PROMPTS[0], params=greedy(6, logprobs=True))
    seen = []

    class Watched(list):
        def __setitem__(self, i, v):
            if v >= 0:
                seen.append((i, len(req.logprobs)))
            super().__setitem__(i, v)
    req.output = Watched(req.output)
    while engine.has_work():
        engine.step()
    assert len(seen) == 6 and all(n > i for i, n in seen), seen
