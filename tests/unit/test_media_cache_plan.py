"""The media cache's ledger lines (graphc/media_rows.py): bytes hand-worked from a preset, --set's rows and
refusals, the KV fill pool paying for the line, and `graphc check` of a CPU plan measuring it to the byte."""
from pathlib import Path

import pytest

from graphc.cli import main
from graphc.errors import EXIT_FITS, EXIT_INVALID
from graphc.plan import load_plan
from graphc.runtime.boot import boot_plan
from graphc.runtime.check import compare

ROOT = Path(__file__).resolve().parents[2]
OMNI = "models/qwen3_omni.py"


@pytest.fixture(autouse=True)
def at_root(monkeypatch):
    monkeypatch.chdir(ROOT)


def plan(tmp_path, *sets: str, gpu: str = "cpu", model: str = OMNI, preset: str = "tiny"):
    out = tmp_path / "p.plan"
    args = [x for s in sets for x in ("--set", s)]
    assert main(["plan", model, "--preset", preset, "--gpu", gpu, *args, "-o", str(out), "-q"]) == EXIT_FITS
    return load_plan(out).devices[0]


def test_the_tiny_omni_lines_hand_worked(tmp_path):
    """models/qwen3_omni.py's tiny preset, bf16 (2 B):
    audio_encoder: output_dim 64; audio_prefill's budget of 2 windows of 104 rows each = 208 rows a step;
      4 steps = 832 rows x 64 x 2 B = 106,496 B.
    vision_encoder: out_hidden_size 64 for embeds and each of 3 deepstack levels = 4 x 64 x 2 B = 512 B a row;
      the largest step, 256 patches merged 2x2 = 64 rows; 4 steps = 256 rows x 512 B = 131,072 B.
    thinker (the talker reads its `hidden`: hidden_size 64): the largest step, thinker_prefill's 128 tokens;
      4 steps = 512 rows x 64 x 2 B = 65,536 B."""
    dev = plan(tmp_path)
    assert dev.ledger["media_cache.audio_encoder"] == 4 * 2 * 104 * 64 * 2 == 106_496
    assert dev.ledger["media_cache.vision_encoder"] == 4 * (256 // 4) * (1 + 3) * 64 * 2 == 131_072
    assert dev.ledger["media_cache.thinker"] == 4 * 128 * 64 * 2 == 65_536
    assert "4 x the 64 rows of vision_encoder's largest step" in dev.sources["media_cache.vision_encoder"]
    assert "the rows its follow stage reads, of cached pages" in dev.sources["media_cache.thinker"]


def test_the_real_omni_follow_line_and_none_without_a_follow_stage(tmp_path):
    """The 30B thinker's hidden rows are 2,048 x 2 B; its largest step is thinker_prefill's 2,048 tokens: 4 x 2,048
    rows x 4,096 B = 32 MiB. Qwen3-ASR (no follow stage) has no LLM line, and --set names no LLM there."""
    assert plan(tmp_path, gpu="h200", preset="30b-a3b").ledger["media_cache.thinker"] == 4 * 2048 * 2048 * 2 == 32 << 20
    asr = plan(tmp_path, model="models/qwen3_asr.py")
    assert [c for c in asr.ledger if c.startswith("media_cache.")] == ["media_cache.audio_encoder"]


def test_set_rows_and_off(tmp_path):
    dev = plan(tmp_path, "media_cache.vision_encoder=10", "media_cache.audio_encoder=0", "media_cache.thinker=3")
    assert dev.ledger["media_cache.vision_encoder"] == 10 * 512
    assert "--set media_cache.vision_encoder=10" in dev.sources["media_cache.vision_encoder"]
    assert "media_cache.audio_encoder" not in dev.ledger
    assert dev.ledger["media_cache.thinker"] == 3 * 128


def test_a_model_without_encoders_has_no_line(monkeypatch):
    """Qwen3.5 declared without its vision tower: nothing feeds the LLM, no line."""
    from graphc.pipeline import run_passes
    from graphc.targets import get_target
    from models import qwen3_5

    monkeypatch.setitem(qwen3_5.PRESETS, "text-only", dict(qwen3_5.PRESETS["0.8b"], vision=None))
    with_tower, text_only = (run_passes(qwen3_5.declare(p), get_target("h200"), 1) for p in ("0.8b", "text-only"))
    lines = [[i.component for i in r.placement.devices[0].items if i.component.startswith("media_cache.")]
             for r in (with_tower, text_only)]
    assert lines == [["media_cache.vision_encoder"], []]


@pytest.mark.parametrize("value, said", [("-1", "is not a whole number of rows >= 0"),
                                         ("1.5", "is not a whole number of rows >= 0"),
                                         ("true", "is not a whole number of rows >= 0"),
                                         ("lots", "is not a whole number of rows >= 0")])
def test_set_refuses_what_is_not_rows(value, said, capsys, tmp_path):
    assert main(["plan", OMNI, "--preset", "tiny", "--gpu", "cpu", "--set", f"media_cache.vision_encoder={value}",
                 "-o", str(tmp_path / "p.plan")]) == EXIT_INVALID
    err = capsys.readouterr().err
    assert said in err and "Fix: e.g. --set media_cache.vision_encoder=0" in err


def test_set_refuses_an_unknown_node_and_a_bare_value(capsys):
    assert main(["plan", OMNI, "--preset", "tiny", "--gpu", "cpu", "--set", "media_cache.vision_encodr=0"]) \
        == EXIT_INVALID
    err = capsys.readouterr().err
    assert "unknown node 'vision_encodr'" in err and "audio_encoder, thinker, vision_encoder" in err
    assert "use 'vision_encoder'" in err
    assert main(["plan", OMNI, "--preset", "tiny", "--gpu", "cpu", "--set", "media_cache=0"]) == EXIT_INVALID
    assert "must map nodes to rows" in capsys.readouterr().err
    assert main(["plan", "models/qwen3_asr.py", "--preset", "tiny", "--gpu", "cpu", "--set", "media_cache.thinker=0"]) \
        == EXIT_INVALID
    err = capsys.readouterr().err
    assert "unknown node 'thinker'" in err and "an LLM a follow stage reads: audio_encoder" in err
    assert main(["plan", OMNI, "--preset", "tiny", "--gpu", "cpu", "--set", "media_cach.x=0"]) == EXIT_INVALID
    assert "use 'media_cache'" in capsys.readouterr().err


def test_the_kv_fill_pool_pays_for_the_line(tmp_path):
    """On a GPU the KV pools fill what the device has left: with the cache, they hold its bytes less (to within
    a page of each pool and the allocator's rounding of one more allocation, 2 MiB)."""
    on = plan(tmp_path, gpu="h100", model="models/tiny_omni.py")
    off = plan(tmp_path, "media_cache.encoder=0", gpu="h100", model="models/tiny_omni.py")
    line = on.ledger["media_cache.encoder"]
    kv = [c for c in on.ledger if c.startswith("kv.")]
    paid = sum(off.ledger[c] - on.ledger[c] for c in kv)
    page = max((off.ledger[c] // off.kv_pages[c.split(".", 1)[1]]) for c in kv)
    assert line > 0 and "media_cache.encoder" not in off.ledger
    assert abs(paid - line) <= len(kv) * page + (2 << 20), (paid, line)
    assert on.total_bytes <= on.capacity_bytes and off.total_bytes <= off.capacity_bytes


def test_graphc_check_measures_the_line_to_the_byte():
    plan = load_plan(ROOT / "plans" / "qwen3_omni_tiny_cpu.plan")
    (boot,) = boot_plan(plan)
    check = compare(boot)
    rows = {r.component: r for r in check.rows}
    assert check.ok, check.faults
    assert rows["media_cache.vision_encoder"].measured == rows["media_cache.vision_encoder"].planned == 131_072
    data = plan.model_dump()
    data["devices"][0]["ledger"]["media_cache.audio_encoder"] += 100     # not a whole number of rows
    (boot,) = boot_plan(type(plan).model_validate(data))
    assert "media_cache.audio_encoder: its storages hold 106,496 B, the plan says 106,596 B (-100 B)" in \
        compare(boot).faults


def test_the_remedy_turns_the_cache_off():
    """A device over its card is offered `media_cache.NODE=0` for each line it holds (none for a line of 0 B)."""
    from types import SimpleNamespace

    from graphc.passes.suggest_remedies import _media_cache_candidates

    items = [SimpleNamespace(component="media_cache.vision_encoder", bytes=3 << 20),
             SimpleNamespace(component="media_cache.audio_encoder", bytes=0),
             SimpleNamespace(component="media_cache.thinker", bytes=1 << 20),
             SimpleNamespace(component="weights.vision_encoder", bytes=1 << 30)]
    model = SimpleNamespace(pipeline=SimpleNamespace(llm=SimpleNamespace(node="thinker")))
    s = SimpleNamespace(ir=SimpleNamespace(model=model))
    (change, overrides, flags, why, trim), llm = _media_cache_candidates(s, SimpleNamespace(items=items))
    assert (change, overrides, flags, trim) == ("media_cache.vision_encoder=0",
                                                {"media_cache": {"vision_encoder": 0}}, {}, None)
    assert "3.00 MiB" in why and "repeated media is encoded again" in why
    assert llm[0] == "media_cache.thinker=0" and "computes the rows its follow stage reads again" in llm[3]
