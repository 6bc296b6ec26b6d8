"""A plan of two CPU devices served through two processes (issue 12): the engine's own (the thinker) and a
worker process for device 0 (the encoders, the talker, Code2Wav), gloo between them. The token ids of
t2t, a2t and i2t, and the speech of t2s and a2s, equal the one-device plan's (seeded weights: each node's
are the same on any device); the encoders' outputs come back through the process group, the talker's
inputs go to it (test_multi_device_run.py: a killed worker)."""
import numpy as np
import pytest
import torch

from graphc.cli import main
from graphc.errors import InvalidInput
from graphc.runtime.engine import Engine
from graphc.serving import Media
from graphc.runtime.sampler import SamplingParams
from graphc.runtime.speech import SpeechParams

PINS = ["nodes.thinker.device=1", "nodes.audio_encoder.device=0", "nodes.vision_encoder.device=0",
        "nodes.talker.device=0", "nodes.code2wav.device=0"]


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    path = tmp_path_factory.mktemp("md")
    sets = [x for p in PINS for x in ("--set", p)]
    for name, gpus in (("one", "1"), ("two", "2")):
        assert main(["plan", "models/qwen3_omni.py", "--preset", "tiny", "--gpu", "cpu", "--gpus", gpus,
                     *(sets if gpus == "2" else []), "-o", str(path / f"{name}.plan"), "-q"]) == 0
    return path / "one.plan", path / "two.plan"


@pytest.fixture(scope="module")
def engines(plans):
    one = Engine(plans[0], random_weights=True)
    two = Engine(plans[1], random_weights=True)
    yield one, two
    two.close()


def requests(engine: Engine) -> list:
    m, rng = engine.host.media, np.random.default_rng(0)
    clip = (0.1 * rng.standard_normal(24000)).astype(np.float32)
    image = torch.from_numpy((rng.random((3, 64, 80)) * 255).astype(np.uint8))
    greedy = SamplingParams(temperature=0, max_tokens=8)
    audio = [m.audio_start_token_id, m.audio_token_id, engine.host.audio_end]
    reqs = [engine.add(prompt_token_ids=[1, 2, 3, 4, 5, 6], params=greedy),
            engine.add(prompt_token_ids=[1, 2, *audio, 7, 8], media=[Media("audio", clip)], params=greedy),
            engine.add(prompt_token_ids=[1, 2, m.vision_start_token_id, m.image_token_id, 9],
                       media=[Media("image", image)], params=greedy),
            engine.add(prompt_token_ids=[3, *audio, 1, 4], media=[Media("audio", clip[:8000])], params=greedy)]
    while engine.has_work():
        engine.step()
    return [engine.output(r) for r in reqs]


def test_two_processes_give_the_one_device_tokens(engines):
    one, two = engines
    assert two.workers is not None and list(two.workers.links) == [0] and set(two.boot.nodes) == {"thinker"}
    assert "cpu x2" in two.summary()
    # the encoders' outputs arrive in the thinker device's receive buffers, one per edge source port: the
    # plan's transfers lines, measured at boot at the ledger's bytes
    assert set(two.workers.buffers) == {("audio_encoder", "embeds"), ("vision_encoder", "embeds"),
                                        ("vision_encoder", "deepstack"), ("talker", "codes"),
                                        ("talker", "next_embeds"), ("code2wav", "wav")}
    ledger, sources = two.plan.devices[1].ledger, two.plan.devices[1].sources
    for comp in ("transfers.audio_encoder", "transfers.vision_encoder"):
        assert two.boot.measured[comp] == ledger[comp] > 0
    # the plan says what each line holds: every buffer by port, elements and dtype, as booted
    for (src, port), buf in two.workers.buffers.items():
        detail = sources[f"transfers.{src}"]
        assert detail.startswith(f"exact: receive buffers of {src}'s output(s)")
        assert f"{port} {buf.numel():,} x {str(buf.dtype).removeprefix('torch.')}" in detail, detail
    before = dict(two.workers.stats)
    want, got = requests(one), requests(two)
    assert [o.error for o in got] == [None] * 4
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert all(len(o.token_ids) == 8 for o in got)
    # the encoders ran on device 0 and their rows came back through the process group
    assert two.workers.stats["steps"] - before["steps"] >= 2            # an audio and an image prefill at least
    assert two.workers.stats["recv_bytes"] > before["recv_bytes"]


def test_one_process_drives_one_multi_device_plan(engines, plans):
    with pytest.raises(InvalidInput, match="already drives a multi-device plan"):
        Engine(plans[1], random_weights=True)


def speak(engine: Engine) -> list:
    """A greedy t2s, a sampled (seeded) t2s and an a2s, arriving together."""
    ids, m = engine.host.speech.ids, engine.host.media
    clip = (0.1 * np.random.default_rng(1).standard_normal(16000)).astype(np.float32)
    user, asst = [ids["im_start_token_id"], ids["user_token_id"]], [ids["im_start_token_id"], ids["assistant_token_id"]]
    audio = [m.audio_start_token_id, m.audio_token_id, engine.host.audio_end]
    text = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    reqs = [engine.add(prompt_token_ids=user + [5, 6, 7] + asst, params=text,
                       speech=SpeechParams(temperature=0, max_frames=18)),
            engine.add(prompt_token_ids=user + [8, 9] + asst, params=text,
                       speech=SpeechParams(temperature=0.9, seed=3, max_frames=25, first_chunk=3)),
            engine.add(prompt_token_ids=user + [4, *audio, 6] + asst, media=[Media("audio", clip)], params=text,
                       speech=SpeechParams(temperature=0, max_frames=12))]
    while engine.has_work():
        engine.step()
    return [engine.output(r) for r in reqs]


def test_speech_across_devices_gives_the_one_device_frames_and_audio(engines):
    """The talker and Code2Wav on device 0, driven from the thinker's device 1 through the model's links: the
    talker's rows and sampling inputs cross in the worker's receive buffers, its codes, next rows and audio
    come back in the engine's; frames, text and samples equal the one-device plan's (same seeded weights)."""
    one, two = engines
    assert {"t2s", "a2s"} <= set(two.kinds())
    assert set(two.workers.linked["talker"]) == {"embeds", "trailing_text", "sampling", "noise", "seen",
                                                 "thinker_embeds", "thinker_hidden"}
    ledger = two.plan.devices[1].ledger
    for comp in ("transfers.talker", "transfers.code2wav"):
        assert two.boot.measured[comp] == ledger[comp] > 0
    # the talker's pages are kept by the engine, as many as its worker booted (less the scratch page on a GPU)
    assert two.speech.pages.num_pages == two.plan.devices[0].kv_pages["talker_kv"]
    before = dict(two.workers.stats)
    want, got = speak(one), speak(two)
    assert [o.error for o in got] == [None] * 3
    for a, b in zip(want, got):
        assert b.token_ids == a.token_ids and len(b.token_ids) == 10
        assert b.audio_codes == a.audio_codes and len(b.audio_codes) >= 3
        assert b.audio_finish_reason == a.audio_finish_reason
        assert b.audio.shape == a.audio.shape and np.array_equal(b.audio, a.audio)
    assert two.speech.pages.num_free == two.speech.capacity            # every talker page given back
    assert two.workers.stats["send_bytes"] > before["send_bytes"]
    assert two.workers.stats["recv_bytes"] > before["recv_bytes"]



def test_a_repeated_image_runs_no_step_on_the_encoders_device(engines):
    """The media cache sits on the thinker's device: the same image after other text takes its rows from it, so
    device 0 runs no step for it, and the tokens equal the one-device plan's."""
    one, two = engines
    m = two.host.media
    image = torch.from_numpy((np.random.default_rng(7).random((3, 64, 80)) * 255).astype(np.uint8))
    greedy = SamplingParams(temperature=0, max_tokens=8)
    got, remote = {}, []
    for e in (one, two):
        for pre in ([1, 2], [5, 6, 7, 8, 9]):
            steps = two.workers.step_stats()["steps"]
            r = e.add(prompt_token_ids=pre + [m.vision_start_token_id, m.image_token_id, 9],
                      media=[Media("image", image)], params=greedy)
            while e.has_work():
                e.step()
            got.setdefault(e is two, []).append(list(r.output))
            if e is two:
                remote.append(two.workers.step_stats()["steps"] - steps)
    assert got[True] == got[False]
    assert remote[0] >= 1 and remote[1] == 0, remote
    assert two.stats()["media_cache"]["vision_encoder"]["hits"] >= 1
