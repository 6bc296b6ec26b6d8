"""What a declared pipeline needs of the walks (graphc/stages.py): refused when declared or overridden,
avoided by remedies, refused by `graphc run` before anything loads. Expected messages and numbers are
worked by hand from the tiny Qwen3-Omni preset (chunk_frames 24, 2 slots, a short walk of 8-frame slots)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

import graphc as gc
from graphc.cli import main
from graphc.plan import fingerprint, load_plan
from graphc.stages import problems, slot_frames
from tests.conftest import ROOT

OMNI = str(ROOT / "models" / "qwen3_omni.py")


def _walks(**budgets) -> dict:
    """A walk table of the tiny speaking pipeline's shape, with some chunk budgets replaced."""
    table = {"dec": ("decode", ("llm",), {"seqs": 8}), "pre": ("prefill", ("llm",), {"tokens": 64, "seqs": 4}),
             "enc": ("prefill", ("enc", "llm"), {"windows": 2, "tokens": 64, "seqs": 4}),
             "f_pre": ("prefill", ("f",), {"tokens": 64, "seqs": 4}), "f_dec": ("decode", ("f",), {"seqs": 4}),
             "short": ("chunk", ("c",), {"frames": 16, "seqs": 2}), "long": ("chunk", ("c",), {"frames": 48, "seqs": 2})}
    for name, budget in budgets.items():
        table[name] = (table[name][0], table[name][1], budget)
    return table


PIPE = gc.Pipeline(stages=(
    gc.LLMStage(name="text", node="llm", decode="dec", prefill=("pre",)),
    gc.EncoderStage(name="hear", node="enc", media=("audio",), walks=("enc",)),
    gc.FollowStage(name="speak", node="f", after="text", reads="hidden", prefill="f_pre", decode="f_dec"),
    gc.ChunkStage(name="voice", node="c", after="speak", walks=("short", "long"), slot_frames=24, sample_rate=24000)))
KINDS = {"t2t": ["pre", "dec"], "a2s": ["enc", "dec", "f_pre", "f_dec", "short", "long"]}


def test_walks_that_serve_have_no_problems():
    assert problems(PIPE, _walks(), KINDS) == []
    assert slot_frames({"frames": 48, "seqs": 2}) == 24 and slot_frames({"frames": 47, "seqs": 2}) is None


@pytest.mark.parametrize("change, expect", [
    (dict(long={"frames": 24, "seqs": 2}), "the longest slot of stage voice's walks is 12 frames (long: 24 frames over 2"),
    (dict(long={"frames": 96, "seqs": 2}), "the longest slot of stage voice's walks is 48 frames"),
    (dict(long={"frames": 47, "seqs": 2}), "chunk walk long has budget {'frames': 47, 'seqs': 2}"),
    (dict(short={"frames": 16}), "chunk walk short has budget {'frames': 16}"),
])
def test_chunk_slots_must_be_whole_and_the_longest_the_stage_chunk(change, expect):
    found = problems(PIPE, _walks(**change), KINDS)
    assert len(found) == 1 and expect in found[0]


def test_the_slot_rule_names_its_fix():
    (msg,) = problems(PIPE, _walks(long={"frames": 24, "seqs": 2}), KINDS)
    assert "walks.long.budget.frames=48" in msg and "frames=24*N" in msg


def test_stage_walks_must_exist_and_have_their_kind_and_path():
    table = _walks()
    del table["f_dec"]
    assert "stage speak names walk 'f_dec', which the model does not declare" in problems(PIPE, table, KINDS)[0]
    table = _walks()
    table["enc"] = ("prefill", ("enc",), {"windows": 2})
    assert "stage hear's walk enc is a prefill walk over enc; it must be a prefill walk holding enc and ending at llm" \
        in problems(PIPE, table, KINDS)[0]
    table = _walks()
    table["dec"] = ("prefill", ("llm",), {"seqs": 8})
    assert "it must be a decode walk over llm alone" in problems(PIPE, table, KINDS)[0]


def test_a_speaking_kind_runs_every_speech_walk_and_every_kind_decodes():
    kinds = {"a2s": ["enc", "dec", "f_pre", "f_dec", "long"], "t2t": ["pre"]}
    found = problems(PIPE, _walks(), kinds)
    assert any("request kind a2s speaks but lacks walk(s) short" in m for m in found)
    assert any("request kind t2t never runs the LLM's decode walk dec" in m for m in found)
    assert len(found) == 2


def test_pipeline_shape_is_checked():
    with pytest.raises(ValueError, match="exactly one llm stage"):
        gc.Pipeline(stages=(gc.EncoderStage(name="e", node="enc", media=("audio",), walks=("enc",)),))
    with pytest.raises(ValueError, match="both or neither"):
        gc.Pipeline(stages=(PIPE.stages[0], PIPE.stages[2]))
    with pytest.raises(ValueError, match="comes after 'text', which is not the pipeline's follow stage"):
        gc.Pipeline(stages=(PIPE.stages[0], PIPE.stages[2], PIPE.stages[3].model_copy(update={"after": "text"})))


@pytest.mark.parametrize("node, port", [("code2wav", "wav"), ("talker", "next_embeds"), ("talker", "codes"),
                                        ("thinker", "hidden")])
def test_ports_the_engine_reads_must_be_declared(node, port):
    from models.qwen3_omni import declare
    model = declare(preset="tiny")
    follow = model.pipeline.follow
    assert (node, port) in {("code2wav", "wav"), (follow.node, "next_embeds"), (follow.node, follow.codes),
                            (model.pipeline.llm.node, follow.reads)}
    n = model.node(node)
    nodes = tuple(x.model_copy(update={"outputs": {k: v for k, v in n.outputs.items() if k != port}})
                  if x.name == node else x for x in model.nodes)
    edges = tuple(e for e in model.edges if e.src != f"{node}.{port}")
    links = tuple(x.model_copy(update={"outputs": tuple(o for o in x.outputs if o != port)}) if x.dst == node else x
                  for x in model.links)
    links = tuple(x for x in links if x.inputs or x.outputs)
    with pytest.raises(ValueError, match=rf"output port\(s\) {node}\.{port}, which those nodes do not declare"):
        gc.Model.model_validate({**model.__dict__, "nodes": nodes, "edges": edges, "links": links})


def test_plan_refuses_a_budget_that_breaks_the_chunk_slots(capsys, tmp_path):
    rc = main(["plan", OMNI, "--preset", "tiny", "--gpu", "cpu", "--set", "walks.code2wav_chunk.budget.frames=24",
               "-o", str(tmp_path / "p.plan")])
    err = capsys.readouterr().err
    assert rc == 2 and not (tmp_path / "p.plan").exists()
    # the chunk walk's slots now hold 12 frames: the middle walk's 16 are the longest, short of the host's 24
    assert "the longest slot of stage voice's walks is 16 frames (code2wav_mid: 32 frames over 2 slots)" in err
    assert "walks.code2wav_mid.budget.frames=48" in err


def test_a_chunk_walk_remedy_keeps_its_slots():
    """The tiny chunk walk's ladder is 1 and 2 slots of 24 frames (24, 48): the one remedy below its budget
    keeps one 24-frame slot. (Cutting frames alone to 24 over 2 slots made plans the engine refused.)"""
    from graphc.passes.suggest_remedies import _budget_candidates
    from graphc.pipeline import run_passes
    from graphc.source import load_model
    from graphc.targets import get_target

    result = run_passes(load_model(OMNI, "tiny").model, get_target("cpu"), 1)
    steps = [st for st in result.sizing.ir.steps if st.walk == "code2wav_chunk"]
    changes = [c[0] for st in steps for c in _budget_candidates(result.sizing, st)]
    assert changes and set(changes) == {"walks.code2wav_chunk.budget={frames: 24, seqs: 1}"}
    overrides = _budget_candidates(result.sizing, steps[0])[0][1]
    assert overrides == {"walks": {"code2wav_chunk": {"budget": {"frames": 24, "seqs": 1}}}}


def _broken_plan(tmp_path) -> str:
    """The shipped tiny speaking plan with its longest chunk walk cut to 12-frame slots (the middle walk's 16 are
    then the longest, short of the host's 24-frame chunks) and fingerprinted again, as a plan made by a compiler
    without the rule would be."""
    plan = load_plan(ROOT / "plans" / "qwen3_omni_tiny_cpu.plan")
    data = plan.body()
    data["walks"]["code2wav_chunk"]["budget"]["frames"] = 24
    data["fingerprint"] = fingerprint({k: v for k, v in data.items()})
    path = tmp_path / "broken.plan"
    path.write_text(json.dumps(data))
    return str(path)


def test_run_refuses_a_plan_that_breaks_its_pipeline_before_loading(tmp_path):
    """In a fresh process: refused with exit 2, the rule named, in under a second of main(), without torch."""
    code = ("import sys, time; from graphc.cli import main; t = time.perf_counter(); "
            f"rc = main(['run', {_broken_plan(tmp_path)!r}, '--random-weights']); "
            "print(rc, time.perf_counter() - t, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    rc, seconds, torch_loaded = out.stdout.split()
    assert rc == "2" and torch_loaded == "False", out.stderr
    assert float(seconds) < 1.0
    assert "cannot be served" in out.stderr and "the longest slot of stage voice's walks is 16 frames" in out.stderr


def test_run_refuses_a_plan_without_a_pipeline(tmp_path, capsys):
    plan = load_plan(ROOT / "plans" / "tiny_cpu.plan")
    data = plan.body()
    data.pop("pipeline", None)
    data["fingerprint"] = fingerprint(data)
    path = tmp_path / "old.plan"
    path.write_text(json.dumps(data))
    assert main(["run", str(path), "--random-weights"]) == 2
    assert "records no serving pipeline" in capsys.readouterr().err
