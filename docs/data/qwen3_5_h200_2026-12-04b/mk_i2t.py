import json, numpy as np
from PIL import Image
rng = np.random.default_rng(0)
lines = []
for i in range(48):
    h, w = (int(x) for x in rng.integers(512, 1025, 2))
    p = f".scratch/img_{i}.png"
    yy, xx = np.mgrid[0:h, 0:w]
    Image.fromarray(np.stack([(xx * 255 // w), (yy * 255 // h), ((xx + yy + 37 * i) % 256)], -1).astype(np.uint8)).save(p)
    ids = rng.integers(0, 150000, 64).tolist()
    ids = ids[:32] + [248053, 248056, 248054] + ids[32:]
    lines.append({"id": f"i{i}", "prompt_token_ids": ids, "media": [{"type": "image", "path": p}],
                  "max_tokens": 128, "temperature": 0, "ignore_eos": True})
open(".scratch/i2t.jsonl", "w").write("".join(json.dumps(x) + "\n" for x in lines))
