"""WS /v1/realtime against a served tiny Qwen3-Omni with talker and Code2Wav (weights re-drawn so it speaks),
driven by the official openai client (GA client.realtime.connect, beta client.beta.realtime.connect) and by
raw websockets. The speech is a synthetic voiced signal (tests/unit/realtime_audio.py) that Silero takes for
speech; where VAD must place a turn is known from how the signal was built."""
import base64
import json
import time
import urllib.request
from types import SimpleNamespace

import numpy as np
import pytest

from graphc.runtime.engine import Engine
from graphc.serve.realtime.route import RealtimeLimits
from tests.unit.loopback import serve, tiny_omni
from tests.unit.realtime_audio import chunks, turn

openai = pytest.importorskip("openai")
websockets_sync = pytest.importorskip("websockets.sync.client")
SESSIONS = 3
SHORT = 4                     # max_output_tokens of the short answers
DELTAS = ("response.output_audio.delta", "response.output_audio_transcript.delta", "response.output_text.delta",
          "response.audio.delta", "response.audio_transcript.delta", "response.text.delta")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    d = tiny_omni(tmp_path_factory.mktemp("realtime"), speech=True)
    engine = Engine(d / "p.plan", checkpoint=d / "ckpt")
    server, port = serve(engine, realtime_limits=RealtimeLimits(max_sessions=SESSIONS, idle_s=60))
    yield SimpleNamespace(engine=engine, port=port, name=engine.model_name)
    server.should_exit = True


def client(s):
    # the beta client takes wss:// unless told the websocket's address
    return openai.OpenAI(base_url=f"http://127.0.0.1:{s.port}/v1", websocket_base_url=f"ws://127.0.0.1:{s.port}/v1",
                         api_key="none", max_retries=0)


def until(conn, last: str, limit: float = 120) -> list:
    """Events from the openai client's connection up to and including the first of type `last`."""
    out, t0 = [], time.time()
    while time.time() - t0 < limit:
        ev = conn.recv()
        out.append(ev)
        if ev.type == last:
            return out
    raise AssertionError(f"no {last} in {limit} s: {[e.type for e in out]}")


def raw(s, query: str = "", **kw):
    return websockets_sync.connect(f"ws://127.0.0.1:{s.port}/v1/realtime{query}", max_size=None, **kw)


def raw_until(ws, last: str, limit: float = 120) -> list[dict]:
    out, t0 = [], time.time()
    while time.time() - t0 < limit:
        ev = json.loads(ws.recv(timeout=limit))
        out.append(ev)
        if ev["type"] == last:
            return out
    raise AssertionError(f"no {last}: {[e['type'] for e in out]}")


def send(ws, kind: str, **fields) -> None:
    ws.send(json.dumps({"type": kind, **fields}))


def collapsed(types: list[str]) -> list[str]:
    """The event types with each run of one delta type shown once."""
    out = []
    for t in types:
        if not (out and out[-1] == t and t in DELTAS):
            out.append(t)
    return out


def pcm(deltas) -> np.ndarray:
    data = b"".join(base64.b64decode(d) for d in deltas)
    assert len(data) % 2 == 0
    return np.frombuffer(data, "<i2")


def post(s, path: str, body: dict) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{s.port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def get_json(s, path: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{s.port}{path}", timeout=30) as r:
        return json.loads(r.read())


def idle(s, timeout: float = 30) -> bool:
    """The engine idle with every page of both pools free, as /health and the scheduler tell."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        h = get_json(s, "/health")
        if h["running"] == h["waiting"] == h["speaking"] == 0 and h["free_pages"] == h["pages"] and \
                h["speech_free_pages"] == h["speech_pages"]:
            return s.engine.scheduler.pool_full()
        time.sleep(0.05)
    return False


def metric(s, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{s.port}/metrics", timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def aborted(s) -> float:
    """Engine requests that ended aborted, as /metrics counts them."""
    with urllib.request.urlopen(f"http://127.0.0.1:{s.port}/metrics", timeout=30) as r:
        return sum(float(line.rsplit(" ", 1)[1]) for line in r.read().decode().splitlines()
                   if line.startswith("graphc_requests_total{") and 'status="abort"' in line)


SPEECH_TURN = [
    "input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped", "input_audio_buffer.committed",
    "conversation.item.created", "response.created", "response.output_item.added", "conversation.item.created",
    "response.content_part.added"]
SPEECH_END = ["response.output_audio.done", "response.output_audio_transcript.done", "response.content_part.done",
              "response.output_item.done", "response.done"]


def test_server_vad_turn_gives_the_whole_sequence_with_decodable_audio(served):
    with client(served).realtime.connect(model=served.name) as conn:
        created = conn.recv()
        assert created.type == "session.created"
        vad = created.session.audio.input.turn_detection          # the defaults the API documents
        assert (vad.type, vad.threshold, vad.prefix_padding_ms, vad.silence_duration_ms) == ("server_vad", 0.5, 300, 500)
        conn.session.update(session={"type": "realtime", "max_output_tokens": SHORT, "temperature": 0})
        assert conn.recv().type == "session.updated"
        for c in chunks(turn(0.6, 1.5, 0.9)):          # speech from 600 ms to 2100 ms
            conn.input_audio_buffer.append(audio=c)
        evs = until(conn, "response.done")
    types = collapsed([e.type for e in evs])
    assert types[:len(SPEECH_TURN)] == SPEECH_TURN and types[-len(SPEECH_END):] == SPEECH_END
    assert set(types[len(SPEECH_TURN):-len(SPEECH_END)]) == {"response.output_audio.delta",
                                                              "response.output_audio_transcript.delta"}
    started, stopped, committed = evs[0], evs[1], evs[2]
    # the onset less the prefix padding, from the start of the first window found speech: a 32 ms window that
    # holds the onset starts less than 32 ms before it
    assert 600 - 32 - 300 < started.audio_start_ms <= 600 - 300 + 100
    assert 2100 + 500 - 50 <= stopped.audio_end_ms <= 2100 + 500 + 100   # the end plus the silence duration
    assert started.item_id == stopped.item_id == committed.item_id
    done = evs[-1].response
    assert done.status in ("completed", "incomplete") and done.usage.output_tokens > 0
    audio = pcm(e.delta for e in evs if e.type == "response.output_audio.delta")
    frames = done.usage.output_token_details.audio_tokens
    assert frames > 0 and len(audio) == served.engine.host.speech.vcfg.samples(frames)   # 24 kHz: the plan's rate
    transcript = "".join(e.delta for e in evs if e.type == "response.output_audio_transcript.delta")
    assert transcript == evs[-4].transcript == done.output[0].content[0].transcript
    assert metric(served, "graphc_realtime_first_audio_seconds_count") >= 1
    assert metric(served, "graphc_realtime_vad_seconds_total") > 0
    # each first audio's way there: every phase once, in the order the engine reaches them, the last its total
    series = 'graphc_realtime_first_audio_phase_seconds_%s{phase="%s"}'
    phase = {p: metric(served, series % ("sum", p))
             for p in ("prepared", "first_token", "follow_prompt", "first_frame", "first_audio", "sent")}
    counts = {metric(served, series % ("count", p)) for p in phase}
    assert counts == {metric(served, "graphc_realtime_first_audio_seconds_count")}, counts
    assert 0 < phase["prepared"] <= phase["first_token"] <= phase["follow_prompt"] <= phase["first_frame"] \
        <= phase["first_audio"] <= phase["sent"], phase
    assert phase["sent"] == pytest.approx(metric(served, "graphc_realtime_first_audio_seconds_sum")), phase
    assert idle(served)


def test_beta_manual_turn_speaks_beta_names_only(served):
    with client(served).beta.realtime.connect(model=served.name) as conn:
        created = conn.recv()
        assert created.type == "session.created" and created.session.modalities == ["text", "audio"]
        conn.session.update(session={"turn_detection": None, "max_response_output_tokens": SHORT, "voice": "aiden"})
        up = conn.recv()
        assert up.type == "session.updated" and up.session.turn_detection is None and up.session.voice == "aiden"
        for c in chunks(turn(0.3, 1.0, 0.3)):
            conn.input_audio_buffer.append(audio=c)
        conn.input_audio_buffer.commit()
        committed = until(conn, "conversation.item.created")
        assert [e.type for e in committed] == ["input_audio_buffer.committed", "conversation.item.created"]
        assert committed[1].item.content[0].type == "input_audio"
        for _ in range(3):        # the tiny talker samples: an answer whose first frame is its end code has no audio
            conn.response.create()
            evs = until(conn, "response.done")
            types = {e.type for e in evs}
            assert not any(t.startswith(("response.output_audio", "response.output_text")) for t in types)
            if evs[-1].response.usage.output_token_details.audio_tokens:
                break
    assert {"response.audio.delta", "response.audio_transcript.delta", "response.audio.done"} <= types
    assert evs[-1].response.status in ("completed", "incomplete")
    assert evs[-1].response.output[0].content[0].type == "audio"


def test_text_turn_answers_as_chat_does(served):
    c = client(served)
    want = c.chat.completions.create(model=served.name, messages=[{"role": "user", "content": "hello there"}],
                                     max_tokens=SHORT, temperature=0).choices[0].message.content
    with c.realtime.connect(model=served.name) as conn:
        conn.recv()
        conn.session.update(session={"type": "realtime", "temperature": 0})
        conn.recv()
        conn.conversation.item.create(item={"type": "message", "role": "user",
                                            "content": [{"type": "input_text", "text": "hello there"}]})
        assert conn.recv().type == "conversation.item.created"
        conn.response.create(response={"output_modalities": ["text"], "max_output_tokens": SHORT,
                                       "metadata": {"turn": "1"}})
        evs = until(conn, "response.done")
        conn.conversation.item.create(item={"type": "message", "role": "user",
                                            "content": [{"type": "input_text", "text": "and again"}]})
        conn.response.create(response={"output_modalities": ["text"], "max_output_tokens": SHORT,
                                       "instructions": "be brief"})
        second = until(conn, "response.done")[-1].response
    text = "".join(e.delta for e in evs if e.type == "response.output_text.delta")
    assert text == want and evs[-1].response.output[0].content[0].text == want
    assert not any("audio" in e.type for e in evs)
    done = evs[-1].response
    assert done.status == "incomplete" and done.status_details.reason == "max_output_tokens"
    assert done.usage.output_tokens == SHORT and done.metadata == {"turn": "1"}
    # the second turn reads the first, after its instructions: the chat template's prompt of the four messages
    turns = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}, {"role": "assistant", "content": want},
             {"role": "user", "content": "and again"}]
    assert second.usage.input_tokens == post(served, "/tokenize", {"messages": turns, "add_generation_prompt": True})["count"]



def test_a_later_turn_reuses_the_earlier_turns_pages(served):
    """The second response's prompt starts with the first's (the conversation so far): the prefix cache serves the
    full pages they share. Expected: the common prefix of the two prompts as /tokenize renders them, in whole pages."""
    page = served.engine.scheduler.kv.page_size
    first = "please count every pebble on the long grey beach " * 6
    c = client(served)
    with c.realtime.connect(model=served.name) as conn:
        conn.recv()
        conn.session.update(session={"type": "realtime", "temperature": 0})
        conn.recv()
        answers = []
        for text in (first, "and the shells?"):
            conn.conversation.item.create(item={"type": "message", "role": "user",
                                                "content": [{"type": "input_text", "text": text}]})
            assert conn.recv().type == "conversation.item.created"
            before = served.engine.stats()["prefix_cache"]["hit_rows"]
            conn.response.create(response={"output_modalities": ["text"], "max_output_tokens": SHORT})
            done = until(conn, "response.done")[-1].response
            answers.append((done.output[0].content[0].text, served.engine.stats()["prefix_cache"]["hit_rows"] - before))
    one = [{"role": "user", "content": first}]
    two = one + [{"role": "assistant", "content": answers[0][0]}, {"role": "user", "content": "and the shells?"}]
    p1, p2 = (post(served, "/tokenize", {"messages": m, "add_generation_prompt": True})["tokens"] for m in (one, two))
    common = next((i for i, (a, b) in enumerate(zip(p1, p2)) if a != b), min(len(p1), len(p2)))
    assert common >= 2 * page, (common, page)              # the test means something: whole pages in common
    assert answers[1][1] >= common // page * page and answers[1][1] < len(p2), (answers, common, len(p2))


def test_a_spoken_later_turn_takes_the_earlier_turns_pages_audio_included(served):
    """A spoken response's prompt starts with the earlier turns', the first turn's audio in them: the prefix cache
    serves their full pages, the talker's rows of that audio from the follow cache (graphc/runtime/follow_rows.py),
    and the audio encoder does not run again. Expected by hand: the second prompt repeats the first up to the
    first's closing `<|im_start|>assistant\n` (3 ids), in whole pages."""
    page = served.engine.scheduler.kv.page_size

    def counts():
        st = served.engine.stats()
        return st["prefix_cache"]["hit_rows"], st["prefix_cache"]["follow_rows"]["hit_rows"], \
            st["media_cache"]["audio_encoder"]["misses"]
    with client(served).realtime.connect(model=served.name) as conn:
        conn.recv()
        conn.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": None}},
                                     "max_output_tokens": SHORT, "temperature": 0})
        conn.recv()
        for c in chunks(turn(0.2, 1.2, 0.2)):
            conn.input_audio_buffer.append(audio=c)
        conn.input_audio_buffer.commit()
        until(conn, "conversation.item.created")
        conn.response.create()
        first = until(conn, "response.done")[-1].response
        before = counts()
        conn.conversation.item.create(item={"type": "message", "role": "user",
                                            "content": [{"type": "input_text", "text": "say it again"}]})
        conn.response.create()
        second = until(conn, "response.done")[-1].response
    assert first.output[0].content[0].type == second.output[0].content[0].type == "output_audio"
    after = counts()
    shared = (first.usage.input_tokens - 3) // page * page
    assert shared >= page and after[0] - before[0] >= shared, (before, after, shared)
    assert after[1] > before[1] and after[2] == before[2], (before, after)
    assert metric(served, "graphc_follow_cache_hits_total") == after[1]          # /metrics shows it

def speak_text(ws, text: str = "tell me a long story", **response) -> None:
    """A text turn answered greedily (the answer, and whether it speaks, then do not hang on what ran before)."""
    send(ws, "conversation.item.create", item={"type": "message", "role": "user",
                                               "content": [{"type": "input_text", "text": text}]})
    send(ws, "response.create", response={"temperature": 0, **response})


def until_audio(ws, tries: int = 3) -> list[dict]:
    """Events up to a response's first audio delta; a response done without audio (the tiny talker's first sampled
    code can be its end code) is asked for again."""
    out = []
    for _ in range(tries):
        while True:
            out.append(json.loads(ws.recv(timeout=120)))
            if out[-1]["type"] == "response.output_audio.delta":
                return out
            if out[-1]["type"] == "response.done":
                assert out[-1]["response"]["usage"]["output_token_details"]["audio_tokens"] == 0, out[-1]
                send(ws, "response.create", response={"temperature": 0})
                break
    raise AssertionError(f"no audio in {tries} responses: {[e['type'] for e in out]}")


def test_cancel_leaves_no_delta_after_response_done(served):
    before = aborted(served)
    with raw(served) as ws:
        raw_until(ws, "session.created")
        speak_text(ws)
        until_audio(ws)
        send(ws, "response.cancel")
        evs = raw_until(ws, "response.done")
        done = evs[-1]["response"]
        assert done["status"] == "cancelled" and done["status_details"]["reason"] == "client_cancelled"
        send(ws, "response.cancel")                       # nothing in progress now: an error, the session goes on
        later = raw_until(ws, "error", limit=5)
        assert not any(e["type"] in DELTAS for e in later) and later[-1]["error"]["code"] == "response_cancel_not_active"
    assert idle(served) and aborted(served) == before + 1          # the engine's request was aborted, not finished


def test_barge_in_cancels_the_answer_and_answers_the_new_speech(served):
    before = aborted(served)
    with raw(served) as ws:
        raw_until(ws, "session.created")
        for c in chunks(turn(0.3, 1.0, 0.7)):
            send(ws, "input_audio_buffer.append", audio=c)
        first = raw_until(ws, "response.output_audio.delta")
        first_id = first[-1]["response_id"]
        audio2 = chunks(turn(0.2, 1.2, 0.8))
        for i, c in enumerate(audio2):
            send(ws, "input_audio_buffer.append", audio=c)
            if i == len(audio2) // 2:                 # while the new speech goes on: shorter answers from now
                send(ws, "session.update", session={"max_output_tokens": SHORT})
        evs = raw_until(ws, "response.done")
        while not (evs[-1]["type"] == "response.done" and evs[-1]["response"]["id"] != first_id):
            evs += raw_until(ws, "response.done")
    types = [e["type"] for e in evs]
    started = types.index("input_audio_buffer.speech_started")
    cancelled = next(i for i, e in enumerate(evs) if e["type"] == "response.done" and e["response"]["id"] == first_id)
    assert started < cancelled
    status = evs[cancelled]["response"]
    assert status["status"] == "cancelled" and status["status_details"]["reason"] == "turn_detected"
    assert not any(e.get("response_id") == first_id for e in evs[cancelled:])       # nothing of it after its done
    second = evs[-1]["response"]
    assert second["status"] in ("completed", "incomplete") and types.index("input_audio_buffer.speech_stopped") > cancelled
    # the new speech's answer: an assistant item of its own (its audio, if any, depends on where the first was cut)
    assert "response.output_item.added" in types[cancelled:] and second["output"]
    assert idle(served) and aborted(served) >= before + 1


def test_vad_runs_off_the_event_loop(served, monkeypatch):
    """Silero's windows run in threads of their own, so that many sessions' VAD never holds the server's loop:
    every window a session's two states read, read where no event loop runs."""
    import asyncio

    from graphc.serve.realtime import vad

    seen, make = [], vad.new_model

    class Watched:
        def __init__(self, model):
            self.model = model

        def process(self, window):
            try:
                asyncio.get_running_loop()
                seen.append("loop")
            except RuntimeError:
                seen.append("thread")
            return self.model.process(window)
    monkeypatch.setattr(vad, "new_model", lambda: tuple(Watched(m) for m in make()))
    with raw(served) as ws:
        raw_until(ws, "session.created")
        send(ws, "session.update", session={"max_output_tokens": SHORT})
        for c in chunks(turn(0.3, 0.8, 0.7)):
            send(ws, "input_audio_buffer.append", audio=c)
        raw_until(ws, "response.done")
    assert len(seen) > 100 and set(seen) == {"thread"}, f"{seen.count('loop')} of {len(seen)} windows on the loop"
    assert idle(served)


def test_truncate_cuts_the_spoken_item(served):
    with raw(served) as ws:
        raw_until(ws, "session.created")
        speak_text(ws, "hi", max_output_tokens=SHORT)
        evs = raw_until(ws, "response.done")
        item = evs[-1]["response"]["output"][0]["id"]
        ms = len(pcm(e["delta"] for e in evs if e["type"] == "response.output_audio.delta")) * 1000 // 24000
        send(ws, "conversation.item.truncate", item_id=item, content_index=0, audio_end_ms=ms + 1)
        bad = raw_until(ws, "error")[-1]["error"]
        assert bad["param"] == "audio_end_ms" and f"{ms} ms" in bad["message"]
        send(ws, "conversation.item.truncate", item_id=item, content_index=0, audio_end_ms=ms // 2)
        cut = raw_until(ws, "conversation.item.truncated")[-1]
        assert (cut["item_id"], cut["content_index"], cut["audio_end_ms"]) == (item, 0, ms // 2)
        send(ws, "conversation.item.retrieve", item_id=item)
        got = raw_until(ws, "conversation.item.retrieved")[-1]["item"]
        assert got["content"][0]["transcript"] == ""        # the transcript goes with the unheard audio


def test_partial_session_update_keeps_vad_on_and_a_bad_one_changes_nothing(served):
    with raw(served) as ws:
        raw_until(ws, "session.created")
        send(ws, "session.update", session={"audio": {"input": {"turn_detection": {"threshold": 0.6}},
                                                      "output": {"voice": "aiden"}}, "max_output_tokens": SHORT})
        raw_until(ws, "session.updated")
        send(ws, "session.update", session={"audio": {"input": {"turn_detection": {"silence_duration_ms": 800}}}})
        audio = raw_until(ws, "session.updated")[-1]["session"]["audio"]
        vad = audio["input"]["turn_detection"]           # what the first update set is kept
        assert (vad["type"], vad["threshold"], vad["prefix_padding_ms"], vad["silence_duration_ms"]) == \
            ("server_vad", 0.6, 300, 800) and audio["output"]["voice"] == "aiden"
        send(ws, "session.update", session={"instructions": "be brief",
                                            "audio": {"input": {"turn_detection": {"threshold": 2}}}})
        assert raw_until(ws, "error")[-1]["error"]["param"].endswith("threshold")
        send(ws, "session.update", session={})
        after = raw_until(ws, "session.updated")[-1]["session"]
        assert after["instructions"] == "" and after["audio"]["input"]["turn_detection"] == vad
        for c in chunks(turn(0.4, 1.0, 1.2)):          # speech 400..1400 ms
            send(ws, "input_audio_buffer.append", audio=c)
        stopped = raw_until(ws, "input_audio_buffer.speech_stopped")[-1]
        assert 1400 + 800 - 50 <= stopped["audio_end_ms"] <= 1400 + 800 + 100
        raw_until(ws, "response.done")


def test_bad_frames_get_errors_and_the_session_goes_on(served):
    with raw(served) as ws:
        raw_until(ws, "session.created")
        for bad in ("{not json", "[" * 100_000):          # not JSON; nested past what a parser follows
            ws.send(bad)
            assert json.loads(ws.recv())["error"]["code"] == "invalid_json"
        send(ws, "no.such.event")
        err = json.loads(ws.recv())["error"]
        assert err["code"] == "unknown_event" and "no.such.event" in err["message"]
        send(ws, "input_audio_buffer.append", audio="%%%")
        assert json.loads(ws.recv())["error"]["param"] == "audio"
        send(ws, "input_audio_buffer.append", audio="AAAA", extra=1)
        assert json.loads(ws.recv())["error"]["param"] == "extra"
        send(ws, "input_audio_buffer.commit")                      # nothing buffered: too little to commit
        assert "at least 100 ms" in json.loads(ws.recv())["error"]["message"]
        send(ws, "session.update", session={"audio": {"output": {"voice": "nobody"}}})
        err = json.loads(ws.recv())["error"]
        assert err["param"] == "session.audio.output.voice" and "aiden, chelsie, ethan" in err["message"]
        send(ws, "response.create", response={"metadata": {"k": 1}})
        assert json.loads(ws.recv())["error"]["param"] == "response.metadata"
        send(ws, "input_audio_buffer.clear")
        assert json.loads(ws.recv())["type"] == "input_audio_buffer.cleared"


def test_abrupt_close_leaks_nothing(served):
    before = aborted(served)
    ws = raw(served).__enter__()
    raw_until(ws, "session.created")
    speak_text(ws)
    until_audio(ws)
    ws.socket.close()                                  # no close frame: the client is gone
    assert idle(served) and aborted(served) == before + 1
    t0 = time.time()
    while metric(served, "graphc_realtime_sessions_open") and time.time() - t0 < 10:
        time.sleep(0.05)
    assert metric(served, "graphc_realtime_sessions_open") == 0


def test_sessions_past_the_limit_are_closed_1013_and_unknown_models_1008(served):
    from websockets.exceptions import ConnectionClosed

    opened = [raw(served).__enter__() for _ in range(SESSIONS)]
    try:
        for ws in opened:
            raw_until(ws, "session.created")
        with raw(served) as extra:
            assert "full" in json.loads(extra.recv())["error"]["message"]
            with pytest.raises(ConnectionClosed) as closed:
                extra.recv()
            assert closed.value.rcvd.code == 1013
    finally:
        for ws in opened:
            ws.close()
    time.sleep(0.3)
    with raw(served, "?model=nope") as ws:
        assert "nope" in json.loads(ws.recv())["error"]["message"]
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv()
        assert closed.value.rcvd.code == 1008


def test_transcription_session_transcribes_and_makes_no_response(served):
    with client(served).realtime.connect(model=served.name, extra_query={"intent": "transcription"}) as conn:
        created = conn.recv()
        assert created.type == "session.created" and created.session.type == "transcription"
        for c in chunks(turn(0.4, 1.0, 0.8)):
            conn.input_audio_buffer.append(audio=c)
        evs = until(conn, "conversation.item.input_audio_transcription.completed")
        conn.response.create()
        refused = until(conn, "error")
    types = [e.type for e in evs]
    assert types[:4] == ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
                         "input_audio_buffer.committed", "conversation.item.created"]
    assert not any(t.startswith("response.") for t in types + [e.type for e in refused])
    deltas = "".join(e.delta for e in evs if e.type == "conversation.item.input_audio_transcription.delta")
    assert evs[-1].transcript == deltas and evs[-1].item_id == evs[2].item_id and evs[-1].usage.input_tokens > 0
    assert "transcription session" in refused[-1].error.message


def test_api_key_is_checked_at_the_upgrade():
    from starlette.applications import Starlette
    from starlette.routing import WebSocketRoute
    from starlette.testclient import TestClient
    from starlette.websockets import WebSocketDisconnect

    from graphc.serve.middleware import ApiKey

    async def echo(ws):
        await ws.accept()
        await ws.send_text("in")
        await ws.close()
    app = ApiKey(Starlette(routes=[WebSocketRoute("/v1/realtime", echo)]), key="sekret")
    tc = TestClient(app)
    with tc.websocket_connect("/v1/realtime", headers={"Authorization": "Bearer sekret"}) as ws:
        assert ws.receive_text() == "in"
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        with pytest.raises(WebSocketDisconnect) as refused:
            with tc.websocket_connect("/v1/realtime", headers=headers):
                pass
        assert refused.value.code == 1008


def test_image_item_is_seen_by_the_answer(served):
    import io

    from PIL import Image

    png = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 30, 30)).save(png, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()
    with raw(served) as ws:
        raw_until(ws, "session.created")
        send(ws, "conversation.item.create", item={"type": "message", "role": "user", "content": [
            {"type": "input_image", "image_url": url}, {"type": "input_text", "text": "what is it?"}]})
        item = raw_until(ws, "conversation.item.created")[-1]["item"]
        assert [p["type"] for p in item["content"]] == ["input_image", "input_text"]
        send(ws, "response.create", response={"output_modalities": ["text"], "max_output_tokens": SHORT})
        done = raw_until(ws, "response.done")[-1]["response"]
        send(ws, "conversation.item.create", item={"type": "message", "role": "user", "content": [
            {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]})
        bad = raw_until(ws, "error")[-1]["error"]
    text_only = post(served, "/tokenize", {"messages": [{"role": "user", "content": "what is it?"}],
                                           "add_generation_prompt": True})["count"]
    assert done["status"] in ("completed", "incomplete") and done["usage"]["input_tokens"] > text_only
    assert bad["param"] == "item.content[0].image_url" and bad["message"].startswith("item.content[0].image_url")



def test_an_idle_session_is_closed():
    """A session with no client event and nothing generating for idle_s seconds is closed (1000), after an error
    event saying so (no engine needed: nothing is generated)."""
    import asyncio

    from prometheus_client import CollectorRegistry

    from graphc.runtime.inputs import Limits
    from graphc.serve.realtime.connection import Connection
    from graphc.serve.realtime.metrics import RealtimeMetrics
    from graphc.serve.realtime.protocol import Wire
    from graphc.serve.realtime.session import new_config

    class Socket:
        sent, closed = [], None

        async def receive(self):
            await asyncio.sleep(3600)

        async def send_text(self, text):
            self.sent.append(json.loads(text))

        async def close(self, code, reason):
            self.closed = (code, reason)

    ws = Socket()
    ctx = SimpleNamespace(limits=Limits(audio_seconds=30.0))
    conn = Connection(ws, ctx, Wire(False), new_config("sess_1", "m", None, False, False),
                      RealtimeMetrics(CollectorRegistry()), None, 0.2, ())
    t0 = time.time()
    asyncio.run(asyncio.wait_for(conn.run(), 10))
    assert ws.closed == (1000, "idle for 0.2 s") and 0.2 <= time.time() - t0 < 5
    assert [e["type"] for e in ws.sent] == ["session.created", "error"] and ws.sent[1]["error"]["code"] == "session_closed"


def test_the_input_buffer_holds_what_a_prompt_holds(served):
    most = served.engine.media_limits().audio_seconds             # the plan's longest audio
    with raw(served) as ws:
        raw_until(ws, "session.created")
        send(ws, "session.update", session={"audio": {"input": {"turn_detection": None}}})
        raw_until(ws, "session.updated")
        half = np.zeros(int(most * 24000 / 2) + 24000, np.float32)      # two of these are over the limit
        send(ws, "input_audio_buffer.append", audio=chunks(half, ms=10 ** 6)[0])
        send(ws, "input_audio_buffer.append", audio=chunks(half, ms=10 ** 6)[0])
        err = raw_until(ws, "error")[-1]["error"]
        assert err["param"] == "audio" and f"at most {most:.1f} s" in err["message"]
        send(ws, "input_audio_buffer.commit")                       # what fitted is committed
        committed = raw_until(ws, "conversation.item.created")
        assert committed[0]["type"] == "input_audio_buffer.committed"


def test_resampling_keeps_the_pitch_and_pcm16_is_checked():
    """A 440 Hz tone streamed in 20 ms chunks from 24 kHz to 16 kHz is still 440 Hz (numpy's FFT) and two thirds
    as long; odd bytes or bad base64 are refused by name."""
    from graphc.errors import InvalidInput
    from graphc.serve.realtime.audio import Resampler, decode_pcm16, encode_pcm16

    tone = np.sin(2 * np.pi * 440 * np.arange(24000) / 24000).astype(np.float32)
    down = Resampler(24000, 16000)
    out = np.concatenate([down(tone[i:i + 480]) for i in range(0, 24000, 480)] + [down(np.zeros(0), last=True)])
    assert len(out) == 16000
    assert np.argmax(np.abs(np.fft.rfft(out))) * 16000 / len(out) == 440
    back = decode_pcm16(encode_pcm16(tone))
    assert np.abs(back - tone).max() <= 2 / 32767          # 16-bit steps: written x 32767, read / 32768
    for bad in ("AAAA", "%%%", 7):             # 3 bytes: half a sample over; not base64; not a string
        with pytest.raises(InvalidInput):
            decode_pcm16(bad)


def test_beta_fields_read_as_ga_ones():
    from graphc.serve.realtime.protocol import Wire

    got = Wire(True).fields_in({"modalities": ["text", "audio"], "voice": "aiden", "input_audio_format": "pcm16",
                                "turn_detection": None, "max_response_output_tokens": 5, "instructions": "x"})
    assert got == {"output_modalities": ["audio"], "instructions": "x", "max_output_tokens": 5,
                   "audio": {"output": {"voice": "aiden"},
                             "input": {"format": {"type": "audio/pcm", "rate": 24000}, "turn_detection": None}}}
    assert Wire(False).event("response.output_audio.delta")["type"] == "response.output_audio.delta"
    assert Wire(True).event("response.output_audio.delta")["type"] == "response.audio.delta"
