"""Qwen3-Omni's vision tower against HF's Qwen3OmniMoeVisionEncoder: two images of different grids
and a two-slice video packed in one step, loaded through graphc's checkpoint loader from the
safetensors file HF itself wrote; the host metadata against transformers.vision_utils; the node on
meta tensors through the compiler's simulation."""
import pytest
import torch
from transformers import vision_utils as hf_utils
from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeVisionEncoderConfig
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeVisionEncoder

from graphc.modules import build_module
from graphc.runtime.checkpoint import load_weights
from graphc.simulate import FakeNode
from graphc.step import StepContext
from models.components.vision import VisionConfig, VisionEncoder, vision_node
from models.components.vision_inputs import (VisionProcessing, build_step, merge_block_positions, process_image,
                                             process_video, smart_resize)
from resources import RaggedAttentionSpec
from resources.ragged_attention import RaggedTorch
from tests.conftest import rel
from tests.parity.weights import assert_norm_eps_match, randomize

HF_CFG = dict(depth=4, hidden_size=32, num_heads=4, intermediate_size=64, patch_size=16, temporal_patch_size=2,
              spatial_merge_size=2, out_hidden_size=48, num_position_embeddings=64, deepstack_visual_indexes=[1, 2, 3])
# Small video bounds keep the tiny video tiny (Qwen3-Omni's minimum would upscale it to 128 tokens a slice).
PROC = VisionProcessing(video_min_pixels=4 * 32 * 32, video_max_pixels=64 * 32 * 32)



@pytest.fixture(scope="module")
def towers(tmp_path_factory):
    torch.manual_seed(0)
    hf = Qwen3OmniMoeVisionEncoder(Qwen3OmniMoeVisionEncoderConfig(**HF_CFG)).eval()
    randomize(hf, seed=0)            # HF's init leaves norms at 1 / 0 and biases at 0: make every tensor matter
    path = tmp_path_factory.mktemp("vision")
    hf.save_pretrained(path)
    cfg = VisionConfig.from_hf(hf.config.to_dict())
    ours = VisionEncoder(cfg).eval()
    load_weights(ours, path)         # HF saved the bare encoder: no prefix
    spec = RaggedAttentionSpec(name="vision_attn", num_heads=cfg.num_heads, head_dim=cfg.head_dim, max_segment=64)
    return hf, ours, spec


@pytest.fixture(scope="module")
def items():
    g = torch.Generator().manual_seed(1)
    image_a = torch.randint(0, 256, (3, 70, 100), dtype=torch.uint8, generator=g)    # -> 64 x 96: grid 1x4x6
    image_b = torch.randint(0, 256, (3, 150, 60), dtype=torch.uint8, generator=g)    # -> 160 x 64: grid 1x10x4
    video = torch.randint(0, 256, (3, 3, 64, 96), dtype=torch.uint8, generator=g)    # 3 frames -> 2 slices of 4x6
    return [process_image(image_a, PROC), process_image(image_b, PROC), process_video(video, PROC)]


def run(ours, spec, step):
    with torch.no_grad():
        return ours(StepContext({"attn": RaggedTorch(spec, step.cu_seqlens)}), **step.inputs())


def test_packed_step_matches_hf(towers, items):
    hf, ours, spec = towers
    step = build_step(items, ours.cfg)
    assert step.grids == [(1, 4, 6), (1, 10, 4), (2, 4, 6)] and step.token_offsets == [0, 6, 16, 28]
    out = run(ours, spec, step)
    with torch.no_grad():
        ref = hf(hidden_states=step.pixel_patches, grid_thw=torch.tensor(step.grids))
    assert out["embeds"].shape == (28, 48) and out["deepstack"].shape == (3, 28, 48)
    assert rel(out["embeds"], ref.pooler_output) < 1e-5
    for k, feature in enumerate(ref.deepstack_features):
        assert rel(out["deepstack"][k], feature) < 1e-5


def test_norm_epsilons_match_hf(towers):
    depth, deepstack = HF_CFG["depth"], HF_CFG["deepstack_visual_indexes"]
    assert assert_norm_eps_match(towers[1], towers[0]) == 2 * depth + 1 + len(deepstack)


def test_padding_the_step_leaves_real_rows_unchanged(towers, items):
    _, ours, spec = towers
    exact = run(ours, spec, build_step(items, ours.cfg))
    step = build_step(items, ours.cfg, patches=149, max_segment=16)   # 37 padding rows, not a whole merge group
    assert step.cu_seqlens[-4:] == [112, 128, 144, 149]
    padded = run(ours, spec, step)
    assert padded["embeds"].shape == (38, 48) and padded["deepstack"].shape == (3, 38, 48)
    torch.testing.assert_close(padded["embeds"][:28], exact["embeds"], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(padded["deepstack"][:, :28], exact["deepstack"], rtol=1e-6, atol=1e-6)
    assert torch.isfinite(padded["embeds"]).all()


def test_step_metadata_matches_vision_utils(items):
    cfg = VisionConfig.from_hf(HF_CFG)
    step = build_step(items, cfg, patches=120)
    grid = torch.tensor(step.grids)
    index, weight = hf_utils.get_vision_interpolation_indices_and_weights(
        grid, num_grid_per_side=8, mode="bilinear", align_corners=True, spatial_merge_size=2)
    assert torch.equal(step.pos_index[:112], index) and torch.equal(step.pos_weight[:112], weight)
    assert torch.equal(step.rope_pos[:112], hf_utils.get_vision_position_ids(grid, 2))
    assert step.cu_seqlens == hf_utils.get_vision_cu_seqlens(grid).tolist() + [120]


def test_patches_follow_hf_layout():
    """A patch row holds (channel, frame, y, x) of the pixels at its rotary (row, col)."""
    g = torch.Generator().manual_seed(2)
    frames = torch.randint(0, 256, (3, 3, 64, 96), dtype=torch.uint8, generator=g)
    item = process_video(frames, PROC)                       # 64 x 96 needs no resize
    # HF's rescale + normalise in fp32: (x - 255 mean) / (255 std); the third frame repeated to fill slice 2
    mean, std = (torch.tensor(v) * 255.0 for v in (PROC.image_mean, PROC.image_std))
    pixels = (torch.cat((frames, frames[-1:])).float() - mean[:, None, None]) / std[:, None, None]
    pos = merge_block_positions(4, 6, 2).repeat(2, 1)
    for i in (0, 5, 23, 24, 47):
        r, c = pos[i].tolist()
        t = i // 24
        want = pixels[2 * t:2 * t + 2, :, 16 * r:16 * r + 16, 16 * c:16 * c + 16].transpose(0, 1)   # [C, T, p, p]
        assert torch.equal(item.patches[i].view(3, 2, 16, 16), want)
    image = process_image(frames[0], PROC).patches.view(24, 3, 2, 256)   # one frame, T copies of it
    first = item.patches[:24].view(24, 3, 2, 256)[:, :, 0]
    assert torch.equal(image[:, :, 0], first) and torch.equal(image[:, :, 1], first)


def test_smart_resize_examples():
    assert smart_resize(448, 448, 32, 56 * 56, 28 * 28 * 1280) == (448, 448)   # sheet §4a: grid 28x28
    assert smart_resize(70, 100, 32, 56 * 56, 28 * 28 * 1280) == (64, 96)
    assert smart_resize(4000, 3000, 32, 56 * 56, 28 * 28 * 1280) == (1152, 864)   # capped by max_pixels


def test_node_traces_on_meta_tensors():
    cfg = VisionConfig.from_hf(HF_CFG)
    node = vision_node(cfg, dtype="float32")
    spec = RaggedAttentionSpec(name="vision_attn", num_heads=cfg.num_heads, head_dim=cfg.head_dim, max_segment=64)
    sizes = {"patches": 256}
    shape = spec.step_shape("patches", {**sizes, "seqs": 4}, "prefill")
    trace = FakeNode(node).trace(node.inputs, sizes, {"attn": spec.fake(shape)}, "vision")
    assert trace.output_bytes == (1 + 3) * 64 * 48 * 4 and trace.peak_bytes > 0


def test_real_size_tower_on_meta():
    """The real config: the sheet's parameter and tensor counts; bf16 weights, fp32 rotary table."""
    cfg = VisionConfig(depth=27, hidden_size=1152, num_heads=16, intermediate_size=4304, out_hidden_size=2048,
                       num_position_embeddings=2304, deepstack_visual_indexes=(8, 16, 24))
    module = build_module(vision_node(cfg), "meta")
    assert sum(p.numel() for p in module.parameters()) == 538_631_408 and len(module.state_dict()) == 351
    assert module.patch_embed.proj.weight.shape == (1152, 3, 2, 16, 16)
    assert module.blocks[0].attn.qkv.weight.dtype == torch.bfloat16 and module.inv_freq.dtype == torch.float32
