"""The paged KV resource's declared contract, worked by hand: page bytes per dtype, the defaults and
bounds a declaration gets, step shapes, the buffers of a captured wrapper, and what the CPU backend
refuses. (Attention values are checked against float64 in tests/property/test_attention_cpu.py.)"""
from __future__ import annotations

import re

import pytest
import torch
from pydantic import ValidationError

from resources.base import StepShape
from resources.paged_kv import PagedKVSpec, PagedTorch, new_cache


def spec(**kw) -> PagedKVSpec:
    args = dict(name="kv", num_layers=3, num_qo_heads=4, num_kv_heads=2, head_dim=8, max_seq_len=100)
    return PagedKVSpec(**(args | kw))


@pytest.mark.parametrize("dtype, elem", [("bfloat16", 2), ("float16", 2), ("float32", 4), ("float8_e4m3fn", 1)])
def test_page_bytes_for_each_dtype(dtype, elem):
    # K and V x 3 layers x 16 tokens x 2 kv heads x 8 dims x the element's bytes
    s = spec(dtype=dtype)
    assert s.page_bytes == 2 * 3 * 16 * 2 * 8 * elem
    assert s.page_formula().endswith(f"x {elem} B = {s.page_bytes} B per page")
    # and the cache the runtime allocates is exactly that many bytes a page
    cache = new_cache(s, 5)
    assert cache.dtype == getattr(torch, dtype)
    assert cache.untyped_storage().nbytes() == 5 * s.page_bytes


def test_an_unknown_dtype_is_refused_with_the_choices():
    with pytest.raises(ValidationError, match=r"dtype 'int8' is not one of \['bfloat16', 'float16', 'float32', "
                                              r"'float8_e4m3fn'\]"):
        spec(dtype="int8")


def test_the_defaults_a_declaration_gets():
    s = spec()
    assert (s.page_size, s.dtype, s.pages, s.fill_share, s.backend, s.decode_backend, s.workspace) == \
        (16, "bfloat16", None, 1.0, "auto", "auto", None)
    assert s.min_pages == 7                                  # ceil(100 / 16)


@pytest.mark.parametrize("field", ["num_layers", "num_qo_heads", "num_kv_heads", "head_dim", "page_size",
                                   "max_seq_len", "pages"])
def test_one_is_the_least_of_each_count(field):
    kw = {field: 1} | ({"num_kv_heads": 1} if field == "num_qo_heads" else {})
    assert getattr(spec(**kw), field) == 1
    with pytest.raises(ValidationError, match=field):
        spec(**{field: 0})


def test_a_fill_share_must_be_positive():
    assert spec(fill_share=0.01).fill_share == 0.01
    with pytest.raises(ValidationError, match="fill_share"):
        spec(fill_share=0)


def test_query_heads_must_be_a_multiple_of_kv_heads():
    assert spec(num_qo_heads=6, num_kv_heads=3).num_qo_heads == 6
    with pytest.raises(ValidationError, match="num_qo_heads 6 must be a multiple of num_kv_heads 4"):
        spec(num_qo_heads=6, num_kv_heads=4)


def test_pages_for_a_length():
    s = spec(page_size=16)
    assert [s.pages_for(n) for n in (1, 15, 16, 17, 32, 33)] == [1, 1, 1, 2, 2, 3]


def test_step_shapes():
    s = spec()
    # a prefill chunk of 40 tokens of up to 3 sequences; decode of 5 rows, one a sequence
    assert s.step_shape("tokens", {"tokens": 40, "seqs": 3}, "prefill") == StepShape(40, 3, 100, "prefill")
    assert s.step_shape("seqs", {"seqs": 5}, "decode") == StepShape(5, 5, 100, "decode")
    # no seqs axis: one sequence; never more sequences than rows
    assert s.step_shape("tokens", {"tokens": 40}, "prefill") == StepShape(40, 1, 100, "prefill")
    assert s.step_shape("tokens", {"tokens": 2, "seqs": 8}, "prefill") == StepShape(2, 2, 100, "prefill")


def test_a_torch_step_holds_no_wrapper_buffers():
    assert spec().wrapper_allocs("torch", StepShape(40, 3, 100, "prefill")) == []


def test_wrapper_buffers_by_hand():
    s = spec(int_workspace_bytes=8192)
    # prefill of 40 rows in 3 sequences, each up to 100 tokens = 7 pages
    assert s.wrapper_allocs("fa2", StepShape(40, 3, 100, "prefill")) == [
        ("int_workspace", 8192), ("qo_indptr", 16), ("kv_indptr", 16), ("kv_indices", 4 * 21),
        ("kv_last_page_len", 12), ("append_indices", 8 * 40), ("kv_lens", 4 * 32768)]
    # decode of 5 sequences on CUDA cores (4 query heads over 2 kv heads): no qo_indptr, no kv_lens
    assert s.wrapper_allocs("fa2", StepShape(5, 5, 100, "decode")) == [
        ("int_workspace", 8192), ("kv_indptr", 24), ("kv_indices", 4 * 35), ("kv_last_page_len", 20),
        ("append_indices", 40)]


def test_triton_decode_buffers_splits_and_partials_by_hand():
    s = spec()
    # decode of 5 sequences: the page table (35 pages), lengths and a split counter per (sequence, kv head)
    assert s.wrapper_allocs("triton", StepShape(5, 5, 100, "decode")) == [
        ("kv_indptr", 24), ("kv_indices", 4 * 35), ("kv_last_page_len", 20), ("split_counts", 4 * 10)]
    # splits: the power of two at or under 256 programs / (seqs x kv heads), 1 to 64
    assert [s.decode_splits(n) for n in (1, 2, 3, 5, 16, 64, 128, 200)] == [64, 64, 32, 16, 8, 2, 1, 1]
    assert spec(num_kv_heads=1, num_qo_heads=4).decode_splits(1) == 64          # 256, capped at 64
    assert spec(num_kv_heads=4, num_qo_heads=32).decode_splits(3) == 16         # 256 // 12 = 21 -> 16
    # partials: 4 B x 5 seqs x 4 q heads x 16 splits x (8 dims + max + sum)
    need = s.float_workspace("triton", StepShape(5, 5, 100, "decode"), 132)
    assert need.bytes == 4 * 5 * 4 * 16 * 10 and "16 splits" in need.formula


def cpu_backend(qo_lens, kv_lens, tables):
    s = spec(page_size=4, num_layers=1, dtype="float32")
    return PagedTorch(s, new_cache(s, 8), qo_lens, kv_lens, tables)


def test_the_cpu_backend_writes_each_new_row_to_its_page_slot():
    p = cpu_backend([2, 3], [6, 3], [[5, 1], [2]])
    # sequence 0: positions 4 and 5 sit in its second page (1) at offsets 0 and 1; sequence 1:
    # positions 0-2 in page 2
    assert p.slots.tolist() == [1 * 4 + 0, 1 * 4 + 1, 2 * 4 + 0, 2 * 4 + 1, 2 * 4 + 2]


@pytest.mark.parametrize("qo_lens, kv_lens, tables, why", [
    ([3], [2], [[0]], "more new rows than tokens"),
    ([-1], [2], [[0]], "negative rows"),
    ([1], [5], [[0]], "5 tokens need 2 pages of 4"),
    ([1, 1], [2], [[0], [1]], "one sequence without a length"),
    ([1], [2], [[0], [1]], "a table without a sequence"),
])
def test_the_cpu_backend_refuses_inconsistent_sequences(qo_lens, kv_lens, tables, why):
    with pytest.raises(ValueError):
        cpu_backend(qo_lens, kv_lens, tables)


def test_the_cpu_backend_takes_a_sequence_that_exactly_fills_its_pages():
    assert cpu_backend([4], [8], [[3, 6]]).slots.tolist() == [6 * 4 + 0, 6 * 4 + 1, 6 * 4 + 2, 6 * 4 + 3]


def test_a_sequence_with_no_new_rows_leaves_the_others_theirs():
    # sequence 0 only holds its 3 tokens this step; sequence 1 appends 2 rows (positions 0 and 1)
    torch.manual_seed(0)
    p = cpu_backend([0, 2], [3, 2], [[4], [7]])
    q, k, v = torch.randn(2, 4, 8), torch.randn(2, 2, 8), torch.randn(2, 2, 8)
    out = p(0, q, k, v)
    # by hand in float64: row i of sequence 1 attends to keys 0..i; query heads 0-1 share kv head 0
    want = torch.empty(2, 4, 8, dtype=torch.float64)
    for i in range(2):
        for h in range(4):
            kk, vv = k[:i + 1, h // 2].double(), v[:i + 1, h // 2].double()
            w = torch.softmax(kk @ q[i, h].double() / 8 ** 0.5, 0)
            want[i, h] = w @ vv
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)


def test_pages_are_given_back_once():
    from resources.paged_kv import PageAllocator

    pages = PageAllocator(8)
    a, b = pages.allocate(3), pages.allocate(2)
    for bad, named in (([7], "[7]"), ([a[0], a[0]], f"[{a[0]}]"), ([99], "[99]"), ([-1], "[-1]")):
        with pytest.raises(RuntimeError, match=rf"freeing pages {re.escape(named)} that are not held"):
            pages.free(bad)
        assert pages.num_free == 3                     # refused before anything changed
    pages.free(a)
    with pytest.raises(RuntimeError, match="not held"):
        pages.free(a[:1])                              # a second time
    pages.free(b)
    assert pages.num_free == 8 and sorted(pages.allocate(8)) == list(range(8))


def test_the_simulation_refuses_calls_that_are_not_the_resources_shape():
    """The fake the compiler traces with (3 layers, 4 query and 2 key heads of 8): a call of its shape gives the
    attention's output shape; other heads, head dims or a layer past the last are refused with the numbers;
    a head dim a kernel lacks may come zero-padded to the width the backend runs (run_head_dim)."""
    from graphc.errors import InvalidInput

    shape = StepShape(phase="prefill", rows=5, seqs=1, kv_len=5)
    fake = spec().fake(shape)

    def call(layer=2, hq=4, hk=2, hv=2, d=8, dv=8, f=fake):
        return f(layer, torch.empty(5, hq, d), torch.empty(5, hk, d), torch.empty(5, hv, dv))
    assert call().shape == (5, 4, 8) and call(layer=0).shape == (5, 4, 8)
    for bad in ({"hq": 2}, {"hk": 4}, {"hv": 1}, {"d": 16, "dv": 16}, {"dv": 4}):
        with pytest.raises(InvalidInput, match=r"resource 'kv' is declared as 4 query and 2 key heads of 8, but its "
                                               r"node calls it with q \[5, \d+, \d+\]") as e:
            call(**bad)
        assert "num_qo_heads, num_kv_heads and head_dim" in str(e.value), bad
    for layer in (3, -1):
        with pytest.raises(InvalidInput, match=rf"resource 'kv' holds layers 0 to 2, but its node calls layer {layer}"):
            call(layer=layer)
    padded = spec().fake(shape, run_head_dim=16)
    assert call(d=16, dv=16, f=padded).shape == (5, 4, 16) and call(f=padded).shape == (5, 4, 8)
    with pytest.raises(InvalidInput):
        call(d=32, dv=32, f=padded)


def test_a_kv_resource_of_the_wrong_shape_is_refused_by_graphc_plan(capsys):
    """`graphc plan` exits 2 naming the resource and the module's heads (tiny_omni's decoder: 4 query and 2 key
    heads of 64, 2 layers)."""
    from graphc.cli import main

    for setting, says in (("head_dim=3", "key heads of 3, but its node calls it with q"),
                          ("num_layers=1", "holds layers 0 to 0, but its node calls layer 1")):
        code = main(["plan", "models/tiny_omni.py", "--gpu", "cpu", "--set", f"resources.decoder_kv.{setting}",
                     "-o", "/dev/null", "-q"])
        err = capsys.readouterr().err
        assert code == 2 and says in err and "resources.decoder_kv" in err, (setting, code, err[-600:])
