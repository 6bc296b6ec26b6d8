"""The one-launch paged decode kernel (resources/paged_triton.py, the 'triton' decode backend) on the GPU at the
Omni thinker's and talker's shapes (32 and 16 query heads over 4 and 2 key heads of 128) in bf16, built as the
runtime builds it (make_backend, for a captured decode rung): against an fp32 reference (PagedTorch over fp32
copies) its error is at most FlashInfer fa2's on the same inputs (x1.25 + one bf16 ulp of the output's scale),
from a lone key to histories of 8,192 keys that many splits share and the last one in merges, on pages of 16 and
of 128 keys; the step's K/V
lands in its page bit for bit; a CUDA graph of it, replayed after the layout is replanned in place, equals an
eager call, and leaves every split counter at 0. Skipped without CUDA."""
from __future__ import annotations

import random

import pytest
import torch

from resources.base import StepShape
from resources.paged_kv import PagedKVSpec, PagedTorch

pytestmark = pytest.mark.gpu

SHAPES = {"thinker": (32, 4), "talker": (16, 2)}
POOL = 2200


def spec(shape: str, page: int = 16) -> PagedKVSpec:
    hq, hkv = SHAPES[shape]
    return PagedKVSpec(name=f"{shape}_kv", num_layers=2, num_qo_heads=hq, num_kv_heads=hkv, head_dim=128,
                       max_seq_len=8192, page_size=page)


def layout(rng: random.Random, kv_lens: list[int], page: int = 16) -> list[list[int]]:
    need = [-(-kv // page) for kv in kv_lens]
    pages = rng.sample(range(POOL * 16 // page), sum(need))
    out, at = [], 0
    for n in need:
        out.append(pages[at:at + n])
        at += n
    return out


def backend(name: str, s: PagedKVSpec, seqs: int, cache: torch.Tensor):
    from resources.flashinfer_backend import make_backend

    workspace = torch.zeros(64 * 2**20, dtype=torch.uint8, device="cuda")
    return make_backend(s, name, workspace, True, StepShape(rows=seqs, seqs=seqs, kv_len=s.max_seq_len,
                                                            phase="decode"), cache=cache, decode_backend=name)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("kv_lens,page", [([1], 16), ([17], 16), ([300, 2048], 16), ([8192, 5, 4000, 129], 16),
                                          ([8192, 129, 1], 128)])      # the 80 GB Omni plan's thinker pages
def test_error_is_at_most_fa2s_and_the_append_is_exact(shape, kv_lens, page):
    pytest.importorskip("triton")
    pytest.importorskip("flashinfer")
    s, n = spec(shape, page), len(kv_lens)
    gen = torch.Generator(device="cuda").manual_seed(n * 1000 + kv_lens[0])
    pool = torch.randn(2, POOL * 16 // page, 2, page, s.num_kv_heads, 128, device="cuda",
                       generator=gen).to(torch.bfloat16)
    q, k, v = (torch.randn(n, h, 128, device="cuda", generator=gen).to(torch.bfloat16)
               for h in (s.num_qo_heads, s.num_kv_heads, s.num_kv_heads))
    tables = layout(random.Random(n), kv_lens, page)
    ref_cache = pool.float()
    ref = PagedTorch(s.model_copy(update={"dtype": "float32"}), ref_cache, [1] * n, kv_lens, tables)(
        1, q.float(), k.float(), v.float())
    got = {}
    for name in ("triton", "fa2"):
        cache = pool.clone()
        b = backend(name, s, n, cache)
        b.plan([1] * n, kv_lens, tables)
        got[name] = b(1, q, k, v)
        torch.cuda.synchronize()
        assert torch.equal(cache.float(), ref_cache), name
    et, ef = ((got[name].float() - ref).abs().max().item() for name in ("triton", "fa2"))
    assert et <= 1.25 * ef + ref.abs().max().item() * 2 ** -8, (et, ef)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_captured_graph_replays_after_replanning():
    pytest.importorskip("triton")
    s = spec("thinker")
    cache = torch.randn(2, POOL, 2, 16, 4, 128, device="cuda").to(torch.bfloat16)
    q, k, v = (torch.randn(4, h, 128, device="cuda").to(torch.bfloat16) for h in (32, 4, 4))
    b, rng = backend("triton", s, 4, cache), random.Random(3)
    first = [8192, 8192, 8192, 8192]
    b.plan([1] * 4, first, layout(rng, first))
    b(1, q, k, v)                                       # compiles outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = b(1, q, k, v)
    for kv_lens in ([3000, 1, 257, 8000], [64, 65, 2, 6000]):
        b.plan([1] * 4, kv_lens, layout(rng, kv_lens))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, b(1, q, k, v)), kv_lens
        assert b.buffers["split_counts"].abs().sum().item() == 0
