"""Whatever bytes a plan-reading command is given, it answers with the plan or a refusal that names the
cause (InvalidInput, exit 2), never a traceback: a shipped plan truncated anywhere, with bytes flipped
or inserted, binary and non-UTF-8 files, deep nesting, other YAML documents. Each case goes through
load_plan and through `graphc explain` and `graphc diff` (issue 14)."""
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphc.cli import main
from graphc.errors import InvalidInput
from graphc.plan import load_plan

PLAN = Path("plans/tiny_small_2xh100.plan").read_bytes()
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def check(path: Path, capsys) -> None:
    """load_plan returns a plan or refuses; the commands exit 0/1 (read) or 2 (refused) and print no traceback."""
    try:
        load_plan(path)
        refused = False
    except InvalidInput:
        refused = True
    assert main(["explain", str(path)]) == (2 if refused else 0)
    assert main(["diff", str(path), str(path)]) == (2 if refused else 0)
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err
    if refused:
        assert out.err.count("error: ") == 2


@SETTINGS
@given(cut=st.integers(0, len(PLAN) - 1))
def test_a_truncated_plan(tmp_path, capsys, cut):
    path = tmp_path / "t.plan"
    path.write_bytes(PLAN[:cut])
    check(path, capsys)


@SETTINGS
@given(at=st.integers(0, len(PLAN) - 1), junk=st.binary(min_size=1, max_size=8), replace=st.booleans())
def test_bytes_flipped_or_inserted(tmp_path, capsys, at, junk, replace):
    path = tmp_path / "t.plan"
    path.write_bytes(PLAN[:at] + junk + PLAN[at + (len(junk) if replace else 0):])
    check(path, capsys)


@SETTINGS
@given(data=st.binary(max_size=256))
def test_any_bytes(tmp_path, capsys, data):
    path = tmp_path / "t.plan"
    path.write_bytes(data)
    check(path, capsys)


@pytest.mark.parametrize("data", [b"\xff\xfe\x00\x01binary", "format: graphc.plan/1\nname: caf\xe9\n".encode("latin-1"),
                                  b"[" * 100000, b"{a: " * 5000, b"\x00" * 64, b"--- 1\n--- 2\n", b""],
                         ids=["binary", "latin-1", "deep-list", "deep-map", "nul", "two-documents", "empty"])
def test_named_files_are_refused(tmp_path, capsys, data):
    path = tmp_path / "t.plan"
    path.write_bytes(data)
    with pytest.raises(InvalidInput):
        load_plan(path)
    check(path, capsys)


def test_the_plan_itself_loads(tmp_path, capsys):
    path = tmp_path / "t.plan"
    path.write_bytes(PLAN)
    check(path, capsys)
    assert load_plan(path).fingerprint
