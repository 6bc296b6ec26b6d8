import pytest

from graphc.errors import InvalidInput
from graphc.overrides import apply_overrides, merge, parse_set


def test_parse_set_builds_nested_values():
    got = parse_set(["walks.prefill.budget.tokens=256", "walks.prefill.ladder=[8, 64]",
                     "resources.decoder_kv.backend=fa2", "resources.decoder_kv.pages=null"])
    assert got == {"walks": {"prefill": {"budget": {"tokens": 256}, "ladder": [8, 64]}},
                   "resources": {"decoder_kv": {"backend": "fa2", "pages": None}}}


def test_parse_set_refuses_malformed_items():
    with pytest.raises(InvalidInput, match="has no '='"):
        parse_set(["walks.prefill"])
    with pytest.raises(InvalidInput, match="empty part"):
        parse_set(["walks..x=1"])


def test_merge_is_deep_and_right_biased():
    assert merge({"a": {"b": 1, "c": 2}}, {"a": {"c": 3}}) == {"a": {"b": 1, "c": 3}}


def test_overrides_apply_and_revalidate(tiny):
    m = apply_overrides(tiny.model, {"walks": {"prefill": {"budget": {"tokens": 64}}},
                                     "resources": {"decoder_kv": {"pages": 99}}})
    assert m.walk("prefill").budget.tokens == 64 and m.walk("prefill").budget.seqs == 4
    assert m.resource("decoder_kv").pages == 99
    assert tiny.model.walk("prefill").budget.tokens == 128   # the declaration is untouched


@pytest.mark.parametrize("overrides, message", [
    ({"walk": {}}, "unknown section 'walk'.*use 'walks'"),
    ({"walks": {"prefil": {"capture": False}}}, "unknown walk 'prefil'.*use 'prefill'"),
    ({"walks": {"prefill": {"budgt": {}}}}, "unknown key 'budgt'.*use 'budget'"),
    ({"resources": {"decoder_kv": {"page_sise": 8}}}, "unknown key 'page_sise'.*use 'page_size'"),
    ({"walks": {"prefill": {"path": ["decoder"]}}}, "cannot be overridden"),
    ({"walks": {"prefill": {"budget": {"tokens": -1}}}}, "greater than or equal to 1"),
    ({"resources": {"decoder_kv": {"pages": "many"}}}, "valid integer"),
])
def test_bad_overrides_are_refused_with_a_hint(tiny, overrides, message):
    with pytest.raises(InvalidInput, match="(?s)" + message):
        apply_overrides(tiny.model, overrides)
