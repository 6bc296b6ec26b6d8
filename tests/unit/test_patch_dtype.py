"""The host casts an image's or a clip's patches to the vision node's input dtype where the request is prepared
(models/components/hosting.py node_dtype): a bf16 plan's pieces and encoder step hold bf16 patches equal to the
fp32 patches cast after packing (what the runtime's copy to the node's dtype did before), and an fp32 plan's stay
fp32. Expected values: vision_inputs' fp32 processing, cast by torch."""
from __future__ import annotations

import pytest
import torch

from graphc import Media
from models import qwen3_omni
from models.components.vision_inputs import build_step, process_image, process_video


@pytest.fixture(params=["bfloat16", "float32"])
def host(request, monkeypatch):
    monkeypatch.setitem(qwen3_omni.PRESETS, "tiny-dt", dict(qwen3_omni.PRESETS["tiny"], dtype=request.param))
    return qwen3_omni.host(qwen3_omni.declare("tiny-dt")), getattr(torch, request.param)


def test_patches_in_the_vision_node_dtype(host):
    h, dtype = host
    g = torch.Generator().manual_seed(0)
    image = torch.randint(0, 256, (3, 40, 56), dtype=torch.uint8, generator=g)
    clip = torch.randint(0, 256, (4, 3, 32, 48), dtype=torch.uint8, generator=g)
    m = h.media
    ids = [1, m.vision_start_token_id, m.image_token_id, 2, m.vision_start_token_id, m.video_token_id, 3]
    prompt = h.prompt(ids, [Media("image", image), Media("video", clip, fps=2.0)])
    pieces = [p for item in prompt.media for p in item.pieces]
    vp = h.vision
    want = torch.cat([process_image(image, vp).patches, process_video(clip, vp).patches])
    assert all(p.data.patches.dtype == dtype for p in pieces)
    assert torch.equal(torch.cat([p.data.patches for p in pieces]), want.to(dtype))
    node = prompt.media[0].node
    units = sum(p.units for p in pieces) + 8                   # a step with padding rows
    batch = h.encode(node, pieces, units)
    fp32 = build_step([type(p.data)(p.data.patches.float(), p.data.grid_thw) for p in pieces], h.vcfg, patches=units)
    assert batch.inputs["pixel_patches"].dtype == dtype
    assert torch.equal(batch.inputs["pixel_patches"], fp32.pixel_patches.to(dtype))
