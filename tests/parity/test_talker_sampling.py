"""The talker's in-step sampler (models/components/talker.py's select) against HF's own logits processors
(transformers 5.24: RepetitionPenaltyLogitsProcessor, SuppressTokensLogitsProcessor, TemperatureLogitsWarper,
TopKLogitsWarper, TopPLogitsWarper, applied row by row in generate's order) followed by the same exponential
race on the same draws; top-p's threshold, HF's to the last bit; the distribution it draws from, counted; the
repetition penalty worked by hand; the defaults Qwen3-Omni's host declares, read back from HF's source; and
SpeechParams' ranges.
"""
from __future__ import annotations

import inspect

import pytest
import torch
from pydantic import ValidationError
from transformers import GenerationConfig
from transformers.generation.logits_process import (RepetitionPenaltyLogitsProcessor, SuppressTokensLogitsProcessor,
                                                    TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)
from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as hf_omni

from graphc.runtime.speech import SpeechParams
from graphc.serving import SpeechSampling
from models.components.speech_host import QwenOmniSpeech
from models.components.talker import SAMPLING, RowParams, log_draws, sampling_row, select

V, CODEBOOK, EOS = 96, 64, 80                      # the tiny preset's codec vocabulary, codebook and codec_eos
SUPPRESS = torch.tensor([i >= CODEBOOK and i != EOS for i in range(V)])


def hf_row(logits: torch.Tensor, t: float, k: int, p: float, rp: float = 1.0, seen: list[int] = (),
           suppress: torch.Tensor | None = None) -> torch.Tensor:
    """One row [V] through HF's processors, as generate builds them: the penalty when != 1, suppression,
    then (sampling only) temperature when != 1, top-k when > 0, top-p when < 1."""
    x = logits[None].float().clone()
    ids = torch.tensor([list(seen)], dtype=torch.long)
    if rp != 1.0:
        x = RepetitionPenaltyLogitsProcessor(rp)(ids, x)
    if suppress is not None:
        x = SuppressTokensLogitsProcessor(suppress.nonzero().flatten().tolist())(ids, x)
    if t == 0:
        return x[0]
    if t != 1.0:
        x = TemperatureLogitsWarper(t)(ids, x)
    if k:
        x = TopKLogitsWarper(k)(ids, x)
    if p < 1.0:
        x = TopPLogitsWarper(p)(ids, x)
    return x[0]


def reference(x: torch.Tensor, t: float, noise: torch.Tensor) -> int:
    """Greedy: the argmax; sampling: the race argmax(p / E) as argmax(x - log E)."""
    return int(x.argmax()) if t == 0 else int((x - noise.log()).argmax())


def pick(gen: torch.Generator, choices):
    return choices[int(torch.randint(len(choices), (1,), generator=gen))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_code0_and_residual_selection_equal_hf_processors_then_the_race(dtype):
    """4000 rows of mixed params (greedy among them), the penalty over random seen sets: the node's codes equal
    HF's processors row by row, then the race on the same draws. Code 0 (4 columns, seen, suppression) and a
    residual code (3 columns, codebook wide, logits in the model's dtype as the code predictor's heads give;
    bf16 rows hold distinct values, since bf16 ties are common and HF's unstable sort orders them its own way)."""
    gen = torch.Generator().manual_seed(0)
    n = 4000
    for code0 in (True, False):
        vocab = V if code0 else CODEBOOK
        if dtype == torch.float32:
            logits = torch.randn(n, vocab, generator=gen) * 3
        else:       # distinct values: among tied logits at a top-p cut, the one kept is the sort's choice (HF's too)
            order = torch.rand(n, vocab, generator=gen).argsort(dim=-1)
            logits = torch.linspace(-8, 8, vocab)[order].to(dtype)
        noise = torch.empty(n, vocab).exponential_(generator=gen)
        seen = torch.rand(n, vocab, generator=gen) < 0.1
        rows, want = [], []
        for i in range(n):
            t = pick(gen, [0.0, 0.5, 0.9, 1.0, 1.7])
            k = pick(gen, [0, 1, 5, 50, 200])
            p = pick(gen, [1.0, 0.95, 0.8, 0.3, 0.05])
            rp = pick(gen, [1.0, 1.05, 1.3, 0.8]) if code0 else 1.0
            row = sampling_row(t, k, p, rp, 1.0, 0, 1.0)
            rows.append(row[:4] if code0 else [row[0], row[1], row[2]])
            x = hf_row(logits[i], t, k, p, rp, seen[i].nonzero().flatten().tolist() if code0 else (),
                       SUPPRESS if code0 else None)
            want.append(reference(x, t, noise[i]))
        params = torch.tensor(rows, dtype=torch.float32)
        got = select(logits, RowParams(params, vocab), log_draws(noise), seen if code0 else None,
                     SUPPRESS if code0 else None)
        assert got.tolist() == want
        greedy = params[:, 0] == 0
        assert 0.1 < greedy.float().mean() < 0.3 and (got[~greedy] != logits[~greedy].float().argmax(-1)).any()
        if code0:
            assert not SUPPRESS[got].any()


def test_zero_rows_are_greedy_and_a_zero_draw_never_picks_a_dropped_id():
    """A captured rung's padding rows hold zeros: greedy (the argmax after suppression), whatever the draws.
    A CPU draw can be 0: it must not make a suppressed or filtered id win."""
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(8, V, generator=gen)
    zero = torch.zeros(8, len(SAMPLING))
    noise = torch.zeros(8, V)
    got = select(logits, RowParams(zero[:, :4], V), log_draws(noise), torch.zeros(8, V, dtype=torch.bool), SUPPRESS)
    assert got.tolist() == logits.masked_fill(SUPPRESS, float("-inf")).argmax(-1).tolist()
    # sampling rows, top_k 3: every dropped id (suppressed or below the top 3) draws E = 0, the kept ones E = 1
    params = torch.tensor([sampling_row(1.0, 3, 1.0, 1.0, 1.0, 0, 1.0)[:4]] * 8)
    top3 = logits.masked_fill(SUPPRESS, float("-inf")).topk(3, dim=-1).indices
    noise = torch.zeros(8, V).scatter(1, top3, 1.0)
    got = select(logits, RowParams(params, V), log_draws(noise), None, SUPPRESS)
    assert (got[:, None] == top3).any(dim=1).all()
    # no filter at all: only suppression drops ids, and they draw E = 0
    params = torch.tensor([sampling_row(1.0, 0, 1.0, 1.0, 1.0, 0, 1.0)[:4]] * 8)
    got = select(logits, RowParams(params, V), log_draws((~SUPPRESS).float().expand(8, V)), None, SUPPRESS)
    assert not SUPPRESS[got].any()


def test_top_p_threshold_is_hfs_to_the_last_bit():
    """Logits [log 0.25, 0] (fp32): the smaller id's probability is exactly fp32 0.2. HF compares the cumulative
    probability with 1 - top_p taken in double (0.19999999999999996, fp32 0.2): at top_p 0.8 the id is dropped
    (in fp32, 1 - 0.8 = 0.19999999 would keep it). A draw that favours it must not pick it."""
    logits = torch.tensor([[float(torch.tensor(0.25).log()), 0.0]])
    assert logits.softmax(-1)[0, 0] == torch.tensor(0.2)
    assert torch.isinf(TopPLogitsWarper(0.8)(None, logits.clone())[0, 0])
    params = torch.tensor([sampling_row(1.0, 0, 0.8, 1.0, 1.0, 0, 1.0)[:3]])
    assert int(select(logits, RowParams(params, 2), log_draws(torch.tensor([[1e-6, 1.0]])))[0]) == 1


def test_draws_follow_the_processed_distribution():
    """200,000 draws of one row of 6 ids, code 0 (penalty over ids {0, 3}, id 5 suppressed, temperature 0.7,
    top_k 4, top_p 0.9) and a residual code (temperature 1.0, top_k 50, top_p 0.8: the defaults): each id's
    frequency is the probability of HF's processed logits within 5 sigma (sigma = sqrt(p(1-p)/n) <= 0.0012);
    ids the processors drop are never drawn. The processed distribution is far from the raw softmax."""
    gen = torch.Generator().manual_seed(2)
    n, v = 200_000, 6
    logits = torch.tensor([1.2, 0.9, 0.1, 1.0, -0.4, 2.5])
    suppress = torch.tensor([False] * 5 + [True])
    seen = torch.tensor([True, False, False, True, False, False])
    for t, k, p, rp, sup, sn in [(0.7, 4, 0.9, 1.3, suppress, seen), (1.0, 50, 0.8, 1.0, None, None)]:
        row = sampling_row(t, k, p, rp, 1.0, 0, 1.0)[:4 if sn is not None else 3]
        noise = torch.empty(n, v).exponential_(generator=gen)
        got = select(logits.expand(n, v), RowParams(torch.tensor([row] * n), v), log_draws(noise),
                     None if sn is None else sn.expand(n, v), sup)
        freq = torch.bincount(got, minlength=v).double() / n
        want = hf_row(logits, t, k, p, rp, sn.nonzero().flatten().tolist() if sn is not None else (),
                      sup).double().softmax(-1)
        sigma = (want * (1 - want) / n).sqrt()
        assert ((freq - want).abs() <= 5 * sigma + 1e-12).all(), (freq, want)
        assert (freq[want == 0] == 0).all() and (want == 0).sum() >= 2
        assert (want - logits.double().softmax(-1)).abs().max() > 0.1


def test_repetition_penalty_by_hand():
    """logits [2.0, 1.5, -1.0, 0.2], id 0 seen, penalty 2: id 0's 2.0 is divided to 1.0, so greedy picks id 1
    (id 0 unpenalised). Negative logits are multiplied: [-0.5, -0.8] with id 0 seen becomes [-1.0, -0.8].
    Sampling at temperature 1, the race x - log E on the penalised [1.0, 1.5, -1.0, 0.2]: E = [1, 1, 1, 1]
    gives id 1 (id 0 without the penalty); E = [0.5, 1, 1, 1] id 0 (1.0 + log 2 = 1.693 > 1.5); E = [0.65, 1,
    1, 1] id 1 (1.0 + 0.431 < 1.5)."""
    def one(logits, seen_ids, rp, t=0.0, e=None):
        x = torch.tensor([logits])
        seen = torch.zeros(1, len(logits), dtype=torch.bool)
        seen[0, seen_ids] = True
        params = torch.tensor([sampling_row(t, 0, 1.0, rp, 1.0, 0, 1.0)[:4]])
        noise = torch.tensor([e or [1.0] * len(logits)])
        return int(select(x, RowParams(params, len(logits)), log_draws(noise), seen)[0])

    assert one([2.0, 1.5, -1.0, 0.2], [0], 2.0) == 1
    assert one([2.0, 1.5, -1.0, 0.2], [0], 1.0) == 0
    assert one([2.0, 1.5, -1.0, 0.2], [], 2.0) == 0                   # nothing seen: no penalty
    assert one([-0.5, -0.8], [0], 2.0) == 1
    assert one([-0.5, -0.8], [1], 2.0) == 0
    assert one([2.0, 1.5, -1.0, 0.2], [0], 2.0, t=1.0) == 1
    assert one([2.0, 1.5, -1.0, 0.2], [0], 1.0, t=1.0) == 0
    assert one([2.0, 1.5, -1.0, 0.2], [0], 2.0, t=1.0, e=[0.5, 1.0, 1.0, 1.0]) == 0
    assert one([2.0, 1.5, -1.0, 0.2], [0], 2.0, t=1.0, e=[0.65, 1.0, 1.0, 1.0]) == 1


def test_qwen3_omni_defaults_are_hfs():
    """The host's defaults, read back from HF: generate's talker_* arguments; what the talker passes its code
    predictor (top_k 50, top_p 0.8, do_sample mirrored); the code predictor's temperature, which no config
    sets: GenerationConfig's global default."""
    sig = inspect.signature(hf_omni.Qwen3OmniMoeForConditionalGeneration.generate).parameters
    hf = {k: sig[f"talker_{k}"].default for k in ("temperature", "top_k", "top_p", "repetition_penalty")}
    assert sig["talker_do_sample"].default is True
    assert QwenOmniSpeech.sampling == SpeechSampling(**hf) == SpeechSampling(temperature=0.9, top_k=50, top_p=1.0,
                                                                          repetition_penalty=1.05)
    src = inspect.getsource(hf_omni.Qwen3OmniMoeTalkerForConditionalGeneration.prepare_inputs_for_generation)
    assert "code_predictor_kwargs.update(top_k=50, top_p=0.8)" in src
    cp = GenerationConfig.from_model_config(hf_omni.Qwen3OmniMoeTalkerCodePredictorConfig())
    assert cp.temperature is None and GenerationConfig()._get_default_generation_params()["temperature"] == 1.0
    assert QwenOmniSpeech.residual_sampling == dict(residual_temperature=1.0, residual_top_k=50, residual_top_p=0.8)
    # a greedy request is greedy for every code (HF mirrors do_sample onto the code predictor)
    row = sampling_row(0.0, 50, 1.0, 1.05, **QwenOmniSpeech.residual_sampling)
    assert row[0] == 0 and row[SAMPLING.index("residual_temperature")] == 0


def test_speech_params_take_the_models_defaults_where_unset():
    d = QwenOmniSpeech.sampling
    assert SpeechParams().sampling(d) == d
    assert SpeechParams(temperature=0).sampling(d) == SpeechSampling(temperature=0, top_k=50, top_p=1.0,
                                                                     repetition_penalty=1.05)
    assert SpeechParams(temperature=0).sampling(d).greedy and SpeechParams(top_p=0.5, seed=3).sampling(d).top_p == 0.5


@pytest.mark.parametrize("bad, why", [
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": float("nan")}, "temperature"),
    ({"temperature": float("inf")}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": -1}, "top_k"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"seed": -1}, "seed"),
    ({"temprature": 0.5}, "did you mean 'temperature'"),
])
def test_bad_speech_params_are_refused_with_the_field(bad, why):
    with pytest.raises(ValidationError, match=why):
        SpeechParams(**bad)
