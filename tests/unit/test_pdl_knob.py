"""The plan's pdl knob reaches every kernel it names: with it set (graphc.modules.set_kernels), a one-row Linear,
a SwiGLU, an RMSNorm and its residual add, and the q/k norm + rotary launch hand pdl=True to their operators;
without it, False. On meta tensors (where the compiler traces them); the launches' arguments are
norm_triton.pdl_launch's, checked by hand below, and tests/gpu/test_pdl_gpu.py runs them so on a GPU."""
import pytest
import torch

from graphc.modules import set_kernels
from models.components.layers import Linear, RMSNorm, SwiGLU, norm_rope_qk

KNOBS = {"fused_norms": 1, "gemv": 1, "gemv_swiglu": 2**30}


class Calls(torch.utils._python_dispatch.TorchDispatchMode):
    """Every graphc operator run inside it, with its pdl argument (its schema's last, defaulting to False)."""

    def __init__(self):
        super().__init__()
        self.pdl: dict[str, list[bool]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        if name.startswith("graphc."):
            schema = func._schema.arguments
            assert schema[-1].name == "pdl", f"{name}'s last argument is {schema[-1].name}, not pdl"
            got = kwargs.get("pdl", args[len(schema) - 1] if len(args) == len(schema) else False)
            self.pdl.setdefault(name, []).append(bool(got))
        return func(*args, **(kwargs or {}))


class Block(torch.nn.Module):
    """A decoder layer's one-row ops: norm, q/k/v projection, q/k norm + rotary, o projection, residual add +
    norm, SwiGLU (its gate_up and down: two launches). Sizes: hidden, q heads, kv heads, head dim, intermediate."""

    def __init__(self, hidden=64, heads=4, kv=1, d=16, inter=128):
        super().__init__()
        self.split = [heads, kv, kv]
        self.norm, self.post, self.qn, self.kn = RMSNorm(hidden), RMSNorm(hidden), RMSNorm(d), RMSNorm(d)
        self.qkv = Linear(hidden, (heads + 2 * kv) * d, bias=False)
        self.o, self.mlp = Linear(heads * d, hidden, bias=False), SwiGLU(hidden, inter)
        self.register_buffer("cos", torch.randn(1, 1, d))
        self.register_buffer("sin", torch.randn(1, 1, d))

    def forward(self, x):
        h = self.norm(x)
        q, k, v = self.qkv(h).view(1, sum(self.split), -1).split(self.split, dim=1)
        q, k = norm_rope_qk(self.qn, self.kn, q, k, self.cos, self.sin)
        total, h = self.post.add(x, self.o(q.reshape(1, -1)))
        return total + self.mlp(h)


def _ran(knobs: dict) -> dict[str, list[bool]]:
    block = Block().to(device="meta", dtype=torch.bfloat16)
    set_kernels(block, knobs)
    calls = Calls()
    with calls, torch.no_grad():
        block(torch.empty(1, 64, device="meta", dtype=torch.bfloat16))
    return calls.pdl


def test_pdl_reaches_every_kernel_it_names():
    on, off = _ran(KNOBS | {"pdl": 1}), _ran(KNOBS)
    want = {"graphc.rms_norm": 1, "graphc.gemv": 3, "graphc.q_k_norm_rope": 1, "graphc.add_rms_norm": 1,
            "graphc.gemv_silu_mul": 1}
    assert {n: len(v) for n, v in on.items() if n in want} == want, on
    assert all(all(v) for n, v in on.items() if n in want), on
    assert not any(any(v) for v in off.values()), off


def test_launch_arguments_by_hand():
    pytest.importorskip("triton", reason="the kernels are Triton's; pip install -e '.[test]' brings it")
    from models.components.norm_triton import pdl_launch
    gpu = type("T", (), {"device": torch.device("cuda", 0)})()          # a GPU tensor's device, without one
    assert pdl_launch(False, gpu) == {}
    assert pdl_launch(True, torch.empty(1)) == {}                  # the interpreter's CPU tensors: none
    assert pdl_launch(True, gpu) == {"PDL": True, "launch_pdl": True}
    assert pdl_launch(0, gpu) == {}
