"""bf16 error at real shapes on the GPU: graphc's bf16 outputs and HF bf16's, each against fp32, measured
and recorded side by side:

    python examples/bench/bf16_error.py --layers 4 --tokens 256 --json $OUT/bf16_error.json

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

    python examples/bench/bf16_error.py --part talker_moe --json $OUT/bf16_error_talker_moe.json

The talker's MoE block at its real shapes (hidden 1024, 128 experts of 384, top-6, a shared expert of 768
gated by sigmoid), HF's Qwen3OmniMoeTalkerTextSparseMoeBlock against graphc's SparseMoE by
tests/parity/weights.check_moe_block_bf16 (the parity tests' rule, router drawn narrow) on the GPU, on 256
rows at once (the fused experts) and a row a call (decode: the one-row kernel for the router, the shared
expert and its gate), with the H200 plan's kernel choices, --seed and two more. Rows where graphc's bf16
router picks other experts than HF's bf16 one (as a set: CUDA's top-k orders ties as it likes) are counted
and left out, as rows HF's bf16 routes elsewhere than its fp32 are.

    python examples/bench/bf16_error.py --part vision --json $OUT/bf16_error_vision.json

The vision tower at its real config on one random image of 64 x 128 patches: HF's Qwen3OmniMoeVisionEncoder in
fp32 (the reference) and bf16 (sdpa), graphc's VisionEncoder (the same weights through the checkpoint loader)
in fp32 (sanity) and in bf16 with the H200 plan's choices (fused_rope, fused_norms, fused_gelu) on fa3 at 72 ->
128; the merged embeddings' and each deepstack level's errors against HF fp32.

    python examples/bench/bf16_error.py --part audio --json $OUT/bf16_error_audio.json

The audio encoder (AuT) at its real config (32 layers of 20 heads of 64, FFN 5,120, output 2,048) on 16 windows:
the log-mel features of three clips of noise, 80, 30 and 13.37 s (1,604 tokens in windows of 104). HF's
Qwen3OmniMoeAudioEncoder in fp32 (the reference, sdpa) and bf16, graphc's AuTEncoder in fp32 (sanity) and in bf16 on
FlashInfer's fa3 (the plan's audio_attn backend; the plan sets no kernel knobs for this node); the error of the
output embeddings against HF fp32.

    python examples/bench/bf16_error.py --part talker --layers 20 --tokens 256 --json $OUT/bf16_error_talker.json

The talker's decoder at its real shapes (hidden 1,024, 16 / 2 heads of 128, 128 experts of 384, top-6, a shared
expert of 768, codec vocab 3,072) cut to --layers layers (all 20 fit: ~2 GB a layer for the fp32 and bf16 copies of
both), HF's Qwen3OmniMoeTalkerForConditionalGeneration against graphc's Talker node on one talker prompt of --tokens
rows (thinker embeddings or hidden states through the two projections, codec ids on the last 6 rows, text
positions), prefilled with every row sampled: the codec_head logits and the final-normed hidden states (the code
predictor's input). graphc bf16 takes the plan's talker choices (fused norms, fused router, fused MoE experts, fused
sampler; its gemv acts on one-row products only, none here: left out) on the torch paged attention as the thinker
part does, its code predictor (it runs, unmeasured here) on the plan's triton backend. Top-6 routing, then routed to
all 128 experts (as the thinker part); graphc's fp32 sanity run is skipped where its gathered expert weights do not
fit (all 128 experts at real shapes).

    python examples/bench/bf16_error.py --part code_predictor --json $OUT/bf16_error_code_predictor.json

The talker's code predictor at its real shapes (5 layers, hidden 1,024, 16 / 8 heads of 128, MLP 3,072, 15 heads of
2,048 codes) on a decode step of 32 sequences (the plan's talker_decode budget): each sequence's talker hidden state
and code-0 embedding, then 15 random codes that both runs take (graphc's sampler is made to pick them through its
draws, HF's model reads their embeddings as one causal sequence), so that every code group's logits have the same
inputs in every run. graphc bf16 with the plan's choices (fused norms, fused sampler, the one-row gemv) on its triton
attention, the 32 sequences in one call and a sequence a call (the gemv's case: one row a product but for the
first step's 2); each code's logits and all 15 against HF fp32.

    python examples/bench/bf16_error.py --part code2wav --json $OUT/bf16_error_code2wav.json

Code2Wav at its real config (8 layers of 16 heads of 64 in a causal window of 72, then 1,920 samples a frame) on one
slot of 100 frames of 16 random codes (the plan's chunk_frames), weights drawn as tests/parity/test_code2wav.py
does (decoder gains 0.5, its last conv 20: a unit-gain Snake stack amplifies rounding many times; the waveform's
std is then 0.3, 0.2% of its samples at the clamp): HF's
Qwen3OmniMoeCode2Wav in fp32 and bf16, graphc's Code2Wav in fp32 and in bf16 with the plan's choices (fused norms;
gemv left out: no product of one row) on fa3 (the plan's code2wav_attn backend); the waveform's error.

The fp32 and bf16 copies of both modules take about 8 GB (audio), 2 GB a layer plus 2 GB (talker), 1.7 GB (code
predictor) and 2.6 GB (code2wav); measured peaks on the H200 (torch.cuda.max_memory_allocated, the commands above):
8.7, 43.6 (20 layers, 256 rows), 1.9 and 2.9 GiB.
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import torch
import transformers

ROOT = Path(__file__).resolve().parents[2]
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


def gathers_fit(tokens: int, top_k: int, c) -> bool:
    """Whether graphc's fp32 experts fit: they gather each pair's weights ([T*k, 2I, H] and [T*k, H, I], the path
    of small models), hundreds of GB routed to all experts at real shapes."""
    return tokens * top_k * 3 * c.moe_intermediate_size * c.hidden_size * 4 < 30 * 2**30


def talker_config(layers: int, tiny: bool):
    """TALKER_30B_A3B, its text model cut to `layers` (tiny: small widths), and HF's Qwen3OmniMoeTalkerConfig of it."""
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeTalkerConfig

    from models.components.talker import TALKER_30B_A3B

    c = TALKER_30B_A3B
    t = c.text_config.model_copy(update={"num_hidden_layers": layers})
    cp = c.code_predictor_config
    if tiny:                    # for checking the script on a CPU: no number of it means anything
        t = t.model_copy(update=dict(vocab_size=256, hidden_size=64, num_attention_heads=4, head_dim=16,
                                     moe_intermediate_size=32, num_experts=16, intermediate_size=96,
                                     shared_expert_intermediate_size=48, mrope_section=(4, 2, 2)))
        cp = cp.model_copy(update=dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=16))
        c = c.model_copy(update=dict(thinker_hidden_size=48, codec_eos_token_id=200, num_code_groups=4))
    c = c.model_copy(update={"text_config": t, "code_predictor_config": cp})
    text = dict(t.model_dump(exclude={"rope_theta", "mrope_section"}),
                rope_parameters={"rope_type": "default", "rope_theta": t.rope_theta,
                                 "mrope_section": list(t.mrope_section), "interleaved": True})
    predictor = dict(cp.model_dump(exclude={"rope_theta"}), num_code_groups=c.num_code_groups,
                     rope_parameters={"rope_type": "default", "rope_theta": cp.rope_theta})
    return c, Qwen3OmniMoeTalkerConfig(text_config=text, code_predictor_config=predictor,
                                       num_code_groups=c.num_code_groups, thinker_hidden_size=c.thinker_hidden_size,
                                       codec_eos_token_id=c.codec_eos_token_id, spatial_merge_size=2)


def load_random(hf, ours, seed: int, rename: tuple[str, str] | None = None, **kw) -> None:
    """Re-draw every weight of HF's module bf16-exact (tests/parity/weights.randomize, the parity tests' rule; kw: its
    gains) and load them into graphc's through the checkpoint loader: every tensor of graphc's is loaded, and every
    one of HF's used unless `rename` (a prefix of HF's names -> graphc's) says HF's module holds more."""
    from graphc.runtime.checkpoint import TensorShards, load_weights
    from tests.parity.weights import randomize

    randomize(hf, seed=seed, bf16_exact=True, **kw)
    state = hf.state_dict()
    if rename:
        state = {k.replace(*rename, 1): v for k, v in state.items()}
    report = load_weights(ours, TensorShards(state), strict=rename is None)
    assert report.loaded == len(ours.state_dict()), report


def paged(spec, dtype, rows: int, dev):
    """resources.paged_kv.PagedTorch over a fresh cache of spec (in `dtype`) for one sequence of `rows` new rows."""
    from resources.paged_kv import PagedTorch, new_cache

    s = spec.model_copy(update={"dtype": str(dtype).removeprefix("torch.")})
    pages = s.pages_for(rows)
    return PagedTorch(s, new_cache(s, pages, dev), [rows], [rows], [list(range(pages))])


def ragged(a, dtype, spec, backend: str, cu: list[int], **kw):
    """A ragged attention binding planned on segments cu (the keys' as well): in a bf16 run on the GPU the plan's
    backend for the resource (kw: make_backend's), else resources.ragged_attention.RaggedTorch."""
    from resources.ragged_attention import RaggedTorch

    if a.tiny or dtype == torch.float32:
        return RaggedTorch(spec, cu)
    from resources.flashinfer_backend import make_backend
    b = make_backend(spec, backend, torch.zeros(256 << 20, dtype=torch.uint8, device="cuda"), False, None, **kw)
    b.plan(cu)
    return b


def code_predictor_attn(a, dtype, cfg, seqs: int):
    """The code predictor's attention for `seqs` frames, declared as models/qwen3_omni.py does (a causal segment of
    num_code_groups rows a frame), on the plan's triton backend."""
    from models.components.talker import code_predictor_cu_seqlens
    from resources import RaggedAttentionSpec

    cp, g = cfg.code_predictor_config, cfg.num_code_groups
    spec = RaggedAttentionSpec(name="code_predictor_attn", num_heads=cp.num_attention_heads,
                               num_kv_heads=cp.num_key_value_heads, head_dim=cp.head_dim, max_segment=g, causal=True,
                               rows_per_segment=g, segment_axis="seqs")
    return ragged(a, dtype, spec, "triton", code_predictor_cu_seqlens(seqs, g))


def measure(hf, ours, run_hf, run_ours, kernels: dict, names: list[str], sanity: bool = True, label: str = "") -> dict:
    """HF's fp32 module (the reference) and a bf16 copy, graphc's fp32 module (sanity: the same weights and math, it
    must equal the reference; sanity False skips it) and a bf16 copy with the plan's kernel choices, each run by
    run_hf / run_ours(module, dtype) -> its outputs in names' order; every output's errors against the reference,
    printed and returned."""
    from graphc.modules import set_kernels
    from tests.conftest import rel

    with torch.no_grad():
        ref = run_hf(hf, torch.float32)
        fp32 = run_ours(ours, torch.float32) if sanity else [None] * len(names)
        h16, o16 = copy.deepcopy(hf).to(torch.bfloat16), copy.deepcopy(ours).to(torch.bfloat16)
        set_kernels(o16, kernels)
        hf_bf16, ours_bf16 = run_hf(h16, torch.bfloat16), run_ours(o16, torch.bfloat16)
    results = {}
    for n, s, h, g, r in zip(names, fp32, hf_bf16, ours_bf16, ref, strict=True):
        row = results[n] = {"fp32_sanity": None if s is None else rel(s, r), "hf_bf16": rel(h, r),
                            "graphc_bf16": rel(g, r)}
        print(f"{label}{n}: graphc bf16 {row['graphc_bf16']:.4g} vs HF bf16 {row['hf_bf16']:.4g} "
              f"(x{row['graphc_bf16'] / row['hf_bf16']:.2f}); fp32 sanity "
              + ("skipped" if s is None else f"{row['fp32_sanity']:.2g}"), flush=True)
    return results


def both_routings(hf, ours, run_hf, run_ours, kernels: dict, tokens: int, c) -> dict:
    """measure() of a MoE model's logits and hidden state with the config's top-k routing, then with every token
    routed to every expert (the same ops without the routing flips a rounding decides); the second turns both
    models to all experts in place, so it comes last."""
    from tests.parity.weights import route_to_all_experts

    results = {}
    for routing, k in ((f"top{c.num_experts_per_tok}", c.num_experts_per_tok), ("all_experts", c.num_experts)):
        if routing == "all_experts":
            for m in (hf, ours):
                route_to_all_experts(m)
        results[routing] = measure(hf, ours, run_hf, run_ours, kernels, ["logits", "hidden"],
                                   sanity=gathers_fit(tokens, k, c), label=f"{routing}, ")
    return results


def thinker(a) -> dict:
    """The thinker at its real text shapes cut to --layers layers (--tiny: small widths on the CPU), one text prompt of
    --tokens ids prefilled, every row sampled: HF fp32 (the reference), HF bf16, graphc fp32 (sanity, where its
    experts fit) and graphc bf16 with the plan's choices; the logits' and the talker's hidden state's errors against
    HF fp32, with top-8 routing and routed to all experts."""
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeThinkerForConditionalGeneration

    from graphc.step import StepContext
    from models.components.thinker import Thinker
    from resources import PagedKVSpec

    dev = torch.device("cpu" if a.tiny else "cuda")
    t0 = time.perf_counter()
    torch.manual_seed(a.seed)
    cfg, n = thinker_config(a.layers, a.tiny), a.tokens
    hf = Qwen3OmniMoeThinkerForConditionalGeneration(hf_config(cfg)).eval()
    ours = Thinker(cfg).eval()
    # HF's module names its text model model.language_model.*, its checkpoint (and graphc) model.*; its (tiny)
    # encoders are not the thinker node's
    load_random(hf, ours, a.seed, rename=("model.language_model.", "model."))
    hf, ours = hf.to(dev), ours.to(dev)
    print(f"built and loaded {a.layers} real-shape layers in {time.perf_counter() - t0:.0f} s", flush=True)
    # the H200 plan's choices (gemv acts on one-row products only: none in a prefill of many tokens)
    kernels = {"fused_norms": 1, "fused_router": 1, "fused_max_tokens": 16384, "gemv": 1}
    ids = torch.randint(0, cfg.vocab_size, (n,), generator=torch.Generator().manual_seed(a.seed + 1)).to(dev)
    positions = torch.arange(n, device=dev).expand(3, -1)
    kv = PagedKVSpec(name="kv", num_layers=a.layers, num_qo_heads=cfg.num_attention_heads,
                     num_kv_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim, page_size=16, max_seq_len=n)

    def run_ours(model, dtype):
        out = model(StepContext({"kv": paged(kv, dtype, n, dev)}), token_ids=ids, positions=positions,
                    sample_rows=torch.arange(n, device=dev))
        return [out["logits"].float(), out["hidden"].float()]

    def run_hf(model, dtype):
        lm = getattr(model.model, "language_model", model.model)        # transformers 5.17 has none
        o = lm(input_ids=ids[None], position_ids=positions[:, None], output_hidden_states=True)
        return [model.lm_head(o.last_hidden_state)[0].float(), o.hidden_states[cfg.accept_hidden_layer][0].float()]

    results = both_routings(hf, ours, run_hf, run_ours, kernels, n, cfg)
    return {"part": "thinker", "layers": a.layers, "tokens": n, "kernels": kernels, "attention": "torch paged",
            "seed": a.seed, "results": results}


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

    from graphc.step import StepContext
    from models.components.vision import VisionConfig, VisionEncoder
    from models.components.vision_inputs import VisionProcessing, build_step, process_image
    from resources import RaggedAttentionSpec

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
    ours = VisionEncoder(VisionConfig.from_hf(hf.config.to_dict())).eval()
    load_random(hf, ours, a.seed)
    gen = torch.Generator().manual_seed(a.seed + 1)
    image = torch.randint(0, 256, (3, height, width), dtype=torch.uint8, generator=gen)
    step = build_step([process_image(image, VisionProcessing(max_pixels=height * width))], ours.cfg)
    inputs = {k: v.to(dev) for k, v in step.inputs().items()}
    c = ours.cfg
    spec = RaggedAttentionSpec(name="vision_attn", num_heads=c.num_heads, head_dim=c.head_dim,
                               max_segment=step.cu_seqlens[-1])
    kernels = {"fused_gelu": 1, "fused_norms": 1, "fused_rope": 1}

    def run_ours(model, dtype):
        out = model(StepContext({"attn": ragged(a, dtype, spec, "fa3", step.cu_seqlens, run_head_dim=128)}), **inputs)
        return [out["embeds"].float()] + [d.float() for d in out["deepstack"]]

    def run_hf(model, dtype):
        o = model(hidden_states=inputs["pixel_patches"].to(dtype), grid_thw=torch.tensor(step.grids, device=dev))
        return [o.pooler_output.float()] + [d.float() for d in o.deepstack_features]

    names = ["embeds"] + [f"deepstack {i}" for i in real["deepstack_visual_indexes"]]
    results = measure(hf.to(dev), ours.to(dev), run_hf, run_ours, {} if a.tiny else kernels, names)
    return {"part": "vision", "patches": step.cu_seqlens[-1], "kernels": {} if a.tiny else kernels,
            "attention": "torch" if a.tiny else "fa3 at 128", "seed": a.seed, "results": results}


def audio(a) -> dict:
    """The audio encoder at its real config (32 layers of 20 heads of 64, FFN 5,120) on 16 windows of 104 tokens (the
    plan's audio_prefill budget; --tiny: a small encoder on the CPU): HF fp32 (the reference, sdpa), HF bf16, graphc
    fp32 (sanity) and graphc bf16 on FlashInfer's fa3 (the plan's audio_attn backend; the plan sets no kernel knobs
    for this node). The error of the output embeddings against HF fp32."""
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeAudioEncoderConfig
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeAudioEncoder

    from graphc.step import StepContext
    from models.components import hf_config as from_hf
    from models.components.audio_inputs import log_mel, pack_audios
    from models.components.aut import QWEN3_OMNI_AUT, AuTEncoder, attention_spec

    cfg = QWEN3_OMNI_AUT
    if a.tiny:                  # for checking the script on a CPU: no number of it means anything
        cfg = cfg.model_copy(update=dict(d_model=64, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=128,
                                         output_dim=48, downsample_hidden_size=16))
    hf_cfg = Qwen3OmniMoeAudioEncoderConfig(**cfg.model_dump(exclude={"layer_norm_eps"}))   # HF's: nn.LayerNorm's
    hf_cfg._attn_implementation = "sdpa"
    dev = torch.device("cpu" if a.tiny else "cuda")
    torch.manual_seed(a.seed)
    hf = Qwen3OmniMoeAudioEncoder(hf_cfg).eval()
    ours = AuTEncoder(from_hf.aut(hf.config.to_dict())).eval()
    load_random(hf, ours, a.seed)
    gen = torch.Generator().manual_seed(a.seed + 1)
    frames = [8000, 3000, 1337]             # 80, 30 and 13.37 s of noise: 10 + 4 + 2 windows, the last ones partial
    mels = [log_mel(0.1 * torch.randn(n * 160, generator=gen)) for n in frames]
    step = pack_audios(mels, 16, ours.cfg)
    tokens = step.cu_seqlens[-1]
    spec = attention_spec(ours.cfg, "audio_attn")

    def run_ours(model, dtype):
        out = model(StepContext({"attn": ragged(a, dtype, spec, "fa3", step.cu_seqlens)}), mel=step.mel.to(dev),
                    rows=step.rows.to(dev))
        return [out["embeds"][:tokens].float()]

    def run_hf(model, dtype):
        o = model(input_features=torch.cat(mels, 1).to(dev), feature_lens=torch.tensor(frames, device=dev))
        return [o.last_hidden_state.float()]

    results = measure(hf.to(dev), ours.to(dev), run_hf, run_ours, {}, ["embeds"])
    return {"part": "audio", "frames": frames, "tokens": tokens, "windows": len(step.cu_seqlens) - 1,
            "attention": "torch" if a.tiny else "fa3", "seed": a.seed, "results": results}


def talker(a) -> dict:
    """The talker's decoder at its real shapes cut to --layers layers (--tiny: small widths on the CPU), one prompt of
    --tokens rows prefilled, every row sampled: HF fp32 (the reference), HF bf16, graphc fp32 (sanity, where its
    experts fit) and graphc bf16 with the plan's choices; the codec_head logits' and the final-normed hidden
    states' errors against HF fp32, with top-6 routing and routed to all experts."""
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeTalkerForConditionalGeneration

    from graphc.step import StepContext
    from models.components import hf_config as from_hf
    from models.components.talker import SAMPLING, Talker
    from resources import PagedKVSpec

    cfg, hf_cfg = talker_config(a.layers, a.tiny)
    t, n, g = cfg.text_config, a.tokens, cfg.num_code_groups
    dev = torch.device("cpu" if a.tiny else "cuda")
    t0 = time.perf_counter()
    torch.manual_seed(a.seed)
    hf = Qwen3OmniMoeTalkerForConditionalGeneration(hf_cfg).eval()
    ours = Talker(from_hf.talker(hf.config.to_dict())).eval()
    load_random(hf, ours, a.seed)
    hf, ours = hf.to(dev), ours.to(dev)
    print(f"built and loaded {a.layers} talker layers in {time.perf_counter() - t0:.0f} s", flush=True)
    # the plan's talker choices but gemv (one-row products only: none in a prefill)
    kernels = {"fused_max_tokens": 16384, "fused_norms": 1, "fused_router": 1, "fused_sampler": 1}
    gen = torch.Generator().manual_seed(a.seed + 1)
    # one prompt: each row the projected thinker embedding (a text row, kind 1) or hidden state (media, kind 2),
    # codec ids on the last 6 (the assistant prefix's); thinker inputs bf16-exact, 1-D positions
    thinker = torch.randn(2, n, cfg.thinker_hidden_size, generator=gen).bfloat16().float().to(dev)
    kind = torch.randint(1, 3, (n,), generator=gen).to(dev)
    codec = torch.full((n,), -1)
    codec[-6:] = torch.randint(0, cfg.code_predictor_config.vocab_size, (6,), generator=gen)
    codec = codec.to(dev)
    positions = torch.arange(n, device=dev).expand(3, -1)
    kv = PagedKVSpec(name="kv", num_layers=a.layers, num_qo_heads=t.num_attention_heads,
                     num_kv_heads=t.num_key_value_heads, head_dim=t.head_dim, page_size=16, max_seq_len=n)

    def run_ours(model, dtype):
        hidden = []
        hook = model.model.norm.register_forward_hook(lambda module, args, out: hidden.append(out.float()))
        ctx = StepContext({"kv": paged(kv, dtype, n, dev), "cp_attn": code_predictor_attn(a, dtype, cfg, n)})

        def zeros(*shape, dtype=dtype):
            return torch.zeros(*shape, dtype=dtype, device=dev)

        out = model(ctx, embeds=zeros(n, t.hidden_size), positions=positions, sample_rows=torch.arange(n, device=dev),
                    trailing_text=zeros(n, cfg.thinker_hidden_size),
                    sampling=zeros(n, len(SAMPLING), dtype=torch.float),
                    noise=zeros(n, g, t.vocab_size, dtype=torch.float), seen=zeros(n, t.vocab_size, dtype=torch.bool),
                    codec_ids=codec, thinker_embeds=thinker[0].to(dtype), thinker_hidden=thinker[1].to(dtype),
                    prompt_kind=kind)                                      # greedy rows: sampling 0, no draws
        hook.remove()
        return [out["logits"], hidden[0]]

    def run_hf(model, dtype):
        x = torch.where((kind == 2)[:, None], model.hidden_projection(thinker[1].to(dtype)),
                        model.text_projection(thinker[0].to(dtype)))
        x = x + torch.where((codec >= 0)[:, None], model.model.codec_embedding(codec.clamp(min=0)), 0.0)
        h = model.model(inputs_embeds=x[None], position_ids=positions[:, None]).last_hidden_state[0]
        return [model.codec_head(h).float(), h.float()]

    results = both_routings(hf, ours, run_hf, run_ours, kernels, n, t)
    return {"part": "talker", "layers": a.layers, "tokens": n, "kernels": kernels,
            "attention": "torch paged; code predictor " + ("torch" if a.tiny else "triton"), "seed": a.seed,
            "results": results}


def code_predictor(a) -> dict:
    """The talker's code predictor at its real shapes (--tiny: small widths on the CPU) on a decode step of 32
    sequences with given codes: HF fp32 (the reference, sdpa), HF bf16, graphc fp32 (sanity) and graphc bf16 with the
    plan's choices on its triton attention, 32 sequences a call and one; each code's logits against HF fp32."""
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import \
        Qwen3OmniMoeTalkerCodePredictorModelForConditionalGeneration

    from functools import partial

    from models.components import hf_config as from_hf
    from models.components.talker import CodePredictor, log_draws

    hf_cfg = talker_config(1, a.tiny)[1]               # its text model (one layer of it) is not built
    cfg = from_hf.talker(hf_cfg.to_dict())
    cp, g, seqs = cfg.code_predictor_config, cfg.num_code_groups, 32
    dev = torch.device("cpu" if a.tiny else "cuda")
    torch.manual_seed(a.seed)
    hf = Qwen3OmniMoeTalkerCodePredictorModelForConditionalGeneration(hf_cfg.code_predictor_config).eval()
    ours = CodePredictor(cp, g).eval()
    load_random(hf, ours, a.seed)
    kernels = {"fused_norms": 1, "fused_sampler": 1, "gemv": 1}   # the plan's talker choices a dense stack takes
    gen = torch.Generator().manual_seed(a.seed + 1)
    # each sequence's talker hidden state (final-normed: unit scale) and code-0 embedding (a codec table row's
    # scale), bf16-exact, and the 15 codes to feed back
    hidden = torch.randn(seqs, cp.hidden_size, generator=gen).bfloat16().float().to(dev)
    code0 = (torch.randn(seqs, cp.hidden_size, generator=gen) / cp.hidden_size ** 0.5).bfloat16().float().to(dev)
    codes = torch.randint(0, cp.vocab_size, (seqs, g - 1), generator=gen).to(dev)
    # graphc's sampler draws them: temperature 1, no filters, and each given code's draw E = 0 (log_draws floors it
    # to log E = -87), so it wins the race x - log E against logits a few units wide
    params = torch.tensor([[1.0, 0.0, 0.0]], device=dev).expand(seqs, -1)
    log_noise = log_draws(1 - torch.nn.functional.one_hot(codes, cp.vocab_size).float())

    def run_ours(model, dtype, one_row):
        logits = []
        hooks = [head.register_forward_hook(lambda module, args, out: logits.append(out.float()))
                 for head in model.lm_head]
        calls = [slice(i, i + 1) for i in range(seqs)] if one_row else [slice(0, seqs)]
        for r in calls:
            got = model(hidden[r].to(dtype), code0[r].to(dtype), code_predictor_attn(a, dtype, cfg, r.stop - r.start),
                        params[r], log_noise[r])[0]
            assert torch.equal(got, codes[r]), "graphc's sampler took other codes than the given ones"
        for h in hooks:
            h.remove()
        logits = torch.stack(logits).view(len(calls), g - 1, -1, cp.vocab_size).transpose(0, 1).flatten(1, 2)
        return [*logits, logits]                                            # [G-1, seqs, V]

    def run_hf(model, dtype):
        x = torch.stack([hidden.to(dtype), code0.to(dtype)]
                        + [model.model.codec_embedding[j](codes[:, j]) for j in range(g - 2)], dim=1)
        h = model.model(inputs_embeds=x).last_hidden_state                 # [seqs, G, H], causal
        logits = torch.stack([model.lm_head[j](h[:, j + 1]) for j in range(g - 1)]).float()
        return [*logits, logits]

    hf, ours = hf.to(dev), ours.to(dev)
    names = [f"code {j}" for j in range(1, g)] + ["all codes"]
    results = {mode: measure(hf, ours, run_hf, partial(run_ours, one_row=one_row), kernels, names, label=f"{mode}, ")
               for mode, one_row in ((f"{seqs} rows a call", False), ("a row a call", True))}
    return {"part": "code_predictor", "seqs": seqs, "kernels": kernels, "attention": "torch" if a.tiny else "triton",
            "seed": a.seed, "results": results}


def code2wav(a) -> dict:
    """Code2Wav at its real config (--tiny: small widths on the CPU) on one slot of 100 frames of random codes: HF
    fp32 (the reference, sdpa), HF bf16, graphc fp32 (sanity) and graphc bf16 with the plan's choices on fa3 (the
    plan's code2wav_attn backend). The waveform's error against HF fp32."""
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeCode2WavConfig
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav

    from graphc.step import StepContext
    from models.components import hf_config as from_hf
    from models.components.code2wav import Code2Wav, attention_spec, cu_seqlens
    from models.qwen3_omni import REAL

    c = REAL["code2wav"]                                # the plan's slots of chunk_frames = 100
    if a.tiny:                  # for checking the script on a CPU: no number of it means anything
        c = c.model_copy(update=dict(codebook_size=64, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=4, intermediate_size=128, sliding_window=8, decoder_dim=64))
    hf_cfg = Qwen3OmniMoeCode2WavConfig(**c.model_dump(exclude={"rope_theta", "chunk_frames", "left_context"}),
                                        rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta})
    hf_cfg._attn_implementation = "sdpa"
    dev = torch.device("cpu" if a.tiny else "cuda")
    torch.manual_seed(a.seed)
    hf = Qwen3OmniMoeCode2Wav(hf_cfg).eval()
    ours = Code2Wav(from_hf.code2wav(hf.config.to_dict(), c)).eval()
    # tests/parity/test_code2wav.py's draw: small biases, the decoder's gains 0.5 and its last conv's 20
    load_random(hf, ours, a.seed, bias_std=0.01,
                gain=lambda n: 20.0 if n.startswith("decoder.6.") else 0.5 if n.startswith("decoder.") else 1.0)
    frames = c.chunk_frames
    codes = torch.randint(0, c.codebook_size, (1, c.num_quantizers, frames),
                          generator=torch.Generator().manual_seed(a.seed + 1)).to(dev)
    spec = attention_spec(ours.cfg, "code2wav_attn")
    kernels = {"fused_norms": 1}        # the plan's code2wav choices but gemv (one-row products only: none here)

    def run_ours(model, dtype):
        out = model(StepContext({"attn": ragged(a, dtype, spec, "fa3", cu_seqlens(frames, 1))}), codes=codes[0].T,
                    filled=torch.tensor([frames], device=dev))
        return [out["wav"][:c.samples(frames)]]

    def run_hf(model, dtype):
        return [model(codes)[0, 0].float()]

    results = measure(hf.to(dev), ours.to(dev), run_hf, run_ours, kernels, ["wav"])
    return {"part": "code2wav", "frames": frames, "samples": c.samples(frames), "kernels": kernels,
            "attention": "torch" if a.tiny else "fa3", "seed": a.seed, "results": results}


PARTS = {"thinker": thinker, "talker_moe": talker_moe, "vision": vision, "audio": audio, "talker": talker, "code_predictor": code_predictor,
         "code2wav": code2wav}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=PARTS, default="thinker")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    ap.add_argument("--tiny", action="store_true", help="small shapes on the CPU: checks the script only")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    out = PARTS[a.part](a)
    out |= {"gpu": "cpu (--tiny)" if a.tiny else torch.cuda.get_device_name(), "torch": torch.__version__,
            "transformers": transformers.__version__}
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0

if __name__ == "__main__":
    sys.exit(main())
