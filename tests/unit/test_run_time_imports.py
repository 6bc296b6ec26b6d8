"""What run time may import. transformers is a test-only dependency: nothing the runtime, the models
or the resources import may pull it in (an install without the test extra would crash on first
use). The runtime reads plans and declarations through the core and runs no compiler pass: nothing
it imports may pull in graphc.passes or graphc.pipeline."""
import subprocess
import sys

CODE = """
import importlib, pkgutil, sys
import graphc, graphc.runtime, models, models.components, resources

def import_all(*pkgs):
    for pkg in pkgs:
        for m in pkgutil.iter_modules(pkg.__path__, pkg.__name__ + "."):
            importlib.import_module(m.name)     # CUDA-only modules import flashinfer lazily

import_all(graphc.runtime, models, models.components, resources)
import torch
from models.components.audio_inputs import log_mel
log_mel(torch.randn(1600))
compiler = sorted(m for m in sys.modules if m.startswith(("graphc.passes", "graphc.pipeline")))
import_all(graphc)                              # the compiler too: it may not need transformers either
print(sorted(m for m in sys.modules if m.split(".")[0] == "transformers"))
print(compiler)
"""


def test_run_time_imports_neither_transformers_nor_the_compiler():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    transformers, compiler = out.stdout.strip().splitlines()
    assert transformers == "[]", transformers
    assert compiler == "[]", compiler
