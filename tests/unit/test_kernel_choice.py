"""The plan's kernel choices (issue 13): select_backends gives bf16 nodes on sm_90 targets the fused MoE
kernels up to 64 tokens, the fused norms and router, and nothing elsewhere; the plan records them only on nodes whose modules declare
the knob; set_kernels sets, resets and refuses; the simulation traces the fused path as its buffers and
operators (worked by hand); a boot sets the plan's choice on the modules."""
import pytest
import torch

from graphc.modules import set_kernels
from graphc.plan import load_plan
from graphc.simulate import _Recorder
from models.components.moe import Experts, SparseMoE


class OpNames(torch.utils._python_dispatch.TorchDispatchMode):
    """The name of every aten or graphc operator run inside it, in order (`seen`)."""

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))

    @classmethod
    def of(cls, fn):
        """(fn(), the operators it ran), without autograd."""
        names = cls()
        with names, torch.no_grad():
            out = fn()
        return out, names.seen


def graphc_ops(seen: list[str]) -> list[str]:
    return [s for s in seen if s.startswith("graphc.")]


def test_shipped_plans_record_the_choice_where_it_acts():
    for path in ("plans/qwen3_omni_h200.plan", "plans/omni_2gpu.plan"):
        plan = load_plan(path)
        assert plan.target.arch == "sm_90"
        got = {n: p.kernels for n, p in plan.nodes.items()}
        # the thinker and the talker hold sparse MoE experts, RMSNorms and layers.Linear, the talker its sampler
        # (with its rows' preparation folded in) and its code predictor's fused frame attention (from 2 sequences)
        # too; Code2Wav RMSNorms and a SwiGLU's Linears only; the audio
        # encoder none of them (LayerNorms, nn.Linear), the vision encoder its fp32 rotary, LayerNorms and MLP's GELU
        mlp = {"fused_norms": 1, "gemm_rows": 32, "gemv": 1, "gemv_swiglu": 16 * 2**20,  # SwiGLUs <= 16 MiB fused
               "norm_gemv": 1, "pdl": 1}
        both = {"fused_max_tokens": 16384, "fused_norms": 1, "fused_router": 1, "gemm_rows": 32, "gemv": 1,
                "moe_pair_tokens": 2,
                "moe_route_group": 1, "moe_shared_sum": 1, "moe_sm90_from": 2048, "moe_sum_norm": 1,
                "norm_gemv": 1, "pdl": 1}
        # the thinker's MoE has no shared expert (no SwiGLU); the talker's has, and its code predictor MLPs
        talker = {**both, **mlp, "frame_attend": 2, "fused_sampler": 1, "select_fold": 1}
        assert got == {"thinker": both, "talker": talker, "audio_encoder": {},
                       "vision_encoder": {"fused_gelu": 1, "fused_norms": 1, "fused_rope": 1},
                       "code2wav": mlp}, got
    assert all(not p.kernels for p in load_plan("plans/qwen3_omni_tiny_cpu.plan").nodes.values())     # cpu
    asr = {n: p.kernels for n, p in load_plan("plans/qwen3_asr_1.7b_h100.plan").nodes.items()}
    assert asr == {"audio_encoder": {}, "thinker": mlp}, asr     # a dense LM: no MoE


def test_select_backends_by_arch_and_dtype():
    from graphc.passes.select_backends import select_backends
    from graphc.verify import verify_graph
    from graphc.source import load_model
    from graphc.targets import get_target

    model = load_model("models/qwen3_omni.py").model
    for gpu, want in (("h100", True), ("h200", True), ("a100-80gb", False), ("l40s", False), ("b200", False)):
        ir = verify_graph(model, get_target(gpu), 1)
        chosen = select_backends(ir).kernels
        bf16 = {n.name for n in model.nodes if n.dtype == "bfloat16"}
        knobs = {"frame_attend": 2, "fused_gelu": 1, "fused_max_tokens": 16384, "fused_norms": 1, "fused_rope": 1,
                 "fused_router": 1, "fused_sampler": 1, "gated_rope": 1, "gemm_rows": 32, "gemv": 1,
                 "gemv_swiglu": 16 * 2**20,
                 "moe_pair_tokens": 2, "moe_route_group": 1, "moe_shared_sum": 1, "moe_sm90_from": 2048,
                 "moe_sum_norm": 1, "norm_gemv": 1, "pdl": 1, "select_fold": 1}
        assert chosen == ({n: knobs for n in bf16}
                          if want else {}), gpu


def test_set_kernels_sets_resets_and_refuses():
    moe = SparseMoE(16, 8, 4, 2, True)
    assert set_kernels(moe, {"fused_max_tokens": 5}) and moe.experts.fused_max_tokens == 5
    assert set_kernels(moe, {}) and moe.experts.fused_max_tokens == Experts.fused_max_tokens == 0
    assert not set_kernels(torch.nn.Linear(2, 2), {"fused_max_tokens": 5})
    with pytest.raises(ValueError, match="unknown kernel choices"):
        set_kernels(moe, {"fused_max_token": 5})


def _on_meta(T: int, k: int, E: int, H: int, I: int):
    """Experts (bf16, on meta) with its inputs for T tokens routed to k of E, the fused kernels chosen for T."""
    with torch.device("meta"):
        ex = Experts(E, H, I).to(torch.bfloat16)
        x = torch.empty(T, H, dtype=torch.bfloat16)
        experts = torch.empty(T, k, dtype=torch.int64)
        weights = torch.empty(T, k, dtype=torch.bfloat16)
    set_kernels(ex, {"fused_max_tokens": T})
    return ex, x, experts, weights


def _simulated(ex, *inputs):
    """(output, the allocations' bytes in order, the operators seen) of ex(*inputs), as the simulation sees them."""
    rec = _Recorder(list(ex.parameters()) + list(inputs))
    names = OpNames()
    with rec, names, torch.no_grad():
        out = ex(*inputs)
    return out, [n for kind, _, n in rec.events if kind == 1], names.seen


def test_the_simulation_sees_the_fused_path_as_its_buffers_and_operators():
    """T tokens routed to k of E experts (hidden H, intermediate I), bf16, on meta: four buffers
    (rows T*k int32, ends E int32, h [T*k, I] and pairs [T*k, H] bf16), three graphc operators, the sum
    [T, H]; no sort, no grouped_mm."""
    T, k, E, H, I = 3, 2, 8, 32, 16
    ex, *inputs = _on_meta(T, k, E, H, I)
    out, allocs, seen = _simulated(ex, *inputs)
    assert allocs == [T * k * 4, E * 4, T * k * I * 2, T * k * H * 2, T * H * 2], allocs
    assert [s for s in seen if s.startswith("graphc.")] == ["graphc.moe_group", "graphc.moe_gate_up", "graphc.moe_down"]
    assert not any("sort" in s or "grouped_mm" in s for s in seen)
    assert out.shape == (T, H) and out.dtype == torch.bfloat16
    set_kernels(ex, {"fused_max_tokens": T - 1})                # one token more than the choice: grouped_mm
    _, _, seen = _simulated(ex, *inputs)
    assert not any(s.startswith("graphc.") for s in seen) and any("grouped_mm" in s for s in seen)


def test_many_pairs_are_grouped_by_the_counting_sort_in_two_operators():
    """600 pairs (300 tokens, k 2: past GROUP_SORT_FROM's 512) are grouped by moe_count and moe_place, with a
    counts buffer of ceil(600 / 128) = 5 blocks x E int32, by hand from COUNT_BLOCK = 128; no torch sort."""
    from models.components import moe_ops, moe_sort

    T, k, E, H, I = 300, 2, 8, 32, 16
    assert moe_ops.GROUP_SORT_FROM == 512 and (moe_sort.COUNT_BLOCK, moe_sort.COUNT_BLOCKS) == (128, 128)
    _, allocs, seen = _simulated(*_on_meta(T, k, E, H, I))
    assert allocs == [T * k * 4, E * 4, 5 * E * 4, T * k * I * 2, T * k * H * 2, T * H * 2], allocs
    assert [s for s in seen if s.startswith("graphc.")] == ["graphc.moe_count", "graphc.moe_place",
                                                            "graphc.moe_gate_up", "graphc.moe_down"]
    assert not any("sort" in s for s in seen)


def test_a_boot_sets_the_plan_choice_on_the_modules():
    from graphc.runtime.boot import boot_plan

    plan = load_plan("plans/qwen3_omni_tiny_cpu.plan")
    plan.nodes["thinker"] = plan.nodes["thinker"].model_copy(update={"kernels": {"fused_max_tokens": 7}})
    (boot,) = boot_plan(plan, seed=0)
    values = {m.fused_max_tokens for m in boot.modules["thinker"].modules() if isinstance(m, Experts)}
    assert values == {7}
    assert {m.fused_max_tokens for m in boot.modules["talker"].modules() if isinstance(m, Experts)} == {0}


class WithExperts(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.moe = SparseMoE(16, 8, 4, 2, True)

    def forward(self, ctx, x):
        return {"y": self.moe(x)}


class WithoutExperts(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, ctx, x):
        return {"y": self.lin(x)}


def test_the_plan_records_a_choice_only_where_a_module_declares_the_knob():
    import graphc as gc
    from graphc.passes.emit_plan import _kernels

    def node(module):
        port = gc.Port(shape=("tokens", 16), dtype="bfloat16")
        return gc.Node(name="n", module=module, dtype="bfloat16", inputs={"x": port}, outputs={"y": port})

    knobs = {"fused_max_tokens": 64}
    assert _kernels(node(WithExperts), knobs) == knobs
    assert _kernels(node(WithoutExperts), knobs) == {}
    assert _kernels(node(WithExperts), {}) == {}
    # a knob no module of the node declares (no RMSNorm here) is left out of the record
    assert _kernels(node(WithExperts), knobs | {"fused_norms": 1}) == knobs


def test_the_simulation_sees_a_fused_decoder_layer_as_four_norm_operators():
    """A thinker layer (hidden 64, 4 heads and 2 kv heads of 16, 8 experts, top 2), bf16 on meta, with the
    norms fused: its input norm, q's and k's norm + rotary (one launch for both), the residual add +
    post-attention norm are one graphc operator each, in that order; none of torch's norm or rotary kernels is left (rsqrt, mean, pow,
    cat, neg). Without the knob, no graphc norm operator runs."""
    from models.components.thinker import MoETextConfig, moe_layer

    cfg = MoETextConfig(vocab_size=32, hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=16, moe_intermediate_size=32, num_experts=8,
                        num_experts_per_tok=2, mrope_section=(4, 2, 2))
    T = 3
    with torch.device("meta"):
        layer = moe_layer(cfg).to(torch.bfloat16)
        x = torch.empty(T, 64, dtype=torch.bfloat16)
        cos = torch.empty(T, 1, 16, dtype=torch.bfloat16)
        sin = torch.empty(T, 1, 16, dtype=torch.bfloat16)

    def attend(q, k, v):
        return torch.empty(T, 4, 16, device="meta", dtype=torch.bfloat16)

    names = OpNames()
    seen = names.seen

    set_kernels(layer, {"fused_norms": 1})
    with names, torch.no_grad():
        out, h = layer(x, None, cos, sin, attend)
    assert out.shape == (T, 64) and h is None and out.dtype == torch.bfloat16
    assert [s for s in seen if s.startswith("graphc.")] == ["graphc.rms_norm", "graphc.q_k_norm_rope",
                                                            "graphc.add_rms_norm"]
    assert not any(s.split(".")[-1] in ("rsqrt", "mean", "pow", "cat", "neg") for s in seen), seen
    set_kernels(layer, {})
    seen.clear()
    with names, torch.no_grad():
        layer(x, None, cos, sin, attend)
    assert not any(s.startswith("graphc.") for s in seen) and any(s.endswith("rsqrt") for s in seen)


def test_the_simulation_sees_a_fused_router_as_one_operator_and_its_two_outputs():
    """T tokens, E experts, top k, bf16 on meta with the router fused: after the gate's matmul, one graphc
    operator writing experts [T, k] int64 and weights [T, k] bf16 (two allocations, worked by hand); no
    softmax, topk or division left."""
    T, E, k, H = 5, 16, 4, 32
    with torch.device("meta"):
        moe = SparseMoE(H, 8, E, k, True).to(torch.bfloat16)
        x = torch.empty(T, H, dtype=torch.bfloat16)
    set_kernels(moe, {"fused_router": 1})
    rec = _Recorder(list(moe.parameters()) + [x])
    names = OpNames()
    seen = names.seen

    with rec, names, torch.no_grad():
        experts, weights = moe.route(x)
    assert [s for s in seen if s.startswith("graphc.")] == ["graphc.moe_route"]
    assert not any(s.split(".")[-1] in ("_softmax", "topk", "div") for s in seen), seen
    allocs = [n for kind, _, n in rec.events if kind == 1]
    assert allocs == [T * E * 2, T * k * 8, T * k * 2], allocs        # the logits, then the two outputs
    assert experts.shape == weights.shape == (T, k) and experts.dtype == torch.int64
    assert weights.dtype == torch.bfloat16


def test_the_simulation_sees_a_fused_residual_unit_as_two_snake_operators():
    """A Code2Wav residual unit (SnakeBeta, dilated causal conv, SnakeBeta, 1x1 conv) in bf16 on meta with
    the norms fused: each SnakeBeta is one graphc.snake_beta and torch's sin, pow, exp and reciprocal are
    gone; the convolutions stay. Without the knob, no graphc operator runs."""
    from models.components.code2wav import ResidualUnit

    with torch.device("meta"):
        unit = ResidualUnit(8, dilation=3).to(torch.bfloat16)
        x = torch.empty(2, 8, 40, dtype=torch.bfloat16)
    set_kernels(unit, {"fused_norms": 1})
    out, seen = OpNames.of(lambda: unit(x))
    assert out.shape == (2, 8, 40) and out.dtype == torch.bfloat16
    assert graphc_ops(seen) == ["graphc.snake_beta", "graphc.snake_beta"]
    assert not any(s.split(".")[-1] in ("sin", "pow", "exp", "reciprocal") for s in seen), seen
    assert sum(s.endswith("convolution") for s in seen) == 2
    set_kernels(unit, {})
    _, seen = OpNames.of(lambda: unit(x))
    assert not graphc_ops(seen) and any(s.endswith("sin") for s in seen)


def test_a_one_row_linear_takes_the_gemv_operator_and_more_rows_cublas():
    """layers.Linear with the gemv knob, bf16 on meta: one row (in any leading shape) is one graphc.gemv
    writing [.., N]; two rows, fp32, or the knob off go to aten's mm/addmm and no graphc operator."""
    from models.components.layers import Linear

    with torch.device("meta"):
        lin = Linear(32, 24, bias=True).to(torch.bfloat16)
        one, two = torch.empty(1, 1, 32, dtype=torch.bfloat16), torch.empty(2, 32, dtype=torch.bfloat16)
    set_kernels(lin, {"gemv": 1})
    y, seen = OpNames.of(lambda: lin(one))
    assert y.shape == (1, 1, 24) and y.dtype == torch.bfloat16
    assert graphc_ops(seen) == ["graphc.gemv"], seen
    assert not any(s.split(".")[-1] in ("mm", "addmm", "linear") for s in seen), seen
    for x, knob in ((two, 1), (one.float(), 1), (one, 0)):
        set_kernels(lin.to(x.dtype), {"gemv": knob})
        _, seen = OpNames.of(lambda: lin(x))
        assert not graphc_ops(seen) and any(s.split(".")[-1] in ("mm", "addmm") for s in seen), seen
        lin.to(torch.bfloat16)


def test_a_few_rows_linear_takes_gemm_rows_up_to_its_knob():
    """layers.Linear with gemm_rows=4, bf16 on meta: 2 to 4 rows (in any leading shape) are one graphc.gemm_rows
    writing [.., N], rows of a wider tensor read where they lie; one row stays gemv's (with gemv on) or cuBLAS's;
    5 rows, fp32, or the knob at 0 go to aten's mm/addmm and no graphc operator."""
    from models.components.layers import Linear

    with torch.device("meta"):
        lin = Linear(32, 24, bias=True).to(torch.bfloat16)
        rows = {m: torch.empty(m, 1, 32, dtype=torch.bfloat16) for m in (1, 2, 4, 5)}
    for m in (2, 4):
        set_kernels(lin, {"gemm_rows": 4})
        y, seen = OpNames.of(lambda: lin(rows[m]))
        assert y.shape == (m, 1, 24) and y.dtype == torch.bfloat16
        assert graphc_ops(seen) == ["graphc.gemm_rows"], (m, seen)
        assert not any(s.split(".")[-1] in ("mm", "addmm", "linear") for s in seen), seen
    with torch.device("meta"):
        strided = torch.empty(3, 2, 32, dtype=torch.bfloat16)[:, 1]          # rows 64 apart: read in place, no copy
    _, seen = OpNames.of(lambda: lin(strided))
    assert graphc_ops(seen) == ["graphc.gemm_rows"] and not any("clone" in s or "copy" in s for s in seen), seen
    set_kernels(lin, {"gemm_rows": 4, "gemv": 1})
    assert graphc_ops(OpNames.of(lambda: lin(rows[1]))[1]) == ["graphc.gemv"]
    for x, knob in ((rows[5], 4), (rows[2].float(), 4), (rows[2], 0), (rows[1], 4)):
        set_kernels(lin.to(x.dtype), {"gemm_rows": knob})
        _, seen = OpNames.of(lambda: lin(x))
        assert not graphc_ops(seen) and any(s.split(".")[-1] in ("mm", "addmm") for s in seen), (x.shape, seen)
        lin.to(torch.bfloat16)


def test_with_norm_rows_a_few_rows_norm_rides_in_the_products_launch():
    """With gemm_rows=8 and norm_rows (fused norms, bf16 on meta), after_norm at 4 rows: a Linear's residual add, norm
    and product are one graphc.norm_gemm_rows; a SwiGLU's norm, gate_up product and activation one, then its down
    product's graphc.gemm_rows; the outputs shaped as the unfused path's. Without norm_rows, or at 9 rows (past
    gemm_rows), the norm launches apart (graphc.add_rms_norm) and no norm_gemm_rows runs."""
    from models.components.layers import Linear, RMSNorm, SwiGLU

    with torch.device("meta"):
        norm, lin, mlp = RMSNorm(32), Linear(32, 24, bias=True), SwiGLU(32, 48)
        for m in (norm, lin, mlp):
            m.to(torch.bfloat16)
        x4, d4 = (torch.empty(4, 1, 32, dtype=torch.bfloat16) for _ in range(2))
        x9, d9 = (torch.empty(9, 32, dtype=torch.bfloat16) for _ in range(2))
    knobs = {"fused_norms": 1, "gemm_rows": 8, "norm_rows": 1}
    for mod in (norm, lin, mlp):
        set_kernels(mod, knobs)
    (t, y), seen = OpNames.of(lambda: lin.after_norm(x4, d4, norm))
    assert graphc_ops(seen) == ["graphc.norm_gemm_rows"] and t.shape == x4.shape and y.shape == (4, 1, 24), seen
    (t, y), seen = OpNames.of(lambda: mlp.after_norm(x4, None, norm))
    assert graphc_ops(seen) == ["graphc.norm_gemm_rows", "graphc.gemm_rows"] and y.shape == (4, 1, 32), seen
    for mod, x, d, off in ((lin, x9, d9, {}), (lin, x4, d4, {"norm_rows": 0}), (mlp, x4, d4, {"norm_rows": 0})):
        for m in (norm, lin, mlp):
            set_kernels(m, knobs | off)
        ops = graphc_ops(OpNames.of(lambda: mod.after_norm(x, d, norm))[1])
        assert ops[0] == "graphc.add_rms_norm" and "graphc.norm_gemm_rows" not in ops, ops


def test_a_one_row_swiglu_takes_one_fused_product_and_activation():
    """layers.SwiGLU with gemv and gemv_swiglu (bytes), bf16 on meta: one row is one graphc.gemv_silu_mul writing
    [.., I] then the down product's graphc.gemv; without gemv_swiglu, or with a bound under the gate_up weight's
    3,072 bytes, the gate_up product and the activation are two (graphc.gemv, graphc.silu_mul); two rows, or gemv
    off (the gate_up product would not take the one-row kernel), never the fused operator."""
    from models.components.layers import SwiGLU

    with torch.device("meta"):
        mlp = SwiGLU(32, 24).to(torch.bfloat16)
        one, two = torch.empty(1, 1, 32, dtype=torch.bfloat16), torch.empty(2, 32, dtype=torch.bfloat16)
    knobs = {"gemv": 1, "gemv_swiglu": 3072, "fused_norms": 1}        # gate_up: 48 x 32 bf16 = 3,072 bytes
    set_kernels(mlp, knobs)
    y, seen = OpNames.of(lambda: mlp(one))
    assert y.shape == (1, 1, 32) and y.dtype == torch.bfloat16
    assert graphc_ops(seen) == ["graphc.gemv_silu_mul", "graphc.gemv"], seen
    for bound in (0, 3071):
        set_kernels(mlp, knobs | {"gemv_swiglu": bound})
        assert graphc_ops(OpNames.of(lambda: mlp(one))[1]) == ["graphc.gemv", "graphc.silu_mul", "graphc.gemv"]
    for x, ks in ((two, knobs), (one, knobs | {"gemv": 0})):
        set_kernels(mlp, ks)
        assert "graphc.gemv_silu_mul" not in graphc_ops(OpNames.of(lambda: mlp(x))[1])


def test_normed_q_and_k_and_v_land_in_the_frame_cache_in_place_where_its_rows_allow():
    """The code predictor's layers write q, k and v straight into their frame-cache slots (FrameAttend.qkv_out):
    with the norms fused (bf16, meta) one graphc.q_k_norm_rope, which also copies v, and no copy where the slots'
    rows take one stride (one slot of S sequences, or two slots of one), the kernel then copies where they
    cannot (two slots of two sequences: q, k and v); without the knob (CPU, fp32) the torch path's results and
    v are copied into the slots and equal a plain call's."""
    from models.components.layers import RMSNorm, norm_rope_qk

    H, KV, D, G = 4, 2, 16, 6
    for s, n, copies in ((3, 1, 0), (1, 2, 0), (2, 2, 3)):
        with torch.device("meta"):
            qn, kn = RMSNorm(D).to(torch.bfloat16), RMSNorm(D).to(torch.bfloat16)
            q = torch.empty(s, n, H, D, dtype=torch.bfloat16)
            k, v = (torch.empty(s, n, KV, D, dtype=torch.bfloat16) for _ in range(2))
            cq = torch.empty(s, G, H, D, dtype=torch.bfloat16)
            ck, cv = (torch.empty(s, G, KV, D, dtype=torch.bfloat16) for _ in range(2))
            cos = sin = torch.empty(n, 1, D, dtype=torch.bfloat16)
        set_kernels(qn, {"fused_norms": 1})
        set_kernels(kn, {"fused_norms": 1})
        out = (cq[:, 1:1 + n], ck[:, 1:1 + n], cv[:, 1:1 + n])
        got, seen = OpNames.of(lambda: norm_rope_qk(qn, kn, q, k, cos, sin, out, v))
        assert got is out
        assert graphc_ops(seen) == ["graphc.q_k_norm_rope"], seen
        assert sum(x.endswith("copy_") for x in seen) == copies, (s, n, seen)
    torch.manual_seed(0)
    qn, kn = RMSNorm(D), RMSNorm(D)
    torch.nn.init.normal_(qn.weight, 1.0, 0.3)
    q, k, v = torch.randn(2, 1, H, D), torch.randn(2, 1, KV, D), torch.randn(2, 1, KV, D)
    cos, sin = torch.rand(1, 1, D), torch.rand(1, 1, D)
    cq, ck, cv = torch.zeros(2, G, H, D), torch.zeros(2, G, KV, D), torch.zeros(2, G, KV, D)
    want = norm_rope_qk(qn, kn, q, k, cos, sin)
    norm_rope_qk(qn, kn, q, k, cos, sin, (cq[:, 3:4], ck[:, 3:4], cv[:, 3:4]), v)
    assert torch.equal(cq[:, 3:4], want[0]) and torch.equal(ck[:, 3:4], want[1]) and torch.equal(cv[:, 3:4], v)
    assert not cq[:, :3].any() and not ck[:, 4:].any() and not cv[:, :3].any() and not cv[:, 4:].any()



CODE_PREDICTOR = dict(vocab_size=16, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8)


def test_the_code_predictors_residual_adds_run_inside_its_norms():
    """The code predictor's layers are FoldedLayers: with the norms fused (bf16, meta) a pass over its 3 layers
    runs no add of its own: the first layer's input norm is graphc.rms_norm, each later one's a
    graphc.add_rms_norm taking the layer before's last residual add, and the final norm one more taking the
    last layer's. On the CPU in fp32 the pass equals the same layers run as DecoderLayers, each adding its
    own residual, then the final norm of the last slot and the code's head."""
    from models.components.thinker import DecoderLayer
    from models.components.talker import FrameAttend, FrameCache

    cp, x, cos, sin, cache = _code_predictor_frame("meta", torch.bfloat16, 2)
    set_kernels(cp, {"fused_norms": 1})
    out, seen = OpNames.of(lambda: cp.run(x, slice(0, 2), cos, sin, cache, cp.lm_head[0]))
    assert out.shape == (2, 16)
    assert [o for o in graphc_ops(seen) if "norm" in o and "q_k" not in o] == \
        ["graphc.rms_norm", "graphc.add_rms_norm"] + ["graphc.add_rms_norm"] * 2 * 2 + ["graphc.add_rms_norm"]
    assert not any(o.split(".")[-1] == "add" for o in seen), seen
    cp, x, cos, sin, cache = _code_predictor_frame("cpu", torch.float32, 2)
    for p in cp.parameters():
        torch.nn.init.normal_(p, 0.0, 0.3)
    got = cp.run(x, slice(0, 2), cos, sin, cache, cp.lm_head[1])
    y, cache = x, FrameCache(cache.attn, cp.cfg, 2, 4, x)
    for i, layer in enumerate(cp.model.layers):
        y = DecoderLayer.forward(layer, y, None, cos[:2], sin[:2], FrameAttend(cache, i, slice(0, 2)))[0]
    want = cp.lm_head[1](cp.model.norm(y[:, -1]))
    assert torch.equal(got, want)


def test_with_norm_gemv_the_code_predictors_final_norm_runs_in_its_heads_launch():
    """At one row (a frame's later step, slot 2) with the norm_gemv knob (bf16, meta) a code predictor pass runs no
    norm launch: each layer's two norms ride in its q/k/v and gate_up launches, and the final norm, with the last
    layer's residual add, in the head's (graphc.norm_gemv 2 x 3 + 1 times); without the knob, the final add +
    norm then the head's gemv."""
    knobs = {"fused_norms": 1, "gemv": 1, "gemv_swiglu": 2**30}
    for knob, want in ((1, ["graphc.norm_gemv"] * 7), (0, ["graphc.rms_norm"] + ["graphc.add_rms_norm"] * 6)):
        cp, x, cos, sin, cache = _code_predictor_frame("meta", torch.bfloat16, 1, 1)
        set_kernels(cp, knobs | {"norm_gemv": knob})
        out, seen = OpNames.of(lambda: cp.run(x, slice(2, 3), cos, sin, cache, cp.lm_head[1]))
        ops = graphc_ops(seen)
        assert out.shape == (1, 16)
        assert [o for o in ops if "norm" in o and "q_k" not in o] == want, (knob, ops)
        assert ops[-1] == ("graphc.norm_gemv" if knob else "graphc.gemv"), ops


def test_with_select_fold_the_sampler_prepares_its_rows_and_writes_the_frames_embeddings():
    """On meta (bf16, the fused sampler): the code predictor given a frame buffer (the talker's select_fold knob)
    samples each of its 3 codes in one graphc.select_codes launch and runs no preparation of the sampling
    columns (RowParams' compares and selects), no embedding lookup and no stack of the embeddings (the codes'
    stack stays); without the buffer, RowParams' 4 compares and 3 selects, a lookup after each code and one
    stack more."""
    from models.components.talker import sampling_row

    runs = {}
    for frame in (True, False):
        cp, x, cos, sin, cache = _code_predictor_frame("meta", torch.bfloat16, 2)
        set_kernels(cp, {"fused_sampler": 1, "pdl": 1})
        params = torch.tensor([sampling_row(0.9, 50, 0.8, 1.05, 0.9, 50, 0.8)[4:]] * 2, device="meta")
        buf = torch.empty(2, 4, 32, device="meta", dtype=torch.bfloat16) if frame else None
        (codes, embeds), seen = OpNames.of(lambda: cp(x[:, 0], x[:, 1], cache.attn, params,
                                                      torch.empty(2, 3, 16, device="meta"), buf))
        assert codes.shape == (2, 3) and embeds.shape == (2, 3, 32)
        assert graphc_ops(seen).count("graphc.select_codes") == 3, seen
        runs[frame] = [sum(o.startswith(op) for o in seen) for op in ("aten.embedding", "aten.stack", "aten.gt",
                                                                       "aten.where")]
    assert runs == {True: [0, runs[False][1] - 1, 0, 0], False: [3, runs[False][1], 4, 3]}, runs


def _code_predictor_frame(device: str, dtype: torch.dtype, S: int, n: int = 2):
    """A 3-layer code predictor (CODE_PREDICTOR, 4 codes a frame) on device with n rows of its frame
    x [S, n, 32] (a frame's first step has two, the later ones one), rotary tables and frame cache (causal
    attention over each sequence's slots)."""
    from models.components.layers import rope_cos_sin, rope_inv_freq
    from models.components.talker import CodePredictor, CodePredictorConfig, FrameCache

    cfg, G = CodePredictorConfig(**CODE_PREDICTOR), 4
    torch.manual_seed(0)
    with torch.device(device):
        cp = CodePredictor(cfg, G).to(dtype)
        x = torch.randn(S, n, 32, dtype=dtype) if device == "cpu" else torch.empty(S, n, 32, dtype=dtype)
        cos, sin = rope_cos_sin(torch.arange(G), rope_inv_freq(8, 1e6), dtype)

        def attn(q, k, v):                     # causal attention over each sequence's G slots
            if device == "meta":
                return torch.empty(q.shape, dtype=dtype, device=q.device)
            qs, ks, vs = (t.view(S, G, -1, 8).transpose(1, 2) for t in (q, k, v))
            ks, vs = (t.repeat_interleave(2, dim=1) for t in (ks, vs))
            o = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=True)
            return o.transpose(1, 2).reshape(S * G, 4, 8)
        return cp, x, cos, sin, FrameCache(attn, cfg, S, G, x)


def test_the_vision_rotary_knob_runs_one_operator():
    """VisionAttention's fused_rope: on meta with the knob, q and k rotate in graphc.q_k_rope_f32 (no fp32 copies,
    cat or neg); without it, the torch path."""
    from models.components.vision import VisionAttention, VisionConfig
    from resources.ragged_attention import FakeRagged, RaggedAttentionSpec

    cfg = VisionConfig(depth=1, hidden_size=32, num_heads=4, intermediate_size=64, out_hidden_size=64,
                       num_position_embeddings=64, deepstack_visual_indexes=(0,))
    attn = FakeRagged(RaggedAttentionSpec(name="v", num_heads=4, head_dim=8, max_segment=8))    # runs 8 as it is
    with torch.device("meta"):
        att = VisionAttention(cfg).to(torch.bfloat16)
        x = torch.empty(6, 32, dtype=torch.bfloat16)
        cos = sin = torch.empty(6, 1, 8)
    assert set_kernels(att, {"fused_rope": 1}) == {"fused_rope"}
    out, ops = OpNames.of(lambda: att(x, cos, sin, attn))
    assert out.shape == (6, 32) and "graphc.q_k_rope_f32" in ops and "aten.cat" not in ops and "aten.neg" not in ops
    set_kernels(att, {})
    _, ops = OpNames.of(lambda: att(x, cos, sin, attn))
    assert "graphc.q_k_rope_f32" not in ops and "aten.cat" in ops


def test_the_vision_rotary_writes_the_padded_copies_an_attention_backend_runs():
    """Where the ragged backend runs the head dim zero-padded (FakeRagged, the simulation's stand-in for a
    FlashInfer backend at 72 -> 128), fused_rope's launch writes q, k and v at that width, so the backend pads
    nothing (no constant_pad_nd) and its output is the head dim's; the torch path still pads three times."""
    from models.components.vision import VisionAttention, VisionConfig
    from resources.ragged_attention import FakeRagged, RaggedAttentionSpec

    cfg = VisionConfig(depth=1, hidden_size=32, num_heads=4, intermediate_size=64, out_hidden_size=64,
                       num_position_embeddings=64, deepstack_visual_indexes=(0,))
    class Seen(FakeRagged):
        def __call__(self, q, k, v):
            widths.append((q.shape[-1], k.shape[-1], v.shape[-1]))
            return super().__call__(q, k, v)

    widths = []
    seen = Seen(RaggedAttentionSpec(name="v", num_heads=4, head_dim=8, max_segment=8), run_head_dim=16)
    with torch.device("meta"):
        att = VisionAttention(cfg).to(torch.bfloat16)
        x = torch.empty(6, 32, dtype=torch.bfloat16)
        cos = sin = torch.empty(6, 1, 8)
    set_kernels(att, {"fused_rope": 1})
    out, ops = OpNames.of(lambda: att(x, cos, sin, seen))
    assert out.shape == (6, 32) and widths == [(16, 16, 16)], widths
    assert ops.count("graphc.q_k_rope_f32") == 1 and "aten.constant_pad_nd" not in ops, ops
    set_kernels(att, {})
    out, ops = OpNames.of(lambda: att(x, cos, sin, seen))
    assert out.shape == (6, 32) and widths[1] == (8, 8, 8) and ops.count("aten.constant_pad_nd") == 3, ops


def test_the_vision_blocks_run_add_and_norm_as_one_and_gelu_in_the_gemm():
    """With fused_norms, every residual add of a vision block runs with the LayerNorm after it
    (graphc.add_layer_norm; the first block's norm1 alone as graphc.layer_norm), and with fused_gelu
    linear_fc1's bias and GELU run in the GEMM's epilogue (_addmm_activation, no gelu kernel); off, torch's
    LayerNorm, add and GELU, as HF runs them."""
    from models.components.vision import VisionConfig, VisionEncoder
    from resources.ragged_attention import FakeRagged, RaggedAttentionSpec

    cfg = VisionConfig(depth=3, hidden_size=32, num_heads=4, intermediate_size=64, out_hidden_size=64,
                       num_position_embeddings=64, deepstack_visual_indexes=(1,))
    attn = FakeRagged(RaggedAttentionSpec(name="v", num_heads=4, head_dim=8, max_segment=8))
    with torch.device("meta"):
        enc = VisionEncoder(cfg).to(torch.bfloat16)
        x = torch.empty(8, 32, dtype=torch.bfloat16)
        cos = sin = torch.empty(8, 1, 8)

    def blocks():
        delta = None
        for i, block in enumerate(enc.blocks):
            x_i, delta = block(x if i == 0 else x_i, delta, cos, sin, attn)
        return x_i + delta

    assert set_kernels(enc, {"fused_norms": 1, "fused_gelu": 1, "fused_rope": 1}) == {"fused_norms", "fused_gelu",
                                                                                   "fused_rope"}
    out, ops = OpNames.of(blocks)
    assert out.shape == (8, 32)
    # block 0: norm1 alone, then norm2 with the attention's add; blocks 1, 2: both norms with an add
    assert ops.count("graphc.layer_norm") == 1 and ops.count("graphc.add_layer_norm") == 5, ops
    assert ops.count("aten._addmm_activation") == 3 and "aten.gelu" not in ops, ops
    assert "aten.native_layer_norm" not in ops and ops.count("aten.add") == 1, ops     # the last delta's add
    set_kernels(enc, {})
    _, ops = OpNames.of(blocks)
    assert ops.count("aten.native_layer_norm") == 6 and ops.count("aten.gelu") == 3, ops
    assert not graphc_ops(ops) and "aten._addmm_activation" not in ops, ops


def test_the_simulation_sees_the_sm90_path_as_its_buffers_and_operators():
    """300 tokens routed to 2 of 8 experts with moe_sm90_from at 300: counts (5 blocks x E int32), the padded rows
    (max tiles x 128 int32: (600 + 127 x 8) // 128 = 12 tiles, the worst case of 7 experts with one pair each),
    the tiles' maps (2 x 12 + 1 int32), h [12 x 128, I] bf16, the unscaled pairs [600, H] bf16, the kernel's
    scales [300, 2] fp32 and the output [300, H]; five graphc operators, by hand."""
    from graphc.modules import set_kernels as knobs

    T, k, E, H, I = 300, 2, 8, 32, 64
    ex, *inputs = _on_meta(T, k, E, H, I)
    knobs(ex, {"fused_max_tokens": T, "moe_sm90_from": T})
    _, allocs, seen = _simulated(ex, *inputs)
    assert allocs == [5 * E * 4, 12 * 128 * 4, 25 * 4, 12 * 128 * I * 2, T * k * H * 2, T * k * 4, T * H * 2], allocs
    assert graphc_ops(seen) == ["graphc.moe_count", "graphc.moe_place_tiles", "graphc.moe_sm90_gate_up",
                                "graphc.moe_sm90_down", "graphc.moe_sum_add"]
    knobs(ex, {"fused_max_tokens": T, "moe_sm90_from": T + 1})      # one token short of the choice: Triton's
    _, _, seen = _simulated(ex, *inputs)
    assert "graphc.moe_sm90_gate_up" not in graphc_ops(seen) and "graphc.moe_gate_up" in graphc_ops(seen)


def test_a_boot_interleaves_the_experts_rows_where_the_plan_chose_the_sm90_kernels():
    """On the CPU boot of the tiny plan with the knob set on the thinker: its experts' gate_up_proj rows are
    interleaved 32 at a time (Experts.arrange_weights), the talker's are not, and the thinker's forward (torch's
    path on the CPU, reading the layout) gives each experts module's output of the boot without the knob."""
    from graphc.runtime.boot import boot_plan
    from models.components import moe_sm90

    plan = load_plan("plans/qwen3_omni_tiny_cpu.plan")
    (plain,) = boot_plan(plan, seed=0)
    plan.nodes["thinker"] = plan.nodes["thinker"].model_copy(update={"kernels": {"moe_sm90_from": 4}})
    (boot,) = boot_plan(plan, seed=0)
    mine = [m for m in boot.modules["thinker"].modules() if isinstance(m, Experts)]
    theirs = [m for m in plain.modules["thinker"].modules() if isinstance(m, Experts)]
    assert mine and {m.gate_up_layout for m in mine} == {moe_sm90.INTERLEAVE}
    assert {m.gate_up_layout for m in boot.modules["talker"].modules() if isinstance(m, Experts)} == {0}
    for a, b in zip(mine, theirs):
        w = b.gate_up_proj.detach()
        assert torch.equal(a.gate_up_proj.detach(), torch.stack([moe_sm90.interleave(w[e], 32) for e in range(len(w))]))
        x = torch.randn(5, w.shape[-1], dtype=w.dtype)
        ex = torch.tensor([[0, 1], [1, 2], [2, 0], [0, 3], [3, 1]]) % w.shape[0]
        wt = torch.rand(5, 2, dtype=w.dtype)
        with torch.no_grad():
            torch.testing.assert_close(a(x, ex, wt), b(x, ex, wt))
