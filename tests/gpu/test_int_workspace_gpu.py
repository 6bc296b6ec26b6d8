"""Captured FlashInfer wrappers of one resource sharing one int workspace (issue 14) give the outputs of
wrappers with one each: the thinker's paged KV at its real heads (32 query, 4 KV, head dim 128; fa3
prefill, fa2 decode, as the plans choose), three captured rungs, 12 steps that cycle through them on
random layouts and inputs, each planned right before its replay as the runtime does. Bit for bit, and the
KV pool after them too. Skipped without CUDA; needs flashinfer-python."""
from __future__ import annotations

import random

import pytest
import torch

from graphc.units import MiB
from resources.base import StepShape
from resources.flashinfer_backend import int_workspace, make_backend
from resources.paged_kv import PagedKVSpec, new_cache
from tests.gpu.test_attention_gpu import script

pytestmark = pytest.mark.gpu

KV = PagedKVSpec(name="t_shared", num_layers=1, num_qo_heads=32, num_kv_heads=4, head_dim=128, max_seq_len=512)
RUNGS = {"decode4": StepShape(rows=4, seqs=4, kv_len=512, phase="decode"),
         "prefill64": StepShape(rows=64, seqs=2, kv_len=512),
         "decode16": StepShape(rows=16, seqs=16, kv_len=512, phase="decode")}
ORDER = ["decode4", "prefill64", "decode16", "decode4", "decode16", "prefill64"] * 2
POOL = 16 * KV.pages_for(512)


def run(shared: bool) -> tuple[list[torch.Tensor], torch.Tensor, set[int]]:
    torch.manual_seed(0)
    cache = new_cache(KV, POOL, "cuda").normal_()
    float_ws = torch.zeros(128 * MiB, dtype=torch.uint8, device="cuda")
    ints = int_workspace(KV, "cuda") if shared else None
    backends, graphs, bufs = {}, {}, {}
    rng = random.Random(0)
    for name, rung in RUNGS.items():
        case = script.Case(name, KV, rung)
        b = make_backend(KV, "fa3", float_ws, True, rung, cache=cache, decode_backend="fa2", ints=ints)
        q, k, v = script.qkv(case)
        qo, kv = script.paged_layout(rng, case, full=True)
        script.replan(b, qo, kv, script.page_tables(rng, case, kv))
        graphs[name], out = script.capture(lambda b=b, q=q, k=k, v=v: b(0, q, k, v))
        backends[name], bufs[name] = b, (q, k, v, out)
    used = {w._int_workspace_buffer.data_ptr() for b in backends.values() for w in (b._prefill, b._decode) if w}
    outs = []
    gen = torch.Generator(device="cuda").manual_seed(1)
    for name in ORDER:
        case = script.Case(name, KV, RUNGS[name])
        q, k, v, out = bufs[name]
        for t in (q, k, v):
            t.normal_(generator=gen)
        qo, kv = script.paged_layout(rng, case, full=False)
        backends[name].plan(qo, kv, script.page_tables(rng, case, kv))      # right before its replay
        graphs[name].replay()
        outs.append(out[:sum(qo)].clone())
    torch.cuda.synchronize()
    return outs, cache, used


def test_shared_int_workspace_replays_equal_one_each():
    pytest.importorskip("flashinfer")
    shared, shared_cache, shared_ptrs = run(True)
    alone, alone_cache, alone_ptrs = run(False)
    assert len(shared_ptrs) == 1 and len(alone_ptrs) == len(RUNGS)       # one buffer, against one a rung
    assert len(shared) == len(ORDER)
    for i, (a, b) in enumerate(zip(shared, alone)):
        assert torch.equal(a, b), f"step {i} ({ORDER[i]}) differs"
    assert torch.equal(shared_cache, alone_cache)
