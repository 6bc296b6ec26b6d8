"""Large host inputs reach a GPU from page-locked memory (graphc/runtime/executor.py staged): a pageable tensor
of PIN_BYTES or more is copied into a page-locked block of its port's planned size before its copy to the
device; a smaller one, one already pinned, one without a block or one larger than its block is left as it is;
the device copy holds the same values."""
import pytest
import torch

from graphc.host_inputs import PIN_BYTES, host_block
from graphc.runtime.executor import staged

pytestmark = pytest.mark.gpu
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
def test_large_pageable_inputs_are_staged_in_their_ports_block():
    big = torch.randn(PIN_BYTES // 4 + 1)                 # one float over the threshold
    block = host_block(big.nbytes)
    out = staged(big, block)
    assert out.is_pinned() and torch.equal(out, big)
    assert out.untyped_storage().nbytes() == block == 2 * PIN_BYTES
    small = torch.randn(PIN_BYTES // 4 - 1)
    assert staged(small, block) is small
    assert staged(out, block) is out
    assert staged(big, None) is big and staged(big, big.nbytes - 4) is big
    dev = out.to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(dev.cpu(), big)
