"""The CPU boot: every rung of every walk runs once, weights load by name, wrong plans are refused, and
the check compares the plan with the storages the boot really holds."""
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from graphc.cli import main
from graphc.errors import InvalidInput
from graphc.plan import load_plan
from graphc.report import render
from graphc.runtime.boot import LiveBytes, boot_plan, plan_ir
from graphc.runtime.check import DeviceCheck, compare, verdict

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def tiny_plan(monkeypatch):
    monkeypatch.chdir(ROOT)
    return load_plan(ROOT / "plans" / "tiny_cpu.plan")


def test_cpu_boot_runs_every_walk_at_every_rung(tiny_plan):
    (boot,) = boot_plan(tiny_plan)
    want = {f"{n}/{w}/{r}" for n, node in tiny_plan.nodes.items() for w, b in node.buckets.items() for r in b.rungs}
    assert set(boot.ran) == want and len(want) == 33
    check = compare(boot)
    assert check.ok, check.faults
    assert all(r.measured == r.planned for r in check.rows if r.component.startswith(("weights", "kv")))
    assert not check.faults and set(boot.step_peaks) == want and check.activations > 0


def test_cpu_check_fails_when_the_ledger_disagrees_with_the_storages(tiny_plan):
    data = tiny_plan.model_dump()
    data["devices"][0]["ledger"]["weights.decoder"] -= 256
    data["devices"][0]["ledger"]["kv.decoder_kv"] *= 2
    (boot,) = boot_plan(type(tiny_plan).model_validate(data))
    check = compare(boot)
    assert not check.ok
    assert check.faults == ["weights.decoder: its storages hold 428,544 B, the plan says 428,288 B (+256 B)",
                            "kv.decoder_kv: its storages hold 4,194,304 B, the plan says 8,388,608 B (-4,194,304 B)"]
    out = render("check.txt.j2", plan=boot.plan, checks=[check], tolerance=0.02)
    assert "device 0: FAILED" in out and "mismatch: weights.decoder" in out


def test_cpu_check_catches_a_tensor_the_arena_formula_misses(monkeypatch):
    """The compiler and the runtime share the arena formula, so both miss the same tensor; only the
    storages the module really uses tell."""
    import graphc.modules
    import graphc.passes.size_weights
    import graphc.runtime.build
    from graphc.pipeline import compile_model
    from graphc.source import load_model

    monkeypatch.chdir(ROOT)
    full = graphc.modules.tensors_for_arena

    def drops_inv_freq(module):
        return [(n, t) for n, t in full(module) if not n.endswith("inv_freq")]
    monkeypatch.setattr(graphc.modules, "tensors_for_arena", drops_inv_freq)
    monkeypatch.setattr(graphc.runtime.build, "tensors_for_arena", drops_inv_freq)
    monkeypatch.setattr(graphc.passes.size_weights, "_CACHE", {})
    plan = compile_model(load_model("models/tiny_omni.py", "tiny"), "cpu").plan
    assert plan.devices[0].ledger["weights.decoder"] == 428544 - 256     # the compiler undercounts
    (boot,) = boot_plan(plan)
    assert boot.arenas["decoder"].numel() == plan.devices[0].ledger["weights.decoder"]   # and so does the arena
    check = compare(boot)
    assert not check.ok
    # inv_freq (32 fp32) lives in a storage of its own; every other component of the fresh plan agrees
    assert check.faults == ["weights.decoder: inv_freq (128 B on cpu) is not in the node's 428,288 B arena",
                            "weights.decoder: its storages hold 428,416 B, the plan says 428,288 B (+128 B)"]


def test_live_bytes_counts_new_storages_until_they_die():
    x = torch.ones(1000)                      # before the step: not counted
    with torch.inference_mode(), LiveBytes() as rec:
        y = x * 2                             # +4,000
        x.view(10, 100).add_(1)               # a view and an in-place write: nothing new
        z = y[:500] + 1                       # +2,000 (6,000 live)
        del y                                 # -4,000
        w = torch.cat([z, z])                 # +4,000 (6,000 live)
        i = torch.tensor([0] * 250)           # +2,000 int64 from host data (8,000 live)
        assert rec.live == 8000
    assert rec.peak == 8000 and w.numel() == i.numel() * 4


def test_cpu_boot_loads_a_checkpoint_by_public_names(tiny_plan, tmp_path):
    from graphc.runtime.build import build_shell

    src = {}
    for name, node in tiny_plan.nodes.items():
        decl = plan_ir(tiny_plan).node(name)
        shell = build_shell(decl)
        gen = torch.Generator().manual_seed(1)
        for k, v in shell.state_dict().items():
            src[decl.weight_prefix + k] = torch.randn(v.shape, generator=gen).to(v.dtype)
    save_file(src, tmp_path / "model.safetensors")
    (boot,) = boot_plan(tiny_plan, checkpoint=str(tmp_path))
    w = boot.modules["decoder"].model.layers[1].mlp.down_proj.weight
    assert torch.equal(w, src["decoder.model.layers.1.mlp.down_proj.weight"])
    assert w.data_ptr() >= boot.arenas["decoder"].data_ptr()       # a view into the node's arena


def test_changed_model_file_is_refused(tiny_plan, tmp_path, monkeypatch):
    data = tiny_plan.model_dump()
    data["model"]["sha256"] = "0" * 64
    bad = type(tiny_plan).model_validate(data)
    with pytest.raises(InvalidInput, match="changed since the plan was compiled"):
        boot_plan(bad)


def test_gpu_plan_without_a_gpu_is_refused(monkeypatch):
    monkeypatch.chdir(ROOT)
    plan = load_plan(ROOT / "plans" / "tiny_h100.plan")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(InvalidInput, match="has no CUDA device"):
        boot_plan(plan)


def test_check_cli(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    assert main(["check", "plans/tiny_cpu.plan"]) == 0
    out = capsys.readouterr().out
    assert "device 0: OK" in out and "synthetic steps run: 33" in out
    assert "CPU check: verifies shapes, finiteness and the real storages" in out
    assert main(["check", "plans/tiny_cpu.plan", "--device", "3"]) == 2


def _gpu_check(planned: int, measured: int, captured: list[str]) -> DeviceCheck:
    return DeviceCheck(1, [], planned, measured, ["decode/1", "decode/8"], captured, [], 0.02, [], 80 * 10**9)


def test_a_devices_verdict_and_line_carry_its_numbers():
    """By hand: 70.70 GB measured against 70 GB planned is +1.00%, inside 2%; 71.5 GB is +2.14%, over it;
    a graph not captured breaks the plan's word whatever the peak."""
    from graphc.runtime.engine import Engine

    fine = verdict(_gpu_check(70 * 10**9, 70_700_000_000, ["decode/1", "decode/8"]))
    assert fine == {"planned": 70 * 10**9, "measured": 70_700_000_000, "within": pytest.approx(0.01),
                    "graphs_planned": 2, "graphs_captured": 2, "missing_graphs": [], "ok": True, "lines": {},
                    "comm_join": None}
    line = Engine.ledger_line(1, fine)
    assert "device 1: 2 of 2 graphs captured, peak 70.700 GB of 70.000 GB planned (+1.00%)" in line
    assert "NOT AS PLANNED" not in line
    over = verdict(_gpu_check(70 * 10**9, 71_500_000_000, ["decode/1", "decode/8"]))
    assert not over["ok"] and "(+2.14%) -- NOT AS PLANNED: its peak" in Engine.ledger_line(1, over)
    short = verdict(_gpu_check(70 * 10**9, 69 * 10**9, ["decode/1"]))
    assert short["missing_graphs"] == ["decode/8"] and not short["ok"]
    assert "1 of 2 graphs captured" in Engine.ledger_line(1, short) and "missing decode/8" in Engine.ledger_line(1, short)
