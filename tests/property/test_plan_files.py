"""Whatever bytes a plan-reading command is given, it answers with the plan or a refusal that names the
cause (InvalidInput, exit 2), never a traceback: a shipped plan truncated anywhere, with bytes flipped
or inserted, binary and non-UTF-8 files, deep nesting, other YAML documents. Each case goes through
load_plan and through `graphc explain` and `graphc diff`, and each refused one through every other
plan-reading command too, `graphc check` and `graphc run --requests` (issues 14 and 15)."""
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphc.cli import main
from graphc.errors import InvalidInput
from graphc.plan import load_plan

PLAN = Path("plans/tiny_small_2xh100.plan").read_bytes()
REQUESTS = "examples/requests_tiny.jsonl"
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
    if refused:                  # a plan that loads would boot: these two read only what they refuse
        assert main(["check", str(path)]) == 2
        assert main(["run", str(path), "--requests", REQUESTS]) == 2
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err
    if refused:
        assert out.err.count("error: ") == 4


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
                                  b"[" * 100000, b"{a: " * 5000, b"\x00" * 64, b"--- 1\n--- 2\n", b"",
                                  b"format: graphc.plan/1\ncount: " + b"1" * 5000, b"format: !!int abc",
                                  b"format: graphc.plan/1\nwhen: 2020-13-45", b"format: !!timestamp x"],
                         ids=["binary", "latin-1", "deep-list", "deep-map", "nul", "two-documents", "empty",
                              "5000-digit-int", "bad-int-tag", "bad-date", "bad-timestamp-tag"])
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


@pytest.mark.parametrize("data", [None, b"\xff\xfe not text", b'{"prompt": "hi"\n', b"[" * 100000,
                                  b'{"prompt_token_ids": [' + b"1" * 5000 + b"]}"],
                         ids=["missing", "not-utf8", "not-json", "deep", "5000-digit-int"])
def test_run_refuses_a_broken_requests_file_before_it_boots(tmp_path, capsys, data):
    path = tmp_path / "r.jsonl"
    if data is not None:
        path.write_bytes(data)
    assert main(["run", "plans/tiny_cpu.plan", "--requests", str(path)]) == 2
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err and "error: " in out.err and str(path) in out.err


def test_check_and_run_refuse_a_gpu_plan_on_a_machine_without_one(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    assert main(["check", "plans/tiny_small_2xh100.plan"]) == 2
    assert main(["run", "plans/tiny_small_2xh100.plan", "--random-weights", "--requests", REQUESTS]) == 2
    out = capsys.readouterr()
    assert out.err.count("no CUDA device") == 2 and "Traceback" not in out.out + out.err
