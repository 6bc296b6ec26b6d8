import pytest

from graphc.errors import InvalidInput
from graphc.targets import CATALOG, calibration, get_target
from graphc.units import GiB, parse_bytes


def test_catalog_has_the_required_targets():
    want = {"h100": "sm_90", "h200": "sm_90", "a100-80gb": "sm_80", "a100-40gb": "sm_80", "l40s": "sm_89",
            "b200": "sm_100", "b300": "sm_103", "cpu": "cpu"}
    assert {k: CATALOG[k].arch for k in want} == want
    assert 79 * GiB < CATALOG["h100"].memory_bytes < 80 * GiB
    assert 139 * GiB < CATALOG["h200"].memory_bytes < 141 * GiB
    assert not CATALOG["cpu"].capture and CATALOG["h100"].capture


def test_memory_cap_emulates_a_smaller_card():
    t = get_target("h200", memory_cap=80 * GiB)
    assert t.memory_bytes == 80 * GiB and "capped" in t.memory_source and t.arch == "sm_90"
    with pytest.raises(InvalidInput, match="cannot add memory"):
        get_target("h100", memory_cap=100 * GiB)


def test_unknown_target_suggests_one():
    with pytest.raises(InvalidInput, match="use --gpu h100"):
        get_target("h10")


def test_calibration_names_its_source():
    assert "H200" in calibration(CATALOG["h100"]).source
    assert "not measured on sm_103" in calibration(CATALOG["b300"]).source
    assert calibration(CATALOG["cpu"]).context_bytes == 0


def test_parse_bytes():
    assert parse_bytes("80GiB") == 80 * GiB and parse_bytes("80 GB") == 80 * 10**9 and parse_bytes(512) == 512
