"""The pdl knob on the GPU (resources/pdl.py). Five decoder layers' one-row kernels at the code predictor's shapes (hidden 1,024, 16 q heads and 8 kv heads of 128, intermediate 3,072; tests/unit/
test_pdl_knob.Block), captured in a CUDA graph with programmatic dependent launch, replayed over 50 fresh inputs:
every output bit for bit that of the same graph launched without it (a kernel that read its input before the
kernel before it had written it would differ). Prints both graphs' replay times (timing is the benchmarks'
business: examples/bench/ab_kernels.py --with pdl). And the tiny GPU plan's engine with the knob on every node
against the same without it. Skipped without CUDA."""
from __future__ import annotations

import pytest
import torch

from graphc.modules import set_kernels
from tests.unit.test_pdl_knob import KNOBS, Block

pytestmark = pytest.mark.gpu


def seeded(layers: torch.nn.Module, std: float) -> torch.nn.Module:
    """layers with weights drawn N(0, std) and norm weights N(1, 0.1), in bf16 on the GPU."""
    for p in layers.parameters():
        p.data.normal_(0, std)
    for m in layers.modules():
        if hasattr(m, "eps") and isinstance(m.weight, torch.nn.Parameter):
            m.weight.data.normal_(1, 0.1)
    return layers.to(device="cuda", dtype=torch.bfloat16)


def graph_of(run, *keep):
    """(a CUDA graph of run(), its output), run twice first to compile and warm outside the capture. keep: the
    modules and tensors run reads, held by the graph: a graph holds no reference to what its kernels read, and a
    replay after they are freed reads whatever was allocated there since."""
    with torch.no_grad():
        for _ in range(2):
            run()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = run()
    graph.keep = keep
    return graph, y


def _captured(pdl: int):
    torch.manual_seed(0)
    layers = seeded(torch.nn.Sequential(*[Block(1024, 16, 8, 128, 3072) for _ in range(5)]), 0.05)
    set_kernels(layers, KNOBS | {"pdl": pdl})
    x = torch.zeros(1, 1024, device="cuda", dtype=torch.bfloat16)
    graph, y = graph_of(lambda: layers(x), layers)
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


def both_replayed(captured, n: int):
    """captured(0)'s and captured(1)'s graphs replayed over the same n random rows [1, 1,024]: (the graphs, the
    outputs of each), the first's all finite."""
    gen = torch.Generator(device="cuda").manual_seed(1)
    inputs = [torch.randn(1, 1024, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(n)]
    plain, other = captured(0), captured(1)
    want, got = _replays(*plain, inputs), _replays(*other, inputs)
    assert all(torch.isfinite(w).all() for w in want)
    return (plain[0], other[0]), want, got


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_pdl_graph_equals_the_plain_graph():
    pytest.importorskip("triton")
    (plain, with_pdl), want, got = both_replayed(_captured, 50)
    diff = [i for i, (a, b) in enumerate(zip(want, got)) if not torch.equal(a, b)]
    assert not diff, f"replays {diff} differ with pdl"
    print(f"5 layers one row: plain {_ms(plain) * 1000:.1f} us, pdl {_ms(with_pdl) * 1000:.1f} us")


def _engine_run(pdl: int):
    from graphc.plan import load_plan
    from graphc.runtime.engine import Engine
    from tests.gpu.arrivals import run_arrivals

    plan = load_plan("plans/tiny_h100.plan")
    for name, node in list(plan.nodes.items()):
        if node.kernels:
            plan.nodes[name] = node.model_copy(update={"kernels": node.kernels | {"pdl": pdl}})
    engine = Engine(plan, random_weights=True, emulate=True)
    reqs, seen = run_arrivals(engine)
    arrival = {r.id: i for i, r in enumerate(reqs)}         # request ids are fresh in each run: key by arrival
    rows = {(arrival[rid], end): row for (rid, end), row in seen.items()}
    out = [r.output for r in reqs], rows, engine.stats()["replayed"]
    del engine
    torch.cuda.empty_cache()
    return out


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_engine_with_pdl_equals_the_engine_without():
    """tiny_h100.plan with the pdl knob on every node (every Triton launch of its decode and prefill steps, the
    paged Triton decode too): tests/gpu/arrivals' 12 requests, their tokens and every sampled logit row bit for bit
    those of the plan without it."""
    pytest.importorskip("flashinfer")
    tokens, seen, replayed = _engine_run(0)
    tokens_pdl, seen_pdl, replayed_pdl = _engine_run(1)
    assert replayed == replayed_pdl > 0
    assert tokens_pdl == tokens
    assert seen_pdl.keys() == seen.keys()
    diff = [k for k in seen if not torch.equal(seen[k], seen_pdl[k])]
    assert not diff, f"{len(diff)} of {len(seen)} logit rows differ with pdl, e.g. {diff[:3]}"
