"""A planning process without torch._dynamo (graphc/dynamo_stub.py, issue 14): inside without_dynamo() torch's
Python meta kernels and a TorchDispatchMode run without importing it; anything but disable asked of the stand-in
imports the real module; on leaving, a later import gets the real module; `graphc plan` makes the same plan bytes
as the library (which does not use the stand-in) and never imports torch._dynamo. Each in a fresh process: the
test process may have imported torch._dynamo already, and the functions first called inside stay unwrapped."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def fresh(script: str, env: dict | None = None) -> dict:
    pre = "import json, sys\nsys.path.insert(0, sys.argv[1])\n"
    out = subprocess.run([sys.executable, "-c", pre + script, str(ROOT)], capture_output=True, text=True,
                         timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


META_OPS = r"""
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from graphc.dynamo_stub import without_dynamo, _Stub

class Count(TorchDispatchMode):           # its __torch_dispatch__ is wrapped by torch._disable_dynamo
    ops = 0
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        Count.ops += 1
        return func(*args, **(kwargs or {}))

with without_dynamo():
    x = torch.arange(6.0, device="meta")
    with Count():
        y = torch.exp(-2.0 * x) + torch.sin(x)[None, :]   # Python meta kernels (elementwise references)
    inside = {"real": "torch._dynamo.eval_frame" in sys.modules,
              "stub": isinstance(sys.modules.get("torch._dynamo"), _Stub)}
after = {"entry": type(sys.modules.get("torch._dynamo")).__name__,
         "attr": type(vars(torch).get("_dynamo")).__name__}
import torch._dynamo
print(json.dumps({"inside": inside, "after": after, "ops": Count.ops, "shape": list(y.shape),
                  "real_after": hasattr(torch._dynamo, "optimize") and not isinstance(torch._dynamo, _Stub)}))
"""


def test_meta_ops_and_a_dispatch_mode_run_without_importing_dynamo_and_leave_the_real_one_importable():
    r = fresh(META_OPS)
    assert r["shape"] == [1, 6] and r["ops"] >= 4, r
    assert r["inside"] == {"real": False, "stub": True}, r
    assert r["after"] == {"entry": "NoneType", "attr": "NoneType"}, r    # nothing of the stand-in is left
    assert r["real_after"], r


ASKED = r"""
import torch
from graphc.dynamo_stub import without_dynamo, _Stub
with without_dynamo():
    torch.exp(torch.ones(2, device="meta"))                   # the stand-in in place
    compiling = torch._dynamo.is_compiling()                  # not disable: the real module answers
    entry = sys.modules["torch._dynamo"]
print(json.dumps({"compiling": compiling, "real": not isinstance(entry, _Stub) and hasattr(entry, "optimize"),
                  "kept": sys.modules["torch._dynamo"] is entry}))
"""


def test_anything_but_disable_imports_the_real_module():
    assert fresh(ASKED) == {"compiling": False, "real": True, "kept": True}


ALREADY = r"""
import torch, torch._dynamo
from graphc.dynamo_stub import without_dynamo
before = list(sys.meta_path)
with without_dynamo():
    same = sys.meta_path == before
print(json.dumps({"same": same, "real": sys.modules["torch._dynamo"] is torch._dynamo}))
"""


def test_nothing_changes_where_dynamo_is_imported_already():
    assert fresh(ALREADY) == {"same": True, "real": True}


CLI = r"""
from graphc.cli import main
rc = main(["plan", sys.argv[1] + "/models/tiny_omni.py", "--gpu", "h100", "-o", sys.argv[2], "-q"])
print(json.dumps({"rc": rc, "dynamo": "torch._dynamo.eval_frame" in sys.modules}))
"""

LIBRARY = r"""
from graphc.pipeline import compile_model
from graphc.source import load_model
compile_model(load_model(sys.argv[1] + "/models/tiny_omni.py"), "h100").plan.save(sys.argv[2])
print(json.dumps({"dynamo": "torch._dynamo.eval_frame" in sys.modules}))
"""


def test_graphc_plan_never_imports_dynamo_and_makes_the_librarys_plan(tmp_path):
    env = dict(os.environ, GRAPHC_CACHE_DIR="off")
    pre = "import json, sys\nsys.path.insert(0, sys.argv[1])\n"

    def run(script, out):
        done = subprocess.run([sys.executable, "-c", pre + script, str(ROOT), str(out)], capture_output=True,
                              text=True, timeout=600, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    cli, lib = run(CLI, tmp_path / "cli.plan"), run(LIBRARY, tmp_path / "lib.plan")
    assert cli == {"rc": 0, "dynamo": False} and lib == {"dynamo": True}
    assert (tmp_path / "cli.plan").read_bytes() == (tmp_path / "lib.plan").read_bytes()
