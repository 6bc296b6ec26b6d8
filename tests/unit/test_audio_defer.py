"""Waiting audio chunks (graphc/runtime/speech.py SpeechLane lead_ms, `graphc run --audio-lead-ms`), on the tiny
speaking Qwen3-Omni planned for the CPU: a later chunk waits while another lane has a step and its audio leads
playback by more than lead_ms, so the vocoder's steps carry more chunks; first chunks and the chunks of a request
whose speech has ended never wait; the audio equals an engine's that decodes each chunk at once (chunks are cut by
frame counts, not by when they run). And the stall a listener hears (Output.times audio_stall_s), worked by hand."""
import time
from types import SimpleNamespace

import numpy as np
import pytest

from graphc.errors import InvalidInput
from graphc.runtime.engine import Engine
from graphc.runtime.sampler import SamplingParams
from graphc.runtime import speech as speech_module
from graphc.runtime.speech import SpeechLane, SpeechParams, stall_s
from tests.parity.speaking import serve_all, speaking_omni

HELLO = [{"role": "user", "content": "hello world, how are you today?"}]
# seeded sampled speech of 7, 46 and 53 frames beside a text request
LOAD = [(HELLO, SamplingParams(temperature=0, max_tokens=8), SpeechParams(max_frames=60, seed=s, temperature=1.0,
                                                                          top_k=0)) for s in (1, 2, 3)]
LOAD += [([{"role": "user", "content": "tell me a story"}], SamplingParams(temperature=0, max_tokens=5), None)]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    _, _, plan, ckpt = speaking_omni(tmp_path_factory.mktemp("audio_defer"), redraw_code2wav=True)
    return plan, ckpt


def chunk_steps(engine, monkeypatch) -> list[tuple[bool, bool, int, int]]:
    """Every chunk step the engine runs from now on: (run where the lane may let chunks wait, some chunk of it was
    urgent when scheduled (a first chunk, an ended speech, audio leading playback by lead_ms or less; every chunk
    without a lead), its chunks, the walk's slots a step)."""
    seen, schedule = [], SpeechLane.schedule_chunks

    def logged(lane, reqs, defer=False):
        now = speech_module.time.perf_counter()
        urgent = {r.id for r in reqs if lane.urgent(r, now)}
        step = schedule(lane, reqs, defer)
        if step is not None:
            seqs = next(w[2] for w in lane.chunk_walks if w[1] == step.walk)
            seen.append((defer, any(r.id in urgent for r in step.reqs), len(step.reqs), seqs))
        return step
    monkeypatch.setattr(SpeechLane, "schedule_chunks", logged)
    return seen


def test_deferred_chunks_run_urgent_or_full_and_make_the_same_audio(built, monkeypatch):
    plan, ckpt = built
    outs, steps = {}, {}
    clock = iter(range(10**9))                 # the lane's clock: a microsecond a reading, so audio leads playback
    for lead in (None, 0.0):                 # 0: a later chunk waits while any of its audio is still to play
        engine = Engine(plan, checkpoint=ckpt, audio_lead_ms=lead)
        steps[lead] = chunk_steps(engine, monkeypatch)
        monkeypatch.setattr(speech_module, "time", SimpleNamespace(perf_counter=lambda: next(clock) * 1e-6))
        outs[lead] = serve_all(engine, LOAD, [0, 0, 1, 2])
        monkeypatch.undo()
    for a, b in zip(outs[0.0], outs[None]):
        assert (a.token_ids, a.audio_codes) == (b.token_ids, b.audio_codes)
        assert (a.audio is None) == (b.audio is None)
        if a.audio is not None:
            # the same chunks of the same frames, batched with other chunks at other steps (fp32: 1e-5 as
            # test_speech_overlap allows)
            err = np.linalg.norm(a.audio - b.audio) / np.linalg.norm(b.audio)
            assert a.audio.shape == b.audio.shape and err < 1e-5, (a.id, err)
    assert any(n < seqs for _, _, n, seqs in steps[None]), steps[None]      # at once: steps of fewer chunks
    assert all(urgent or n == seqs for waits, urgent, n, seqs in steps[0.0] if waits), steps[0.0]
    assert len(steps[0.0]) < len(steps[None])


def test_a_chunk_waits_only_while_its_audio_leads_playback_by_more_than_lead_ms():
    lane = SpeechLane.__new__(SpeechLane)
    lane.lead_ms, lane.sample_rate = 100.0, 24000
    now = time.perf_counter()

    def req(chunk, ended, started_s_ago):         # one second of audio made, first chunk sent started_s_ago
        s = SimpleNamespace(chunk=chunk, ended=ended, audio=[np.zeros(24000)], sent=[now - started_s_ago])
        return SimpleNamespace(speech=s)
    assert not lane.urgent(req(2, None, 0.5), now)         # leads playback by 500 ms
    assert lane.urgent(req(2, None, 0.95), now)            # by 50 ms
    assert lane.urgent(req(2, "stop", 0.0), now) and lane.urgent(req(0, None, 0.0), now)
    lane.lead_ms = None
    assert lane.urgent(req(2, None, 0.0), now)


def test_stall_by_hand():
    rate = 24000
    assert stall_s([0.0, 1.0, 1.5], [rate, rate // 2, rate], rate) == 0.0      # each arrives as the last ends
    assert stall_s([0.0, 2.0, 2.5], [rate, rate, rate], rate) == pytest.approx(1.0)   # 1 s of silence, then none
    assert stall_s([0.0, 0.1, 3.0], [rate // 2, rate, rate], rate) == pytest.approx(1.5)  # plays to 1.5, waits 1.5


@pytest.mark.parametrize("bad", [-1.0, float("inf"), float("nan")])
def test_a_negative_or_endless_lead_is_refused_before_boot(built, bad):
    plan, ckpt = built
    with pytest.raises(InvalidInput) as e:
        Engine(plan, checkpoint=ckpt, audio_lead_ms=bad)
    assert "audio lead" in str(e.value) and "--audio-lead-ms" in str(e.value)
