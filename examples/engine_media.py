"""Serve one request of every kind a plan has (t2t, a2t, i2t, v2t, av2t, and t2s, a2s where it speaks) on
seeded weights, with media made in memory (no files, no decoders), and print which walks and rungs ran and
when each speaking request's first audio came: a smoke run of the engine's encoder and speech paths on a
GPU plan.

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
from graphc.runtime.speech import SpeechParams  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("plan")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--frames", type=int, default=32, help="the most codec frames a speaking request says")
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
    if engine.speech is not None:
        cases |= {"t2s": (turns(engine, text), []), "a2s": (turns(engine, [m.audio_token_id] + text), [Media("audio", wave)])}
    params = SamplingParams(temperature=0, max_tokens=a.max_tokens, ignore_eos=True)
    reqs = {}
    for k, (ids, media) in cases.items():
        if k in engine.kinds():
            speech = SpeechParams(max_frames=a.frames, temperature=0) if k.endswith("2s") else None
            try:
                reqs[k] = engine.add(prompt_token_ids=ids, media=media, params=params, speech=speech)
            except InvalidInput as e:             # a media item larger than this plan's walks carry
                print(f"{k}: refused: {str(e).splitlines()[0]}")
    while engine.has_work():
        engine.step()
    stats = engine.stats()
    outs = {k: engine.output(r) for k, r in reqs.items()}
    for k, r in reqs.items():
        o = outs[k]
        speech = (f", {len(o.audio_codes)} frames, {len(o.audio) / o.sample_rate:.2f} s of audio "
                  f"({o.audio_finish_reason}), first audio {o.times['first_audio_s'] * 1e3:.0f} ms"
                  if o.audio is not None else "")
        print(f"{k}: kind {r.kind}, {len(r.prompt.ids)} prompt rows, {len(r.output)} tokens, {r.finish_reason}{speech}")
    print(engine.stats_line(stats))
    print("rungs:", json.dumps(stats["rungs"]))
    assert all(r.finish_reason == "length" for r in reqs.values()) and engine.scheduler.pool_full()
    assert all(len(o.audio) > 0 for o in outs.values() if o.audio is not None), "a speaking request made no audio"
    if a.json:
        speech = {k: {"frames": len(o.audio_codes), "audio_s": len(o.audio) / o.sample_rate, **o.times}
                  for k, o in outs.items() if o.audio is not None}
        Path(a.json).write_text(json.dumps({"kinds": {k: r.kind for k, r in reqs.items()}, "speech": speech, **stats},
                                           indent=1))


def turns(engine, user: list[int]) -> list[int]:
    """<|im_start|>user ... <|im_start|>assistant in the speech host's ids: the turn a speaking kind answers."""
    ids = engine.host.speech.ids
    return [ids["im_start_token_id"], ids["user_token_id"], *user, ids["im_start_token_id"], ids["assistant_token_id"]]


if __name__ == "__main__":
    main()
