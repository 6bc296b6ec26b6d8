"""Qwen3-Omni's speech on the host: the talker's prompt rows, the text it speaks next, its step inputs,
and Code2Wav's streamed chunks: graphc's Speech contract (graphc/serving.py) for the pipeline's follow
stage (the talker) and chunk stage (Code2Wav).

The talker prompt is HF's Qwen3OmniMoeForConditionalGeneration.generate's, built as the thinker goes:
  user rows     every row whose latest <|im_start|> is followed by the user token: multimodal rows
                (audio/image/video ids) take hidden_projection(the thinker's layer-accept_hidden_layer
                hidden), text rows text_projection(the thinker's embedding of the id)
  assistant     from the last <|im_start|>assistant: its first 3 rows, 4 x tts_pad, tts_bos, its 4th
                row (the first generated token), each text-projected, plus the codec embeddings of
                [nothink, think_bos, think_eos, speaker, codec_pad, codec_bos] on the last 6 of those 9
The text spoken next at frame k (trailing_text) is assistant row 4 + k; the thinker's last token (its
end of turn, or the token that hit max_tokens) is never spoken: tts_eos takes its place, then tts_pad.
HF builds all of this after the thinker finished; here the talker starts as soon as the rows it needs
exist (the first generated tokens, and whether the next one is the last), so text and speech overlap.
Positions: mrope.rope_index over the talker's ids (the user rows' ids, then 9 x tts_pad) with the
request's media grids, 1-D without media; decode rows continue at index + delta.
Sampling defaults are HF's (transformers 5.24): Qwen3OmniMoeForConditionalGeneration.generate's talker_*
arguments for code 0 (do_sample True, temperature 0.9, top_k 50, top_p 1.0, repetition_penalty 1.05 over
the generated code-0 ids: the talker generates from inputs_embeds, so its input_ids hold those only), and
for the residual codes what the talker's prepare_inputs_for_generation passes its code predictor (top_k
50, top_p 0.8, do_sample the talker's) over the code predictor's generation config, which sets no
temperature: GenerationConfig's global default, 1.0.
"""
from __future__ import annotations

import torch

from graphc import FollowPrompt, InvalidInput, Model, Prompt, Speech, SpeechSampling
from models.components import code2wav as c2w
from models.components.mrope import MediaTokens, rope_index
from models.components.talker import sampling_row

# HF's talker defaults (the module docstring says where they come from)
TALKER_SAMPLING = SpeechSampling(temperature=0.9, top_k=50, top_p=1.0, repetition_penalty=1.05)
RESIDUAL_SAMPLING = dict(residual_temperature=1.0, residual_top_k=50, residual_top_p=0.8)

# Qwen/Qwen3-Omni-30B-A3B-Instruct's ids (config.json, the fact sheet's sections 1d and 1g)
REAL_IDS = dict(im_start_token_id=151644, user_token_id=872, assistant_token_id=77091, tts_pad_token_id=151671,
                tts_bos_token_id=151672, tts_eos_token_id=151673, codec_nothink_id=2155, codec_think_bos_id=2156,
                codec_think_eos_id=2157, codec_pad_id=2148, codec_bos_id=2149,
                speaker_id={"chelsie": 2301, "ethan": 2302, "aiden": 2303})
TOP = ("im_start_token_id", "user_token_id", "assistant_token_id", "tts_pad_token_id", "tts_bos_token_id",
       "tts_eos_token_id")
TALKER = ("codec_nothink_id", "codec_think_bos_id", "codec_think_eos_id", "codec_pad_id", "codec_bos_id", "speaker_id")


def speech_ids(config: dict | None, vocab: int) -> dict:
    """The ids speech reads: from a checkpoint's config.json (top level and talker_config), else the real
    model's when its thinker vocabulary holds them, else ids at the top of a small vocabulary (seeded
    weights of a tiny preset: the talker's special codec ids then sit just above its codebook)."""
    if config is not None:
        talker = config.get("talker_config", {})
        missing = [k for k in TOP if config.get(k) is None] + [k for k in TALKER if talker.get(k) is None]
        if missing:
            raise InvalidInput(f"config.json lacks what speech needs: {', '.join(missing)}",
                               "Qwen3-Omni's talker prompt reads these ids", "use the checkpoint's own config.json")
        return {**{k: config[k] for k in TOP}, **{k: talker[k] for k in TALKER}}
    if vocab > REAL_IDS["tts_eos_token_id"]:
        return dict(REAL_IDS)
    return {**dict(zip(TOP, range(vocab - 16, vocab - 10))), "codec_nothink_id": -1}


class QwenOmniSpeech(Speech):
    sampling = TALKER_SAMPLING
    residual_sampling = RESIDUAL_SAMPLING

    def __init__(self, model: Model, media: MediaTokens, ids: dict, talker: str = "talker", vocoder: str = "code2wav",
                 thinker: str = "thinker", first_chunk: int = 2):
        self.model, self.media, self.ids = model, media, ids
        self.thinker = thinker
        self.tcfg = model.node(talker).config
        self.vcfg: c2w.Code2WavConfig = model.node(vocoder).config
        if ids.get("codec_nothink_id", 0) < 0:            # seeded tiny weights: special codec ids above the codebook
            base = self.tcfg.code_predictor_config.vocab_size
            names = ("codec_pad_id", "codec_bos_id", "codec_nothink_id", "codec_think_bos_id", "codec_think_eos_id")
            free = [i for i in range(base, self.tcfg.text_config.vocab_size) if i != self.tcfg.codec_eos_token_id]
            if len(free) < 8:
                raise InvalidInput("the talker's codec vocabulary has no room for its special ids", "", "")
            ids = {**ids, **dict(zip(names, free)), "speaker_id": {"chelsie": free[5], "ethan": free[6], "aiden": free[7]}}
            self.ids = ids
        self.voices = {k.lower(): int(v) for k, v in ids["speaker_id"].items()}
        self.default_voice = "ethan" if "ethan" in self.voices else sorted(self.voices)[0]
        self.first_chunk = first_chunk
        self.groups = self.tcfg.num_code_groups
        self.noise_shape = (self.groups, self.tcfg.text_config.vocab_size)
        self.seen_size = self.tcfg.text_config.vocab_size
        self.mm = {media.audio_token_id, media.image_token_id, media.video_token_id}
        self.embedding = None

    # ---- what the thinker gives
    def bind(self, modules: dict, device: torch.device) -> None:
        """The thinker's token embedding table (its 'embeds' for text rows are exactly these rows)."""
        self.embedding = modules[self.thinker].model.embed_tokens
        self.device = device

    def embed(self, ids: list[int]) -> torch.Tensor:
        """The rows of `ids`, looked up on the device: the ids go there by an async copy (a blocking copy would
        wait for the steps in flight, each talker step's build)."""
        with torch.inference_mode():
            return self.embedding(torch.tensor(ids, dtype=torch.int64).to(self.device, non_blocking=True))

    def _user_rows(self, ids: list[int]) -> list[int]:
        """HF's rule: rows whose most recent <|im_start|> (or row 0) is followed by the user token."""
        out, prev = [], 0
        for i, t in enumerate(ids):
            if t == self.ids["im_start_token_id"]:
                prev = i
            if ids[min(prev + 1, len(ids) - 1)] == self.ids["user_token_id"]:
                out.append(i)
        return out

    def hidden_rows(self, prompt: Prompt) -> list[int]:
        return [i for i in self._user_rows(prompt.ids) if prompt.ids[i] in self.mm]

    def _assistant(self, prompt: Prompt) -> int:
        """The last <|im_start|>assistant row (kept in the prompt's host_data)."""
        if "assistant" in prompt.host_data:
            return prompt.host_data["assistant"]
        ids = prompt.ids
        start, asst = self.ids["im_start_token_id"], self.ids["assistant_token_id"]
        found = [i for i in range(len(ids) - 1) if ids[i] == start and ids[i + 1] == asst]
        if not found:
            raise InvalidInput("the prompt has no assistant turn to speak", "speech starts at the last "
                               "<|im_start|>assistant", "send messages (the chat template adds it) or end the "
                               "prompt with <|im_start|>assistant")
        prompt.host_data["assistant"] = found[-1]
        return found[-1]

    def check(self, prompt: Prompt) -> None:
        self._assistant(prompt)

    # ---- the talker's rows
    def follow_prompt(self, prompt: Prompt, output: list[int], finished: bool, voice: str,
                      hidden: dict[int, torch.Tensor]) -> FollowPrompt | None:
        ids = prompt.ids
        seq = ids[self._assistant(prompt):] + output            # the assistant rows, prompt part then generated
        if finished and len(seq) < 5:                        # row 3 is the last (never spoken): nothing to say
            return FollowPrompt.silent(3)                # the talker's M-RoPE rows: t, h, w
        if not finished and len(seq) < 6:                   # frame 0 speaks row 4: is it the last?
            return None
        user = self._user_rows(ids)
        i = self.ids
        special = self.embed([i["tts_pad_token_id"], i["tts_bos_token_id"]])
        text_ids = [ids[r] for r in user]
        embeds = self.embed(text_ids + seq[:4])
        n = len(user)
        rows = [embeds[:n], embeds[n:n + 3], special[:1].expand(4, -1), special[1:2], embeds[n + 3:n + 4]]
        thinker_embeds = torch.cat(rows)
        thinker_hidden = torch.zeros_like(thinker_embeds)
        kind = torch.ones(n + 9, dtype=torch.int64)
        for k, r in enumerate(user):
            if ids[r] in self.mm:
                thinker_hidden[k] = hidden[r]
                thinker_embeds[k] = 0
                kind[k] = 2
        codec = [-1] * (n + 3) + [i["codec_nothink_id"], i["codec_think_bos_id"], i["codec_think_eos_id"],
                                  self.voices[voice], i["codec_pad_id"], i["codec_bos_id"]]
        talker_ids = text_ids + [i["tts_pad_token_id"]] * 9
        if any(prompt.rope.get(k) for k in ("audio_lengths", "image_grid_thw", "video_grid_thw")):
            positions, delta = rope_index(talker_ids, self.media, **prompt.rope)
        else:
            positions, delta = torch.arange(n + 9, dtype=torch.int64).expand(3, -1), 0
        return FollowPrompt(rows=n + 9, positions=positions, delta=delta,
                            inputs={"codec_ids": torch.tensor(codec, dtype=torch.int64),
                                    "thinker_embeds": thinker_embeds, "thinker_hidden": thinker_hidden,
                                    "prompt_kind": kind})

    def trailing(self, prompt: Prompt, output: list[int], finished: bool, frame: int) -> int | None:
        """The token (its thinker embedding) frame `frame` adds to the talker's next row; None until known."""
        a = self._assistant(prompt)
        seq_len = len(prompt.ids) - a + len(output)
        at = 4 + frame
        if at < seq_len - 1:
            n = len(prompt.ids) - a
            return prompt.ids[a + at] if at < n else output[at - n]
        if not finished:
            return None
        return self.ids["tts_eos_token_id"] if at == seq_len - 1 else self.ids["tts_pad_token_id"]

    @property
    def trailing_pad(self) -> int:
        return self.ids["tts_pad_token_id"]

    # ---- sampling
    def sampling_row(self, s: SpeechSampling) -> list[float]:
        return sampling_row(s.temperature, s.top_k, s.top_p, s.repetition_penalty, **self.residual_sampling)

    @staticmethod
    def seen_codes(codes: torch.Tensor) -> torch.Tensor:
        """codes [n, G] -> [n, 1]: code 0, the one the repetition penalty reads."""
        return codes[:, :1]

    def follow_inputs(self, parts: list, samples: list[int], trailing: list[torch.Tensor], prefill: bool,
                      sampling: torch.Tensor, noise: torch.Tensor, seen: torch.Tensor) -> dict:
        """One talker step's inputs. parts: ("prompt", FollowPrompt, start, end) or ("decode", next_embed [H],
        position); samples: the rows that emit a frame; trailing: each one's next text embedding; sampling,
        noise, seen: each sample row's (the node's ports)."""
        h = self.tcfg.text_config.hidden_size
        th = self.tcfg.thinker_hidden_size
        dev = self.device
        embeds, positions, codec, te, tk, kind = [], [], [], [], [], []
        for p in parts:
            if p[0] == "prompt":
                _, tp, a, b = p
                embeds.append(torch.zeros(b - a, h, device=dev))
                positions.append(tp.positions_of(a, b))
                if prefill:
                    codec.append(tp.inputs["codec_ids"][a:b])
                    te.append(tp.inputs["thinker_embeds"][a:b].float())
                    tk.append(tp.inputs["thinker_hidden"][a:b].float())
                    kind.append(tp.inputs["prompt_kind"][a:b])
            else:
                _, nxt, pos = p
                embeds.append(nxt[None].float())
                positions.append(torch.full((3, 1), pos, dtype=torch.int64))
                if prefill:
                    codec.append(torch.full((1,), -1, dtype=torch.int64))
                    te.append(torch.zeros(1, th, device=dev))
                    tk.append(torch.zeros(1, th, device=dev))
                    kind.append(torch.zeros(1, dtype=torch.int64))
        out = {"embeds": torch.cat(embeds), "positions": torch.cat(positions, dim=1),
               "sample_rows": torch.tensor(samples, dtype=torch.int64),
               "trailing_text": torch.stack(trailing).float(), "sampling": sampling, "noise": noise, "seen": seen}
        if prefill:
            out |= {"codec_ids": torch.cat(codec), "thinker_embeds": torch.cat(te), "thinker_hidden": torch.cat(tk),
                    "prompt_kind": torch.cat(kind)}
        return out

    def follow_layouts(self, samples: int) -> dict:
        from models.components.talker import code_predictor_cu_seqlens

        return {"cp_attn": code_predictor_cu_seqlens(samples, self.groups)}

    def is_end(self, codes: list[int]) -> bool:
        return codes[0] == self.tcfg.codec_eos_token_id

    # ---- Code2Wav
    def chunk_frames(self, index: int, first: int) -> int:
        return c2w.stream_chunk_frames(self.vcfg, index, first)

    def slot(self, start: int, end: int) -> c2w.Slot:
        return c2w.stream_slot(self.vcfg, start, end)

    def chunk_inputs(self, filled: list[tuple[torch.Tensor, c2w.Slot]], slots: int,
                       slot_frames: int) -> tuple[dict, dict]:
        return c2w.pack_slots(self.vcfg, filled, slots, slot_frames), {"attn": c2w.cu_seqlens(slot_frames, slots)}
