"""Logprobs as the routes show them: each token's text, never its id alone.

  chat        logprobs.content: [{token, logprob, bytes, top_logprobs: [...]}] of the output tokens
  completions logprobs: {tokens, token_logprobs, top_logprobs (keyed by text), text_offset}; with echo the
              prompt's tokens come first, the first of them with null logprob and null top_logprobs (OpenAI's
              shape, what lm-evaluation-harness reads)
  prompt_logprobs (graphc's and vLLM's field): per prompt token None (the first) or {id: {logprob, rank,
              decoded_token}} holding the prompt's token and the top alternatives asked for

An entry is the engine's (graphc/runtime/sampler.py): {token_id, logprob, top: [(id, logprob)], rank (prompt
tokens)}. Without a tokenizer a token's text is its id.
"""
from __future__ import annotations


def token_text(tokenizer, tid: int) -> str:
    return tokenizer.decode([tid], skip_special_tokens=False) if tokenizer else str(tid)


def chat_logprobs(tokenizer, req, start: int, end: int) -> dict | None:
    """Chat's logprobs {content: [...]} of output tokens start..end, None when not asked for."""
    if req.logprobs is None:
        return None

    def entry(tid, lp):
        text = token_text(tokenizer, tid)
        return {"token": text, "logprob": lp, "bytes": list(text.encode())}
    return {"content": [{**entry(e["token_id"], e["logprob"]),
                         "top_logprobs": [entry(t, v) for t, v in e["top"]]} for e in req.logprobs[start:end]]}


def completion_logprobs(tokenizer, entries: list, top: int, offset: int, out: dict | None = None) -> tuple[dict, int]:
    """/v1/completions' logprobs of `entries` (None: a token with none, the prompt's first) appended to `out` (a
    new one by default): each token's text, its logprob, its `top` alternatives keyed by text and its character
    offset from `offset`; and the offset after them."""
    out = out if out is not None else {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for e, tid in entries:
        t = token_text(tokenizer, tid)
        out["tokens"].append(t)
        out["token_logprobs"].append(None if e is None else e["logprob"])
        out["top_logprobs"].append(None if e is None else {token_text(tokenizer, i): v for i, v in e["top"][:top]})
        out["text_offset"].append(offset)
        offset += len(t)
    return out, offset


def output_entries(req, start: int, end: int) -> list:
    """(entry, token id) of output tokens start..end."""
    return [(e, e["token_id"]) for e in req.logprobs[start:end]]


def prompt_entries(req) -> list:
    """(entry or None, token id) of every prompt token."""
    return list(zip(req.prompt_logprobs, req.prompt.ids))


def prompt_logprobs(tokenizer, req, top: int) -> list | None:
    """The prompt_logprobs field: None for the first token, then {id: {logprob, rank, decoded_token}} of the
    prompt's token and its `top` alternatives; None when not asked for."""
    if req.prompt_logprobs is None:
        return None
    out = [None]
    for e in req.prompt_logprobs[1:]:
        ranked = {e["token_id"]: (e["logprob"], e["rank"])} | \
            {t: (v, r) for r, (t, v) in enumerate(e["top"][:top], 1) if t != e["token_id"]}
        out.append({str(t): {"logprob": v, "rank": r, "decoded_token": token_text(tokenizer, t)}
                    for t, (v, r) in ranked.items()})
    return out
