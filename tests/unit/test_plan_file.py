import pytest

from graphc.errors import InvalidInput
from graphc.pipeline import compile_model
from graphc.plan import load_plan


def test_plan_round_trips(tmp_path, tiny):
    plan = compile_model(tiny, "h100").plan
    path = tmp_path / "t.plan"
    plan.save(path)
    again = load_plan(path)
    assert again == plan and again.fingerprint == plan.fingerprint


def test_edited_plan_is_refused(tmp_path, tiny):
    path = tmp_path / "t.plan"
    compile_model(tiny, "h100").plan.save(path)
    path.write_text(path.read_text().replace("budget: 16", "budget: 32", 1))
    with pytest.raises(InvalidInput, match="edited after it was compiled"):
        load_plan(path)


def test_not_a_plan_is_refused(tmp_path):
    path = tmp_path / "x.plan"
    path.write_text("format: something/else\n")
    with pytest.raises(InvalidInput, match="is not a graphc.plan/1 plan"):
        load_plan(path)
    path.write_text("!!python/object:os.system ['true']\n")
    with pytest.raises(InvalidInput, match="not valid YAML"):
        load_plan(path)


def test_unknown_key_in_a_plan_is_refused(tmp_path, tiny):
    import yaml

    from graphc.plan import fingerprint

    data = compile_model(tiny, "h100").plan.model_dump(mode="json")
    data["devices"][0]["ledgre"] = {}
    data.pop("fingerprint")
    data["fingerprint"] = fingerprint(data)
    path = tmp_path / "t.plan"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(InvalidInput, match="unknown key 'ledgre'.*did you mean 'ledger'"):
        load_plan(path)


@pytest.mark.parametrize("libyaml", [True, False])
def test_shipped_plans_load_and_edits_are_refused_with_or_without_libyaml(monkeypatch, tmp_path, libyaml):
    """Plans are written and fingerprinted by libyaml's emitter where PyYAML has it, its Python emitter
    otherwise, and the two give the same text: every shipped plan is written again byte for byte and keeps its
    fingerprint either way, loads either way, and an edited one is refused either way."""
    import glob

    import yaml

    if not libyaml:
        monkeypatch.delattr(yaml, "CSafeDumper", raising=False)
    from graphc.plan import fingerprint

    for f in sorted(glob.glob("plans/*.plan")):
        plan = load_plan(f)
        assert plan.to_yaml() == open(f).read() and fingerprint(plan.body()) == plan.fingerprint, f
        edited = tmp_path / "edited.plan"
        edited.write_text(open(f).read().replace("capacity_bytes: ", "capacity_bytes: 1", 1))
        with pytest.raises(InvalidInput, match="edited after it was compiled"):
            load_plan(edited)
