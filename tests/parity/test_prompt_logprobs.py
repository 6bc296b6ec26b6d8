"""Prompt logprobs (SamplingParams.prompt_logprobs) against HF: a tiny Qwen3-Omni thinker written by transformers,
its weights re-drawn, served by graphc.Engine; every prompt token's logprob, rank and top alternatives equal HF's
log-softmax of the same prompt (fp32), the first token None. The prompts cross many steps (a scoring request's
chunk holds no more rows than the step has sequences), share steps with requests that only sample, and one was
prefilled before, so that a prefix cache that served its pages would leave rows unscored."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from graphc.runtime.engine import Engine
from graphc.runtime.sampler import SamplingParams
from tests.unit.loopback import tiny_omni_hf


@pytest.fixture(scope="module")
def omni(tmp_path_factory):
    d = tmp_path_factory.mktemp("plp")
    hf, _ = tiny_omni_hf(d, seed=5)
    return hf, Engine(d / "p.plan", checkpoint=d / "ckpt")


def hf_scores(hf, ids: list[int]) -> torch.Tensor:
    """HF's log-softmax at every row of the prompt: [T, vocab]."""
    with torch.no_grad():
        logits = hf.thinker(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long)).logits
    return logits[0].float().log_softmax(-1)


def check(entries: list, ids: list[int], lp: torch.Tensor, top: int) -> None:
    assert len(entries) == len(ids) and entries[0] is None
    for i in range(1, len(ids)):
        e, row = entries[i], lp[i - 1]
        assert e["token_id"] == ids[i]
        assert e["logprob"] == pytest.approx(row[ids[i]].item(), abs=2e-5)
        assert e["rank"] == int((row > row[ids[i]]).sum()) + 1
        want = row.topk(top)
        assert [t for t, _ in e["top"]] == want.indices.tolist()
        assert [v for _, v in e["top"]] == pytest.approx(want.values.tolist(), abs=2e-5)


def run(engine, items: list[tuple[list[int], SamplingParams]]):
    reqs = [engine.add(prompt_token_ids=ids, params=p) for ids, p in items]
    while engine.has_work():
        engine.step()
    return reqs


def test_prompt_logprobs_equal_hf_across_steps_beside_sampling_requests(omni):
    hf, engine = omni
    rng = np.random.default_rng(0)
    prompts = [rng.integers(10, 300, n).tolist() for n in (37, 9, 23)]
    plain = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    run(engine, [(prompts[0], plain)])                      # its pages now cached: scoring must not take them
    alone = run(engine, [(prompts[1], plain)])[0].output
    scoring = [SamplingParams(temperature=0, max_tokens=3, ignore_eos=True, prompt_logprobs=k, logprobs=True)
               for k in (2, 0)]
    reqs = run(engine, [(prompts[0], scoring[0]), (prompts[1], plain), (prompts[2], scoring[1])])
    for req, ids, k in ((reqs[0], prompts[0], 2), (reqs[2], prompts[2], 0)):
        lp = hf_scores(hf, ids + req.output)
        check(req.prompt_logprobs, ids, lp, k)
        # the sampled tokens and their logprobs are those of the same rows
        assert [e["logprob"] for e in req.logprobs] == pytest.approx(
            [lp[len(ids) - 1 + j, t].item() for j, t in enumerate(req.output)], abs=2e-5)
    assert reqs[1].output == alone and reqs[1].prompt_logprobs is None
    assert engine.scheduler.idle() and engine.scheduler.pool_full()


def test_a_scoring_chunk_holds_no_more_rows_than_the_step_has_sequences(omni, monkeypatch):
    _, engine = omni
    seqs = {w.name: w.budget.seqs for w in engine.model.walks}
    steps, schedule = [], engine.scheduler.schedule

    def spy():
        plan = schedule()
        if plan is not None:
            steps.append(plan)
        return plan
    monkeypatch.setattr(engine.scheduler, "schedule", spy)
    req = run(engine, [(list(range(10, 40)), SamplingParams(max_tokens=2, prompt_logprobs=1, temperature=0))])[0]
    mine = [(p, c) for p in steps for c in p.chunks if c.req is req and c.end - c.start > 1]
    assert len(mine) > 1 and all(c.end - c.start <= seqs[p.walk] for p, c in mine)
    assert [r for _, c in mine if c.score for r in range(*c.score)] == list(range(29))   # each once; row 29 samples
    assert all(p.rungs.get(engine.llm) is None for p, c in mine if c.score)
    assert len(req.prompt_logprobs) == 30
