"""Write tiny checkpoints the way users have them: HF transformers' save_pretrained (config.json and
safetensors), a tokenizer.json built with `tokenizers`, and a Qwen-style chat template.

    python examples/make_tiny_checkpoint.py asr ckpt/tiny_asr        # Qwen3-ASR (transformers' layout)
    python examples/make_tiny_checkpoint.py omni ckpt/tiny_omni      # Qwen3-Omni thinker (no talker)
    python examples/make_tiny_checkpoint.py omni-speech ckpt/tiny_omni_speech   # with talker and Code2Wav
    python examples/make_tiny_checkpoint.py qwen3_5 ckpt/tiny_qwen3_5            # Qwen3.5 (text, image, video in)

Then plan and serve it on a CPU:

    graphc plan models/qwen3_asr.py --preset tiny --checkpoint ckpt/tiny_asr --gpu cpu -o asr.plan
    graphc run asr.plan --checkpoint ckpt/tiny_asr --requests examples/requests_tiny_asr.jsonl --output out.jsonl

Each checkpoint folder also gets sample.wav, a 2 s tone to send it.

Needs transformers (the test extra). Weights are HF's random init (seeded); the tests re-draw them.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|audio_start|>", "<|audio_end|>", "<|audio_pad|>",
            "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>", "<tts_pad>", "<tts_text_bos>",
            "<tts_text_eod>"]
ROLES = ["system", "user", "assistant"]          # one token each, as in Qwen's vocabulary
CORPUS = ["the quick brown fox jumps over the lazy dog", "transcribe this audio please", "what is in the image",
          "describe the video", "hello world, how are you today?", "graphc plans and serves multimodal models",
          "naïve café — 日本語のテキスト 😀", "numbers 0123456789 and symbols !?.,;:"] * 4
# Qwen3's chat template in small: its tools branch as Qwen3 writes it (the tools in the system turn, an
# assistant's tool_calls as <tool_call> blocks, each run of tool results as one user turn of
# <tool_response> blocks), without its thinking branches; media parts as Qwen3-Omni writes them
TOOLS_HEAD = ("# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided "
              "with function signatures within <tools></tools> XML tags:\\n<tools>")
TOOLS_TAIL = ("\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
              "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": "
              "<args-json-object>}\\n</tool_call><|im_end|>\\n")
TEMPLATE = (
    "{%- macro render(content) -%}"
    "{%- if content is string -%}{{ content }}"
    "{%- else -%}{%- for part in content -%}"
    "{%- if part.type == 'text' -%}{{ part.text }}"
    "{%- elif part.type == 'audio' -%}{{ '<|audio_start|><|audio_pad|><|audio_end|>' }}"
    "{%- elif part.type == 'image' -%}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif part.type == 'video' -%}{{ '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}"
    "{%- if tools -%}"
    "{{ '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' -%}{{ render(messages[0].content) + '\\n\\n' }}{%- endif -%}"
    "{{ \"" + TOOLS_HEAD + "\" }}"
    "{%- for tool in tools -%}{{ '\\n' }}{{ tool | tojson }}{%- endfor -%}"
    "{{ \"" + TOOLS_TAIL + "\" }}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if tools and loop.first and message.role == 'system' -%}"
    "{%- elif message.role == 'assistant' and message.tool_calls -%}"
    "{{ '<|im_start|>assistant\\n' + render(message.content) }}"
    "{%- for tool_call in message.tool_calls -%}"
    "{%- if (loop.first and message.content) or not loop.first -%}{{ '\\n' }}{%- endif -%}"
    "{%- if tool_call.function -%}{%- set tool_call = tool_call.function -%}{%- endif -%}"
    "{{ '<tool_call>\\n{\"name\": \"' + tool_call.name + '\", \"arguments\": ' }}"
    "{%- if tool_call.arguments is string -%}{{ tool_call.arguments }}"
    "{%- else -%}{{ tool_call.arguments | tojson }}{%- endif -%}"
    "{{ '}\\n</tool_call>' }}"
    "{%- endfor -%}"
    "{{ '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{ '<|im_start|>user' }}{%- endif -%}"
    "{{ '\\n<tool_response>\\n' + render(message.content) + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{ '<|im_end|>\\n' }}{%- endif -%}"
    "{%- else -%}"
    "{{ '<|im_start|>' + message.role + '\\n' + render(message.content) + '<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}")
VOCAB = 512


def build_tokenizer() -> Tokenizer:
    """Byte-level BPE of under 400 ids, then the special tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=390, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    tok.add_special_tokens(SPECIALS)
    tok.add_tokens(ROLES)
    assert tok.get_vocab_size() <= VOCAB - 8
    return tok


def ids(tok: Tokenizer) -> dict[str, int]:
    return {s: tok.token_to_id(s) for s in SPECIALS + ROLES}


def asr_model(tok: Tokenizer, seed: int = 0):
    from transformers.models.qwen3_asr.configuration_qwen3_asr import Qwen3ASRConfig
    from transformers.models.qwen3_asr.modeling_qwen3_asr import Qwen3ASRForConditionalGeneration

    s = ids(tok)
    torch.manual_seed(seed)
    cfg = Qwen3ASRConfig(
        audio_config=dict(model_type="qwen3_asr_encoder", num_mel_bins=128, d_model=64, encoder_layers=2,
                          encoder_attention_heads=4, encoder_ffn_dim=128, output_dim=64, downsample_hidden_size=16),
        text_config=dict(model_type="qwen3", vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128,
                         tie_word_embeddings=True),
        audio_token_id=s["<|audio_pad|>"], pad_token_id=s["<|endoftext|>"],
        eos_token_id=[s["<|im_end|>"], s["<|endoftext|>"]])
    return Qwen3ASRForConditionalGeneration(cfg).eval()


def omni_model(tok: Tokenizer, seed: int = 0, speech: bool = False):
    """The thinker alone, or with speech: a talker (code predictor) and Code2Wav whose codec vocabulary is
    its codebook plus 1024 special ids, as the real one (HF's generate suppresses the top 1024 ids)."""
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeConfig
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeForConditionalGeneration

    s = ids(tok)
    torch.manual_seed(seed)
    text = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
                norm_topk_prob=True, max_position_embeddings=4096,
                rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": [4, 2, 2],
                                 "interleaved": True})
    audio = dict(num_mel_bins=128, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=128, d_model=64,
                 output_dim=64, downsample_hidden_size=16)
    vision = dict(depth=3, hidden_size=32, intermediate_size=64, num_heads=4, out_hidden_size=64,
                  deepstack_visual_indexes=[0, 1], num_position_embeddings=64, patch_size=16)
    thinker = dict(text_config=text, audio_config=audio, vision_config=vision, audio_token_id=s["<|audio_pad|>"],
                   image_token_id=s["<|image_pad|>"], video_token_id=s["<|video_pad|>"],
                   audio_start_token_id=s["<|audio_start|>"], vision_start_token_id=s["<|vision_start|>"],
                   position_id_per_seconds=13)
    if not speech:
        cfg = Qwen3OmniMoeConfig(thinker_config=thinker, enable_audio_output=False)
        return Qwen3OmniMoeForConditionalGeneration(cfg).eval()
    book, groups = 64, 4
    codec = dict(codec_pad_id=book + 996, codec_bos_id=book + 997, codec_eos_token_id=book + 998,
                 codec_nothink_id=book + 999, codec_think_bos_id=book + 1000, codec_think_eos_id=book + 1001,
                 speaker_id={"chelsie": book + 1010, "ethan": book + 1011, "aiden": book + 1012})
    talker_text = dict(vocab_size=book + 1024, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, moe_intermediate_size=16,
                       num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, shared_expert_intermediate_size=32,
                       rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": [4, 2, 2],
                                        "interleaved": True})
    predictor = dict(vocab_size=book, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16, num_code_groups=groups,
                     rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0})
    talker = dict(text_config=talker_text, code_predictor_config=predictor, num_code_groups=groups,
                  thinker_hidden_size=64, accept_hidden_layer=2, spatial_merge_size=2,
                  audio_token_id=s["<|audio_pad|>"], image_token_id=s["<|image_pad|>"],
                  video_token_id=s["<|video_pad|>"], audio_start_token_id=s["<|audio_start|>"],
                  vision_start_token_id=s["<|vision_start|>"], position_id_per_seconds=13, **codec)
    code2wav = dict(codebook_size=book, num_quantizers=groups, hidden_size=32, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=4, intermediate_size=64, sliding_window=8,
                    upsampling_ratios=[2, 2], upsample_rates=[2, 2, 2, 2], decoder_dim=64)
    cfg = Qwen3OmniMoeConfig(thinker_config=thinker, talker_config=talker, code2wav_config=code2wav,
                             enable_audio_output=True, im_start_token_id=s["<|im_start|>"],
                             im_end_token_id=s["<|im_end|>"], tts_pad_token_id=s["<tts_pad>"],
                             tts_bos_token_id=s["<tts_text_bos>"], tts_eos_token_id=s["<tts_text_eod>"],
                             system_token_id=s["system"], user_token_id=s["user"], assistant_token_id=s["assistant"])
    return Qwen3OmniMoeForConditionalGeneration(cfg).eval()


def qwen3_5_model(tok: Tokenizer, seed: int = 0):
    """Qwen3.5 with its vision tower: 8 decoder layers (Gated DeltaNet, 3 to 1 with gated attention)."""
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5Config
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForConditionalGeneration

    s = ids(tok)
    torch.manual_seed(seed)
    text = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=8, full_attention_interval=4,
                num_attention_heads=4, num_key_value_heads=2, head_dim=64, linear_num_key_heads=2,
                linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32, linear_conv_kernel_dim=4,
                rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                                 "mrope_section": [4, 2, 2], "mrope_interleaved": True})
    vision = dict(depth=2, hidden_size=32, num_heads=4, intermediate_size=48, out_hidden_size=64,
                  num_position_embeddings=64)
    cfg = Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=False,
                        image_token_id=s["<|image_pad|>"], video_token_id=s["<|video_pad|>"],
                        vision_start_token_id=s["<|vision_start|>"], vision_end_token_id=s["<|vision_end|>"])
    return Qwen3_5ForConditionalGeneration(cfg).eval()


def save(model, tok: Tokenizer, path: str | Path) -> Path:
    """save_pretrained, tokenizer.json, the chat template and a generation config with our end ids."""
    path = Path(path)
    model.save_pretrained(path)
    tok.save(str(path / "tokenizer.json"))
    (path / "chat_template.jinja").write_text(TEMPLATE)
    s = ids(tok)
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}))
    # pixel bounds the tiny plans hold: a video frame slice within the vision attention's 128-patch segment; the
    # patch layout of the towers (16-pixel patches, 2 frames, 2 x 2 merged), as the real checkpoints state it for
    # HF's processors
    grid = {"patch_size": 16, "temporal_patch_size": 2, "merge_size": 2}
    (path / "preprocessor_config.json").write_text(json.dumps({"min_pixels": 32 * 32, "max_pixels": 128 * 256} | grid))
    (path / "video_preprocessor_config.json").write_text(json.dumps({"min_pixels": 32 * 32, "max_pixels": 96 * 128}
                                                                    | grid))
    # a 2 s tone to send it (examples/requests_tiny_asr.jsonl reads ckpt/tiny_asr/sample.wav)
    import numpy as np
    import soundfile as sf

    t = np.arange(32000) / 16000
    sf.write(path / "sample.wav", (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), 16000)
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [s["<|im_end|>"], s["<|endoftext|>"]]}))
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kind", choices=["asr", "omni", "omni-speech", "qwen3_5"])
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    tok = build_tokenizer()
    model = (asr_model(tok, a.seed) if a.kind == "asr" else qwen3_5_model(tok, a.seed) if a.kind == "qwen3_5"
             else omni_model(tok, a.seed, speech=a.kind == "omni-speech"))
    print(save(model, tok, a.out))


if __name__ == "__main__":
    main()
