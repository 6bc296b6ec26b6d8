"""The sampler against HF's logits processors (the same rule written independently), OpenAI's
penalty formula looped by hand, and the distribution it draws from counted.
"""
from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError
from transformers.generation.logits_process import (MinPLogitsWarper, RepetitionPenaltyLogitsProcessor,
                                                    TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

from graphc.runtime.sampler import Sampler, SamplingParams, new_generator, penalise, warp

V = 50


def hf_process(logits: torch.Tensor, p: SamplingParams, history: list[int]) -> torch.Tensor:
    """One row through HF's processors in generate's order (no presence/frequency: HF has none)."""
    x = logits[None].clone()
    ids = torch.tensor([history], dtype=torch.long)
    if p.repetition_penalty != 1.0 and history:
        x = RepetitionPenaltyLogitsProcessor(p.repetition_penalty)(ids, x)
    if p.greedy:
        return x[0]
    x = TemperatureLogitsWarper(p.temperature)(ids, x)
    if p.top_k:
        x = TopKLogitsWarper(p.top_k)(ids, x)
    if p.top_p < 1.0:
        x = TopPLogitsWarper(p.top_p)(ids, x)
    if p.min_p > 0:
        x = MinPLogitsWarper(p.min_p)(ids, x)
    return x[0]


ROWS = [
    SamplingParams(temperature=0.7, top_k=5),
    SamplingParams(temperature=1.3, top_p=0.8),
    SamplingParams(temperature=0.9, min_p=0.2, repetition_penalty=1.3),
    SamplingParams(temperature=0.0, repetition_penalty=2.0),
    SamplingParams(temperature=1.0, top_k=10, top_p=0.6, min_p=0.05, repetition_penalty=0.8),
    SamplingParams(),
    SamplingParams(top_k=V + 7),                       # larger than the vocabulary: no cut
]


def test_penalties_and_warpers_match_hf_row_by_row():
    torch.manual_seed(0)
    logits = torch.randn(len(ROWS), V) * 3
    prompts = [[1, 2, 3], [4], [], [5, 5, 6], [7, 8], [9], []]
    outputs = [[10], [], [11, 1, 11], [6], [12, 13], [], [0]]
    got = warp(penalise(logits, ROWS, prompts, outputs), ROWS)
    for i, p in enumerate(ROWS):
        want = hf_process(logits[i], p, prompts[i] + outputs[i])
        assert torch.equal(torch.isinf(got[i]), torch.isinf(want)), i
        fin = ~torch.isinf(want)
        torch.testing.assert_close(got[i][fin], want[fin], rtol=1e-6, atol=1e-6)


def test_presence_and_frequency_by_openai_formula():
    torch.manual_seed(1)
    logits = torch.randn(2, V)
    params = [SamplingParams(presence_penalty=0.5, frequency_penalty=0.25),
              SamplingParams(presence_penalty=-1.0, frequency_penalty=1.5)]
    outputs = [[3, 3, 3, 7], [7, 8]]
    got = penalise(logits, params, [[3, 9], [1]], outputs)
    want = logits.clone()
    for i, (p, out) in enumerate(zip(params, outputs)):
        for t in range(V):
            c = out.count(t)          # the prompt does not count
            want[i, t] -= c * p.frequency_penalty + (c > 0) * p.presence_penalty
    torch.testing.assert_close(got, want)


def test_greedy_is_the_argmax_of_the_penalised_logits():
    logits = torch.tensor([[1.0, 3.0, 2.9, -1.0], [0.5, -0.2, -0.1, 0.4]])
    params = [SamplingParams(temperature=0, repetition_penalty=2.0), SamplingParams(temperature=0)]
    # row 0: token 1 was seen, 3.0 / 2 = 1.5 < 2.9: token 2 wins; row 1: no penalty, token 0
    out = Sampler()(logits, params, [[1], []], [[], []], [None, None])
    assert out.tokens.tolist() == [2, 0]


def test_draws_follow_the_warped_distribution():
    # four tokens with probabilities 0.4, 0.3, 0.2, 0.1; top_k=3 leaves 4/9, 3/9, 2/9 and never token 3
    logits = torch.log(torch.tensor([0.4, 0.3, 0.2, 0.1]))
    n = 20000
    params = [SamplingParams(top_k=3)] * n
    out = Sampler(seed=3)(logits.expand(n, 4).clone(), params, [[]] * n, [[]] * n, [None] * n)
    freq = torch.bincount(out.tokens, minlength=4).double() / n
    want = torch.tensor([4 / 9, 3 / 9, 2 / 9, 0.0], dtype=torch.float64)
    assert freq[3] == 0
    assert torch.all((freq - want).abs() < 4 * torch.sqrt(want * (1 - want) / n) + 1e-12), freq


def test_a_seeded_request_draws_the_same_alone_and_in_a_batch():
    torch.manual_seed(2)
    steps = [torch.randn(6, V) for _ in range(5)]
    mine = SamplingParams(temperature=0.8, top_p=0.9, seed=1234)
    others = [SamplingParams(temperature=1.2), SamplingParams(temperature=0), SamplingParams(seed=7, top_k=4),
              SamplingParams(min_p=0.1), SamplingParams(temperature=0.5, seed=99)]

    def run(batch: bool) -> list[int]:
        sampler = Sampler(seed=5 if batch else 6)
        gens = {0: new_generator(1234), 3: new_generator(7), 5: new_generator(99)}
        toks = []
        for logits in steps:
            rows = [2] if not batch else list(range(6))
            params = [others[0], others[1], mine, others[2], others[3], others[4]]
            idx = {r: params[r] for r in rows}
            g = [gens[0] if r == 2 else (gens.get(r) if r in (3, 5) else None) for r in rows]
            out = sampler(logits[rows], list(idx.values()), [[]] * len(rows), [[]] * len(rows), g)
            toks.append(out.tokens[rows.index(2)].item())
        return toks

    alone, batched = run(False), run(True)
    assert alone == batched
    assert len(set(alone)) > 1          # it really samples


def test_logprobs_are_the_models_own():
    # probabilities 1/2, 1/4, 1/8, 1/8 whatever the temperature or penalty asked
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.125, 0.125], [0.5, 0.25, 0.125, 0.125]]))
    params = [SamplingParams(temperature=0, logprobs=True, top_logprobs=2, repetition_penalty=3.0),
              SamplingParams(temperature=0)]
    out = Sampler()(logits, params, [[0], []], [[], []], [None, None])
    # row 0: token 0 is penalised to log(0.5) x 3 < log(0.25): token 1 is chosen, its logprob log(1/4)
    assert out.tokens.tolist() == [1, 0]
    assert out.logprobs[0].item() == pytest.approx(math.log(0.25))
    assert math.isnan(out.logprobs[1].item())
    assert out.top_ids[0].tolist() == [0, 1]
    assert out.top_logprobs[0].tolist() == pytest.approx([math.log(0.5), math.log(0.25)])


@pytest.mark.parametrize("bad, why", [
    ({"temperature": -0.1}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"min_p": 1.5}, "min_p"),
    ({"top_k": -1}, "top_k"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": -3}, "frequency_penalty"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
    ({"top_logprobs": 3}, "top_logprobs=3 needs logprobs=true"),
    ({"stop": [""]}, "a stop string is empty"),
    ({"stop_token_ids": [-1]}, "negative id"),
    ({"temprature": 0.5}, "did you mean 'temperature'"),
])
def test_bad_params_are_refused_with_the_field(bad, why):
    with pytest.raises(ValidationError, match=why):
        SamplingParams(**bad)


def test_a_batch_of_the_wrong_size_is_refused():
    with pytest.raises(ValueError, match=r"logits \[2, 4\] for 1 params"):
        Sampler()(torch.zeros(2, 4), [SamplingParams()], [[]], [[]], [None])


def test_top_p_keeps_the_smallest_set_that_reaches_it():
    # probabilities 1/2, 1/4, 1/8, 1/8 (exact in binary): top_p 0.75 is reached by the first two
    # exactly, so the two 1/8 tokens go; 0.76 needs a third (either 1/8: HF keeps the later one)
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.125, 0.125]] * 2))
    got = warp(logits, [SamplingParams(top_p=0.75), SamplingParams(top_p=0.76)])
    assert torch.isinf(got).tolist() == [[False, False, True, True], [False, False, False, True]] or \
        torch.isinf(got).tolist() == [[False, False, True, True], [False, False, True, False]]


def test_a_tiny_top_p_keeps_the_top_token():
    # 1 - 1e-9 is 1.0 in fp32: every cumulative sum is at or under it, yet the top token stays
    torch.manual_seed(4)
    logits = torch.randn(8, V)
    out = Sampler()(logits, [SamplingParams(top_p=1e-9)] * 8, [[]] * 8, [[]] * 8, [None] * 8)
    assert out.tokens.tolist() == logits.argmax(dim=-1).tolist()


def test_min_p_keeps_tokens_at_exactly_its_share_of_the_top():
    # 1/2, 1/4, 1/8, 1/8 with min_p 0.5: the threshold is 1/4, and 1/4 itself stays
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.125, 0.125]]))
    assert torch.isinf(warp(logits, [SamplingParams(min_p=0.5)])).tolist() == [[False, False, True, True]]


def test_logit_bias_matches_hf_sequence_bias_and_is_clamped_to_100():
    """logit_bias (OpenAI's: token id -> added to its logit, within +-100) against HF's SequenceBiasLogitsProcessor
    with one-token sequences; a greedy row takes the token its bias lifts; ids and values are checked."""
    from transformers.generation.logits_process import SequenceBiasLogitsProcessor

    from graphc.runtime.sampler import bias

    torch.manual_seed(0)
    logits = torch.randn(3, V)
    given = [{"7": 2.5, "11": -1.0}, {}, {"3": 500.0, "4": -1e9}]
    rows = [SamplingParams(temperature=0, logit_bias=b) for b in given]
    assert rows[2].logit_bias == ((3, 100.0), (4, -100.0))                  # clamped, by hand
    ours = bias(logits, rows)
    for i, p in enumerate(rows):
        hf = SequenceBiasLogitsProcessor({(t,): b for t, b in p.logit_bias}) if p.logit_bias else None
        want = hf(torch.zeros(1, 1, dtype=torch.long), logits[i:i + 1].clone())[0] if hf else logits[i]
        assert torch.allclose(ours[i], want)
    picked = Sampler()(logits, rows, [[]] * 3, [[]] * 3, [None] * 3).tokens
    assert picked[2].item() == 3 and picked[1].item() == logits[1].argmax().item()
    for bad in ({"-1": 1.0}, {"x": 1.0}, {"1": float("nan")}):
        with pytest.raises(ValidationError, match="logit_bias"):
            SamplingParams(logit_bias=bad)
