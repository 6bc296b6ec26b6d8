"""Speech out through the server and the official `openai` client: a tiny Qwen3-Omni with talker and Code2Wav
(examples/make_tiny_checkpoint.py omni-speech, weights re-drawn), planned from its config.json and served on
loopback. Chat completions with modalities ["text", "audio"] streamed and not, /v1/audio/speech, the offline
JSONL run with audio; each WAV a client saves opens with soundfile at 24 kHz, holds the samples its codes
imply, and equals what graphc.Engine makes for the same request."""
import base64
import io
import json
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import soundfile as sf

from graphc.cli import main
from graphc.runtime.engine import Engine
from graphc.runtime.sampler import SamplingParams
from graphc.runtime.speech import SpeechParams
from tests.parity.speaking import speaking_omni
from tests.unit.loopback import serve

openai = pytest.importorskip("openai")
MSGS = [{"role": "user", "content": "hello world, how are you today?"}]
MAX, FRAMES, SEED = 8, 40, 7             # text tokens, codec frames at most, the talker's seed (sampled speech)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    _, tok, plan, ckpt = speaking_omni(tmp_path_factory.mktemp("speech_api"))
    d = plan.parent
    engine = Engine(plan, checkpoint=ckpt)
    ref = Engine(plan, checkpoint=ckpt)       # the same weights, stepped by the test alone
    server, port = serve(engine, max_audio_bytes=200_000)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=120)
    yield dict(engine=engine, ref=ref, client=client, dir=d, port=port, tok=tok)
    server.should_exit = True


def offline(engine, voice, messages=MSGS, **kw):
    """What the engine alone makes for a chat request with speech (greedy text, MAX tokens; the talker
    samples at the model's defaults from its own seed, so the frames do not depend on the batch)."""
    req = engine.add(messages=messages, params=SamplingParams(temperature=0, max_tokens=MAX, seed=SEED),
                     speech=SpeechParams(voice=voice, seed=SEED, max_frames=FRAMES), **kw)
    while not req.closed:
        engine.step()
    return engine.output(req)


def delta_audio(chunk) -> dict:
    """A streamed chunk's delta.audio (the client types it as ChoiceDeltaAudio) as a dict."""
    audio = chunk.choices[0].delta.audio
    return {} if audio is None else audio.model_dump(exclude_none=True)


def frames_to_samples(engine, frames: int) -> int:
    cfg = engine.host.speech.vcfg
    return cfg.samples(frames)                    # U * frames - tail: one continuous waveform


def read_wav(data: bytes):
    wave, rate = sf.read(io.BytesIO(data), dtype="float32")
    return wave, rate


def test_chat_audio_unstreamed_and_streamed_equal_the_engine(served):
    c, engine = served["client"], served["engine"]
    want = offline(served["ref"], "chelsie")
    assert len(want.audio_codes) > 0
    r = c.chat.completions.create(model=engine.plan.model.name, messages=MSGS, max_tokens=MAX, temperature=0,
                                  modalities=["text", "audio"], audio={"voice": "chelsie", "format": "wav", "max_frames": FRAMES}, seed=SEED)
    msg = r.choices[0].message
    assert msg.content is None and msg.audio.transcript == want.text and msg.audio.id.startswith("audio_")
    wave, rate = read_wav(base64.b64decode(msg.audio.data))
    assert rate == 24000 and len(wave) == frames_to_samples(engine, len(want.audio_codes)) == len(want.audio)
    assert np.abs(wave - want.audio).max() <= 2 / 32767     # 16-bit PCM of the same samples (read back / 32768)
    assert r.usage.completion_tokens_details.audio_tokens == len(want.audio_codes)
    # streamed: transcript deltas and audio deltas (one WAV stream) join to the same
    stream = c.chat.completions.create(model=engine.plan.model.name, messages=MSGS, max_tokens=MAX, temperature=0,
                                       modalities=["text", "audio"], audio={"voice": "chelsie", "format": "wav", "max_frames": FRAMES},
                                       seed=SEED, stream=True)
    text, data, last = "", b"", None
    for chunk in stream:
        if not chunk.choices:
            continue
        audio = delta_audio(chunk)
        text += audio.get("transcript") or ""
        data += base64.b64decode(audio["data"]) if audio.get("data") else b""
        last = chunk.choices[0].finish_reason or last
    assert text == want.text and last == want.finish_reason
    wave2, rate2 = read_wav(data)
    assert rate2 == 24000 and np.array_equal(wave2, wave)
    assert wait_idle(engine)


def test_pcm16_stream_is_the_raw_samples(served):
    c, engine = served["client"], served["engine"]
    want = offline(served["ref"], "ethan")
    stream = c.chat.completions.create(model=engine.plan.model.name, messages=MSGS, max_tokens=MAX, temperature=0,
                                       modalities=["text", "audio"], audio={"voice": "ethan", "format": "pcm16", "max_frames": FRAMES},
                                       seed=SEED, stream=True)
    data = b"".join(base64.b64decode(delta_audio(ch).get("data") or "") for ch in stream if ch.choices)
    pcm = np.frombuffer(data, dtype="<i2").astype(np.float32) / 32767
    assert len(pcm) == len(want.audio) and np.abs(pcm - want.audio).max() <= 1 / 32767 + 1e-6


def test_audio_speech_speaks_the_input_as_given(served, tmp_path):
    c, engine, tok = served["client"], served["engine"], served["tok"]
    text = "the quick brown fox jumps over the lazy dog"
    kw = dict(model=engine.plan.model.name, voice="aiden", input=text, extra_body={"seed": SEED, "max_frames": FRAMES})
    r = c.audio.speech.create(**kw, response_format="wav")
    wave, rate = read_wav(r.content)
    ids = tok.encode(text, add_special_tokens=False).ids
    want = offline(served["ref"], "aiden", [{"role": "user", "content": text}], speak=ids)   # the route's prompt
    assert len(want.audio_codes) > 0
    assert want.text == text and rate == 24000
    assert len(wave) == frames_to_samples(engine, len(want.audio_codes)) == len(want.audio)
    assert np.abs(wave - want.audio).max() <= 2 / 32767
    # streamed to a file, and as server-sent events
    path = tmp_path / "out.wav"
    with c.audio.speech.with_streaming_response.create(**kw, response_format="wav") as resp:
        resp.stream_to_file(path)
    assert np.array_equal(sf.read(path, dtype="float32")[0], wave)
    body = {"input": text, "voice": "aiden", "response_format": "pcm", "stream_format": "sse", "seed": SEED,
            "max_frames": FRAMES}
    with urllib.request.urlopen(request(served, "/v1/audio/speech", body), timeout=60) as s:
        events = [json.loads(line[6:]) for line in s.read().decode().splitlines() if line.startswith("data: ")]
    assert [e["type"] for e in events[:-1]] == ["speech.audio.delta"] * (len(events) - 1)
    assert events[-1]["type"] == "speech.audio.done" and events[-1]["usage"]["output_tokens"] == len(want.audio_codes)
    pcm = np.frombuffer(b"".join(base64.b64decode(e["audio"]) for e in events[:-1]), "<i2")
    assert len(pcm) == len(want.audio)
    for fmt in ("mp3", "flac", "opus"):           # whole files, encoded by libsndfile
        w, rate = read_wav(c.audio.speech.create(**kw, response_format=fmt).content)
        assert rate == 24000 and abs(len(w) - len(want.audio)) <= 2048      # codecs pad to their frames
    assert wait_idle(engine)


def wait_idle(engine, timeout=5.0):
    t = time.time()
    while engine.has_work() and time.time() - t < timeout:
        time.sleep(0.01)
    return not engine.has_work() and engine.scheduler.pool_full() and \
        engine.speech.pages.num_free == engine.speech.capacity


def request(served, path, body) -> urllib.request.Request:
    return urllib.request.Request(f"http://127.0.0.1:{served['port']}{path}", data=json.dumps(body).encode(),
                                  headers={"Content-Type": "application/json"}, method="POST")


def post(served, path, body):
    """(status, JSON body) of a POST, errors included."""
    try:
        with urllib.request.urlopen(request(served, path, body), timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.parametrize("body, status, param, words", [
    ({"modalities": ["text", "audio"], "audio": {"voice": "nobody", "format": "wav"}}, 400, "voice",
     "aiden, chelsie, ethan"),
    ({"modalities": ["text", "audio"], "audio": {"voice": "ethan", "format": "aac"}}, 400, "audio.format", "formats"),
    ({"modalities": ["text", "audio"], "audio": {"voice": "ethan", "format": "mp3"}, "stream": True}, 400,
     "audio.format", "cannot be streamed"),
    ({"modalities": ["text", "audio"]}, 400, "audio", "both"),
    ({"audio": {"voice": "ethan", "format": "wav"}}, 400, "modalities", "both"),
    ({"modalities": ["text", "audio"], "audio": {"voice": "ethan", "format": "wav", "speed": 2}}, 400, "audio.speed",
     "Extra inputs"),
])
def test_chat_audio_refusals(served, body, status, param, words):
    code, got = post(served, "/v1/chat/completions", {"messages": MSGS, **body})
    err = got["error"]
    assert code == status and err["param"] == param and words in err["message"], err


@pytest.mark.parametrize("body, status, param, words", [
    ({"input": "hi", "voice": "ethan", "speed": 1.5}, 400, "speed", "not served"),
    ({"input": "hi", "voice": "ethan", "response_format": "aac"}, 400, "response_format", "formats"),
    ({"input": "hi", "voice": "ethan", "response_format": "mp3", "stream_format": "sse"}, 400, "response_format",
     "cannot be streamed"),
    ({"input": "hi", "voice": "zed"}, 400, "voice", "aiden, chelsie, ethan"),
    ({"input": "", "voice": "ethan"}, 400, "input", "at least 1"),
    ({"input": "hi", "voice": "ethan", "model": "other"}, 404, "model", "not served"),
    ({"input": "hi", "voice": "ethan", "pitch": 3}, 400, "pitch", "Extra inputs"),
])
def test_speech_refusals(served, body, status, param, words):
    code, got = post(served, "/v1/audio/speech", body)
    err = got["error"]
    assert code == status and err["param"] == param and words in err["message"], err


def test_oversized_body_is_refused_before_it_is_read(served):
    """A body past 200 kB of media x 4/3 + 1 MiB: 413 from its header, before a byte of it is sent (a client
    still uploading would see the server close the connection instead of the answer)."""
    from tests.unit.loopback import answer_to_header

    before = dict(served["engine"].scheduler.stats.steps)
    status, body = answer_to_header(served["port"], "/v1/chat/completions", 1600000)
    assert status == 413
    assert "at most" in body["error"]["message"] and body["error"]["code"] == "request_too_large"
    assert dict(served["engine"].scheduler.stats.steps) == before


def test_offline_jsonl_writes_each_requests_wav(served, tmp_path):
    d = served["dir"]
    want = offline(served["ref"], "chelsie")
    lines = [{"id": "a", "messages": MSGS, "max_tokens": MAX, "temperature": 0, "modalities": ["text", "audio"],
              "audio": {"voice": "chelsie", "seed": SEED, "max_frames": FRAMES}},
             {"id": "b", "messages": MSGS, "max_tokens": MAX, "temperature": 0}]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert main(["run", str(d / "p.plan"), "--checkpoint", str(d / "ckpt"), "--requests", str(tmp_path / "in.jsonl"),
                 "--output", str(tmp_path / "out.jsonl")]) == 0
    out = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert out[0]["audio_path"] == str(tmp_path / "out.audio" / "a.wav") and "audio_path" not in out[1]
    wave, rate = sf.read(out[0]["audio_path"], dtype="float32")
    assert rate == 24000 and len(wave) == len(want.audio) and out[0]["audio_frames"] == len(want.audio_codes)
    assert out[0]["text"] == want.text == out[1]["text"]


def test_metrics_count_speaking_requests_and_their_first_audio(served):
    """After this module's requests: t2s requests counted by kind, first-audio latency observed for each one
    that spoke, the talker's and Code2Wav's steps among the walks."""
    import re

    c, engine = served["client"], served["engine"]
    c.chat.completions.create(model=engine.plan.model.name, messages=MSGS, max_tokens=MAX, temperature=0,
                              modalities=["text", "audio"], audio={"voice": "ethan", "format": "wav", "max_frames": 8},
                              seed=SEED)
    assert wait_idle(engine)
    with urllib.request.urlopen(f"http://127.0.0.1:{served['port']}/metrics", timeout=30) as r:
        text = r.read().decode()

    def value(name: str) -> float:
        found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
        assert found, name
        return float(found.group(1))
    spoke = sum(value(f'graphc_requests_total{{kind="t2s",status="{s}"}}') for s in ("stop", "length")
                if f'kind="t2s",status="{s}"' in text)
    assert spoke >= 1 and value("graphc_first_audio_seconds_count") >= 1
    for walk in ("talker_prefill", "talker_decode", "code2wav_short"):
        assert value(f'graphc_walk_steps_total{{walk="{walk}"}}') == engine.stats()["steps"][walk]


def test_an_aborted_speaking_request_frees_thinker_and_talker_pages(served, leak_oracle):
    """Aborted while its thinker decodes, while its talker decodes, and after its text ended: every page of
    both pools comes back and the engine holds nothing."""
    ref = leak_oracle.watch(served["ref"])
    for steps in (2, 6, 14):
        req = ref.add(messages=MSGS, params=SamplingParams(temperature=0, max_tokens=MAX),
                      speech=SpeechParams(voice="ethan", seed=SEED, max_frames=FRAMES))
        for _ in range(steps):
            ref.step()
        assert not req.closed
        ref.abort(req.id)
        assert req.closed and req.finish_reason in ("abort", "stop", "length") and not ref.has_work()
        assert ref.scheduler.pool_full() and ref.speech.pages.num_free == ref.speech.capacity


def test_a_spoken_answer_whose_first_token_ends_it_closes_with_no_audio(served, leak_oracle):
    """Was a hang (the request stayed speaking, no step to run; the server then ended with code 3): the
    talker has nothing to speak when the text's first token ends the turn (found by the soak)."""
    ref = leak_oracle.watch(served["ref"])
    vocab = ref.model.node(ref.llm).outputs["logits"].shape[-1]
    req = ref.add(messages=MSGS, params=SamplingParams(max_tokens=8, temperature=0, stop_token_ids=list(range(vocab))),
                  speech=SpeechParams(voice="ethan", max_frames=10))
    for _ in range(10):
        if req.closed:
            break
        ref.step()
    out = ref.output(req)
    assert req.closed and out.finish_reason == "stop" and len(out.token_ids) == 1
    assert out.audio_codes == [] and len(out.audio) == 0 and out.audio_finish_reason == "stop"
    code, got = post(served, "/v1/chat/completions", {"messages": MSGS, "max_tokens": 8, "temperature": 0,
                                                      "stop_token_ids": list(range(vocab)),
                                                      "modalities": ["text", "audio"],
                                                      "audio": {"voice": "ethan", "format": "wav"}})
    assert code == 200 and got["choices"][0]["finish_reason"] == "stop"
    wave, rate = read_wav(base64.b64decode(got["choices"][0]["message"]["audio"]["data"]))
    assert len(wave) == 0 and rate == 24000
    assert wait_idle(served["engine"])


def test_a_cancelled_speech_stream_counts_as_an_abort_and_health_shows_the_talker(served, leak_oracle):
    """A /v1/audio/speech stream the client leaves was freed but counted nowhere (its finish_reason, 'stop'
    from the start, was kept); /health now shows the talker's pool too (found by the soak)."""
    import re

    engine = leak_oracle.watch(served["engine"])

    def aborts() -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{served['port']}/metrics", timeout=30) as r:
            found = re.search(r'^graphc_requests_total\{kind="t2s",status="abort"\} (\S+)$', r.read().decode(), re.M)
        return float(found.group(1)) if found else 0.0
    before = aborts()
    body = {"input": "the quick brown fox jumps over the lazy dog " * 4, "voice": "aiden", "response_format": "pcm",
            "stream_format": "sse", "seed": SEED, "max_frames": 400}
    with urllib.request.urlopen(request(served, "/v1/audio/speech", body), timeout=60) as s:
        assert s.status == 200                  # the headers, then the client leaves before the tiny talker ends
    assert wait_idle(engine)
    assert aborts() == before + 1
    with urllib.request.urlopen(f"http://127.0.0.1:{served['port']}/health", timeout=30) as r:
        h = json.loads(r.read())
    assert h["speaking"] == 0 and h["speech_free_pages"] == h["speech_pages"] == engine.speech.capacity
