"""The short-segment ragged attention kernel (resources/ragged_triton.py, the 'triton' backend) on the GPU at
the code predictor's shapes (16 query and 8 key heads of 128, causal 16-row frames) in bf16, built as the
runtime builds it (make_backend, for a captured rung): against an fp32 reference (RaggedTorch over fp32
copies) its error is at most FlashInfer fa3's on the same inputs (x1.25 + one bf16 ulp of the output's scale:
fa3 rounds p to bf16, this kernel keeps it in fp32, and both round the output once), for the rung's real and
padding rows alike; a CUDA graph of it replays the eager result after the layout is replanned in place to
other key segments. Skipped without CUDA."""
from __future__ import annotations

import pytest
import torch

from resources.base import StepShape
from resources.ragged_attention import RaggedAttentionSpec, RaggedTorch

pytestmark = pytest.mark.gpu

CP = RaggedAttentionSpec(name="code_predictor_attn", num_heads=16, num_kv_heads=8, head_dim=128, max_segment=16,
                         causal=True, rows_per_segment=16, segment_axis="seqs")


def qkv(rows: int, seed: int):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(rows, h, 128, device="cuda", generator=gen).to(torch.bfloat16) * 2
            for h in (16, 8, 8)]


def backend(name: str, rung: StepShape):
    from resources.flashinfer_backend import make_backend

    workspace = torch.zeros(64 * 2**20, dtype=torch.uint8, device="cuda")
    return make_backend(CP, name, workspace, True, rung)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("seqs,real", [(1, 1), (2, 1), (32, 32), (32, 3)])
def test_error_is_at_most_fa3s(seqs, real):
    pytest.importorskip("triton")
    pytest.importorskip("flashinfer")
    rung = StepShape(rows=16 * seqs, seqs=seqs, kv_len=16)
    q, k, v = qkv(rung.rows, seqs * 100 + real)
    cu = [16 * i for i in range(real + 1)]
    padded = [16 * i for i in range(seqs + 1)]         # the padding rows as segments of their own
    ref = RaggedTorch(CP, padded)(q.float(), k.float(), v.float())
    got = {}
    for name in ("triton", "fa3"):
        b = backend(name, rung)
        b.plan(cu)
        got[name] = b(q, k, v)
        torch.cuda.synchronize()
    n = 16 * real                                       # fa3 leaves padding rows unwritten; triton writes them
    et, ef = ((got[name][:n].float() - ref[:n]).abs().max().item() for name in ("triton", "fa3"))
    ulp = ref.abs().max().item() * 2 ** -8
    assert et <= 1.25 * ef + ulp, (et, ef)
    assert got["triton"].dtype == torch.bfloat16 and torch.isfinite(got["triton"]).all()
    if n < rung.rows:                                   # the padding rows' own segments
        assert (got["triton"][n:].float() - ref[n:]).abs().max().item() <= 1.25 * ef + ulp


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_captured_graph_replays_after_replanning():
    """Replanned in place to other key segments (a frame of 10 keys: its first 6 queries see none), the graph
    captured on the first layout replays the second's answer, as an eager call of the same backend gives it."""
    pytest.importorskip("triton")
    rung = StepShape(rows=16 * 8, seqs=8, kv_len=16)
    q, k, v = qkv(rung.rows, 7)
    b = backend("triton", rung)
    full = [16 * i for i in range(9)]
    b.plan(full)
    first = b(q, k, v)                                  # compiles outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = b(q, k, v)
    short = [0, 16, 26] + [26 + 16 * i for i in range(1, 7)]
    for cu_k in (short, full):
        b.plan(full, cu_k)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, b(q, k, v)), cu_k
        ref = RaggedTorch(CP, full, cu_k)(q.float(), k.float(), v.float())
        seen = [r for r in range(rung.rows) if not 16 <= r < 22] if cu_k is short else list(range(rung.rows))
        assert (out[seen].float() - ref[seen]).abs().max().item() < 0.05, cu_k
    assert torch.equal(out, first)
