"""A JSONL of requests for `graphc run --requests` on seeded weights (token ids, no tokenizer): t2t prompts
of random ids, a2t prompts whose one audio placeholder id stands for a synthetic WAV written beside it, and
i2t prompts likewise with a random PNG, and t2s prompts (a user turn of random ids, then the assistant's
turn) that ask for speech too.

    python examples/bench/make_requests.py out/requests.jsonl --t2t 32 --a2t 32 --max-tokens 64
    graphc run plans/qwen3_omni_h200.plan --random-weights --requests out/requests.jsonl --stats out/stats.json

The placeholders are the host's media token ids (Qwen3-Omni's real ones unless --audio-token / --image-token
say otherwise).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def pixels(rng, h: int, w: int, pattern: str, i: int) -> np.ndarray:
    """An h x w RGB image: random noise, or three gradients (compresses to a small PNG)."""
    if pattern == "noise":
        return rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    yy, xx = np.mgrid[0:h, 0:w]
    return np.stack([xx * 255 // w, yy * 255 // h, (xx + yy + 37 * i) % 256], -1).astype(np.uint8)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--t2t", type=int, default=32)
    ap.add_argument("--a2t", type=int, default=32)
    ap.add_argument("--i2t", type=int, default=0, help="prompts around one random image (PNG) of 128-1024 px a side")
    ap.add_argument("--t2s", type=int, default=0, help="prompts answered with text and speech (greedy)")
    ap.add_argument("--frames", type=int, default=64, help="the most codec frames a t2s answer speaks (80 ms each)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=128, help="text tokens per prompt (t2t), around the audio (a2t)")
    ap.add_argument("--seconds", type=float, nargs=2, default=(2.0, 20.0), help="audio lengths drawn in this range")
    ap.add_argument("--vocab", type=int, default=151_000, help="prompt ids are drawn below this")
    ap.add_argument("--audio-token", type=int, default=151_675)
    ap.add_argument("--image-token", type=int, default=151_655)
    ap.add_argument("--image-frame", type=int, nargs=2, default=None, metavar=("START", "END"),
                    help="ids around each image placeholder (Qwen3.5: 248053 248054; Qwen3-Omni's prompts take none)")
    ap.add_argument("--pattern", choices=["noise", "gradient"], default="noise",
                    help="image pixels: random noise, or gradients (small PNGs; seeded weights see no difference)")
    ap.add_argument("--turn-tokens", type=int, nargs=3, default=(151_644, 872, 77_091),
                    help="<|im_start|>, user and assistant ids (a t2s prompt's turns)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    import soundfile as sf

    rng = np.random.default_rng(a.seed)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(a.t2t + a.a2t + a.i2t + a.t2s):
        ids = rng.integers(0, a.vocab, a.prompt).tolist()
        line = {"id": f"r{i}", "max_tokens": a.max_tokens, "temperature": 0, "ignore_eos": True}
        if i >= a.t2t + a.a2t + a.i2t:
            start, user, assistant = a.turn_tokens
            ids = [start, user] + ids + [start, assistant]
            line |= {"modalities": ["text", "audio"], "audio": {"temperature": 0, "max_frames": a.frames}}
        elif i >= a.t2t + a.a2t:
            from PIL import Image

            h, w = (int(x) for x in rng.integers(128, 1025, 2))
            img = out.parent / f"image_{i}.png"
            Image.fromarray(pixels(rng, h, w, a.pattern, i)).save(img)
            frame = a.image_frame or ()
            image = [frame[0], a.image_token, frame[1]] if frame else [a.image_token]
            ids = ids[: a.prompt // 2] + image + ids[a.prompt // 2:]
            line["media"] = [{"type": "image", "path": str(img)}]
        elif i >= a.t2t:
            n = int(rng.uniform(*a.seconds) * 16000)
            t = np.arange(n) / 16000
            wave = (0.2 * np.sin(2 * np.pi * rng.uniform(100, 800) * t) + 0.02 * rng.standard_normal(n))
            wav = out.parent / f"audio_{i}.wav"
            sf.write(wav, wave.astype(np.float32), 16000)
            ids = ids[: a.prompt // 2] + [a.audio_token] + ids[a.prompt // 2:]
            line["media"] = [{"type": "audio", "path": str(wav)}]
        line["prompt_token_ids"] = ids
        lines.append(line)
    rng.shuffle(lines)
    out.write_text("".join(json.dumps(x) + "\n" for x in lines))
    print(out)


if __name__ == "__main__":
    main()
