"""Padding a paged layout to a captured rung (graphc/runtime/gpu_step.pad_paged), by hand-worked cases:
exactly the rung's sequences and rows, real sequences untouched unless every slot is real, padding on the
scratch page."""
import pytest

from graphc.runtime.gpu_step import pad_paged

S = 99   # the scratch page


def test_decode_pads_with_one_row_sequences_on_the_scratch_page():
    qo, kv, tables = pad_paged([1, 1], [17, 5], [[0, 1], [2]], rows=4, seqs=4, page_size=16, scratch=S)
    assert qo == [1, 1, 1, 1] and kv == [17, 5, 1, 1] and tables == [[0, 1], [2], [S], [S]]


def test_prefill_spreads_padding_rows_over_spare_sequences():
    qo, kv, tables = pad_paged([10], [10], [[3]], rows=48, seqs=4, page_size=16, scratch=S)
    assert qo == [10, 13, 13, 12] and kv == [10, 13, 13, 12] and sum(qo) == 48
    assert tables[1:] == [[S], [S], [S]]


def test_spare_sequences_without_padding_rows_hold_no_rows():
    qo, kv, tables = pad_paged([16], [20], [[0, 1]], rows=16, seqs=3, page_size=16, scratch=S)
    assert qo == [16, 0, 0] and kv == [20, 1, 1] and tables == [[0, 1], [S], [S]]


def test_with_every_slot_real_the_last_sequence_takes_the_padding_rows():
    qo, kv, tables = pad_paged([5, 3], [5, 14], [[0], [1]], rows=24, seqs=2, page_size=16, scratch=S)
    # 16 padding rows after the second sequence's 14: rows 14..29, its page then the scratch page
    assert qo == [5, 19] and kv == [5, 30] and tables == [[0], [1, S]]


def test_a_layout_larger_than_the_rung_is_refused():
    with pytest.raises(ValueError, match="do not fit a rung"):
        pad_paged([5, 5], [5, 5], [[0], [1]], rows=8, seqs=2, page_size=16, scratch=S)
    with pytest.raises(ValueError, match="do not fit a rung"):
        pad_paged([1, 1, 1], [1, 1, 1], [[0], [1], [2]], rows=4, seqs=2, page_size=16, scratch=S)
