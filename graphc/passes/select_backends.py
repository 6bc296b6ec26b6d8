"""Pick kernel backends per attention resource from the arch's capability table.

A paged KV resource gets one backend for prefill and mixed steps and one for decode steps; a
backend whose kernels do not take the resource's head dim runs it padded (capabilities.HEAD_DIMS).

Kernels that are not attention's, per node (graphc.modules.KERNEL_KNOBS, applied to whichever of the node's
modules declare them): a bf16 node on an sm_90 target runs its sparse MoE experts' steps of up to
FUSED_MAX_TOKENS tokens in the fused Triton kernels (models/components/moe_ops.py; tiled past 64 tokens),
grouped_mm above; measured on the H200 faster at every count from 1 to 16,384 tokens at the shapes of the
shipped MoE models' two autoregressive nodes (docs/benchmarks.md), and not measured on other archs or above 16,384 tokens. Of those,
steps of SM90_FROM tokens or more run the experts' two GEMMs in FlashInfer's SM90 CuTe-DSL kernels
(models/components/moe_sm90.py, the moe_sm90_from knob; the boot interleaves gate_up_proj's rows for them):
one whole MoE layer on the H200 at 2,048 / 4,096 tokens, routing of random logits, the larger node 439 / 670 us
against the Triton kernels' 528 / 863, the smaller 126 / 202 against 148 / 231; with 8 experts favoured (+3 in
their logits) 532 / 747 against 522 / 821 and 158 / 216 against 161 / 231; below 2,048 tokens the smaller
was slower on them at every count measured but 65 tokens of skewed routing, and the larger at every
count but 1,024 tokens of random routing
(examples/bench/bench_moe_sm90.py, docs/data/moe_sm90_layer_h200_2026-12-02g.json). The same
nodes run their RMSNorms, residual add + RMSNorm and qk-norm + rotary embedding as one launch each
(models/components/norm_ops.py, the fused_norms knob), and their MoE routers' softmax, top-k and
renormalisation as one (moe_ops.fused_route, the fused_router knob), at every token count; and their linear
layers' one-row products in a weight-streaming Triton kernel (gemv_triton.py, the gemv knob; cuBLAS for more
rows); and an in-step sampler of codes in one launch per code (select_ops.py, the fused_sampler knob); and
the vision tower's fp32 rotary of q and k in one launch that also writes the zero-padded q, k and v its
attention kernel runs (norm_ops.q_k_rope_f32, the fused_rope knob), its LayerNorms with the residual add
before them (layers.LayerNorm under fused_norms) and its MLP's bias and GELU in cuBLASLt's GEMM epilogue (the
fused_gelu knob); and a gated attention's two zero-centred q/k norms and partial rotary in one launch
(norm_ops.zc_norm_partial_rope, the gated_rope knob: the 9B's decode on an H100 6.31 -> 6.11 ms at 1 sequence,
7.77 -> 7.54 at 16, 8.44 -> 8.17 at 32). Measured on the H200 (docs/benchmarks.md), the gated_rope knob on
an H100, not on other archs. Their Gated DeltaNet layers
run the delta rule on flash-linear-attention's Triton kernels where their linear_state resource's backend is
'fla' (resources/capabilities.py; delta_rule.fla_rule, the fla_gdn knob; its
parity at real shapes: tests/gpu/test_gated_deltanet_gpu.py); the compiler traces what those kernels allocate
(delta_rule.fla_allocations). There a decode step's rule runs in place on the state pool (gdn_triton.slot_decode,
the gdn_slots knob: 19.3 -> 12.0 ms for the 9B's 64-sequence decode on the H200).

The same sparse-MoE nodes run a decode step's router and the grouping of its token-expert pairs (at most 64 a
launch) in one launch (moe_route_group) and the experts' sum, the residual add and the next decoder layer's input
RMSNorm in one (moe_sum_norm): models/components/moe_edges_triton.py; a sparse-MoE decoder layer at one sequence
runs 9 launches of its own and 1 of attention (the triton paged decode). Measured on an H100 with a shipped one-80 GB MoE plan: its larger
node's decode 4.12 -> 4.01 ms at 1 sequence, equal at 16 and 64 (7.18, 22.93 ms), the smaller's 3.82 -> 3.76 ms.
The same nodes, and the dense bf16 sm_90 nodes, also run a gated shared expert's tail in the experts' sum launch
(moe_shared_sum), their Triton kernels with programmatic dependent launch (pdl: resources/pdl.py; each kernel
waits on the one before it inside its programs, so its launch overlaps that one's tail) and a dense layer's
one-row RMSNorms, with the residual add before each, in the programs of the product after them (norm_gemv:
layers.Linear.after_norm). On an H100, captured, seeded weights (examples/bench/ab_kernels.py --with; docs/
benchmarks.md), the one-80 GB MoE plan's larger node's decode at 1 sequence 3.217 -> 2.949 ms with pdl alone,
2.940 with all three, the smaller's 3.536 -> 2.912 and 2.876, equal at 16 sequences (15.15, 6.52 -> 6.45 ms);
a 1.7B dense LM plan's LM node 1.627 -> 1.583 ms at 1 sequence (pdl and norm_gemv), equal at 16 and 64. The
delta-rule nodes (below) run neither pdl nor norm_gemv (NOT_WITH_GDN): the 9B's decode with both was 6.007 ->
6.026 ms at 1 sequence, 7.110 -> 7.121 at 16, equal at 64. A codec decoder's dense transformer runs pdl and
norm_gemv too, not timed alone: its steps run many rows, where its Triton launches are the fused norms that
tests/gpu/test_pdl_gpu.py holds bit for bit with and without pdl. The same nodes fold a code-sampling node's row
preparation into its sampler (select_fold: the fused sampler's launch also prepares its rows' sampling columns and
writes its code's embedding into the frame's buffer, with pdl where the node has it): 765 -> 718 simulated kernel
launches in the one-80 GB plan's smaller node's step at 1 sequence, 1,355 -> 1,308 at 16 (examples/tools/
launch_ops.py --with select_fold); on an H100, captured, that node's decode 2.829 -> 2.810 ms at 1 sequence and
5.927 -> 5.752 at 16, the larger node's equal (2.931, 2.945; examples/bench/ab_kernels.py --with select_fold
--sampled). A node that samples no codes ignores the knob.
The same nodes, in steps of at least FRAME_ATTEND_SEQS sequences, run each code predictor layer's q/k norm,
rotary, frame-cache write and attention in one launch (frame_triton.py, the frame_attend knob; the cp_attn
resource's attention is then not called, and the frame cache is not zeroed): on an H100, captured, the one-80 GB
plan's smaller node's decode 4.538 -> 4.434 ms at 2 sequences, 5.009 -> 4.876 at 4, 5.756 -> 5.374 at 8, 5.754 ->
5.225 at 16, but 2.767 -> 2.881 at one (examples/bench/ab_kernels.py --with frame_attend --sampled).
The same nodes, the delta-rule nodes apart (not measured there), run a linear layer's steps of 2 to GEMM_ROWS rows
through one Triton launch that reads each weight row once and multiplies the rows on the tensor cores
(gemv_triton.gemm_rows, the gemm_rows knob), not cuBLAS: on an H100, captured, at 13 decode shapes of the one-80
GB plan's nodes and 2, 4, 8 and 16 rows, faster than cuBLAS in 51 of 52 cells (336.5 -> 304.8 us summed; the larger
node's qkv at 2 rows +0.7%), its lm_head 2-4% (examples/bench/bench_gemv.py --rows); the one-80 GB plan's
smaller node's decode 4.538 -> 4.008 ms at 2 sequences, 5.766 -> 4.942 at 16, 6.453 -> 6.097 at 32; with
frame_attend from 2 too, 3.769, 4.925 and 6.095 (ab_kernels.py --with frame_attend gemm_rows=32 --sampled). That
plan's T2S at 16 streams on the stream lane, with both on every node: RTF 0.140 -> 0.130 (examples/bench/
bench_speech.py --with gemm_rows=32 frame_attend=2, against the plan before them on the same machine).
The nodes whose delta rule runs on fla-core also run gdn_fused: the zero-centred RMSNorms (and a residual add
with one), the Gated DeltaNet's gates, its gated output norm and a decode step's conv on the conv state pool,
one Triton launch each (models/components/norm_ops.py, gdn_step_triton.py): the 9B's decode on an H100 9.04 -> 6.53 ms at 1 sequence,
11.89 -> 8.25 at 16, 14.49 -> 10.27 at 64 (examples/bench/ab_kernels.py --with KNOB; docs/benchmarks.md). It costs
the 9B's plans 0.94 GB of KV pages: with fewer fp32 temporaries before them, the allocator model places a
prefill layer's two 1 GiB blocks in a new segment (activations 2.96 -> 3.90 GB at 8,192 tokens). The same nodes
run an eager step's conv (many rows a sequence) on the conv state pool in place, two launches a layer
(norm_ops.gdn_conv_rows, the gdn_conv_rows knob), where torch's reference path gathers each row's window as an fp32
[T, K, C] tensor: the 9B's activations at 8,192 tokens 3.77 -> 1.66 GiB (+4,308 KV pages on the h100 plan); on
an H100, captured, a layer's conv of 8,192 rows 2,591 -> 572 us (examples/bench/bench_prefill_kernels.py --only
conv; its outputs within a bf16 ulp of torch's, the pool the same), and a round of 16 60 s clips 490 -> 514 tok/s
(examples/bench/bench_video.py, one round each; docs/benchmarks.md).

Of the fused experts' steps, those of at most PAIR_TOKENS tokens run a program per token-expert pair and no
grouping (models/components/moe_pairs_triton.py, the moe_pair_tokens knob; the router's launch then routes alone).
On an H100, one layer's experts with the residual, captured, random routing (examples/bench/bench_moe_pairs.py):
at the larger node's shape 35.9 -> 30.0 us at one token, 53.9 -> 48.0 at two, 104.4 -> 98.1 at four, 160.4 ->
154.5 at eight; the smaller's 14.9 -> 8.1, 17.2 -> 10.8, 22.8 -> 20.3, 41.1 -> 37.0. A shipped one-80 GB MoE
plan's captured decode (examples/bench/ab_kernels.py, seeded weights): the larger node 3.98 -> 3.55 ms at one
sequence, 4.58 -> 4.39 at two, but 4.88 -> 5.47 at four: seeded weights send a step's tokens to few experts (13
a layer at 16 sequences against 82 under uniform routing, docs/benchmarks.md), and the pairs read a shared expert
once each; the smaller node 3.75 -> 3.69, 5.02 -> 4.86, 5.33 -> 5.08. So two tokens, faster both ways.

The same bf16 sm_90 nodes run a one-row SwiGLU's gate_up product and its activation as one launch (gemv_triton.
gemv_silu_mul, the gemv_swiglu knob) where its gate_up weight holds at most GEMV_SWIGLU_BYTES: on the H200, captured,
MLPs of intermediate x hidden 3,072 x 1,024 (12.6 MB) 6.54 -> 5.46 us, 768 x 1,024 (3.1 MB) 3.89 -> 2.88 us,
768 x 2,048 (6.3 MB) 4.87 -> 3.92 us and 3,584 x 1,024 (14.7 MB) 6.98 -> 6.05 us, all bitwise the two launches'
output; 12,288 x 4,096 (201 MB) was slower (50.83 -> 54.14 us), so larger weights keep the two
(examples/bench/bench_gemv.py --swiglu, docs/data/h200_2026-12-06/swiglu.json).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from graphc.ir import IR
from resources import capabilities
from resources.linear_state import LinearStateSpec
from resources.paged_kv import PagedKVSpec


@dataclass(frozen=True)
class Choice:
    prefill: str
    decode: str
    head_dim: int | None        # the head dim the kernels run at (padded when it differs)
    why: str


FUSED_MAX_TOKENS = 16384
SM90_FROM = 2048
GEMV_SWIGLU_BYTES = 16 * 2**20
PAIR_TOKENS = 2
FRAME_ATTEND_SEQS = 2
GEMM_ROWS = 32
FUSED_ARCHS = ("sm_90",)
# norm_gemv and pdl measured no faster on the delta-rule nodes, gemm_rows not measured there (module docstring)
NOT_WITH_GDN = ("gemm_rows", "norm_gemv", "pdl")


@dataclass(frozen=True)
class Backends:
    chosen: dict[str, Choice]   # attention and linear_state resource -> its backends
    kernels: dict[str, dict[str, int]] = field(default_factory=dict)   # node -> kernel knobs (see above)

    def backend(self, resource: str, phase: str = "prefill") -> str:
        c = self.chosen[resource]
        return c.decode if phase == "decode" else c.prefill

    def check(self, ir: IR) -> None:
        for r in ir.model.resources:
            if r.is_attention:
                assert r.name in self.chosen, f"no backend for {r.name}"


def _why(requested: str, kind: str, arch: str, got: str, spec=None) -> str:
    head = f"requested '{requested}'" if requested != "auto" else "auto: first in preference order"
    order = capabilities.available(kind, arch)
    before = order[:order.index(got)] if got in order else order          # the backends auto passed over
    passed = [f"{b}: {why}" for b in before if (why := capabilities.unfit(spec, b))]
    return f"{head}; {arch} {kind} has {', '.join(order)}" + (f" ({'; '.join(passed)})" if passed else "")


def select_backends(ir: IR) -> Backends:
    chosen = {}
    arch, target = ir.target.arch, ir.target.name
    for r in ir.model.resources:
        if isinstance(r, LinearStateSpec):
            b, _ = capabilities.choose(r.kind, arch, r.backend, r.name, target, spec=r)
            chosen[r.name] = Choice(b, b, None, _why(r.backend, r.kind, arch, b, r))
        if not r.is_attention:
            continue
        head_dim = r.head_dim
        paged = isinstance(r, PagedKVSpec)
        prefill, runs = capabilities.choose(r.kind, arch, r.backend, r.name, target, head_dim, pad=not paged,
                                            spec=r)
        why = _why(r.backend, r.kind, arch, prefill, r)
        decode = prefill
        if paged:
            decode, _ = capabilities.choose("paged_kv_decode", arch, r.decode_backend, r.name, target, head_dim,
                                            field="decode_backend", pad=False, spec=r)
            why += f"; decode: {_why(r.decode_backend, 'paged_kv_decode', arch, decode, r)}"
        if runs is not None and runs != head_dim:
            why += f"; {prefill} takes no head_dim {head_dim}: runs zero-padded to {runs}"
        chosen[r.name] = Choice(prefill, decode, runs, why)
    knobs = {"frame_attend": FRAME_ATTEND_SEQS, "fused_gelu": 1, "fused_max_tokens": FUSED_MAX_TOKENS,
             "fused_norms": 1, "fused_rope": 1, "fused_router": 1, "fused_sampler": 1, "gated_rope": 1,
             "gemm_rows": GEMM_ROWS, "gemv": 1, "gemv_swiglu": GEMV_SWIGLU_BYTES, "moe_pair_tokens": PAIR_TOKENS, "moe_route_group": 1,
             "moe_shared_sum": 1, "moe_sm90_from": SM90_FROM, "moe_sum_norm": 1, "norm_gemv": 1, "pdl": 1,
             "select_fold": 1}
    kernels = {n.name: dict(knobs) for n in ir.model.nodes if arch in FUSED_ARCHS and n.dtype == "bfloat16"}
    for n in ir.model.nodes:        # the delta rule on fla-core where its state resource's backend is fla,
        if any(res in chosen and chosen[res].prefill == "fla" for res in n.resources.values()):   # decode in place
            gdn = {"fla_gdn": 1, "gdn_conv_rows": 1, "gdn_fused": 1, "gdn_slots": 1}
            rest = {k: v for k, v in kernels.get(n.name, {}).items() if k not in NOT_WITH_GDN}
            kernels[n.name] = dict(sorted((rest | gdn).items()))
    out = Backends(chosen, kernels)
    out.check(ir)
    return out
