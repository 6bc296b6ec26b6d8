"""The pdl knob on the GPU (models/components/norm_triton.pdl_launch): five decoder layers' one-row kernels at the
code predictor's shapes (hidden 1,024, 16 q heads and 8 kv heads of 128, intermediate 3,072; tests/unit/
test_pdl_knob.Block), captured in a CUDA graph with programmatic dependent launch, replayed over 50 fresh inputs:
every output bit for bit that of the same graph launched without it (a kernel that read its input before the
kernel before it had written it would differ). Prints both graphs' replay times (timing is the benchmarks'
business: examples/bench/ab_kernels.py --with pdl). Skipped without CUDA."""
from __future__ import annotations

import pytest
import torch

from graphc.modules import set_kernels
from tests.unit.test_pdl_knob import KNOBS, Block

pytestmark = pytest.mark.gpu


def _captured(pdl: int):
    torch.manual_seed(0)
    layers = torch.nn.Sequential(*[Block(1024, 16, 8, 128, 3072) for _ in range(5)])
    for p in layers.parameters():
        p.data.normal_(0, 0.05)
    for m in layers.modules():
        if hasattr(m, "eps") and isinstance(m.weight, torch.nn.Parameter):
            m.weight.data.normal_(1, 0.1)
    layers = layers.to(device="cuda", dtype=torch.bfloat16)
    set_kernels(layers, KNOBS | {"pdl": pdl})
    x = torch.zeros(1, 1024, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        for _ in range(2):
            layers(x)                                   # compile and warm outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = layers(x)
    return graph, x, y


def _replays(graph, x, y, inputs):
    out = []
    for z in inputs:
        x.copy_(z)
        graph.replay()
        out.append(y.clone())
    torch.cuda.synchronize()
    return out


def _ms(graph) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(5):
        graph.replay()
    start.record()
    for _ in range(100):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 100


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_pdl_graph_equals_the_plain_graph():
    pytest.importorskip("triton")
    gen = torch.Generator(device="cuda").manual_seed(1)
    inputs = [torch.randn(1, 1024, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(50)]
    plain, with_pdl = _captured(0), _captured(1)
    want, got = _replays(*plain, inputs), _replays(*with_pdl, inputs)
    assert all(torch.isfinite(w).all() for w in want)
    diff = [i for i, (a, b) in enumerate(zip(want, got)) if not torch.equal(a, b)]
    assert not diff, f"replays {diff} differ with pdl"
    print(f"5 layers one row: plain {_ms(plain[0]) * 1000:.1f} us, pdl {_ms(with_pdl[0]) * 1000:.1f} us")
