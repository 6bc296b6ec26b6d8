"""HF's Qwen3.5 modules as the references: their torch paths, wherever they run.

transformers binds Qwen3.5's delta rules and causal convs at import to flash-linear-attention's and causal-conv1d's
kernels where those packages import (the GPU machine's environment has fla-core), and those kernels take no CPU
tensors. The references here run on the CPU, so each such function is put back to the torch function it wraps,
for the whole session."""
from __future__ import annotations

import importlib
import inspect

import pytest

HF_MODULES = ("transformers.models.qwen3_5.modeling_qwen3_5", "transformers.models.qwen3_5_moe.modeling_qwen3_5_moe")
TORCH_PATHS = ("causal_conv1d_update", "causal_conv1d_fn", "torch_chunk_gated_delta_rule",
               "torch_recurrent_gated_delta_rule")


@pytest.fixture(scope="session", autouse=True)
def hf_torch_paths():
    patch = pytest.MonkeyPatch()
    for name in HF_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:              # a transformers without the model: its tests skip or fail on their own
            continue
        for fn in TORCH_PATHS:
            patch.setattr(module, fn, inspect.unwrap(getattr(module, fn)))
    yield
    patch.undo()
