"""Sampling: one batch of last-position logits to one token per request, each row by its own params.

A guided request's grammar mask first (graphc/runtime/grammar.py: the tokens its grammar refuses at -inf);
then each request's logit_bias; then HF generate's order: repetition penalty (over prompt and output),
presence and frequency penalties (over the output, OpenAI's formula), then temperature, top-k, top-p and
min-p. Temperature 0 is greedy: the argmax of the penalised logits. A request with a seed draws from its own generator,
so its tokens do not depend on what else is in the batch; the others share the engine's generator.
Drawing is an exponential race (argmax of p / E, E ~ Exp(1)), which samples p exactly.

Logprobs are of the model's own distribution (log-softmax of the logits before penalties and
temperature), as the OpenAI API reports them; a guided request's too, before its mask (so every one is
finite, and its top alternatives may be tokens its grammar refused).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from pydantic import Field, field_validator, model_validator

from graphc.runtime.grammar import Guide, Mask, apply_mask
from graphc.strict import Strict

MAX_TOP_LOGPROBS = 20
MAX_BIAS = 100.0          # logit_bias values beyond +-100 are clamped (OpenAI's range)


class SamplingParams(Strict):
    """One request's sampling parameters (OpenAI's names; top_k, min_p and repetition_penalty as
    vLLM and HF name them). Unknown keys and out-of-range values are refused."""

    max_tokens: int | None = Field(None, ge=1)      # None: up to what the plan allows
    temperature: float = Field(1.0, ge=0.0)          # 0: greedy
    top_k: int = Field(0, ge=0)                      # 0: every token
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    repetition_penalty: float = Field(1.0, gt=0.0)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    seed: int | None = Field(None, ge=0)
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: bool = False
    top_logprobs: int = Field(0, ge=0, le=MAX_TOP_LOGPROBS)
    # each prompt token's logprob (the first has none) and this many top alternatives; None: not asked
    prompt_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    # token id -> added to its logit, clamped to +-MAX_BIAS; given as a mapping, held as sorted (id, bias) pairs
    logit_bias: tuple[tuple[int, float], ...] = ()
    guide: Guide | None = None     # what the output must match (graphc/runtime/grammar.py): JSON, a regex, tools

    @field_validator("logit_bias", mode="before")
    @classmethod
    def _bias_pairs(cls, v: Any) -> Any:
        if isinstance(v, dict):
            try:
                pairs = sorted((int(t), float(b)) for t, b in v.items())
            except (TypeError, ValueError) as e:
                raise ValueError(f"logit_bias maps token ids to numbers: {e}") from e
            if any(t < 0 for t, _ in pairs) or any(b != b for _, b in pairs):
                raise ValueError(f"logit_bias {v!r:.80}: ids are 0 or more, biases numbers (not NaN)")
            return tuple((t, max(-MAX_BIAS, min(MAX_BIAS, b))) for t, b in pairs)
        return v

    @model_validator(mode="after")
    def _check(self) -> "SamplingParams":
        if self.top_logprobs and not self.logprobs:
            raise ValueError(f"top_logprobs={self.top_logprobs} needs logprobs=true")
        if any(not s for s in self.stop):
            raise ValueError("a stop string is empty")
        if any(t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids {list(self.stop_token_ids)} holds a negative id")
        return self

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class Sampled:
    tokens: torch.Tensor                 # [B] int64
    logprobs: torch.Tensor               # [B] fp32: each chosen token's logprob (NaN where not asked)
    top_ids: torch.Tensor                # [B, n] int64, n = the batch's largest top_logprobs
    top_logprobs: torch.Tensor           # [B, n] fp32, descending


def score(logits: torch.Tensor, targets: list[int], top: int) -> list[dict]:
    """Prompt logprobs: each row's log-softmax read at its target (the prompt's next token), as entries
    {token_id, logprob, rank (1: the most likely token), top: the `top` most likely (id, logprob) pairs}."""
    lp = logits.float().log_softmax(dim=-1)
    chosen = lp.gather(1, torch.tensor(targets, dtype=torch.int64, device=lp.device)[:, None])
    rank = (lp > chosen).sum(dim=-1) + 1
    tv, ti = lp.topk(top, dim=-1) if top else (lp.new_empty(len(targets), 0), rank.new_empty(len(targets), 0))
    return [{"token_id": t, "logprob": c, "rank": r, "top": list(zip(i, v))}
            for t, c, r, i, v in zip(targets, chosen[:, 0].tolist(), rank.tolist(), ti.tolist(), tv.tolist())]


def new_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def bias(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Each row's logit_bias added to its logits (the first processor, as OpenAI applies it)."""
    rows = [(i, t, b) for i, p in enumerate(params) for t, b in p.logit_bias]
    if not rows:
        return logits
    i, t, b = zip(*rows)
    idx = (on_device(list(i), torch.int64, logits.device), on_device(list(t), torch.int64, logits.device))
    return logits.index_put(idx, on_device(list(b), logits.dtype, logits.device), accumulate=True)


def needs_history(params: SamplingParams) -> bool:
    """Its sampling reads its tokens so far (the penalties): the host must hold them before its next step."""
    return params.repetition_penalty != 1.0 or bool(params.presence_penalty or params.frequency_penalty)


def on_device(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A small tensor on the device without a host sync (an async copy from the host)."""
    return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)


def _column(values: list[float], like: torch.Tensor) -> torch.Tensor:
    return on_device(values, like.dtype, like.device)[:, None]


def penalise(logits: torch.Tensor, params: list[SamplingParams], prompts: list[list[int]],
             outputs: list[list[int]]) -> torch.Tensor:
    """Repetition penalty over each row's prompt and output tokens (a positive logit divided by it, a
    negative one multiplied), then logit -= frequency x count + presence x (count > 0) over its output."""
    b, v = logits.shape
    out = logits.clone()
    if any(p.repetition_penalty != 1.0 for p in params):
        seen = torch.zeros(b, v, dtype=torch.bool, device=logits.device)
        for i, (pr, ou) in enumerate(zip(prompts, outputs, strict=True)):
            ids = [t for t in (*pr, *ou) if 0 <= t < v]
            if ids:
                seen[i, torch.tensor(ids, device=logits.device)] = True
        rp = _column([p.repetition_penalty for p in params], logits)
        out = torch.where(seen, torch.where(out < 0, out * rp, out / rp), out)
    if any(p.presence_penalty or p.frequency_penalty for p in params):
        counts = torch.zeros(b, v, dtype=logits.dtype, device=logits.device)
        for i, ou in enumerate(outputs):
            if ou:
                counts[i].index_add_(0, torch.tensor(ou, device=logits.device),
                                     torch.ones(len(ou), dtype=logits.dtype, device=logits.device))
        out = out - _column([p.frequency_penalty for p in params], logits) * counts \
            - _column([p.presence_penalty for p in params], logits) * (counts > 0).to(logits.dtype)
    return out


def warp(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Temperature, then top-k (ties at the k-th value kept), top-p (the smallest set of top tokens
    whose probability reaches top_p, at least one) and min-p (tokens under min_p x the top token's
    probability dropped); what is dropped becomes -inf. A greedy row is divided by nothing, and the
    filters never drop its largest logit, so its argmax stands."""
    out = logits / _column([p.temperature if not p.greedy else 1.0 for p in params], logits)
    neg = float("-inf")
    ks = [p.top_k if 0 < p.top_k < out.shape[1] else 0 for p in params]
    if any(ks):
        kth = torch.stack([torch.topk(row, k).values[-1] if k else torch.full((), neg, device=row.device)
                           for row, k in zip(out, ks)])[:, None]
        out = out.masked_fill(out < kth, neg)
    if any(p.top_p < 1.0 for p in params):
        sorted_logits, order = torch.sort(out, dim=-1)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop = cum <= 1 - _column([p.top_p for p in params], out)
        drop[:, -1] = False
        out = out.masked_fill(drop.scatter(1, order, drop), neg)
    if any(p.min_p > 0 for p in params):
        probs = out.softmax(dim=-1)
        drop = probs < _column([p.min_p for p in params], out) * probs.amax(dim=-1, keepdim=True)
        out = out.masked_fill(drop, neg)
    return out


class Sampler:
    """Samples one token per row; `generators[i]` is request i's own (seeded) generator or None."""

    def __init__(self, seed: int = 0, device: torch.device | str = "cpu"):
        self.shared = new_generator(seed, device)

    def __call__(self, logits: torch.Tensor, params: list[SamplingParams], prompts: list[list[int]],
                 outputs: list[list[int]], generators: list[torch.Generator | None],
                 mask: Mask | None = None) -> Sampled:
        """mask: the guided rows' grammar bitmask (graphc/runtime/grammar.py step_mask)."""
        if logits.dim() != 2 or logits.shape[0] != len(params) or len(generators) != len(params):
            raise ValueError(f"logits {list(logits.shape)} for {len(params)} params and {len(generators)} generators")
        raw = logits.float()
        logits = apply_mask(raw, mask) if mask is not None else raw
        if all(p.greedy and not needs_history(p) and not p.logit_bias for p in params):   # warp keeps the argmax
            return self._logprobs(raw, logits.argmax(dim=-1), params)
        processed = warp(penalise(bias(logits, params), params, prompts, outputs), params)
        probs = processed.softmax(dim=-1)
        race = torch.empty_like(probs)
        shared = [i for i, g in enumerate(generators) if g is None and not params[i].greedy]
        if shared:
            noise = torch.empty(len(shared), probs.shape[1], device=probs.device).exponential_(generator=self.shared)
            race.index_copy_(0, on_device(shared, torch.int64, probs.device), noise)
        for i, g in enumerate(generators):
            if g is not None and not params[i].greedy:
                race[i] = torch.empty(probs.shape[1], device=probs.device).exponential_(generator=g)
        greedy = on_device([p.greedy for p in params], torch.bool, logits.device)
        tokens = torch.where(greedy, processed.argmax(dim=-1), (probs / race).argmax(dim=-1))
        return self._logprobs(raw, tokens, params)

    @staticmethod
    def _logprobs(logits: torch.Tensor, tokens: torch.Tensor, params: list[SamplingParams]) -> Sampled:
        b = logits.shape[0]
        n = max((p.top_logprobs for p in params), default=0)
        if not any(p.logprobs for p in params):
            nan = torch.full((b,), float("nan"), device=logits.device)
            return Sampled(tokens, nan, tokens.new_empty(b, 0), logits.new_empty(b, 0))
        lp = logits.log_softmax(dim=-1)
        chosen = lp.gather(1, tokens[:, None])[:, 0]
        asked = on_device([p.logprobs for p in params], torch.bool, logits.device)
        chosen = torch.where(asked, chosen, torch.full_like(chosen, float("nan")))
        top = lp.topk(n, dim=-1) if n else None
        return Sampled(tokens, chosen, top.indices if top else tokens.new_empty(b, 0),
                       top.values if top else logits.new_empty(b, 0))
