"""The compiler end to end on the tiny model, for several targets."""
import re

import pytest

from graphc.errors import DoesNotFit, InvalidInput
from graphc.overrides import merge
from graphc.pipeline import compile_model
from graphc.units import GiB, MiB


@pytest.mark.parametrize("gpu", ["cpu", "h100", "h200", "a100-80gb", "a100-40gb", "l40s", "b200", "b300"])
def test_tiny_plans_for_every_target(tiny, gpu):
    plan = compile_model(tiny, gpu).plan
    assert plan.target.gpu == gpu and len(plan.devices) == 1
    d = plan.devices[0]
    assert d.total_bytes == sum(d.ledger.values()) and d.total_bytes <= d.capacity_bytes
    assert plan.nodes["decoder"].buckets["decode"].rungs[-1] == 16
    if gpu == "cpu":
        assert "capture_pool" not in d.ledger and all(not b.captured for n in plan.nodes.values()
                                                       for b in n.buckets.values())
    else:
        assert d.ledger["capture_pool"] > 0 and d.ledger["context"] > 0
        assert len(d.capture_order) == sum(len(r) for n in plan.nodes.values() for r in n.graphs.values())


def test_weights_are_exact(tiny):
    plan = compile_model(tiny, "cpu").plan
    # encoder: in 32->128, 2 layers of (4x(128x128+128) + 2x2x128 + 128x512+512 + 512x128+128),
    # ln_post 2x128, proj 128x64+64
    layer = 4 * (128 * 128 + 128) + 4 * 128 + (128 * 512 + 512) + (512 * 128 + 128)
    enc = (32 * 128 + 128) + 2 * layer + 256 + (128 * 64 + 64)
    assert plan.nodes["encoder"].num_params == enc and plan.nodes["encoder"].weights_bytes == 2 * enc


def test_two_gpus_place_each_node(tiny_small):
    plan = compile_model(tiny_small, "h100", 2, replicas=1).plan
    assert {n.device for n in plan.nodes.values()} <= {0, 1} and len(plan.devices) == 2
    for d in plan.devices:
        assert d.total_bytes <= d.capacity_bytes


def test_pins_are_honoured(tiny_small):
    plan = compile_model(tiny_small, "h100", 2, {"nodes": {"encoder": {"device": 1}, "decoder": {"device": 0}}}).plan
    assert plan.nodes["encoder"].device == 1 and plan.nodes["decoder"].device == 0
    assert plan.devices[1].nodes == ["encoder"]


def test_fill_pool_takes_what_is_left(tiny_small):
    plan = compile_model(tiny_small, "h100", memory_cap=2 * GiB).plan
    d = plan.devices[0]
    page = plan.resources["decoder_kv"].page_bytes
    assert 0 <= d.free_bytes < page + 2 * MiB     # at most a page and an allocator segment left over
    assert d.kv_pages["decoder_kv"] >= plan.resources["decoder_kv"].min_pages


def test_capture_limit_makes_steps_eager(tiny):
    plan = compile_model(tiny, "h100", 1, {"walks": {"audio_prefill": {"capture_limit": {"encoder": 2}}}}).plan
    bk = plan.nodes["encoder"].buckets["audio_prefill"]
    assert bk.captured == [1, 2] and bk.eager_above == 2
    assert "encoder@audio_prefill" in plan.devices[0].sources["activations"]
    assert len(plan.nodes["encoder"].graphs["prefill:windows"]) == 2


def test_explicit_ladder(tiny):
    plan = compile_model(tiny, "h100", 1, {"walks": {"prefill": {"ladder": [32, 100]}}}).plan
    assert plan.nodes["decoder"].buckets["prefill"].rungs == [32, 100, 128]


def test_a_nodes_own_ladder_beats_its_walks(tiny):
    """audio_prefill runs encoder (windows, budget 4) then decoder (tokens, budget 128). The walk's ladder
    [2, 64] gives the encoder [2, 4]; the decoder's own [16, 48] gives it [16, 48, 128], not [2, 64, 128]."""
    walk = {"ladder": [2, 64], "ladders": {"decoder": [16, 48]}}
    plan = compile_model(tiny, "h100", 1, {"walks": {"audio_prefill": walk}}).plan
    assert plan.nodes["encoder"].buckets["audio_prefill"].rungs == [2, 4]
    assert plan.nodes["decoder"].buckets["audio_prefill"].rungs == [16, 48, 128]
    assert plan.nodes["decoder"].buckets["prefill"].rungs == [1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128]


@pytest.mark.parametrize("walk, says", [
    ({"ladders": {"vocoder": [8]}}, "sets ladders for 'vocoder', which is not on its path"),
    ({"ladders": {"decoder": [48, 16]}}, "ladders.decoder [48, 16] must be strictly increasing"),
    ({"ladders": {"decoder": []}}, "ladders.decoder [] must be strictly increasing"),
])
def test_a_bad_node_ladder_is_refused(tiny, walk, says):
    with pytest.raises(InvalidInput, match=re.escape(says)):
        compile_model(tiny, "h100", 1, {"walks": {"audio_prefill": walk}})


def test_does_not_fit_lists_ranked_remedies(tiny_small):
    fixed = {"resources": {"decoder_kv": {"pages": 512}}}
    need = compile_model(tiny_small, "h100", 1, fixed, memory_cap=2 * GiB).plan.devices[0]
    cap = need.total_bytes - need.ledger["headroom"] - 1 * MiB     # 1 MiB short of what one device needs
    with pytest.raises(DoesNotFit) as e:
        compile_model(tiny_small, "h100", 1, fixed, memory_cap=cap, headroom=0)
    remedies = e.value.remedies
    assert remedies and all(r.freed > 0 for r in remedies)
    fits = [r for r in remedies if r.fits]
    assert fits and remedies[:len(fits)] == fits                     # those that fit alone come first
    assert [r.freed for r in fits] == sorted((r.freed for r in fits), reverse=True)
    for r in [r for r in fits if r.overrides][:2]:                    # and each really does fit
        assert r.freed >= 1 * MiB
        assert compile_model(tiny_small, "h100", 1, merge(fixed, r.overrides), memory_cap=cap, headroom=0).plan
    assert compile_model(tiny_small, "h100", 2, fixed, memory_cap=cap, headroom=0).plan   # so does a second GPU
    assert "device 0 needs" in str(e.value) and "Fix:" in str(e.value)


def test_request_longer_than_the_pool_is_refused(tiny):
    with pytest.raises(DoesNotFit, match=r"holds 32 pages \(512 tokens\); the longest allowed request \(1,024 tokens\)") as e:
        compile_model(tiny, "h100", 1, {"resources": {"decoder_kv": {"pages": 32}}})
    changes = [r.change for r in e.value.remedies]
    assert "resources.decoder_kv.pages=64" in changes and "resources.decoder_kv.max_seq_len=512" in changes


def test_fit_flag_trims_encoder_rungs_and_records_them(tiny_small):
    # a declared workspace that is far too big is the first thing --fit trims
    from graphc.overrides import apply_overrides
    from graphc.source import ModelSource
    import graphc as gc
    from resources import WorkspaceSpec

    m = tiny_small.model
    enc = m.resource("encoder_attn").model_copy(update={"workspace": "enc_ws", "backend": "fa2"})
    ws = WorkspaceSpec(name="enc_ws", bytes=512 * MiB, slots=2)
    m2 = gc.Model.model_validate({**m.__dict__, "resources": (enc, m.resource("decoder_kv"), ws)})
    src = ModelSource(tiny_small.file, "small", m2)
    with pytest.raises(DoesNotFit):
        compile_model(src, "h100", memory_cap=int(1.6 * GiB), remedies=False)
    out = compile_model(src, "h100", memory_cap=int(1.6 * GiB), fit=True)
    changes = [t.change for t in out.trimmed]
    assert changes and changes[0] in ("resources.enc_ws.bytes=null", "resources.enc_ws.slots=1")
    assert out.plan.trimmed[0].freed_bytes > 0
    ws = apply_overrides(m2, out.plan.overrides).resource("enc_ws")
    assert ws.bytes is None or ws.slots == 1


def test_too_small_workspace_is_refused_at_plan_time(tiny):
    import graphc as gc
    from graphc.source import ModelSource
    from resources import WorkspaceSpec

    m = tiny.model
    enc = m.resource("encoder_attn").model_copy(update={"workspace": "enc_ws", "backend": "fa2"})
    m2 = gc.Model.model_validate({**m.__dict__, "resources": (enc, m.resource("decoder_kv"),
                                                               WorkspaceSpec(name="enc_ws", bytes=4096))})
    with pytest.raises(InvalidInput, match=r"workspace 'enc_ws' holds 4.00 KiB per slot; 'encoder_attn' needs") as e:
        compile_model(ModelSource(tiny.file, "tiny", m2), "h100")
    assert "would fail at capture" in str(e.value) and "--set resources.enc_ws.bytes=" in str(e.value)
    # fa3 keeps no split-KV partials, so the same workspace is enough there
    m3 = gc.Model.model_validate({**m2.__dict__, "resources": (enc.model_copy(update={"backend": "fa3"}),
                                                               m.resource("decoder_kv"),
                                                               WorkspaceSpec(name="enc_ws", bytes=4096))})
    assert compile_model(ModelSource(tiny.file, "tiny", m3), "h100").plan


def test_a_module_named_by_import_path_plans_as_its_class(tiny):
    """The shipped models name their modules by import path (graphc.declare.ModuleRef); the same model with the
    classes themselves makes the same plan byte for byte."""
    import graphc as gc
    from graphc.declare import ModuleRef
    from graphc.source import ModelSource

    m = tiny.model
    assert all(isinstance(n.module, ModuleRef) for n in m.nodes)
    classes = gc.Model.model_validate({**m.__dict__, "nodes": tuple(n.model_copy(update={"module": n.module_class})
                                                                     for n in m.nodes)})
    assert not any(isinstance(n.module, ModuleRef) for n in classes.nodes)
    for gpu in ("cpu", "h100"):
        by_class = compile_model(ModelSource(tiny.file, "tiny", classes), gpu).plan
        assert by_class.dump() == compile_model(tiny, gpu).plan.dump()
