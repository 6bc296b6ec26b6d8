"""Qwen3.5 served on the GPU, held to an independent reference: a small Qwen3.5 checkpoint (the tiny preset's
budgets; the nodes from a config.json with head dims the GPU kernels take, weights drawn here) planned for the
h200; 12 t2t requests arriving over several steps (tests/gpu/arrivals.py), so decode replays captured rungs
padded onto the padding slot, prompts run eagerly (chunked, mixed with decode) on flash-linear-attention's
kernels, and slots are freed and taken again. Every logit row the engine sampled from is compared with one CPU
fp32 forward of the same weights over the request's whole sequence (prompt and the tokens the GPU chose) through
the torch rule and torch attention: the GPU's error must be at most the same CPU forward's own in bf16 (mean over
the rows, with a 25% margin). Then: no slot or page is held. Skipped without CUDA, flashinfer-python or fla-core."""
from __future__ import annotations

import copy
import json

import pytest
import torch
from safetensors.torch import save_file

from graphc.cli import main
from graphc.plan import load_plan
from graphc.runtime.engine import Engine
from graphc.step import StepContext
from models.components.qwen3_5_text import Qwen3_5LM
from models.components.qwen3_5_text_config import Qwen3_5TextConfig
from models.qwen3_5 import TINY
from resources.linear_state import StateStep, new_state
from resources.paged_kv import PageAllocator, PagedTorch, new_cache
from tests.gpu.arrivals import run_arrivals
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


# FlashInfer's attention takes head_dim 64 (not the tiny preset's 32); 16 rotary dims, M-RoPE sections 4/2/2
SMALL = dict(TINY.model_dump(), hidden_size=128, head_dim=64, mrope_section=[4, 2, 2], linear_key_head_dim=32,
             linear_value_head_dim=32, layer_types=list(TINY.layer_types), tie_word_embeddings=False)


def small_plan(tmp_path, gpu: str) -> str:
    """A checkpoint of SMALL's shapes with weights drawn by tests/parity/weights.randomize, and its plan."""
    ckpt = tmp_path / "ckpt"
    if not ckpt.exists():
        ckpt.mkdir()
        llm = Qwen3_5LM(Qwen3_5TextConfig.from_text_config(SMALL))
        with torch.no_grad():
            for name, p in llm.named_parameters():      # A_log and dt_bias: decays in (0, 1) per head
                p.copy_(torch.randn_like(p) * (p.shape[-1] ** -0.5 if p.dim() > 1 else 0.1))
            for layer in llm.body.layers:
                if layer.is_linear:
                    layer.linear_attn.A_log.uniform_(-2.0, 0.0)
        save_file({k: v.contiguous() for k, v in llm.state_dict().items()}, str(ckpt / "model.safetensors"))
        text = SMALL | {"model_type": "qwen3_5_text", "dtype": "bfloat16"}
        (ckpt / "config.json").write_text(json.dumps(text))
    path = str(tmp_path / f"q_{gpu}.plan")
    assert main(["plan", "models/qwen3_5.py", "--preset", "tiny", "--checkpoint", str(ckpt), "--gpu", gpu,
                 "-o", path, "-q"]) == 0
    return path


def test_captured_decode_on_state_slots_matches_a_cpu_fp32_forward(tmp_path):
    pytest.importorskip("flashinfer")
    pytest.importorskip("fla")
    from graphc.runtime.boot import local_gpu

    path = small_plan(tmp_path, local_gpu()[0] or "h200")       # planned for this card (h100 or h200)
    engine = Engine(load_plan(path), str(tmp_path / "ckpt"), emulate=True)
    layers = engine.boot.modules["llm"].model.language_model.layers
    assert layers[0].linear_attn.fla_gdn == 1 and all(x.self_attn.gated_rope == 1 for x in layers if not x.is_linear)
    reqs, seen = run_arrivals(engine)
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
