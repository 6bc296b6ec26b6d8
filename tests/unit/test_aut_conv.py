"""The audio front end's convolution as im2col + GEMM equals torch's Conv2d."""
import pytest
import torch
import torch.nn.functional as F

from models.components.aut import conv_s2


@pytest.mark.parametrize("c_in,h,w", [(1, 128, 100), (6, 9, 7), (5, 2, 1)])
def test_conv_s2_equals_conv2d(c_in, h, w):
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(c_in, 7, 3, 2, padding=1).double()
    x = torch.randn(3, c_in, h, w, dtype=torch.float64)
    ref = F.conv2d(x, conv.weight, conv.bias, stride=2, padding=1)        # [S, out, H', W']
    got = conv_s2(x, conv)                                                # [S, H', W', out]
    assert got.shape == ref.permute(0, 2, 3, 1).shape
    torch.testing.assert_close(got, ref.permute(0, 2, 3, 1), rtol=1e-12, atol=1e-12)
