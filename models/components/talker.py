"""Qwen3-Omni's talker and its code predictor as one serving node: one forward emits whole codec frames.

A forward runs the talker's MoE layers (shared expert, M-RoPE, paged role "kv") over packed rows, then
for each sampled row: final norm -> codec_head -> code 0 -> the code predictor's 15 sequential steps ->
codes 1..15, and the next talker input embedding (the 16 code embeddings summed, plus the projected text
the row speaks next). HF runs the code predictor at the start of the *next* talker step; doing it at the
end of this one gives the same frames and keeps prefill and decode to one capturable forward each.

Weight names (minus the node's weight_prefix, 'talker.' in the real checkpoint): model.codec_embedding,
model.layers.N.{input_layernorm, self_attn.*, post_attention_layernorm, mlp.gate, mlp.experts.*,
mlp.shared_expert.{gate,up,down}_proj, mlp.shared_expert_gate}, model.norm, codec_head,
{text,hidden}_projection.linear_fc{1,2}, code_predictor.model.{layers.N.*, norm, codec_embedding.{0..14}},
code_predictor.lm_head.{0..14}.

Talker input rows are additive, so prompt and decode rows mix in one step:
  row = embeds + [codec_embedding(codec_ids) if >= 0] + [text_projection(thinker_embeds) if prompt_kind 1,
        hidden_projection(thinker_hidden) if prompt_kind 2]
Decode rows feed the previous step's next_embeds as embeds and leave the optional 'prompt' group out; a
step that feeds the group runs both projections on all its rows (static shapes).
Prompt rows, as HF's Qwen3OmniMoeForConditionalGeneration.generate builds them (thinker rows of the
sequence; thinker_embeds of a text row is its token's thinker embedding, thinker_hidden the thinker's
'hidden' output at layer accept_hidden_layer):
  user turns:   multimodal rows kind 2, text rows kind 1 (codec_ids -1);
  assistant:    its first 3 tokens kind 1; 4 rows of tts_pad then 1 of tts_bos (kind 1 with the thinker
                embedding of those ids); the first generated text token (kind 1); codec_ids on the last 6 of
                those 9 rows: nothink, think_bos, think_eos, speaker, codec_pad, codec_bos.
trailing_text [S, Ht]: for each sampled row, the thinker embedding of the text it speaks next (generated
token k+1 at frame k, then tts_eos, then tts_pad). Positions: mrope.rope_index over the talker's ids (the
user turns' thinker ids, then tts_pad for the 9 assistant rows) with the talker's media ids when the
request has media, else 1-D; decode rows continue at index + delta.

Selection (`select`), per sampled row by its own `sampling` row, in HF generate's processor order: code 0
from the codec_head logits: repetition penalty over the code-0 ids the request generated before (`seen`),
then suppression (code 0 is restricted to the codebook, ids < code predictor vocab_size, plus codec_eos:
for the real config, 3072 ids and codebook 2048, HF's suppress_tokens), then temperature, top-k, top-p;
the 15 residual codes from the code predictor's heads: temperature, top-k, top-p (no penalty). A row of
temperature 0 is greedy: the argmax of the penalised, suppressed logits (of the raw logits for residual
codes), exactly what HF's do_sample=False picks. A sampling row draws by an exponential race on its
`noise` (E ~ Exp(1), drawn by the caller): argmax of p / E, taken as the argmax of x - log E over the
processed logits x, which is exactly a draw from p. Every op has a static shape and none reads a value
on the host (per-row top-k through a sort and a gathered threshold, top-p through the sorted cumulative
softmax), so sampling runs inside the captured step. The caller (graphc/runtime/speech.py) keeps each
request's `seen` and its noise generator; zero rows (a captured rung's padding) are greedy, filters off.

The code predictor's short cache lives inside the forward: per layer, G = num_code_groups slots per
sampled row for q, k and v. Its attention goes through role "cp_attn" (a causal ragged_attention with
max_segment >= G) bound with cu_seqlens = cu_seqlens_k = [0, G, 2G, ..., S*G] (`code_predictor_cu_seqlens`):
every step attends all S*G slots in that one fixed layout; under the causal mask the real query at slot p
sees exactly keys 0..p, and the other slots' outputs are discarded. One binding serves all 15 steps.
"""
from __future__ import annotations

from functools import partial

import torch
from torch import nn

from graphc import NodeModule, StepContext
from models.components.layers import Linear, RMSNorm, SwiGLU, rope_cos_sin, rope_inv_freq
from models.components.talker_config import SAMPLING, TALKER_30B_A3B, CodePredictorConfig, TalkerConfig, \
    TalkerTextConfig, code_predictor_cu_seqlens, sampling_row, talker_ports  # noqa: F401
from models.components.thinker import Attend, Attention, FoldedLayer, MRope, moe_layer, next_norm


class RowParams:
    """A step's per-row sampling parameters, prepared once for every select that shares them (the 15
    residual codes share theirs). params [S, 3 or 4]: temperature (0: greedy), top_k (0: off), 1 - top_p
    (0: off), and for code 0 the repetition penalty (0 reads as 1: a padding row)."""

    def __init__(self, params: torch.Tensor, vocab: int):
        t, k, floor = params[:, 0:1], params[:, 1:2], params[:, 2:3]
        self.sampled = t[:, 0] > 0
        self.temperature = torch.where(t > 0, t, 1.0)
        # the ascending sorted row's index of the k-th largest logit; off: 0, the smallest (nothing is below it)
        self.kth = torch.where(k > 0, vocab - k.long().clamp(1, vocab), 0)
        self.floor = torch.where(floor > 0, floor, -1.0)           # off: no cumulative probability is <= -1
        self.penalty = torch.where(params[:, 3:4] > 0, params[:, 3:4], 1.0) if params.shape[1] > 3 else None


def select(logits: torch.Tensor, rows: RowParams, log_noise: torch.Tensor, seen: torch.Tensor | None = None,
           suppress: torch.Tensor | None = None) -> torch.Tensor:
    """logits [S, V] -> codes [S] int64, each row by its RowParams. HF's processors in generate's order:
    repetition penalty over seen [S, V] (bool; None: none), suppression (suppress [V] bool -> -inf),
    temperature, top-k, top-p; a greedy row takes the argmax after suppression, a sampling row wins an
    exponential race on its draws (log_noise [S, V] = log E, E ~ Exp(1)): argmax(x - log E) = argmax(p / E).
    Static shapes, no host reads."""
    neg = float("-inf")
    x = logits.float()
    if seen is not None:
        rp = rows.penalty
        x = torch.where(seen, torch.where(x < 0, x * rp, x / rp), x)
    if suppress is not None:
        x = x.masked_fill(suppress, neg)
    greedy = x.argmax(dim=-1)
    x = x / rows.temperature
    # one ascending sort serves both filters: top-k drops the sorted row's head, after which the row is
    # still sorted and holds what HF's top-p sorts
    sorted_x, order = torch.sort(x, dim=-1)
    drop = sorted_x < sorted_x.gather(-1, rows.kth)
    cum = sorted_x.masked_fill(drop, neg).softmax(dim=-1).cumsum(dim=-1)
    drop_p = cum <= rows.floor
    drop_p[:, -1] = False                                                        # the top token stays
    drop = drop | drop_p
    race = torch.where(drop.scatter(-1, order, drop), neg, x - log_noise)
    return torch.where(rows.sampled, race.argmax(dim=-1), greedy)


def sampler(module: nn.Module, logits: torch.Tensor):
    """The select a module runs: the fused one-launch sampler (select_ops.fused_select) where the plan says so
    (its fused_sampler knob) and the logits are on a GPU (or meta, where the compiler traces them); else
    select, the torch path."""
    if module.fused_sampler and logits.device.type in ("cuda", "meta"):
        from models.components.select_ops import fused_select
        return fused_select
    return select


def pick(module: nn.Module, logits: torch.Tensor, rows: RowParams, log_noise: torch.Tensor, table: nn.Embedding,
         out: torch.Tensor | None = None, seen: torch.Tensor | None = None, suppress: torch.Tensor | None = None
         ) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes [S], their rows of table [S, H]): sampler(module, logits)'s codes, then the table's lookup; with out
    [S, H] (Talker.frame: the select_fold knob; rows then select_ops.RawRows) the fused sampler writes the rows
    there in its own launch, with programmatic dependent launch where the module's pdl knob says so."""
    if out is not None:
        from models.components.select_ops import fused_select
        return fused_select(logits, rows, log_noise, seen, suppress, (table.weight, out), bool(module.pdl)), out
    code = sampler(module, logits)(logits, rows, log_noise, seen, suppress)
    return code, table(code)


def _rows(params: torch.Tensor, vocab: int, folded: bool):
    """The rows' sampling parameters for pick: RowParams, or where the fused sampler folds their preparation
    (the select_fold knob, a frame buffer given) the columns as they are (select_ops.RawRows)."""
    if folded:
        from models.components.select_ops import RawRows
        return RawRows(params)
    return RowParams(params, vocab)


def log_draws(noise: torch.Tensor) -> torch.Tensor:
    """log E of Exp(1) draws; E floored at the smallest normal float (a CPU draw can be 0), so the race
    never meets -inf - (-inf)."""
    return noise.clamp_min(torch.finfo(torch.float32).tiny).log()


class ResizeMLP(nn.Module):
    """Thinker width -> talker width: linear_fc2(silu(linear_fc1(x))), both with bias."""

    def __init__(self, inp: int, hidden: int, out: int):
        super().__init__()
        self.linear_fc1 = Linear(inp, hidden)
        self.linear_fc2 = Linear(hidden, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(nn.functional.silu(self.linear_fc1(x)))


class FrameCache:
    """The code predictor's q/k/v slots of one frame: [layers, S, G, heads, D], written step by step."""

    def __init__(self, attn, cfg: CodePredictorConfig, seqs: int, groups: int, like: torch.Tensor,
                 zeroed: bool = True):
        n, d = cfg.num_hidden_layers, cfg.head_dim
        self.attn, self.s, self.g = attn, seqs, groups
        # zeros, not empty: masked slots still enter attn's softmax(.) @ V, and 0 x NaN would poison the output;
        # not zeroed where nothing reads a slot before writing it (the frame_attend knob's kernel: no launches)
        new = like.new_zeros if zeroed else like.new_empty
        self.q = new(n, seqs, groups, cfg.num_attention_heads, d)
        self.k = new(n, seqs, groups, cfg.num_key_value_heads, d)
        self.v = new(n, seqs, groups, cfg.num_key_value_heads, d)

    def attend(self, layer: int, slots: slice, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               written: tuple[bool, bool, bool] = (False, False, False)) -> torch.Tensor:
        """q [S, n, H, D], k/v [S, n, KV, D] at slots -> attention output of those slots [S, n, H, D]. written:
        q, k and v are already in the cache's slots (FrameAttend.qkv_out), not copied again."""
        for cache, x, done in zip((self.q, self.k, self.v), (q, k, v), written):
            if not done:
                cache[layer, :, slots] = x
        o = self.attn(self.q[layer].flatten(0, 1), self.k[layer].flatten(0, 1), self.v[layer].flatten(0, 1))
        return o.view(self.s, self.g, *o.shape[1:])[:, slots]


class FrameAttend(partial):
    """A code predictor layer's attend at some slots: partial(FrameCache.attend, layer, slots), with qkv_out
    naming the cache's q, k and v slots, where the attention layer writes its normed q and k and its v in place
    (thinker.Attention; one launch where the norms are fused). A partial, so the compiler's layer memo keys it as
    one (graphc/layer_memo.py: by its function, not its layer and slots) and replays the frame's repeated layer
    passes. fused (the frame_attend knob): the layer's norms, rotary, cache writes and attention as one launch
    (fused, which the layer calls)."""

    def __new__(cls, cache: FrameCache, layer: int, slots: slice, fused: bool = False):
        self = super().__new__(cls, cache.attend, layer, slots)
        self.qkv_out = (cache.q[layer, :, slots], cache.k[layer, :, slots], cache.v[layer, :, slots])
        self.cache, self.fused = cache, (self._fused if fused else None)
        return self

    def _fused(self, q_norm, k_norm, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor,
               sin: torch.Tensor) -> torch.Tensor:
        """The frame_attend knob's one launch (frame_ops.frame_attend): q and k normed and rotated (cos, sin: the
        slots' rows), written with v into the cache's slots, and the slots' attention over the frame [S, n, H, D].
        Attention.forward calls it in place of norm_rope_qk and this partial."""
        from models.components.frame_ops import frame_attend
        c, layer, slots = self.cache, self.args[0], self.args[1]
        return frame_attend(q, k, v, q_norm.weight, k_norm.weight, cos, sin, (c.q[layer], c.k[layer], c.v[layer]),
                            slots.start, q_norm.eps, bool(q_norm.pdl))

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return super().__call__(q, k, v, tuple(x is y for x, y in zip((q, k, v), self.qkv_out)))


class CodePredictorBody(nn.Module):
    def __init__(self, cfg: CodePredictorConfig, groups: int):
        super().__init__()
        self.layers = nn.ModuleList(
            FoldedLayer(cfg.hidden_size, Attention(cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
                                                    cfg.head_dim, cfg.rms_norm_eps),
                         SwiGLU(cfg.hidden_size, cfg.intermediate_size), cfg.rms_norm_eps)
            for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.codec_embedding = nn.ModuleList(nn.Embedding(cfg.vocab_size, cfg.hidden_size) for _ in range(groups - 1))


class CodePredictor(nn.Module):
    """Residual codes 1..G-1 of a frame from the talker's hidden state and code 0's embedding."""

    # the plan's knob (graphc/passes/select_backends.py): 1 samples each code in one launch (sampler())
    fused_sampler: int = 0
    # another: that launch with programmatic dependent launch (resources/pdl.py), where the talker's select_fold
    # knob has it write the code's embedding too (pick)
    pdl: int = 0
    # another, N > 0: in a step of at least N sequences, each layer's q/k norm, rotary, frame-cache write and
    # attention in one launch (frame_triton.py) on a GPU in bf16, where the cp_attn resource's attention is not
    # called; else (and at 0) q_k_norm_rope, then that attention
    frame_attend: int = 0

    def __init__(self, cfg: CodePredictorConfig, groups: int):
        super().__init__()
        self.cfg, self.groups = cfg, groups
        self.model = CodePredictorBody(cfg, groups)
        self.lm_head = nn.ModuleList(Linear(cfg.hidden_size, cfg.vocab_size, bias=False) for _ in range(groups - 1))
        self.register_buffer("inv_freq", rope_inv_freq(cfg.head_dim, cfg.rope_theta), persistent=False)

    def fuses_frame(self, x: torch.Tensor) -> bool:
        """The frame_attend knob applies to rows x [S, ...]: at least its value of sequences S, bf16 on a GPU or on
        meta tensors (where the compiler traces)."""
        return (0 < self.frame_attend <= x.shape[0] and x.dtype == torch.bfloat16
                and x.device.type in ("cuda", "meta"))

    def run(self, x: torch.Tensor, slots: slice, cos: torch.Tensor, sin: torch.Tensor, cache: FrameCache,
            head: Linear) -> torch.Tensor:
        """x [S, n, H] at positions slots -> head's logits [S, V] of the last slot's final-normed hidden. Each
        layer's last residual add runs in the next one's input norm, the last layer's in the final norm
        (FoldedLayer); with the norm_gemv knob at one row that norm runs in the head's launch too
        (Linear.after_norm)."""
        delta, fused = None, self.fuses_frame(x)
        for i, layer in enumerate(self.model.layers):
            x, delta = layer(x, delta, cos[slots], sin[slots], FrameAttend(cache, i, slots, fused))
        return head.after_norm(x[:, -1], delta[:, -1], self.model.norm)[1]

    def forward(self, hidden: torch.Tensor, code0_embed: torch.Tensor, attn: Attend, params: torch.Tensor,
                log_noise: torch.Tensor, frame: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden, code0_embed [S, H] -> codes [S, G-1] int64, their embeddings [S, G-1, H]. params [S, 3]:
        the residual codes' temperature, top_k, 1 - top_p; log_noise [S, G-1, >= vocab_size]: each code's
        log draws (log_draws). frame [S, G, H] (Talker.frame): code j's embedding written in frame[:, j + 1] by
        its sampler's launch, and frame[:, 1:] the embeddings returned."""
        rows = _rows(params, self.cfg.vocab_size, frame is not None)
        v = self.cfg.vocab_size
        s, g = hidden.shape[0], self.groups
        cache = FrameCache(attn, self.cfg, s, g, hidden, zeroed=not self.fuses_frame(hidden))
        positions = torch.arange(g, device=hidden.device)
        cos, sin = rope_cos_sin(positions, self.inv_freq, hidden.dtype)        # [G, 1, D]
        x = torch.stack((hidden, code0_embed), dim=1)                           # [S, 2, H]: HF's 2-row prefill
        codes, embeds = [], []
        for j in range(g - 1):
            slots = slice(0, 2) if j == 0 else slice(j + 1, j + 2)
            logits = self.run(x, slots, cos, sin, cache, self.lm_head[j])
            code, e = pick(self, logits, rows, log_noise[:, j, :v], self.model.codec_embedding[j],
                           None if frame is None else frame[:, j + 1])          # [S], [S, H]
            codes.append(code)
            embeds.append(e)
            x = e[:, None]                                                      # next step's one row
        return torch.stack(codes, dim=1), (torch.stack(embeds, dim=1) if frame is None else frame[:, 1:])


class TalkerBody(nn.Module):
    def __init__(self, cfg: TalkerTextConfig):
        super().__init__()
        self.codec_embedding = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(moe_layer(cfg, cfg.shared_expert_intermediate_size)
                                    for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Talker(NodeModule):
    """Node: talker rows -> whole codec frames for the sampled rows, and their next input embeddings.

    Inputs: embeds [T, H], positions [3, T] int64, sample_rows [S] int64, trailing_text [S, Ht],
    sampling [S, len(SAMPLING)] fp32, noise [S, G, vocab] fp32 (Exp(1) draws: code 0's, then each residual
    code's in its first codebook columns), seen [S, vocab] bool (code-0 ids generated before);
    optional group 'prompt': codec_ids [T] int64, thinker_embeds [T, Ht], thinker_hidden [T, Ht],
    prompt_kind [T] int64. Outputs: logits [S, vocab] fp32 (codec_head, before suppression),
    codes [S, G] int64, next_embeds [S, H].
    """

    ROLES = {"kv": "paged_kv", "cp_attn": "ragged_attention"}
    fused_sampler: int = 0          # the plan's knobs, as CodePredictor's
    pdl: int = 0
    # another: with the fused sampler, each code's launch also prepares its rows' sampling columns and writes its
    # embedding into the frame's buffer (frame, pick): no RowParams launches, no lookups, no stack or
    # concatenation of the frame's rows
    select_fold: int = 0

    def __init__(self, cfg: TalkerConfig):
        super().__init__()
        text, cp = cfg.text_config, cfg.code_predictor_config
        self.cfg = cfg
        self.model = TalkerBody(text)
        self.codec_head = Linear(text.hidden_size, text.vocab_size, bias=False)
        self.text_projection = ResizeMLP(cfg.thinker_hidden_size, text.intermediate_size, text.hidden_size)
        self.hidden_projection = ResizeMLP(cfg.thinker_hidden_size, text.intermediate_size, text.hidden_size)
        self.code_predictor = CodePredictor(cp, cfg.num_code_groups)
        self.rope = MRope(text.head_dim, text.rope_theta, text.mrope_section)
        suppress = torch.arange(text.vocab_size) >= cp.vocab_size
        suppress[cfg.codec_eos_token_id] = False
        self.register_buffer("suppress", suppress, persistent=False)

    def prompt_rows(self, codec_ids: torch.Tensor, thinker_embeds: torch.Tensor, thinker_hidden: torch.Tensor,
                    prompt_kind: torch.Tensor) -> torch.Tensor:
        """[T, H]: the projected thinker side plus the codec side of prompt rows."""
        text = self.text_projection(thinker_embeds)
        mm = self.hidden_projection(thinker_hidden)
        side = torch.where((prompt_kind == 2)[:, None], mm, torch.where((prompt_kind == 1)[:, None], text, 0.0))
        codec = self.model.codec_embedding(codec_ids.clamp(min=0))
        return side + torch.where((codec_ids >= 0)[:, None], codec, 0.0)

    def frame(self, logits: torch.Tensor, h: torch.Tensor) -> torch.Tensor | None:
        """The frame's embeddings [S, G, H], left for the fused sampler to write (the select_fold knob, with the
        fused sampler where it runs: sampler()); else None."""
        if not (self.select_fold and sampler(self, logits) is not select):
            return None
        return torch.empty(h.shape[0], self.cfg.num_code_groups, h.shape[1], device=h.device, dtype=h.dtype)

    def forward(self, ctx: StepContext, embeds: torch.Tensor, positions: torch.Tensor, sample_rows: torch.Tensor,
                trailing_text: torch.Tensor, sampling: torch.Tensor, noise: torch.Tensor, seen: torch.Tensor,
                codec_ids: torch.Tensor | None = None,
                thinker_embeds: torch.Tensor | None = None, thinker_hidden: torch.Tensor | None = None,
                prompt_kind: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        kv = ctx["kv"]
        x = embeds
        if codec_ids is not None:
            x = x + self.prompt_rows(codec_ids, thinker_embeds, thinker_hidden, prompt_kind)
        cos, sin, h = *self.rope(positions, x.dtype), None
        for i, layer in enumerate(self.model.layers):
            x, h = layer(x, h, cos, sin, partial(kv, i), next_norm(self.model.layers, i))
        h = self.model.norm(x.index_select(0, sample_rows))                      # [S, H]
        logits = self.codec_head(h).float()                                      # [S, V]
        log_noise = log_draws(noise)                                             # [S, G, V]
        frame = self.frame(logits, h)
        code0, e0 = pick(self, logits, _rows(sampling[:, :4], logits.shape[-1], frame is not None), log_noise[:, 0],
                         self.model.codec_embedding, None if frame is None else frame[:, 0], seen, self.suppress)
        residual, residual_embeds = self.code_predictor(h, e0, ctx["cp_attn"], sampling[:, 4:], log_noise[:, 1:],
                                                        frame)
        if frame is None:
            frame = torch.cat((e0[:, None], residual_embeds), dim=1)            # [S, G, H]
        next_embeds = frame.sum(dim=1) + self.text_projection(trailing_text)
        return {"logits": logits, "codes": torch.cat((code0[:, None], residual), dim=1), "next_embeds": next_embeds}
