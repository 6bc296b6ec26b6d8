"""Speaking requests overlap the host's work with the device (graphc/runtime/flight.py, graphc/runtime/speech.py),
on a tiny Qwen3-Omni with talker and Code2Wav (examples/make_tiny_checkpoint.py omni-speech, weights re-drawn)
planned for the CPU: the LLM's steps with speaking rows stay in flight, and each talker step launches before the
one before it is read back; text, codes and audio equal an engine's that reads every step at once (greedy and
seeded sampling, requests of different lengths arriving at different steps, a talker that ends itself with its end
code read one step late, a text that stops on a token read while its next row is in flight); an abort while a speaking request's token or frame is in flight leaves the others as
they were and every pool whole."""
import numpy as np
import pytest

from graphc.runtime.engine import Engine
from graphc.runtime.flight import Flight
from graphc.runtime.sampler import SamplingParams
from graphc.runtime.speech import SpeechLane, SpeechParams
from tests.parity.speaking import serve_all, speaking_omni

TEXT = 8


def msgs(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


HELLO = msgs("hello world, how are you today?")


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    _, _, plan, ckpt = speaking_omni(tmp_path_factory.mktemp("speech_overlap"), redraw_code2wav=True)
    return {o: Engine(plan, checkpoint=ckpt, overlap=o) for o in (True, False)}


serve = serve_all


def rel(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def greedy(n: int = TEXT) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n)


LOAD = [(HELLO, greedy(), SpeechParams(voice="chelsie", max_frames=30, temperature=0, repetition_penalty=1.0)),
        (HELLO, greedy(), SpeechParams(voice="ethan", max_frames=12, temperature=0)),
        (msgs("tell me a story"), SamplingParams(temperature=0.8, seed=3, max_tokens=10),
         SpeechParams(voice="aiden", max_frames=25, seed=5)),
        (msgs("what is in the image"), greedy(6), None),
        (HELLO, greedy(5), SpeechParams(max_frames=20, seed=11, first_chunk=2)),
        (msgs("say something short"), SamplingParams(temperature=0.7, seed=9, max_tokens=12),
         SpeechParams(max_frames=16, seed=2, temperature=0.9, top_k=20))]
ARRIVALS = [0, 1, 1, 3, 6, 9]


def test_speaking_requests_equal_reading_every_step_at_once(engines, monkeypatch):
    emitted = {o: {} for o in engines}
    real = SpeechLane._launch_follow

    def launch(lane, step):                        # frames each request's talker steps sampled, read or void
        flight = real(lane, step)
        for r in flight.emit if flight is not None else ():
            counts = emitted[lane.overlap]
            counts[r.id] = counts.get(r.id, 0) + 1
        return flight
    monkeypatch.setattr(SpeechLane, "_launch_follow", launch)
    story = serve(engines[False], [(msgs("tell me a story"), greedy(12), None)], [0])[0].token_ids
    k = next(k for k in range(4, len(story)) if story[k] not in story[:k])
    stop = SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[story[k]])     # read with its next row in flight
    load = LOAD + [(msgs("tell me a story"), stop, SpeechParams(voice="ethan", max_frames=20, temperature=0))]
    got = {o: serve(engines[o], load, ARRIVALS + [2]) for o in engines}
    assert got[True][-1].token_ids == story[:k + 1] and got[True][-1].finish_reason == "stop"
    reasons = set()
    for a, b in zip(got[True], got[False]):
        assert (a.token_ids, a.text, a.finish_reason) == (b.token_ids, b.text, b.finish_reason), a.id
        assert all(t >= 0 for t in a.token_ids)
        assert (a.audio_codes, a.audio_finish_reason) == (b.audio_codes, b.audio_finish_reason), a.id
        if b.audio is None:
            assert a.audio is None
            continue
        # the same chunks of the same frames (Code2Wav may batch them with other requests' chunks at other steps)
        assert a.audio.shape == b.audio.shape and rel(a.audio, b.audio) < 1e-5, (a.id, rel(a.audio, b.audio))
        reasons.add(a.audio_finish_reason)
        # the end code is sampled but is no frame; read one step late, the frame after it is sampled too (void)
        extra = {"stop": 1, "length": 0}[a.audio_finish_reason]
        assert emitted[False][b.id] == len(b.audio_codes) + extra
        assert emitted[True][a.id] == len(a.audio_codes) + 2 * extra, a.id        # max_frames: no frame past it
    assert reasons == {"stop", "length"}           # weights seed 3: chelsie's greedy talker ends itself (frame 18)
    assert len({len(o.audio_codes) for o in got[True] if o.audio is not None}) >= 4


def reads_at_once(engine, monkeypatch, items, arrivals) -> dict:
    """Steps with a speaking row launched and read back, by stage, and those read before any next step of their
    stage launched (a host sync with nothing queued behind it)."""
    log = {"llm": [], "follow": []}
    launch, read = Flight.launch.__func__, Flight.read
    launch_f, read_f = SpeechLane._launch_follow, SpeechLane.read_follow

    def llm_launch(cls, rows, sampled):
        flight = launch(cls, rows, sampled)
        if any(r.speech is not None for r, _ in rows):
            log["llm"].append(("launch", flight))
        return flight

    def llm_read(flight):
        log["llm"].append(("read", flight))
        return read(flight)

    def follow_launch(lane, step):
        flight = launch_f(lane, step)
        if flight is not None:
            log["follow"].append(("launch", flight))
        return flight

    def follow_read(lane):
        log["follow"].append(("read", lane.inflight))
        return read_f(lane)
    monkeypatch.setattr(Flight, "launch", classmethod(llm_launch))
    monkeypatch.setattr(Flight, "read", llm_read)
    monkeypatch.setattr(SpeechLane, "_launch_follow", follow_launch)
    monkeypatch.setattr(SpeechLane, "read_follow", follow_read)
    serve(engine, items, arrivals)
    out = {}
    for stage, events in log.items():
        at = {id(f): i for i, (k, f) in enumerate(events) if k == "launch"}       # each flight is kept in the log
        reads = [(i, at[id(f)]) for i, (k, f) in enumerate(events) if k == "read" and id(f) in at]
        at_once = sum(1 for i, j in reads if not any(k == "launch" for k, _ in events[j + 1:i]))
        out[stage] = (len(at), len(reads), at_once)
    return out


def test_the_next_step_launches_before_a_speaking_steps_tokens_and_codes_are_read(engines, monkeypatch):
    """Each LLM step with a speaking row and each talker step stays in flight while the next one is built:
    only a stage's last step (nothing to launch after it) and a talker step whose frames complete a chunk are read
    at once; reading every step at once (overlap off) reads each one before the next."""
    items = [(HELLO, greedy(TEXT), SpeechParams(voice="ethan", max_frames=30, temperature=0))]
    on = reads_at_once(engines[True], monkeypatch, items, [0])
    off = reads_at_once(engines[False], monkeypatch, items, [0])
    llm, follow = on["llm"], on["follow"]
    assert llm[0] == llm[1] == TEXT and follow[0] == follow[1] == 30
    assert llm[2] == 1                              # the last text token: no step after it
    # 30 frames in chunks of 2, 4, 8 and 16 (the host's first chunk of 2, doubling): the 2nd, 6th and 14th
    # frames are read at once, and the last
    assert follow[2] == 4
    assert off == {"llm": (TEXT, TEXT, TEXT), "follow": (30, 30, 30)}


@pytest.mark.parametrize("where", ["token", "frame"])
def test_an_abort_while_a_speaking_step_is_in_flight_leaves_the_others_as_they_were(engines, leak_oracle, where):
    engine = leak_oracle.watch(engines[True])
    other = (HELLO, greedy(), SpeechParams(voice="aiden", max_frames=20, seed=4))
    alone = serve(engines[False], [other], [0])[0]
    a = engine.add(messages=HELLO, params=greedy(), speech=SpeechParams(voice="chelsie", max_frames=30, seed=1))
    b = engine.add(messages=other[0], params=other[1], speech=other[2])

    def in_flight() -> bool:
        if where == "token":
            return engine.inflight is not None and any(r is a for r, _ in engine.inflight.rows) and len(a.output) > 3
        lane = engine.speech.inflight
        return lane is not None and a in lane.emit and len(a.speech.frames) > 2
    for _ in range(200):
        if in_flight():
            break
        engine.step()
    assert in_flight(), f"request a's {where} was never in flight"
    engine.abort(a.id)
    assert a.closed and a.finish_reason == "abort" and all(t >= 0 for t in a.output)
    while engine.has_work():
        engine.step()
    got = engine.output(b)
    assert (got.token_ids, got.audio_codes) == (alone.token_ids, alone.audio_codes)
    assert got.audio.shape == alone.audio.shape and rel(got.audio, alone.audio) < 1e-5
    assert engine.scheduler.pool_full() and engine.speech.pages.num_free == engine.speech.capacity


def test_a_frame_whose_text_is_a_token_in_flight_waits_for_its_read(engines, monkeypatch):
    """The LLM's output seen by the host's Speech may end in a placeholder (a token still on the device): a host
    that names it as a frame's text gets that frame delayed until the token is read, and no placeholder reaches
    an embedding."""
    engine = engines[True]
    sh = engine.host.speech
    real, real_embed = type(sh).trailing, type(sh).embed
    named, embedded = [], []

    def trailing(prompt, output, finished, frame):     # a host that speaks the newest token once it exists
        t = real(sh, prompt, output, finished, frame)
        if t is None and output and not finished:
            named.append(output[-1])
            return output[-1]
        return t

    def embed(ids):
        embedded.extend(ids)
        return real_embed(sh, ids)
    monkeypatch.setattr(sh, "trailing", trailing)
    monkeypatch.setattr(sh, "embed", embed)
    out = serve(engine, [(HELLO, greedy(), SpeechParams(max_frames=12, temperature=0))], [0])[0]
    assert any(t < 0 for t in named) and min(embedded) >= 0
    assert len(out.audio_codes) == 12 and len(out.token_ids) == TEXT
