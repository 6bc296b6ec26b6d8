"""A GPU plan's host lines (graphc/passes/size_host.py), compiled here from the shipped plans' inputs, against
what booted workers held on the H200 (examples/bench/host_memory.py, docs/data/host_memory_h200_2026-12-04/):
the page-locked line covers the page-locked allocator's peak, with at most the boot's two dropped wrappers and
the read-back reserve to spare, and the total covers the whole resident peak of a seeded boot (the peak less
file pages of a checkpoint boot, whose mapped checkpoint pages are page cache the kernel takes back). And the
tiny plan's lines worked by hand."""
from __future__ import annotations

import json
import sys

import pytest

from graphc.passes import size_host
from graphc.host_inputs import INPUT_SETS, PIN_BYTES, host_block, input_blocks
from graphc.plan import load_plan
from graphc.runtime.boot import plan_ir
from graphc.targets import calibration, get_target
from graphc.units import MiB
from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "examples" / "tools"))
from regen_plans import compile_shipped  # noqa: E402

DATA = ROOT / "docs" / "data" / "host_memory_h200_2026-12-04"
RECORDS = sorted(DATA.glob("*.json"))
# FlashInfer wrappers the shipped plans gained after those boots, one a captured graph: the Omni plan's code2wav_mid
# walk (its rungs of 1, 2, 4, 8 and 16 slots: 5), and the thinker's media row ladder (rungs 64, 96, 128, 192, 384,
# 768 and 1,536 rows, which the patch ladder's 256, 512, 1,024 and 2,048 lacked, in its +visual and +audio+visual
# prefill families: 14)
GAINED = {"plans/qwen3_omni_h200.plan": 5 + 14}


def as_booted(name: str):
    """The shipped plan as those boots ran it: its paged resources decoding on FlashInfer's fa2, whose captured
    wrappers each pin an int workspace (the one-launch Triton decode sm_90 plans take now pins none)."""
    paged = [r for r, spec in load_plan(ROOT / "plans" / f"{name}.plan").resources.items() if spec.kind == "paged_kv"]
    return compile_shipped(name, {r: {"decode_backend": "fa2"} for r in paged})


@pytest.mark.parametrize("record", RECORDS, ids=[r.stem for r in RECORDS])
def test_host_lines_cover_what_the_h200_measured(record):
    rec = json.loads(record.read_text())
    plan = as_booted(rec["plan"].removeprefix("plans/").removesuffix(".plan"))
    host, last = plan.devices[0].host, rec["phases"][-1]
    inputs = INPUT_SETS * sum(input_blocks(plan_ir(plan), plan.devices[0].nodes).values())   # no boot stages one
    spare = size_host.BOOT_WRAPPERS * 8 * MiB + size_host.READBACK_BYTES + inputs
    measured = host["pinned"] - GAINED.get(rec["plan"], 0) * 8 * MiB    # the line of the plan as it was booted
    assert last["pinned_peak"] <= measured <= last["pinned_peak"] + spare
    total = sum(host.values())
    if rec["checkpoint"] is None:
        assert last["VmHWM"] <= total
    else:
        assert last["peak_anon_shmem"] <= total and last["VmRSS"] <= total


def test_the_records_cover_a_checkpoint_boot_and_three_seeded_ones():
    assert len(RECORDS) == 4 and sum(json.loads(r.read_text())["checkpoint"] is not None for r in RECORDS) == 1


def test_the_tiny_plans_lines_by_hand():
    """tiny_h100: its decoder's 12 prefill and 12 audio-prefill graphs each hold a FlashInfer wrapper (its 6
    decode graphs and the encoder's attention run on Triton: none), no eager step, 2 the boot drops: 26 x 8 MiB,
    and 1 MiB of read-backs; staging the loader's chunk twice; the process line counts the launches the kernels
    line counts."""
    dev = compile_shipped("tiny_h100").devices[0]
    assert dev.host["pinned"] == 26 * 8 * MiB + 1 * MiB
    assert dev.host["staging"] == 2 * 64 * MiB                 # the loader's 64 MiB chunk, as read and as cast
    cal = calibration(get_target("h100"))
    launches = (dev.ledger["kernels"] - cal.kernels_base_bytes) // cal.graph_launch_bytes
    assert dev.host["process"] == cal.host_base_bytes + cal.host_launch_bytes * launches
    cpu = load_plan(ROOT / "plans" / "tiny_cpu.plan").devices[0]
    assert cpu.host == {} and compile_shipped("tiny_cpu").devices[0].host == {}


def test_page_locked_blocks_are_powers_of_two_by_hand():
    assert [host_block(n) for n in (1, 2, 3, 5, 8 * MiB, 8 * MiB + 1)] == [1, 2, 4, 8, 8 * MiB, 16 * MiB]


def test_large_host_inputs_blocks_by_hand():
    """qwen3_omni_h200: the host feeds the vision encoder 8,192 patches of 3 x 2 x 16 x 16 = 1,536 bf16 values
    (25,165,824 B: a 32 MiB block) and the audio encoder 16 windows of 8 x 128 x 100 fp32 mel values (6,553,600 B:
    8 MiB); its patch positions ([8192, 4] int64, 256 KiB) stay under PIN_BYTES and the thinker's host inputs
    are ids and positions. Two steps' worth: 80 MiB more page-locked memory than the wrappers' and read-backs'."""
    plan = compile_shipped("qwen3_omni_h200")
    blocks = input_blocks(plan_ir(plan), plan.devices[0].nodes)
    assert blocks == {("audio_encoder", "mel"): 8 * MiB, ("vision_encoder", "pixel_patches"): 32 * MiB}
    assert PIN_BYTES > 8192 * 4 * 8
    # 109 FlashInfer wrappers' 8 MiB int workspaces, one a captured graph: 127 graphs, less the thinker's 10 and the
    # talker's 8 decode graphs (Triton: they pin none); 2 the boot drops, 1 MiB read-backs
    dev = plan.devices[0]
    assert len(dev.capture_order) == 127
    assert dev.host["pinned"] == (109 * 8 + 2 * 8 + 1 + 2 * (32 + 8)) * MiB
    assert "large host inputs 80.00 MiB: 2 steps x a block each" in dev.host_sources["pinned"]
    asr = compile_shipped("qwen3_asr_1.7b_h100")
    assert input_blocks(plan_ir(asr), asr.devices[0].nodes) == {("audio_encoder", "mel"): 16 * MiB}  # 32 windows


def test_input_blocks_take_host_fed_ports_from_pin_bytes_up_on_their_devices():
    """A hand-built walk: a host-fed port of exactly PIN_BYTES is staged in a block of that size, one a byte
    under is not, a port an edge feeds is not; a node on another device adds nothing. omni_2gpu: its encoders'
    device stages the mel and patches (as on the one-GPU plan), the thinker's device nothing."""
    from types import SimpleNamespace as NS

    from graphc.declare import Edge, Port

    ports = {"big": Port(shape=("tokens", 1024), dtype="float32"), "small": Port(shape=("tokens", 1023), dtype="float32"),
             "fed": Port(shape=("tokens", 4096), dtype="float32")}
    rows = PIN_BYTES // 4096
    step = lambda node: NS(node=node, inputs=("big", "small", "fed"), sizes_at=lambda budget: {"tokens": rows},
                           budget=rows)                                                  # noqa: E731
    ir = NS(model=NS(edges=[Edge(src="enc.out", dst="dec.fed"), Edge(src="enc.out", dst="far.fed")], links=[]),
            steps=[step("far"), step("dec")], node=lambda name: NS(inputs=ports))
    assert input_blocks(ir, ["dec"]) == {("dec", "big"): PIN_BYTES}
    assert input_blocks(ir, ["far", "dec"]) == {("dec", "big"): PIN_BYTES, ("far", "big"): PIN_BYTES}
    plan = compile_shipped("omni_2gpu")
    enc, thinker = (input_blocks(plan_ir(plan), d.nodes) for d in plan.devices)
    assert enc == {("audio_encoder", "mel"): 8 * MiB, ("vision_encoder", "pixel_patches"): 32 * MiB} and thinker == {}
