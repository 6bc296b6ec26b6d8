"""The engine on the GPU, held to an independent reference: tiny_h100.plan booted with seeded bf16 weights,
12 t2t requests arriving over several steps (chunked prefills, mixed steps, decode at several rungs, every
step a replayed graph padded to its rung), then every logit row the engine sampled from compared with one
CPU fp32 forward of the same weights over each request's whole sequence (prompt and the tokens the GPU
chose), through the torch reference attention. Skipped without CUDA; needs flashinfer-python."""
from __future__ import annotations

import copy

import pytest
import torch

from graphc.cli import main
from graphc.plan import load_plan
from graphc.runtime.engine import Engine
from graphc.step import StepContext
from resources.paged_kv import PageAllocator, PagedTorch, new_cache
from tests.gpu.arrivals import run_arrivals

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("limit", [None, 32])
def test_replayed_steps_match_a_cpu_fp32_forward_of_the_same_weights(limit, tmp_path):
    """limit: the prefill walk captures rungs up to 32 tokens, so longer chunks run eagerly, as the plan says."""
    pytest.importorskip("flashinfer")
    path = "plans/tiny_h100.plan"
    if limit is not None:
        path = str(tmp_path / "limited.plan")
        assert main(["plan", "models/tiny_omni.py", "--gpu", "h100", "--set", f"walks.prefill.capture_limit.decoder={limit}",
                     "-o", path, "-q"]) == 0
    engine = Engine(load_plan(path), random_weights=True, emulate=True)
    reqs, seen = run_arrivals(engine)
    stats = engine.stats()
    assert stats["replayed"] > 0
    if limit is None:
        assert stats["eager"] == 0
    else:
        assert stats["rungs"].get("prefill/decoder/eager", 0) > 0
        assert all(r == "eager" or int(r) <= limit for k, r in (x.rsplit("/", 1) for x in stats["rungs"])
                   if k == "prefill/decoder")
    assert engine.scheduler.idle() and engine.scheduler.pool_full()

    decoder = copy.deepcopy(engine.boot.modules["decoder"]).float().cpu()
    spec = engine.executor.kv_spec
    worst = 0.0
    for req in reqs:
        ids = req.prompt.ids + req.output[:-1]
        n = len(ids)
        cache = new_cache(spec.model_copy(update={"dtype": "float32"}), spec.pages_for(n))
        table = PageAllocator(spec.pages_for(n)).allocate(spec.pages_for(n))
        ctx = StepContext({"kv": PagedTorch(spec, cache, [n], [n], [table])})
        with torch.inference_mode():
            ref = decoder(ctx, token_ids=torch.tensor(ids), positions=torch.arange(n),
                          sample_rows=torch.arange(n))["logits"]
        rows = [r for (rid, r) in seen if rid == req.id]
        assert len(rows) == len(req.output)
        for r in rows:
            got, want = seen[(req.id, r)], ref[r]
            worst = max(worst, float((got - want).norm() / want.norm()))
    print(f"worst relative error of a sampled logit row against CPU fp32: {worst:.2e} over {len(seen)} rows")
    assert worst < 3e-2, worst
