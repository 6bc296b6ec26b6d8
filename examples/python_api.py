"""graphc's Python API: boot a plan with graphc.Engine and generate() a few requests in one batch, no server.

    python examples/python_api.py tiny_omni.plan --checkpoint ckpt/tiny_omni    # chat messages, text out
    python examples/python_api.py plans/tiny_cpu.plan --random-weights          # seeded weights: token ids

(tiny_omni.plan and ckpt/tiny_omni as README.md's "Run" section makes them.) With --checkpoint the requests
are chat messages and a plain prompt, made into token ids by the checkpoint's tokenizer and chat template;
with --random-weights there is no tokenizer, so they are token ids. Each request is a dict of the fields a
line of `graphc run --requests` holds (messages | prompt | prompt_token_ids, sampling parameters by name);
generate() runs them together and returns one Output each, in order. Printed per request: its id, kind,
prompt and generated token counts, finish reason, and the text (or the token ids).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import graphc  # noqa: E402


def requests(with_tokenizer: bool, max_tokens: int) -> list[dict]:
    greedy = {"max_tokens": max_tokens, "temperature": 0}
    if with_tokenizer:
        return [{"id": "chat", "messages": [{"role": "user", "content": "hello world, how are you today?"}],
                 **greedy},
                {"id": "sampled", "messages": [{"role": "user", "content": "describe the video"}],
                 "max_tokens": max_tokens, "temperature": 0.8, "top_p": 0.9, "seed": 1},
                {"id": "prompt", "prompt": "the quick brown fox", **greedy}]
    return [{"id": "ids", "prompt_token_ids": [11, 12, 13, 14, 15], **greedy},
            {"id": "ids-sampled", "prompt_token_ids": [21, 22, 23], "max_tokens": max_tokens, "temperature": 0.8,
             "seed": 1}]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("plan", help="a plan file (graphc plan ... -o FILE)")
    weights = ap.add_mutually_exclusive_group(required=True)
    weights.add_argument("--checkpoint", metavar="DIR", help="weights, config.json, tokenizer.json, chat template")
    weights.add_argument("--random-weights", action="store_true", help="seeded weights, token ids only")
    ap.add_argument("--max-tokens", type=int, default=12)
    args = ap.parse_args(argv)

    engine = graphc.Engine(args.plan, checkpoint=args.checkpoint, random_weights=args.random_weights)
    try:
        print(engine.summary().splitlines()[0])
        outputs = engine.generate(requests(engine.tokenizer is not None, args.max_tokens))
    finally:
        engine.close()
    for out in outputs:
        what = repr(out.text) if out.text is not None else f"token ids {out.token_ids}"
        print(f"{out.id}: {out.kind}, {out.prompt_tokens} prompt tokens -> {len(out.token_ids)} tokens "
              f"({out.finish_reason}): {what}")
        if out.error:
            print(f"  error: {out.error}")
    return 0 if all(o.error is None for o in outputs) else 1


if __name__ == "__main__":
    sys.exit(main())
