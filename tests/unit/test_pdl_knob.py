"""The plan's pdl knob reaches every kernel it names: with it set (graphc.modules.set_kernels), a one-row Linear,
a SwiGLU, an RMSNorm and its residual add, the q/k norm + rotary launch, and a MoE block's router, pair kernels
and slots' sum (with the next norm) hand pdl=True to their operators; without it, False. On meta tensors (where the compiler traces them); the launches' arguments are
resources.pdl.pdl_launch's, checked by hand below, and tests/gpu/test_pdl_gpu.py runs them so on a GPU."""
import pytest
import torch

from graphc.modules import set_kernels
from models.components.layers import Linear, RMSNorm, SwiGLU, norm_rope_qk
from models.components.moe import SparseMoE

KNOBS = {"fused_norms": 1, "gemv": 1, "gemv_swiglu": 2**30}


class Calls(torch.utils._python_dispatch.TorchDispatchMode):
    """Every graphc operator run inside it that takes a pdl argument (its schema's last, defaulting to False), with
    it; `others`: those that take none."""

    def __init__(self):
        super().__init__()
        self.pdl: dict[str, list[bool]] = {}
        self.others: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        if name.startswith("graphc."):
            schema = func._schema.arguments
            if schema[-1].name != "pdl":
                self.others.append(name)
            else:
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


def _ran(knobs: dict, block: torch.nn.Module | None = None, tokens: int = 1) -> Calls:
    block = (block or Block()).to(device="meta", dtype=torch.bfloat16)
    set_kernels(block, knobs)
    calls = Calls()
    with calls, torch.no_grad():
        x = torch.empty(tokens, 64, device="meta", dtype=torch.bfloat16)
        block(x) if isinstance(block, Block) else block.add_norm(x, torch.empty_like(x), block.next_norm)
    return calls


def test_pdl_reaches_every_kernel_it_names():
    on, off = _ran(KNOBS | {"pdl": 1}).pdl, _ran(KNOBS).pdl
    want = {"graphc.rms_norm": 1, "graphc.gemv": 3, "graphc.q_k_norm_rope": 1, "graphc.add_rms_norm": 1,
            "graphc.gemv_silu_mul": 1}
    assert {n: len(v) for n, v in on.items() if n in want} == want, on
    assert all(all(v) for n, v in on.items() if n in want), on
    assert not any(any(v) for v in off.values()), off


def test_launch_arguments_by_hand():
    pytest.importorskip("triton", reason="the kernels are Triton's; pip install -e '.[test]' brings it")
    from resources.pdl import pdl_launch
    gpu = type("T", (), {"device": torch.device("cuda", 0)})()          # a GPU tensor's device, without one
    assert pdl_launch(False, gpu) == {}
    assert pdl_launch(True, torch.empty(1)) == {}                  # the interpreter's CPU tensors: none
    assert pdl_launch(True, gpu) == {"PDL": True, "launch_pdl": True}
    assert pdl_launch(0, gpu) == {}


MOE = KNOBS | {"fused_max_tokens": 64, "fused_router": 1, "moe_pair_tokens": 2, "moe_route_group": 1,
               "moe_sum_norm": 1}


def _moe() -> SparseMoE:
    moe = SparseMoE(64, 32, 8, 2, True)
    moe.next_norm = RMSNorm(64)
    return moe


@pytest.mark.parametrize("tokens, want, plain", [
    (1, {"graphc.moe_route": 1, "graphc.moe_pair_gate_up": 1, "graphc.moe_pair_down": 1, "graphc.moe_sum_add_norm": 1},
     []),
    (4, {"graphc.moe_route_group": 1, "graphc.moe_sum_add_norm": 1}, ["graphc.moe_gate_up", "graphc.moe_down"])])
def test_pdl_reaches_the_moe_kernels(tokens, want, plain):
    """A pair step's router, pair kernels and sum take it; a grouped step's router-and-grouping launch and its sum
    take it, its grouped kernels do not (they take no pdl)."""
    on, off = _ran(MOE | {"pdl": 1}, _moe(), tokens), _ran(MOE, _moe(), tokens)
    assert {n: len(v) for n, v in on.pdl.items() if n.startswith("graphc.moe")} == want, on.pdl
    assert all(all(v) for v in on.pdl.values()), on.pdl
    assert not any(any(v) for v in off.pdl.values()), off.pdl
    assert [n for n in on.others if n.startswith("graphc.moe")] == plain


@pytest.mark.parametrize("pdl", [False, True])
def test_the_triton_attention_backends_take_it(pdl):
    """make_backend hands the node's knob to the Triton attention backends (their launches: pdl_launch's)."""
    pytest.importorskip("triton", reason="the kernels are Triton's; pip install -e '.[test]' brings it")
    from resources import flashinfer_backend as fb
    from resources.base import StepShape
    from resources.paged_kv import PagedKVSpec, new_cache
    from resources.ragged_attention import RaggedAttentionSpec

    paged = PagedKVSpec(name="kv", num_layers=1, num_qo_heads=4, num_kv_heads=2, head_dim=16, page_size=4,
                        max_seq_len=64)
    rung = StepShape(rows=2, seqs=2, kv_len=64, phase="decode")
    b = fb.make_backend(paged, "triton", torch.zeros(1 << 16, dtype=torch.uint8), True, rung,
                        cache=new_cache(paged, 8), decode_backend="triton", pdl=pdl)
    ragged = RaggedAttentionSpec(name="r", num_heads=4, head_dim=16, max_segment=8, rows_per_segment=8)
    r = fb.make_backend(ragged, "triton", torch.zeros(16, dtype=torch.uint8), False, None, pdl=pdl)
    assert (b.pdl, r.pdl) == (pdl, pdl)


def test_every_declared_knob_defaults_to_the_reference_path():
    """A knob a plan does not set leaves its module on the path without it (0): every module class of
    models/components that declares a knob, pdl and moe_shared_sum among them, declares it 0."""
    import importlib
    import inspect
    import pkgutil

    import models.components as mc
    from graphc.modules import KERNEL_KNOBS

    found = {}
    for info in pkgutil.iter_modules(mc.__path__):
        mod = importlib.import_module(f"models.components.{info.name}")
        for name, cls in inspect.getmembers(mod, inspect.isclass):
            if issubclass(cls, torch.nn.Module) and cls.__module__ == mod.__name__:
                found |= {f"{name}.{k}": cls.__dict__[k] for k in KERNEL_KNOBS if k in cls.__dict__}
    assert {"SparseMoE.moe_shared_sum", "SparseMoE.pdl", "Experts.pdl", "Linear.pdl", "RMSNorm.pdl",
            "SwiGLU.pdl"} <= set(found), sorted(found)
    assert {k: v for k, v in found.items() if v != 0} == {}
