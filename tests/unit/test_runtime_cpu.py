"""The CPU boot: every rung of every walk runs once, weights load by name, wrong plans are refused."""
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from graphc.cli import main
from graphc.errors import InvalidInput
from graphc.plan import load_plan
from graphc.runtime.boot import boot_plan, plan_ir
from graphc.runtime.check import compare

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
    assert check.ok and all(r.measured == r.planned for r in check.rows if r.component.startswith(("weights", "kv")))


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
    assert main(["check", "plans/tiny_cpu.plan", "--device", "3"]) == 2
