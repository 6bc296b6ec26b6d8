"""Qwen3.5 (dense: 0.8B, 9B; MoE: 35B-A3B; and tiny presets of each) as a graphc model: a hybrid decoder of Gated
DeltaNet layers (state in a linear_state resource's slots) and gated full-attention layers (paged KV), 3 to 1, each
followed by a dense SwiGLU MLP (qwen3_5) or a sparse MoE block with a gated shared expert (qwen3_5_moe).

Nodes, walks and resources:
  vision_encoder   models/components/vision.py in Qwen3-VL's layout (Qwen3-Omni's tower, no deepstack), at
                   model.visual.*; its rows spliced into the LLM's embeddings
  llm              models/components/qwen3_5_text.py: Qwen3_5LM, weights at model.language_model.* and lm_head
  llm_state        the Gated DeltaNet layers' conv and recurrent state: one slot per decode sequence
  llm_kv           paged K and V of the full-attention layers only (a quarter of the layers)
  llm_prefill      prompt chunks, llm_mixed: decode rows with a prompt chunk, llm_decode: one row a sequence,
  image_prefill    the tower and the LLM: patches (4 per LLM token), images per step
  video_prefill    the tower and the LLM: patches, frame groups (two frames each) per step
Request kinds t2t, i2t and v2t. A video is laid out as Qwen3-VL's processor does (models/components/vl_host.py:
one pixel budget over the clip, each frame group after its time as text).

Shapes are the real ones (../shared/reference/qwen3_5.md section 2.1); `config` (a checkpoint's config.json)
declares the nodes from its text_config instead (model_type qwen3_5 or qwen3_5_moe). On a GPU, decode steps
replay captured graphs that read their sequences' slot ids from static buffers; prompt rows run eagerly.
"""
from __future__ import annotations

import graphc as gc
from models.components.qwen3_5_text_config import (QWEN3_5_0_8B, QWEN3_5_9B, QWEN3_5_35B_A3B, Qwen3_5MoeTextConfig,
                                                    Qwen3_5TextConfig, qwen3_5_ports)
from models.components.vision_config import VISION_QWEN3_5_0_8B, VISION_QWEN3_5_9B, VisionConfig, vision_node
from resources import RaggedAttentionSpec, WorkspaceSpec

LLM = "models.components.qwen3_5_text:Qwen3_5LM"
# the real checkpoints' media ids (config.json: image_token_id, video_token_id, vision_start_token_id, vision_end_token_id)
IMAGE_TOKEN, VIDEO_TOKEN, VISION_START, VISION_END = 248056, 248057, 248053, 248054

TINY = Qwen3_5TextConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=8,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=32, linear_num_key_heads=2,
                         linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
                         mrope_section=(2, 1, 1), tie_word_embeddings=True)
TINY_VISION = VisionConfig(depth=2, hidden_size=32, num_heads=4, intermediate_size=48, out_hidden_size=64,
                           num_position_embeddings=16)
TINY_MOE = Qwen3_5MoeTextConfig(**TINY.model_dump(exclude={"intermediate_size"}), num_experts=8, num_experts_per_tok=3,
                                moe_intermediate_size=32, shared_expert_intermediate_size=48)
# 35B-A3B's tower: 9B's (Qwen3-VL's layout, no deepstack) projecting to the LLM's hidden size 2048 (the reference's
# section 1 table: depth 27, width 1152)
VISION_QWEN3_5_35B_A3B = VISION_QWEN3_5_9B.model_copy(update={"out_hidden_size": 2048})
# model_type -> the text config class that reads its text_config
TEXT_CONFIGS = {"qwen3_5": Qwen3_5TextConfig, "qwen3_5_text": Qwen3_5TextConfig,
                "qwen3_5_moe": Qwen3_5MoeTextConfig, "qwen3_5_moe_text": Qwen3_5MoeTextConfig}

PRESETS = {
    # text config, per-step budgets, the longest request
    # (patches: an image's patches at most, 16 x 16 px each, 4 to an LLM token; images: per step; videos: clips a
    # step; frame_groups: the vision attention's segments a step, one a frame group: a clip's frames shrink with
    # its length under one pixel budget, to 12 patches a group for 60 s at the processor's defaults, so a 60 s
    # clip is 60 groups of 768 patches and 1,065 prompt rows; 512 groups let the tokens bound such a step, at 7)
    "9b": dict(text=QWEN3_5_9B, vision=VISION_QWEN3_5_9B, decode_seqs=64, prefill_tokens=8192, prefill_seqs=16,
               mixed_tokens=2048, patches=16384, images=8, videos=16, frame_groups=512, max_seq_len=32768, page_size=16),
    "0.8b": dict(text=QWEN3_5_0_8B, vision=VISION_QWEN3_5_0_8B, decode_seqs=128, prefill_tokens=8192, prefill_seqs=16,
                 mixed_tokens=2048, patches=16384, images=8, videos=16, frame_groups=512, max_seq_len=32768, page_size=16),
    "35b-a3b": dict(text=QWEN3_5_35B_A3B, vision=VISION_QWEN3_5_35B_A3B, decode_seqs=64, prefill_tokens=8192,
                    prefill_seqs=16, mixed_tokens=2048, patches=16384, images=8, videos=16, frame_groups=512, max_seq_len=32768,
                    page_size=16),
    "tiny": dict(text=TINY, vision=TINY_VISION, decode_seqs=8, prefill_tokens=128, prefill_seqs=4, mixed_tokens=64,
                 patches=256, images=2, videos=2, frame_groups=8, max_seq_len=1024, page_size=16, pages=256),
    "tiny-moe": dict(text=TINY_MOE, vision=TINY_VISION, decode_seqs=8, prefill_tokens=128, prefill_seqs=4,
                     mixed_tokens=64, patches=256, images=2, videos=2, frame_groups=8, max_seq_len=1024, page_size=16, pages=256),
}


def from_config(p: dict, config: dict) -> dict:
    """The preset's budgets with the text config and dtype from a checkpoint's config.json."""
    kind = TEXT_CONFIGS.get(config.get("model_type"))
    if kind is None:
        raise gc.InvalidInput(f"config.json's model_type is {config.get('model_type')!r}", "this file declares the "
                              "Qwen3.5 models (model_type qwen3_5 or qwen3_5_moe)", "pass a Qwen3.5 checkpoint")
    text = config.get("text_config", config)
    dtype = text.get("dtype", config.get("dtype", "bfloat16"))
    out = dict(p, text=kind.from_text_config(text), dtype=dtype)
    return out | ({"vision": VisionConfig.from_hf(config["vision_config"])} if "vision_config" in config
                  else {"vision": None})


def walks(p: dict) -> list[gc.Walk]:
    """Decode is captured; prompt rows run eagerly (capture=False, and no LLM rung on image_prefill), as the
    compiler requires of a node on state slots: the chunked delta rule sizes its kernels on the host."""
    out = [
        gc.Walk(name="llm_decode", kind="decode", path=("llm",), budget=gc.Budget(seqs=p["decode_seqs"])),
        gc.Walk(name="llm_prefill", kind="prefill", path=("llm",), capture=False,
                budget=gc.Budget(tokens=p["prefill_tokens"], seqs=p["prefill_seqs"])),
        gc.Walk(name="llm_mixed", kind="mixed", path=("llm",), capture=False,
                budget=gc.Budget(tokens=p["mixed_tokens"], seqs=p["decode_seqs"])),
    ]
    if p["vision"] is not None:
        out.append(gc.Walk(name="image_prefill", kind="prefill", path=("vision_encoder", "llm"),
                           capture_limit={"llm": 0},
                           budget=gc.Budget(patches=p["patches"], tokens=p["prefill_tokens"], seqs=p["images"])))
        out.append(gc.Walk(name="video_prefill", kind="prefill", path=("vision_encoder", "llm"),
                           capture_limit={"llm": 0},
                           budget=gc.Budget(patches=p["patches"], tokens=p["prefill_tokens"], seqs=p["videos"],
                                            segments=p["frame_groups"])))
    return out


def vision(p: dict, dt: str) -> tuple[list, list, list]:
    """The tower's (nodes, resources, edges), none for a checkpoint without a vision_config."""
    v: VisionConfig | None = p["vision"]
    if v is None:
        return [], [], []
    return ([vision_node(v, name="vision_encoder", attn="vision_attn", dtype=dt, layout="qwen3_vl")],
            [WorkspaceSpec(name="vision_ws"),
             RaggedAttentionSpec(name="vision_attn", num_heads=v.num_heads, head_dim=v.head_dim,
                                 max_segment=p["patches"], workspace="vision_ws")],
            [gc.Edge(src="vision_encoder.embeds", dst="llm.mm_embeds")])


def declare(preset: str = "9b", config: dict | None = None, tp: int = 1) -> gc.Model:
    """The preset's budgets; the nodes' shapes from `config` (a checkpoint's config.json) when given. tp > 1: one
    of tp tensor-parallel ranks' declaration: the LLM node's config is a rank's part (its heads, KV heads, linear
    heads and MLP widths divided by tp: Qwen3_5TextConfig.rank_part), and so are its KV pages and state slots; the
    vision tower, embeddings, LM head and norms are whole on every rank."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset '{preset}'; presets: {', '.join(PRESETS)}")
    p = PRESETS[preset] if config is None else from_config(PRESETS[preset], config)
    text: Qwen3_5TextConfig = p["text"].rank_part(tp)
    dt = p.get("dtype", "bfloat16")
    rows = f"patches/{p['vision'].merge_unit}" if p["vision"] is not None else "tokens"
    inputs, outputs = qwen3_5_ports(text, rows, dt)
    # the checkpoints' multi-token-prediction head (mtp.*) is not run; nor is a tower the config declares none of
    ignore = ("mtp.",) + (("model.visual.",) if p["vision"] is None else ())
    llm = gc.Node(name="llm", module=LLM, config=text, weight_prefix="", dtype=dt, inputs=inputs, outputs=outputs,
                  resources={"kv": "llm_kv", "state": "llm_state"}, ignore_weights=ignore)
    enc_nodes, enc_resources, edges = vision(p, dt)
    stages = [gc.LLMStage(name="text", node="llm", decode="llm_decode", prefill=("llm_prefill", "llm_mixed"))]
    requests = [gc.RequestKind(name="t2t", stages=("llm_prefill", "llm_decode"))]
    if enc_nodes:
        stages.append(gc.EncoderStage(name="see", node="vision_encoder", media=("image", "video"),
                                      walks=("image_prefill", "video_prefill")))
        requests += [gc.RequestKind(name="i2t", stages=("image_prefill", "llm_decode")),
                     gc.RequestKind(name="v2t", stages=("video_prefill", "llm_decode"))]
    return gc.Model(
        name=f"qwen3_5-{preset}" if config is None else f"qwen3_5-{preset}-checkpoint",
        nodes=enc_nodes + [llm],
        resources=enc_resources + [
            text.kv_spec("llm_kv", p["max_seq_len"], dtype=dt, page_size=p["page_size"], pages=p.get("pages")),
            text.state_spec("llm_state", conv_dtype=dt)],
        edges=edges, walks=walks(p), requests=requests, pipeline=gc.Pipeline(stages=tuple(stages)),
    )

def host(model: gc.Model, checkpoint: str | None = None):
    """The serving host (graphc.Host): text, images and videos in (models/components/vl_host.py), 3-row M-RoPE
    positions; the media ids and end-of-sequence ids from the checkpoint's config.json (the real ids, or the
    vocabulary's last ones, with seeded weights; then no end of sequence: greedy runs to max_tokens). A video's
    frame-group times are text in the checkpoint tokenizer's ids (tokenizer.json); without one, videos are refused.
    A video file's frames are sampled as HF's Qwen3-VL video processor samples them (vl_host.spread_frames)."""
    from models.components.hosting import Encoders, checkpoint_config, generation_eos, random_media_tokens, \
        vision_processing
    from models.components.mrope import MediaTokens
    from models.components.vl_host import TimestampVideoHost, spread_frames

    vocab = model.node("llm").config.vocab_size
    cfg = checkpoint_config(checkpoint)
    ids = {"image_token_id": IMAGE_TOKEN, "video_token_id": VIDEO_TOKEN, "vision_start_token_id": VISION_START}
    end = VISION_END
    if cfg is not None:
        ids = {k: cfg.get(k, v) for k, v in ids.items()}
        end = cfg.get("vision_end_token_id", end)
    real = max([*ids.values(), end]) < vocab
    media = (MediaTokens(**ids, audio_token_id=-1, audio_start_token_id=-2) if real else random_media_tokens(vocab))
    eos = generation_eos(checkpoint, cfg.get("text_config", cfg)) if cfg is not None else ()
    seen = "vision_encoder" in {n.name for n in model.nodes}
    return TimestampVideoHost(model, "llm", Encoders(image=("vision_encoder", "image_prefill") if seen else None,
                                                     video=("vision_encoder", "video_prefill") if seen else None),
                              media, mrope=True, eos_token_ids=eos,
                              vision=vision_processing(checkpoint) if checkpoint else None,
                              vision_end=end if real else vocab - 6, timestamp_ids=timestamp_ids(checkpoint),
                              video_frames=spread_frames(checkpoint))


def timestamp_ids(checkpoint: str | None):
    """text -> its ids in the checkpoint's tokenizer.json (no special tokens added), or None without one."""
    from pathlib import Path

    if checkpoint is None or not (Path(checkpoint) / "tokenizer.json").is_file():
        return None
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(checkpoint) / "tokenizer.json"))
    return lambda text: tok.encode(text, add_special_tokens=False).ids
