"""The engine is generic: a model of a shape it never served (tests/shapes/chained.py: two chained
autoregressive stages with no media, then a frame-local decoder of codes into audio, written against
graphc's public API only) is planned by `graphc plan` and served by graphc.Engine without a change to
graphc, models or resources.

Expected values come from a reference written here in plain torch from the booted modules' state_dicts:
dense, unpaged, causal attention over the whole sequence recomputed at every step (no cache), the rows
fed as graphc/runtime/speech.py's docstring says (the speaker's prompt rows, then one row a frame, the
previous frame's next_embeds). Several requests of different lengths run at once and arrive over several
steps, so prefill chunking, batched decode, paging and audio chunking are all exercised.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from graphc import InvalidInput, Media
from graphc.cli import main
from graphc.runtime.engine import Engine
from graphc.runtime.sampler import SamplingParams
from graphc.runtime.speech import SpeechParams
from tests.conftest import ROOT

MODEL = str(ROOT / "tests" / "shapes" / "chained.py")

# (prompt length, text tokens, speech frames or None for text only, first chunk or None (10: more than a
# slot's 4 frames, which the host caps), arrival step)
REQUESTS = [(5, 7, 12, None, 0), (12, 6, 9, 3, 0), (40, 8, None, None, 0), (23, 5, 16, 1, 0),
            (3, 9, 5, None, 2), (30, 4, None, None, 3), (17, 10, 14, 10, 6)]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tensors of a few KiB: one torch thread (on a busy two-core machine a second one only spins)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def plan(one_thread, tmp_path_factory):
    """`graphc plan tests/shapes/chained.py --gpu cpu -o p.plan`: its exit code and the plan's path."""
    path = tmp_path_factory.mktemp("chained") / "p.plan"
    rc = main(["plan", MODEL, "--gpu", "cpu", "-o", str(path), "-q"])
    return rc, path


def prompt_ids(i: int, n: int) -> list[int]:
    return [(7 * i + 3 * j + 1) % 120 for j in range(n)]


def serve(engine: Engine) -> list:
    """REQUESTS through the engine, each added before its arrival step, greedy; (request, output) each."""
    reqs, step = {}, 0
    while len(reqs) < len(REQUESTS) or engine.has_work():
        for i, (n, tokens, frames, first, at) in enumerate(REQUESTS):
            if at == step:
                sp = None if frames is None else SpeechParams(max_frames=frames, first_chunk=first)
                reqs[i] = engine.add(prompt_token_ids=prompt_ids(i, n), speech=sp,
                                     params=SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True))
        engine.step()
        step += 1
    return [(reqs[i], engine.output(reqs[i])) for i in range(len(REQUESTS))]


def test_a_new_shape_plans_and_serves_text_and_speech(plan, leak_oracle):
    """Planned by the CLI (exit 0), the plan refuses media and sampled speech (the host's word) and serves
    every request to its length: text-only ones with no audio, speaking ones with U samples for each frame
    they made (at most max_frames; fewer only when the speaker's end code stopped it), every walk ran, and
    the pools hold every page again once idle (the leak oracle)."""
    rc, path = plan
    assert rc == 0 and path.is_file()
    engine = leak_oracle.watch(Engine(path, random_weights=True))
    assert sorted(engine.kinds()) == ["t2s", "t2t"]
    with pytest.raises(InvalidInput, match="takes no media"):
        engine.add(prompt_token_ids=[1, 2], media=[Media("audio", np.zeros(1600, dtype=np.float32))])
    with pytest.raises(InvalidInput, match="greedy only"):
        engine.add(prompt_token_ids=[1, 2], speech=SpeechParams(temperature=0.7))
    u = engine.model.node("writer").config.upsample
    outs = serve(engine)
    for (n, tokens, frames, _, _), (_, out) in zip(REQUESTS, outs):
        assert out.error is None and out.finish_reason == "length" and len(out.token_ids) == tokens
        assert out.prompt_tokens == n
        if frames is None:
            assert out.kind == "t2t" and out.audio is None and out.audio_codes is None
            continue
        assert out.kind == "t2s" and out.sample_rate == 8000
        assert out.audio_finish_reason in ("stop", "length") and 0 <= len(out.audio_codes) <= frames
        assert (len(out.audio_codes) == frames) == (out.audio_finish_reason == "length")
        assert out.audio.dtype == np.float32 and out.audio.shape == (len(out.audio_codes) * u,)
    assert {o.audio_finish_reason for _, o in outs} >= {"stop", "length"}   # seed 0: both ends are met
    steps = engine.stats()["steps"]
    assert all(steps.get(w, 0) > 0 for w in ("writer_prefill", "writer_decode", "speaker_prefill",
                                             "speaker_decode", "decoder_chunk"))
    assert not engine.has_work() and engine.scheduler.pool_full()


# ---- the reference: plain torch over the booted weights, dense and unpaged
def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary on x [T, H, Dh] at positions 0..T-1, the halves of each head rotated."""
    t, _, d = x.shape
    freq = theta ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = torch.arange(t, dtype=torch.float32)[:, None, None] * freq
    a, b = x[..., :d // 2], x[..., d // 2:]
    return torch.cat([a * ang.cos() - b * ang.sin(), b * ang.cos() + a * ang.sin()], dim=-1)


def block(sd: dict, pre: str, x: torch.Tensor, heads: int, kv_heads: int, eps: float,
          theta: float | None) -> torch.Tensor:
    """One pre-norm layer over the whole sequence: causal attention (rotary when theta), then the GELU MLP."""
    t = x.shape[0]
    h = rms(x, sd[pre + "attn_norm.weight"], eps)
    q = (h @ sd[pre + "q.weight"].T).view(t, heads, -1)
    k = (h @ sd[pre + "k.weight"].T).view(t, kv_heads, -1)
    v = (h @ sd[pre + "v.weight"].T).view(t, kv_heads, -1)
    if theta is not None:
        q, k = rope(q, theta), rope(k, theta)
    k, v = (z.repeat_interleave(heads // kv_heads, dim=1) for z in (k, v))
    o = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True)
    x = x + o.transpose(0, 1).reshape(t, -1) @ sd[pre + "o.weight"].T
    m = rms(x, sd[pre + "mlp_norm.weight"], eps)
    return x + F.gelu(m @ sd[pre + "up.weight"].T) @ sd[pre + "down.weight"].T


def writer_rows(sd: dict, cfg, ids: list[int]) -> torch.Tensor:
    """The writer's final (normed) hidden rows [len(ids), D] of the whole sequence."""
    x = sd["embed.weight"][torch.tensor(ids)]
    for i in range(cfg.writer_layers):
        x = block(sd, f"blocks.{i}.", x, cfg.writer_heads, cfg.writer_kv_heads, cfg.eps, cfg.rope_theta)
    return rms(x, sd["norm.weight"], cfg.eps)


def writer_ref(sd: dict, cfg, prompt: list[int], n: int) -> tuple[list[int], torch.Tensor]:
    """Greedy tokens (the whole sequence recomputed each step) and the prompt rows' hidden states."""
    out, hidden = [], None
    for _ in range(n):
        rows = writer_rows(sd, cfg, prompt + out)
        hidden = rows[:len(prompt)] if hidden is None else hidden
        out.append(int((rows[-1] @ sd["lm_head.weight"].T).argmax()))
    return out, hidden


def speaker_ref(sd: dict, embed: torch.Tensor, cfg, hidden: torch.Tensor, text: list[int],
                max_frames: int) -> tuple[list[list[int]], str]:
    """Greedy frames and why they ended: the rows are the prompt's hidden rows, then frame k's next_embeds
    (its codes' embeddings and the writer's embedding of text[k], the pad id past the text) for frame k+1."""
    rows, frames = [r for r in hidden], []
    offsets = torch.arange(cfg.groups) * cfg.codebook
    while True:
        x = torch.stack(rows) + sd["pos.weight"][:len(rows)]
        for i in range(cfg.speaker_layers):
            x = block(sd, f"blocks.{i}.", x, cfg.speaker_heads, cfg.speaker_kv_heads, cfg.eps, None)
        last = rms(x[-1], sd["norm.weight"], cfg.eps)
        codes = (last @ sd["heads.weight"].T).view(cfg.groups, cfg.codebook).argmax(-1)
        if int(codes[0]) == cfg.end_code:
            return frames, "stop"
        frames.append(codes.tolist())
        if len(frames) >= max_frames:
            return frames, "length"
        k = len(frames) - 1
        said = embed[text[k] if k < len(text) else cfg.pad_id]
        rows.append(sd["code_embed.weight"][codes + offsets].sum(0) @ sd["code_proj.weight"].T
                    + said @ sd["trailing_proj.weight"].T)


def decoder_ref(sd: dict, cfg, frames: list[list[int]]) -> np.ndarray:
    """Every frame's U samples at once: its codes' embeddings summed, normed, a linear, tanh."""
    if not frames:
        return np.zeros(0, dtype=np.float32)
    codes = torch.tensor(frames) + torch.arange(cfg.groups) * cfg.codebook
    x = rms(sd["code_embed.weight"][codes].sum(1), sd["norm.weight"], cfg.eps)
    return torch.tanh(x @ sd["out.weight"].T).reshape(-1).numpy()


def test_a_new_shape_serves_what_dense_torch_computes(plan):
    """Text tokens, the writer's hidden prompt rows, the speaker's codes frame by frame (and why they ended)
    and the decoder's audio of every request served together, against the reference above on the same
    weights: tokens and codes exactly, hidden rows and audio within fp32 rounding."""
    engine = Engine(plan[1], random_weights=True)
    cfg = engine.model.node("writer").config
    sd = {name: {k: v.float() for k, v in engine.boot.modules[name].state_dict().items()}
          for name in ("writer", "speaker", "decoder")}
    stopped = 0
    for i, ((n, tokens, frames, _, _), (req, out)) in enumerate(zip(REQUESTS, serve(engine))):
        text, hidden = writer_ref(sd["writer"], cfg, prompt_ids(i, n), tokens)
        assert out.token_ids == text, f"request {i}: tokens"
        if frames is None:
            continue
        got = torch.stack([req.speech.hidden[r] for r in range(n)])
        torch.testing.assert_close(got, hidden, rtol=1e-5, atol=1e-5)
        codes, why = speaker_ref(sd["speaker"], sd["writer"]["embed.weight"], cfg, hidden, text, frames)
        assert out.audio_codes == codes and out.audio_finish_reason == why, f"request {i}: codes"
        np.testing.assert_allclose(out.audio, decoder_ref(sd["decoder"], cfg, codes), rtol=1e-5, atol=1e-6)
        stopped += why == "stop"
    assert 0 < stopped < sum(f is not None for _, _, f, _, _ in REQUESTS)   # both ends compared
