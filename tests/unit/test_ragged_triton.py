"""The short-segment ragged attention kernel (resources/ragged_triton.py) under Triton's interpreter on CPU
equals RaggedTorch (SDPA per segment, the CPU backend) on the layouts the runtime gives it: a captured rung
of code-predictor frames with padding rows (laid out as spare segments, every row written) and replanned in
place to other key segments, fewer queries than keys aligned to the last keys, a sliding window, no mask, GQA
groups of 1 and 2 and a head dim that is not a power of two; a query that sees no key is zeros. Too long a segment, too small a rung and a resource
without a fixed segment length are refused.
tests/gpu/test_ragged_triton_gpu.py runs it compiled at the code predictor's shapes."""
import pytest

pytest.importorskip("triton", reason="the kernels are Triton's; pip install -e '.[test]' brings it")

from tests.unit.test_moe_triton import interpreted  # noqa: E402

SCRIPT = r"""
import torch
from resources.base import StepShape
from resources.ragged_attention import RaggedAttentionSpec, RaggedTorch
from resources.ragged_triton import RaggedTriton

torch.manual_seed(0)
out = {}

def spec(**kw):
    base = dict(name="r", num_heads=4, num_kv_heads=2, head_dim=40, max_segment=16, rows_per_segment=16, causal=True)
    return RaggedAttentionSpec(**{**base, **kw})

def qkv(s, tq, tk):
    return (torch.randn(tq, s.num_heads, s.head_dim), torch.randn(tk, s.kv_heads, s.head_dim),
            torch.randn(tk, s.kv_heads, s.head_dim))

def err(a, b):
    return (a - b).abs().max().item()

# a captured rung of 4 frames of 16 rows, 2 real: the padding rows take spare segments of their own
s = spec()
q, k, v = qkv(s, 64, 64)
b = RaggedTriton(s, StepShape(rows=64, seqs=4, kv_len=16), "cpu",
                 {"qo_indptr": torch.zeros(5, dtype=torch.int32), "kv_indptr": torch.zeros(5, dtype=torch.int32)})
b.plan([0, 16, 32])
got = b(q, k, v)
out["rung"] = err(got, RaggedTorch(s, [0, 16, 32, 48, 64])(q, k, v))
out["indptr"] = b.buffers["qo_indptr"].tolist()
# replanned in place to a layout whose key segments differ (the second has 10 keys: its first 6 queries see
# none): the same buffers now give that layout's answer, not the first's
cq, ck = [0, 16, 32, 48, 64], [0, 16, 26, 42, 58]
b.plan(cq, ck)
out["indptr_k"] = b.buffers["kv_indptr"].tolist()
out["replanned"] = err(b(q, k, v)[[*range(16), *range(22, 64)]],
                       RaggedTorch(s, cq, ck)(q, k, v)[[*range(16), *range(22, 64)]])
out["replanned_unseen"] = b(q, k, v)[16:22].abs().max().item()

# eager: fewer queries than keys (aligned to the last keys), a window, an empty segment
for name, kw in (("window", dict(window=3)), ("causal", {}), ("nomask", dict(causal=False)),
                 ("group1", dict(num_heads=2, num_kv_heads=2, head_dim=64))):
    s = spec(**kw)
    cq, ck = [0, 1, 3, 3, 9], [0, 5, 9, 9, 16]
    q, k, v = qkv(s, 9, 16)
    b = RaggedTriton(s, None, "cpu")
    b.plan(cq, ck)
    out[name] = err(b(q, k, v), RaggedTorch(s, cq, ck)(q, k, v))

# causal, more queries than keys: the first queries see nothing and are zeros
s = spec()
q, k, v = qkv(s, 3, 1)
b = RaggedTriton(s, None, "cpu")
b.plan([0, 3], [0, 1])
got = b(q, k, v)
out["unseen"] = got[:2].abs().max().item()
out["seen"] = err(got[2:], RaggedTorch(s, [0, 1], [0, 1])(q[2:], k, v))
print(json.dumps(out))
"""


def test_short_segments_equal_sdpa_per_segment():
    got = interpreted(SCRIPT)
    assert got.pop("indptr") == [0, 16, 32, 48, 64] and got.pop("indptr_k") == [0, 16, 26, 42, 58]
    assert got.pop("unseen") == got.pop("replanned_unseen") == 0.0
    assert set(got) == {"rung", "replanned", "window", "causal", "nomask", "group1", "seen"}
    for case, e in got.items():
        assert e < 1e-5, (case, e)


def test_too_long_a_segment_too_small_a_rung_and_unfixed_segments_are_refused():
    from resources.base import StepShape
    from resources.ragged_attention import RaggedAttentionSpec
    from resources.ragged_triton import RaggedTriton

    def spec(**kw):
        return RaggedAttentionSpec(**{**dict(name="r", num_heads=4, num_kv_heads=2, head_dim=40, max_segment=16,
                                             rows_per_segment=16, causal=True), **kw})
    with pytest.raises(ValueError, match="a segment of 20 rows; the triton backend holds at most 16"):
        RaggedTriton(spec(), None, "cpu").plan([0, 20])
    with pytest.raises(ValueError, match="3 segments over 48 rows do not fit a rung of 2 segments of 16 rows"):
        RaggedTriton(spec(), StepShape(rows=32, seqs=2, kv_len=16), "cpu", {}).plan([0, 16, 32, 48])
    with pytest.raises(ValueError, match="takes segments of a fixed length"):
        RaggedTriton(spec(rows_per_segment=None), None, "cpu")
