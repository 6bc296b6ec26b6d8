"""Serve one request of every text kind a plan has (t2t, a2t, i2t, v2t, av2t) on seeded weights, with media
made in memory (no files, no decoders), and print which walks and rungs ran: a smoke run of the engine's
encoder paths on a GPU plan.

    python examples/engine_media.py plans/qwen3_omni_h200.plan [--max-tokens 16] [--json OUT.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from graphc.errors import InvalidInput  # noqa: E402
from graphc.runtime.engine import Engine  # noqa: E402
from graphc.serving import Media  # noqa: E402
from graphc.runtime.sampler import SamplingParams  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("plan")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--json", default=None)
    ap.add_argument("--emulate", action="store_true")
    a = ap.parse_args()
    engine = Engine(a.plan, random_weights=True, emulate=a.emulate)
    print(engine.summary(), flush=True)
    rng = np.random.default_rng(0)
    m = engine.host.media
    t = np.arange(16000 * 6) / 16000
    wave = (0.2 * np.sin(2 * np.pi * 300 * t)).astype(np.float32)
    image = torch.from_numpy(rng.integers(0, 256, (3, 480, 640), dtype=np.uint8))
    frames = torch.from_numpy(rng.integers(0, 256, (12, 3, 360, 640), dtype=np.uint8))
    vocab = engine.model.node(engine.llm).outputs["logits"].shape[-1]
    text = rng.integers(0, min(1000, vocab - 16), 64).tolist()
    cases = {"t2t": (text, []), "a2t": (text + [m.audio_token_id], [Media("audio", wave)]),
             "i2t": (text + [m.image_token_id], [Media("image", image)]),
             "v2t": (text + [m.video_token_id], [Media("video", frames, 2.0)]),
             "av2t": (text + [m.video_token_id], [Media("video", frames, 2.0, audio=wave)])}
    params = SamplingParams(temperature=0, max_tokens=a.max_tokens, ignore_eos=True)
    reqs = {}
    for k, (ids, media) in cases.items():
        if k in engine.kinds():
            try:
                reqs[k] = engine.add(prompt_token_ids=ids, media=media, params=params)
            except InvalidInput as e:             # a media item larger than this plan's walks carry
                print(f"{k}: refused: {str(e).splitlines()[0]}")
    while engine.has_work():
        engine.step()
    stats = engine.stats()
    for k, r in reqs.items():
        print(f"{k}: kind {r.kind}, {len(r.prompt.ids)} prompt rows, {len(r.output)} tokens, {r.finish_reason}")
    print(engine.stats_line(stats))
    print("rungs:", json.dumps(stats["rungs"]))
    assert all(r.finish_reason == "length" for r in reqs.values()) and engine.scheduler.pool_full()
    if a.json:
        Path(a.json).write_text(json.dumps({"kinds": {k: r.kind for k, r in reqs.items()}, **stats}, indent=1))


if __name__ == "__main__":
    main()
