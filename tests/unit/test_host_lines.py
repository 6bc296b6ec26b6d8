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
from graphc.plan import load_plan
from graphc.targets import calibration, get_target
from graphc.units import MiB
from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "examples" / "tools"))
from regen_plans import compile_shipped  # noqa: E402

DATA = ROOT / "docs" / "data" / "host_memory_h200_2026-12-04"
RECORDS = sorted(DATA.glob("*.json"))


@pytest.mark.parametrize("record", RECORDS, ids=[r.stem for r in RECORDS])
def test_host_lines_cover_what_the_h200_measured(record):
    rec = json.loads(record.read_text())
    host = compile_shipped(rec["plan"].removeprefix("plans/").removesuffix(".plan")).devices[0].host
    last = rec["phases"][-1]
    spare = size_host.BOOT_WRAPPERS * 8 * MiB + size_host.READBACK_BYTES
    assert last["pinned_peak"] <= host["pinned"] <= last["pinned_peak"] + spare
    total = sum(host.values())
    if rec["checkpoint"] is None:
        assert last["VmHWM"] <= total
    else:
        assert last["peak_anon_shmem"] <= total and last["VmRSS"] <= total


def test_the_records_cover_a_checkpoint_boot_and_three_seeded_ones():
    assert len(RECORDS) == 4 and sum(json.loads(r.read_text())["checkpoint"] is not None for r in RECORDS) == 1


def test_the_tiny_plans_lines_by_hand():
    """tiny_h100: its decoder's 6 decode, 12 prefill and 12 audio-prefill graphs each hold a FlashInfer wrapper
    (the encoder's attention runs on Triton: none), no eager step, 2 the boot drops: 32 x 8 MiB, and 1 MiB of
    read-backs; staging the loader's chunk twice; the process line counts the launches the kernels line counts."""
    dev = compile_shipped("tiny_h100").devices[0]
    assert dev.host["pinned"] == 32 * 8 * MiB + 1 * MiB
    assert dev.host["staging"] == 2 * 64 * MiB                 # the loader's 64 MiB chunk, as read and as cast
    cal = calibration(get_target("h100"))
    launches = (dev.ledger["kernels"] - cal.kernels_base_bytes) // cal.graph_launch_bytes
    assert dev.host["process"] == cal.host_base_bytes + cal.host_launch_bytes * launches
    cpu = load_plan(ROOT / "plans" / "tiny_cpu.plan").devices[0]
    assert cpu.host == {} and compile_shipped("tiny_cpu").devices[0].host == {}


def test_page_locked_blocks_are_powers_of_two_by_hand():
    assert [size_host._pow2(n) for n in (1, 2, 3, 5, 8 * MiB, 8 * MiB + 1)] == [1, 2, 4, 8, 8 * MiB, 16 * MiB]
