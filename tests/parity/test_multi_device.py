"""A plan of two CPU devices served through two processes (issue 12): the engine's own (the thinker) and a
worker process for device 0 (the encoders, the talker, Code2Wav), gloo between them. The token ids of
t2t, a2t and i2t equal the one-device plan's (seeded weights: each node's are the same on any device),
the encoders' outputs come back through the process group (test_multi_device_failure.py: a killed worker)."""
import numpy as np
import pytest
import torch

from graphc.cli import main
from graphc.errors import InvalidInput
from graphc.runtime.engine import Engine
from graphc.runtime.host import Media
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
                                        ("vision_encoder", "deepstack")}
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


def test_speech_across_devices_is_refused_with_the_reason(engines):
    two = engines[1]
    assert "t2s" not in two.kinds() and "t2t" in two.kinds()
    with pytest.raises(InvalidInput) as e:
        two.add(prompt_token_ids=[1, 2, 3], speech=SpeechParams())
    assert "another device" in str(e.value) and e.value.param == "modalities"
