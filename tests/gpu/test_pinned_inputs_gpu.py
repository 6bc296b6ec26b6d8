"""Large host inputs reach a GPU from page-locked memory (graphc/runtime/executor.py _pinned): a pageable
tensor of PIN_BYTES or more is pinned before its copy, a smaller one or one already pinned is left as it is,
nothing is pinned for a CPU device, and the copy made from the pinned tensor holds the same values."""
import pytest
import torch

from graphc.runtime.executor import PIN_BYTES, _pinned

pytestmark = pytest.mark.gpu
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
def test_large_pageable_inputs_are_pinned_before_their_copy():
    dev = torch.device("cuda")
    big = torch.randn(PIN_BYTES // 4 + 1)                 # one float over the threshold
    small = torch.randn(PIN_BYTES // 4 - 1)
    assert not big.is_pinned()
    staged = _pinned(big, dev)
    assert staged.is_pinned() and torch.equal(staged, big)
    assert _pinned(small, dev) is small
    assert _pinned(staged, dev) is staged
    assert _pinned(big, torch.device("cpu")) is big
    out = staged.to(dev, non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(out.cpu(), big)
