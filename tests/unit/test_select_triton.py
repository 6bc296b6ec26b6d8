"""The fused sampler (models/components/select_triton.py through select_ops.fused_select) under Triton's
interpreter on CPU equals the torch path it replaces (talker.select, itself equal to HF's processors in
tests/parity), row for row, on talker-like batches built as the talker builds them (sampling_row ->
RowParams; code 0 with the repetition penalty over seen and the codebook's suppression, a residual code
without; log_noise a strided slice of the step's draws): greedy and sampled rows mixed, top-k off and on
(k 1, k = V), top-p off and on (down to top_p 1e-4 and 0, which keep only the top id), logits drawn as small
integers or bf16 values so that ties straddle top-k's and top-p's thresholds, V not a power of two (37, 29,
3072), S = 1 and S > 1. Also: quotients to the last bit (rounding_batch: the temperature's and the
penalty's divisions are IEEE's), top-p's cut inside rows of signed zeros (zeros_batch: -0.0 ties +0.0 in the
sort), and a cumulative probability exactly equal to the floor (dropped).

Ties are the sort's, which on CUDA is stable (a radix sort: value, then index); torch.sort's CPU default is
not (std::sort), so here the torch path runs with stable=True, what the GPU does. One thing cannot match:
the softmax's and the cumulative sum's summation order, so where the torch path's cumulative probability lies
within a few ulp of top-p's floor the two can keep different ids. The rows compare exactly but those with a
cumulative probability within TOL of their floor, and every disagreement must be at such a row.
tests/gpu/test_select_gpu.py runs the same comparison compiled at the talker's real shapes."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

pytest.importorskip("triton", reason="the kernels are Triton's; pip install -e '.[test]' brings it")

from tests.unit.test_moe_triton import ROOT, interpreted  # noqa: E402

TOL = 1e-5
TEMPERATURES = [0.0, 0.5, 0.9, 1.0, 1.7]
TOP_P = [1.0, 0.95, 0.8, 0.5, 0.3, 0.05, 1e-4, 0.0]     # 0: floor 1, only the sort's last id stays
PENALTIES = [1.0, 1.05, 1.3, 0.8, 0.0]              # 0: a padding row's, read as 1


def talker_batch(gen: torch.Generator, s: int, vocab: int, codebook: int, eos: int, code0: bool, kind: str,
                 device: str = "cpu", j: int = 3):
    """A step's select inputs as the talker makes them: (logits [S, V], rows (RowParams), log_noise, seen,
    suppress); V = vocab for code 0, codebook for a residual code (the j-th). kind 'ints': fp32 logits of
    small integers (long ties; a third of the rows all negative); 'bf16': randn * 2.5 rounded to bf16 (ties
    where the values crowd) through a row-strided view, kept in bf16 for a residual code as the code
    predictor's heads give them. Row 0's logits are all equal, and row 1 draws E = 1 everywhere (its race is
    the argmax of the kept logits, ties and all)."""
    from models.components.talker import RowParams, log_draws, sampling_row

    v = vocab if code0 else codebook
    if kind == "ints":
        shift = torch.tensor([-8.0, 0.0, 3.0])[torch.randint(3, (s, 1), generator=gen)]  # some rows all negative
        logits = torch.randint(-4, 5, (s, v), generator=gen).float() + shift
    else:                                       # code 0's logits are fp32 (codec_head's, cast), the others bf16
        logits = (torch.randn(s, v + 5, generator=gen) * 2.5).bfloat16()
        logits = (logits.float() if code0 else logits)[:, :v]
    logits[0] = 1.0
    ks = [0, 1, 2, 5, 50, v - 1, v]
    pick = lambda xs: xs[int(torch.randint(len(xs), (1,), generator=gen))]  # noqa: E731
    sampling = torch.tensor([sampling_row(pick(TEMPERATURES), pick(ks), pick(TOP_P), pick(PENALTIES),
                                          pick(TEMPERATURES[1:]), pick(ks), pick(TOP_P)) for _ in range(s)])
    noise = torch.empty(s, 16, vocab).exponential_(generator=gen)
    noise[1:2] = 1.0
    seen = torch.rand(s, vocab, generator=gen) < 0.2
    suppress = torch.arange(vocab) >= codebook
    suppress[eos] = False
    logits, sampling, noise, seen, suppress = (t.to(device) for t in (logits, sampling, noise, seen, suppress))
    log_noise = log_draws(noise)                                           # [S, G, vocab], as Talker.forward
    if code0:
        return logits, RowParams(sampling[:, :4], v), log_noise[:, 0], seen, suppress
    return logits, RowParams(sampling[:, 4:], v), log_noise[:, 1:][:, j, :v], None, None


def rounding_batch(v: int, device: str = "cpu"):
    """Rows whose codes hang on the last bit of a quotient (select's inputs, code 0's layout, V = v): ids 3 and
    5 hold neighbouring fp32 values a < b whose quotients by the divisor round to one value (so id 3, the first
    of the tie, wins the argmax) while their products with the divisor's reciprocal do not (id 5 would win).
    Rows 0-3 sample at temperature 1.7 without filters on E = 1 (the race is the argmax of x / 1.7); rows 4-7
    are greedy with penalty 1.3 over both ids. Every other id is 0."""
    from models.components.talker import RowParams, sampling_row

    def pairs(d: float):
        a = torch.linspace(d, 2.0, 20001)[:-1]          # in [d, 2): a / d stays in a's binade, so quotients tie
        b = torch.nextafter(a, torch.tensor(4.0))
        div = torch.tensor(d)
        hit = (a / div == b / div) & (a * (1 / div) != b * (1 / div))
        return a[hit][:4], b[hit][:4]

    logits = torch.zeros(8, v)
    (logits[:4, 3], logits[:4, 5]), (logits[4:, 3], logits[4:, 5]) = pairs(1.7), pairs(1.3)
    seen = torch.zeros(8, v, dtype=torch.bool)
    seen[4:, 3] = seen[4:, 5] = True
    sampling = torch.tensor([sampling_row(1.7, 0, 1.0, 1.0, 1.0, 0, 1.0)] * 4
                            + [sampling_row(0.0, 0, 1.0, 1.3, 0.0, 0, 1.0)] * 4)
    return (logits.to(device), RowParams(sampling[:, :4].to(device), v), torch.zeros(8, v, device=device),
            seen.to(device), None)


def zeros_batch(v: int, s: int, device: str = "cpu"):
    """Rows of signed zeros (fp32, random signs) but max(1, V // 128) ids at 1.0, sampled at temperature 1 with
    top-p 0.3 to 0.7 (a residual code's layout): top-p's cut falls inside the zeros, where the sort's order of
    -0.0 and +0.0 decides which are kept. Returns select's inputs and the logits with each -0.0 made the
    smallest negative normal instead: the rows as a sort that put -0.0 below +0.0 would see them."""
    from models.components.talker import RowParams, sampling_row

    gen = torch.Generator().manual_seed(v + s)
    logits = torch.where(torch.rand(s, v, generator=gen) < 0.5, -0.0, 0.0)
    logits.scatter_(1, torch.rand(s, v, generator=gen).argsort(dim=-1)[:, :max(1, v // 128)], 1.0)
    below = torch.where((logits == 0) & logits.signbit(), -torch.finfo(torch.float32).tiny, logits)
    top_p = (torch.rand(s, generator=gen) * 0.4 + 0.3).tolist()
    rows = RowParams(torch.tensor([sampling_row(1.0, 0, p, 1.0, 1.0, 0, 1.0)[:3] for p in top_p]).to(device), v)
    log_noise = torch.empty(s, v).exponential_(generator=gen).log().to(device)
    return (logits.to(device), rows, log_noise, None, None), below.to(device)


def torch_parts(logits, rows, seen, suppress):
    """talker.select's steps, line for line, up to top-p: the processed logits before temperature (greedy's),
    the ascending sorted row, top-k's drop and the cumulative probability along the sort."""
    x = logits.float()
    if seen is not None:
        rp = rows.penalty
        x = torch.where(seen, torch.where(x < 0, x * rp, x / rp), x)
    if suppress is not None:
        x = x.masked_fill(suppress, float("-inf"))
    sorted_x, _ = torch.sort(x / rows.temperature, dim=-1, stable=True)
    drop = sorted_x < sorted_x.gather(-1, rows.kth)
    cum = sorted_x.masked_fill(drop, float("-inf")).softmax(dim=-1).cumsum(dim=-1)
    return x, sorted_x, drop, cum


def compare(logits, rows, log_noise, seen=None, suppress=None) -> dict:
    """fused_select against talker.select on one batch: the rows that differ, the rows near top-p's floor
    (a cumulative probability but the last within TOL of it), and counts of the cases the batch covers."""
    from models.components.select_ops import fused_select
    from models.components.talker import select

    want = select(logits, rows, log_noise, seen, suppress)
    got = fused_select(logits, rows, log_noise, seen, suppress)
    x, sorted_x, drop_k, cum = torch_parts(logits, rows, seen, suppress)
    floor, kth, sampled = rows.floor, rows.kth, rows.sampled
    near = sampled & (floor[:, 0] > 0) & ((cum - floor).abs() <= TOL)[:, :-1].any(dim=-1)
    drop_p = cum <= floor
    drop_p[:, -1] = False
    kept = ~(drop_k | drop_p)
    # equal neighbours in the sort, the first dropped by top-p alone and the second kept: a cut inside a tie
    p_split = sampled & ((sorted_x[:, :-1] == sorted_x[:, 1:]) & drop_p[:, :-1] & ~drop_k[:, :-1]
                         & kept[:, 1:]).any(dim=-1)
    # the kth value also just below position kth: a positional top-k cut would drop one of equal values
    k_tie = sampled & (kth[:, 0] > 0) & (sorted_x.gather(-1, kth)
                                         == sorted_x.gather(-1, (kth - 1).clamp(min=0)))[:, 0]
    count = lambda m: int(m.sum())  # noqa: E731
    return {"rows": len(want), "codes": want.tolist(), "bad": (got != want).nonzero().flatten().tolist(),
            "near": near.nonzero().flatten().tolist(), "dtype": str(got.dtype), "shape": list(got.shape),
            "greedy": count(~sampled), "sampled": count(sampled), "raced": count(sampled & (want != x.argmax(-1))),
            "top_k": count(sampled & (kth[:, 0] > 0)), "k_tie": count(k_tie),
            "top_p": count(sampled & (floor[:, 0] > 0)),
            "p_split": count(p_split), "only_top": count(sampled & (kept.sum(-1) == 1) & (floor[:, 0] > 0)),
            "seen": seen is not None, "suppress": suppress is not None}


# vocab, codebook, codec eos: a small one (neither a power of two) and the real config's
SMALL, REAL = (37, 29, 33), (3072, 2048, 2150)

SCRIPT = r"""
import functools
import torch
# CUDA's torch.sort is stable (a radix sort); the CPU default is not: run the torch path as the GPU does
torch.sort = functools.partial(torch.sort, stable=True)
from models.components.select_ops import fused_select
from models.components.talker import RowParams, log_draws, sampling_row, select
from tests.unit.test_select_triton import REAL, SMALL, compare, rounding_batch, talker_batch, zeros_batch

gen = torch.Generator().manual_seed(0)
out = {}
for name, cfg, s in [("small", SMALL, 48), ("small_s1", SMALL, 1), ("real", REAL, 8), ("real_s1", REAL, 1)]:
    for code0 in (True, False):
        for kind in ("ints", "bf16"):
            out[f"{name}_{'code0' if code0 else 'residual'}_{kind}"] = compare(*talker_batch(gen, s, *cfg, code0,
                                                                                             kind))
out["rounding"] = compare(*rounding_batch(37))
for v, s in ((37, 16), (3072, 6)):
    batch, below = zeros_batch(v, s)
    out[f"zeros_{v}"] = dict(compare(*batch), bit_order=select(below, *batch[1:]).tolist())
# top_p 0.8 over logits [log 0.25, 0]: the smaller id's probability is exactly 0.2, the floor's fp32 value, so
# cum <= floor holds with equality and the id is dropped though its draw favours it (test_talker_sampling's case)
logits = torch.tensor([[float(torch.tensor(0.25).log()), 0.0]])
rows = RowParams(torch.tensor([sampling_row(1.0, 0, 0.8, 1.0, 1.0, 0, 1.0)[:3]]), 2)
ln = log_draws(torch.tensor([[1e-6, 1.0]]))
out["exact_floor"] = [int(fused_select(logits, rows, ln)[0]), int(select(logits, rows, ln)[0])]
print(json.dumps(out))
"""


def test_fused_select_equals_the_torch_path_in_the_interpreter():
    r = interpreted(SCRIPT)
    assert r.pop("exact_floor") == [1, 1]
    rounding = r.pop("rounding")               # the temperature's and the penalty's quotients, to the last bit
    assert rounding["codes"] == [3] * 8 and rounding["bad"] == [], rounding
    for v in (37, 3072):                       # -0.0 ties +0.0 in the sort (by index), and that decides codes
        zeros = r.pop(f"zeros_{v}")
        assert set(zeros["bad"]) <= set(zeros["near"]) and len(zeros["near"]) <= zeros["rows"] // 2, zeros
        assert zeros["codes"] != zeros["bit_order"] and zeros["p_split"] == zeros["rows"], zeros
    total = {key: sum(c[key] for c in r.values()) for key in ("rows", "greedy", "sampled", "raced", "top_k", "k_tie",
                                                              "top_p", "p_split", "only_top")}
    for name, c in r.items():
        assert c["shape"] == [c["rows"]] and c["dtype"] == "torch.int64", name
        assert set(c["bad"]) <= set(c["near"]), (name, c)          # every disagreement is at top-p's boundary
        assert c["seen"] == c["suppress"] == ("code0" in name), name
    near = sum(len(c["near"]) for c in r.values())
    # the cases meant are there, in numbers, and nearly every row compares exactly
    assert near <= 0.05 * total["rows"], (near, total)
    assert total["greedy"] >= 30 and total["sampled"] >= 120 and total["raced"] >= 50, total
    assert total["top_k"] >= 60 and total["k_tie"] >= 25 and total["top_p"] >= 100, total
    assert total["p_split"] >= 30 and total["only_top"] >= 40, total
    assert r["small_s1_code0_ints"]["rows"] == r["real_s1_residual_bf16"]["rows"] == 1


def test_fused_select_shapes_and_imports():
    """The operator's fake (the compiler's simulation; meta tensors) gives codes [S] int64 without running Triton;
    select_ops imports neither Triton nor talker.py (which will import it); bad shapes are refused."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from models.components.select_ops import fused_select
    from models.components.talker import RowParams, sampling_row

    rows = RowParams(torch.tensor([sampling_row(0.9, 50, 0.8, 1.05, 0.9, 50, 0.8)[:4]] * 3), 3072)
    with FakeTensorMode(allow_non_fake_inputs=True):
        codes = fused_select(torch.empty(3, 3072), rows, torch.empty(3, 3072), torch.empty(3, 3072, dtype=torch.bool),
                             torch.empty(3072, dtype=torch.bool))
    assert codes.shape == (3,) and codes.dtype == torch.int64
    meta = RowParams(torch.tensor([sampling_row(0.9, 50, 0.8, 1.05, 0.9, 50, 0.8)[:4]] * 3, device="meta"), 3072)
    codes = fused_select(torch.empty(3, 3072, device="meta"), meta, torch.empty(3, 16, 3072, device="meta")[:, 0],
                         torch.empty(3, 3072, dtype=torch.bool, device="meta"),
                         torch.empty(3072, dtype=torch.bool, device="meta"))
    assert codes.shape == (3,) and codes.dtype == torch.int64 and codes.device.type == "meta"
    with pytest.raises(ValueError, match="do not fit"):
        fused_select(torch.empty(3, 3072), rows, torch.empty(3, 2048))
    with pytest.raises(ValueError, match="do not fit"):
        fused_select(torch.empty(3, 5000), rows, torch.empty(3, 5000))
    residual = RowParams(torch.tensor([sampling_row(0.9, 50, 0.8, 1.05, 0.9, 50, 0.8)[4:]] * 3), 3072)
    with pytest.raises(ValueError, match="penalty"):
        fused_select(torch.empty(3, 3072), residual, torch.empty(3, 3072), torch.empty(3, 3072, dtype=torch.bool))
    from models.components.select_ops import RawRows
    table = torch.empty(3072, 16, dtype=torch.bfloat16)
    for bad in ((table[:2048], torch.empty(3, 16, dtype=torch.bfloat16)),        # fewer rows than codes
                (table, torch.empty(3, 16)),                                       # another dtype
                (table, torch.empty(16, 3, dtype=torch.bfloat16).t())):            # columns strided
        with pytest.raises(ValueError, match="embedding table"):
            fused_select(torch.empty(3, 3072), rows, torch.empty(3, 3072), embed=bad)
    with pytest.raises(ValueError, match="want \\[S, 3 or 4\\] float32"):
        RawRows(torch.zeros(3, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="2 rows of sampling columns for 3 rows"):
        fused_select(torch.empty(3, 3072), RawRows(torch.zeros(2, 3)), torch.empty(3, 3072))
    probe = ("import sys; import models.components.select_ops; "
             "print(sorted(m for m in ('triton', 'models.components.talker') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr[-2000:] + out.stdout


KTH_SCRIPT = r"""
import torch
import triton
import triton.language as tl
from models.components.select_triton import _kth_value, _order_keys


@triton.jit
def probe(x_ptr, k_ptr, a_ptr, V, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    m = offs < V
    u = _order_keys(tl.load(x_ptr + row * V + offs, mask=m, other=0.0), m)
    k = tl.load(k_ptr + row)
    tl.store(a_ptr + row, _kth_value(u, k))


gen = torch.Generator().manual_seed(0)
out = {}
for v in (37, 2048, 3072):
    n = 12
    rows = [torch.randn(v, generator=gen).mul(2.5).bfloat16().float(),                  # ties where values crowd
            torch.randint(-4, 5, (v,), generator=gen).float(),                           # long ties, negatives
            torch.where(torch.rand(v, generator=gen) < 0.5, -0.0, 0.0),                  # signed zeros
            torch.full((v,), 1.5)]                                                       # one value
    rows[0][::7] = float("-inf")                                                          # suppressed ids
    rows[1][1::5] = -0.0
    x = torch.stack([rows[i % 4] * (1 if i < 8 else -1) for i in range(n)])
    k = torch.randint(1, v, (n,), generator=gen)
    k[0], k[1] = 1, v - 1
    a = torch.empty(n)
    probe[(n,)](x, k, a, v, BLOCK=triton.next_power_of_2(v))
    want = torch.sort(x, dim=1).values.gather(1, k[:, None])[:, 0]                       # brute force
    out[str(v)] = [[float(w) for w in want], [float(t) for t in a]]
print(json.dumps(out))
"""


def test_the_kth_value_search_finds_the_kth_value_the_sort_does():
    """top-k's threshold, by the one-bit search (_kth_value), against the kth entry of the sorted row (brute
    force), under the interpreter: rows of crowded bf16 values with -inf ids, long ties of small integers with -0.0 among them,
    signed zeros alone, one value throughout, each negated too; kth from 1 to V - 1; V 37 (padded to 64), 2,048
    and 3,072 (padded to 4,096)."""
    got = interpreted(KTH_SCRIPT)
    assert set(got) == {"37", "2048", "3072"}
    for v, (want, bit) in got.items():
        assert bit == want, (v, want, bit)


EMBED_SCRIPT = r"""
import torch
from models.components import talker
from models.components.select_ops import RawRows, fused_select
from models.components.talker import RowParams, sampling_row
from tests.unit.test_kernel_choice import _code_predictor_frame
from tests.unit.test_select_triton import REAL, SMALL, talker_batch

gen = torch.Generator().manual_seed(3)
out = {}
for name, cfg, s, code0 in (("small_code0", SMALL, 120, True), ("small_residual", SMALL, 120, False),
                            ("real_residual", REAL, 6, False)):
    logits, _, log_noise, seen, suppress = talker_batch(gen, s, *cfg, code0, "bf16")
    v = logits.shape[1]
    # every preparation RowParams makes: greedy (temperature 0), top-k off / 1 / V / past V, top-p off and on,
    # a padding row's penalty 0
    raw = torch.tensor([[[0.0, 0.7, 1.3][i % 3], [0, 1, 2, 5, v, v + 7][i % 6], [0.0, 0.2, 0.9][i % 4 % 3],
                         [0.0, 1.05, 1.3, 0.8][i % 4]] for i in range(s)])[:, :4 if code0 else 3]
    table = torch.randn(v + 3, 24, generator=gen).bfloat16()
    frame = torch.full((s, 4, 24), float("nan"), dtype=torch.bfloat16)          # rows strided, as a frame's
    plain = fused_select(logits, RowParams(raw, v), log_noise, seen, suppress)
    codes = fused_select(logits, RawRows(raw), log_noise, seen, suppress, (table, frame[:, 2]))
    out[name] = [torch.equal(codes, plain), torch.equal(frame[:, 2], table[codes]),
                 bool(frame[:, [0, 1, 3]].isnan().all()), len(set(codes.tolist()))]
talker.sampler = lambda module, logits: fused_select        # the GPU's choice, here under the interpreter
cp, x, cos, sin, cache = _code_predictor_frame("cpu", torch.float32, 2)
for p in cp.parameters():
    torch.nn.init.normal_(p, 0.0, 0.3)
params = torch.tensor([sampling_row(0.9, 50, 0.8, 1.05, 1.3, 5, 0.9)[4:]] * 2)
log_noise = torch.empty(2, 3, 16).exponential_(generator=gen).log()
codes, embeds = cp(x[:, 0], x[:, 1], cache.attn, params, log_noise)
frame = torch.full((2, 4, 32), float("nan"))
got_codes, got_embeds = cp(x[:, 0], x[:, 1], cache.attn, params, log_noise, frame)
lookups = torch.stack([cp.model.codec_embedding[j](codes[:, j]) for j in range(3)], dim=1)
out["code_predictor"] = [torch.equal(got_codes, codes), torch.equal(got_embeds, embeds), torch.equal(embeds, lookups),
                         torch.equal(frame[:, 1:], embeds), bool(frame[:, 0].isnan().all()), codes.tolist()]
print(json.dumps(out))
"""


def test_the_sampler_folds_its_rows_preparation_and_each_codes_embedding():
    """fused_select as the select_fold knob calls it (RawRows: the sampling columns as given; an embedding
    table), under the interpreter: the codes those of the call with RowParams (torch's preparation: greedy rows,
    top-k off, 1, V and past V, top-p off and on, a padding row's penalty 0) and no table, the output rows (a
    row-strided slot of a frame buffer) the table's rows of them (an independent gather) and nothing else of the
    buffer written; code 0's layout (penalty, suppression, V 37) and a residual code's at the real V. The code
    predictor given the frame: codes and embeddings bit for bit those of its RowParams, lookups and stack, in
    frame[:, 1:], slot 0 untouched."""
    got = interpreted(EMBED_SCRIPT)
    for name in ("small_code0", "small_residual", "real_residual"):
        assert got[name][:3] == [True, True, True] and got[name][3] > 2, (name, got[name])
    cp = got["code_predictor"]
    assert cp[:5] == [True] * 5, cp
    assert len({c for row in cp[5] for c in row}) > 1, cp           # the codes vary: the rows gathered differ


SELECT_SIGNATURE = {"logits_ptr": "*bf16", "sampled_ptr": "*u8", "temp_ptr": "*fp32", "kth_ptr": "*i64",
                    "floor_ptr": "*fp32", "pen_ptr": "*fp32", "noise_ptr": "*fp32", "seen_ptr": "*u8", "sup_ptr": "*u8",
                    "out_ptr": "*i64", "V": "i32", "l_row": "i32", "n_row": "i32", "s_row": "i32", "sa_st": "i32",
                    "t_st": "i32", "k_st": "i32", "f_st": "i32", "p_st": "i32", "emb_ptr": "*bf16", "e_ptr": "*bf16",
                    "e_row": "i32", "H": "i32"}


@pytest.mark.parametrize("fold", [False, True])
@pytest.mark.parametrize("seen", [False, True])
def test_the_sampler_compiles_for_sm_90(fold, seen):
    """_select compiled for sm_90 without a GPU (tests/sm90_compile.py) as the shipped plans launch it (RowParams'
    tensors, no table) and as select_fold does (the raw columns, an embedding row of 1,024, pdl), code 0's
    layout (penalty and suppression) and a residual code's: it compiles, and only the pdl launch holds the grid
    dependency instructions."""
    pytest.importorskip("triton.backends.nvidia", reason="this Triton has no CUDA backend to compile with")
    from models.components.select_triton import _select
    from tests.sm90_compile import compile_sm90

    sig = SELECT_SIGNATURE | ({"sampled_ptr": "*fp32", "kth_ptr": "*fp32"} if fold else {})
    consts = {"HAS_SEEN": seen, "HAS_SUP": seen, "PRECISE": True, "INDEX_BITS": 12, "BLOCK": 4096,
              "BLOCK_H": 1024 if fold else 1, "PDL": fold, "RAW": fold}
    asm = compile_sm90(_select, sig, consts, num_warps=8)
    assert asm["cubin"] and ("griddepcontrol" in asm["ptx"]) == fold
