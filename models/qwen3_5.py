"""Qwen3.5 (dense: 0.8B, 9B, and a tiny preset) as a graphc model: a hybrid decoder of Gated DeltaNet
layers (state in a linear_state resource's slots) and gated full-attention layers (paged KV), 3 to 1.

Nodes, walks and resources:
  llm              models/components/qwen3_5_text.py: Qwen3_5LM, weights at model.language_model.* and lm_head
  llm_state        the Gated DeltaNet layers' conv and recurrent state: one slot per decode sequence
  llm_kv           paged K and V of the full-attention layers only (a quarter of the layers)
  llm_prefill      prompt chunks, llm_mixed: decode rows with a prompt chunk, llm_decode: one row a sequence

Shapes are the real ones (../shared/reference/qwen3_5.md section 2.1); `config` (a checkpoint's config.json)
declares the nodes from its text_config instead. The MoE sizes (qwen3_5_moe) are refused by name. The engine
binds the state slots on eager steps only: `graphc run` serves cpu plans; GPU plans are for plan, explain and
check until captured steps carry their slot ids.
"""
from __future__ import annotations

import graphc as gc
from models.components.qwen3_5_text_config import QWEN3_5_0_8B, QWEN3_5_9B, Qwen3_5TextConfig, qwen3_5_ports

LLM = "models.components.qwen3_5_text:Qwen3_5LM"
# the real checkpoints' media ids (config.json: image_token_id, video_token_id, vision_start_token_id)
IMAGE_TOKEN, VIDEO_TOKEN, VISION_START = 248056, 248057, 248053

TINY = Qwen3_5TextConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=8,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=32, linear_num_key_heads=2,
                         linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
                         mrope_section=(2, 1, 1), tie_word_embeddings=True)

PRESETS = {
    # text config, per-step budgets, the longest request
    "9b": dict(text=QWEN3_5_9B, decode_seqs=64, prefill_tokens=8192, prefill_seqs=16, mixed_tokens=2048,
               max_seq_len=32768, page_size=16),
    "0.8b": dict(text=QWEN3_5_0_8B, decode_seqs=128, prefill_tokens=8192, prefill_seqs=16, mixed_tokens=2048,
                 max_seq_len=32768, page_size=16),
    "tiny": dict(text=TINY, decode_seqs=8, prefill_tokens=128, prefill_seqs=4, mixed_tokens=64, max_seq_len=1024,
                 page_size=16, pages=256),
}


def from_config(p: dict, config: dict) -> dict:
    """The preset's budgets with the text config and dtype from a checkpoint's config.json."""
    if config.get("model_type") not in ("qwen3_5", "qwen3_5_text"):
        raise gc.InvalidInput(f"config.json's model_type is {config.get('model_type')!r}", "this file declares the "
                              "dense Qwen3.5 models (model_type qwen3_5)", "pass a Qwen3.5 dense checkpoint")
    text = config.get("text_config", config)
    dtype = text.get("dtype", config.get("dtype", "bfloat16"))
    return dict(p, text=Qwen3_5TextConfig.from_text_config(text), dtype=dtype)


def walks(p: dict) -> list[gc.Walk]:
    return [
        gc.Walk(name="llm_decode", kind="decode", path=("llm",), budget=gc.Budget(seqs=p["decode_seqs"])),
        gc.Walk(name="llm_prefill", kind="prefill", path=("llm",),
                budget=gc.Budget(tokens=p["prefill_tokens"], seqs=p["prefill_seqs"])),
        gc.Walk(name="llm_mixed", kind="mixed", path=("llm",),
                budget=gc.Budget(tokens=p["mixed_tokens"], seqs=p["decode_seqs"])),
    ]


def declare(preset: str = "9b", config: dict | None = None) -> gc.Model:
    """The preset's budgets; the nodes' shapes from `config` (a checkpoint's config.json) when given."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset '{preset}'; presets: {', '.join(PRESETS)}")
    p = PRESETS[preset] if config is None else from_config(PRESETS[preset], config)
    text: Qwen3_5TextConfig = p["text"]
    dt = p.get("dtype", "bfloat16")
    inputs, outputs = qwen3_5_ports(text, "tokens", dt)
    llm = gc.Node(name="llm", module=LLM, config=text, weight_prefix="", dtype=dt, inputs=inputs, outputs=outputs,
                  resources={"kv": "llm_kv", "state": "llm_state"})
    return gc.Model(
        name=f"qwen3_5-{preset}" if config is None else f"qwen3_5-{preset}-checkpoint",
        nodes=[llm],
        resources=[text.kv_spec("llm_kv", p["max_seq_len"], dtype=dt, page_size=p["page_size"], pages=p.get("pages")),
                   text.state_spec("llm_state", conv_dtype=dt)],
        walks=walks(p),
        requests=[gc.RequestKind(name="t2t", stages=("llm_prefill", "llm_decode"))],
        pipeline=gc.Pipeline(stages=(gc.LLMStage(name="text", node="llm", decode="llm_decode",
                                                 prefill=("llm_prefill", "llm_mixed")),)),
    )


def host(model: gc.Model, checkpoint: str | None = None):
    """The serving host (graphc.Host): text in, 3-row M-RoPE positions (equal rows for text), the checkpoint's
    end-of-sequence ids (none with seeded weights: greedy runs to max_tokens)."""
    from models.components.hosting import AudioVisualHost, Encoders, checkpoint_config, generation_eos, \
        random_media_tokens
    from models.components.mrope import MediaTokens

    vocab = model.node("llm").config.vocab_size
    cfg = checkpoint_config(checkpoint)
    media = MediaTokens(image_token_id=IMAGE_TOKEN, video_token_id=VIDEO_TOKEN, vision_start_token_id=VISION_START,
                        audio_token_id=-1, audio_start_token_id=-2) if vocab > VIDEO_TOKEN else random_media_tokens(vocab)
    eos = generation_eos(checkpoint, cfg.get("text_config", cfg)) if cfg is not None else ()
    return AudioVisualHost(model, "llm", Encoders(), media, mrope=True, eos_token_ids=eos)
