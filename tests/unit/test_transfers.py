"""Tensors that cross devices land in static receive buffers the plan counts (issue 12): the ledger's
transfers.NODE lines of the shipped two-GPU Omni plan, worked by hand from the real config (the encoders'
edges into the thinker, and the talker and Code2Wav the thinker's device drives through links)."""
import pytest

import graphc as gc
from graphc.plan import load_plan

HIDDEN, BF16 = 2048, 2          # the thinker's hidden size; the encoders' outputs are bf16
# the talker's (real config, the fact sheet): hidden 1024, 16 code groups, a codec vocabulary of 3,072;
# the preset's talker budgets: 2,048 prompt rows and 32 sequences a step
T_HIDDEN, GROUPS, T_VOCAB, T_TOKENS, T_SEQS = 1024, 16, 3072, 2048, 32
# Code2Wav: 16 slots of 100 frames, 1,920 samples a frame (4 x 2 x 5 x 4 x 3 x 2 upsampling), float32
WAV = 16 * 100 * 1920 * 4


def test_the_thinker_device_holds_a_buffer_per_encoder_output_at_its_largest_step():
    plan = load_plan("plans/omni_2gpu.plan")
    thinker = next(d for d in plan.devices if "thinker" in d.nodes)
    others = [d for d in plan.devices if d is not thinker]
    audio = 16 * 104 * HIDDEN * BF16                      # 16 windows of 104 tokens (audio_prefill's budget)
    vision = 8192 // 4 * HIDDEN * BF16                    # 8,192 patches merged 4 to a token
    deepstack = 3 * vision                                # 3 deepstack layers of the same rows
    # what comes back from the talker (its codes, int64, and next input rows) and Code2Wav (its audio)
    talker = T_SEQS * GROUPS * 8 + T_SEQS * T_HIDDEN * BF16
    got = {k: v for k, v in thinker.ledger.items() if k.startswith("transfers.")}
    assert got == {"transfers.audio_encoder": audio, "transfers.vision_encoder": vision + deepstack,
                   "transfers.talker": talker, "transfers.code2wav": WAV}
    # the talker's rows and sampling inputs the thinker's device makes: embeds and thinker rows at the prompt
    # budget, the rest a row per sequence (sampling: 7 float32 parameters; noise: a float32 draw per code
    # group and codec id; seen: a bool per codec id)
    into = (T_TOKENS * T_HIDDEN * BF16 + 2 * T_TOKENS * HIDDEN * BF16
            + T_SEQS * (HIDDEN * BF16 + 7 * 4 + GROUPS * T_VOCAB * 4 + T_VOCAB))
    assert [{k: v for k, v in d.ledger.items() if k.startswith("transfers.")} for d in others] == [
        {"transfers.thinker": into}]
    cross = audio + vision + deepstack + talker + WAV + into
    assert f"then fewest bytes crossing devices ({cross:,} B a step" in plan.placement


def test_one_device_plans_hold_no_transfer_buffers():
    for path in ("plans/qwen3_omni_h200.plan", "plans/qwen3_omni_tiny_cpu.plan"):
        assert not [k for d in load_plan(path).devices for k in d.ledger if k.startswith("transfers.")]


def link_model(**link) -> dict:
    port = gc.Port(shape=("tokens", 4), dtype="float32")
    nodes = [gc.Node(name=n, module=__import__("torch").nn.Identity, inputs={"x": port}, outputs={"y": port})
             for n in ("a", "b")]
    walks = [gc.Walk(name="w", kind="prefill", path=("a",), budget=gc.Budget(tokens=8))]
    return dict(name="m", nodes=nodes, walks=walks, links=[gc.Link(**link)])


@pytest.mark.parametrize("link, why", [
    (dict(src="a", dst="c", inputs=("x",)), "unknown node 'c'"),
    (dict(src="a", dst="a", inputs=("x",)), "links a node to itself"),
    (dict(src="a", dst="b", inputs=("z",)), "has no input z"),
    (dict(src="a", dst="b", outputs=("y", "y")), "lists one twice"),
    (dict(src="a", dst="b"), "names no port"),
])
def test_a_link_that_names_what_is_not_there_is_refused(link, why):
    with pytest.raises(ValueError, match=why):
        gc.Model(**link_model(**link))
