"""The engine's side of a stream lane (graphc/lanes.py, SpeechLane.on_lane / handed / _take_over), on the tiny
speaking Qwen3-Omni planned for the CPU, where no CUDA stream exists: the lane's stream is a stand-in, and
torch.cuda.stream, torch.cuda.Event and Tensor.record_stream are recorders. Two speaking requests, one with an
audio item (the talker's prompt reads the thinker's rows of it), served to the end. Checked: every step of the
talker and Code2Wav runs inside the lane's stream and every thinker or encoder step outside it; before a
request's talker prompt is built the lane's stream waits on the event the thinker's step recorded after keeping
that request's rows, and each of those rows is marked used by the lane's stream; the text, codes and audio equal
those of the same engine without the stand-in."""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pytest
import torch

from graphc.runtime.engine import Engine
from graphc.runtime.sampler import SamplingParams
from graphc.runtime.speech import SpeechParams
from graphc.serving import Media
from tests.parity.speaking import speaking_omni


class Lane:
    """The lane's stream: what waited on it, in order."""

    def __init__(self):
        self.waits: list = []

    def wait_event(self, event) -> None:
        self.waits.append(event)


class Event:
    def __init__(self):
        self.at = None

    def record(self, stream=None) -> None:
        self.at = RECORD.step


class RECORD:
    step = 0                  # the engine step being run
    current = None            # the stream entered, None outside


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    _, _, plan, ckpt = speaking_omni(tmp_path_factory.mktemp("lane_streams"), redraw_code2wav=True)
    return plan, ckpt


def serve(engine) -> list:
    clip = (0.1 * np.random.default_rng(1).standard_normal(16000)).astype(np.float32)
    ids, m = engine.host.speech.ids, engine.host.media
    start, end = ids["im_start_token_id"], engine.host.eos_token_ids[0]
    user = [start, ids["user_token_id"], 7, 8, 9, m.audio_start_token_id, m.audio_token_id, engine.host.audio_end, 11]
    reqs = [engine.add(prompt_token_ids=user + [end, start, ids["assistant_token_id"]], media=media,
                       params=SamplingParams(temperature=0, max_tokens=6, ignore_eos=True),
                       speech=SpeechParams(temperature=0, max_frames=10))
            for media in ([Media("audio", clip)], [Media("audio", clip)])]
    while engine.has_work():
        engine.step()
        RECORD.step += 1
    return [engine.output(r) for r in reqs]


def test_the_lane_runs_its_stages_on_its_stream_after_the_rows_it_reads(plan, monkeypatch):
    want = serve(Engine(plan[0], checkpoint=plan[1]))
    engine = Engine(plan[0], checkpoint=plan[1])
    lane = engine.speech
    lane.stream = Lane()
    marked, where, prompts = [], [], {}

    @contextmanager
    def stream(s):
        RECORD.current = s
        try:
            yield
        finally:
            RECORD.current = None
    monkeypatch.setattr(torch.cuda, "stream", stream)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda t, s: marked.append((id(t), s)), raising=False)
    run_node = engine.executor.run_node
    monkeypatch.setattr(engine.executor, "run_node",
                        lambda node, *a, **k: where.append((node, RECORD.current)) or run_node(node, *a, **k))
    follow_prompt = lane.sh.follow_prompt

    def prompt(p, output, done, voice, hidden):
        fp = follow_prompt(p, output, done, voice, hidden)
        if fp is not None:
            state = next(r.speech for r in engine.talking if r.speech.hidden is hidden)
            prompts[id(hidden)] = (lane.stream.waits[-1:] == [state.ready] and state.ready.at is not None,
                                   [id(t) for t in hidden.values()], RECORD.current)
        return fp
    monkeypatch.setattr(lane.sh, "follow_prompt", prompt)
    got = serve(engine)
    speech = {"talker", "code2wav"}
    assert {n for n, _ in where} == {"audio_encoder", "thinker", "talker", "code2wav"}
    assert all((s is lane.stream) == (n in speech) for n, s in where), where
    assert len(prompts) == 2
    for waited, rows, current in prompts.values():
        assert current is lane.stream and waited and rows           # built on the lane, after its rows' event
        assert all((r, lane.stream) in marked for r in rows)
    for a, b in zip(got, want):
        assert (a.token_ids, a.audio_codes) == (b.token_ids, b.audio_codes)
        assert np.array_equal(np.asarray(a.audio), np.asarray(b.audio))
