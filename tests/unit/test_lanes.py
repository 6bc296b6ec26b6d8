"""Stream lanes in the plan (graphc/lanes.py): the setting's refusals, and a lane's capture pool.

A lane's two ledger lines are checked against the single-pool path they must reproduce: the main stream's pool
is the pool of a device (or a plan) whose lane graphs are not there, and the lane's pool the pool of one with
only the lane's graphs: tests/tally_model.py by node subsets, and Qwen3-Omni's h200 plan against the same inputs
re-planned with the other walks not captured.
"""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from graphc import lanes
from graphc.errors import InvalidInput
from graphc.passes.tally_ledger import tally_ledger
from graphc.source import load_model
from graphc.targets import get_target
from tests.unit.test_tally_ledger import detail, sizing

ROOT = Path(__file__).resolve().parents[2]
SPEECH_WALKS = ["talker_prefill", "talker_decode", "code2wav_short", "code2wav_mid", "code2wav_chunk"]
OTHER_WALKS = ["thinker_decode", "thinker_prefill", "thinker_mixed", "audio_prefill", "image_prefill",
               "video_prefill", "av_prefill"]


@pytest.fixture(scope="module")
def omni():
    return load_model(str(ROOT / "models" / "qwen3_omni.py"), "tiny").model


def refused(fn, *args) -> InvalidInput:
    with pytest.raises(InvalidInput) as e:
        fn(*args)
    return e.value


def test_the_setting_names_a_follow_stage_and_a_boolean(omni):
    assert lanes.choices(omni) == ["speak"]
    assert lanes.settings(omni, {"speak": True}) == {"speak": True}
    assert lanes.lane_nodes(omni, {"speak": True}) == {"speak": ["talker", "code2wav"]}
    assert lanes.lane_nodes(omni, {"speak": False}) == {}
    e = refused(lanes.settings, omni, {"spek": True})
    assert e.what == "unknown lane 'spek' in overrides at lanes" and e.fix == "use 'speak'"
    e = refused(lanes.settings, omni, {"speak": 1})
    assert e.what == "lanes.speak=1 is not true or false" and e.fix == "--set lanes.speak=true"
    e = refused(lanes.settings, omni, ["speak"])
    assert e.what == "overrides.lanes must map follow stages to true or false"
    asr = load_model(str(ROOT / "models" / "qwen3_asr.py"), "tiny").model
    e = refused(lanes.settings, asr, {"speak": True})
    assert "(none: it has no follow stage)" in e.why and e.fix == "remove lanes.speak"


def test_a_lane_needs_a_gpu_and_every_step_of_its_nodes_captured():
    on = {"speak": ["talker", "code2wav"]}
    none = SimpleNamespace(eager={})
    e = refused(lanes.check, SimpleNamespace(target=get_target("cpu")), none, on)
    assert e.what == "--set lanes.speak=true needs a GPU target"
    lanes.check(SimpleNamespace(target=get_target("h100")), none, on)
    eager = SimpleNamespace(eager={("thinker", "thinker_prefill"): 4096, ("talker", "talker_decode"): 32})
    e = refused(lanes.check, SimpleNamespace(target=get_target("h100")), eager, on)
    assert e.what == "lane speak: talker's steps on walk talker_decode run eagerly up to 32"
    lanes.check(SimpleNamespace(target=get_target("cpu")), eager, {})          # no lane: nothing to check


def test_a_device_of_lane_nodes_only_has_no_lane():
    on = {"speak": ["talker", "code2wav"]}
    assert lanes.on_device(on, ["thinker", "talker", "code2wav"]) == on
    assert lanes.on_device(on, ["audio_encoder", "talker"]) == {"speak": ["talker"]}
    assert lanes.on_device(on, ["talker", "code2wav"]) == {}
    assert lanes.on_device(on, ["thinker"]) == {}


def test_the_lane_pool_is_the_pool_of_its_graphs_alone():
    s = sizing(str(ROOT / "tests" / "tally_model.py"), "h100")
    alone_a = tally_ledger(s, 0, ["a"], {})
    alone_b = tally_ledger(s, 0, ["b"], {})
    lane = tally_ledger(replace(s, lanes={"x": ["b"]}), 0, ["a", "b"], {})
    assert lane.get("capture_pool") == alone_a.get("capture_pool") > 0
    assert lane.get("capture_pool.x") == alone_b.get("capture_pool") > 0
    both = tally_ledger(s, 0, ["a", "b"], {})
    assert "capture_pool.x" not in [i.component for i in both.items]
    # every other line is the one-stream device's
    rest = {i.component: i.bytes for i in lane.items if not i.component.startswith("capture_pool")}
    assert rest == {i.component: i.bytes for i in both.items if i.component != "capture_pool"}
    assert detail(lane, "capture_pool.x").startswith("2 graphs of lane x (b), on a stream of its own, captured "
                                                     "largest first into a pool of their own;")
    only_b = tally_ledger(replace(s, lanes={"x": ["b"]}), 0, ["b"], {})       # nothing else there: one stream
    assert only_b.get("capture_pool") == alone_b.get("capture_pool")
    assert "capture_pool.x" not in [i.component for i in only_b.items]


def test_the_omni_plan_with_the_speak_lane():
    sys.path.insert(0, str(ROOT / "examples" / "tools"))
    from regen_plans import compile_shipped

    lane = compile_shipped("qwen3_omni_h200", sections={"lanes": {"speak": True}}).devices[0]
    speech = compile_shipped("qwen3_omni_h200", sections={"walks": {w: {"capture": False} for w in OTHER_WALKS}})
    rest = compile_shipped("qwen3_omni_h200", sections={"walks": {w: {"capture": False} for w in SPEECH_WALKS}})
    assert lane.lanes == {"speak": ["talker", "code2wav"]}
    assert lane.ledger["capture_pool.speak"] == speech.devices[0].ledger["capture_pool"]
    assert lane.ledger["capture_pool"] == rest.devices[0].ledger["capture_pool"]
    assert lane.total_bytes == sum(lane.ledger.values())
    talker_graphs = [g for g in lane.capture_order if g.split("/")[0] in ("talker", "code2wav")]
    assert lane.sources["capture_pool.speak"].startswith(
        f"simulated: {len(talker_graphs)} graphs of lane speak (talker, code2wav), on a stream of its own")
