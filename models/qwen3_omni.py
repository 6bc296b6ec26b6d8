"""Qwen3-Omni-30B-A3B as a graphc model: audio and vision encoders spliced into the MoE thinker,
the talker (with its code predictor) and Code2Wav for speech.

Real shapes from the fact sheet (shared/reference/qwen3_omni.md); weight names are the public
checkpoint's (thinker.audio_tower.*, thinker.visual.*, thinker.model.*, thinker.lm_head,
talker.*, code2wav.*). Presets: '30b-a3b' (default) and 'tiny' (runs on a CPU in seconds).

Walks (one engine step each) and their budgets (the most one step carries):
  thinker_decode   thinker                      seqs
  thinker_prefill  thinker                      tokens per chunk (and sequences)
  thinker_mixed    thinker                      a prefill chunk beside decode rows: tokens, seqs
  audio_prefill    audio_encoder -> thinker     windows (104 tokens each) spliced into a chunk
  image_prefill    vision_encoder -> thinker    patches (4 per LLM token), images per step
  video_prefill    vision_encoder -> thinker    patches, frame groups per step
  av_prefill       both encoders -> thinker     a video with its sound (use_audio_in_video)
  talker_prefill   talker                       the talker's prompt rows
  talker_decode    talker (+ code predictor)    sequences, one 16-code frame each
  code2wav_short   code2wav                     frames in short slots (a request's first chunks: 2, 4 and 8 new frames)
  code2wav_mid     code2wav                     frames in middle slots (the next chunks, 16 and 32 new frames)
  code2wav_chunk   code2wav                     frames in slots of chunk_frames (75 new + 25 left context)
"""
from __future__ import annotations

import graphc as gc
from models.components import code2wav_config as c2w
from models.components.aut_config import QWEN3_OMNI_AUT, AuTConfig, attention_spec, node_ports
from models.components.talker_config import TALKER_30B_A3B, CodePredictorConfig, TalkerConfig, TalkerTextConfig, \
    talker_ports
from models.components.thinker_config import THINKER_30B_A3B, ThinkerConfig, thinker_ports
from models.components.vision_config import VisionConfig, vision_node
from resources import PagedKVSpec, RaggedAttentionSpec, WorkspaceSpec

VISION_30B_A3B = VisionConfig(depth=27, hidden_size=1152, num_heads=16, intermediate_size=4304, out_hidden_size=2048,
                              num_position_embeddings=2304, deepstack_visual_indexes=(8, 16, 24))

REAL = dict(
    aut=QWEN3_OMNI_AUT, vision=VISION_30B_A3B, thinker=THINKER_30B_A3B, talker=TALKER_30B_A3B,
    # Code2Wav serves streamed chunks in slots of 100 frames (75 new beside HF's 25 of left context); a
    # request's first chunks are shorter (2, 4 and 8 new frames with their context fill 16; 16 and 32 new
    # frames, 57 at most with context, and an 8 s answer's last chunk fill 64) and a slot costs its full
    # length, so they have walks of 16- and 64-frame slots
    code2wav=c2w.Code2WavConfig(chunk_frames=100), code2wav_short=16, code2wav_mid=64,
    decode_seqs=64, prefill_tokens=2048, prefill_seqs=16, mixed_tokens=1024, windows=16, patches=8192,
    images=4, frame_groups=16, max_frame_patches=8192, talker_seqs=32, code2wav_slots=16,
    # the talker's prompts of 16 requests that heard a few seconds of audio (about 100 rows each) in one step
    talker_tokens=2048,
    # an image has at least 4 merged tokens; patch rungs start at 256 (a 256x256 image) and double
    patch_ladder=(256, 512, 1024, 2048, 4096, 8192, 16384, 32768),
    # a media chunk's thinker rows (its text and at least 64 rows of a 256-patch image): steps of 1.5x and 2x
    media_row_ladder=(64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536),
    thinker_len=32768, talker_len=32768, page_size=16,
)

TINY = dict(
    aut=AuTConfig(d_model=64, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=128, output_dim=64,
                  downsample_hidden_size=16),
    vision=VisionConfig(depth=4, hidden_size=32, num_heads=4, intermediate_size=64, out_hidden_size=64,
                        num_position_embeddings=64, deepstack_visual_indexes=(1, 2, 3)),
    thinker=ThinkerConfig(vocab_size=512, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=16, moe_intermediate_size=32, num_experts=8,
                          num_experts_per_tok=2, mrope_section=(4, 2, 2), accept_hidden_layer=2),
    talker=TalkerConfig(
        text_config=TalkerTextConfig(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, head_dim=16, moe_intermediate_size=16, num_experts=8,
                                     num_experts_per_tok=2, mrope_section=(4, 2, 2), intermediate_size=64,
                                     shared_expert_intermediate_size=32),
        code_predictor_config=CodePredictorConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                                  num_hidden_layers=2, num_attention_heads=4,
                                                  num_key_value_heads=2, head_dim=16),
        thinker_hidden_size=64, num_code_groups=4, codec_eos_token_id=80),
    code2wav=c2w.Code2WavConfig(codebook_size=64, num_quantizers=4, hidden_size=32, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=4, intermediate_size=64, sliding_window=8,
                                upsampling_ratios=(2, 2), upsample_rates=(2, 2, 2, 2), decoder_dim=64,
                                chunk_frames=24, left_context=4), code2wav_short=8, code2wav_mid=16,
    decode_seqs=8, prefill_tokens=128, prefill_seqs=4, mixed_tokens=64, windows=2, patches=256, images=2,
    frame_groups=4, max_frame_patches=128, talker_tokens=64, talker_seqs=4, code2wav_slots=2,
    thinker_len=1024, talker_len=1024, page_size=16, thinker_pages=256, talker_pages=256,
)

PRESETS = {"30b-a3b": REAL, "tiny": TINY}


def thinker_node(p: dict) -> gc.Node:
    dt = p.get("dtype", "bfloat16")
    inputs, outputs = thinker_ports(p["thinker"], f"windows*{p['aut'].window_tokens}",
                                    f"patches/{p['vision'].merge_unit}", len(p["vision"].deepstack_visual_indexes), dt)
    return gc.Node(name="thinker", module="models.components.thinker:Thinker", config=p["thinker"],
                   weight_prefix="thinker.", resources={"kv": "thinker_kv"}, inputs=inputs, outputs=outputs, dtype=dt)


def talker_node(p: dict) -> gc.Node:
    dt = p.get("dtype", "bfloat16")
    inputs, outputs = talker_ports(p["talker"], dt)
    return gc.Node(name="talker", module="models.components.talker:Talker", config=p["talker"],
                   weight_prefix="talker.", resources={"kv": "talker_kv", "cp_attn": "code_predictor_attn"},
                   inputs=inputs, outputs=outputs, dtype=dt)


def resources(p: dict) -> list:
    th, tk, cp = p["thinker"], p["talker"].text_config, p["talker"].code_predictor_config
    v, c = p["vision"], p["code2wav"]
    groups = p["talker"].num_code_groups
    return [
        # the encoders' float workspaces, sized by the compiler unless a deployment sets them
        WorkspaceSpec(name="audio_ws"),
        WorkspaceSpec(name="vision_ws"),
        attention_spec(p["aut"], "audio_attn", workspace="audio_ws"),
        RaggedAttentionSpec(name="vision_attn", num_heads=v.num_heads, head_dim=v.head_dim,
                            max_segment=p["max_frame_patches"], workspace="vision_ws"),
        PagedKVSpec(name="thinker_kv", num_layers=th.num_hidden_layers, num_qo_heads=th.num_attention_heads,
                    num_kv_heads=th.num_key_value_heads, head_dim=th.head_dim, page_size=p["page_size"],
                    max_seq_len=p["thinker_len"], pages=p.get("thinker_pages"), fill_share=5.0),
        PagedKVSpec(name="talker_kv", num_layers=tk.num_hidden_layers, num_qo_heads=tk.num_attention_heads,
                    num_kv_heads=tk.num_key_value_heads, head_dim=tk.head_dim, page_size=p["page_size"],
                    max_seq_len=p["talker_len"], pages=p.get("talker_pages"), fill_share=1.0),
        # the code predictor's 16-code frame per sampled row: one causal segment of 16 rows each
        RaggedAttentionSpec(name="code_predictor_attn", num_heads=cp.num_attention_heads,
                            num_kv_heads=cp.num_key_value_heads, head_dim=cp.head_dim, max_segment=groups,
                            causal=True, rows_per_segment=groups, segment_axis="seqs"),
        c2w.attention_spec(c, "code2wav_attn"),
    ]


def walks(p: dict) -> list[gc.Walk]:
    return [
        gc.Walk(name="thinker_decode", kind="decode", path=("thinker",), budget=gc.Budget(seqs=p["decode_seqs"])),
        gc.Walk(name="thinker_prefill", kind="prefill", path=("thinker",),
                budget=gc.Budget(tokens=p["prefill_tokens"], seqs=p["prefill_seqs"])),
        gc.Walk(name="thinker_mixed", kind="mixed", path=("thinker",),
                budget=gc.Budget(tokens=p["mixed_tokens"], seqs=p["decode_seqs"])),
        gc.Walk(name="audio_prefill", kind="prefill", path=("audio_encoder", "thinker"),
                budget=gc.Budget(windows=p["windows"], tokens=p["prefill_tokens"], seqs=p["prefill_seqs"])),
        gc.Walk(name="image_prefill", kind="prefill", path=("vision_encoder", "thinker"),
                budget=gc.Budget(patches=p["patches"], tokens=p["prefill_tokens"], seqs=p["images"]),
                ladders=patch_ladders(p)),
        gc.Walk(name="video_prefill", kind="prefill", path=("vision_encoder", "thinker"),
                budget=gc.Budget(patches=p["patches"], tokens=p["prefill_tokens"], seqs=p["frame_groups"]),
                ladders=patch_ladders(p)),
        # a video heard with its own sound (use_audio_in_video): both encoders spliced into one chunk
        gc.Walk(name="av_prefill", kind="prefill", path=("audio_encoder", "vision_encoder", "thinker"),
                budget=gc.Budget(windows=p["windows"], patches=p["patches"], tokens=p["prefill_tokens"],
                                 seqs=p["frame_groups"]), ladders=patch_ladders(p)),
        gc.Walk(name="talker_prefill", kind="prefill", path=("talker",),
                budget=gc.Budget(tokens=p["talker_tokens"], seqs=p["talker_seqs"])),
        gc.Walk(name="talker_decode", kind="decode", path=("talker",), budget=gc.Budget(seqs=p["talker_seqs"])),
    ] + chunk_walks(p)


def patch_ladders(p: dict) -> dict[str, tuple[int, ...]]:
    """The vision encoder climbs the patch ladder; the thinker's rows on the same walks climb media_row_ladder
    (an image's rows padded to the next rung of 1.5x, not of the patch ladder's 2x)."""
    out = {"vision_encoder": p["patch_ladder"]} if "patch_ladder" in p else {}
    return out | ({"thinker": p["media_row_ladder"]} if "media_row_ladder" in p else {})


def chunk_walks(p: dict) -> list[gc.Walk]:
    """Code2Wav's walks, one a slot length: the short and middle slots of a request's first chunks and
    chunk_frames; each takes code2wav_slots slots a step, in rungs of 1, 2, 4, ... slots."""
    n = p["code2wav_slots"]
    slots = [s for s in (1, 2, 4, 8, 16, 32) if s < n] + [n]
    lengths = (p["code2wav_short"], p["code2wav_mid"], p["code2wav"].chunk_frames)
    return [gc.Walk(name=name, kind="chunk", path=("code2wav",), budget=gc.Budget(frames=n * f, seqs=n),
                    ladder=tuple(s * f for s in slots)) for name, f in zip(CHUNKS, lengths)]


# the talker's inputs made on the thinker's device (the others, positions and row indices, on the host)
TALKER_FROM_THINKER = ("embeds", "trailing_text", "sampling", "noise", "seen", "thinker_embeds", "thinker_hidden")
CHUNKS = ("code2wav_short", "code2wav_mid", "code2wav_chunk")
SPEECH = ("thinker_decode", "talker_prefill", "talker_decode") + CHUNKS


def from_config(p: dict, config: dict) -> dict:
    """The preset's budgets with the nodes' shapes and dtype from a checkpoint's config.json (HF names):
    thinker_config (text, audio and vision), and talker_config and code2wav_config when the checkpoint
    speaks (enable_audio_output). How Code2Wav is chunked for serving stays the preset's."""
    from models.components import hf_config as hf

    th = hf.sub(config, "thinker_config")
    text = hf.sub(th, "text_config")
    speech = bool(config.get("enable_audio_output", True))
    p = dict(p, aut=hf.aut(hf.sub(th, "audio_config")), vision=hf.vision(hf.sub(th, "vision_config")),
             dtype=hf.dtype(config, th, text), speech=speech)
    accept = None
    if speech:
        talker = hf.sub(config, "talker_config")
        p["talker"] = hf.talker(talker)
        p["code2wav"] = hf.code2wav(hf.sub(config, "code2wav_config"), p["code2wav"])
        accept = hf.sub(talker, "accept_hidden_layer")
    p["thinker"] = hf.thinker(text, accept)
    return p


def declare(preset: str = "30b-a3b", config: dict | None = None) -> gc.Model:
    """The preset's budgets; the nodes' shapes from `config` (a checkpoint's config.json) when given. A
    checkpoint without audio output declares the thinker alone (kinds t2t, a2t, i2t, v2t)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset '{preset}'; presets: {', '.join(PRESETS)}")
    p = PRESETS[preset] if config is None else from_config(PRESETS[preset], config)
    dt, speech = p.get("dtype", "bfloat16"), p.get("speech", True)
    enc_in, enc_out = node_ports(p["aut"], dt)
    c_in, c_out = c2w.ports(p["code2wav"])
    nodes = [
        gc.Node(name="audio_encoder", module="models.components.aut:AuTEncoder", config=p["aut"],
                weight_prefix="thinker.audio_tower.", inputs=enc_in, outputs=enc_out, resources={"attn": "audio_attn"}, dtype=dt),
        vision_node(p["vision"], name="vision_encoder", attn="vision_attn", dtype=dt),
        thinker_node(p),
    ]
    if speech:
        nodes += [talker_node(p),
                  gc.Node(name="code2wav", module="models.components.code2wav:Code2Wav", config=p["code2wav"],
                          weight_prefix="code2wav.", inputs=c_in, outputs=c_out, resources={"attn": "code2wav_attn"}, dtype=dt)]
    speech_parts = ("talker_kv", "code_predictor_attn", "code2wav_attn")
    requests = [
        gc.RequestKind(name="t2t", stages=("thinker_prefill", "thinker_decode")),
        gc.RequestKind(name="a2t", stages=("audio_prefill", "thinker_decode")),
        gc.RequestKind(name="i2t", stages=("image_prefill", "thinker_decode")),
        gc.RequestKind(name="v2t", stages=("video_prefill", "thinker_decode")),
        gc.RequestKind(name="av2t", stages=("av_prefill", "thinker_decode")),
    ]
    if speech:
        requests += [gc.RequestKind(name="t2s", stages=("thinker_prefill", SPEECH)),
                     gc.RequestKind(name="a2s", stages=("audio_prefill", SPEECH))]
    return gc.Model(
        name=f"qwen3_omni-{preset}" if config is None else f"qwen3_omni-{preset}-checkpoint",
        nodes=nodes,
        resources=[r.model_copy(update={"dtype": dt}) if r.name in ("thinker_kv", "talker_kv") else r
                   for r in resources(p) if speech or r.name not in speech_parts],
        edges=[gc.Edge(src="audio_encoder.embeds", dst="thinker.audio_embeds"),
               gc.Edge(src="vision_encoder.embeds", dst="thinker.visual_embeds"),
               gc.Edge(src="vision_encoder.deepstack", dst="thinker.deepstack")],
        # the engine builds the talker's rows from the thinker's embeddings and hidden states (and its
        # sampling rows and draws) on the thinker's device, and reads the codes and the audio there
        links=[gc.Link(src="thinker", dst="talker", inputs=TALKER_FROM_THINKER, outputs=("codes", "next_embeds")),
               gc.Link(src="thinker", dst="code2wav", outputs=("wav",))] if speech else [],
        walks=[w for w in walks(p) if speech or w.name not in SPEECH[1:]],
        requests=requests,
        pipeline=pipeline(p["code2wav"], speech),
    )


def pipeline(code2wav: c2w.Code2WavConfig, speech: bool) -> gc.Pipeline:
    """The thinker decodes text with the encoders spliced into its prefill; when it speaks, the talker
    follows it (reading its hidden rows) and Code2Wav decodes the talker's codes in slots of chunk_frames."""
    stages = [
        gc.LLMStage(name="text", node="thinker", decode="thinker_decode", prefill=("thinker_prefill", "thinker_mixed")),
        gc.EncoderStage(name="hear", node="audio_encoder", media=("audio",), walks=("audio_prefill", "av_prefill")),
        gc.EncoderStage(name="see", node="vision_encoder", media=("image", "video"),
                        walks=("image_prefill", "video_prefill", "av_prefill")),
    ]
    if speech:
        stages += [gc.FollowStage(name="speak", node="talker", after="text", reads="hidden",
                                  prefill="talker_prefill", decode="talker_decode"),
                   gc.ChunkStage(name="voice", node="code2wav", after="speak", walks=CHUNKS,
                                 slot_frames=code2wav.chunk_frames, sample_rate=c2w.SAMPLE_RATE)]
    return gc.Pipeline(stages=stages)

def host(model: gc.Model, checkpoint: str | None = None):
    """The serving host (graphc.Host, graphc/serving.py): Qwen3-Omni's media tokens and end-of-turn ids from the
    checkpoint's config.json (<|audio_end|> from its tokenizer.json), or the real model's (seeded weights
    on a vocabulary that holds them); with a talker, its speech (models/components/speech_host.py)."""
    from models.components.hosting import AudioVisualHost, Encoders, checkpoint_config, generation_eos, \
        random_media_tokens, special_token, vision_processing
    from models.components.mrope import MediaTokens

    walks = {w.name for w in model.walks}
    encoders = Encoders(audio=("audio_encoder", "audio_prefill"), image=("vision_encoder", "image_prefill"),
                        video=("vision_encoder", "video_prefill"),
                        audio_in_video="av_prefill" if "av_prefill" in walks else None)
    vocab = model.node("thinker").config.vocab_size
    cfg = checkpoint_config(checkpoint)
    if cfg is not None:
        th = cfg.get("thinker_config", cfg)
        media = MediaTokens(**{k: th[k] for k in MediaTokens.model_fields if k in th and k != "spatial_merge_size"})
        eos = generation_eos(checkpoint, cfg)
        audio_end = special_token(checkpoint, "<|audio_end|>", media.audio_start_token_id + 1)
    elif vocab > MediaTokens().audio_token_id:
        media, eos, audio_end = MediaTokens(), (151645, 151643), 151670
    else:
        media, eos = random_media_tokens(vocab), ()
        audio_end = vocab - 6
    host = AudioVisualHost(model, "thinker", encoders, media, mrope=True, eos_token_ids=eos,
                           vision=vision_processing(checkpoint), audio_end=audio_end)
    if any(n.name == "talker" for n in model.nodes):
        from models.components.speech_host import QwenOmniSpeech, speech_ids
        host.speech = QwenOmniSpeech(model, media, speech_ids(cfg, vocab))
    return host

