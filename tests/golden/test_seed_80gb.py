"""The seeds' 80 GB case (shared/seeds/pr-omni-on-80gb-gpus.txt) is refused before any boot, with
remedies that were each re-planned; what --fit makes of it is plans/qwen3_omni_h100_seed80gb_fit.plan."""
from graphc.cli import main
from graphc.plan import check_servable, load_plan
from graphc.stages import slot_frames
from tests.conftest import ROOT


def test_seed_settings_are_refused_on_an_h100_with_remedies(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    rc = main(["plan", "models/qwen3_omni.py", "--gpu", "h100", "--config", "examples/configs/seed_80gb.yaml",
               "-o", str(tmp_path / "x.plan")])
    err = capsys.readouterr().err
    assert rc == 1 and not (tmp_path / "x.plan").exists()
    assert "does NOT fit 1 x h100" in err and "device 0 needs" in err
    assert "workspace.audio_ws" in err and "1.00 GiB  declared" in err       # 512 MB x 2 slots
    for remedy in ("--gpus 2", "resources.audio_ws.bytes=null", "resources.vision_ws.slots=1"):
        assert remedy in err


def test_the_trimmed_plan_records_its_trims():
    plan = load_plan(ROOT / "plans" / "qwen3_omni_h100_seed80gb_fit.plan")
    changes = [t.change for t in plan.trimmed]
    assert changes[:2] == ["resources.audio_ws.bytes=null", "resources.vision_ws.bytes=null"]
    assert all(t.freed_bytes > 0 for t in plan.trimmed)
    assert plan.devices[0].total_bytes <= plan.devices[0].capacity_bytes
    assert plan.resources["thinker_kv"].pages == {0: 256} and plan.walks["image_prefill"].budget["patches"] == 32768


def test_the_trimmed_plan_is_servable():
    """--fit trims the chunk walk by whole 100-frame slots (the host's chunk), so `graphc run` serves it."""
    plan = load_plan(ROOT / "plans" / "qwen3_omni_h100_seed80gb_fit.plan")
    check_servable(plan)
    assert slot_frames(plan.walks["code2wav_chunk"].budget) == 100 == plan.pipeline.chunk.slot_frames
