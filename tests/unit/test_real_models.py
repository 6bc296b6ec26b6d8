"""The real presets hold exactly the fact sheet's weights (shared/reference/qwen3_omni.md, section 2
and 6), node by node, built on the meta device."""
import pytest

from graphc.modules import build_module, weight_sizes
from graphc.source import load_model
from tests.conftest import ROOT

OMNI = {"audio_encoder": 1_295_854_336, "vision_encoder": 1_077_262_816, "thinker": 61_065_293_824,
        "talker": 6_366_052_352 + 283_140_608, "code2wav": 432_033_154}
ASR = {"1.7b": {"audio_encoder": 317_477_504, "thinker": 1_720_574_976},
       "0.6b": {"audio_encoder": 186_376_192, "thinker": 596_049_920}}


def params(model, name):
    return weight_sizes(build_module(model.node(name), "meta"))


def test_qwen3_omni_weights_equal_the_sheet():
    model = load_model(str(ROOT / "models" / "qwen3_omni.py")).model
    got = {n: params(model, n).params for n in OMNI}
    assert got == OMNI
    assert got["talker"] + got["code2wav"] == 7_081_226_114          # the speech side in all


@pytest.mark.parametrize("preset", ["1.7b", "0.6b"])
def test_qwen3_asr_params_equal_the_sheet(preset):
    model = load_model(str(ROOT / "models" / "qwen3_asr.py"), preset).model
    assert {n: params(model, n).num_params for n in ASR[preset]} == ASR[preset]   # tied embeddings counted once
