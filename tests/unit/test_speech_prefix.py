"""Speaking requests and the prefix cache (graphc/runtime/scheduler.py _lookup): a speaking request takes cached
pages whose rows its follow stage reads (the host's speech.hidden_rows: Qwen3-Omni's user-turn media rows; text
rows the talker looks up by id) only where the follow cache holds those rows (graphc/runtime/follow_rows.py, the
plan's media_cache.thinker line). On the tiny speaking Qwen3-Omni on the CPU, a second request that repeats a
first's long prompt start takes its whole pages, through the audio with the follow cache and only those before
the audio without it (--set media_cache.thinker=0), and its text, codes and audio equal those of an engine
without the prefix cache."""
from __future__ import annotations

import numpy as np
import pytest

from graphc.cli import main
from graphc.runtime.engine import Engine
from graphc.runtime.sampler import SamplingParams
from graphc.runtime.speech import SpeechParams
from graphc.serving import Media
from tests.parity.speaking import speaking_omni


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    d = tmp_path_factory.mktemp("speech_prefix")
    _, _, plan, ckpt = speaking_omni(d, redraw_code2wav=True)
    assert main(["plan", "models/qwen3_omni.py", "--preset", "tiny", "--checkpoint", str(ckpt), "--gpu", "cpu",
                 "--set", "media_cache.thinker=0", "-o", str(d / "nofollow.plan"), "-q"]) == 0
    out = {c: Engine(plan, checkpoint=ckpt, prefix_cache=c) for c in (True, False)}
    out["no follow cache"] = Engine(d / "nofollow.plan", checkpoint=ckpt)
    return out


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
    """The two requests one after the other; their outputs, the rows each took from the cache and its prompt's
    ids (media expanded to their rows)."""
    clip = (0.1 * np.random.default_rng(1).standard_normal(16000)).astype(np.float32)
    out = []
    for ids in prompts:
        req = engine.add(prompt_token_ids=ids, media=[Media("audio", clip)] if audio else [],
                         params=SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
                         speech=SpeechParams(temperature=0, max_frames=12))
        while engine.has_work():
            engine.step()
        out.append((engine.output(req), req.cached, req.prompt.ids))
    assert engine.scheduler.pool_full()
    return out


def common_rows(a: list[int], b: list[int]) -> int:
    return next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)


@pytest.mark.parametrize("audio", [False, True])
@pytest.mark.parametrize("follow", [True, False])
def test_a_speaking_request_takes_the_pages_its_talker_reads_where_held(engines, audio, follow):
    cached, fresh = engines[True] if follow else engines["no follow cache"], engines[False]
    ps = cached.scheduler.kv.page_size
    two = prompts(cached, audio)
    got, want = run(cached, two, audio), run(fresh, two, audio)
    # by hand: the rows the two prompts share (system 43, the user turn's first 5, then the audio start id, its
    # rows and end id, and 20 more ids), or without the follow cache those before the audio's rows
    common = common_rows(got[0][2], got[1][2])
    before_audio = 43 + 5 + 1
    assert common == (before_audio + len(got[0][2]) - len(two[0]) + 2 + 20 if audio else 43 + 5 + 20)
    held = common if follow or not audio else before_audio
    assert got[0][1] == 0 and got[1][1] == held // ps * ps > (before_audio if follow and audio else 0), (got[1][1], held)
    for (a, _, _), (b, _, _) in zip(got, want):
        assert (a.token_ids, a.audio_codes, a.audio_finish_reason) == (b.token_ids, b.audio_codes,
                                                                      b.audio_finish_reason)
        assert a.audio is not None and np.array_equal(a.audio, b.audio)
    if follow and audio:
        st = cached.stats()["prefix_cache"]["follow_rows"]
        assert st["hit_rows"] == len(got[0][2]) - len(two[0]) + 1 > 0, st     # the audio's rows, all read again
