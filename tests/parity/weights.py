"""Shared helpers of the parity tests: random weights for an HF reference model, the norms' epsilons, and the
bf16 tolerance rule.

HF's init leaves RMSNorm/LayerNorm weights at 1, biases at 0, LayerScale at 0.01 and the MoE experts empty:
a graphc node that uses the wrong norm, swaps two norms or drops a bias still matches such a model. Every
parity test therefore re-draws every parameter of the HF model with `randomize` before HF saves it and
graphc loads it. In bf16, graphc's node is held to HF's own bf16 error against fp32 (`assert_bf16_close`);
the MoE router's top-k choice in bf16 has its own block test (`check_moe_block_bf16`).
"""
from __future__ import annotations

import copy
import math
from collections.abc import Callable

import torch
from torch import nn

from graphc.runtime.checkpoint import TensorShards, load_weights

from tests.conftest import rel


def randomize(model: nn.Module, seed: int = 0, gain: float | Callable[[str], float] = 1.0, bias_std: float = 0.02,
              scale_std: float = 0.1, bf16_exact: bool = False) -> nn.Module:
    """Re-draw every parameter of model in place from torch.Generator().manual_seed(seed), in
    named_parameters order:
      matrices, convolution kernels, embeddings, fused experts: N(0, 1) * gain(name) / sqrt(fan_in)
        (fan_in: a convolution's weight[0].numel(), else the last dim: in_features, hidden for embeddings
        and for the experts' [E, out, in] tensors);
      norm weights (any module whose class name holds 'Norm'), LayerScale .scale, ConvNeXt .gamma: 1 + scale_std * N;
      SnakeBeta's log-scale .alpha / .beta: 0.1 * N;
      biases (norm biases included): bias_std * N.
    Any other parameter is an error, so a new kind of tensor is never left at its init.
    bf16_exact rounds every value to bfloat16 precision (kept in the model's dtype): an fp32 model then
    holds exactly the weights its bf16 copy holds, so a bf16 run differs from it by arithmetic alone.
    """
    g = torch.Generator().manual_seed(seed)
    gain_of = gain if callable(gain) else (lambda name, c=float(gain): c)
    kinds = {}
    for mod_name, mod in model.named_modules():
        cls = type(mod).__name__
        for p_name, p in mod.named_parameters(recurse=False):
            if p.dim() >= 2:
                kind = "conv" if isinstance(mod, nn.modules.conv._ConvNd) else "matrix"
            elif "Norm" in cls:
                kind = "scale" if p_name == "weight" else "bias" if p_name == "bias" else None
            elif p_name in ("scale", "gamma"):
                kind = "scale"
            elif p_name in ("alpha", "beta") and "Snake" in cls:
                kind = "log_scale"
            elif p_name == "bias":
                kind = "bias"
            else:
                kind = None
            if kind is None:
                raise ValueError(f"randomize: no rule for {cls} parameter {mod_name}.{p_name} {tuple(p.shape)}")
            kinds.setdefault(id(p), kind)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            kind = kinds[id(p)]
            if kind in ("conv", "matrix"):
                fan_in = p[0].numel() if kind == "conv" else p.shape[-1]
                value = noise * gain_of(name) / math.sqrt(fan_in)
            elif kind == "scale":
                value = 1 + scale_std * noise
            elif kind == "log_scale":
                value = 0.1 * noise
            else:
                value = bias_std * noise
            if bf16_exact:
                value = value.bfloat16().float()
            p.copy_(value)
    return model



def _eps(module: nn.Module) -> float | None:
    for attr in ("eps", "variance_epsilon"):            # torch's LayerNorm and graphc's RMSNorm; HF's RMSNorms
        value = getattr(module, attr, None)
        if isinstance(value, float):
            return value
    return None


def assert_norm_eps_match(ours: nn.Module, hf: nn.Module, hf_name: Callable[[str], str] = lambda name: name) -> int:
    """Every norm of graphc's node has the epsilon of HF's module of the same name (hf_name maps graphc's module
    names onto HF's); returns how many norms were compared. A wrong epsilon moves outputs by about
    (eps difference) / (variance of the norm's input): ~1e-6 at these models' O(1) activations, under the fp32
    tolerance, so the value itself is compared."""
    theirs = dict(hf.named_modules())
    norms = [(name, module) for name, module in ours.named_modules() if "Norm" in type(module).__name__]
    assert norms, f"no norms in {type(ours).__name__}"
    for name, module in norms:
        assert hf_name(name) in theirs, f"HF has no module {hf_name(name)} (graphc's {name})"
        want = _eps(theirs[hf_name(name)])
        assert want is not None and _eps(module) == want, f"{name}: eps {_eps(module)}, HF's {want}"
    return len(norms)

def bf16(module: nn.Module) -> nn.Module:
    """A bfloat16 copy of module (the fp32 original is kept as the reference)."""
    return copy.deepcopy(module).to(torch.bfloat16)


def route_to_all_experts(model: nn.Module) -> nn.Module:
    """Set every MoE router of model (HF's TopKRouter or graphc's SparseMoE) to pick all its experts; returns model.

    For the bf16 node tests: with top-k < E, a row whose k-th and (k+1)-th logits lie closer than the two runs'
    rounding differences (~1% of the logits' spread: scale does not help) picks another expert in one run than in
    the other, an O(1) difference on that row. With 8 experts, top 3, 2-3 layers and 30-60 rows, expect about
    one such row per run (and as many against fp32, in HF's run and graphc's independently): the error then
    counts swaps, not rounding. Measured with top-3: one swapped row made the talker's graphc error 2.4 x HF's,
    and the thinker's logits errors rose from 0.009 to 0.047 in both runs. Routed to all experts, the node's
    bf16 path stays the same ops minus that coin flip; the top-k choice in bf16 is the MoE block tests' job."""
    routers = [m for m in model.modules() if isinstance(getattr(m, "top_k", None), int)]
    assert routers, f"no MoE router in {type(model).__name__}"
    for module in routers:
        module.top_k = module.experts.num_experts if hasattr(module, "experts") else module.num_experts
    return model


# The bf16 rule. A bf16 run differs from the fp32 reference by rounding; HF's own bf16 run of the same model,
# same weights (bf16-exact, see randomize) and same inputs measures how much rounding this model and these
# inputs produce: e_hf = rel(hf_bf16, hf_fp32). graphc's bf16 node must stay within
#     e_graphc = rel(graphc_bf16, hf_fp32) <= BF16_K * e_hf + BF16_FLOOR.
# graphc computes the same ops as HF, in places in another order (paged SDPA per sequence, fused sums), so its
# rounding is of the same size but not the same draw. Measured e_graphc / e_hf (transformers 5.24, torch 2.13,
# CPU; per-test numbers in the tests): 0.90-1.05 on the dense, thinker and talker nodes over 4 weight seeds,
# exactly 1.00 on the MoE blocks and their router weights (same ops, same order). BF16_K = 1.5 leaves 40% above
# the worst of those and fails what adds rounding of its own: a router that casts its top-k probabilities to
# bf16 before renormalising (two extra roundings) measures 1.72-1.86 x HF on the router weights, a bf16 softmax
# 1.73-1.86 x plus expert swaps. A node that rounds *less* than HF (e.g. an RMSNorm scaling in fp32 before its
# cast) passes: the rule bounds error, not difference. BF16_FLOOR is the fp32 parity bound: it only matters for
# outputs HF reproduces exactly in bf16 (e_hf = 0, the thinker's spliced embeddings), which may then still
# differ from fp32 by what the fp32 tests allow.
BF16_K = 1.5
BF16_FLOOR = 1e-5


def assert_bf16_close(ours_bf16: torch.Tensor, hf_bf16: torch.Tensor, hf_fp32: torch.Tensor, what: str = "",
                      k: float = BF16_K, floor: float = BF16_FLOOR) -> tuple[float, float]:
    """rel(ours_bf16, hf_fp32) <= k * rel(hf_bf16, hf_fp32) + floor; returns (graphc error, HF error)."""
    ours, hf = rel(ours_bf16, hf_fp32), rel(hf_bf16, hf_fp32)
    assert ours <= k * hf + floor, \
        f"{what}: rel(graphc bf16, fp32) {ours:.3g} > {k} x rel(HF bf16, fp32) {hf:.3g} + {floor}"
    return ours, hf


# The router's softmax must run in fp32 (HF: softmax(dtype=float), top-k, renormalise, then cast). A softmax
# taken in bf16 keeps 8 bits of each probability: experts whose logits lie within ~0.004-0.008 of each other tie,
# and top-k then picks by index instead of by logit. With routers drawn at unit gain (logits ~1 wide, as in the
# node tests) such near-ties are rare and the mutant hides in the rounding; the MoE block tests draw the router
# narrow, logits ~0.05 wide, so that a bf16 softmax swaps an expert on 8-14% of the rows (20-35 of 256 measured),
# while HF's own bf16 routing (logits rounded to bf16, ~1e-4 apart at that size) departs from fp32's on 0 or 1.
ROUTER_GAIN = 0.05


def check_moe_block_bf16(hf_block: nn.Module, ours_block: nn.Module, rows: int = 256, seed: int = 0,
                         device: str = "cpu", kernels: dict[str, int] | None = None, one_row: bool = False,
                         exact_routing: bool = True) -> dict[str, tuple[float, float]]:
    """HF's sparse MoE block against graphc's SparseMoE on one input, fp32 and bf16: weights re-drawn bf16-exact
    (router at ROUTER_GAIN) and copied to ours by name, input rows bf16-exact. Asserts fp32 parity; in bf16 the
    same experts as HF's router on every row; then the bf16 rule for the router weights and the block output
    on the rows where HF's bf16 router picks the experts HF's fp32 router picks (a row HF itself routes
    elsewhere in bf16 measures that swap, not rounding, and its O(1) error would hide a node's own swaps).
    device: where the blocks run; kernels: the plan's kernel choices for graphc's bf16 block
    (graphc.modules.set_kernels); one_row: graphc's bf16 output taken a row a call, as decode steps run it;
    exact_routing False: graphc's experts need only be HF's as a set (on CUDA torch.topk orders equal
    probabilities as it likes, and the narrow router's bf16 logits tie often), rows whose set differs are left
    out as HF's swaps are, and counted. Returns {"router": (graphc error, HF error), "output": (...),
    "rows": (rows measured, rows where graphc's experts are not HF bf16's)}."""
    hf_block, ours_block = copy.deepcopy(hf_block).eval(), copy.deepcopy(ours_block).eval()
    randomize(hf_block, seed, gain=lambda name: ROUTER_GAIN if name == "gate.weight" else 1.0, bf16_exact=True)
    load_weights(ours_block, TensorShards(hf_block.state_dict()))       # HF's names, stacked as a checkpoint's
    num_experts, hidden = ours_block.gate.out_features, ours_block.gate.in_features
    x = torch.randn(rows, hidden, generator=torch.Generator().manual_seed(seed)).bfloat16().to(device)
    hf_block, ours_block = hf_block.to(device), ours_block.to(device)
    hf16, ours16 = bf16(hf_block), bf16(ours_block)
    if kernels:
        from graphc.modules import set_kernels
        set_kernels(ours16, kernels)

    def dense(experts, weights):     # [N, k] choices -> [N, E] weights
        return torch.zeros(len(experts), num_experts, device=device).scatter(1, experts, weights.float())

    with torch.no_grad():
        assert rel(ours_block(x.float()), hf_block(x.float()[None])[0]) < 1e-5
        _, w32, e32 = hf_block.gate(x.float())
        _, w16, e16 = hf16.gate(x)
        our_e, our_w = ours16.route(x)
        same = (our_e.sort(-1).values == e16.sort(-1).values).all(-1)
        if exact_routing:
            assert torch.equal(our_e, e16), f"graphc's bf16 router picks other experts than HF's on " \
                                            f"{int((our_e != e16).any(-1).sum())} of {rows} rows"
        agree = (e16.sort(-1).values == e32.sort(-1).values).all(-1) & same
        assert agree.sum() >= 0.9 * rows
        router = assert_bf16_close(dense(our_e, our_w)[agree], dense(e16, w16)[agree], dense(e32, w32)[agree],
                                   "router weights")
        x = x[agree]
        got = torch.cat([ours16(row[None]) for row in x]) if one_row else ours16(x)
        output = assert_bf16_close(got, hf16(x[None])[0], hf_block(x.float()[None])[0], "MoE block output")
    return {"router": router, "output": output, "rows": (int(agree.sum()), int((~same).sum()))}
