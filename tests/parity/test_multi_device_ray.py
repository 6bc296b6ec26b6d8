"""`graphc run PLAN --ray ADDRESS` on a local Ray cluster (issue 12): the two-device tiny Omni plan's devices
as actors in one placement group, gloo between them. Token ids equal the one-device plan's for t2t,
a2t and i2t, and a t2s's speech its audio; a killed device actor ends the run naming its device within 10 s. A module of its own: it
starts and stops its cluster."""
import json
import time

import numpy as np
import pytest
import ray
import soundfile as sf
from PIL import Image

from graphc.cli import main
from graphc.errors import InvalidInput
from graphc.plan import load_plan
from graphc.runtime.engine import Engine, parse_request
from graphc.runtime.ray_run import RayServing, bundles, strategy
from tests.parity.test_multi_device import plans  # noqa: F401  (the fixture)


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def jsonl(tmp_path_factory):
    """t2t, a2t and i2t requests with their media in files, as a user writes them."""
    path = tmp_path_factory.mktemp("ray")
    rng = np.random.default_rng(0)
    sf.write(path / "clip.wav", (0.1 * rng.standard_normal(24000)).astype(np.float32), 16000)
    Image.fromarray((rng.random((64, 80, 3)) * 255).astype(np.uint8)).save(path / "pic.png")
    items = [{"id": "t2t", "prompt_token_ids": [1, 2, 3, 4, 5, 6]},
             {"id": "a2t", "prompt_token_ids": [1, 2, "AUDIO", 7, 8], "media": [{"type": "audio", "path": str(path / "clip.wav")}]},
             {"id": "i2t", "prompt_token_ids": [1, 2, "IMAGE", 9], "media": [{"type": "image", "path": str(path / "pic.png")}]},
             {"id": "t2s", "prompt_token_ids": ["USER", 5, 6, 7, "ASSISTANT"], "modalities": ["text", "audio"],
              "audio": {"temperature": 0, "max_frames": 12}}]
    return path, items


def resolve(items, engine):
    """The placeholders as the model's media token ids."""
    m = engine.host.media
    sp = engine.host.speech.ids
    ids = {"AUDIO": [m.audio_start_token_id, m.audio_token_id, engine.host.audio_end],
           "IMAGE": [m.vision_start_token_id, m.image_token_id],
           "USER": [sp["im_start_token_id"], sp["user_token_id"]],
           "ASSISTANT": [sp["im_start_token_id"], sp["assistant_token_id"]]}
    out = []
    for it in items:
        toks = [t for x in it["prompt_token_ids"] for t in (ids[x] if isinstance(x, str) else [x])]
        out.append(it | {"prompt_token_ids": toks, "max_tokens": 8, "temperature": 0})
    return out


def test_placement_group_follows_the_plan(plans):
    plan = load_plan(plans[1])
    assert bundles(plan) == [{"CPU": 1}, {"CPU": 1}] and strategy(plan) == "PACK"      # gloo crosses hosts
    gpu = load_plan("plans/omni_2gpu.plan")
    assert bundles(gpu) == [{"GPU": 1, "CPU": 1}] * 2 and strategy(gpu) == "STRICT_PACK"


def test_ray_actors_give_the_one_device_tokens(cluster, plans, jsonl, tmp_path):
    one = Engine(plans[0], random_weights=True)
    items = resolve(jsonl[1], one)
    want = one.generate(items)
    assert all(o.error is None and len(o.token_ids) == 8 for o in want)
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(x) + "\n" for x in items))
    out, stats = tmp_path / "out.jsonl", tmp_path / "stats.json"
    assert main(["run", str(plans[1]), "--ray", "local", "--random-weights", "--requests", str(tmp_path / "in.jsonl"),
                 "--output", str(out), "--stats", str(stats)]) == 0
    got = [json.loads(x) for x in out.read_text().splitlines()]
    assert [g["id"] for g in got] == ["t2t", "a2t", "i2t", "t2s"]
    assert [g["token_ids"] for g in got] == [o.token_ids for o in want]
    # the spoken answer: the talker and Code2Wav in device 0's actor, driven from the engine's actor
    spoke = got[3]
    assert spoke["audio_frames"] == len(want[3].audio_codes) >= 3
    wav, rate = sf.read(spoke["audio_path"], dtype="float32")
    assert rate == want[3].sample_rate and wav.shape == want[3].audio.shape
    assert np.abs(wav - want[3].audio).max() <= 2 / 32768             # the WAV's 16-bit rounding
    remote = json.loads(stats.read_text())["remote"]
    assert remote["steps"] >= 2 and remote["recv_bytes"] > 0          # the encoders ran in device 0's actor


def test_a_killed_device_actor_ends_the_run_naming_it(cluster, plans, jsonl):
    serving = RayServing(load_plan(plans[1]), "local", llm_device=1, random_weights=True)
    try:
        probe = Engine(plans[0], random_weights=True)       # only for the media token ids
        # the spoken answer keeps device 0's talker busy for as long as the thinker speaks (with the fixture's 12
        # frames it was done in the first second, and a fast machine ran all 400 tokens before the kill)
        items = [x | {"max_tokens": 400, "ignore_eos": True} | ({"audio": {"temperature": 0, "max_frames": 400}}
                                                              if "audio" in x else {})
                 for x in resolve(jsonl[1], probe)]
        parsed = [parse_request(x, i) for i, x in enumerate(items)]
        ref = serving.engine.generate.remote(parsed)
        time.sleep(0.5)                                    # the run is under way
        ray.kill(serving.actors[0])
        t0 = time.monotonic()
        got = ray.get(ref, timeout=30)
        assert time.monotonic() - t0 < 10
        assert got[0] == "dead" and "device 0" in got[1], got
    finally:
        serving.close()


def test_a_cluster_too_small_is_refused_with_what_it_has(cluster, plans, monkeypatch):
    import graphc.runtime.ray_run as rr
    monkeypatch.setattr(rr, "PG_TIMEOUT_S", 2.0)
    monkeypatch.setattr(rr, "bundles", lambda plan: [{"CPU": 100}] * len(plan.devices))
    with pytest.raises(InvalidInput, match="did not hold the plan's 2 bundles") as e:
        RayServing(load_plan(plans[1]), "local", llm_device=1, random_weights=True)
    assert "available" in str(e.value)


def test_a_node_without_the_memory_of_its_devices_is_refused_before_an_actor_boots(cluster, plans, monkeypatch):
    """Both bundles of the two-device cpu plan land on this host (one Ray node); with less available there than
    their planned bytes, RayServing refuses with both numbers, naming the node's devices, and starts no actor;
    with exactly their bytes it passes the check (then boots)."""
    import graphc.hostmem as hm
    import graphc.runtime.ray_run as rr

    plan = load_plan(plans[1])
    need = sum(d.total_bytes for d in plan.devices)
    assert plan.target.host_bytes is not None
    monkeypatch.setattr(hm, "available_bytes", lambda: (need - 1, "by hand"))
    monkeypatch.setattr(rr, "_classes", lambda ray: (_ for _ in ()).throw(AssertionError("an actor class was made")))
    with pytest.raises(InvalidInput) as e:
        RayServing(plan, "local", llm_device=1, random_weights=True)
    text = str(e.value)
    assert f"the plan's devices [0, 1] on Ray node" in text and f"plans {need:,} B" in text
    assert f"this host has {need - 1:,} B" in text and "--memory-cap" in text
    monkeypatch.setattr(hm, "available_bytes", lambda: (need, "by hand"))
    with pytest.raises(AssertionError, match="an actor class was made"):
        RayServing(plan, "local", llm_device=1, random_weights=True)


def test_graphc_run_serves_through_ray(plans):
    """The server in the engine's actor answers a completion with the tokens the offline run gives."""
    import signal
    import urllib.request

    from tests.parity.test_multi_device_run import _serve

    server, port = _serve(plans[1], "--ray", "local")
    try:
        body = json.dumps({"prompt": [1, 2, 3, 4, 5, 6], "max_tokens": 6, "temperature": 0}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                     {"Content-Type": "application/json"})
        got = json.loads(urllib.request.urlopen(req, timeout=120).read())
        one = Engine(plans[0], random_weights=True)
        want = one.generate([{"prompt_token_ids": [1, 2, 3, 4, 5, 6], "max_tokens": 6, "temperature": 0}])[0]
        assert got["choices"][0]["token_ids"] == want.token_ids and len(want.token_ids) == 6
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=60)
        except Exception:
            server.kill()
