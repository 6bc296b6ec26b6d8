"""Each structural refusal of verify_graph, on small edits of the tiny model."""
import pytest

import graphc as gc
from graphc.errors import InvalidInput
from graphc.verify import verify_graph
from graphc.targets import get_target
from resources import PagedKVSpec


def _edit(model, **changes):
    """The model with changes; its serving pipeline dropped, so verify_graph, not the pipeline's own
    rules (tests/unit/test_pipeline_requirements.py), is what refuses a broken graph."""
    return gc.Model.model_validate({**model.__dict__, "pipeline": None, **changes})


def _node(model, name, **changes):
    n = model.node(name)
    return type(n).model_validate({**n.__dict__, **changes})


def _walks(model, name, **changes):
    out = []
    for w in model.walks:
        out.append(type(w).model_validate({**w.__dict__, **changes}) if w.name == name else w)
    return tuple(out)


def check(model, devices=1, gpu="h100"):
    return verify_graph(model, get_target(gpu), devices)


def test_the_tiny_model_verifies(tiny):
    ir = check(tiny.model)
    axes = {(s.node, s.walk): s.axis for s in ir.steps}
    assert axes == {("decoder", "decode"): "seqs", ("decoder", "prefill"): "tokens",
                    ("encoder", "audio_prefill"): "windows", ("decoder", "audio_prefill"): "tokens"}
    groups = {(s.node, s.walk): s.groups for s in ir.steps}
    assert groups[("decoder", "audio_prefill")] == ("mm",) and groups[("decoder", "prefill")] == ()


def test_unbound_role(tiny):
    m = _edit(tiny.model, nodes=(_node(tiny.model, "encoder", resources={}), tiny.model.node("decoder")))
    with pytest.raises(InvalidInput, match="does not bind role"):
        check(m)


def test_role_bound_to_wrong_kind(tiny):
    m = _edit(tiny.model, nodes=(_node(tiny.model, "encoder", resources={"attn": "decoder_kv"}),
                                 tiny.model.node("decoder")))
    with pytest.raises(InvalidInput, match="needs a ragged_attention resource"):
        check(m)


def test_ports_must_agree_along_an_edge(tiny):
    bad = _node(tiny.model, "encoder", outputs={"embeds": gc.Port(shape=("windows*16", 32), dtype="bfloat16")})
    with pytest.raises(InvalidInput, match="ports disagree"):
        check(_edit(tiny.model, nodes=(bad, tiny.model.node("decoder"))))
    bad = _node(tiny.model, "encoder", outputs={"embeds": gc.Port(shape=("windows*16", 64), dtype="float32")})
    with pytest.raises(InvalidInput, match="ports disagree"):
        check(_edit(tiny.model, nodes=(bad, tiny.model.node("decoder"))))


def test_edge_to_unknown_port(tiny):
    with pytest.raises(InvalidInput, match="has no input 'embeds'"):
        check(_edit(tiny.model, edges=(gc.Edge(src="encoder.embeds", dst="decoder.embeds"),)))


def test_walk_must_follow_edges(tiny):
    m = _edit(tiny.model, walks=_walks(tiny.model, "audio_prefill", path=("decoder", "encoder")))
    with pytest.raises(InvalidInput, match="runs 'decoder' before 'encoder', which feeds it"):
        check(m)
    m = _edit(tiny.model, walks=_walks(tiny.model, "audio_prefill", path=("encoder",)))
    check(m)                                               # a walk of one node reads nothing
    m = _edit(tiny.model, edges=(), walks=_walks(tiny.model, "audio_prefill", path=("encoder", "decoder")))
    with pytest.raises(InvalidInput, match="runs 'encoder' but no node after it on the path reads it"):
        check(m)


def test_two_encoders_may_feed_one_llm_in_one_walk():
    from models.qwen3_omni import declare

    m = declare("tiny")
    assert m.walk("av_prefill").path == ("audio_encoder", "vision_encoder", "thinker")
    check(m)
    bad = m.model_copy(update={"walks": tuple(w.model_copy(update={"path": ("audio_encoder", "thinker", "vision_encoder")})
                                              if w.name == "av_prefill" else w for w in m.walks)})
    with pytest.raises(InvalidInput, match="runs 'thinker' before 'vision_encoder', which feeds it"):
        check(bad)


def test_walk_must_budget_the_capture_axis(tiny):
    m = _edit(tiny.model, walks=_walks(tiny.model, "audio_prefill", budget=gc.Budget(tokens=128, seqs=4)))
    with pytest.raises(InvalidInput, match="does not budget 'windows'"):
        check(m)


def test_stray_node(tiny):
    m = _edit(tiny.model, walks=tuple(w for w in tiny.model.walks if w.name != "audio_prefill"),
              requests=(gc.RequestKind(name="t2t", stages=("prefill", "decode")),))
    with pytest.raises(InvalidInput, match=r"\['encoder'\] are on no walk"):
        check(m)


def test_unused_resource(tiny):
    extra = PagedKVSpec(name="spare", num_layers=1, num_qo_heads=1, num_kv_heads=1, head_dim=8, max_seq_len=8)
    with pytest.raises(InvalidInput, match=r"\['spare'\] are declared but nothing uses them"):
        check(_edit(tiny.model, resources=tiny.model.resources + (extra,)))


def test_request_with_unknown_walk(tiny):
    m = _edit(tiny.model, requests=(gc.RequestKind(name="a2s", stages=("audio_prefill", ("decode", "talk"))),))
    with pytest.raises(InvalidInput, match="unknown walk 'talk'"):
        check(m)


def test_pin_out_of_range(tiny):
    m = _edit(tiny.model, nodes=(tiny.model.node("encoder"), _node(tiny.model, "decoder", device=2)))
    with pytest.raises(InvalidInput, match="pinned to device 2"):
        check(m, devices=2)


def test_cpu_plans_take_several_devices_each_a_process(tiny):
    assert check(tiny.model, devices=2, gpu="cpu").num_devices == 2     # one worker process a device (issue 12)
    m = _edit(tiny.model, nodes=(tiny.model.node("encoder"), _node(tiny.model, "decoder", device=2)))
    with pytest.raises(InvalidInput, match="pinned to device 2"):
        check(m, devices=2, gpu="cpu")
