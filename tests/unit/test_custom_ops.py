"""Every graphc torch operator keeps its mutated arguments present when the dispatcher calls it: none has a
default value. torch 2.11's dispatcher (the GPU image's) drops trailing arguments equal to their defaults before
the ADInplaceOrView kernel of a custom op, which then bumps each mutated argument's version by its index in what
is left: a mutated argument with a default, passed as its default (None), is indexed past the end and the call
fails with IndexError (torch 2.13, this machine's, does not fail such a call, so no CPU test of the operators shows it). The operators are found by their
registrations in the source, so a new one is held to this too."""
import importlib
import re
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
REGISTERED = re.compile(r'custom_op\("graphc::(\w+)"')


def defining_modules() -> dict[str, str]:
    """graphc operator name -> the module that registers it."""
    found = {}
    for folder in ("graphc", "models", "resources"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for name in REGISTERED.findall(path.read_text()):
                found[name] = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    return found


def test_no_graphc_operator_gives_a_mutated_argument_a_default():
    ops = defining_modules()
    assert len(ops) >= 30 and "select_codes" in ops, ops
    bad = []
    for name, module in sorted(ops.items()):
        importlib.import_module(module)
        schema = getattr(torch.ops.graphc, name).default._schema
        bad += [f"graphc::{name}({a.name})" for a in schema.arguments
                if a.alias_info is not None and a.alias_info.is_write and a.has_default_value()]
    assert not bad, f"mutated arguments with a default (give them none; pass them always): {bad}"
