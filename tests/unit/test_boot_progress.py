"""Boot progress (graphc/runtime/progress.py): one line per phase with its size and time, bytes/s for weights,
bars only where the lines are shown and stderr is a terminal, nothing for a library user, the logger as it was
after the CLI's command. Expected sizes are worked from the plan file and the checkpoint written here."""
from __future__ import annotations

import io
import logging
import re

import pytest
import torch
from safetensors.torch import save_file

from graphc.cli import main
from graphc.plan import load_plan
from graphc.runtime import progress
from graphc.runtime.boot import boot_plan, plan_ir
from graphc.runtime.checkpoint import TensorShards, load_weights
from graphc.runtime.progress import BootProgress, phase_line, shown
from tests.conftest import ROOT

MiB = 2**20


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def tiny_plan(monkeypatch):
    monkeypatch.chdir(ROOT)
    return load_plan(ROOT / "plans" / "tiny_cpu.plan")


def test_a_phase_line_names_its_size_and_time_and_the_rate_of_bytes():
    assert phase_line("weights", 3 * MiB, "B", "loaded", 2.0) == "weights: 3.00 MiB loaded in 2.0 s (1.50 MiB/s)"
    assert phase_line("capture", 1200, "graph", "captured", 3.14) == "capture: 1,200 graphs captured in 3.1 s"
    assert phase_line("workers", 1, "device", "booted", 0.25) == "workers: 1 device booted in 0.2 s"
    assert phase_line("weights", 512, "B", "seeded", 0.0) == "weights: 512 B seeded in 0.0 s"


def test_phases_report_in_order_once_done_and_not_when_they_fail_or_had_nothing_to_do(caplog):
    p = BootProgress("replica 1")
    with caplog.at_level(logging.INFO, logger="graphc.boot"):
        with p.phase("weights", 2 * MiB, "B", "loaded") as ph:
            ph.update(MiB)
            ph.update(MiB)
        with pytest.raises(RuntimeError), p.phase("kernels", 3, "job", "built or loaded") as ph:
            ph.update(1)
            raise RuntimeError("a kernel failed")
        with p.phase("convolutions", 0, "engine", "chosen"):
            pass
        with p.phase("capture", 2, "graph", "captured") as ph:
            ph.update(2)
        p.done()
    lines = [r.getMessage() for r in caplog.records if r.name == "graphc.boot"]
    assert [re.sub(r"in \d+\.\d s", "in T s", ln.split(" (")[0]) for ln in lines] == [
        "boot replica 1: weights: 2.00 MiB loaded in T s", "boot replica 1: capture: 2 graphs captured in T s",
        "boot replica 1: done in T s"]


def test_a_library_boot_prints_nothing_even_on_a_terminal(tiny_plan, monkeypatch, capsys):
    tty = Terminal()
    monkeypatch.setattr("sys.stderr", tty)
    boot_plan(tiny_plan)
    assert tty.getvalue() == "" and capsys.readouterr() == ("", "")


def test_check_shows_each_phase_and_the_boot_time_and_nothing_with_q(tiny_plan, capsys):
    assert main(["check", "plans/tiny_cpu.plan"]) == 0
    err = capsys.readouterr().err.splitlines()
    # the plan's weights: encoder 799.50 KiB + decoder 418.50 KiB = 1,247,232 B = 1.19 MiB; 33 rungs in all
    weights = sum(b for c, b in tiny_plan.devices[0].ledger.items() if c.startswith("weights."))
    rungs = sum(len(b.rungs) for n in tiny_plan.nodes.values() for b in n.buckets.values())
    assert (weights, rungs) == (1_247_232, 33)
    assert [re.sub(r"\d+\.\d s", "T s", ln.split(" (")[0]) for ln in err] == [
        "boot: weights: 1.19 MiB seeded in T s", "boot: warm-up: 33 steps run in T s", "boot: done in T s"], err
    assert main(["check", "plans/tiny_cpu.plan", "-q"]) == 0
    assert capsys.readouterr().err == ""


def test_shown_draws_bars_on_a_terminal_and_a_checkpoint_boot_reports_its_bytes_and_rate(tiny_plan, tmp_path,
                                                                                          monkeypatch):
    """The bytes are the checkpoint's tensors, saved here in the modules' dtypes; the rate is bytes over time.
    After shown(), the logger is as it was."""
    from graphc.runtime.build import build_shell

    src = {}
    ir = plan_ir(tiny_plan)
    for name in tiny_plan.nodes:
        decl = ir.node(name)
        for k, v in build_shell(decl).state_dict().items():
            src[decl.weight_prefix + k] = torch.randn(v.shape).to(v.dtype)
    save_file(src, tmp_path / "model.safetensors")
    on_disk = sum(t.numel() * t.element_size() for t in src.values())
    log = logging.getLogger("graphc.boot")
    before = (list(log.handlers), log.level, log.propagate)
    tty = Terminal()
    monkeypatch.setattr("sys.stderr", tty)
    with shown():
        assert progress.bars_on()
        boot_plan(tiny_plan, checkpoint=str(tmp_path))
    assert (list(log.handlers), log.level, log.propagate) == before and not progress.bars_on()
    out = tty.getvalue()
    assert "boot: weights:" in out and "%|" in out               # the bar drew, then the phase's line
    assert re.search(r"boot: warm-up: 33 steps run in \d+\.\d s\n", out), out
    line = next(ln for ln in re.split(r"[\r\n]", out) if re.match(r"boot: weights: [\d.]+ MiB loaded", ln))
    m = re.fullmatch(r"boot: weights: ([\d.]+) MiB loaded in ([\d.]+) s \(([\d.]+) (KiB|MiB)/s\)", line)
    assert m, line
    assert m[1] == f"{on_disk / MiB:.2f}"
    seconds, rate = float(m[2]), float(m[3]) * (1024 if m[4] == "KiB" else MiB)
    if seconds >= 0.5:                          # the printed time is rounded to 0.1 s
        assert on_disk / (seconds + 0.05) <= rate <= on_disk / (seconds - 0.05), line


def test_load_weights_reports_each_chunk_it_copies(monkeypatch):
    """Every byte of the module's tensors once, in chunks no larger than the staging bytes."""
    from graphc import hostmem

    monkeypatch.setattr(hostmem, "STAGING_BYTES", 256)
    module = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 8, bias=False)).to(torch.bfloat16)
    disk = {k: torch.randn(v.shape) for k, v in module.state_dict().items()}        # float32 on disk
    chunks = []
    load_weights(module, TensorShards(disk), on_bytes=chunks.append)
    # bf16 in memory: (32*16 + 32 + 8*32) * 2 B = 1,600 B
    assert sum(chunks) == 1600 and max(chunks) <= 256 and len(chunks) > 4

