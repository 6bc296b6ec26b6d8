"""A request's media pieces are named by their content (prefix_cache.digest: 160 MB of patches for a 30 s clip)
where the request is prepared, in parallel over its pieces, never in the engine's thread: Engine.prepare fills
Request.media_keys, and admission (the prefix cache's lookup) and the encoder step (the media cache) only read
them. Planted bugs caught: the keys left to the engine's thread, and pieces given each other's digests."""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from graphc import Media
from graphc.cli import main
from graphc.runtime import prefix_cache
from graphc.runtime.engine import Engine
from graphc.runtime.sampler import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """The tiny Qwen3-Omni on the CPU, its video walk wide enough for a frame group of the tiny host's clips."""
    plan = tmp_path_factory.mktemp("digests") / "video.plan"
    sets = ["walks.video_prefill.budget.patches=2048", "walks.video_prefill.budget.tokens=512",
            "resources.vision_attn.max_segment=512"]
    assert main(["plan", "models/qwen3_omni.py", "--preset", "tiny", "--gpu", "cpu", "-o", str(plan), "-q",
                 *[x for s in sets for x in ("--set", s)]]) == 0
    e = Engine(plan, random_weights=True)
    yield e
    e.close()


def video_request(engine, seed: int) -> dict:
    """Six 16 x 16 frames: three frame groups, so three pieces of different pixels; then a page of text, so that
    a cached run can end after the clip."""
    frames = np.random.default_rng(seed).integers(0, 256, (6, 3, 16, 16), dtype=np.uint8)
    return {"prompt_token_ids": [5, 6, engine.host.media.video_token_id] + [7] * 20,
            "media": [Media("video", frames, 2.0)], "params": GREEDY}


def test_pieces_are_named_where_the_request_is_prepared(engine, monkeypatch):
    hashed = []
    digest = prefix_cache.digest

    def recorded(data):
        hashed.append(threading.current_thread().name)
        return digest(data)
    monkeypatch.setattr(prefix_cache, "digest", recorded)
    with ThreadPoolExecutor(1, thread_name_prefix="prepare") as pool:
        admissions = [pool.submit(engine.prepare, **video_request(engine, s)).result() for s in (1, 1)]
    prepared = len(hashed)
    for a in admissions:                       # the second is the first's clip: its pages come from the cache
        engine.admit(a)
        while engine.has_work():
            engine.step()
    assert prepared == 6 and all(name.startswith(("prepare", "graphc-digest")) for name in hashed), hashed
    assert len(hashed) == prepared, f"the engine's thread hashed {len(hashed) - prepared} pieces"
    assert admissions[1].req.cached > 0, "the repeated clip took no cached page"


def test_parallel_digests_name_each_piece_as_one_thread_does(engine):
    a = engine.prepare(**video_request(engine, 2))
    pieces = [p for m in a.req.prompt.media for p in m.pieces]
    got = prefix_cache.media_digests(a.req.prompt)
    assert len(pieces) == 3 and len(set(got.values())) == 3
    assert got == {id(p): prefix_cache.digest(p.data) for p in pieces}
