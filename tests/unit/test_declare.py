import pytest
from pydantic import ValidationError

import graphc as gc
from graphc.declare import ModuleRef
from graphc.errors import InvalidInput
from models.components.encoder import EncoderConfig, WindowEncoder
from resources import PagedKVSpec, RaggedAttentionSpec


def test_unknown_key_names_the_closest_valid_key():
    with pytest.raises(ValidationError, match=r"unknown key 'nmae' in Node; did you mean 'name'\?"):
        gc.Node(nmae="x", module=WindowEncoder, inputs={}, outputs={})
    with pytest.raises(ValidationError, match=r"unknown key 'tokenz' in Budget; did you mean 'tokens'\?"):
        gc.Budget(tokenz=3)
    with pytest.raises(ValidationError, match=r"unknown key 'page_sise'.*'page_size'"):
        PagedKVSpec(name="kv", num_layers=1, num_qo_heads=1, num_kv_heads=1, head_dim=8, max_seq_len=8, page_sise=16)


def test_port_dims_are_ints_or_axis_expressions():
    assert gc.Port(shape=("windows*104", 8), dtype="bfloat16").concrete({"windows": 3}) == (312, 8)
    assert gc.Port(shape=("patches/4", 8), dtype="bfloat16").concrete({"patches": 10}) == (3, 8)
    for bad in [("rows", 8), ("tokens*0",), (0,), ("tokens*x",)]:
        with pytest.raises(ValidationError):
            gc.Port(shape=bad, dtype="float32")


def test_budget_needs_an_axis_and_positive_values():
    with pytest.raises(ValidationError, match="at least one axis"):
        gc.Budget()
    with pytest.raises(ValidationError):
        gc.Budget(tokens=0)


def test_walk_ladder_must_increase():
    with pytest.raises(ValidationError, match="strictly increasing"):
        gc.Walk(name="w", kind="decode", path=("a",), budget=gc.Budget(seqs=4), ladder=(4, 2))


def test_node_module_must_be_a_torch_module():
    with pytest.raises(ValidationError, match="torch.nn.Module subclass"):
        gc.Node(name="x", module=int, inputs={}, outputs={})


def ref_node(module: str) -> gc.Node:
    return gc.Node(name="x", module=module, inputs={"x": gc.Port(shape=("tokens",), dtype="int64")}, outputs={})


def test_a_module_named_by_import_path_is_imported_when_first_built():
    n = ref_node("models.components.encoder:WindowEncoder")
    assert isinstance(n.module, ModuleRef) and n.module_name == "models.components.encoder.WindowEncoder"
    assert n.module_class is WindowEncoder
    assert isinstance(n.model_copy(update={"name": "y"}).module, ModuleRef)
    for bad, why in (("models.components.encoder.WindowEncoder", "neither a torch.nn.Module subclass nor"),
                     ("models.components.encoder:", "neither"), (":WindowEncoder", "neither"),
                     ("no_such_package.mod:M", "no module 'no_such_package.mod' to import"),
                     ("models.components.no_such_file:M", "no module 'models.components.no_such_file'")):
        with pytest.raises(ValidationError, match=why):
            ref_node(bad)
    # what only importing it can tell: refused when the node is first built (the compiler's first use)
    with pytest.raises(InvalidInput, match="models.components.encoder has no attribute 'NoSuch'"):
        ref_node("models.components.encoder:NoSuch").module_class
    with pytest.raises(InvalidInput, match="not a torch.nn.Module subclass"):
        ref_node("models.components.encoder_config:EncoderConfig").build()



def test_a_module_that_fails_to_import_is_refused_when_built(tmp_path, monkeypatch):
    (tmp_path / "broken_node_module.py").write_text("import torch\nraise RuntimeError('no weights here')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    n = ref_node("broken_node_module:M")                    # found, not run
    with pytest.raises(InvalidInput, match="importing broken_node_module failed: RuntimeError: no weights here"):
        n.build()


def test_model_refuses_duplicate_names():
    cfg = EncoderConfig(input_dim=4, hidden_size=8, num_layers=1, num_heads=2, ffn_dim=8, output_dim=8)
    port = {"features": gc.Port(shape=("windows*4", 4), dtype="float32")}
    node = gc.Node(name="enc", module=WindowEncoder, config=cfg, inputs=port,
                   outputs={"embeds": gc.Port(shape=("windows*4", 8), dtype="float32")}, resources={"attn": "a"})
    walk = gc.Walk(name="w", kind="encode", path=("enc",), budget=gc.Budget(windows=2))
    with pytest.raises(ValidationError, match="duplicate nodes names: enc"):
        gc.Model(name="m", nodes=(node, node), walks=(walk,),
                 resources=(RaggedAttentionSpec(name="a", num_heads=2, head_dim=4, max_segment=4),))


def test_resource_specs_check_heads():
    with pytest.raises(ValidationError, match="multiple of num_kv_heads"):
        RaggedAttentionSpec(name="a", num_heads=3, num_kv_heads=2, head_dim=4, max_segment=4)


@pytest.mark.parametrize("value,shown", [(10**6, "1,000,000"), (float("inf"), "inf"), (6.2e16, "62,000,000,000,000,000"),
                                         (70000.5, "70,000.5")])
def test_a_count_past_its_bound_is_refused_with_its_value(value, shown):
    """A layer, head or expert count past MAX_COUNT (65,536) is refused by name and value, a float infinity too
    (a `--set ...num_hidden_layers=inf` once raised OverflowError formatting it)."""
    import re

    from graphc.strict import Strict

    class Counts(Strict):
        num_hidden_layers: float

    with pytest.raises(ValidationError, match=f"num_hidden_layers is {re.escape(shown)}; a count of layers"):
        Counts.model_validate({"num_hidden_layers": value})
