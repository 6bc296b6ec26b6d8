"""Chunk walks carry whole slots (Code2Wav): seqs at a rung counts its slots, walks of different slot
lengths on one node capture separate graph families, and plans name those graphs so that the GPU
runtime parses them back. Expected values are worked by hand from the presets."""
import glob

import pytest

from graphc.errors import InvalidInput
from graphc.ir import build_ir
from graphc.pipeline import compile_model
from graphc.passes.emit_plan import graph_id
from graphc.plan import load_plan, parse_graph_id
from graphc.runtime.boot import plan_ir
from graphc.source import load_model
from graphc.targets import get_target

OMNI = "models/qwen3_omni.py"


@pytest.fixture(scope="module")
def real_ir():
    return build_ir(load_model(OMNI).model, get_target("h200"), 1)


def step(ir, walk):
    return next(s for s in ir.steps if s.walk == walk and s.node == "code2wav")


def test_a_chunk_rung_counts_its_slots(real_ir):
    long, mid, short = (step(real_ir, w) for w in ("code2wav_chunk", "code2wav_mid", "code2wav_short"))
    assert (long.slot, mid.slot, short.slot) == (100, 64, 16)     # 1600 frames / 16 slots; 1024 / 16; 256 / 16
    assert long.sizes_at(400) == {"frames": 400, "seqs": 4}
    assert long.sizes_at(1600) == {"frames": 1600, "seqs": 16}
    assert short.sizes_at(64) == {"frames": 64, "seqs": 4}
    assert mid.sizes_at(128) == {"frames": 128, "seqs": 2}
    assert len({long.family, mid.family, short.family}) == 3      # one node, three families of graphs
    talker = next(s for s in real_ir.steps if s.walk == "talker_prefill")
    assert talker.slot is None and talker.sizes_at(128)["seqs"] == 32   # a prefill's seqs stay its budget


def test_a_rung_that_is_not_whole_slots_is_refused():
    src = load_model(OMNI, "tiny")
    with pytest.raises(InvalidInput) as e:
        compile_model(src, "cpu", 1, {"walks": {"code2wav_chunk": {"ladder": [24, 36]}}})
    msg = str(e.value)
    assert "code2wav_chunk" in msg and "[36]" in msg and "24" in msg


@pytest.mark.parametrize("path", sorted(glob.glob("plans/*.plan")))
def test_every_planned_graph_id_parses_back_to_a_family_the_ir_knows(path):
    plan = load_plan(path)
    ir = plan_ir(plan)
    for d in plan.devices:
        for gid in d.capture_order:
            node, family, rung = parse_graph_id(gid)
            assert graph_id((node, family, rung)) == gid
            assert rung in plan.nodes[node].graphs[family]
            assert ir.family(node, family).node == node


def test_graph_ids_with_a_slash_in_the_family_parse():
    assert parse_graph_id("code2wav/prefill:frames/x/1600") == ("code2wav", "prefill:frames/x", 1600)


@pytest.mark.parametrize("frames, want", [
    # 2, 4 (+2), 8 (+6) | 16 (+14), 32 (+25), the last 38 (+25) = 63
    (100, [16, 16, 16, 64, 64, 64]),
    # ... 32 (+25) | 64 (+25) = 89, 75 (+25), the last 49 (+25) = 74
    (250, [16, 16, 16, 64, 64, 100, 100, 100]),
])
def test_an_answers_chunks_take_the_shortest_planned_slot_that_holds_them(real_ir, frames, want):
    """The real preset's streamed chunks (first chunk 2 frames, doubling, 25 frames of left context) in the
    plan's slot lengths (16, 64, 100), each in the shortest that holds it: worked by hand, a 100-frame (8 s)
    answer decodes 3 x 16 + 3 x 64 frames of slots and a 250-frame one 3 x 16 + 2 x 64 + 3 x 100."""
    from models.components.code2wav import stream_chunk_frames, stream_slot
    from models.qwen3_omni import CHUNKS, REAL

    lengths = sorted(step(real_ir, w).slot for w in CHUNKS)
    got, start, i = [], 0, 0
    while start < frames:
        end = min(start + stream_chunk_frames(REAL["code2wav"], i, 2), frames)
        got.append(min(n for n in lengths if n >= stream_slot(REAL["code2wav"], start, end).frames))
        start, i = end, i + 1
    assert lengths == [16, 64, 100] and got == want
