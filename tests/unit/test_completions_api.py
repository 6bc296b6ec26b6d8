"""/v1/completions' echo with prompt logprobs, the prompt_logprobs field, a request's own chat template, batched
prompts, stream_options and the usage's cached tokens (issue 38), through the openai client on a tiny Qwen3-Omni
thinker (weights re-drawn). The expected logprobs are HF's log-softmax of the same ids; the expected texts are
the tokenizer's own decodings; a batch's choices are the same prompts sent one by one."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from graphc.runtime.engine import Engine
from tests.unit.loopback import post, serve, tiny_omni_hf

openai = pytest.importorskip("openai")
NAME = None                       # the plan's model name: a request may leave it out
PROMPT = "the cat sat on the mat, and then"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    d = tmp_path_factory.mktemp("echo")
    hf, tok = tiny_omni_hf(d, seed=7)
    engine = Engine(d / "p.plan", checkpoint=d / "ckpt")
    # a server's Driver is the only thread that steps its engine: the trusting server gets its own
    servers = [serve(engine), serve(Engine(d / "p.plan", checkpoint=d / "ckpt"), trust_request_chat_template=True)]
    clients = [openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
               for _, port in servers]
    yield dict(hf=hf, tok=tok, engine=engine, client=clients[0], trusting=clients[1], port=servers[0][1])
    for server, _ in servers:
        server.should_exit = True


def text(tok, tid: int) -> str:
    """A token's text as OpenAI shows a logprob's token: its own decoding, special tokens included."""
    return tok.decode([tid], skip_special_tokens=False)


def hf_logprobs(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        out = hf.thinker(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    return out.logits[0].float().log_softmax(-1)


def test_echo_with_logprobs_is_what_lm_eval_reads(served):
    """lm-evaluation-harness's loglikelihood request: echo, logprobs=1, max_tokens=1, temperature 0; it sums
    token_logprobs[ctxlen:-1] and calls a continuation greedy when each token's logprob is its top one's."""
    c, tok, hf = served["client"], served["tok"], served["hf"]
    ids = tok.encode(PROMPT).ids
    r = c.completions.create(model=NAME, prompt=PROMPT, max_tokens=1, logprobs=1, echo=True, temperature=0)
    ch = r.choices[0]
    out = ch.model_extra["token_ids"]
    lp = hf_logprobs(hf, ids + out)
    alone = c.completions.create(model=NAME, prompt=PROMPT, max_tokens=1, temperature=0).choices[0].text
    assert ch.text == PROMPT + alone
    assert ch.logprobs.tokens == [text(tok, t) for t in ids + out]
    assert ch.logprobs.token_logprobs[0] is None and ch.logprobs.top_logprobs[0] is None
    want = [lp[i - 1, t].item() for i, t in enumerate(ids + out) if i]
    assert ch.logprobs.token_logprobs[1:] == pytest.approx(want, abs=2e-5)
    for i, top in enumerate(ch.logprobs.top_logprobs[1:], 1):
        best = lp[i - 1].argmax().item()
        assert top == pytest.approx({text(tok, best): lp[i - 1, best].item()}, abs=2e-5)
    assert ch.logprobs.text_offset == list(np.cumsum([0] + [len(text(tok, t)) for t in ids + out])[:-1])
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == 1


def test_echo_streams_the_prompt_first_and_echoes_token_ids(served):
    c, tok = served["client"], served["tok"]
    ids = tok.encode(PROMPT).ids
    kw = dict(model=NAME, max_tokens=5, logprobs=2, echo=True, temperature=0, extra_body={"ignore_eos": True})
    whole = c.completions.create(prompt=PROMPT, **kw).choices[0]
    chunks = [ch.choices[0] for ch in c.completions.create(prompt=PROMPT, stream=True, **kw) if ch.choices]
    assert "".join(ch.text for ch in chunks) == whole.text and chunks[0].text.startswith(PROMPT), \
        [(ch.text, ch.logprobs.tokens[-3:]) for ch in chunks]
    assert [t for ch in chunks for t in ch.logprobs.tokens] == whole.logprobs.tokens, \
        ([(ch.text, ch.logprobs.tokens[-3:]) for ch in chunks], whole.logprobs.tokens[-6:], whole.text)
    assert [o for ch in chunks for o in ch.logprobs.text_offset] == whole.logprobs.text_offset
    as_ids = c.completions.create(prompt=ids, **kw).choices[0]
    assert as_ids.text == whole.text and as_ids.logprobs.token_logprobs[1:] == \
        pytest.approx(whole.logprobs.token_logprobs[1:], abs=1e-6)
    plain = c.completions.create(prompt=PROMPT, model=NAME, max_tokens=5, temperature=0, echo=True,
                                 extra_body={"ignore_eos": True}).choices[0]
    assert plain.text == whole.text and plain.logprobs is None


def test_prompt_logprobs_on_both_routes(served):
    c, tok, hf = served["client"], served["tok"], served["hf"]
    ids = tok.encode(PROMPT).ids
    lp = hf_logprobs(hf, ids)
    r = c.completions.create(model=NAME, prompt=ids, max_tokens=1, temperature=0, extra_body={"prompt_logprobs": 2})
    got = r.choices[0].model_extra["prompt_logprobs"]
    assert got[0] is None and len(got) == len(ids)
    for i in range(1, len(ids)):
        row = lp[i - 1]
        want = {ids[i]: (row[ids[i]].item(), int((row > row[ids[i]]).sum()) + 1)}
        for rank, t in enumerate(row.topk(2).indices.tolist(), 1):
            want.setdefault(t, (row[t].item(), rank))
        have = {int(k): v for k, v in got[i].items()}
        assert {k: v["rank"] for k, v in have.items()} == {k: r for k, (_, r) in want.items()}
        assert {k: v["logprob"] for k, v in have.items()} == pytest.approx({k: v for k, (v, _) in want.items()}, abs=2e-5)
        assert all(v["decoded_token"] == text(tok, int(k)) for k, v in got[i].items())
    msgs = [{"role": "user", "content": PROMPT}]
    chat = c.chat.completions.create(model=NAME, messages=msgs, max_tokens=1, extra_body={"prompt_logprobs": 0})
    rendered = post(served["port"], "/tokenize", {"messages": msgs})[1]["tokens"]
    plp = chat.model_extra["prompt_logprobs"]
    assert len(plp) == len(rendered) == chat.usage.prompt_tokens
    assert [int(next(iter(e))) for e in plp[1:]] == rendered[1:]
    with pytest.raises(openai.BadRequestError, match="prompt_logprobs is served on whole answers"):
        c.completions.create(model=NAME, prompt=PROMPT, stream=True, extra_body={"prompt_logprobs": 1})


def test_a_requests_own_chat_template_only_when_trusted(served):
    c, trusting, tok = served["client"], served["trusting"], served["tok"]
    own = "{% for m in messages %}<<{{ m['content'] }}>>{% endfor %}"
    msgs = [{"role": "user", "content": PROMPT}]
    with pytest.raises(openai.BadRequestError, match="--trust-request-chat-template"):
        c.chat.completions.create(model=NAME, messages=msgs, max_tokens=1, extra_body={"chat_template": own})
    r = trusting.chat.completions.create(model=NAME, messages=msgs, max_tokens=1, extra_body={"chat_template": own})
    assert r.usage.prompt_tokens == len(tok.encode(f"<<{PROMPT}>>").ids)
    with pytest.raises(openai.BadRequestError, match="does not parse"):
        trusting.chat.completions.create(model=NAME, messages=msgs, max_tokens=1,
                                         extra_body={"chat_template": "{% for %}"})


def test_a_batch_of_prompts_is_each_prompts_n_choices_in_turn(served):
    c, tok = served["client"], served["tok"]
    prompts = ["the cat sat", "on the mat, and then it", "hello"]
    kw = dict(model=NAME, max_tokens=4, temperature=0, extra_body={"ignore_eos": True})
    alone = [c.completions.create(prompt=p, **kw).choices[0].text for p in prompts]
    r = c.completions.create(prompt=prompts, n=2, **kw)
    assert [ch.index for ch in r.choices] == list(range(6))
    assert [ch.text for ch in r.choices] == [t for t in alone for _ in range(2)]
    assert r.usage.prompt_tokens == sum(len(tok.encode(p).ids) for p in prompts)
    assert r.usage.completion_tokens == 6 * 4
    ids = [tok.encode(p).ids for p in prompts]
    streamed = {}
    for ch in c.completions.create(prompt=ids, stream=True, echo=True, **kw):
        for piece in ch.choices:
            streamed[piece.index] = streamed.get(piece.index, "") + piece.text
    assert streamed == {i: p + t for i, (p, t) in enumerate(zip(prompts, alone))}
    with pytest.raises(openai.BadRequestError, match="empty batch"):
        c.completions.create(prompt=[], **kw)


def test_stream_options_are_strict_and_usage_may_come_in_every_chunk(served):
    c = served["client"]
    kw = dict(model=NAME, prompt=PROMPT, max_tokens=5, temperature=0, extra_body={"ignore_eos": True})
    chunks = list(c.completions.create(stream=True, stream_options={"include_usage": True,
                                                                    "continuous_usage_stats": True}, **kw))
    counts = [ch.usage.completion_tokens for ch in chunks]
    assert counts == sorted(counts) and counts[-1] == 5 and all(ch.usage is not None for ch in chunks)
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == len(served["tok"].encode(PROMPT).ids)
    with pytest.raises(openai.BadRequestError, match="bogus"):
        c.completions.create(stream=True, stream_options={"bogus": 1}, **kw)
    with pytest.raises(openai.BadRequestError, match="stream_options is for streamed requests"):
        c.completions.create(stream_options={"include_usage": True}, **kw)


def test_usage_counts_the_prompt_rows_taken_from_the_cache(served):
    c, engine = served["client"], served["engine"]
    page = engine.executor.kv_spec.page_size
    ids = list(range(20, 20 + 3 * page + 5))               # three full pages and some
    kw = dict(model=NAME, prompt=ids, max_tokens=2, temperature=0)
    first = c.completions.create(**kw).usage
    again = c.completions.create(**kw).usage
    assert first.prompt_tokens_details.cached_tokens == 0
    assert again.prompt_tokens_details.cached_tokens == 3 * page      # every full page; the last row is computed


def test_a_value_of_another_json_type_is_refused(served):
    """Strict bodies: pydantic's lax mode would take true as 1.0, false as 0 and "2" as 2."""
    port = served["port"]
    for route, body, field in (("/v1/completions", {"prompt": "hi", "frequency_penalty": True}, "frequency_penalty"),
                               ("/v1/completions", {"prompt": "hi", "logprobs": False}, "logprobs"),
                               ("/v1/completions", {"prompt": "hi", "n": "2"}, "n"),
                               ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                         "stream": 1}, "stream"),
                               ("/tokenize", {"prompt": "hi", "add_special_tokens": 0}, "add_special_tokens")):
        status, got = post(port, route, body)
        assert status == 400 and field in got["error"]["message"], (route, body, got)
