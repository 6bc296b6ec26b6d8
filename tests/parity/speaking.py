"""The tiny speaking Qwen3-Omni the speech tests share: its checkpoint and CPU plan, and a loop that serves a
list of requests through an Engine to its end."""
from __future__ import annotations

from pathlib import Path

from examples.make_tiny_checkpoint import build_tokenizer, omni_model, save
from graphc.cli import main
from graphc.runtime.engine import Engine
from tests.parity.test_code2wav import redraw
from tests.parity.weights import randomize


def speaking_omni(d: Path, redraw_code2wav: bool = False):
    """(the HF model, its tokenizer, the plan's path, the checkpoint's path): a tiny speaking Qwen3-Omni drawn with
    seed 3 and saved under d, planned for the CPU. redraw_code2wav: test_code2wav's draw of Code2Wav (unit gain in
    its Snake stack, which keeps fp32 rounding, batched or not, near 1e-7)."""
    tok = build_tokenizer()
    hf = omni_model(tok, speech=True)
    randomize(hf, seed=3)
    if redraw_code2wav:
        redraw(hf.code2wav)
    save(hf, tok, d / "ckpt")
    assert main(["plan", "models/qwen3_omni.py", "--preset", "tiny", "--checkpoint", str(d / "ckpt"), "--gpu", "cpu",
                 "-o", str(d / "p.plan"), "-q"]) == 0
    return hf, tok, d / "p.plan", d / "ckpt"


def serve_all(engine: Engine, items: list, arrivals: list[int]) -> list:
    """items: (messages, SamplingParams, SpeechParams or None); request i is added before step arrivals[i]. Steps
    until every request ends, checks every pool is whole once idle, and returns the outputs in order."""
    reqs, step = {}, 0
    while len(reqs) < len(items) or engine.has_work():
        for i, ((m, sp, speech), at) in enumerate(zip(items, arrivals)):
            if at == step and i not in reqs:
                reqs[i] = engine.add(messages=m, params=sp, speech=speech)
        engine.step()
        step += 1
    assert engine.scheduler.idle() and engine.scheduler.pool_full() and not engine.talking
    assert engine.speech.pages.num_free == engine.speech.capacity
    return [engine.output(reqs[i]) for i in range(len(items))]
