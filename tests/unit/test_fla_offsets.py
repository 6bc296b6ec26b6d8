"""An eager step's offsets reach fla-core once a step, on the host and on the device: every Gated DeltaNet layer
of the step passes FLA the same two int64 tensors (StateStep.cu_tensors), so FLA sizes its chunks from the host's
copy (no read-back from the GPU) and its identity-keyed cache of chunk indices holds across the layers. A fake
fla.ops.gated_delta_rule records what it is given (fla-core is a GPU package); the layers run on the CPU with
GatedDeltaNet.fla_device patched to take their rows."""
from __future__ import annotations

import sys
import types

import torch

from models.components.delta_rule import fla_rule, gated_delta_rule, prepare_qk
from models.components.gated_deltanet import GatedDeltaNet
from models.components.gated_deltanet_config import GatedDeltaNetConfig, state_spec
from resources.linear_state import StateStep, new_state

CFG = GatedDeltaNetConfig(hidden_size=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                          linear_value_head_dim=8)


def fake_fla(monkeypatch) -> list[dict]:
    """Install a fake fla.ops.gated_delta_rule whose chunked rule records its offsets and runs the torch rule."""
    calls = []

    def chunk(q, k, v, g, beta, initial_state, output_final_state, use_qk_l2norm_in_kernel, cu_seqlens,
              cu_seqlens_cpu=None):
        calls.append({"dev": cu_seqlens, "host": cu_seqlens_cpu})
        qp, kp = prepare_qk(q[0], k[0], v.shape[2] // q.shape[2])
        o, s = gated_delta_rule(qp, kp, v[0], g[0], beta[0], initial_state, cu_seqlens.tolist())
        return o[None], s

    mod = types.ModuleType("fla.ops.gated_delta_rule")
    mod.chunk_gated_delta_rule, mod.fused_recurrent_gated_delta_rule = chunk, None
    for name, m in (("fla", types.ModuleType("fla")), ("fla.ops", types.ModuleType("fla.ops")),
                    ("fla.ops.gated_delta_rule", mod)):
        monkeypatch.setitem(sys.modules, name, m)
    return calls


def test_every_layer_of_a_step_passes_the_same_host_and_device_offsets(monkeypatch):
    calls = fake_fla(monkeypatch)
    monkeypatch.setattr(GatedDeltaNet, "fla_device", staticmethod(lambda x: True))
    torch.manual_seed(0)
    layers = [GatedDeltaNet(CFG, i).eval() for i in range(3)]
    for m in layers:
        m.fla_gdn = 1
    state = new_state(state_spec(CFG, "s", 3, conv_dtype="float32", state_dtype="float32"), 4)
    with torch.no_grad():
        for lens in ([3, 2], [4, 1, 2]):
            step = StateStep(state, list(range(len(lens))), lens, [False] * len(lens))
            h = torch.randn(sum(lens), CFG.hidden_size)
            for m in layers:
                h = m(h, step)
    first, second = calls[:3], calls[3:]
    assert len(calls) == 6
    for group, cu in ((first, [0, 3, 5]), (second, [0, 4, 5, 7])):
        assert all(c["dev"] is group[0]["dev"] and c["host"] is group[0]["host"] for c in group)
        host = group[0]["host"]
        assert host.device.type == "cpu" and host.dtype == torch.int64 and host.tolist() == cu
        assert group[0]["dev"].dtype == torch.int64 and group[0]["dev"].tolist() == cu
    assert first[0]["host"] is not second[0]["host"]               # a new step, its own offsets


def test_a_call_without_the_steps_offsets_still_gives_fla_the_hosts(monkeypatch):
    calls = fake_fla(monkeypatch)
    t, hk, hv, d = 5, 2, 4, 8
    q, k, v = torch.randn(t, hk, d), torch.randn(t, hk, d), torch.randn(t, hv, d)
    g, beta, s0 = -torch.rand(t, hv), torch.rand(t, hv), torch.zeros(2, hv, d, d)
    fla_rule(q, k, v, g, beta, s0, [0, 3, 5])
    assert calls[0]["host"].device.type == "cpu" and calls[0]["host"].tolist() == [0, 3, 5]
