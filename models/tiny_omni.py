"""A tiny audio-to-text model: a window encoder spliced into a dense Qwen3 decoder.

Small enough to plan in well under a second and to run on a CPU; shaped like Qwen3-Omni's audio
path (windows of an encoder packed by cu_seqlens, a paged-KV decoder, audio rows spliced into a
prefill chunk). Presets: 'tiny' (default) and 'small' (wider, for multi-target tests).
"""
from __future__ import annotations

import graphc as gc
from models.components.encoder_config import EncoderConfig
from models.components.qwen3_dense_config import Qwen3Config, lm_ports
from resources import PagedKVSpec, RaggedAttentionSpec

WINDOW = 16       # encoder rows per window (Qwen3-Omni: 104)
FEATURES = 32     # encoder input features per row

PRESETS = {
    # head dims of 64: the smallest FlashInfer's kernels take, so the tiny plans boot on a GPU too
    "tiny": dict(enc_hidden=128, enc_layers=2, enc_heads=2, hidden=64, layers=2, heads=4, kv_heads=2, head_dim=64,
                 ffn=128, vocab=512, max_seq_len=1024, pages=256),
    "small": dict(enc_hidden=256, enc_layers=4, enc_heads=4, hidden=512, layers=4, heads=8, kv_heads=2, head_dim=64,
                  ffn=1024, vocab=4096, max_seq_len=4096, pages=None),
}


def declare(preset: str = "tiny") -> gc.Model:
    if preset not in PRESETS:
        raise ValueError(f"unknown preset '{preset}'; presets: {', '.join(PRESETS)}")
    p = PRESETS[preset]
    enc = EncoderConfig(input_dim=FEATURES, hidden_size=p["enc_hidden"], num_layers=p["enc_layers"],
                        num_heads=p["enc_heads"], ffn_dim=4 * p["enc_hidden"], output_dim=p["hidden"])
    lm = Qwen3Config(vocab_size=p["vocab"], hidden_size=p["hidden"], num_layers=p["layers"], num_heads=p["heads"],
                     num_kv_heads=p["kv_heads"], head_dim=p["head_dim"], intermediate_size=p["ffn"])
    d = p["hidden"]
    lm_in, lm_out = lm_ports(lm, f"windows*{WINDOW}")
    return gc.Model(
        name=f"tiny_omni-{preset}",
        nodes=[
            gc.Node(name="encoder", module="models.components.encoder:WindowEncoder", config=enc,
                    weight_prefix="encoder.",
                    inputs={"features": gc.Port(shape=(f"windows*{WINDOW}", FEATURES), dtype="bfloat16")},
                    outputs={"embeds": gc.Port(shape=(f"windows*{WINDOW}", d), dtype="bfloat16")},
                    resources={"attn": "encoder_attn"}),
            gc.Node(name="decoder", module="models.components.qwen3_dense:Qwen3LM", config=lm, weight_prefix="decoder.",
                    inputs=lm_in, outputs=lm_out,
                    resources={"kv": "decoder_kv"}),
        ],
        resources=[
            RaggedAttentionSpec(name="encoder_attn", num_heads=p["enc_heads"], head_dim=p["enc_hidden"] // p["enc_heads"],
                                max_segment=WINDOW, rows_per_segment=WINDOW),
            PagedKVSpec(name="decoder_kv", num_layers=p["layers"], num_qo_heads=p["heads"], num_kv_heads=p["kv_heads"],
                        head_dim=p["head_dim"], page_size=16, max_seq_len=p["max_seq_len"], pages=p["pages"]),
        ],
        edges=[gc.Edge(src="encoder.embeds", dst="decoder.mm_embeds")],
        walks=[
            gc.Walk(name="decode", kind="decode", path=("decoder",), budget=gc.Budget(seqs=16)),
            gc.Walk(name="prefill", kind="prefill", path=("decoder",), budget=gc.Budget(tokens=128, seqs=4)),
            gc.Walk(name="audio_prefill", kind="prefill", path=("encoder", "decoder"),
                    budget=gc.Budget(windows=4, tokens=128, seqs=4)),
        ],
        requests=[gc.RequestKind(name="t2t", stages=("prefill", "decode")),
                  gc.RequestKind(name="a2t", stages=("audio_prefill", "decode"))],
        pipeline=gc.Pipeline(stages=(
            gc.LLMStage(name="text", node="decoder", decode="decode", prefill=("prefill",)),
            gc.EncoderStage(name="hear", node="encoder", media=("audio",), walks=("audio_prefill",)))),
    )


def host(model: gc.Model, checkpoint: str | None = None):
    """The serving host (graphc.Host, graphc/serving.py): text prompts with 1-D positions. The window encoder takes
    feature rows no public front end produces, so this model serves t2t only (a2t requests are refused)."""
    from models.components.hosting import AudioVisualHost, Encoders
    from models.components.mrope import MediaTokens

    return AudioVisualHost(model, "decoder", Encoders(), MediaTokens(), mrope=False, eos_token_ids=())
