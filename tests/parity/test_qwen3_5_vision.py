"""Qwen3.5's vision tower is graphc's Qwen3-Omni vision node under Qwen3-VL's weight names (layout "qwen3_vl").

HF's tiny Qwen3_5ForConditionalGeneration (vision weights re-drawn) saves itself; graphc's node is declared by
vision_node(layout="qwen3_vl"), its config read from the saved config.json's vision_config, its weights loaded by
graphc's checkpoint loader under the node's weight_prefix 'model.visual.' (strict: every tensor there used), and
its output compared with HF's Qwen3_5VisionModel for one image, two images packed in one step and a
three-slice video. The tolerance is relative (|ours - HF| / |HF| over the whole output, as the Omni test):
the random tiny weights set the outputs' scale. Measured: ~1.1e-6 rel (max abs ~2.5e-6 on outputs of
max |2.3|), which is fp32 noise: HF's own fp32 output is 1.0e-6 from its fp64 one, graphc's 5e-7.
Also: Qwen3-VL's deepstack mergers under their own names against HF's Qwen3VLVisionModel, the declaration
without a deepstack port, and the real 0.8B / 9B configs against HF's module and the reference sheet.
"""
import json

import pytest
import torch
from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5Config, Qwen3_5VisionConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForConditionalGeneration, Qwen3_5VisionModel
from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLVisionConfig
from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel

from graphc.errors import InvalidInput
from graphc.modules import build_module
from graphc.runtime.checkpoint import TensorShards, load_weights
from graphc.simulate import FakeNode
from graphc.step import StepContext
from models.components.vision import Qwen3VLVisionEncoder, VisionEncoder
from models.components.vision_config import VISION_QWEN3_5_0_8B, VISION_QWEN3_5_9B, VisionConfig, vision_node
from models.components.vision_inputs import VisionItem, VisionProcessing, build_step, process_image, process_video
from resources import RaggedAttentionSpec
from resources.ragged_attention import RaggedTorch
from tests.conftest import rel
from tests.parity.weights import assert_norm_eps_match, randomize

TOL = 1e-5
VISION = dict(depth=3, hidden_size=32, num_heads=4, intermediate_size=48, out_hidden_size=64,
              num_position_embeddings=16)          # a 4 x 4 learned grid, interpolated up to each image's
TEXT = dict(vocab_size=96, hidden_size=64, intermediate_size=80, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=2,
            linear_key_head_dim=16, linear_value_head_dim=16,
            rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                             "mrope_section": [2, 1, 1], "mrope_interleaved": True})
# Qwen3.5's processor normalises with mean = std = 0.5; small video bounds keep the video tiny.
PROC = VisionProcessing(image_mean=(0.5,) * 3, image_std=(0.5,) * 3, video_min_pixels=4 * 32 * 32,
                        video_max_pixels=64 * 32 * 32)
# The 0.8B checkpoint's vision_config, verbatim (reference sheet qwen3_5.md §2.1).
REAL_0_8B = {"model_type": "qwen3_5", "deepstack_visual_indexes": [], "depth": 12, "hidden_size": 768,
             "num_heads": 12, "intermediate_size": 3072, "hidden_act": "gelu_pytorch_tanh", "in_channels": 3,
             "patch_size": 16, "temporal_patch_size": 2, "spatial_merge_size": 2, "out_hidden_size": 1024,
             "num_position_embeddings": 2304, "initializer_range": 0.02}


def spec_for(cfg: VisionConfig) -> RaggedAttentionSpec:
    return RaggedAttentionSpec(name="vision_attn", num_heads=cfg.num_heads, head_dim=cfg.head_dim, max_segment=64)


def run(ours, step):
    with torch.no_grad():
        return ours(StepContext({"attn": RaggedTorch(spec_for(ours.cfg), step.cu_seqlens)}), **step.inputs())


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """HF's tiny Qwen3.5 with random vision weights, saved by HF: (its tower, the checkpoint folder)."""
    torch.manual_seed(0)
    hf = Qwen3_5ForConditionalGeneration(Qwen3_5Config(text_config=TEXT, vision_config=VISION)).eval()
    randomize(hf.model.visual, seed=0)      # HF's init leaves norms at 1 / 0 and biases at 0
    path = tmp_path_factory.mktemp("qwen3_5")
    hf.save_pretrained(path)
    return hf.model.visual, path


@pytest.fixture(scope="module")
def ours(saved):
    _, path = saved
    cfg = VisionConfig.from_hf(json.loads((path / "config.json").read_text())["vision_config"])
    node = vision_node(cfg, name="vision_encoder", dtype="float32", layout="qwen3_vl")
    module = build_module(node, "cpu")
    report = load_weights(module, path, prefix=node.weight_prefix)
    assert report.loaded == len(module.state_dict())
    return module


def media(kind: str):
    g = torch.Generator().manual_seed(1)
    image_a = torch.randint(0, 256, (3, 70, 100), dtype=torch.uint8, generator=g)    # -> 64 x 96: grid 1x4x6
    image_b = torch.randint(0, 256, (3, 150, 60), dtype=torch.uint8, generator=g)    # -> 160 x 64: grid 1x10x4
    video = torch.randint(0, 256, (5, 3, 64, 96), dtype=torch.uint8, generator=g)    # 5 frames -> 3 slices of 4x6
    return {"image": [process_image(image_a, PROC)],
            "two_images": [process_image(image_a, PROC), process_image(image_b, PROC)],
            "video": [process_video(video, PROC)]}[kind]


@pytest.mark.parametrize("kind, grids, tokens", [("image", [(1, 4, 6)], 6),
                                                 ("two_images", [(1, 4, 6), (1, 10, 4)], 16),
                                                 ("video", [(3, 4, 6)], 18)])
def test_step_matches_hf(saved, ours, kind, grids, tokens):
    hf, _ = saved
    step = build_step(media(kind), ours.cfg)
    assert step.grids == grids
    out = run(ours, step)
    with torch.no_grad():
        ref = hf(hidden_states=step.pixel_patches, grid_thw=torch.tensor(step.grids)).pooler_output
    assert set(out) == {"embeds"} and out["embeds"].shape == ref.shape == (tokens, VISION["out_hidden_size"])
    assert rel(out["embeds"], ref) < TOL


def test_video_slices_as_separate_items_change_nothing(ours):
    """Qwen3.5's processor gives the LLM one t=1 group per temporal slice (timestamps between them); the tower
    attends within a slice anyway, so a (3, h, w) video and its three (1, h, w) slices give the same tokens."""
    (video,) = media("video")
    rows = video.num_patches // 3
    slices = [VisionItem(video.patches[i * rows:(i + 1) * rows], (1, 4, 6)) for i in range(3)]
    torch.testing.assert_close(run(ours, build_step(slices, ours.cfg))["embeds"],
                               run(ours, build_step([video], ours.cfg))["embeds"], rtol=0, atol=0)


def test_norm_epsilons_match_hf(saved, ours):
    assert assert_norm_eps_match(ours, saved[0]) == 2 * VISION["depth"] + 1


def test_omni_layout_refuses_qwen3_5_names(saved, ours):
    """The names are the only difference: Qwen3-Omni's layout misses the merger's and finds Qwen3.5's unexpected."""
    omni = VisionEncoder(ours.cfg)
    with pytest.raises(InvalidInput) as e:
        load_weights(omni, saved[1], prefix="model.visual.")
    said = str(e.value)
    assert "6 missing or mis-shaped, 6 unexpected" in said
    assert "merger.ln_q.weight: missing" in said and "unexpected: model.visual.merger.norm.weight" in said


def test_declaration_has_no_deepstack_port():
    cfg = VisionConfig.from_hf(VISION)
    node = vision_node(cfg, dtype="float32", layout="qwen3_vl")
    assert node.weight_prefix == "model.visual." and node.module == "models.components.vision:Qwen3VLVisionEncoder"
    assert set(node.outputs) == {"embeds"}
    assert vision_node(cfg, layout="qwen3_vl", weight_prefix="visual.").weight_prefix == "visual."
    sizes = {"patches": 256}
    spec = spec_for(cfg)
    shape = spec.step_shape("patches", {**sizes, "seqs": 4}, "prefill")
    trace = FakeNode(node).trace(node.inputs, sizes, {"attn": spec.fake(shape)}, "vision")
    assert trace.output_bytes == 64 * VISION["out_hidden_size"] * 4


def test_real_configs_match_the_sheet():
    """The 0.8B config.json's vision_config reads as VISION_QWEN3_5_0_8B; on meta, the node's tensors are HF's
    Qwen3_5VisionModel's by name and shape, and their counts the sheet's probe (0.8B: 100.6 M, 9B: 456.0 M)."""
    assert VisionConfig.from_hf(REAL_0_8B) == VISION_QWEN3_5_0_8B
    assert VISION_QWEN3_5_9B.head_dim == 72 and VISION_QWEN3_5_0_8B.head_dim == 64
    for cfg, millions in ((VISION_QWEN3_5_0_8B, 100.6), (VISION_QWEN3_5_9B, 456.0)):
        ours = build_module(vision_node(cfg, layout="qwen3_vl"), "meta").state_dict()
        with torch.device("meta"):
            hf = Qwen3_5VisionModel(Qwen3_5VisionConfig(**cfg.model_dump(exclude={"deepstack_visual_indexes",
                                                                              "rope_theta", "layer_norm_eps"})))
        assert {k: v.shape for k, v in ours.items()} == {k: v.shape for k, v in hf.state_dict().items()}
        assert round(sum(v.numel() for v in ours.values()) / 1e6, 1) == millions


def test_qwen3_vl_deepstack_names_match_hf():
    """The layout's deepstack mergers (Qwen3-VL: deepstack_merger_list.K) against HF's Qwen3VLVisionModel."""
    torch.manual_seed(0)
    hf = Qwen3VLVisionModel(Qwen3VLVisionConfig(**VISION, deepstack_visual_indexes=[0, 2])).eval()
    randomize(hf, seed=2)
    cfg = VisionConfig.from_hf(hf.config.to_dict())
    ours = Qwen3VLVisionEncoder(cfg).eval()
    load_weights(ours, TensorShards({"model.visual." + k: v for k, v in hf.state_dict().items()}),
                 prefix="model.visual.")
    step = build_step(media("two_images"), cfg)
    out = run(ours, step)
    with torch.no_grad():
        ref = hf(hidden_states=step.pixel_patches, grid_thw=torch.tensor(step.grids))
    assert out["deepstack"].shape == (2, 16, VISION["out_hidden_size"])
    assert rel(out["embeds"], ref.pooler_output) < TOL
    for k, feature in enumerate(ref.deepstack_features):
        assert rel(out["deepstack"][k], feature) < TOL
