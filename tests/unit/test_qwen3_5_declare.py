"""models/qwen3_5.py declares Qwen3.5's hybrid decoder for the compiler: state slots for its Gated DeltaNet
layers, paged KV for its full-attention layers only. Expected bytes are worked by hand from the real configs
(../shared/reference/qwen3_5.md section 2.1) and the tiny preset's numbers."""
from __future__ import annotations

from pathlib import Path

import pytest

from graphc.errors import InvalidInput
from graphc.pipeline import compile_model
from graphc.source import load_model

ROOT = Path(__file__).resolve().parents[2]
MODEL = str(ROOT / "models" / "qwen3_5.py")


def test_9b_state_slot_and_kv_page_are_the_real_models():
    """9B: 24 linear layers, conv (2 x 16 x 128 + 32 x 128) channels x 3 rows x 2 B (bf16), recurrent 32 x 128 x
    128 x 4 B (fp32, mamba_ssm_dtype); 8 full layers of 4 KV heads of 256 (bf16, 16-token pages)."""
    model = load_model(MODEL, "9b").model
    state, kv = model.resource("llm_state"), model.resource("llm_kv")
    assert state.slot_bytes == 24 * ((2 * 16 * 128 + 32 * 128) * 3 * 2 + 32 * 128 * 128 * 4) == 51_511_296
    assert kv.page_bytes == 2 * 8 * 16 * 4 * 256 * 2                    # 32 KiB a token
    assert (state.num_layers, kv.num_layers) == (24, 8)


def test_0_8b_state_slot():
    state = load_model(MODEL, "0.8b").model.resource("llm_state")
    assert state.slot_bytes == 18 * ((2 * 16 * 128 + 16 * 128) * 3 * 2 + 16 * 128 * 128 * 4)      # 18.63 MiB


def test_tiny_plan_holds_a_slot_per_decode_sequence():
    c = compile_model(load_model(MODEL, "tiny"), "cpu")
    lines = {i.component: i.bytes for i in c.result.placement.devices[0].items}
    # 6 linear layers x 8 decode sequences (no capture on a CPU)
    assert lines["state.llm_state.conv"] == 6 * 8 * (2 * 2 * 16 + 4 * 16) * 3 * 2
    assert lines["state.llm_state.recurrent"] == 6 * 8 * 4 * 16 * 16 * 4
    assert lines["kv.llm_kv"] == 256 * 2 * 2 * 16 * 2 * 32 * 2             # 256 pages of 2 full layers


def test_a_qwen3_5_moe_checkpoint_config_declares_the_moe_node():
    """A qwen3_5_moe config.json (text_config of HF's Qwen3_5MoeTextConfig names) declares the MoE text config;
    the tiny-moe preset's shapes are the tiny dense preset's with 8 experts, top 3, and a shared expert."""
    tiny_moe = load_model(MODEL, "tiny-moe").model.node("llm").config
    text = {k: v for k, v in tiny_moe.model_dump().items() if v is not None}
    config = {"model_type": "qwen3_5_moe", "text_config": {**text, "model_type": "qwen3_5_moe_text"}}
    model = load_model(MODEL, "tiny-moe", config=config).model
    assert model.node("llm").config == tiny_moe and model.name == "qwen3_5-tiny-moe-checkpoint"
    with pytest.raises(InvalidInput, match="read it with Qwen3_5MoeTextConfig"):
        load_model(MODEL, "tiny", config={**config, "model_type": "qwen3_5"})


def test_a_checkpoint_config_of_another_family_is_refused():
    with pytest.raises(InvalidInput, match="model_type is 'qwen3_moe'"):
        load_model(MODEL, "tiny", config={"model_type": "qwen3_moe", "text_config": {}})


def test_the_real_0_8b_config_json_declares_the_real_model(tmp_path):
    """Qwen/Qwen3.5-0.8B's config.json (its text_config and vision_config verbatim, the reference sheet's 2.1)
    through `graphc plan --checkpoint`: the nodes' configs are the 0.8B ones, the media ids its own, and the
    checkpoint's mtp.* head is declared ignored."""
    import json

    from graphc.cli import main
    from graphc.plan import load_plan
    from models.components.qwen3_5_text_config import QWEN3_5_0_8B
    from models.components.vision_config import VISION_QWEN3_5_0_8B
    from tests.parity.test_qwen3_5_text import REAL_0_8B_TEXT_CONFIG
    from tests.parity.test_qwen3_5_vision import REAL_0_8B

    config = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
              "image_token_id": 248056, "video_token_id": 248057, "vision_start_token_id": 248053,
              "vision_end_token_id": 248054, "tie_word_embeddings": True, "text_config": REAL_0_8B_TEXT_CONFIG,
              "vision_config": REAL_0_8B}
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = load_model(MODEL, "0.8b", config=config).model
    assert model.node("llm").config == QWEN3_5_0_8B and model.node("vision_encoder").config == VISION_QWEN3_5_0_8B
    assert model.node("llm").ignore_weights == ("mtp.",) and model.node("llm").dtype == "bfloat16"
    host = load_model(MODEL, "0.8b", config=config).module.host(model, str(tmp_path))
    assert (host.media.image_token_id, host.media.vision_start_token_id, host.eos_token_ids) == (248056, 248053,
                                                                                                (248044,))
    assert (host.media.video_token_id, host.vision_end) == (248057, 248054)
    assert host.timestamp_ids is None               # no tokenizer.json beside the config: videos are refused
    out = tmp_path / "p.plan"
    assert main(["plan", MODEL, "--preset", "0.8b", "--checkpoint", str(tmp_path), "--gpu", "cpu", "--memory-cap",
                 "16GiB", "-o", str(out), "-q", "--set", "walks.llm_prefill.budget.tokens=512",
                 "--set", "walks.image_prefill.budget.tokens=512", "--set", "walks.image_prefill.budget.patches=512",
                 "--set", "walks.llm_mixed.budget.tokens=256"]) == 0
    plan = load_plan(out)
    assert plan.resources["llm_state"].slot_bytes == 18 * ((2 * 16 * 128 + 16 * 128) * 3 * 2 + 16 * 128 * 128 * 4)
    assert sorted(plan.requests) == ["i2t", "t2t", "v2t"]


def test_a_video_step_takes_more_frame_groups_than_clips():
    """9B's video walk: 16 clips a step for the LLM, 512 frame groups for the tower's attention (a 60 s clip at the
    processor's default bounds is 60 groups, so 64 segments held one clip a step); the step's attention plans 512
    segments and one of padding rows, and the scheduler reads both bounds."""
    from graphc.runtime.scheduler import _limits

    model = load_model(MODEL, "9b").model
    budget = model.walk("video_prefill").budget
    assert (budget.seqs, budget.segments) == (16, 512)
    sizes = {"patches": 16384, "tokens": 8192, "seqs": 16, "segments": 512}
    assert model.resource("vision_attn").step_shape("patches", sizes, "prefill").seqs == 513
    assert _limits(model, "video_prefill", {"vision_encoder": "patches"}) == (8192, 16, {"vision_encoder": (16384, 512)})
    # the image walk budgets no segments: its 8 images a step are both the LLM's sequences and the tower's segments
    assert _limits(model, "image_prefill", {"vision_encoder": "patches"}) == (8192, 8, {"vision_encoder": (16384, 8)})


def test_a_segments_budget_on_a_walk_without_an_encoder_is_refused(tmp_path, capsys):
    from graphc.cli import main

    code = main(["plan", MODEL, "--preset", "tiny", "--gpu", "cpu", "-o", str(tmp_path / "p.plan"), "-q",
                 "--set", "walks.llm_prefill.budget.segments=4"])
    assert code == 2
    assert "walk 'llm_prefill' budgets segments=4, but no node on its path has ragged attention" in capsys.readouterr().err
