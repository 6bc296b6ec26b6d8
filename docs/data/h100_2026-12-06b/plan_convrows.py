"""The 9B h100 plan with gdn_conv_rows on its fla nodes (an A/B variant; the knob has no --set)."""
import sys
import graphc.pipeline as pl
from graphc.passes import select_backends as sb

orig = sb.select_backends


def patched(ir):
    out = orig(ir)
    for k in out.kernels.values():
        if "fla_gdn" in k:
            k["gdn_conv_rows"] = 1
    return out


pl.select_backends = patched
from graphc.cli import main
sys.exit(main(["plan", "models/qwen3_5.py", "--preset", "9b", "--gpu", sys.argv[1], "-o", sys.argv[2], "-q"]))
