"""FlashInfer's fa2 backends against fp32 torch SDPA at small shapes, eager and captured in a CUDA
graph (replayed after re-planning another layout of the rung): examples/bench/attention_gpu.py's runs.

Head dims and windows match the script's audio, code2wav and thinker/talker shapes, so these load
the same compiled kernels. Skipped without CUDA (tests/conftest.py); needs flashinfer-python.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from graphc.units import MiB
from resources.base import StepShape
from resources.paged_kv import PagedKVSpec
from resources.ragged_attention import RaggedAttentionSpec


def _script():
    path = Path(__file__).resolve().parents[2] / "examples" / "bench" / "attention_gpu.py"
    spec = importlib.util.spec_from_file_location("attention_gpu", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module     # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


script = _script()
pytestmark = pytest.mark.gpu

ENCODER = RaggedAttentionSpec(name="t_enc", num_heads=4, head_dim=64, max_segment=32)
WINDOWED = RaggedAttentionSpec(name="t_c2w", num_heads=4, head_dim=64, max_segment=48, causal=True, window=9)
KV = PagedKVSpec(name="t_kv", num_layers=2, num_qo_heads=16, num_kv_heads=2, head_dim=128, max_seq_len=256)

CASES = [
    script.Case("ragged", ENCODER, StepShape(rows=128, seqs=4, kv_len=32)),
    script.Case("ragged_causal_window", WINDOWED, StepShape(rows=192, seqs=4, kv_len=48)),
    script.Case("paged_prefill", KV, StepShape(rows=96, seqs=3, kv_len=256)),
    script.Case("paged_decode", KV, StepShape(rows=8, seqs=8, kv_len=256, phase="decode")),
]


@pytest.fixture(scope="module")
def workspace():
    pytest.importorskip("flashinfer")
    return torch.zeros(64 * MiB, dtype=torch.uint8, device="cuda")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_fa2_matches_sdpa_eager_and_captured(case, workspace):
    rec = script.run_case(case, "fa2", workspace, replays=3)
    for mode in ("eager", "captured"):
        run = rec[mode]
        assert run["status"] == "ok", run
        assert run["rel_err"] < script.TOL, (mode, run)
        assert run.get("append_exact", True), (mode, run)
    ws = rec["workspace"]
    assert ws["status"] == "ok" and ws["float_used"] <= workspace.numel(), ws


def test_a_padded_head_dim_takes_inputs_already_padded(workspace):
    """The vision tower's heads (16 of 72) on fa3, which runs them zero-padded to 128: q, k and v handed over
    already padded (what VisionAttention's fused rotary writes) give the same output, bit for bit, as the
    72-wide ones the backend pads itself, 72 wide either way, at two segments of 1,024 and 3,072 patches."""
    from resources.flashinfer_backend import make_backend

    spec = RaggedAttentionSpec(name="t_vision", num_heads=16, head_dim=72, max_segment=4096)
    b = make_backend(spec, "fa3", workspace, False, None, run_head_dim=128)
    assert b.run_head_dim == 128
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(4096, 16, 72, device="cuda", generator=gen, dtype=torch.bfloat16) for _ in range(3))
    b.plan([0, 1024, 4096])
    want = b(q, k, v)
    got = b(*(torch.nn.functional.pad(t, (0, 56)) for t in (q, k, v)))
    assert want.shape == got.shape == (4096, 16, 72)
    assert torch.equal(got, want)
