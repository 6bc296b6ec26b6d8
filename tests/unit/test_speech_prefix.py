"""Speaking requests and the prefix cache (graphc/runtime/scheduler.py _lookup): a speaking request takes cached
pages only before the first row whose LLM output its follow stage reads (the host's speech.hidden_rows: Qwen3-Omni's
user-turn media rows; text rows the talker looks up by id). On the tiny speaking Qwen3-Omni on the CPU, a second
request that repeats a first's long prompt start takes its whole pages (text only), or those before its audio
(audio in the user turn), and its text, codes and audio equal those of an engine without the cache."""
from __future__ import annotations

import numpy as np
import pytest

from graphc.runtime.engine import Engine
from graphc.runtime.sampler import SamplingParams
from graphc.runtime.speech import SpeechParams
from graphc.serving import Media
from tests.parity.speaking import speaking_omni


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    _, _, plan, ckpt = speaking_omni(tmp_path_factory.mktemp("speech_prefix"), redraw_code2wav=True)
    return {c: Engine(plan, checkpoint=ckpt, prefix_cache=c) for c in (True, False)}


def prompts(engine, audio: bool) -> list[list[int]]:
    """Two prompts that share a long start (a system turn of 40 ids, then the user turn's first ids, an audio item
    among them when asked) and differ in their last user id."""
    ids, m = engine.host.speech.ids, engine.host.media
    start, end = ids["im_start_token_id"], engine.host.eos_token_ids[0]
    system = [start, 5] + [10 + i % 50 + 60 * audio for i in range(40)] + [end]     # each case its own
    user = [start, ids["user_token_id"], 7, 8, 9] + ([m.audio_start_token_id, m.audio_token_id, engine.host.audio_end]
                                                     if audio else []) + [11] * 20
    asst = [end, start, ids["assistant_token_id"]]
    return [system + user + [last] + asst for last in (30, 31)]


def run(engine, prompts: list[list[int]], audio: bool) -> list:
    """The two requests one after the other; their outputs and the rows each took from the cache."""
    clip = (0.1 * np.random.default_rng(1).standard_normal(16000)).astype(np.float32)
    out = []
    for ids in prompts:
        req = engine.add(prompt_token_ids=ids, media=[Media("audio", clip)] if audio else [],
                         params=SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
                         speech=SpeechParams(temperature=0, max_frames=12))
        while engine.has_work():
            engine.step()
        out.append((engine.output(req), req.cached))
    assert engine.scheduler.pool_full()
    return out


@pytest.mark.parametrize("audio", [False, True])
def test_a_speaking_request_takes_the_pages_before_what_its_talker_reads(engines, audio):
    cached, fresh = engines[True], engines[False]
    ps = cached.scheduler.kv.page_size
    two = prompts(cached, audio)
    got, want = run(cached, two, audio), run(fresh, two, audio)
    # by hand: the rows the two prompts share (system 43, the user turn's first 5, then 20 more ids, or the audio
    # start id before the audio item's rows), in whole pages
    common = 43 + 5 + (1 if audio else 20)
    assert got[0][1] == 0 and got[1][1] == common // ps * ps > 0, (got[1][1], common, ps)
    for (a, _), (b, _) in zip(got, want):
        assert (a.token_ids, a.audio_codes, a.audio_finish_reason) == (b.token_ids, b.audio_codes,
                                                                      b.audio_finish_reason)
        assert a.audio is not None and np.array_equal(a.audio, b.audio)
