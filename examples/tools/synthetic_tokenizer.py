"""Write a tokenizer folder for a plan's model: its special and media tokens at the ids the plan's model serves,
so that seeded weights (graphc run --random-weights) serve text, chat, realtime sessions and media prompts.

    python examples/tools/synthetic_tokenizer.py plans/qwen3_omni_h200.plan /tmp/tok
    graphc run plans/qwen3_omni_h200.plan --random-weights --tokenizer /tmp/tok --port 8000

OUT_DIR gets tokenizer.json (byte-level BPE) and tokenizer_config.json (eos and pad tokens, and the chat template
examples/make_tiny_checkpoint.TEMPLATE, Qwen's layout in small). Where each id comes from, the first that names it:

1. The model file's host as graphc run --random-weights makes it, host(model, None) on the plan's declaration:
     <|audio_pad|> <|image_pad|> <|video_pad|>   host.token_of: the placeholders of the media its encoders take
     <|audio_start|> <|vision_start|>            host.media (MediaTokens), for audio / for images or videos
     <|audio_end|>                               host.audio_end (with audio); <|vision_end|>: host.vision_end
                                                 where the host has one (Qwen3.5's)
     <|im_end|> <|endoftext|>                    host.eos_token_ids, in generation_config's order (im_end first)
     <|im_start|> user assistant <tts_pad> <tts_text_bos> <tts_text_eod>
                                                 host.speech.ids, a speaking model's (Qwen3-Omni's talker)
   Qwen3-Omni-30B-A3B: endoftext 151643, im_start 151644, im_end 151645, vision_start 151652, image_pad 151655,
   video_pad 151656, audio_start 151669, audio_end 151670, tts_pad/bos/eod 151671-151673, audio_pad 151675,
   user 872, assistant 77091; Qwen3.5: vision_start 248053, vision_end 248054, image_pad 248056, video_pad 248057.
2. Qwen's special-token block (QWEN_BLOCK: each token's offset from <|endoftext|>, as Qwen3-Omni's and Qwen3.5's
   tokenizers lay it out), for tokens the host does not name, where every id the host names sits at its offset
   from one base: Qwen3-Omni's vision_end 151653; Qwen3.5's endoftext 248044, im_start 248045, im_end 248046.
3. Else the highest ids below the LLM's vocabulary that nothing else holds (tiny presets' seeded media ids sit at
   the top of their vocabulary too).
The text body takes ids from 0 up, under every id above; the role words system/user/assistant are one token
each. Every id is below the LLM's vocabulary rows (the plan's declaration).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

from examples.make_tiny_checkpoint import CORPUS, TEMPLATE  # noqa: E402

# Qwen's special tokens, each at its offset from <|endoftext|> (Qwen3-Omni's tokenizer from 151643, Qwen3.5's
# from 248044); the ones left out (box, quad, fim, tool and think tokens) no prompt of graphc's needs
QWEN_BLOCK = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2, "<|vision_start|>": 9, "<|vision_end|>": 10,
              "<|image_pad|>": 12, "<|video_pad|>": 13, "<|audio_start|>": 26, "<|audio_end|>": 27,
              "<tts_pad>": 28, "<tts_text_bos>": 29, "<tts_text_eod>": 30, "<|audio_pad|>": 32}
ROLES = ("system", "user", "assistant")
PLACEHOLDER = {"audio": "<|audio_pad|>", "image": "<|image_pad|>", "video": "<|video_pad|>"}
SPEECH = {"im_start_token_id": "<|im_start|>", "user_token_id": "user", "assistant_token_id": "assistant",
          "tts_pad_token_id": "<tts_pad>", "tts_bos_token_id": "<tts_text_bos>", "tts_eos_token_id": "<tts_text_eod>"}
BODY = 1000          # the most ids the BPE body takes (it takes fewer where the corpus has fewer merges)


def plan_host(plan_path: str):
    """(the host graphc run --random-weights makes for the plan's model, the LLM's vocabulary rows)."""
    from graphc.plan import load_plan
    from graphc.runtime.engine import vocab_rows
    from graphc.source import load_model

    plan = load_plan(plan_path)
    src = load_model(plan.model.file, plan.model.preset, plan.model.config)
    return src.module.host(src.model, None), vocab_rows(plan)


def named_ids(host) -> dict[str, int]:
    """The token strings whose ids the host names (the module docstring's list 1)."""
    out = {PLACEHOLDER[kind]: i for kind, i in host.token_of.items()}
    if "audio" in host.token_of:
        out["<|audio_start|>"] = host.media.audio_start_token_id
        if host.audio_end is not None:
            out["<|audio_end|>"] = host.audio_end
    if {"image", "video"} & set(host.token_of):
        out["<|vision_start|>"] = host.media.vision_start_token_id
        if getattr(host, "vision_end", None) is not None:
            out["<|vision_end|>"] = host.vision_end
    out |= dict(zip(("<|im_end|>", "<|endoftext|>"), host.eos_token_ids))
    if host.speech is not None:
        out |= {text: host.speech.ids[key] for key, text in SPEECH.items()}
    return out


def wanted(named: dict[str, int]) -> list[str]:
    """Every token the folder places: the turn markers and role words, and the media and speech tokens of
    the kinds the host named."""
    out = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *ROLES]
    if "<|audio_pad|>" in named:
        out += ["<|audio_start|>", "<|audio_end|>", "<|audio_pad|>"]
    if {"<|image_pad|>", "<|video_pad|>"} & set(named):
        out += ["<|vision_start|>", "<|vision_end|>"] + [t for t in ("<|image_pad|>", "<|video_pad|>") if t in named]
    if "<tts_pad>" in named:
        out += ["<tts_pad>", "<tts_text_bos>", "<tts_text_eod>"]
    return out


def block_base(named: dict[str, int]) -> int | None:
    """Where <|endoftext|> sits when every named id of QWEN_BLOCK's tokens sits at its offset from it, else None."""
    bases = {i - QWEN_BLOCK[t] for t, i in named.items() if t in QWEN_BLOCK}
    return bases.pop() if len(bases) == 1 else None


def place(named: dict[str, int], vocab: int) -> dict[str, int]:
    """Every wanted token's id: named, else at its QWEN_BLOCK offset, else the highest free id below vocab."""
    ids = dict(named)
    base = block_base(named)
    for t in wanted(named):
        if t not in ids and base is not None and t in QWEN_BLOCK:
            ids[t] = base + QWEN_BLOCK[t]
    free = (i for i in range(vocab - 1, -1, -1) if i not in set(ids.values()))
    for t in wanted(named):
        if t not in ids:
            ids[t] = next(free)
    bad = {t: i for t, i in ids.items() if not 0 <= i < vocab}
    if bad or len(set(ids.values())) != len(ids):
        raise SystemExit(f"the plan's ids do not make a tokenizer: {ids} (vocabulary {vocab}; out of it: {bad})")
    return ids


def body(room: int) -> Tokenizer:
    """Byte-level BPE trained on a small corpus, at most `room` ids."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=min(BODY, room), initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(CORPUS + [__doc__], trainer)
    return tok


def build(ids: dict[str, int]) -> Tokenizer:
    """The BPE body under the lowest placed id, each placed token in its vocabulary at its id (so `tokenizers`
    keeps the id: an added token it does not find there takes the next free one) and in added_tokens."""
    data = json.loads(body(min(ids.values())).to_str())
    vocab = data["model"]["vocab"]
    added = []
    for t, i in sorted(ids.items(), key=lambda kv: kv[1]):
        vocab[t] = i
        added.append({"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                      "normalized": t in ROLES, "special": t not in ROLES})
    data["added_tokens"] = added
    return Tokenizer.from_str(json.dumps(data))


def write(plan_path: str, out: str | Path) -> dict[str, int]:
    """OUT's tokenizer.json and tokenizer_config.json for the plan's model; the placed ids."""
    host, vocab = plan_host(plan_path)
    ids = place(named_ids(host), vocab)
    tok = build(ids)
    for t, i in ids.items():                      # what graphc run will see
        assert tok.token_to_id(t) == i and tok.encode(t, add_special_tokens=False).ids == [i], (t, i)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
              "chat_template": TEMPLATE}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    return ids


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("plan")
    ap.add_argument("out")
    args = ap.parse_args()
    ids = write(args.plan, args.out)
    print(f"{args.out}: " + ", ".join(f"{t} {i}" for t, i in sorted(ids.items(), key=lambda kv: kv[1])))


if __name__ == "__main__":
    main()
