"""What a guided request costs a step on the host: its matcher's fill of the next-token bitmask, and the mask
applied to the logits (graphc/runtime/grammar.py), at a Qwen-sized vocabulary (151,936 logits).

    python examples/bench/grammar_mask.py --json OUT.json
    python examples/bench/grammar_mask.py --device cuda --json OUT.json     # the mask applied on a GPU

The vocabulary is synthetic byte-level BPE (no checkpoint is needed): the 256 byte symbols, then words and
identifiers of Python's standard library with and without a leading space, then runs of digits and
punctuation, to 151,643 tokens and padded to 151,936 as Qwen's lm_head is. Each guided row walks its grammar
by sampling its masked random logits, as a model with random weights would; every step times the fill of
every row, then one apply over the batch.
"""
from __future__ import annotations

import argparse
import itertools
import json
import re
import statistics
import sys
import sysconfig
import time
from pathlib import Path

import torch

WIDTH, TOKENS = 151_936, 151_643
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}},
    "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                "required": ["city", "zip"]}}, "required": ["name", "age", "tags", "address"]}


def vocabulary() -> list[str]:
    from tokenizers import pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    words: dict[str, None] = {}
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        for w in re.findall(r"[A-Za-z_]{2,16}", path.read_text(errors="ignore")):
            words.setdefault(w)
            words.setdefault("\u0120" + w)                     # the byte-level spelling of " " + w
        if len(words) > TOKENS:
            break
    runs = ("".join(p) for n in (2, 3) for p in itertools.product("0123456789{}[]\":,.-_ ", repeat=n))
    vocab = dict.fromkeys(alphabet)
    for tok in itertools.chain(words, (r.replace(" ", "\u0120") for r in runs)):
        if len(vocab) >= TOKENS:
            break
        vocab.setdefault(tok)
    return list(vocab)


def tokenizer(vocab: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(vocab)}, []))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>", "<|im_end|>"])
    return tok


def run(grammars, guide, batch: int, steps: int, seed: int = 0, device: str = "cpu") -> dict:
    from graphc.runtime.grammar import apply_mask, step_mask

    torch.manual_seed(seed)
    matchers = [grammars.matcher(guide) for _ in range(batch)]
    fill, apply = [], []
    for _ in range(steps):
        logits = torch.randn(batch, WIDTH, device=device)
        sync(device)
        t0 = time.perf_counter()
        mask = step_mask(matchers, [m.accepted for m in matchers], WIDTH)
        t1 = time.perf_counter()
        masked = apply_mask(logits, mask)
        sync(device)                                        # the apply's time is the device's
        t2 = time.perf_counter()
        fill.append((t1 - t0) * 1e3)
        apply.append((t2 - t1) * 1e3)
        for i, m in enumerate(matchers):
            m.accept(int(torch.softmax(masked[i], 0).multinomial(1)))
            if m.terminated:
                matchers[i] = grammars.matcher(guide)           # a new request in its place
    return {"batch": batch, "steps": steps, "fill_ms_p50": statistics.median(fill),
            "fill_ms_per_row_p50": statistics.median(fill) / batch, "fill_ms_p90": sorted(fill)[int(0.9 * steps)],
            "apply_ms_p50": statistics.median(apply), "step_ms_p50": statistics.median(a + b for a, b in zip(fill, apply))}


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--device", default="cpu", help="where the logits are and the mask is applied (cpu, cuda)")
    args = ap.parse_args(argv)
    from graphc.runtime.grammar import Grammars, Guide

    tok = tokenizer(vocabulary())
    t0 = time.perf_counter()
    grammars = Grammars(tok, WIDTH, [tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")])
    out = {"vocab": tok.get_vocab_size(), "width": WIDTH, "tokenizer_info_s": time.perf_counter() - t0,
           "threads": torch.get_num_threads(), "device": args.device, "runs": []}
    for kind, guide in (("json_schema", Guide(kind="json_schema", json_schema=SCHEMA)),
                        ("json_object", Guide(kind="json_object"))):
        t0 = time.perf_counter()
        grammars.compile(guide)
        out[f"compile_{kind}_s"] = time.perf_counter() - t0
        for b in args.batch:
            out["runs"].append({"guide": kind} | run(grammars, guide, b, args.steps, device=args.device))
            print(json.dumps(out["runs"][-1]), file=sys.stderr)
    text = json.dumps(out, indent=1)
    if args.json:
        args.json.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
