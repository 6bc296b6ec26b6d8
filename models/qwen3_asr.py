"""Qwen3-ASR (0.6B, 1.7B, and a tiny preset): the AuT audio encoder spliced into a dense Qwen3.

Weight names follow the public QwenLM checkpoints (Qwen/Qwen3-ASR-*): thinker.audio_tower.* and
thinker.model.* (embeddings tied to the LM head). Real sizes from the fact sheet, section 6.
"""
from __future__ import annotations

import graphc as gc
from models.components.aut import QWEN3_ASR_0_6B_AUT, QWEN3_ASR_1_7B_AUT, AuTConfig, AuTEncoder, attention_spec, \
    node_ports
from models.components.qwen3_dense import Qwen3Config, Qwen3LM, lm_ports
from resources import PagedKVSpec

TINY_AUT = AuTConfig(d_model=64, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=128, output_dim=64,
                     downsample_hidden_size=16)

PRESETS = {
    # audio encoder, text model, per-step budgets, the longest request
    "1.7b": dict(aut=QWEN3_ASR_1_7B_AUT, lm=Qwen3Config(vocab_size=151936, hidden_size=2048, num_layers=28, num_heads=16,
                                                        num_kv_heads=8, head_dim=128, intermediate_size=6144,
                                                        tie_word_embeddings=True),
                 decode_seqs=128, tokens=4096, seqs=16, windows=32, max_seq_len=16384),
    "0.6b": dict(aut=QWEN3_ASR_0_6B_AUT, lm=Qwen3Config(vocab_size=151936, hidden_size=1024, num_layers=28, num_heads=16,
                                                        num_kv_heads=8, head_dim=128, intermediate_size=3072,
                                                        tie_word_embeddings=True),
                 decode_seqs=128, tokens=4096, seqs=16, windows=32, max_seq_len=16384),
    "tiny": dict(aut=TINY_AUT, lm=Qwen3Config(vocab_size=512, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                                              head_dim=16, intermediate_size=128, tie_word_embeddings=True),
                 decode_seqs=8, tokens=256, seqs=4, windows=4, max_seq_len=2048, pages=512),
}


def declare(preset: str = "1.7b") -> gc.Model:
    if preset not in PRESETS:
        raise ValueError(f"unknown preset '{preset}'; presets: {', '.join(PRESETS)}")
    p = PRESETS[preset]
    aut, lm = p["aut"], p["lm"]
    enc_in, enc_out = node_ports(aut, "bfloat16")
    lm_in, lm_out = lm_ports(lm, f"windows*{aut.window_tokens}")
    return gc.Model(
        name=f"qwen3_asr-{preset}",
        nodes=[
            gc.Node(name="audio_encoder", module=AuTEncoder, config=aut, weight_prefix="thinker.audio_tower.",
                    inputs=enc_in, outputs=enc_out, resources={"attn": "audio_attn"}),
            gc.Node(name="thinker", module=Qwen3LM, config=lm, weight_prefix="thinker.",
                    inputs=lm_in, outputs=lm_out, resources={"kv": "thinker_kv"}),
        ],
        resources=[
            attention_spec(aut, "audio_attn"),
            PagedKVSpec(name="thinker_kv", num_layers=lm.num_layers, num_qo_heads=lm.num_heads,
                        num_kv_heads=lm.num_kv_heads, head_dim=lm.head_dim, page_size=16,
                        max_seq_len=p["max_seq_len"], pages=p.get("pages")),
        ],
        edges=[gc.Edge(src="audio_encoder.embeds", dst="thinker.mm_embeds")],
        walks=[
            gc.Walk(name="thinker_decode", kind="decode", path=("thinker",), budget=gc.Budget(seqs=p["decode_seqs"])),
            gc.Walk(name="thinker_prefill", kind="prefill", path=("thinker",),
                    budget=gc.Budget(tokens=p["tokens"], seqs=p["seqs"])),
            gc.Walk(name="audio_prefill", kind="prefill", path=("audio_encoder", "thinker"),
                    budget=gc.Budget(windows=p["windows"], tokens=p["tokens"], seqs=p["seqs"])),
        ],
        requests=[gc.RequestKind(name="a2t", stages=("audio_prefill", "thinker_prefill", "thinker_decode"))],
    )
