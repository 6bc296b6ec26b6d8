"""transformers is a test-only dependency: nothing the runtime, the models or the resources import
may pull it in (an install without the test extra would crash on first use)."""
import subprocess
import sys

CODE = """
import importlib, pkgutil, sys
import graphc, graphc.runtime, models, models.components, resources
for pkg in (graphc, graphc.runtime, models, models.components, resources):
    for m in pkgutil.iter_modules(pkg.__path__, pkg.__name__ + "."):
        if m.name.endswith((".gpu", ".kernels")):
            continue            # CUDA-only modules: import flashinfer lazily, never transformers
        importlib.import_module(m.name)
import torch
from models.components.audio_inputs import log_mel
log_mel(torch.randn(1600))
print(sorted(m for m in sys.modules if m.split(".")[0] == "transformers"))
"""


def test_no_runtime_module_imports_transformers():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", out.stdout
