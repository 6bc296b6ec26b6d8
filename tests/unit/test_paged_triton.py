"""The one-launch paged decode kernel (resources/paged_triton.py) under Triton's interpreter on CPU equals
PagedTorch (the CPU backend: the append, then SDPA per sequence) on the layouts a decode rung gets: sequences
whose only key is the step's own, one past a page boundary, several key blocks, and histories long enough to be
cut into splits that the last one in merges (their counters back at 0 after every launch, so a second call of
the same graph merges again); the same rung replanned in place to another layout; a GQA group of 3 (not a
power of two); pages of 128 keys; an eager backend; a float16 cache under float32 queries. The step's K/V must land in its page
bit for bit.
Prefill rungs, several rows of a sequence, a rung's wrong sequence count and a head dim it cannot run are
refused. tests/gpu/test_paged_triton_gpu.py runs it compiled, against fp32 and FlashInfer."""
import pytest

pytest.importorskip("triton", reason="the kernels are Triton's; pip install -e '.[test]' brings it")

from tests.unit.test_moe_triton import interpreted  # noqa: E402

SCRIPT = r"""
import random
import torch
from resources.base import StepShape
from resources.paged_kv import PagedKVSpec, PagedTorch
from resources.paged_triton import PagedTriton, BALANCE, BLOCK_N

torch.manual_seed(0)
rng = random.Random(0)
out = {}
POOL = 260

def spec(hq=8, hkv=2, d=32, page=16):
    return PagedKVSpec(name="kv", num_layers=2, num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, max_seq_len=2400,
                       page_size=page)

def tables(kv_lens, page, pool):
    need = [-(-kv // page) for kv in kv_lens]
    perm = rng.sample(range(pool), sum(need))
    out, at = [], 0
    for n in need:
        out.append(perm[at:at + n])
        at += n
    return out

def check(name, b, s, cache, kv_lens):
    n = len(kv_lens)
    t = tables(kv_lens, s.page_size, cache.shape[1])
    q, k, v = torch.randn(n, s.num_qo_heads, s.head_dim), torch.randn(n, s.num_kv_heads, s.head_dim), torch.randn(n, s.num_kv_heads, s.head_dim)
    ref_cache = cache.clone()
    ref = PagedTorch(s, ref_cache, [1] * n, kv_lens, t)(1, q, k, v)
    b.plan([1] * n, kv_lens, t)
    got = b(1, q, k, v)
    out[name] = (got - ref).abs().max().item()
    out[name + "_append"] = torch.equal(cache, ref_cache)
    if b.rung is not None:
        again = b(1, q, k, v)
        out[name + "_again"] = (again - ref).abs().max().item()
        out[name + "_counts"] = b.buffers["split_counts"].abs().sum().item()

s = spec()
cache = torch.randn(2, POOL, 2, 16, 2, 32)
ws = torch.zeros(1 << 20, dtype=torch.uint8)
b = PagedTriton(s, ws, cache, StepShape(rows=4, seqs=4, kv_len=2400, phase="decode"))
out["splits"] = [s.decode_splits(4), BALANCE, BLOCK_N]
check("rung", b, s, cache, [1, 17, 300, 2400])
check("replanned", b, s, cache, [1100, 64, 65, 2])
s3 = spec(hq=6, hkv=2)
check("group3", PagedTriton(s3, ws, cache, StepShape(rows=2, seqs=2, kv_len=2400, phase="decode")), s3, cache, [700, 33])
check("eager", PagedTriton(s, ws, cache), s, cache, [5, 900, 16])
# pages of 128 keys (the 80 GB Omni plan's thinker): a key block inside one page, a sequence over three
s128 = spec(page=128)
cache128 = torch.randn(2, 40, 2, 128, 2, 32)
check("page128", PagedTriton(s128, ws, cache128, StepShape(rows=3, seqs=3, kv_len=2400, phase="decode")), s128,
      cache128, [129, 300, 1])
# a cache in another dtype than q's (float16 here; fp8 on a GPU): keys and values are read, and the step's own are
# written, in the cache's dtype, as PagedTorch does
s16, cache16 = s.model_copy(update={"dtype": "float16"}), cache.half()
check("half_cache", PagedTriton(s16, ws, cache16), s16, cache16, [300, 2, 3])
print(json.dumps(out))
"""


def test_decode_equals_paged_torch():
    got = interpreted(SCRIPT)
    # 256 programs over 4 sequences x 2 kv heads: 32 splits of each. The 2,400-key sequence is 38 blocks of 64
    # keys: 3 blocks a split (3 x 3 x 8 >= 38 > 2 x 2 x 8), so 13 splits, which the merge joins in two loads
    assert got.pop("splits") == [32, 8, 64]
    for name in ("rung", "replanned", "group3", "eager", "half_cache", "page128"):
        assert got.pop(name + "_append") is True, name
        assert got.pop(name) < 1e-5, name
    for name in ("rung", "replanned", "group3", "page128"):
        assert got.pop(name + "_counts") == 0, name
        assert got.pop(name + "_again") < 1e-5, name
    assert not got


def test_what_it_cannot_run_is_refused():
    import torch

    from resources.base import StepShape
    from resources.paged_kv import PagedKVSpec
    from resources.paged_triton import PagedTriton

    s = PagedKVSpec(name="kv", num_layers=1, num_qo_heads=4, num_kv_heads=2, head_dim=32, max_seq_len=64)
    cache, ws = torch.zeros(1, 8, 2, 16, 2, 32), torch.zeros(4096, dtype=torch.uint8)
    with pytest.raises(ValueError, match="runs decode steps only, not a prefill rung"):
        PagedTriton(s, ws, cache, StepShape(rows=8, seqs=2, kv_len=64, phase="prefill"))
    with pytest.raises(ValueError, match="cannot run it: head_dim 40: it takes powers of two from 16 to 128"):
        PagedTriton(s.model_copy(update={"head_dim": 40}), ws, cache)
    b = PagedTriton(s, ws, cache, StepShape(rows=2, seqs=2, kv_len=64, phase="decode"))
    with pytest.raises(ValueError, match=r"one new row per sequence .* got new rows \[2, 1\]"):
        b.plan([2, 1], [5, 6], [[0], [1]])
    with pytest.raises(ValueError, match="takes exactly 2 sequences, got 3: pad with sequences on a scratch page"):
        b.plan([1, 1, 1], [5, 6, 7], [[0], [1], [2]])
    with pytest.raises(RuntimeError, match="plan"):
        b(0, torch.zeros(2, 4, 32), torch.zeros(2, 2, 32), torch.zeros(2, 2, 32))
    b.plan([1, 1], [5, 6], [[0], [1]])
    with pytest.raises(ValueError, match="planned for 2 rows; q, k and v have 3"):
        b(0, torch.zeros(3, 4, 32), torch.zeros(3, 2, 32), torch.zeros(3, 2, 32))
