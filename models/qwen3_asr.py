"""Qwen3-ASR (0.6B, 1.7B, and a tiny preset): the AuT audio encoder spliced into a dense Qwen3.

Weight names follow the public QwenLM checkpoints (Qwen/Qwen3-ASR-*): thinker.audio_tower.* and
thinker.model.* (embeddings tied to the LM head). Real sizes from the fact sheet, section 6.
"""
from __future__ import annotations

import graphc as gc
from models.components import hf_config as hf
from models.components.aut_config import QWEN3_ASR_0_6B_AUT, QWEN3_ASR_1_7B_AUT, AuTConfig, attention_spec, node_ports
from models.components.qwen3_dense_config import Qwen3Config, lm_ports
from resources import PagedKVSpec

# the nodes' modules, by import path (imported when first built)
AUT, AUT_HF = "models.components.aut:AuTEncoder", "models.components.aut:AuTEncoderHF"
LM, LM_NESTED = "models.components.qwen3_dense:Qwen3LM", "models.components.qwen3_dense:Qwen3LMNested"

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


def from_config(config: dict) -> dict:
    """Node configs, classes, weight prefixes and dtype from a checkpoint's config.json: transformers'
    layout (model_type qwen3_asr: model.audio_tower.*, model.multi_modal_projector.*, model.language_model.*)
    or QwenLM's (thinker_config: thinker.audio_tower.*, thinker.model.*)."""
    if config.get("model_type") == "qwen3_asr":
        audio, text = hf.sub(config, "audio_config"), hf.sub(config, "text_config")
        tie = config.get("tie_word_embeddings", text.get("tie_word_embeddings"))
        return dict(aut=hf.aut(audio), lm=hf.qwen3(text, tie), enc=(AUT_HF, "model."), llm=(LM_NESTED, ""),
                    dtype=hf.dtype(config, text))
    th = hf.sub(config, "thinker_config")
    audio, text = hf.sub(th, "audio_config"), hf.sub(th, "text_config")
    tie = th.get("tie_word_embeddings", text.get("tie_word_embeddings"))
    return dict(aut=hf.aut(audio), lm=hf.qwen3(text, tie), enc=(AUT, "thinker.audio_tower."),
                llm=(LM, "thinker."), dtype=hf.dtype(config, th, text))


def declare(preset: str = "1.7b", config: dict | None = None) -> gc.Model:
    """The preset's budgets; the nodes' shapes from `config` (a checkpoint's config.json) when given."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset '{preset}'; presets: {', '.join(PRESETS)}")
    p = PRESETS[preset]
    c = from_config(config) if config is not None else dict(aut=p["aut"], lm=p["lm"], enc=(AUT, "thinker.audio_tower."),
                                                            llm=(LM, "thinker."), dtype="bfloat16")
    aut, lm, dt = c["aut"], c["lm"], c["dtype"]
    enc_in, enc_out = node_ports(aut, dt)
    lm_in, lm_out = lm_ports(lm, f"windows*{aut.window_tokens}", dt)
    return gc.Model(
        name=f"qwen3_asr-{preset}" if config is None else f"qwen3_asr-{preset}-checkpoint",
        nodes=[
            gc.Node(name="audio_encoder", module=c["enc"][0], config=aut, weight_prefix=c["enc"][1], dtype=dt,
                    inputs=enc_in, outputs=enc_out, resources={"attn": "audio_attn"}),
            gc.Node(name="thinker", module=c["llm"][0], config=lm, weight_prefix=c["llm"][1], dtype=dt,
                    inputs=lm_in, outputs=lm_out, resources={"kv": "thinker_kv"}),
        ],
        resources=[
            attention_spec(aut, "audio_attn"),
            PagedKVSpec(name="thinker_kv", num_layers=lm.num_layers, num_qo_heads=lm.num_heads, dtype=dt,
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
        pipeline=gc.Pipeline(stages=(
            gc.LLMStage(name="text", node="thinker", decode="thinker_decode", prefill=("thinker_prefill",)),
            gc.EncoderStage(name="hear", node="audio_encoder", media=("audio",), walks=("audio_prefill",)))),
    )


def host(model: gc.Model, checkpoint: str | None = None):
    """The serving host (graphc.Host, graphc/serving.py): 1-D positions, audio through the AuT."""
    from models.components.asr_transcription import AsrTranscription
    from models.components.hosting import AudioVisualHost, Encoders, checkpoint_config, generation_eos, \
        random_media_tokens
    from models.components.mrope import MediaTokens

    vocab = model.node("thinker").config.vocab_size
    cfg = checkpoint_config(checkpoint)
    if cfg is not None:
        audio = cfg.get("audio_token_id", cfg.get("thinker_config", {}).get("audio_token_id", 151676))
        media, eos = MediaTokens(audio_token_id=audio), generation_eos(checkpoint, cfg)
    elif vocab > 151676:
        media, eos = MediaTokens(audio_token_id=151676), (151645, 151643)
    else:
        media, eos = random_media_tokens(vocab), ()
    host = AudioVisualHost(model, "thinker", Encoders(audio=("audio_encoder", "audio_prefill")), media, mrope=False,
                           eos_token_ids=eos)
    host.transcription = AsrTranscription()
    return host
