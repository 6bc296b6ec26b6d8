"""Qwen3.5 served on the GPU, held to an independent reference: the tiny preset planned for the h200, booted with
seeded bf16 weights; 12 t2t requests arriving over several steps, so decode replays captured rungs padded onto
the padding slot, prompts run eagerly (chunked, mixed with decode) on flash-linear-attention's kernels, and
slots are freed and taken again. Every logit row the engine sampled from is compared with one CPU fp32 forward
of the same weights over the request's whole sequence (prompt and the tokens the GPU chose) through the torch
rule and torch attention: the GPU's error must be at most the same CPU forward's own in bf16 (mean over the rows,
with a 25% margin). Then: no slot or page is held. Skipped without CUDA, flashinfer-python or fla-core."""
from __future__ import annotations

import copy

import pytest
import torch

from graphc.cli import main
from graphc.plan import load_plan
from graphc.runtime.engine import Engine
from graphc.runtime.sampler import SamplingParams
from graphc.step import StepContext
from resources.linear_state import StateStep, new_state
from resources.paged_kv import PageAllocator, PagedTorch, new_cache
from tests.leak import held

pytestmark = pytest.mark.gpu


def reference(engine: Engine, ids: list[int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Logits of every row of one sequence, in one CPU forward of the engine's own weights in `dtype`."""
    llm = copy.deepcopy(engine.boot.modules["llm"]).to(device="cpu", dtype=dtype)
    for m in llm.modules():
        if hasattr(m, "fla_gdn"):
            m.fla_gdn = 0
    name = str(dtype).removeprefix("torch.")
    kv = engine.executor.kv_spec.model_copy(update={"dtype": name})
    state = engine.model.resource("llm_state").model_copy(update={"conv_dtype": name})
    n = len(ids)
    pages = kv.pages_for(n)
    ctx = StepContext({"kv": PagedTorch(kv, new_cache(kv, pages), [n], [n], [PageAllocator(pages).allocate(pages)]),
                       "state": StateStep(new_state(state, 1), [0], [n], [False])})
    with torch.inference_mode():
        return llm(ctx, token_ids=torch.tensor(ids), positions=torch.arange(n).expand(3, n).contiguous(),
                   sample_rows=torch.arange(n))["logits"]


def test_captured_decode_on_state_slots_matches_a_cpu_fp32_forward(tmp_path):
    pytest.importorskip("flashinfer")
    pytest.importorskip("fla")
    path = str(tmp_path / "q.plan")
    assert main(["plan", "models/qwen3_5.py", "--preset", "tiny", "--gpu", "h200", "-o", path, "-q"]) == 0
    engine = Engine(load_plan(path), random_weights=True, emulate=True)
    assert engine.boot.modules["llm"].model.language_model.layers[0].linear_attn.fla_gdn == 1
    seen: dict[tuple[str, int], torch.Tensor] = {}
    run = engine.executor.run

    def recording(plan):
        result = run(plan)
        for c, row in zip([c for c in plan.chunks if c.sample], result.logits):
            seen[(c.req.id, c.end - 1)] = row.float().cpu()
        return result
    engine.executor.run = recording

    gen = torch.Generator().manual_seed(0)
    lengths = [5, 40, 130, 7, 300, 16, 64, 3, 90, 200, 33, 12]        # some cut into chunks
    arrivals = [0, 0, 0, 1, 1, 2, 4, 4, 6, 9, 12, 20]
    prompts = [torch.randint(0, 500, (n,), generator=gen).tolist() for n in lengths]
    reqs, step = [], 0
    while len(reqs) < len(prompts) or engine.has_work():
        for i, at in enumerate(arrivals):
            if at == step:
                reqs.append(engine.add(prompt_token_ids=prompts[i],
                                       params=SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)))
        engine.step()
        step += 1
    stats = engine.stats()
    decode = {r: n for k, n in stats["rungs"].items() for key, r in [k.rsplit("/", 1)] if key == "llm_decode/llm"}
    print(f"\nrungs: {stats['rungs']}")
    assert decode and "eager" not in decode and stats["replayed"] > 0
    assert held(engine) == []
    errs = {"gpu": [], "cpu bf16": []}
    for req in reqs:
        ids = req.prompt.ids + req.output[:-1]
        ref, bf16 = reference(engine, ids), reference(engine, ids, torch.bfloat16)
        rows = sorted(r for (rid, r) in seen if rid == req.id)
        assert len(rows) == len(req.output)
        for r in rows:
            errs["gpu"].append(float((seen[(req.id, r)] - ref[r]).norm() / ref[r].norm()))
            errs["cpu bf16"].append(float((bf16[r] - ref[r]).norm() / ref[r].norm()))
    mean = {k: sum(v) / len(v) for k, v in errs.items()}
    print(f"relative error of sampled logit rows against CPU fp32 over {len(seen)} rows: mean {mean}, "
          f"worst {max(errs['gpu']):.2e} (gpu) {max(errs['cpu bf16']):.2e} (cpu bf16)")
    assert mean["gpu"] <= 1.25 * mean["cpu bf16"] + 1e-3, mean
