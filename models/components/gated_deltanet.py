"""Gated DeltaNet linear attention (Qwen3.5's three of every four decoder layers) over packed sequences,
each carrying its conv and recurrent state in a slot of a linear_state resource.

One step holds any mix of prefill chunks (a first chunk, or one continuing from the slot's state) and
decode rows; each sequence reads its slot and writes it back in place. Weight names follow the checkpoint
(`...layers.{i}.linear_attn.`): in_proj_qkv [2 key_dim + value_dim, hidden] (rows q|k|v), in_proj_z
[value_dim, hidden], in_proj_b and in_proj_a [HV, hidden] (stacked at load, in that order, into one
projection, in_proj_qkvzba: one GEMM a layer on a GPU, where there were four), conv1d.weight [conv_dim, 1, K]
(no bias), dt_bias and A_log [HV], norm.weight [dv] (plain, not 1 + w) and out_proj [hidden, value_dim]. The
core runs in plain torch (delta_rule.py), or on flash-linear-attention's kernels on CUDA where the plan's fla_gdn knob
says so (delta_rule.fla_rule); with the gdn_slots knob a decode step's rule runs on the state pool in place
(gdn_triton.slot_decode, CUDA). With the gdn_fused knob the gates, a decode step's conv on the conv state pool in
place and the gated output norm are one launch each (norm_ops.py: gdn_gates, gdn_conv_row, gated_rms_norm), on
bf16 rows on a GPU. With the gdn_conv_rows knob a step of many-row sequences runs its conv on the pool in place
(norm_ops.gdn_conv_rows, two launches; graphc/passes/select_backends.py gives its measure).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from models.components import norm_ops
from models.components.delta_rule import causal_conv, fla_rule, gated_delta_rule, one_row, prepare_qk, read_slots
from models.components.gated_deltanet_config import GatedDeltaNetConfig
from models.components.layers import Linear, RMSNorm

if TYPE_CHECKING:
    from resources.linear_state import StateStep


class GatedRMSNorm(RMSNorm):
    """weight * rmsnorm(x) * silu(gate) over each head's last dim: RMSNorm's, then the gate, in gate's dtype (HF's
    Qwen3_5RMSNormGated). x: rows in gate's dtype, or the core's fp32 output, rounded to it first. Under the
    gdn_fused knob (takes) one launch (norm_ops.gated_rms_norm), which reads the rows as they are (fp32 or bf16)."""

    gdn_fused: int = 0        # the plan's knob (graphc/modules.py KERNEL_KNOBS)

    def takes(self, x: torch.Tensor) -> bool:
        """Whether a layer whose rows are x's (its input) runs this norm fused."""
        return (bool(self.gdn_fused) and x.dtype == torch.bfloat16 and self.weight.dtype == x.dtype
                and norm_ops.on_kernel_device(x))

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        if self.takes(gate) and x.shape == gate.shape and x.shape[-1] == self.weight.shape[0]:
            return norm_ops.gated_rms_norm(x, gate, self.weight, self.eps)
        x = x.to(gate.dtype)
        return (super().forward(x) * F.silu(gate.float())).to(x.dtype)


class GatedDeltaNet(nn.Module):
    """[T, hidden] -> [T, hidden] for the sequences of one step (state: its StateStep).

    layer: this layer's index among the linear-attention layers, i.e. into the state pool's layer axis.
    """

    STACKS = {"in_proj_qkvzba": ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")}   # read at load
    fla_gdn: int = 0          # the plan's knob: the delta rule on fla-core's kernels (CUDA)
    gdn_slots: int = 0        # the plan's knob: a decode step's rule on the state pool in place (CUDA, Triton)
    gdn_fused: int = 0        # the plan's knob: the gates, a decode step's conv (and the norms) one launch each
    gdn_conv_rows: int = 0    # the plan's knob: a many-row step's conv on the pool in place (two launches)

    def __init__(self, cfg: GatedDeltaNetConfig, layer: int):
        super().__init__()
        self.cfg, self.layer = cfg, layer
        self.hk, self.hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        self.dk, self.dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        self.widths = (cfg.conv_dim, cfg.value_dim, self.hv, self.hv)         # q|k|v, z, b, a
        self.in_proj_qkvzba = Linear(cfg.hidden_size, sum(self.widths), bias=False)
        self.conv1d = nn.Conv1d(cfg.conv_dim, cfg.conv_dim, cfg.linear_conv_kernel_dim, groups=cfg.conv_dim,
                                bias=False)   # holds the weight only: the conv runs in causal_conv
        self.dt_bias = nn.Parameter(torch.ones(self.hv))
        self.A_log = nn.Parameter(torch.zeros(self.hv))
        self.norm = GatedRMSNorm(self.dv, cfg.rms_norm_eps)
        self.out_proj = Linear(cfg.value_dim, cfg.hidden_size, bias=False)

    @staticmethod
    def fla_device(x: torch.Tensor) -> bool:
        """Whether fla-core's kernels can take x: on a GPU, and on meta (the compiler's trace of their memory)."""
        return x.is_cuda or x.is_meta

    @staticmethod
    def one_gemm(x: torch.Tensor) -> bool:
        """Whether project() runs one GEMM for x's rows: on a GPU and in the compiler's trace."""
        return x.is_cuda or x.is_meta

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """in_proj_qkv's, in_proj_z's, in_proj_b's and in_proj_a's rows of x: on a GPU (and in the compiler's
        trace) column views of one GEMM (one gemv at one row, under the plan's knob); on a CPU four products,
        summed as HF's four projections sum (the fp32 parity the tests hold to 1e-5 sees the order)."""
        if self.one_gemm(x):
            return self.in_proj_qkvzba(x).split(self.widths, dim=-1)
        return tuple(F.linear(x, part) for part in self.in_proj_qkvzba.weight.split(self.widths, dim=0))

    def fused(self, x: torch.Tensor) -> bool:
        """Whether the gdn_fused kernels take this layer's rows x (bf16 on a kernel device)."""
        return bool(self.gdn_fused) and x.dtype == torch.bfloat16 and norm_ops.on_kernel_device(x)

    def conv(self, qkv: torch.Tensor, state: StateStep) -> torch.Tensor:
        """The conv over q|k|v rows [T, conv_dim]; each sequence's window is read from and written to its slot."""
        pool = state.conv(self.layer)                                        # [slots, conv_dim, K-1]
        if self.fused(qkv) and one_row(state.cu_seqlens):                    # in place on the pool
            return norm_ops.gdn_conv_row(qkv, self.conv1d.weight[:, 0], pool, state.slots, state.has_state)
        if self.gdn_conv_rows and norm_ops.on_kernel_device(qkv) and not one_row(state.cu_seqlens):   # eager
            return norm_ops.gdn_conv_rows(qkv, self.conv1d.weight[:, 0], pool, state.slots, state.has_state,
                                          state.row_sequences(), state.cu_tensors()[1])
        windows = read_slots(pool, state.slots, state.has_state)
        y, new = causal_conv(qkv, self.conv1d.weight[:, 0], windows, state.cu_seqlens)
        pool.index_copy_(0, state.slots, new.to(pool.dtype))
        return y

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
             state: StateStep) -> torch.Tensor:
        """The delta rule from each sequence's slot state, written back in place: o [T, HV, dv], fp32 (v's dtype
        from fla-core's chunked and recurrent kernels)."""
        pool = state.recurrent(self.layer)                                   # [slots, HV, dk, dv]
        if self.gdn_slots and (q.is_cuda or q.is_meta) and one_row(state.cu_seqlens):
            return self.slot_core(q, k, v, g, beta, pool, state)
        s0 = read_slots(pool, state.slots, state.has_state).float()
        if self.fla_gdn and self.fla_device(q):
            cu_t = None if q.is_meta or one_row(state.cu_seqlens) else state.cu_tensors()
            o, s1 = fla_rule(q, k, v, g, beta, s0, state.cu_seqlens, cu_t)
        else:
            q, k = prepare_qk(q, k, self.hv // self.hk)
            o, s1 = gated_delta_rule(q, k, v, g, beta, s0, state.cu_seqlens)
        pool.index_copy_(0, state.slots, s1.to(pool.dtype))
        return o

    def slot_core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                  pool: torch.Tensor, state: StateStep) -> torch.Tensor:
        """core() of a decode step on the pool in place (gdn_triton.slot_decode): o [N, HV, dv] fp32, its one
        allocation (on meta: what the compiler's trace records)."""
        if q.is_meta:
            return torch.empty(q.shape[0], self.hv, self.dv, dtype=torch.float32, device=q.device)
        from models.components.gdn_triton import slot_decode

        return slot_decode(q, k, v, g.contiguous(), beta.contiguous(), pool, state.slots, state.has_state)

    def gates(self, b: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(beta [T, HV] in b's dtype, g [T, HV] the log decay in fp32) of in_proj_b's and in_proj_a's rows."""
        if self.fused(b):
            return norm_ops.gdn_gates(b, a, self.A_log, self.dt_bias)
        beta = b.sigmoid()
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias.float())
        return beta, g

    def forward(self, x: torch.Tensor, state: StateStep) -> torch.Tensor:
        t = x.shape[0]
        if t != state.num_rows:
            raise ValueError(f"linear-attention layer {self.layer} got {t} rows for a step of {state.num_rows} "
                             f"(sequence lengths {state.seq_lens}): the step's rows and its StateStep must agree")
        qkv, z, b, a = self.project(x)
        qkv = self.conv(qkv, state)                                          # [T, conv_dim]
        kd = self.hk * self.dk
        q = qkv[:, :kd].view(t, self.hk, self.dk)
        k = qkv[:, kd:2 * kd].view(t, self.hk, self.dk)
        v = qkv[:, 2 * kd:].view(t, self.hv, self.dv)
        beta, g = self.gates(b, a)                                           # [T, HV] each
        o = self.core(q, k, v, g, beta, state)                               # [T, HV, dv]
        if not self.norm.takes(x):                                           # (the fused norm rounds it itself)
            o = o.to(x.dtype)
        o = self.norm(o, z.view(t, self.hv, self.dv))
        return self.out_proj(o.reshape(t, self.hv * self.dv))
