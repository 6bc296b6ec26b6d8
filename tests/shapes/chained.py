"""A model of a shape graphc's own models do not have: two chained autoregressive stages with no media,
then a decoder of codes into audio. Written against graphc's public API only (graphc, resources'
PagedKVSpec), to show that the engine serves a new shape without a change to graphc.

  writer   the LLM stage: token ids -> logits of the sampled rows, and every row's final hidden state
           (rotary positions, pre-norm attention through its paged KV role, a GELU MLP)
  speaker  the follow stage: rows of embeddings (the writer's hidden prompt rows, then one row per frame)
           -> G codes a frame (greedy argmax of G heads) and the next frame's input row (the codes'
           embeddings, projected, plus the projected writer embedding of the text token the frame speaks);
           learned positions, pre-norm attention through its own paged KV role
  decoder  the chunk stage: codes [frames, G] -> wav [frames * U], frame by frame (no attention), so a
           chunk's audio does not depend on how the frames are chunked

Speech is greedy only. The speaker's prompt is the writer's final hidden state of every prompt row; frame
k speaks the writer's k-th generated token (the pad id once the text is done and k is past it). A frame
whose first code is END ends the speech.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

import graphc as gc
from resources import PagedKVSpec


class ChainedConfig(gc.Strict):
    vocab: int = Field(ge=2)            # the writer's token ids
    hidden: int = Field(ge=2)           # D: the writer's and the speaker's width (D2 = D)
    writer_layers: int = Field(ge=1)
    writer_heads: int = Field(ge=1)
    writer_kv_heads: int = Field(ge=1)
    writer_head_dim: int = Field(ge=2)
    speaker_layers: int = Field(ge=1)
    speaker_heads: int = Field(ge=1)
    speaker_kv_heads: int = Field(ge=1)
    speaker_head_dim: int = Field(ge=2)
    ffn: int = Field(ge=1)
    groups: int = Field(ge=1)           # G codes a frame
    codebook: int = Field(ge=2)         # C ids per code group
    end_code: int = Field(ge=0)         # a frame whose first code is this ends the speech
    pad_id: int = Field(ge=0)           # the token a frame past the text speaks
    upsample: int = Field(ge=1)         # U audio samples a frame
    decoder_width: int = Field(ge=1)
    max_seq_len: int = Field(ge=1)      # of each stage (the speaker's learned positions cover it)
    rope_theta: float = 10000.0
    eps: float = 1e-6


TINY = dict(
    config=ChainedConfig(vocab=128, hidden=64, writer_layers=2, writer_heads=4, writer_kv_heads=2, writer_head_dim=16,
                         speaker_layers=2, speaker_heads=2, speaker_kv_heads=1, speaker_head_dim=32, ffn=128, groups=3,
                         codebook=32, end_code=5, pad_id=127, upsample=8, decoder_width=32, max_seq_len=128),
    page_size=8, writer_pages=96, speaker_pages=64, prefill_tokens=32, prefill_seqs=4, decode_seqs=8,
    speaker_tokens=32, speaker_seqs=4, slots=2, slot_frames=4, sample_rate=8000,
)
PRESETS = {"tiny": TINY}
FIRST_CHUNK = 2         # frames of a request's first audio chunk by default (later chunks: a whole slot)


# ---- the nodes, in plain torch
class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(dim)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, 1, head_dim / 2] of 1-D positions [T]."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim)
    angles = positions.float()[:, None] * inv[None, :]
    return angles.cos()[:, None, :], angles.sin()[:, None, :]


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary on x [T, H, Dh] (halves rotated)."""
    a, b = x.chunk(2, dim=-1)
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


class Block(nn.Module):
    """Pre-norm attention (through a paged KV backend, `kv(layer, q, k, v)`) then a pre-norm GELU MLP."""

    def __init__(self, dim: int, heads: int, kv_heads: int, head_dim: int, ffn: int, eps: float, layer: int):
        super().__init__()
        self.layer, self.h, self.kvh, self.d = layer, heads, kv_heads, head_dim
        self.attn_norm = RMSNorm(dim, eps)
        self.q = nn.Linear(dim, heads * head_dim, bias=False)
        self.k = nn.Linear(dim, kv_heads * head_dim, bias=False)
        self.v = nn.Linear(dim, kv_heads * head_dim, bias=False)
        self.o = nn.Linear(heads * head_dim, dim, bias=False)
        self.mlp_norm = RMSNorm(dim, eps)
        self.up = nn.Linear(dim, ffn, bias=False)
        self.down = nn.Linear(ffn, dim, bias=False)

    def forward(self, x: torch.Tensor, kv, rope: tuple | None) -> torch.Tensor:
        t = x.shape[0]
        h = self.attn_norm(x)
        q = self.q(h).view(t, self.h, self.d)
        k = self.k(h).view(t, self.kvh, self.d)
        v = self.v(h).view(t, self.kvh, self.d)
        if rope is not None:
            q, k = rotate(q, *rope), rotate(k, *rope)
        x = x + self.o(kv(self.layer, q, k, v).reshape(t, self.h * self.d))
        return x + self.down(F.gelu(self.up(self.mlp_norm(x))))


class Writer(gc.NodeModule):
    """The LLM node. Inputs token_ids [T], positions [T], sample_rows [S]; outputs logits [S, V] (fp32) and
    hidden [T, D], every row's final (normed) hidden state."""

    ROLES = {"kv": "paged_kv"}

    def __init__(self, cfg: ChainedConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden)
        self.blocks = nn.ModuleList(Block(cfg.hidden, cfg.writer_heads, cfg.writer_kv_heads, cfg.writer_head_dim,
                                          cfg.ffn, cfg.eps, i) for i in range(cfg.writer_layers))
        self.norm = RMSNorm(cfg.hidden, cfg.eps)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)

    def forward(self, ctx: gc.StepContext, token_ids: torch.Tensor, positions: torch.Tensor,
                sample_rows: torch.Tensor) -> dict[str, torch.Tensor]:
        kv = ctx["kv"]
        x = self.embed(token_ids)
        rope = rotary(positions, self.cfg.writer_head_dim, self.cfg.rope_theta)
        for block in self.blocks:
            x = block(x, kv, rope)
        x = self.norm(x)
        return {"logits": self.lm_head(x.index_select(0, sample_rows)).float(), "hidden": x}


class Speaker(gc.NodeModule):
    """The follow node. Inputs embeds [T, D], positions [T], sample_rows [S], trailing [S, D] (the writer's
    embedding of the token each sampled frame speaks); outputs codes [S, G] (greedy) and next_embeds [S, D]
    (the next row: the codes' embeddings summed and projected, plus the projected trailing)."""

    ROLES = {"kv": "paged_kv"}

    def __init__(self, cfg: ChainedConfig):
        super().__init__()
        self.cfg = cfg
        self.pos = nn.Embedding(cfg.max_seq_len, cfg.hidden)
        self.blocks = nn.ModuleList(Block(cfg.hidden, cfg.speaker_heads, cfg.speaker_kv_heads, cfg.speaker_head_dim,
                                          cfg.ffn, cfg.eps, i) for i in range(cfg.speaker_layers))
        self.norm = RMSNorm(cfg.hidden, cfg.eps)
        self.heads = nn.Linear(cfg.hidden, cfg.groups * cfg.codebook, bias=False)
        self.code_embed = nn.Embedding(cfg.groups * cfg.codebook, cfg.hidden)
        self.code_proj = nn.Linear(cfg.hidden, cfg.hidden, bias=False)
        self.trailing_proj = nn.Linear(cfg.hidden, cfg.hidden, bias=False)
        self.register_buffer("offsets", torch.arange(cfg.groups) * cfg.codebook, persistent=False)

    def forward(self, ctx: gc.StepContext, embeds: torch.Tensor, positions: torch.Tensor, sample_rows: torch.Tensor,
                trailing: torch.Tensor) -> dict[str, torch.Tensor]:
        kv = ctx["kv"]
        x = embeds + self.pos(positions)
        for block in self.blocks:
            x = block(x, kv, None)
        x = self.norm(x.index_select(0, sample_rows))
        codes = self.heads(x).view(x.shape[0], self.cfg.groups, self.cfg.codebook).argmax(-1)
        summed = self.code_embed(codes + self.offsets).sum(1)
        return {"codes": codes, "next_embeds": self.code_proj(summed) + self.trailing_proj(trailing)}


class Decoder(gc.NodeModule):
    """The chunk node: codes [F, G] -> wav [F * U], each frame on its own (embeddings summed, normed, a
    linear to U samples, tanh)."""

    def __init__(self, cfg: ChainedConfig):
        super().__init__()
        self.cfg = cfg
        self.code_embed = nn.Embedding(cfg.groups * cfg.codebook, cfg.decoder_width)
        self.norm = RMSNorm(cfg.decoder_width, cfg.eps)
        self.out = nn.Linear(cfg.decoder_width, cfg.upsample, bias=False)
        self.register_buffer("offsets", torch.arange(cfg.groups) * cfg.codebook, persistent=False)

    def forward(self, ctx: gc.StepContext, codes: torch.Tensor) -> dict[str, torch.Tensor]:
        x = self.norm(self.code_embed(codes + self.offsets).sum(1))
        return {"wav": torch.tanh(self.out(x)).reshape(-1)}


# ---- the declaration
def nodes(c: ChainedConfig) -> list[gc.Node]:
    d, g = c.hidden, c.groups
    port = gc.Port
    return [
        gc.Node(name="writer", module=Writer, config=c, dtype="float32", resources={"kv": "writer_kv"},
                inputs={"token_ids": port(shape=("tokens",), dtype="int64"),
                        "positions": port(shape=("tokens",), dtype="int64"),
                        "sample_rows": port(shape=("seqs",), dtype="int64")},
                outputs={"logits": port(shape=("seqs", c.vocab), dtype="float32"),
                         "hidden": port(shape=("tokens", d), dtype="float32")}),
        gc.Node(name="speaker", module=Speaker, config=c, dtype="float32", resources={"kv": "speaker_kv"},
                inputs={"embeds": port(shape=("tokens", d), dtype="float32"),
                        "positions": port(shape=("tokens",), dtype="int64"),
                        "sample_rows": port(shape=("seqs",), dtype="int64"),
                        "trailing": port(shape=("seqs", d), dtype="float32")},
                outputs={"codes": port(shape=("seqs", g), dtype="int64"),
                         "next_embeds": port(shape=("seqs", d), dtype="float32")}),
        gc.Node(name="decoder", module=Decoder, config=c, dtype="float32",
                inputs={"codes": port(shape=("frames", g), dtype="int64")},
                outputs={"wav": port(shape=(f"frames*{c.upsample}",), dtype="float32")}),
    ]


def kv_spec(name: str, c: ChainedConfig, p: dict, layers: int, heads: int, kv_heads: int, head_dim: int,
            pages: int) -> PagedKVSpec:
    return PagedKVSpec(name=name, num_layers=layers, num_qo_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                       page_size=p["page_size"], max_seq_len=c.max_seq_len, pages=pages, dtype="float32")


def walks(p: dict) -> list[gc.Walk]:
    return [
        gc.Walk(name="writer_prefill", kind="prefill", path=("writer",),
                budget=gc.Budget(tokens=p["prefill_tokens"], seqs=p["prefill_seqs"])),
        gc.Walk(name="writer_decode", kind="decode", path=("writer",), budget=gc.Budget(seqs=p["decode_seqs"])),
        gc.Walk(name="speaker_prefill", kind="prefill", path=("speaker",),
                budget=gc.Budget(tokens=p["speaker_tokens"], seqs=p["speaker_seqs"])),
        gc.Walk(name="speaker_decode", kind="decode", path=("speaker",), budget=gc.Budget(seqs=p["speaker_seqs"])),
        gc.Walk(name="decoder_chunk", kind="chunk", path=("decoder",),
                budget=gc.Budget(frames=p["slots"] * p["slot_frames"], seqs=p["slots"])),
    ]


def pipeline(p: dict) -> gc.Pipeline:
    return gc.Pipeline(stages=(
        gc.LLMStage(name="write", node="writer", decode="writer_decode", prefill=("writer_prefill",)),
        gc.FollowStage(name="speak", node="speaker", after="write", reads="hidden", prefill="speaker_prefill",
                       decode="speaker_decode"),
        gc.ChunkStage(name="sound", node="decoder", after="speak", walks=("decoder_chunk",),
                      slot_frames=p["slot_frames"], sample_rate=p["sample_rate"]),
    ))


def declare(preset: str = "tiny") -> gc.Model:
    if preset not in PRESETS:
        raise ValueError(f"unknown preset '{preset}'; presets: {', '.join(PRESETS)}")
    p = PRESETS[preset]
    c = p["config"]
    return gc.Model(
        name=f"chained-{preset}",
        nodes=nodes(c),
        resources=[
            kv_spec("writer_kv", c, p, c.writer_layers, c.writer_heads, c.writer_kv_heads, c.writer_head_dim,
                    p["writer_pages"]),
            kv_spec("speaker_kv", c, p, c.speaker_layers, c.speaker_heads, c.speaker_kv_heads, c.speaker_head_dim,
                    p["speaker_pages"]),
        ],
        walks=walks(p),
        requests=[gc.RequestKind(name="t2t", stages=("writer_prefill", "writer_decode")),
                  gc.RequestKind(name="t2s", stages=("writer_prefill", ("writer_decode", "speaker_prefill",
                                                                        "speaker_decode", "decoder_chunk")))],
        pipeline=pipeline(p),
    )


# ---- the host
class FrameSlot:
    """Frames [start, end) decoded in a slot of their own (no left context: the decoder is frame-local); the
    slot's samples [keep_start, keep_stop) are all new. (A plain class: a model file is imported without a
    sys.modules entry, where @dataclass looks its module up.)"""

    def __init__(self, start: int, end: int, upsample: int):
        self.start, self.end, self.frames = start, end, end - start
        self.keep_start, self.keep_stop = 0, (end - start) * upsample


class ChainedSpeech(gc.Speech):
    """The speaker's prompt rows, the token each frame speaks, its step inputs, and the decoder's slots."""

    voices = {"default": 0}
    default_voice = "default"
    noise_shape = (1,)
    seen_size = 1

    def __init__(self, model: gc.Model):
        self.cfg: ChainedConfig = model.node("writer").config
        self.slot_frames = model.pipeline.chunk.slot_frames
        self.first_chunk = min(FIRST_CHUNK, self.slot_frames)
        self.trailing_pad = self.cfg.pad_id
        self.embedding = None
        self.device = torch.device("cpu")

    def bind(self, modules: dict, device: torch.device) -> None:
        self.embedding, self.device = modules["writer"].embed, device

    def check(self, prompt: gc.Prompt) -> None:
        return None

    def hidden_rows(self, prompt: gc.Prompt) -> list[int]:
        return list(range(len(prompt.ids)))

    def follow_prompt(self, prompt: gc.Prompt, output: list[int], text_done: bool, voice: str,
                      hidden: dict[int, torch.Tensor]) -> gc.FollowPrompt | None:
        n = len(prompt.ids)
        if any(r not in hidden for r in range(n)):
            return None
        rows = torch.stack([hidden[r] for r in range(n)])
        return gc.FollowPrompt(rows=n, positions=torch.arange(n, dtype=torch.int64)[None], delta=0,
                               inputs={"embeds": rows})

    def trailing(self, prompt: gc.Prompt, output: list[int], text_done: bool, frame: int) -> int | None:
        if frame < len(output):
            return output[frame]
        return self.cfg.pad_id if text_done else None

    def embed(self, ids: list[int]) -> torch.Tensor:
        with torch.inference_mode():
            return self.embedding(torch.tensor(ids, dtype=torch.int64, device=self.device))

    def sampling_row(self, sampling: gc.SpeechSampling) -> list[float]:
        """Greedy only (the speaker samples nothing): other parameters are refused when a request is added."""
        if not sampling.greedy or sampling.repetition_penalty != 1.0:
            raise gc.InvalidInput(f"speech sampling {sampling.model_dump()}", "this model's speech is greedy only",
                                  "send speech temperature 0 (the default) and no repetition penalty")
        return [0.0]

    def seen_codes(self, codes: torch.Tensor) -> torch.Tensor:
        return torch.zeros(codes.shape[0], 1, dtype=torch.int64, device=codes.device)

    def follow_inputs(self, parts: list, samples: list[int], trailing: list[torch.Tensor], prefill: bool,
                      sampling: torch.Tensor, noise: torch.Tensor, seen: torch.Tensor) -> dict:
        embeds, positions = [], []
        for part in parts:
            if part[0] == "prompt":
                _, fp, a, b = part
                embeds.append(fp.inputs["embeds"][a:b])
                positions.append(fp.positions_of(a, b)[0])
            else:
                _, row, pos = part
                embeds.append(row[None])
                positions.append(torch.tensor([pos], dtype=torch.int64))
        return {"embeds": torch.cat(embeds), "positions": torch.cat(positions),
                "sample_rows": torch.tensor(samples, dtype=torch.int64), "trailing": torch.stack(trailing)}

    def follow_layouts(self, samples: int) -> dict:
        return {}

    def is_end(self, codes: list[int]) -> bool:
        return codes[0] == self.cfg.end_code

    def chunk_frames(self, index: int, first: int) -> int:
        """`first` frames, then a slot's; never more than a slot holds (the engine has no longer slot)."""
        return min(first, self.slot_frames) if index == 0 else self.slot_frames

    def slot(self, start: int, end: int) -> FrameSlot:
        return FrameSlot(start, end, self.cfg.upsample)

    def chunk_inputs(self, filled: list[tuple[torch.Tensor, FrameSlot]], slots: int,
                     slot_frames: int) -> tuple[dict, dict]:
        codes = torch.zeros(slots * slot_frames, self.cfg.groups, dtype=torch.int64)
        for i, (frames, slot) in enumerate(filled):
            codes[i * slot_frames:i * slot_frames + slot.frames] = frames[:, slot.start:slot.end].T
        return {"codes": codes}, {}


class ChainedHost(gc.Host):
    """Text prompts with 1-D positions; no media, so no encoder step ever runs."""

    eos_token_ids = ()

    def __init__(self, model: gc.Model):
        self.speech = ChainedSpeech(model)

    def prompt(self, ids: list[int], media: list[gc.Media]) -> gc.Prompt:
        if media:
            raise gc.InvalidInput(f"this model takes no media ({len(media)} item(s) given)",
                                  "it has no encoder stage", "send text token ids only")
        return gc.Prompt(ids=list(ids), positions=torch.arange(len(ids), dtype=torch.int64)[None], delta=0)

    def encode(self, node: str, pieces: list[gc.Piece], units: int) -> gc.EncodeBatch:
        raise gc.InvalidInput(f"this model has no encoder, yet node {node} was asked to encode", "", "")


def host(model: gc.Model, checkpoint: str | None = None) -> ChainedHost:
    """The serving host (graphc.Host): seeded weights only (no checkpoint format is defined for this shape)."""
    return ChainedHost(model)
