"""Sparse mixture-of-experts feed-forward (Qwen3-MoE style), as Qwen3-Omni's thinker and talker use it.

Router: gate.weight [E, H]; softmax in fp32 over all E experts, top-k, optionally renormalised, cast back
to the hidden dtype (HF's order of casts). Experts are fused in memory for grouped GEMM:
experts.gate_up_proj [E, 2I, H] (gate rows, then up rows; interleaved after boot where the plan runs the
SM90 kernels: Experts.arrange_weights) and experts.down_proj [E, H, I]; the checkpoint
loader fuses the on-disk per-expert tensors. Optional shared expert (the talker's): shared_expert.{gate,up,
down}_proj scaled by sigmoid(shared_expert_gate [1, H]).

Every shape is static for a given row count: the T*k token-expert pairs are sorted by expert and the
per-expert end offsets are found on device with searchsorted, so a step captures as one CUDA graph.
torch's grouped_mm runs bf16 (rows 16-byte aligned); its meta kernel takes bf16 only, so the compiler could
not trace it in fp32. Other dtypes (fp32 for exact parity on tiny models) gather each pair's expert weights
and run one batched matmul: same static shapes, [T*k, 2I, H] of gathered weights, for small models only.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from models.components.layers import Linear, RMSNorm, SwiGLU


class Experts(nn.Module):
    # a kernel choice the plan makes (graphc/passes/select_backends.py; set on the module at boot and in the
    # simulation): bf16 steps of at most this many tokens run the fused kernels (moe_ops.py) on a GPU (and
    # on meta tensors, where the compiler traces them); 0: never
    fused_max_tokens: int = 0
    # another: of those, steps of at least this many tokens run their two GEMMs in FlashInfer's SM90 kernels
    # (moe_sm90.py), which read gate_up_proj's up and gate rows interleaved; 0: never
    moe_sm90_from: int = 0
    # how gate_up_proj's rows lie now (not a knob: the data's state): 0 gate's rows then up's (the checkpoint's
    # order), or up's and gate's this many at a time (moe_sm90.INTERLEAVE). arrange_weights() sets it.
    gate_up_layout: int = 0
    # a knob: with the fused kernels, add_norm's norm runs in the launch that sums the slots and adds the residual
    # (moe_ops.fused_experts_norm); 0: a launch of its own
    moe_sum_norm: int = 0
    # a knob: with the fused kernels, steps of at most this many tokens run a program per token-expert pair and no
    # grouping (moe_pairs_triton.py), below the grouped kernels; 0: never
    moe_pair_tokens: int = 0
    # a knob: the pair kernels and the slots' sum launched with programmatic dependent launch
    # (resources/pdl.py); 0: plain launches
    pdl: int = 0

    def __init__(self, num_experts: int, hidden: int, intermediate: int):
        super().__init__()
        self.num_experts = num_experts
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate, hidden))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, intermediate))

    def arrange_weights(self) -> None:
        """After the weights are loaded (in the checkpoint's order) and the plan's knobs set: lay gate_up_proj's
        rows out as the chosen kernels read them, in place, an expert at a time (one expert's copy extra)."""
        from models.components import moe_sm90

        want = moe_sm90.INTERLEAVE if self.moe_sm90_from else 0
        if want == self.gate_up_layout:
            return
        if want and self.gate_up_proj.device.type == "cuda" and (why := moe_sm90.available()):
            raise RuntimeError(f"the plan runs this node's MoE experts from {self.moe_sm90_from} tokens in "
                               f"FlashInfer's SM90 kernels, which cannot load here ({why}); install the "
                               f"gpu extra (flashinfer-python>=0.7.2 and its nvidia-cutlass-dsl)")
        if self.gate_up_proj.shape[1] % (2 * moe_sm90.INTERLEAVE):
            raise ValueError(f"Experts: intermediate size {self.gate_up_proj.shape[1] // 2} is not a multiple of "
                             f"{moe_sm90.INTERLEAVE}, which the SM90 kernels' interleaved rows need")
        with torch.no_grad():                   # the layouts are 0 and INTERLEAVE: one pass goes either way
            for w in self.gate_up_proj:
                w.copy_(moe_sm90.interleave(w, want))
        self.gate_up_layout = want

    def _gate_up(self, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x W1's columns [..., 2I] as (gate, up), in gate_up_proj's row layout."""
        if not self.gate_up_layout:
            gate, up = y.chunk(2, dim=-1)
            return gate, up
        v = y.unflatten(-1, (-1, 2, self.gate_up_layout))
        return v[..., 1, :].flatten(-2), v[..., 0, :].flatten(-2)

    def fused(self, x: torch.Tensor) -> bool:
        """Whether x's rows take the fused kernels (moe_ops.fused_experts)."""
        return x.dtype == torch.bfloat16 and x.shape[0] <= self.fused_max_tokens and x.device.type in ("cuda", "meta")

    def sums_norm(self, x: torch.Tensor, norm: RMSNorm) -> bool:
        """Whether add_norm runs norm in the launch that sums the slots (the moe_sum_norm knob, the fused kernels
        for x's rows, a fused layers.RMSNorm)."""
        return bool(self.moe_sum_norm and self.fused(x) and norm.fused(x) and type(norm).forward is RMSNorm.forward)

    def add_norm(self, x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor, residual: torch.Tensor,
                 norm: RMSNorm, grouped: tuple[torch.Tensor, torch.Tensor] | None = None,
                 shared: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(forward(...) with the residual, norm of it): norm is the next decoder layer's input RMSNorm (a
        layers.RMSNorm: w * rmsnorm(x)); with the moe_sum_norm knob, in the launch that sums the slots. shared: a
        gated shared expert's (rows [T, H], gate logits [T, 1]), sigmoid(gate) * rows added to the slots' sum before
        the residual (SparseMoE's order), in that launch too: only where sums_norm."""
        if self.sums_norm(x, norm):
            from models.components.moe_ops import fused_experts_norm
            return fused_experts_norm(x, self.gate_up_proj, self.down_proj, experts, weights, residual,
                                      (norm.weight, norm.eps) + (shared or ()), self.gate_up_layout,
                                      self.moe_sm90_from, grouped, self.moe_pair_tokens, bool(self.pdl))
        if shared is not None:
            raise ValueError("Experts.add_norm takes a shared expert's rows only where its sum runs the norm "
                             "(sums_norm): the moe_sum_norm knob, the fused kernels and a fused RMSNorm")
        y = self(x, experts, weights, residual, grouped)
        return y, norm(y)

    def forward(self, x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor,
                residual: torch.Tensor | None = None, grouped: tuple[torch.Tensor, torch.Tensor] | None = None
                ) -> torch.Tensor:
        """x [T, H], experts/weights [T, k] -> [T, H]: each row's k expert outputs, weighted and summed (and
        added to residual [T, H] where given: one launch with the sum where the kernels run). grouped: the pairs
        grouped by expert already (moe_ops.fused_route_group), for the fused kernels."""
        t, k = experts.shape
        if self.fused(x):
            from models.components.moe_ops import fused_experts
            return fused_experts(x, self.gate_up_proj, self.down_proj, experts, weights, residual,
                                 self.gate_up_layout, self.moe_sm90_from, grouped, self.moe_pair_tokens,
                                 bool(self.pdl))
        order, rows = torch.sort(experts.reshape(-1))                            # [T*k] pairs by expert
        ends = torch.searchsorted(order, torch.arange(1, self.num_experts + 1, device=x.device),
                                  out_int32=True)                                 # [E] end of each expert's rows
        xs = x.index_select(0, rows // k)                                        # [T*k, H]
        if x.dtype == torch.bfloat16:
            gate, up = self._gate_up(F.grouped_mm(xs, self.gate_up_proj.transpose(-2, -1), offs=ends))
            y = F.grouped_mm(F.silu(gate) * up, self.down_proj.transpose(-2, -1), offs=ends)   # [T*k, H]
        else:
            gate, up = self._gate_up(torch.bmm(self.gate_up_proj.index_select(0, order), xs[:, :, None])[:, :, 0])
            y = torch.bmm(self.down_proj.index_select(0, order), (F.silu(gate) * up)[:, :, None])[:, :, 0]
        y = y * weights.reshape(-1).index_select(0, rows)[:, None]
        pairs = torch.empty_like(y)
        pairs[rows] = y                                                          # back to (token, slot) order
        out = pairs.view(t, k, -1).sum(dim=1)
        return out if residual is None else residual + out


class SparseMoE(nn.Module):
    """Qwen3-MoE block: router + routed experts (+ a gated shared expert when shared_intermediate > 0)."""

    # a kernel choice the plan makes (select_backends; set at boot and in the simulation): 1 runs a bf16
    # router's softmax, top-k and renormalisation on a GPU (and on meta tensors) as one launch
    # (moe_ops.fused_route); among equal probabilities it takes the lowest expert; 0: torch's ops
    fused_router: int = 0
    # another (with fused_router and the fused experts): a step of at most moe_ops.ROUTE_GROUP_PAIRS token-expert
    # pairs has its router group the pairs by expert in the same launch (moe_ops.fused_route_group); 0: two launches
    moe_route_group: int = 0
    # another: the router's launch with programmatic dependent launch (resources/pdl.py); 0: a plain one
    pdl: int = 0
    # another (with the experts' moe_sum_norm): a gated shared expert's sigmoid, product and add to the slots' sum
    # ride in the launch that sums them, adds the residual and norms (Experts.add_norm's shared); 0: three launches
    # of their own, and the residual's add with the norm a fourth
    moe_shared_sum: int = 0

    def __init__(self, hidden: int, intermediate: int, num_experts: int, top_k: int, norm_topk_prob: bool,
                 shared_intermediate: int = 0):
        super().__init__()
        self.top_k, self.norm_topk_prob, self.shared = top_k, norm_topk_prob, shared_intermediate > 0
        self.gate = Linear(hidden, num_experts, bias=False)      # the router: the one-row kernel at one row
        self.experts = Experts(num_experts, hidden, intermediate)
        if self.shared:
            self.shared_expert = SwiGLU(hidden, shared_intermediate)
            self.shared_expert_gate = Linear(hidden, 1, bias=False)        # one row: the one-row kernel

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, H] -> (experts [T, k] int64, weights [T, k] in x's dtype)."""
        logits = self.gate(x)                                                    # [T, E]
        if self.fused_router and logits.dtype == torch.bfloat16 and logits.device.type in ("cuda", "meta"):
            from models.components.moe_ops import fused_route
            return fused_route(logits, self.top_k, self.norm_topk_prob, bool(self.pdl))
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return experts, weights.to(logits.dtype)

    def routed(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """route(x), and the pairs grouped by expert where the moe_route_group knob has the router group them in
        its launch (a step of few pairs on the fused grouped kernels below their SM90 ones), else None."""
        from models.components.moe_ops import ROUTE_GROUP_PAIRS

        t, ex = x.shape[0], self.experts
        if (self.moe_route_group and self.fused_router and ex.fused(x) and t * self.top_k <= ROUTE_GROUP_PAIRS
                and t > ex.moe_pair_tokens and not (ex.moe_sm90_from and t >= ex.moe_sm90_from)):
            from models.components.moe_ops import fused_route_group
            return fused_route_group(self.gate(x), self.top_k, self.norm_topk_prob, bool(self.pdl))
        return (*self.route(x), None)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """x [T, H] -> the block's output [T, H], plus residual where given (the decoder layer's add: without a
        shared expert it shares the experts' last launch)."""
        return self.add_norm(x, residual, None)[0]

    def add_norm(self, x: torch.Tensor, residual: torch.Tensor | None, norm: RMSNorm | None
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(forward(x, residual), norm of it where norm is given: the next decoder layer's input RMSNorm, in the
        launch that adds the residual where the kernels allow)."""
        if not self.shared:
            experts, weights, grouped = self.routed(x)
            if norm is not None and residual is not None:
                return self.experts.add_norm(x, experts, weights, residual, norm, grouped)
            y = self.experts(x, experts, weights, residual, grouped)
            return y, (None if norm is None else norm(y))
        # the gated shared expert is added to the routed experts' rounded sum (HF's order; a bf16 add commutes)
        # in the launch that sums the slots (with the residual's add and the next norm: the moe_shared_sum knob)
        if self.moe_shared_sum and norm is not None and residual is not None and self.experts.sums_norm(x, norm):
            rows, gate = self.shared_expert(x), self.shared_expert_gate(x)
            experts, weights, grouped = self.routed(x)
            return self.experts.add_norm(x, experts, weights, residual, norm, grouped, (rows, gate))
        shared = torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        experts, weights, grouped = self.routed(x)
        out = self.experts(x, experts, weights, shared, grouped)
        if residual is None:
            return out, (None if norm is None else norm(out))
        return (residual + out, None) if norm is None else norm.add(residual, out)
