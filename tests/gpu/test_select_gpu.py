"""The fused sampler (models/components/select_triton.py, through select_ops.fused_select) compiled on the GPU
at the talker's real shapes equals the torch path it replaces (talker.select, CUDA's stable radix sort and
all), row for row but where top-p's cumulative probability lies within TOL of its floor (the two sum in
different orders: tests/unit/test_select_triton.py says more): code 0 at V = 3072 with the repetition penalty
over seen and the codebook's suppression, fp32 logits; a residual code at V = 2048 on bf16 logits with its
draws a strided slice log_noise[:, 1 + j, :2048] of the step's [S, 16, 3072]; S = 1, 8, 32; greedy and
sampled rows mixed, filters off and on, ties across both thresholds. Also: quotients to the last bit (the
temperature's and the penalty's: IEEE division, not Triton's approximate `/`), -0.0 tied with +0.0 as CUB's
radix sort ties them, one launch a call, and a CUDA graph replays it. Skipped without CUDA."""
from __future__ import annotations

import pytest
import torch

from tests.unit.test_select_triton import REAL, compare, rounding_batch, talker_batch, zeros_batch

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("seqs", [1, 8, 32])
@pytest.mark.parametrize("code", ["code0", "residual"])
def test_fused_select_equals_the_torch_path(seqs, code):
    pytest.importorskip("triton")
    vocab, codebook, _ = REAL
    gen = torch.Generator().manual_seed(seqs)
    results = []
    for kind in ("ints", "bf16"):
        for j in (0, 7, 14):
            batch = talker_batch(gen, seqs, *REAL, code == "code0", kind, device="cuda", j=j)
            logits, log_noise = batch[0], batch[2]
            assert logits.shape == (seqs, vocab if code == "code0" else codebook)
            assert log_noise.stride(0) == 16 * vocab and log_noise.stride(1) == 1        # a strided slice
            results.append(compare(*batch))
    for c in results:
        assert c["shape"] == [seqs] and c["dtype"] == "torch.int64"
        assert set(c["bad"]) <= set(c["near"]), c                  # every disagreement is at top-p's boundary
    rows = sum(c["rows"] for c in results)
    near = sum(len(c["near"]) for c in results)
    # near rows are mostly exact hits (integer logits' kept sets often sum to 0.5 at floor 0.5): few in all
    assert near <= max(2, 0.1 * rows), (near, rows)
    if seqs == 32:                                                  # the cases meant are there
        total = {key: sum(c[key] for c in results) for key in ("greedy", "sampled", "raced", "k_tie", "p_split",
                                                                 "only_top")}
        assert min(total.values()) >= 10, total


@pytest.mark.parametrize("vocab", [2048, 3072])
def test_quotients_to_the_last_bit(vocab):
    """Neighbouring logits whose quotients by the temperature (1.7) or the penalty (1.3) round to one value, so
    the first id wins the tie, where a product with the reciprocal or an approximate division would not."""
    pytest.importorskip("triton")
    c = compare(*rounding_batch(vocab, "cuda"))
    assert c["codes"] == [3] * 8 and c["bad"] == [], c


@pytest.mark.parametrize("vocab, seqs", [(2048, 32), (3072, 8)])
def test_signed_zeros_tie_in_the_sort(vocab, seqs):
    """top-p's cut inside rows of -0.0 and +0.0: CUB's radix sort (torch.sort on CUDA) reads -0.0 as +0.0, so
    the zeros go by index; with -0.0 below +0.0 the torch path itself would pick other codes. If this fails on
    `codes != bit_order`, CUDA's sort orders -0.0 below +0.0 after all, and select_triton's key must too."""
    pytest.importorskip("triton")
    batch, below = zeros_batch(vocab, seqs, "cuda")
    from models.components.talker import select

    c = dict(compare(*batch), bit_order=select(below, *batch[1:]).tolist())
    assert c["codes"] != c["bit_order"], c
    assert set(c["bad"]) <= set(c["near"]) and len(c["near"]) <= seqs // 2, c


def test_one_launch_and_a_cuda_graph_replays_it():
    """fused_select launches one kernel (the parameters' casts and the column checks copy nothing at the
    talker's dtypes and layouts), and a CUDA graph of it replays to the eager codes."""
    pytest.importorskip("triton")
    from models.components.select_ops import fused_select

    gen = torch.Generator().manual_seed(7)
    args = talker_batch(gen, 32, *REAL, True, "ints", device="cuda")
    eager = fused_select(*args)                                     # compiles
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fused_select(*args)
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert len(kernels) == 1 and "select" in kernels[0], kernels
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fused_select(*args)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fused_select(*args)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)


@pytest.mark.parametrize("code", ["code0", "residual"])
def test_the_folded_launch_with_pdl_in_a_graph(code):
    """fused_select as the select_fold knob calls it (the sampling columns as given, select_ops.RawRows; an
    embedding table; pdl), captured after a kernel that writes its logits (a scale of a copy, so a launch that
    read them early would see the old ones), replayed over 8 batches of 32 rows: each replay's codes those of
    the plain call (RowParams, no table) on the same logits, and the rows (a row-strided slot of a [32, 16,
    1024] frame buffer) the table's rows of them; the rest of the buffer untouched."""
    pytest.importorskip("triton")
    from models.components.select_ops import RawRows, fused_select
    from models.components.talker import RowParams

    gen = torch.Generator().manual_seed(11)
    logits, _, log_noise, seen, suppress = talker_batch(gen, 32, *REAL, code == "code0", "bf16", device="cuda")
    v = logits.shape[1]
    raw = torch.tensor([[[0.0, 0.7, 1.3][i % 3], [0, 1, 2, 50, v, v + 7][i % 6], [0.0, 0.2, 0.9][i % 4 % 3],
                         [0.0, 1.05, 1.3, 0.8][i % 4]] for i in range(32)], device="cuda")[:, :4 if seen is not None
                                                                                            else 3]
    table = torch.randn(v, 1024, device="cuda").bfloat16()
    frame = torch.full((32, 16, 1024), float("nan"), device="cuda", dtype=torch.bfloat16)
    src, held = logits.clone(), torch.empty_like(logits)

    def step():
        torch.mul(src, 1.0, out=held)                                    # the kernel before, writing the logits
        return fused_select(held, RawRows(raw), log_noise, seen, suppress, (table, frame[:, 3]), pdl=True)
    step()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        codes = step()
    for i in range(8):
        src.copy_(talker_batch(gen, 32, *REAL, code == "code0", "bf16", device="cuda")[0])
        g.replay()
        torch.cuda.synchronize()
        want = fused_select(src, RowParams(raw, v), log_noise, seen, suppress)
        assert torch.equal(codes, want), i
        assert torch.equal(frame[:, 3], table[want]), i
    assert frame[:, [0, 1, 2, 4]].isnan().all()
