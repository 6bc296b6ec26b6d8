"""POST /v1/audio/transcriptions on a tiny Qwen3-ASR checkpoint (transformers' layout, every weight re-drawn),
driven by the official `openai` client on loopback: each response format and the stream give the text the
engine gives offline for the same prompt (after Qwen3-ASR's header is stripped), and what is refused."""
import socket
import time

import numpy as np
import pytest
import soundfile as sf

from examples.make_tiny_checkpoint import TEMPLATE, asr_model, build_tokenizer, save
from graphc.cli import main
from graphc.runtime.engine import Engine
from graphc.serve.default_transcription import DefaultTranscription
from graphc.serve.transcriptions import output_cap
from models.components.asr_transcription import AsrStream, AsrTranscription, split_asr
from tests.parity.weights import randomize
from tests.unit.loopback import serve

openai = pytest.importorskip("openai")
pytest.importorskip("multipart")

LIMIT = 200_000                     # bytes: the 2 s clip (64 KB) passes, a 10 s one does not


def tiny_asr(d) -> Engine:
    """A tiny Qwen3-ASR checkpoint under d (every weight re-drawn), planned, booted."""
    save(randomize(asr_model(build_tokenizer()), seed=1), build_tokenizer(), d / "ckpt")
    assert main(["plan", "models/qwen3_asr.py", "--preset", "tiny", "--checkpoint", str(d / "ckpt"), "--gpu", "cpu",
                 "-o", str(d / "p.plan"), "-q"]) == 0
    return Engine(d / "p.plan", checkpoint=d / "ckpt")


def wait_idle(engine, timeout=5.0):
    t = time.time()
    while not engine.scheduler.idle() and time.time() - t < timeout:
        time.sleep(0.01)
    return engine.scheduler.idle() and engine.scheduler.pool_full()


CONTEXT = "the quick brown fox"


def offline(engine, wav, context: str = "", language: str | None = None):
    """What the engine generates for the clip with Qwen3-ASR's prompt, written out here: (text, token ids)."""
    cap = 64 + 30 * 2                                       # the 2 s clip's output cap
    if language is None:
        item = {"messages": [{"role": "system", "content": context},
                             {"role": "user", "content": [{"type": "audio", "path": str(wav)}]}]}
    else:                                                   # forced as qwen_asr forces it: after the generation prompt
        prompt = (f"<|im_start|>system\n{context}<|im_end|>\n<|im_start|>user\n"
                  f"<|audio_start|><|audio_pad|><|audio_end|><|im_end|>\n<|im_start|>assistant\n"
                  f"language {language}<asr_text>")
        item = {"prompt": prompt, "media": [{"type": "audio", "path": str(wav)}]}
    out = engine.generate([{**item, "temperature": 0, "max_tokens": cap}])[0]
    assert out.error is None, out.error
    return out.text, out.token_ids


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    d = tmp_path_factory.mktemp("transcribe")
    engine, wav = tiny_asr(d), d / "ckpt" / "sample.wav"
    want = {"plain": offline(engine, wav), "context": offline(engine, wav, CONTEXT, "English")}   # before serving
    server, port = serve(engine, max_audio_bytes=LIMIT)
    t = np.arange(16000 * 10) / 16000
    sf.write(d / "long.wav", (0.2 * np.sin(2 * np.pi * 300 * t)).astype(np.float32), 16000)      # 320 KB
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=60)
    yield dict(engine=engine, want=want, client=client, dir=d, port=port, wav=wav)
    server.should_exit = True


def test_json_text_and_verbose_json_give_the_engines_text(served):
    c, name = served["client"], served["engine"].plan.model.name
    raw, ids = served["want"]["plain"]
    want = split_asr(raw)[1]
    assert want.strip()                                     # the re-drawn weights say something
    r = c.audio.transcriptions.create(model=name, file=open(served["wav"], "rb"))
    assert r.text == want
    assert r.usage.type == "tokens" and r.usage.output_tokens == len(ids)
    assert r.usage.input_tokens == r.usage.input_token_details.audio_tokens + r.usage.input_token_details.text_tokens
    ids_ = served["engine"].tokenize([{"role": "system", "content": ""}, {"role": "user", "content": [{"type": "audio"}]}])
    assert r.usage.input_token_details.text_tokens == len(ids_) - 1      # the placeholder became the audio's rows
    assert c.audio.transcriptions.create(model=name, file=open(served["wav"], "rb"), response_format="text") == want
    v = c.audio.transcriptions.create(model=name, file=open(served["wav"], "rb"), response_format="verbose_json")
    assert v.text == want and v.duration == pytest.approx(2.0) and v.language == ""
    seg = v.segments[0]
    assert len(v.segments) == 1 and seg.tokens == ids and seg.end == pytest.approx(2.0) and seg.avg_logprob < 0
    assert v.usage.type == "duration" and v.usage.seconds == pytest.approx(2.0)
    assert wait_idle(served["engine"])


def test_streamed_deltas_join_to_the_done_text(served):
    c, name = served["client"], served["engine"].plan.model.name
    raw, ids = served["want"]["plain"]
    events = list(c.audio.transcriptions.create(model=name, file=open(served["wav"], "rb"), stream=True))
    deltas = [e for e in events if e.type == "transcript.text.delta"]
    assert [e.type for e in events[len(deltas):]] == ["transcript.text.done"] and len(deltas) > 1
    assert "".join(e.delta for e in deltas) == events[-1].text == split_asr(raw)[1]
    assert events[-1].usage.output_tokens == len(ids)
    assert wait_idle(served["engine"])


def test_prompt_and_language_reach_the_model(served):
    c, name = served["client"], served["engine"].plan.model.name
    plain = split_asr(served["want"]["plain"][0])[1]
    raw, _ = served["want"]["context"]
    want = split_asr(raw, "English")[1]
    assert want != plain
    v = c.audio.transcriptions.create(model=name, file=open(served["wav"], "rb"), prompt=CONTEXT,
                                      language="en", response_format="verbose_json")
    assert v.text == want and v.language == "english"
    events = list(c.audio.transcriptions.create(model=name, file=open(served["wav"], "rb"), stream=True,
                                                prompt=CONTEXT, language="en"))
    assert "".join(e.delta for e in events[:-1]) == events[-1].text == want
    assert wait_idle(served["engine"])


def test_split_asr_strips_qwen3_asr_header():
    assert split_asr("language English<asr_text>hello world") == ("English", "hello world")
    assert split_asr("  language chinese<asr_text> 你好 \n") == ("Chinese", "你好")
    assert split_asr("language None<asr_text>") == ("", "")
    assert split_asr("language English\nmore\n<asr_text>hi") == ("English", "hi")
    assert split_asr("hello <asr_text> there") == ("", "hello <asr_text> there")     # no header: all text
    assert split_asr("language English with no tag") == ("", "language English with no tag")
    assert split_asr("  hi there ", forced="German") == ("German", "hi there")


@pytest.mark.parametrize("raw", ["language English<asr_text>hello world  ", " language English<asr_text> a b\n",
                                 "langu", "language Eng no tag", "plain text  here ", "la<asr_text>x",
                                 "language None<asr_text>", "  \n "])
def test_streamed_pieces_join_to_split_asr_at_every_cut(raw):
    for forced in (None, "English"):
        for cut in range(len(raw) + 1):
            for pieces in ([raw[:cut], raw[cut:]], list(raw)):
                s = AsrStream(forced)
                out = "".join(s.add(p, last=i == len(pieces) - 1) for i, p in enumerate(pieces))
                assert out == s.text == split_asr(raw, forced)[1], (raw, forced, pieces)
                assert s.language == split_asr(raw, forced)[0]


def test_other_models_are_asked_to_transcribe_and_the_cap_leaves_room():
    from graphc.runtime.chat import ChatTemplate

    t = ChatTemplate(TEMPLATE)
    omni = DefaultTranscription().prompt(t, "names: Ada", "English")
    assert omni == ("<|im_start|>system\nnames: Ada<|im_end|>\n<|im_start|>user\n<|audio_start|><|audio_pad|>"
                    "<|audio_end|>Transcribe the English audio into text.<|im_end|>\n<|im_start|>assistant\n")
    assert "system" not in DefaultTranscription().prompt(t, "", None)
    assert AsrTranscription().prompt(t, "", "French").endswith("<|im_start|>assistant\nlanguage French<asr_text>")
    assert output_cap("x" * 50, 2.0, 2048) == 124
    assert output_cap("x" * 50, 60.0, 2048) is None         # 60 s may fill the plan: the engine decides


def post(port: int, body, headers: dict) -> tuple[int, dict]:
    """A raw POST to the route (a generator body goes chunked, without Content-Length)."""
    import http.client
    import json

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("POST", "/v1/audio/transcriptions", body=body, headers=headers,
                 encode_chunked=not isinstance(body, bytes))
    r = conn.getresponse()
    out = r.status, json.loads(r.read())
    conn.close()
    return out


def test_refusals(served):
    c, name, wav = served["client"], served["engine"].plan.model.name, served["wav"]
    with pytest.raises(openai.APIStatusError, match="over 200,000 bytes") as e:
        c.audio.transcriptions.create(model=name, file=open(served["dir"] / "long.wav", "rb"))
    assert e.value.status_code == 413

    with socket.create_connection(("127.0.0.1", served["port"]), timeout=10) as sock:     # refused from its header
        sock.sendall(b"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\nContent-Length: 900000000\r\n"
                     b"Content-Type: multipart/form-data; boundary=b\r\n\r\n")
        assert sock.recv(100).startswith(b"HTTP/1.1 413")                             # before any byte of it

    def chunks():                                    # no Content-Length: counted as it arrives
        yield b"--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\r\n"
        for _ in range(40):
            yield b"\0" * 10_000
    status, body = post(served["port"], chunks(), {"content-type": "multipart/form-data; boundary=b"})
    assert status == 413 and body["error"]["param"] == "file"
    with pytest.raises(openai.NotFoundError, match="not served here") as e:
        c.audio.transcriptions.create(model="whisper-1", file=open(wav, "rb"))
    assert e.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError, match="json, text, verbose_json"):
        c.audio.transcriptions.create(model=name, file=open(wav, "rb"), response_format="srt")
    with pytest.raises(openai.BadRequestError, match="unknown field 'bogus'"):
        c.audio.transcriptions.create(model=name, file=open(wav, "rb"), extra_body={"bogus": "1"})
    with pytest.raises(openai.BadRequestError, match="timestamp_granularities"):
        c.audio.transcriptions.create(model=name, file=open(wav, "rb"), timestamp_granularities=["word"])
    with pytest.raises(openai.BadRequestError, match="temperature"):
        c.audio.transcriptions.create(model=name, file=open(wav, "rb"), temperature=1.5)
    with pytest.raises(openai.BadRequestError, match="language 'xx'"):
        c.audio.transcriptions.create(model=name, file=open(wav, "rb"), language="xx")
    with pytest.raises(openai.BadRequestError, match="does not decode"):
        c.audio.transcriptions.create(model=name, file=("a.wav", b"not audio at all"))
    status, body = post(served["port"], b'{"model": "x"}', {"content-type": "application/json"})
    assert status == 400 and "multipart/form-data" in body["error"]["message"]
    assert wait_idle(served["engine"])


def test_a_plan_that_takes_no_audio_says_so(served, monkeypatch):
    monkeypatch.setattr(served["engine"], "kinds", lambda: ["t2t"])
    with pytest.raises(openai.BadRequestError, match="takes no audio"):
        served["client"].audio.transcriptions.create(model=served["engine"].plan.model.name,
                                                     file=open(served["wav"], "rb"))
