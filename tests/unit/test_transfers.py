"""Tensors that cross devices land in static receive buffers the plan counts (issue 12): the ledger's
transfers.NODE lines of the shipped two-GPU Omni plan, worked by hand from the real config."""
from graphc.plan import load_plan

HIDDEN, BF16 = 2048, 2          # the thinker's hidden size; the encoders' outputs are bf16


def test_the_thinker_device_holds_a_buffer_per_encoder_output_at_its_largest_step():
    plan = load_plan("plans/qwen3_omni_2xh100.plan")
    thinker = next(d for d in plan.devices if "thinker" in d.nodes)
    others = [d for d in plan.devices if d is not thinker]
    audio = 16 * 104 * HIDDEN * BF16                      # 16 windows of 104 tokens (audio_prefill's budget)
    vision = 8192 // 4 * HIDDEN * BF16                    # 8,192 patches merged 4 to a token
    deepstack = 3 * vision                                # 3 deepstack layers of the same rows
    got = {k: v for k, v in thinker.ledger.items() if k.startswith("transfers.")}
    assert got == {"transfers.audio_encoder": audio, "transfers.vision_encoder": vision + deepstack}
    assert all(not k.startswith("transfers.") for d in others for k in d.ledger)     # nothing flows into them
    assert f"then fewest bytes crossing devices ({audio + vision + deepstack:,} B a step" in plan.placement


def test_one_device_plans_hold_no_transfer_buffers():
    for path in ("plans/qwen3_omni_h200.plan", "plans/qwen3_omni_tiny_cpu.plan"):
        assert not [k for d in load_plan(path).devices for k in d.ledger if k.startswith("transfers.")]
