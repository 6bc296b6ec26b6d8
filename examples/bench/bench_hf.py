"""HF transformers' own modules at Qwen3-Omni's real shapes, timed on this GPU at the shapes of graphc's
captured steps, and the ratio to graphc's time for the same step:

    python examples/bench/bench_steps.py plans/qwen3_omni_h200.plan --only audio_encoder vision_encoder talker code2wav \
        --json $OUT/steps_speech_h200.json
    python examples/bench/bench_hf.py --ours $OUT/steps_speech_h200.json --json $OUT/hf_h200.json

| module | HF input | graphc graph |
|---|---|---|
| audio encoder (Qwen3OmniMoeAudioEncoder) | one 128 s audio: 12,800 mel frames = 16 windows of 8 s | audio_encoder windows/16 |
| vision encoder (Qwen3OmniMoeVisionEncoder) | one image of 64 x 128 patches = 8,192 | vision_encoder patches/8192 |
| Code2Wav (Qwen3OmniMoeCode2Wav) | B sequences of 100 frames, B = 1 and 16 | code2wav slots of 100 frames, 1 and 16 |
| talker decode (Qwen3OmniMoeTalkerForConditionalGeneration.generate, greedy, code predictor included) | B prompts of 100 rows, B = 1 and 16; a frame's time = (generate of F2 frames - of F1) / (F2 - F1) | talker decode seqs/1 and seqs/16 |

HF's modules are built from the real config (the fact sheet's values; HF's class defaults differ) with
random bf16 weights, run eagerly with sdpa attention, as HF serves them; times are the median of
--repeats runs after a warm-up, CUDA events around each. graphc's are its captured graphs' replays
from bench_steps.py's JSON (seeded weights, random token ids). Each module is timed in a try: one that
fails is reported with its error and the others still run. The CPU can run it with --tiny (small
configs, for checking the script; no ratio is meaningful there).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

REAL = {
    "audio": dict(num_mel_bins=128, d_model=1280, encoder_layers=32, encoder_attention_heads=20, encoder_ffn_dim=5120,
                  downsample_hidden_size=480, output_dim=2048, n_window=50, n_window_infer=800, conv_chunksize=500,
                  max_source_positions=1500),
    "vision": dict(depth=27, hidden_size=1152, num_heads=16, intermediate_size=4304, patch_size=16,
                   temporal_patch_size=2, spatial_merge_size=2, in_channels=3, out_hidden_size=2048,
                   num_position_embeddings=2304, deepstack_visual_indexes=[8, 16, 24]),
    "code2wav": dict(codebook_size=2048, num_quantizers=16, hidden_size=1024, num_hidden_layers=8,
                     num_attention_heads=16, num_key_value_heads=16, intermediate_size=3072, sliding_window=72,
                     rope_parameters={"rope_type": "default", "rope_theta": 10000}, max_position_embeddings=8000,
                     rms_norm_eps=1e-5, layer_scale_initial_scale=0.01,
                     upsampling_ratios=[2, 2], upsample_rates=[8, 5, 4, 3], decoder_dim=1536),
    "talker_text": dict(hidden_size=1024, num_hidden_layers=20, num_attention_heads=16, num_key_value_heads=2,
                        head_dim=128, num_experts=128, num_experts_per_tok=6, moe_intermediate_size=384,
                        shared_expert_intermediate_size=768, norm_topk_prob=True, intermediate_size=2048,
                        vocab_size=3072, max_position_embeddings=65536, rms_norm_eps=1e-6,
                        rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [24, 20, 20],
                                         "interleaved": True}),
    "code_predictor": dict(hidden_size=1024, num_hidden_layers=5, num_attention_heads=16, num_key_value_heads=8,
                           head_dim=128, intermediate_size=3072, vocab_size=2048, num_code_groups=16,
                           max_position_embeddings=32768, rms_norm_eps=1e-6,
                           rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
    "talker": dict(num_code_groups=16, thinker_hidden_size=2048, accept_hidden_layer=24, codec_pad_id=2148,
                   codec_bos_id=2149, codec_eos_token_id=2150, codec_nothink_id=2155, codec_think_bos_id=2156,
                   codec_think_eos_id=2157, position_id_per_seconds=13, spatial_merge_size=2),
    # the step shapes: audio windows, image patch grid, Code2Wav frames a sequence, talker prompt rows
    "shapes": dict(windows=16, grid=(1, 64, 128), frames=100, prompt=100, batches=(1, 16), frames_timed=(8, 24)),
}

TINY = {
    "audio": dict(num_mel_bins=128, d_model=64, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=128,
                  output_dim=32, downsample_hidden_size=16, n_window=50, n_window_infer=800),
    "vision": dict(depth=2, hidden_size=32, num_heads=2, intermediate_size=64, patch_size=16, temporal_patch_size=2,
                   spatial_merge_size=2, in_channels=3, out_hidden_size=32, num_position_embeddings=64,
                   deepstack_visual_indexes=[0]),
    "code2wav": dict(codebook_size=64, num_quantizers=4, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     num_key_value_heads=2, intermediate_size=64, sliding_window=8, upsampling_ratios=[2, 2],
                     upsample_rates=[2, 2], decoder_dim=32),
    "talker_text": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                        shared_expert_intermediate_size=32, norm_topk_prob=True, intermediate_size=64, vocab_size=80,
                        rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [4, 2, 2],
                                         "interleaved": True}),
    "code_predictor": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                           head_dim=16, intermediate_size=64, vocab_size=64, num_code_groups=4),
    "talker": dict(num_code_groups=4, thinker_hidden_size=48, accept_hidden_layer=1, codec_pad_id=66,
                   codec_bos_id=67, codec_eos_token_id=70, codec_nothink_id=68, codec_think_bos_id=69,
                   codec_think_eos_id=71, position_id_per_seconds=13, spatial_merge_size=2),
    "shapes": dict(windows=2, grid=(1, 4, 8), frames=12, prompt=12, batches=(1, 2), frames_timed=(2, 4)),
}


def timed(fn, device: torch.device, repeats: int) -> float:
    """Median ms of fn() after one warm-up call."""
    with torch.inference_mode():
        fn()
        times = []
        for _ in range(repeats):
            if device.type == "cuda":
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b))
            else:
                t0 = time.perf_counter()
                fn()
                times.append(1e3 * (time.perf_counter() - t0))
    return sorted(times)[len(times) // 2]


def build(cls, config, dtype, device):
    """An HF module of `config`, its weights drawn on the device (N(0, 0.02); norms and biases as HF inits them)."""
    config._attn_implementation = "sdpa"
    with torch.device(device):
        model = cls(config)
    return model.to(dtype).eval()


def audio(cfg: dict, shapes: dict, dtype, device, repeats: int) -> list[dict]:
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeAudioEncoderConfig
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeAudioEncoder

    m = build(Qwen3OmniMoeAudioEncoder, Qwen3OmniMoeAudioEncoderConfig(**cfg["audio"]), dtype, device)
    frames = shapes["windows"] * cfg["audio"]["n_window_infer"]
    mel = torch.randn(cfg["audio"]["num_mel_bins"], frames, device=device)
    lens = torch.tensor([frames], device=device)
    ms = timed(lambda: m(input_features=mel, feature_lens=lens), device, repeats)
    return [{"module": "audio encoder", "shape": f"{shapes['windows']} windows ({frames} mel frames)",
             "graph": f"audio_encoder/prefill:windows/{shapes['windows']}", "hf_ms": ms}]


def vision(cfg: dict, shapes: dict, dtype, device, repeats: int) -> list[dict]:
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeVisionEncoderConfig
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeVisionEncoder

    v = cfg["vision"]
    m = build(Qwen3OmniMoeVisionEncoder, Qwen3OmniMoeVisionEncoderConfig(**v), dtype, device)
    t, h, w = shapes["grid"]
    patches = t * h * w
    px = torch.randn(patches, v["in_channels"] * v["temporal_patch_size"] * v["patch_size"] ** 2, device=device,
                     dtype=dtype)
    grid = torch.tensor([shapes["grid"]], device=device)
    ms = timed(lambda: m(px, grid_thw=grid), device, repeats)
    return [{"module": "vision encoder", "shape": f"{patches} patches ({h} x {w})",
             "graph": f"vision_encoder/prefill:patches/{patches}", "hf_ms": ms}]


def code2wav(cfg: dict, shapes: dict, dtype, device, repeats: int) -> list[dict]:
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeCode2WavConfig
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav

    c = cfg["code2wav"]
    m = build(Qwen3OmniMoeCode2Wav, Qwen3OmniMoeCode2WavConfig(**c), dtype, device)
    rows = []
    for b in shapes["batches"]:
        codes = torch.randint(0, c["codebook_size"], (b, c["num_quantizers"], shapes["frames"]), device=device)
        ms = timed(lambda: m(codes), device, repeats)
        rows.append({"module": "Code2Wav", "shape": f"{b} x {shapes['frames']} frames",
                     "graph": f"code2wav/prefill:frames@{shapes['frames']}/{b * shapes['frames']}", "hf_ms": ms})
    return rows


def talker(cfg: dict, shapes: dict, dtype, device, repeats: int) -> list[dict]:
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import (
        Qwen3OmniMoeTalkerCodePredictorConfig, Qwen3OmniMoeTalkerConfig, Qwen3OmniMoeTalkerTextConfig)
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeTalkerForConditionalGeneration

    tcfg = Qwen3OmniMoeTalkerConfig(text_config=Qwen3OmniMoeTalkerTextConfig(**cfg["talker_text"]).to_dict(),
                                    code_predictor_config=Qwen3OmniMoeTalkerCodePredictorConfig(
                                        **cfg["code_predictor"]).to_dict(), **cfg["talker"])
    m = build(Qwen3OmniMoeTalkerForConditionalGeneration, tcfg, dtype, device)
    h = cfg["talker_text"]["hidden_size"]
    f1, f2 = shapes["frames_timed"]
    rows = []
    for b in shapes["batches"]:
        n = shapes["prompt"]
        emb = torch.randn(b, n, h, device=device, dtype=dtype) * 0.02
        mask = torch.ones(b, n, dtype=torch.long, device=device)
        ids = torch.full((b, n), 5, dtype=torch.long, device=device)
        trailing = torch.randn(b, f2 + 2, h, device=device, dtype=dtype) * 0.02
        pad = torch.randn(b, 1, h, device=device, dtype=dtype) * 0.02

        def gen(frames: int):
            return m.generate(inputs_embeds=emb, attention_mask=mask, talker_input_ids=ids,
                              trailing_text_hidden=trailing, tts_pad_embed=pad, max_new_tokens=frames,
                              min_new_tokens=frames, do_sample=False, eos_token_id=None, repetition_penalty=1.0,
                              output_hidden_states=True, return_dict_in_generate=True)

        a, c = timed(lambda: gen(f1), device, repeats), timed(lambda: gen(f2), device, repeats)
        rows.append({"module": "talker decode (one frame)", "shape": f"{b} sequence{'s' if b > 1 else ''}",
                     "graph": f"talker/decode:seqs/{b}", "hf_ms": (c - a) / (f2 - f1),
                     "hf_generate_ms": {str(f1): a, str(f2): c}})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ours", help="bench_steps.py's JSON for the same plan's audio, vision, talker and Code2Wav graphs")
    ap.add_argument("--json", default=None)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tiny", action="store_true", help="small configs (checks the script on a CPU)")
    ap.add_argument("--modules", nargs="+", default=["audio", "vision", "code2wav", "talker"])
    ap.add_argument("--rerender", metavar="JSON", help="an earlier run's JSON: its HF times against --ours, nothing run")
    a = ap.parse_args()
    import transformers

    cfg = TINY if a.tiny else REAL
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    ours = {}
    if a.ours:
        ours = {r["graph"]: r["ms"] for r in json.loads(Path(a.ours).read_text())["rows"]}
    rows = []
    if a.rerender:
        info = json.loads(Path(a.rerender).read_text())
        for r in info["rows"]:
            if r.get("graph") in ours:
                r["graphc_ms"] = ours[r["graph"]]
                r["x_faster"] = r["hf_ms"] / r["graphc_ms"]
        table(info["rows"])
        if a.json:
            Path(a.json).write_text(json.dumps(info, indent=1))
        return 0
    for name in a.modules:
        fn = {"audio": audio, "vision": vision, "code2wav": code2wav, "talker": talker}[name]
        try:
            got = fn(cfg, cfg["shapes"], dtype, device, a.repeats)
        except Exception as e:                      # one module failing leaves the others to run
            got = [{"module": name, "error": f"{type(e).__name__}: {e}"[:500]}]
        for r in got:
            if "graph" in r and r["graph"] in ours:
                r["graphc_ms"] = ours[r["graph"]]
                r["x_faster"] = r["hf_ms"] / r["graphc_ms"]
            print(json.dumps(r), flush=True)
        rows += got
        if device.type == "cuda":
            torch.cuda.empty_cache()
    info = {"gpu": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__,
            "transformers": transformers.__version__, "dtype": str(dtype), "repeats": a.repeats, "rows": rows}
    if a.json:
        Path(a.json).write_text(json.dumps(info, indent=1))
    table(rows)
    return 0


def table(rows: list[dict]) -> None:
    print("\n| module | shape | HF ms | graphc ms | x faster |\n|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['module']} | error: {r['error'][:120]} | | | |")
        else:
            g, x = r.get("graphc_ms"), r.get("x_faster")
            print(f"| {r['module']} | {r['shape']} | {r['hf_ms']:.2f} | {'-' if g is None else format(g, '.2f')} | "
                  f"{'-' if x is None else format(x, '.1f')} |")


if __name__ == "__main__":
    sys.exit(main())
