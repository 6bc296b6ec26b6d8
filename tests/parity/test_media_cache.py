"""The media cache (graphc/runtime/media_cache.py) on a tiny Qwen3-Omni thinker written by transformers (its
weights re-drawn): the same image, or audio clip, after other text is not encoded again, and the LLM reads
the very rows an engine without the cache (its plan's --set media_cache.<node>=0) computes for it, so the
greedy answers are equal (test_engine.py holds that engine to HF). Encoder steps are counted at the
encoder modules themselves. Hand-worked cases: a cache of one image's rows keeps the most recently used
image; an image larger than the cache is never stored; an idle engine holds every KV page of the plan."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from graphc import Media
from graphc.cli import main
from graphc.plan import load_plan
from graphc.runtime.engine import Engine
from graphc.runtime.sampler import SamplingParams
from tests.unit.loopback import tiny_omni

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
ENCODERS = ("audio_encoder", "vision_encoder")


def plan(d, name: str, **rows) -> str:
    """A CPU plan of the tiny checkpoint with media_cache rows set (none given: the default rule)."""
    sets = [x for node, n in rows.items() for x in ("--set", f"media_cache.{node}={n}")]
    out = d / f"{name}.plan"
    assert main(["plan", "models/qwen3_omni.py", "--preset", "tiny", "--checkpoint", str(d / "ckpt"), "--gpu", "cpu",
                 *sets, "-o", str(out), "-q"]) == 0
    return out


@pytest.fixture(scope="module")
def omni(tmp_path_factory):
    return tiny_omni(tmp_path_factory.mktemp("media"), speech=False)


@pytest.fixture(scope="module")
def engines(omni):
    """(cache on by default, cache off), each with its encoders' steps and the LLM's spliced rows recorded."""
    on, off = Engine(omni / "p.plan", omni / "ckpt"), Engine(plan(omni, "off", audio_encoder=0, vision_encoder=0),
                                                              omni / "ckpt")
    return watch(on), watch(off)


def watch(engine: Engine) -> Engine:
    """engine.calls[node]: the node's module calls; engine.rows: each LLM step's spliced encoder rows, by port."""
    engine.calls = {n: 0 for n in ENCODERS}
    engine.rows = []
    for n in ENCODERS:
        def count(_m, _a, n=n):
            engine.calls[n] += 1
        engine.boot.modules[n].register_forward_pre_hook(count)

    def spliced(_m, _a, kw):
        got = {}
        for port, rows, dim in (("audio_embeds", "audio_rows", 0), ("visual_embeds", "visual_rows", 0),
                                ("deepstack", "visual_rows", 1)):
            if kw.get(port) is not None:
                idx = kw[rows][kw[rows] >= 0]
                got[port] = kw[port].index_select(dim, idx).clone()
        engine.rows.append(got)
    engine.boot.modules["thinker"].register_forward_pre_hook(spliced, with_kwargs=True)
    return engine


def run(engine: Engine, prompt: list[int], media: list[Media]) -> list[int]:
    req = engine.add(prompt_token_ids=prompt, params=GREEDY, media=media)
    while engine.has_work():
        engine.step()
    assert req.error is None, req.error
    return list(req.output)


def ids(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(10, 300, n).tolist()


def image(seed: int, h: int = 96, w: int = 128) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).integers(0, 256, (3, h, w), np.uint8))


def clip(seed: int, seconds: float = 1.5) -> np.ndarray:
    return (0.1 * np.random.default_rng(seed).standard_normal(int(16000 * seconds))).astype(np.float32)


def fed(engine: Engine, since: int) -> list[dict]:
    """The spliced rows of the LLM steps from step `since` on that splice any."""
    return [r for r in engine.rows[since:] if r]


def same_rows(a: list[dict], b: list[dict]) -> bool:
    return len(a) == len(b) and all(x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
                                    for x, y in zip(a, b))


@pytest.mark.parametrize("kind, node, make", [("image", "vision_encoder", image), ("audio", "audio_encoder", clip)])
def test_the_same_media_after_other_text_is_not_encoded_again(engines, leak_oracle, kind, node, make):
    """Two requests, the same media item after different text (no KV page in common): the second runs no
    encoder step, and its LLM steps read exactly the rows the cache-off engine computes."""
    on, off = engines
    leak_oracle.watch(on)
    item = make(11)
    tok = on.host.token_of[kind]
    first, second = ids(1, 5) + [tok] + ids(2, 4), ids(3, 21) + [tok] + ids(4, 4)
    hits = on.stats()["media_cache"][node]["hits"]
    for prompt, runs in ((first, 1), (second, 0)):
        calls, steps = dict(on.calls), (len(on.rows), len(off.rows))
        got = run(on, prompt, [Media(kind, item)])
        assert on.calls[node] - calls[node] == runs
        assert got == run(off, prompt, [Media(kind, item)])
        assert same_rows(fed(on, steps[0]), fed(off, steps[1]))
    assert on.stats()["media_cache"][node]["hits"] == hits + 1


def test_a_step_mixing_cached_and_new_pieces_reads_each_pieces_rows(engines):
    """One step of two requests: one image cached before, one new; the new one is encoded alone and the LLM
    reads both images' rows as the cache-off engine computes them."""
    on, off = engines
    old, new = image(21), image(22)
    tok = on.host.token_of["image"]
    run(on, ids(5, 3) + [tok], [Media("image", old)])
    prompts = [ids(6, 9) + [tok] + ids(7, 2), ids(8, 4) + [tok] + ids(9, 3)]
    items = [[Media("image", old)], [Media("image", new)]]
    calls, steps = on.calls["vision_encoder"], (len(on.rows), len(off.rows))
    outs = []
    for e in (on, off):
        reqs = [e.add(prompt_token_ids=p, params=GREEDY, media=m) for p, m in zip(prompts, items)]
        while e.has_work():
            e.step()
        outs.append([list(r.output) for r in reqs])
    assert on.calls["vision_encoder"] - calls == 1
    both = 2 * image_rows(on, old)
    assert [len(r["visual_embeds"]) for r in fed(on, steps[0])] == [both]       # one step spliced both images
    assert outs[0] == outs[1]
    assert same_rows(fed(on, steps[0]), fed(off, steps[1]))


def image_rows(engine: Engine, item: torch.Tensor) -> int:
    """The encoder output rows of one image: its prompt rows (each takes one)."""
    prompt = engine.host.prompt([engine.host.token_of["image"]], [Media("image", item)])
    return sum(len(p.rows) for m in prompt.media for p in m.pieces)


def test_a_cache_of_one_images_rows_keeps_the_most_recent_image(omni, engines):
    """Images a, b, b, a with room for one: a stored, b evicts it, b from the cache, a encoded again."""
    on, _ = engines
    a, b = image(31), image(32)
    rows = image_rows(on, a)
    assert image_rows(on, b) == rows
    one = watch(Engine(plan(omni, "one", vision_encoder=rows), omni / "ckpt"))
    tok = one.host.token_of["image"]
    runs = []
    for i, item in enumerate((a, b, b, a)):
        calls = one.calls["vision_encoder"]
        run(one, ids(40 + i, 3 + 17 * i) + [tok], [Media("image", item)])
        runs.append(one.calls["vision_encoder"] - calls)
    st = one.stats()["media_cache"]["vision_encoder"]
    assert runs == [1, 1, 0, 1]
    assert (st["hits"], st["misses"], st["evicted"], st["pieces"]) == (1, 3, 2, 1)
    config = json.loads((omni / "ckpt" / "config.json").read_text())
    vision = config["thinker_config"]["vision_config"]
    assert config["dtype"] == "float32"
    # a row: embeds and each deepstack level's row, out_hidden_size floats of 4 bytes each
    row = (1 + len(vision["deepstack_visual_indexes"])) * vision["out_hidden_size"] * 4
    assert st["stored_bytes"] == st["capacity_bytes"] == rows * row


def test_a_hit_makes_an_image_the_most_recently_used(omni, engines):
    """Room for two images: a, b, a (from the cache, now the most recent), c evicts b, so a comes from the cache
    again and b is encoded again."""
    on, _ = engines
    a, b, c = image(61), image(62), image(63)
    two = watch(Engine(plan(omni, "two", vision_encoder=2 * image_rows(on, a)), omni / "ckpt"))
    tok = two.host.token_of["image"]
    runs = []
    for i, item in enumerate((a, b, a, c, a, b)):
        calls = two.calls["vision_encoder"]
        run(two, ids(70 + i, 2 + 17 * i) + [tok], [Media("image", item)])
        runs.append(two.calls["vision_encoder"] - calls)
    assert runs == [1, 1, 0, 1, 0, 1]


def test_an_image_larger_than_the_cache_is_not_stored(omni, engines):
    on, off = engines
    item = image(51)
    small = watch(Engine(plan(omni, "small", vision_encoder=image_rows(on, item) - 1), omni / "ckpt"))
    tok = small.host.token_of["image"]
    for i in range(2):
        prompt = ids(52 + i, 4 + 16 * i) + [tok]
        assert run(small, prompt, [Media("image", item)]) == run(off, prompt, [Media("image", item)])
    st = small.stats()["media_cache"]["vision_encoder"]
    assert small.calls["vision_encoder"] == 2
    assert (st["hits"], st["stored_bytes"], st["pieces"]) == (0, 0, 0)


def test_the_kv_pool_is_the_plans_and_whole_when_idle(omni, engines):
    """The cache takes no KV page: the pool has the plan's pages, every one free once idle."""
    on, _ = engines
    planned = load_plan(omni / "p.plan").devices[0]
    assert planned.ledger["media_cache.vision_encoder"] > 0 and planned.ledger["media_cache.audio_encoder"] > 0
    pool = on.scheduler.pages
    assert pool.num_pages == planned.kv_pages["thinker_kv"]
    assert not on.has_work() and pool.num_free == pool.num_pages


def metric(text: str, name: str, node: str) -> float:
    line = next(x for x in text.splitlines() if x.startswith(f'{name}{{node="{node}"}}'))
    return float(line.split()[-1])


def test_metrics_count_hits_misses_and_stored_bytes(omni, engines):
    """/metrics' text (the app's registry): a new image is a miss that stores its rows, the same again a hit."""
    from graphc.serve.ops import Metrics

    on, _ = engines
    item, tok = image(81), on.host.token_of["image"]
    text = Metrics(on).text().decode()
    before = [metric(text, f"graphc_media_cache_{m}", "vision_encoder") for m in ("hits_total", "misses_total",
                                                                                  "stored_bytes")]
    for i in range(2):
        run(on, ids(82 + i, 3 + 16 * i) + [tok], [Media("image", item)])
    text = Metrics(on).text().decode()
    after = [metric(text, f"graphc_media_cache_{m}", "vision_encoder") for m in ("hits_total", "misses_total",
                                                                                 "stored_bytes")]
    row = (1 + 2) * 64 * 4        # the tiny checkpoint: embeds and 2 deepstack levels of 64 float32 (config.json)
    assert [a - b for a, b in zip(after, before)] == [1, 1, image_rows(on, item) * row]
    assert metric(text, "graphc_media_cache_stored_bytes", "audio_encoder") >= 0       # a line for each cache


def test_graphc_run_stats_hold_the_media_cache(tmp_path, monkeypatch):
    from tests.conftest import ROOT

    monkeypatch.chdir(ROOT)
    reqs, stats = tmp_path / "r.jsonl", tmp_path / "s.json"
    reqs.write_text(json.dumps({"prompt_token_ids": list(range(1, 20)), "max_tokens": 2}) + "\n")
    assert main(["run", str(ROOT / "plans" / "tiny_cpu.plan"), "--random-weights", "--requests", str(reqs),
                 "--output", str(tmp_path / "o.jsonl"), "--stats", str(stats)]) == 0
    got = json.loads(stats.read_text())["media_cache"]["encoder"]
    assert (got["hits"], got["misses"], got["stored_bytes"]) == (0, 0, 0)
    assert got["capacity_bytes"] == load_plan(ROOT / "plans" / "tiny_cpu.plan").devices[0].ledger["media_cache.encoder"]
