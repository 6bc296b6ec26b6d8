import pytest

from graphc.errors import InvalidInput
from graphc.overrides import apply_overrides
from graphc.passes.select_backends import select_backends
from graphc.passes.verify_graph import verify_graph
from graphc.targets import get_target
from resources import capabilities


def backends(model, gpu):
    return select_backends(verify_graph(model, get_target(gpu), 1)).chosen


def test_auto_takes_the_arch_preference(tiny):
    assert backends(tiny.model, "h100") == {"encoder_attn": "fa3", "decoder_kv": "fa3"}
    assert backends(tiny.model, "a100-80gb") == {"encoder_attn": "fa2", "decoder_kv": "fa2"}
    assert backends(tiny.model, "b300")["encoder_attn"] == "cutlass"
    assert backends(tiny.model, "cpu") == {"encoder_attn": "torch", "decoder_kv": "torch"}


def test_override_is_honoured(tiny):
    m = apply_overrides(tiny.model, {"resources": {"encoder_attn": {"backend": "fa2"}}})
    assert backends(m, "h100")["encoder_attn"] == "fa2"


def test_override_with_no_kernels_for_the_arch_is_refused(tiny):
    m = apply_overrides(tiny.model, {"resources": {"encoder_attn": {"backend": "fa3"}}})
    with pytest.raises(InvalidInput, match="'fa3' has no kernels for sm_103; b300 has: cutlass, fa2, cudnn") as e:
        backends(m, "b300")
    assert "--set resources.encoder_attn.backend=cutlass" in str(e.value)


def test_unknown_backend_is_refused(tiny):
    m = apply_overrides(tiny.model, {"resources": {"decoder_kv": {"backend": "flash9"}}})
    with pytest.raises(InvalidInput, match="'flash9' is not a paged_kv backend"):
        backends(m, "h100")


def test_every_arch_has_a_backend_for_every_kind():
    for kind, per_arch in capabilities.TABLE.items():
        assert set(per_arch) == set(capabilities.ARCHS), kind
        assert all(per_arch[a] for a in capabilities.ARCHS), kind
