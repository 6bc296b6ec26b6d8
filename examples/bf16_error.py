"""bf16 error at real shapes on the GPU (issue 13: "bf16 outputs on the GPU stay at or under HF bf16's own
error against fp32 at real shapes; measure both, record both"):

    python examples/bf16_error.py --layers 4 --tokens 256 --json $OUT/bf16_error.json

Qwen3-Omni's thinker at its real text shapes (hidden 2048, 32 / 4 heads of 128, 128 experts top-8, vocab
152,064) cut to --layers decoder layers (the per-layer math is the model's; fp32 copies of all 48 would not
fit beside the bf16 ones), tiny encoders (not used). HF's Qwen3OmniMoeThinkerForConditionalGeneration gets
every weight re-drawn bf16-exact (tests/parity/weights.randomize, the parity tests' rule), graphc's Thinker
node loads them through the checkpoint loader. One text prompt of --tokens random ids is prefilled:

    HF fp32        the reference (TF32 off)
    HF bf16        HF's own bf16 run: its error against the reference is the yardstick
    graphc fp32    must equal the reference (sanity: the same weights and math)
    graphc bf16    the node with the plan's kernel choices on (fused norms, q/k/v and gate/up GEMMs, fused
                   router, fused MoE experts with the residual add): its error must stay at or under HF bf16's

graphc's attention here is the torch paged backend (resources/paged_kv.PagedTorch, SDPA): FlashInfer's
kernels are held to a reference on their own (docs/gpu-attention.md). Errors are rel = |a - b| / |b| over
logits of every row and the hidden states the talker takes, twice: with the real top-8 routing (a row
whose 8th and 9th experts lie closer than the runs' rounding picks another expert in one run: an O(1)
difference that counts swaps) and routed to all 128 experts (weights.route_to_all_experts: the same ops
minus that coin flip, as the CPU parity tests measure).

    python examples/bf16_error.py --part talker_moe --json $OUT/bf16_error_talker_moe.json

The talker's MoE block at its real shapes (hidden 1024, 128 experts of 384, top-6, a shared expert of 768
gated by sigmoid), HF's Qwen3OmniMoeTalkerTextSparseMoeBlock against graphc's SparseMoE by
tests/parity/weights.check_moe_block_bf16 (the parity tests' rule, router drawn narrow) on the GPU, on 256
rows at once (the fused experts) and a row a call (decode: the one-row kernel for the router, the shared
expert and its gate), with the H200 plan's kernel choices, --seed and two more. Rows where graphc's bf16
router picks other experts than HF's bf16 one (as a set: CUDA's top-k orders ties as it likes) are counted
and left out, as rows HF's bf16 routes elsewhere than its fp32 are.

    python examples/bf16_error.py --part vision --json $OUT/bf16_error_vision.json

The vision tower at its real config on one random image of 64 x 128 patches: HF's Qwen3OmniMoeVisionEncoder in
fp32 (the reference) and bf16 (sdpa), graphc's VisionEncoder (the same weights through the checkpoint loader)
in fp32 (sanity) and in bf16 with the H200 plan's choices (fused_rope, fused_norms, fused_gelu) on fa3 at 72 ->
128; the merged embeddings' and each deepstack level's errors against HF fp32.
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def thinker_config(layers: int, tiny: bool):
    from models.components.thinker import THINKER_30B_A3B
    update = {"num_hidden_layers": layers, "accept_hidden_layer": layers // 2}
    if tiny:                    # for checking the script on a CPU: no number of it means anything
        update |= dict(vocab_size=512, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                       moe_intermediate_size=32, num_experts=16, num_experts_per_tok=4, mrope_section=(4, 2, 2))
    return THINKER_30B_A3B.model_copy(update=update)


def hf_config(c):
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeThinkerConfig

    text = dict(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=768, num_hidden_layers=c.num_hidden_layers,
                num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads,
                head_dim=c.head_dim, moe_intermediate_size=c.moe_intermediate_size, num_experts=c.num_experts,
                num_experts_per_tok=c.num_experts_per_tok, norm_topk_prob=True, max_position_embeddings=65536,
                rms_norm_eps=c.rms_norm_eps,
                rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta,
                                 "mrope_section": list(c.mrope_section), "interleaved": True})
    audio = dict(num_mel_bins=16, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=32, d_model=16,
                 output_dim=c.hidden_size, downsample_hidden_size=8)
    vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=c.hidden_size,
                  deepstack_visual_indexes=[0], num_position_embeddings=16, patch_size=4)
    return Qwen3OmniMoeThinkerConfig(text_config=text, audio_config=audio, vision_config=vision)


def talker_moe(a) -> dict:
    """The talker's MoE block at its real shapes: errors of graphc's bf16 and HF's bf16 against HF fp32."""
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeTalkerConfig
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeTalkerTextSparseMoeBlock

    from models.components.moe import SparseMoE
    from models.components.talker import TALKER_30B_A3B
    from tests.parity.weights import check_moe_block_bf16

    t = TALKER_30B_A3B.text_config
    if a.tiny:                  # for checking the script on a CPU: no number of it means anything
        t = t.model_copy(update=dict(hidden_size=64, moe_intermediate_size=32, num_experts=16,
                                     shared_expert_intermediate_size=48))
    hf_cfg = Qwen3OmniMoeTalkerConfig(text_config=dict(
        hidden_size=t.hidden_size, moe_intermediate_size=t.moe_intermediate_size, num_experts=t.num_experts,
        num_experts_per_tok=t.num_experts_per_tok, norm_topk_prob=t.norm_topk_prob,
        shared_expert_intermediate_size=t.shared_expert_intermediate_size)).text_config
    torch.manual_seed(a.seed)
    hf = Qwen3OmniMoeTalkerTextSparseMoeBlock(hf_cfg).eval()
    ours = SparseMoE(t.hidden_size, t.moe_intermediate_size, t.num_experts, t.num_experts_per_tok, t.norm_topk_prob,
                     shared_intermediate=t.shared_expert_intermediate_size).eval()
    kernels = {"fused_norms": 1, "fused_router": 1, "fused_max_tokens": 16384, "gemv": 1}
    device = "cpu" if a.tiny else "cuda"
    results = {}
    for seed in (a.seed, a.seed + 1, a.seed + 2):
        for mode, one_row in (("256 rows", False), ("a row a call", True)):
            e = check_moe_block_bf16(hf, ours, rows=256, seed=seed, device=device, kernels=kernels, one_row=one_row,
                                     exact_routing=False)
            rows, elsewhere = e.pop("rows")
            results[f"seed {seed}, {mode}"] = {"rows": rows, "rows_routed_elsewhere_than_hf_bf16": elsewhere,
                                               **{k: {"graphc_bf16": g, "hf_bf16": h} for k, (g, h) in e.items()}}
            print(f"seed {seed}, {mode}: {rows} rows ({elsewhere} routed elsewhere than HF bf16); "
                  + "; ".join(f"{k} graphc {g:.4g} vs HF {h:.4g}" for k, (g, h) in e.items()), flush=True)
    return {"part": "talker_moe", "kernels": kernels, "results": results}


def vision(a) -> dict:
    """The vision tower at its real config (27 blocks of 16 heads of 72, MLP 4,304, deepstack after 8, 16, 24) on
    one random image of 64 x 128 patches (8,192; --tiny: a small tower and image on the CPU): HF fp32 (the
    reference, sdpa), HF bf16, graphc fp32 (sanity) and graphc bf16 with the H200 plan's kernel choices
    (fused_rope, fused_norms, fused_gelu) on FlashInfer's fa3 at 72 -> 128, as the plan runs it. Errors of the
    merged embeddings and each deepstack level against HF fp32."""
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeVisionEncoderConfig
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeVisionEncoder

    from graphc.modules import set_kernels
    from graphc.runtime.checkpoint import TensorShards, load_weights
    from graphc.step import StepContext
    from models.components.vision import VisionConfig, VisionEncoder
    from models.components.vision_inputs import VisionProcessing, build_step, process_image
    from resources import RaggedAttentionSpec
    from resources.ragged_attention import RaggedTorch
    from tests.conftest import rel
    from tests.parity.weights import randomize

    real = dict(depth=27, hidden_size=1152, num_heads=16, intermediate_size=4304, patch_size=16, temporal_patch_size=2,
                spatial_merge_size=2, out_hidden_size=2048, num_position_embeddings=2304,
                deepstack_visual_indexes=[8, 16, 24])
    if a.tiny:                  # for checking the script on a CPU: no number of it means anything
        real |= dict(depth=3, hidden_size=32, num_heads=4, intermediate_size=64, out_hidden_size=48,
                     num_position_embeddings=64, deepstack_visual_indexes=[1, 2])
    height, width = (64, 96) if a.tiny else (1024, 2048)         # 64 x 128 patches of 16
    dev = torch.device("cpu" if a.tiny else "cuda")
    hf_cfg = Qwen3OmniMoeVisionEncoderConfig(**real)
    hf_cfg._attn_implementation = "sdpa"
    torch.manual_seed(a.seed)
    hf = Qwen3OmniMoeVisionEncoder(hf_cfg).eval()
    randomize(hf, seed=a.seed, bf16_exact=True)
    ours = VisionEncoder(VisionConfig.from_hf(hf.config.to_dict())).eval()
    report = load_weights(ours, TensorShards(hf.state_dict()))
    assert report.loaded == len(ours.state_dict()), report
    gen = torch.Generator().manual_seed(a.seed + 1)
    image = torch.randint(0, 256, (3, height, width), dtype=torch.uint8, generator=gen)
    step = build_step([process_image(image, VisionProcessing(max_pixels=height * width))], ours.cfg)
    inputs = {k: v.to(dev) for k, v in step.inputs().items()}
    c = ours.cfg
    spec = RaggedAttentionSpec(name="vision_attn", num_heads=c.num_heads, head_dim=c.head_dim,
                               max_segment=step.cu_seqlens[-1])
    kernels = {"fused_gelu": 1, "fused_norms": 1, "fused_rope": 1}

    def attention(dtype):
        if a.tiny or dtype == torch.float32:
            return RaggedTorch(spec, step.cu_seqlens)
        from resources.flashinfer_backend import make_backend
        b = make_backend(spec, "fa3", torch.zeros(256 << 20, dtype=torch.uint8, device=dev), False, None,
                         run_head_dim=128)
        b.plan(step.cu_seqlens)
        return b

    def run_ours(model, dtype):
        with torch.no_grad():
            out = model(StepContext({"attn": attention(dtype)}), **inputs)
        return [out["embeds"].float()] + [d.float() for d in out["deepstack"]]

    def run_hf(model, dtype):
        with torch.no_grad():
            o = model(hidden_states=inputs["pixel_patches"].to(dtype), grid_thw=torch.tensor(step.grids, device=dev))
        return [o.pooler_output.float()] + [d.float() for d in o.deepstack_features]

    hf32, ours32 = hf.to(dev), ours.to(dev)
    ref = run_hf(hf32, torch.float32)
    sanity = run_ours(ours32, torch.float32)
    h16, o16 = copy.deepcopy(hf32).to(torch.bfloat16), copy.deepcopy(ours32).to(torch.bfloat16)
    set_kernels(o16, {} if a.tiny else kernels)
    hf_bf16, ours_bf16 = run_hf(h16, torch.bfloat16), run_ours(o16, torch.bfloat16)
    names = ["embeds"] + [f"deepstack {i}" for i in real["deepstack_visual_indexes"]]
    results = {n: {"fp32_sanity": rel(s, r), "hf_bf16": rel(h, r), "graphc_bf16": rel(g, r)}
               for n, s, h, g, r in zip(names, sanity, hf_bf16, ours_bf16, ref)}
    for n, row in results.items():
        print(f"{n}: graphc bf16 {row['graphc_bf16']:.4g} vs HF bf16 {row['hf_bf16']:.4g} "
              f"(x{row['graphc_bf16'] / row['hf_bf16']:.2f}); fp32 sanity {row['fp32_sanity']:.2g}", flush=True)
    return {"part": "vision", "patches": step.cu_seqlens[-1], "kernels": {} if a.tiny else kernels,
            "attention": "torch" if a.tiny else "fa3 at 128", "seed": a.seed, "results": results}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("thinker", "talker_moe", "vision"), default="thinker")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    ap.add_argument("--tiny", action="store_true", help="small shapes on the CPU: checks the script only")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    if a.part in ("talker_moe", "vision"):
        out = {"talker_moe": talker_moe, "vision": vision}[a.part](a)
        out |= {"gpu": "cpu (--tiny)" if a.tiny else torch.cuda.get_device_name(), "torch": torch.__version__}
        if a.json:
            Path(a.json).write_text(json.dumps(out, indent=1))
        return 0
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeThinkerForConditionalGeneration

    from graphc.modules import set_kernels
    from graphc.runtime.checkpoint import TensorShards, load_weights
    from graphc.step import StepContext
    from models.components.thinker import Thinker
    from resources import PagedKVSpec
    from resources.paged_kv import PagedTorch, new_cache
    from tests.conftest import rel
    from tests.parity.weights import randomize, route_to_all_experts

    dev = torch.device("cpu" if a.tiny else "cuda")
    t0 = time.perf_counter()
    torch.manual_seed(a.seed)
    cfg = thinker_config(a.layers, a.tiny)
    hf = Qwen3OmniMoeThinkerForConditionalGeneration(hf_config(cfg)).eval()
    randomize(hf, seed=a.seed, bf16_exact=True)
    ours = Thinker(cfg).eval()
    # HF's module names its text model model.language_model.*, its checkpoint (and graphc) model.*
    state = {k.replace("model.language_model.", "model.", 1): v for k, v in hf.state_dict().items()}
    report = load_weights(ours, TensorShards(state), strict=False)
    assert report.loaded == len(ours.state_dict()), report
    hf, ours = hf.to(dev), ours.to(dev)
    print(f"built and loaded {a.layers} real-shape layers in {time.perf_counter() - t0:.0f} s", flush=True)
    # the H200 plan's choices (gemv acts on one-row products only: none in a prefill of many tokens)
    kernels = {"fused_norms": 1, "fused_router": 1, "fused_max_tokens": 16384, "gemv": 1}
    gen = torch.Generator().manual_seed(a.seed + 1)
    ids = torch.randint(0, cfg.vocab_size, (a.tokens,), generator=gen)
    positions = torch.arange(a.tokens).expand(3, -1)
    spec = PagedKVSpec(name="kv", num_layers=a.layers, num_qo_heads=cfg.num_attention_heads,
                       num_kv_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim, page_size=16,
                       max_seq_len=a.tokens, dtype="float32")

    def run_ours(model, dtype):
        s = spec.model_copy(update={"dtype": str(dtype).removeprefix("torch.")})
        pages = s.pages_for(a.tokens)
        ctx = StepContext({"kv": PagedTorch(s, new_cache(s, pages, dev), [a.tokens], [a.tokens], [list(range(pages))])})
        with torch.no_grad():
            out = model(ctx, token_ids=ids.to(dev), positions=positions.to(dev), sample_rows=torch.arange(a.tokens, device=dev))
        return out["logits"].float(), out["hidden"].float()

    def run_hf(model):
        lm = getattr(model.model, "language_model", model.model)        # transformers 5.17 has none
        with torch.no_grad():
            o = lm(input_ids=ids[None].to(dev), position_ids=positions[:, None].to(dev), output_hidden_states=True)
            return model.lm_head(o.last_hidden_state)[0].float(), o.hidden_states[cfg.accept_hidden_layer][0].float()

    results = {}
    for routing in ("top8", "all_experts"):
        h32, o32 = (route_to_all_experts(copy.deepcopy(m)) for m in (hf, ours)) if routing == "all_experts" else (hf, ours)
        h16, o16 = copy.deepcopy(h32).to(torch.bfloat16), copy.deepcopy(o32).to(torch.bfloat16)
        set_kernels(o16, kernels)
        ref_logits, ref_hidden = run_hf(h32)
        hf_logits, hf_hidden = run_hf(h16)
        # graphc's fp32 experts gather each pair's weights ([T*k, 2I, H], the path of small models): routed to all
        # 128 experts at real shapes that is hundreds of GB, so the sanity check runs only where it fits
        k = o32.model.layers[0].mlp.top_k
        fits = a.tokens * k * 3 * cfg.moe_intermediate_size * cfg.hidden_size * 4 < 30 * 2**30
        o32_logits, o32_hidden = run_ours(o32, torch.float32) if fits else (None, None)
        our_logits, our_hidden = run_ours(o16, torch.bfloat16)
        row = {"fp32_sanity": {"logits": rel(o32_logits, ref_logits), "hidden": rel(o32_hidden, ref_hidden)} if fits
               else {"logits": None, "hidden": None},
               "hf_bf16": {"logits": rel(hf_logits, ref_logits), "hidden": rel(hf_hidden, ref_hidden)},
               "graphc_bf16": {"logits": rel(our_logits, ref_logits), "hidden": rel(our_hidden, ref_hidden)}}
        results[routing] = row
        print(f"{routing}: logits graphc {row['graphc_bf16']['logits']:.4g} vs HF {row['hf_bf16']['logits']:.4g}; "
              f"hidden (layer {cfg.accept_hidden_layer}) graphc {row['graphc_bf16']['hidden']:.4g} vs HF "
              f"{row['hf_bf16']['hidden']:.4g}; fp32 sanity {row['fp32_sanity']['logits']}", flush=True)
        del h32, o32, h16, o16
        if not a.tiny:
            torch.cuda.empty_cache()
    out = {"gpu": "cpu (--tiny)" if a.tiny else torch.cuda.get_device_name(), "torch": torch.__version__, "layers": a.layers, "tokens": a.tokens,
           "seed": a.seed, "kernels": kernels, "results": results}
    try:
        import transformers
        out["transformers"] = transformers.__version__
    except ImportError:
        pass
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    print("| routing | output | HF bf16 vs fp32 | graphc bf16 vs fp32 | graphc / HF |\n|---|---|---|---|---|")
    for routing, row in results.items():
        for what in ("logits", "hidden"):
            g, h = row["graphc_bf16"][what], row["hf_bf16"][what]
            print(f"| {routing} | {what} | {h:.4g} | {g:.4g} | {g / h:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
