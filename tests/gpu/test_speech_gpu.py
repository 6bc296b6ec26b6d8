"""Speech on the GPU, held to an independent reference: plans/qwen3_omni_h200.plan (the real shapes: the tiny
preset's head_dim 16 has no FlashInfer kernel) booted with seeded bf16 weights; six t2s requests arriving
over several steps (first chunks in the short slots, later ones in the long ones, every step a replayed
graph). The audio each request received is compared with a CPU fp32 forward of the same Code2Wav weights
(torch attention) on the same frames, chunk by chunk as the stream cut them. Skipped without CUDA; needs
flashinfer-python and an H200 (the plan's card)."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from graphc.plan import load_plan
from graphc.runtime.engine import Engine
from graphc.step import StepContext
from models.components.code2wav import attention_spec, cu_seqlens, pack_slots, stream_chunk_frames, stream_slot
from resources.ragged_attention import RaggedTorch
from tests.gpu.arrivals import run_speech

pytestmark = pytest.mark.gpu


def test_streamed_audio_matches_a_cpu_fp32_code2wav_of_the_same_frames():
    pytest.importorskip("flashinfer")
    if "H200" not in torch.cuda.get_device_name(0):
        pytest.skip("the plan is for an H200")
    engine = Engine(load_plan("plans/qwen3_omni_h200.plan"), random_weights=True)
    reqs = run_speech(engine)
    stats = engine.stats()
    assert stats["eager"] == 0 and stats["steps"]["code2wav_short"] > 0 and stats["steps"]["code2wav_chunk"] > 0
    fp32 = copy.deepcopy(engine.boot.modules["code2wav"]).float().cpu()
    bf16 = copy.deepcopy(engine.boot.modules["code2wav"]).cpu()          # its own dtype: bf16 run eagerly
    cfg = fp32.cfg
    spec = attention_spec(cfg, "code2wav_attn")

    def decode(module, codes, s):
        step_in = pack_slots(cfg, [(codes, s)], 1, s.frames)
        with torch.inference_mode():
            wav = module(StepContext({"attn": RaggedTorch(spec, cu_seqlens(s.frames, 1))}), **step_in)["wav"]
        return wav[s.keep_start:s.keep_stop].double()

    def rel(a, b):
        return float((a - b).norm() / b.norm())

    ours, eager, chunks = [], [], 0
    for req in reqs[:3]:
        out = engine.output(req)
        assert out.error is None and len(out.audio_codes) > 5
        codes = torch.tensor(out.audio_codes, dtype=torch.int64).T           # [Q, N]
        want, cheap, start, i = [], [], 0, 0
        while start < codes.shape[1]:
            end = min(start + stream_chunk_frames(cfg, i, engine.host.speech.first_chunk), codes.shape[1])
            s = stream_slot(cfg, start, end)
            want.append(decode(fp32, codes, s))
            cheap.append(decode(bf16, codes, s))
            start, i = end, i + 1
        got = torch.as_tensor(np.asarray(out.audio)).double()
        want, cheap = torch.cat(want), torch.cat(cheap)
        assert got.shape == want.shape
        n = cfg.samples(engine.host.speech.first_chunk)                      # the first chunk (a short slot)
        ours.append((rel(got, want), rel(got[:n], want[:n])))
        eager.append((rel(cheap, want), rel(cheap[:n], want[:n])))
        chunks += i
    print(f"relative error against CPU fp32 Code2Wav, whole audio and first chunk, over {len(ours)} requests, "
          f"{chunks} chunks: replayed bf16 graphs {ours}; eager bf16 on the CPU {eager}")
    # the captured bf16 steps are no further from fp32 than bf16 itself is
    assert all(o[0] <= 1.5 * e[0] + 1e-3 and o[1] <= 1.5 * e[1] + 1e-3 for o, e in zip(ours, eager)), (ours, eager)
