import pytest

from graphc.errors import InvalidInput
from graphc.overrides import apply_overrides
from graphc.passes.select_backends import select_backends
from graphc.verify import verify_graph
from graphc.targets import get_target
from resources import PagedKVSpec, RaggedAttentionSpec, capabilities


def backends(model, gpu):
    return {k: c.prefill for k, c in select_backends(verify_graph(model, get_target(gpu), 1)).chosen.items()}


def test_auto_takes_the_arch_preference(tiny):
    assert backends(tiny.model, "h100") == {"encoder_attn": "triton", "decoder_kv": "fa3"}   # 16-row windows
    assert select_backends(verify_graph(tiny.model, get_target("h100"), 1)).backend("decoder_kv", "decode") == "triton"
    assert backends(tiny.model, "a100-80gb") == {"encoder_attn": "fa2", "decoder_kv": "fa2"}
    assert backends(tiny.model, "b300")["encoder_attn"] == "cutlass"
    assert backends(tiny.model, "cpu") == {"encoder_attn": "torch", "decoder_kv": "torch"}


def test_override_is_honoured(tiny):
    m = apply_overrides(tiny.model, {"resources": {"encoder_attn": {"backend": "fa2"}}})
    assert backends(m, "h100")["encoder_attn"] == "fa2"


def test_override_with_no_kernels_for_the_arch_is_refused(tiny):
    m = apply_overrides(tiny.model, {"resources": {"encoder_attn": {"backend": "fa3"}}})
    with pytest.raises(InvalidInput, match="'fa3' has no kernels for sm_103; b300 has: cutlass, fa2") as e:
        backends(m, "b300")
    assert "--set resources.encoder_attn.backend=cutlass" in str(e.value)
    assert "cudnn" not in str(e.value)                   # not offered: it is not planned (below)


def test_cudnn_is_refused_until_its_workspace_is_modelled(tiny):
    """The table lists cudnn on sm_90, but nothing sizes its float workspace: asking for it is refused with
    why and the fix, on the arch where it exists (elsewhere the usual no-kernels refusal)."""
    m = apply_overrides(tiny.model, {"resources": {"encoder_attn": {"backend": "cudnn"}}})
    with pytest.raises(InvalidInput, match="backend 'cudnn' is not planned") as e:
        backends(m, "h100")
    assert "neither modelled nor measured" in str(e.value)
    assert "--set resources.encoder_attn.backend=auto (on h100: triton, fa3, fa2)" in str(e.value)
    with pytest.raises(InvalidInput, match="'cudnn' has no kernels for sm_80"):
        backends(m, "a100-80gb")


def test_unknown_backend_is_refused(tiny):
    m = apply_overrides(tiny.model, {"resources": {"decoder_kv": {"backend": "flash9"}}})
    with pytest.raises(InvalidInput, match="'flash9' is not a paged_kv backend"):
        backends(m, "h100")


def test_every_arch_has_a_backend_for_every_kind():
    for kind, per_arch in capabilities.TABLE.items():
        assert set(per_arch) == set(capabilities.ARCHS), kind
        assert all(per_arch[a] for a in capabilities.ARCHS), kind


def test_head_dim_a_backend_lacks_runs_padded_or_is_refused():
    assert capabilities.choose("ragged_attention", "sm_90", "auto", "v", "h100", 72) == ("fa3", 128)
    assert capabilities.choose("ragged_attention", "sm_90", "auto", "a", "h100", 64) == ("fa3", 64)
    assert capabilities.choose("ragged_attention", "sm_80", "auto", "v", "a100-80gb", 72) == ("fa2", 128)
    with pytest.raises(InvalidInput, match="no kernels for head_dim 300"):
        capabilities.choose("ragged_attention", "sm_90", "fa3", "v", "h100", 300)


def test_decode_backend_is_chosen_apart_and_refused_apart(tiny, tiny_small):
    chosen = select_backends(verify_graph(tiny_small.model, get_target("h100"), 1))
    assert (chosen.backend("decoder_kv"), chosen.backend("decoder_kv", "decode")) == ("fa3", "triton")
    m = apply_overrides(tiny_small.model, {"resources": {"decoder_kv": {"decode_backend": "fa3"}}})
    assert select_backends(verify_graph(m, get_target("h100"), 1)).backend("decoder_kv", "decode") == "fa3"
    m = apply_overrides(tiny.model, {"resources": {"decoder_kv": {"decode_backend": "fa3", "head_dim": 48}}})
    with pytest.raises(InvalidInput, match="takes head_dim 48"):
        select_backends(verify_graph(m, get_target("h100"), 1))
    m = apply_overrides(tiny.model, {"resources": {"decoder_kv": {"decode_backend": "trtllm-gen"}}})
    with pytest.raises(InvalidInput, match="decode_backend=triton"):
        select_backends(verify_graph(m, get_target("h100"), 1))
    # triton's decode kernel holds a head in one power-of-two block (FlashInfer's prefill refuses 48 first in a
    # plan; asked of the table alone, triton refuses it with its own reason and offers what fits)
    kv48 = PagedKVSpec(name="kv", num_layers=1, num_qo_heads=4, num_kv_heads=2, head_dim=48, max_seq_len=64)
    with pytest.raises(InvalidInput, match="backend 'triton' cannot run it") as e:
        capabilities.choose("paged_kv_decode", "sm_90", "triton", "kv", "h100", 48, "decode_backend", False, kv48)
    assert "head_dim 48: it takes powers of two from 16 to 128" in str(e.value)
    assert "--set resources.kv.decode_backend=auto (on h100: fa2, fa3)" in str(e.value)
    # auto passes over it for a head dim of 256 (Qwen3.5's), saying why
    m = apply_overrides(tiny.model, {"resources": {"decoder_kv": {"head_dim": 256}}})
    kv = select_backends(verify_graph(m, get_target("h100"), 1)).chosen["decoder_kv"]
    assert kv.decode == "fa2" and "(triton: head_dim 256: it takes powers of two from 16 to 128)" in kv.why


def test_padded_head_dim_sizes_the_float_workspace(tiny):
    """Vision's head dim 72 runs padded to 128 on fa2 (sm_80): its split-KV partials are 128 wide
    (a 20 MiB workspace sized for 72 failed FlashInfer's aligned_alloc on the H200)."""
    from resources import StepShape

    spec = RaggedAttentionSpec(name="v", num_heads=16, head_dim=72, max_segment=1024)
    shape = StepShape(rows=4096, seqs=4, kv_len=1024)
    at72 = spec.float_workspace("fa2", shape, 132).bytes
    at128 = spec.float_workspace("fa2", shape, 132, head_dim=128).bytes
    assert at128 > 20 * 2**20 > at72


def choices(model, gpu):
    return select_backends(verify_graph(model, get_target(gpu), 1)).chosen


def test_why_says_whether_the_backend_was_requested(tiny):
    auto = choices(tiny.model, "h100")["encoder_attn"]
    assert auto.why == "auto: first in preference order; sm_90 ragged_attention has triton, fa3, fa2, cudnn"
    m = apply_overrides(tiny.model, {"resources": {"encoder_attn": {"backend": "fa2"}}})
    asked = choices(m, "h100")["encoder_attn"]
    assert (asked.prefill, asked.decode) == ("fa2", "fa2")
    assert asked.why == "requested 'fa2'; sm_90 ragged_attention has triton, fa3, fa2, cudnn"


def test_resources_that_are_not_attention_are_skipped_wherever_they_are_declared():
    """A workspace declared before the attention resource that uses it: the pass steps over it and
    still chooses backends for what follows."""
    import graphc as gc
    from tests import oracle_model

    m = oracle_model.declare()
    ws, cache = m.resource("ws"), m.resource("cache")
    first = gc.Model.model_validate({**m.__dict__, "resources": (ws, cache)})
    chosen = choices(first, "h100")
    assert set(chosen) == {"cache"} and (chosen["cache"].prefill, chosen["cache"].decode) == ("fa3", "triton")


def test_a_requested_decode_backend_is_never_padded(tiny):
    """On sm_100 trtllm-gen prefills any head dim; fa2 would decode 96 only zero-padded to 128, which a
    KV cache (stored at its real head dim) cannot be: refused, where 'auto' keeps trtllm-gen."""
    m = apply_overrides(tiny.model, {"resources": {"decoder_kv": {"head_dim": 96}}})
    auto = choices(m, "b200")["decoder_kv"]
    assert (auto.prefill, auto.decode, auto.head_dim) == ("trtllm-gen", "trtllm-gen", 96)
    m = apply_overrides(tiny.model, {"resources": {"decoder_kv": {"head_dim": 96, "decode_backend": "fa2"}}})
    with pytest.raises(InvalidInput, match="backend 'fa2' has no kernels for head_dim 96") as e:
        choices(m, "b200")
    assert "--set resources.decoder_kv.decode_backend=auto" in str(e.value)


def test_padded_head_dim_is_noted_only_when_padded(tiny):
    """Windows of 40 rows (triton takes at most 32): fa3, which has kernels for head dims 64, 128 and 256."""
    windows = {"max_segment": 40, "rows_per_segment": 40}
    native = choices(apply_overrides(tiny.model, {"resources": {"encoder_attn": windows}}), "h100")["encoder_attn"]
    assert (native.prefill, native.head_dim) == ("fa3", 64) and "zero-padded" not in native.why
    m = apply_overrides(tiny.model, {"resources": {"encoder_attn": {**windows, "head_dim": 72}}})
    padded = choices(m, "h100")["encoder_attn"]
    assert (padded.prefill, padded.head_dim) == ("fa3", 128)
    assert padded.why == ("auto: first in preference order; sm_90 ragged_attention has triton, fa3, fa2, cudnn "
                          "(triton: max_segment 40 > 32); fa3 takes no head_dim 72: runs zero-padded to 128")
    fits = choices(apply_overrides(tiny.model, {"resources": {"encoder_attn": {"head_dim": 72}}}), "h100")
    assert (fits["encoder_attn"].prefill, fits["encoder_attn"].head_dim) == ("triton", 72), "triton runs 72 as is"


def test_triton_is_taken_only_for_short_segments_of_one_length(tiny):
    """'triton' (resources/ragged_triton.py) holds a whole segment in one program: first in sm_90's order (the
    H200 measured it faster than fa3 on 16-row frames), auto takes it where it fits (tiny's 16-row encoder
    windows), a resource with segments of one length up to 32 rows, a power-of-two GQA group and a head dim up
    to 256; auto passes over it for any other and says why, and asking for it there is refused with every
    reason and the backends that fit."""
    c = choices(tiny.model, "h100")["encoder_attn"]
    assert (c.prefill, c.decode, c.head_dim) == ("triton", "triton", 64)
    asked = {"backend": "triton"}
    c = choices(apply_overrides(tiny.model, {"resources": {"encoder_attn": {"max_segment": 32,
                                                                              "rows_per_segment": 32}}}), "h100")
    assert c["encoder_attn"].prefill == "triton"
    bad = apply_overrides(tiny.model, {"resources": {"encoder_attn": {**asked, "rows_per_segment": None,
                                                                       "max_segment": 40, "head_dim": 288}}})
    with pytest.raises(InvalidInput, match="backend 'triton' cannot run it") as e:
        choices(bad, "h100")
    assert ("its segments have no fixed length (rows_per_segment); max_segment 40 > 32; head_dim 288 > 256"
            in str(e.value))
    assert "--set resources.encoder_attn.backend=auto (on h100: fa3, fa2)" in str(e.value)
    long = {"max_segment": 33, "rows_per_segment": 33}
    with pytest.raises(InvalidInput, match="max_segment 33 > 32"):
        choices(apply_overrides(tiny.model, {"resources": {"encoder_attn": {**asked, **long}}}), "h100")
    c = choices(apply_overrides(tiny.model, {"resources": {"encoder_attn": long}}), "h100")["encoder_attn"]
    assert c.prefill == "fa3"
    assert c.why == ("auto: first in preference order; sm_90 ragged_attention has triton, fa3, fa2, cudnn "
                     "(triton: max_segment 33 > 32)")
    c = choices(apply_overrides(tiny.model, {"resources": {"encoder_attn": {"rows_per_segment": None}}}), "h100")
    assert c["encoder_attn"].prefill == "fa3", "segments of any length up to 16: fa3"
    spec = RaggedAttentionSpec(name="x", num_heads=6, num_kv_heads=2, head_dim=64, max_segment=16, rows_per_segment=16)
    assert capabilities.unfit(spec, "triton") == "its GQA group of 3 heads is not a power of two"
    assert capabilities.unfit(spec, "fa3") is None
    assert capabilities.unfit(None, "triton"), "no resource given: not taken"
    assert choices(tiny.model, "a100-80gb")["encoder_attn"].prefill == "fa2", "no triton on sm_80: not measured"
    with pytest.raises(InvalidInput, match="'triton' has no kernels for sm_80"):
        choices(apply_overrides(tiny.model, {"resources": {"encoder_attn": asked}}), "a100-80gb")

