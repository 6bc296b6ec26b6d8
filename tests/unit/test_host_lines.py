"""A GPU plan's host lines (graphc/passes/size_host.py) against what booted workers held on the H200
(examples/bench/host_memory.py, docs/data/host_memory_h200_2026-12-04/): the page-locked line covers the
page-locked allocator's peak, with at most the boot's two dropped wrappers and the read-back reserve to spare,
and the total covers the whole resident peak of a seeded boot (the peak less file pages of a checkpoint boot,
whose mapped checkpoint pages are page cache the kernel takes back)."""
from __future__ import annotations

import json

import pytest

from graphc.passes import size_host
from graphc.plan import load_plan
from graphc.runtime import checkpoint
from graphc.units import MiB
from tests.conftest import ROOT

DATA = ROOT / "docs" / "data" / "host_memory_h200_2026-12-04"
RECORDS = sorted(DATA.glob("*.json"))


@pytest.mark.parametrize("record", RECORDS, ids=[r.stem for r in RECORDS])
def test_host_lines_cover_what_the_h200_measured(record):
    rec = json.loads(record.read_text())
    plan = load_plan(ROOT / rec["plan"])
    host = plan.devices[0].host
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


def test_the_staging_line_is_the_loaders_chunk_as_read_and_as_cast():
    assert size_host.STAGING_BYTES == checkpoint.STAGING_BYTES
    assert load_plan(ROOT / "plans" / "qwen3_omni_h200.plan").devices[0].host["staging"] == 2 * checkpoint.STAGING_BYTES
