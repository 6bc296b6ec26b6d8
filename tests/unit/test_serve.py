"""graphc run end to end on a tiny Qwen3-Omni thinker checkpoint: the OpenAI-compatible server driven by the
official `openai` client on loopback, the offline JSONL batch, seeded sampling, and what is refused."""
import base64
import json
import time

import numpy as np
import pytest
import soundfile as sf

from examples.make_tiny_checkpoint import build_tokenizer, omni_model, save
from graphc.cli import main
from graphc.runtime.engine import Engine
from graphc.runtime.sampler import SamplingParams
from tests.unit.loopback import post, serve

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    d = tmp_path_factory.mktemp("serve")
    save(omni_model(build_tokenizer()), build_tokenizer(), d / "ckpt")
    assert main(["plan", "models/qwen3_omni.py", "--preset", "tiny", "--checkpoint", str(d / "ckpt"), "--gpu", "cpu",
                 "-o", str(d / "p.plan"), "-q"]) == 0
    # answers are compared token for token with a fresh engine's; the checkpoint's weights are HF's defaults
    # (near-tied logits), so rows reused from another step's batch could flip a token: no prefix cache here
    engine = Engine(d / "p.plan", checkpoint=d / "ckpt", prefix_cache=False)
    server, port = serve(engine)
    wave = (0.2 * np.sin(np.arange(24000) / 16000 * 2 * np.pi * 220)).astype(np.float32)
    sf.write(d / "a.wav", wave, 16000)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
    yield dict(engine=engine, client=client, dir=d, port=port)
    server.should_exit = True


def wait_idle(engine, timeout=5.0):
    t = time.time()
    while not engine.scheduler.idle() and time.time() - t < timeout:
        time.sleep(0.01)
    return engine.scheduler.idle() and engine.scheduler.pool_full()


MESSAGES = [{"role": "user", "content": "hello world, how are you today?"}]


def test_chat_streamed_equals_unstreamed_and_the_engine_offline(served):
    c, engine = served["client"], served["engine"]
    full = c.chat.completions.create(model=engine.plan.model.name, messages=MESSAGES, max_tokens=12, temperature=0)
    chunks = list(c.chat.completions.create(model=engine.plan.model.name, messages=MESSAGES, max_tokens=12,
                                            temperature=0, stream=True, stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == full.choices[0].message.content
    assert full.usage.completion_tokens == chunks[-1].usage.completion_tokens
    assert full.choices[0].finish_reason in ("stop", "length")
    assert wait_idle(engine)


def test_completions_take_token_ids_and_return_them(served):
    c, engine = served["client"], served["engine"]
    r = c.completions.create(model=engine.plan.model.name, prompt=[5, 6, 7, 8], max_tokens=6, temperature=0,
                             extra_body={"ignore_eos": True})
    ids = r.choices[0].model_extra["token_ids"]
    assert len(ids) == 6 and r.usage.prompt_tokens == 4
    assert wait_idle(engine)


def test_audio_input_part(served):
    import base64

    c, engine = served["client"], served["engine"]
    data = base64.b64encode((served["dir"] / "a.wav").read_bytes()).decode()
    r = c.chat.completions.create(model=engine.plan.model.name, max_tokens=4, temperature=0, messages=[
        {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": data, "format": "wav"}},
                                     {"type": "text", "text": "transcribe"}]}])
    assert r.usage.prompt_tokens > 30        # the audio's rows are in the prompt
    assert wait_idle(engine)


def test_logprobs_are_served(served):
    c, engine = served["client"], served["engine"]
    r = c.chat.completions.create(model=engine.plan.model.name, messages=MESSAGES, max_tokens=3, temperature=0,
                                  logprobs=True, top_logprobs=2)
    lp = r.choices[0].logprobs.content
    assert len(lp) == r.usage.completion_tokens and all(len(x.top_logprobs) == 2 for x in lp)
    assert all(x.logprob <= 0 and x.top_logprobs[0].logprob >= x.top_logprobs[1].logprob for x in lp)


def test_streamed_logprobs_cover_every_token_once(served):
    """Each streamed chunk's logprobs are its own tokens': none skipped when the engine has the next token in
    flight as the chunk is written (graphc/runtime/flight.py), none sent twice."""
    c, engine = served["client"], served["engine"]
    kw = dict(model=engine.plan.model.name, messages=MESSAGES, max_tokens=24, temperature=0, logprobs=True,
              top_logprobs=1, extra_body={"ignore_eos": True})
    full = c.chat.completions.create(**kw).choices[0].logprobs.content
    chunks = list(c.chat.completions.create(**kw, stream=True))
    got = [x for ch in chunks if ch.choices and ch.choices[0].logprobs for x in ch.choices[0].logprobs.content]
    assert [(x.token, round(x.logprob, 4)) for x in got] == [(x.token, round(x.logprob, 4)) for x in full]
    assert len(got) == 24 and wait_idle(engine)


def test_small_routes_answer_as_the_peers_do(served):
    """/v1/models/{id} (the served one; another is OpenAI's 404), /version as pyproject's, /ping by GET and POST."""
    import tomllib
    import urllib.request

    c, engine, port = served["client"], served["engine"], served["port"]
    name = engine.plan.model.name
    assert c.models.retrieve(name).id == name
    with pytest.raises(openai.NotFoundError, match="not served here") as e:
        c.models.retrieve("gpt-4")
    assert e.value.body["code"] == "model_not_found"
    project = tomllib.loads(open("pyproject.toml").read())["project"]
    from graphc import __version__
    assert "version" in project.get("dynamic", []) and __version__.count(".") == 2
    got = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/version").read())
    assert got == {"version": __version__}
    for method in ("GET", "POST"):
        r = urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/ping", method=method))
        assert r.status == 200


def test_refusals_have_openai_bodies(served):
    c, engine = served["client"], served["engine"]
    name = engine.plan.model.name
    with pytest.raises(openai.NotFoundError, match="not served here"):
        c.chat.completions.create(model="gpt-4", messages=MESSAGES)
    with pytest.raises(openai.BadRequestError, match="this plan does not speak"):
        c.chat.completions.create(model=name, messages=MESSAGES, modalities=["text", "audio"],
                                  audio={"voice": "ethan", "format": "wav"})
    with pytest.raises(openai.BadRequestError, match="bogus"):
        c.chat.completions.create(model=name, messages=MESSAGES, extra_body={"bogus": 1})
    with pytest.raises(openai.BadRequestError, match=r"asks for .* tokens .* the plan allows 1024"):
        c.completions.create(model=name, prompt=[5] * 1000, max_tokens=100)
    with pytest.raises(openai.BadRequestError, match="n=17: at most 16 choices"):
        c.chat.completions.create(model=name, messages=MESSAGES, n=17)
    assert wait_idle(engine)


def test_models_and_health(served):
    from urllib.request import urlopen

    base = f"http://127.0.0.1:{served['port']}"
    assert json.load(urlopen(base + "/v1/models"))["data"][0]["id"] == served["engine"].plan.model.name
    from urllib.error import HTTPError
    from urllib.request import Request

    try:
        urlopen(Request(base + "/v1/chat/completions", data=b"{bad json", headers={"content-type": "application/json"}))
        raise AssertionError("malformed JSON was accepted")
    except HTTPError as e:
        assert e.code == 400 and "not valid JSON" in json.load(e)["error"]["message"]
    h = json.load(urlopen(base + "/health"))
    assert h["status"] == "ok" and h["pages"] == served["engine"].scheduler.capacity


def own_engine(served) -> Engine:
    """An engine of the same plan and weights that the server's thread does not step."""
    return Engine(served["dir"] / "p.plan", checkpoint=served["dir"] / "ckpt")


def test_a_seed_gives_the_same_tokens_alone_and_in_a_full_batch(served):
    engine = own_engine(served)
    sampled = SamplingParams(temperature=1.0, top_k=50, seed=7, max_tokens=8, ignore_eos=True)
    alone = engine.generate([{"messages": MESSAGES, **sampled.model_dump()}])[0].token_ids
    others = [{"prompt_token_ids": list(range(3, 3 + n)), "temperature": 0.8, "max_tokens": 8, "ignore_eos": True}
              for n in range(2, 9)]
    batch = engine.generate(others[:3] + [{"messages": MESSAGES, **sampled.model_dump()}] + others[3:])
    assert batch[3].token_ids == alone
    unseeded = engine.generate([{"messages": MESSAGES, "temperature": 1.0, "max_tokens": 8, "ignore_eos": True}] * 4)
    assert len({tuple(o.token_ids) for o in unseeded}) > 1       # unseeded requests draw differently


def test_offline_jsonl_run_and_a_changed_config_is_refused(served, tmp_path, capsys):
    d, engine = served["dir"], own_engine(served)
    lines = [{"id": "a", "messages": MESSAGES, "max_tokens": 5, "temperature": 0},
             {"id": "b", "messages": [{"role": "user", "content": [{"type": "audio", "path": str(d / "a.wav")},
                                                                    {"type": "text", "text": "hi"}]}],
              "max_tokens": 5, "temperature": 0}]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    rc = main(["run", str(d / "p.plan"), "--checkpoint", str(d / "ckpt"), "--requests", str(tmp_path / "in.jsonl"),
               "--output", str(tmp_path / "out.jsonl"), "--stats", str(tmp_path / "stats.json")])
    assert rc == 0
    outs = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [o["id"] for o in outs] == ["a", "b"] and [o["kind"] for o in outs] == ["t2t", "a2t"]
    want = engine.generate([{k: v for k, v in x.items() if k != "id"} for x in lines])
    assert [o["token_ids"] for o in outs] == [w.token_ids for w in want]
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["steps"]["audio_prefill"] >= 1 and stats["eager"] >= 1
    cfg = json.loads((d / "ckpt" / "config.json").read_text())
    cfg["thinker_config"]["text_config"]["num_hidden_layers"] = 2
    changed = tmp_path / "changed"
    changed.mkdir()
    (changed / "config.json").write_text(json.dumps(cfg))
    capsys.readouterr()
    assert main(["run", str(d / "p.plan"), "--checkpoint", str(changed), "--requests", str(tmp_path / "in.jsonl")]) == 2
    assert "thinker_config.text_config.num_hidden_layers: 3 in the plan, 2 in the checkpoint" in capsys.readouterr().err


def test_http_tokens_equal_the_engine_and_a_dropped_stream_frees_its_pages(served, leak_oracle):
    c, engine = served["client"], leak_oracle.watch(served["engine"])
    name = engine.plan.model.name
    prompts = [[5, 6, 7, 8, 9], list(range(20, 60))]
    want = own_engine(served).generate([{"prompt_token_ids": p, "max_tokens": 7, "temperature": 0, "ignore_eos": True}
                                        for p in prompts])
    for p, w in zip(prompts, want):
        r = c.completions.create(model=name, prompt=p, max_tokens=7, temperature=0, extra_body={"ignore_eos": True})
        assert r.choices[0].model_extra["token_ids"] == w.token_ids
    stream = c.chat.completions.create(model=name, messages=MESSAGES, max_tokens=900, temperature=0, stream=True,
                                       extra_body={"ignore_eos": True})
    next(iter(stream))
    t = time.time()
    stream.close()                                # the client goes away mid-stream: 900 tokens would take ~10 s
    assert wait_idle(engine, timeout=3), f"pages still held {time.time() - t:.1f} s after the client left"


def test_transcription_on_qwen3_omni_asks_it_to_transcribe(served):
    """Qwen3-Omni has no ASR format: /v1/audio/transcriptions sends the audio with 'Transcribe the audio into
    text.' (graphc/serve/default_transcription.py) and returns its answer as is; greedy, capped at 64 + 30
    tokens a second of audio. The text equals a second engine's answer to that chat request."""
    from graphc.serving import Media
    from graphc.runtime.media import load_audio

    c, engine, d = served["client"], served["engine"], served["dir"]
    got = c.audio.transcriptions.create(model=engine.plan.model.name, file=open(d / "a.wav", "rb"))
    ref = Engine(d / "p.plan", checkpoint=d / "ckpt")
    wave = load_audio(str(d / "a.wav"))
    msgs = [{"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": "Transcribe the audio into text."}]}]
    ids = ref.tokenize(prompt=ref.template.render(msgs, add_generation_prompt=True))
    req = ref.add(prompt_token_ids=ids, media=[Media("audio", wave)],
                  params=SamplingParams(temperature=0, max_tokens=64 + round(30 * len(wave) / 16000)))
    while not req.closed:
        ref.step()
    assert got.text == ref.output(req).text and len(req.output) > 1


def test_tokenize_and_detokenize_agree_with_hf_tokenizer_and_template(served):
    """/tokenize, /detokenize and /tokenizer_info against HF's tokenizer of the same files (issue 38)."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(served["dir"] / "ckpt"))
    port, most = served["port"], served["engine"].max_seq_len
    text = "hello world, how are you today?"
    want = hf.encode(text, add_special_tokens=False)
    assert post(port, "/tokenize", {"prompt": text, "return_token_strs": True}) == (200, {
        "count": len(want), "max_model_len": most, "tokens": want, "token_strs": hf.convert_ids_to_tokens(want)})
    assert post(port, "/tokenize", {"prompt": text, "add_special_tokens": False}) == (200, {   # as lm-eval asks
        "count": len(want), "max_model_len": most, "tokens": want})
    chat = hf.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)
    chat = chat["input_ids"] if isinstance(chat, dict) or hasattr(chat, "keys") else chat
    status, got = post(port, "/tokenize", {"messages": MESSAGES, "model": served["engine"].model_name})
    assert status == 200 and got["tokens"] == list(chat) and got["count"] == len(chat)
    assert post(port, "/detokenize", {"tokens": want}) == (200, {"prompt": hf.decode(want)})
    import urllib.request
    info = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/tokenizer_info").read())
    assert info["vocab_size"] == len(hf) and info["max_model_len"] == most and info["chat_template"] == hf.chat_template
    assert info["eos_token"] == hf.eos_token


@pytest.mark.parametrize("path,body,status,words", [
    ("/tokenize", {"prompt": "a", "messages": MESSAGES}, 400, "prompt or messages, one of them"),
    ("/tokenize", {}, 400, "prompt or messages, one of them"),
    ("/tokenize", {"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {
        "data": base64.b64encode(b"RIFF").decode()}}]}]}, 400, "media"),
    ("/tokenize", {"prompt": "a", "bogus": 1}, 400, "bogus"),
    ("/tokenize", {"prompt": "a", "add_special_tokens": True}, 400, "add_special_tokens is true"),
    ("/tokenize", {"prompt": "a", "model": "gpt-4"}, 404, "'gpt-4' is not served here"),
    ("/detokenize", {"tokens": [1, 10**6]}, 400, "[1000000] are outside the vocabulary"),
])
def test_the_tokenizer_routes_refuse_what_they_cannot_answer(served, path, body, status, words):
    got_status, got = post(served["port"], path, body)
    assert got_status == status and words in got["error"]["message"], got


TEMPLATE = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<assistant>"
            "{% endif %}{% if enable_thinking is defined and not enable_thinking %}/no_think{% endif %}")


def test_chat_template_given_at_start_and_its_kwargs_per_request(served, tmp_path):
    """--chat-template (a file or the text) renders chat requests instead of the checkpoint's, with a request's
    chat_template_kwargs in scope: the ids are HF's tokenizer's of the text worked by hand (issue 38)."""
    from transformers import AutoTokenizer

    from graphc.errors import InvalidInput

    hf = AutoTokenizer.from_pretrained(str(served["dir"] / "ckpt"))
    (tmp_path / "t.jinja").write_text(TEMPLATE)
    for given in (TEMPLATE, str(tmp_path / "t.jinja")):
        engine = Engine(served["dir"] / "p.plan", checkpoint=served["dir"] / "ckpt", chat_template=given)
        text = "<user>hello world, how are you today?<assistant>"
        assert engine.tokenize(MESSAGES) == hf.encode(text, add_special_tokens=False)
        assert engine.tokenize(MESSAGES, template_kwargs={"enable_thinking": False}) == \
            hf.encode(text + "/no_think", add_special_tokens=False)
        with pytest.raises(InvalidInput, match="are the template's own inputs"):
            engine.tokenize(MESSAGES, template_kwargs={"add_generation_prompt": False})
        engine.close()
    with pytest.raises(InvalidInput, match="no such file"):
        Engine(served["dir"] / "p.plan", checkpoint=served["dir"] / "ckpt", chat_template=str(tmp_path / "none.jinja"))
    with pytest.raises(InvalidInput, match="--chat-template with no tokenizer"):      # before the boot
        Engine(served["dir"] / "p.plan", random_weights=True, chat_template=TEMPLATE)


def test_a_chat_requests_template_kwargs_reach_the_template_and_its_own_template_is_refused(served):
    port = served["port"]
    status, got = post(port, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 1,
                                                       "chat_template_kwargs": {"messages": []}})
    assert status == 400 and "are the template's own inputs" in got["error"]["message"]
    status, got = post(port, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 1, "chat_template": "x"})
    assert status == 400 and got["error"]["param"] == "chat_template"


def test_logit_bias_through_the_completions_route(served):
    """A +100 bias makes greedy pick that id every step; an id past the vocabulary is a 400 naming it."""
    client = served["client"]
    out = client.completions.create(model=served["engine"].model_name, prompt=[1, 2, 3], max_tokens=4,
                                    temperature=0, logit_bias={"17": 100}, extra_body={"ignore_eos": True})
    assert out.usage.completion_tokens == 4
    got = served["engine"].tokenize(prompt=out.choices[0].text)
    assert got == [17] * 4, got
    status, err = post(served["port"], "/v1/completions", {"prompt": [1, 2], "max_tokens": 1,
                                                            "logit_bias": {"1000000": 5}})
    assert status == 400 and "logit_bias ids [1000000] are outside the vocabulary" in err["error"]["message"]


def test_completion_logprobs_show_text_with_offsets_streamed_or_not(served):
    """/v1/completions logprobs as OpenAI shows them (issue 38): each token's text (HF's decoding of its id),
    the top alternatives keyed by text, text_offset the characters before each token; a stream's chunks
    together say the same."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(served["dir"] / "ckpt"))
    kw = dict(model=served["engine"].model_name, prompt="hello world", max_tokens=6, temperature=0, logprobs=2,
              extra_body={"ignore_eos": True})
    c = served["client"]
    full = c.completions.create(**kw).choices[0]
    lp = full.logprobs
    texts = [hf.decode([i]) for i in full.model_extra["token_ids"]]              # the ids graphc answered with
    assert lp.tokens == texts and len(texts) == 6
    assert lp.text_offset == [sum(len(t) for t in texts[:k]) for k in range(len(texts))]
    assert all(1 <= len(top) <= 2 and lp.tokens[k] in top for k, top in enumerate(lp.top_logprobs))   # texts may coincide
    parts = [ch.choices[0].logprobs for ch in c.completions.create(**kw, stream=True) if ch.choices[0].logprobs]
    assert [t for p in parts for t in p.tokens] == lp.tokens
    assert [o for p in parts for o in p.text_offset] == lp.text_offset
    assert [v for p in parts for v in p.token_logprobs] == pytest.approx(lp.token_logprobs)


def test_n_choices_whole_and_streamed(served):
    """n > 1 (issue 38): seeded sampling gives choice i what a lone request seeded seed + i gives (so choices
    differ, and repeat); streamed, each choice's chunks carry its index and add up to its text; usage counts
    the prompt once; a spoken answer with n > 1 is a 400."""
    c, name = served["client"], served["engine"].model_name
    kw = dict(model=name, prompt=[1, 2, 3], max_tokens=5, temperature=1.0, seed=11, extra_body={"ignore_eos": True})
    many = c.completions.create(**kw, n=3)
    alone = [c.completions.create(**{**kw, "seed": 11 + i}).choices[0] for i in range(3)]
    assert [ch.index for ch in many.choices] == [0, 1, 2]
    assert [ch.model_extra["token_ids"] for ch in many.choices] == [a.model_extra["token_ids"] for a in alone]
    assert many.usage.prompt_tokens == 3 and many.usage.completion_tokens == 15
    text = {0: "", 1: "", 2: ""}
    ends = {}
    for chunk in c.completions.create(**kw, n=3, stream=True, stream_options={"include_usage": True}):
        for ch in chunk.choices:
            text[ch.index] += ch.text
            ends[ch.index] = ch.finish_reason or ends.get(ch.index)
        usage = chunk.usage or None
    assert [text[i] for i in range(3)] == [ch.text for ch in many.choices] and ends == {0: "length", 1: "length",
                                                                                      2: "length"}
    assert usage.completion_tokens == 15
    chat = c.chat.completions.create(model=name, messages=MESSAGES, max_tokens=3, temperature=0, n=2)
    assert [ch.index for ch in chat.choices] == [0, 1] and chat.choices[0].message.content == chat.choices[1].message.content
    with pytest.raises(openai.BadRequestError, match="n=2 with audio out"):
        c.chat.completions.create(model=name, messages=MESSAGES, n=2, modalities=["text", "audio"],
                                  audio={"voice": "ethan", "format": "wav"})
    assert wait_idle(served["engine"])
