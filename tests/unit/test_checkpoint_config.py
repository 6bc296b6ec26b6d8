"""Declaring models from a checkpoint's config.json (graphc plan --checkpoint): the real Qwen3-Omni and
Qwen3-ASR shapes (the presets, from the fact sheet) written by transformers' own config classes come back
as the same node configs; what is missing or unsupported is refused by name; the plan records the config."""
import json

import pytest
from transformers.models.qwen3_asr.configuration_qwen3_asr import Qwen3ASRConfig
from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeConfig

from graphc.cli import main
from graphc.errors import InvalidInput
from graphc.plan import load_plan
from graphc.source import first_difference, load_model
from models import qwen3_asr, qwen3_omni
from models.components.aut import AuTEncoder, AuTEncoderHF
from models.components.qwen3_dense import Qwen3LM, Qwen3LMNested


def rope(c, mrope=True) -> dict:
    out = {"rope_type": "default", "rope_theta": c.rope_theta}
    return out | ({"mrope_section": list(c.mrope_section), "interleaved": True} if mrope else {})


def omni_config(speech: bool = True) -> dict:
    r = qwen3_omni.REAL
    th, tk, c2 = r["thinker"], r["talker"], r["code2wav"]
    drop = ("accept_hidden_layer", "rope_theta", "mrope_section")
    thinker = dict(text_config={k: v for k, v in th.model_dump().items() if k not in drop} | {"rope_parameters": rope(th)},
                   audio_config=r["aut"].model_dump(),
                   vision_config={k: v for k, v in r["vision"].model_dump().items() if k not in ("rope_theta", "hidden_act")})
    talker = dict(text_config={k: v for k, v in tk.text_config.model_dump().items() if k not in drop}
                  | {"rope_parameters": rope(tk.text_config)},
                  code_predictor_config={k: v for k, v in tk.code_predictor_config.model_dump().items() if k != "rope_theta"}
                  | {"rope_parameters": rope(tk.code_predictor_config, mrope=False)},
                  thinker_hidden_size=tk.thinker_hidden_size, num_code_groups=tk.num_code_groups,
                  codec_eos_token_id=tk.codec_eos_token_id, accept_hidden_layer=th.accept_hidden_layer)
    return Qwen3OmniMoeConfig(thinker_config=thinker, talker_config=talker, enable_audio_output=speech,
                              code2wav_config={k: v for k, v in c2.model_dump().items()
                                               if k not in ("chunk_frames", "left_context")}).to_dict()


def test_real_omni_config_declares_the_preset_nodes():
    m = qwen3_omni.declare("30b-a3b", config=json.loads(json.dumps(omni_config())))
    r = qwen3_omni.REAL
    for node, want in [("thinker", r["thinker"]), ("talker", r["talker"]), ("code2wav", r["code2wav"]),
                       ("audio_encoder", r["aut"]), ("vision_encoder", r["vision"])]:
        assert m.node(node).config == want, node
    assert [k.name for k in m.requests] == ["t2t", "a2t", "i2t", "v2t", "av2t", "t2s", "a2s"]


def test_omni_without_audio_output_declares_the_thinker_alone():
    m = qwen3_omni.declare("30b-a3b", config=omni_config(speech=False))
    assert [n.name for n in m.nodes] == ["audio_encoder", "vision_encoder", "thinker"]
    assert m.node("thinker").config.accept_hidden_layer is None
    assert {w.name for w in m.walks} == {"thinker_decode", "thinker_prefill", "thinker_mixed", "audio_prefill",
                                         "image_prefill", "video_prefill", "av_prefill"}
    assert [k.name for k in m.requests] == ["t2t", "a2t", "i2t", "v2t", "av2t"]


def asr_dicts() -> tuple[dict, dict]:
    p = qwen3_asr.PRESETS["1.7b"]
    lm = p["lm"]
    text = dict(vocab_size=lm.vocab_size, hidden_size=lm.hidden_size, num_hidden_layers=lm.num_layers,
                num_attention_heads=lm.num_heads, num_key_value_heads=lm.num_kv_heads, head_dim=lm.head_dim,
                intermediate_size=lm.intermediate_size, rope_theta=lm.rope_theta, tie_word_embeddings=True)
    hf = Qwen3ASRConfig(audio_config=dict(model_type="qwen3_asr_encoder", **p["aut"].model_dump()),
                        text_config=dict(model_type="qwen3", **text)).to_dict()
    qwenlm = {"thinker_config": {"audio_config": p["aut"].model_dump(), "text_config": text}, "dtype": "bfloat16"}
    return hf, qwenlm


def test_real_asr_configs_in_both_layouts_declare_the_preset_nodes():
    p = qwen3_asr.PRESETS["1.7b"]
    hf, qwenlm = asr_dicts()
    for config, enc, llm, prefixes in ((hf, AuTEncoderHF, Qwen3LMNested, ("model.", "")),
                                       (qwenlm, AuTEncoder, Qwen3LM, ("thinker.audio_tower.", "thinker."))):
        m = qwen3_asr.declare("1.7b", config=config)
        assert m.node("audio_encoder").config == p["aut"] and m.node("thinker").config == p["lm"]
        assert (m.node("audio_encoder").module_class, m.node("thinker").module_class) == (enc, llm)
        assert (m.node("audio_encoder").weight_prefix, m.node("thinker").weight_prefix) == prefixes


def test_what_a_config_lacks_or_uses_that_graphc_does_not_is_refused_by_name():
    hf, _ = asr_dicts()
    del hf["text_config"]
    with pytest.raises(InvalidInput, match="config.json has no text_config"):
        qwen3_asr.declare("1.7b", config=hf)
    cfg = omni_config()
    cfg["thinker_config"]["text_config"]["rope_parameters"]["rope_type"] = "yarn"
    with pytest.raises(InvalidInput, match="rope type 'yarn' is not supported"):
        qwen3_omni.declare("30b-a3b", config=cfg)
    with pytest.raises(InvalidInput, match="takes no config argument"):
        load_model("models/tiny_omni.py", "tiny", config={"x": 1})


def test_the_plan_records_the_config_and_a_difference_is_named(tmp_path):
    hf = json.loads(json.dumps(asr_dicts()[0]))          # as config.json holds it
    hf["text_config"]["num_hidden_layers"] = 2          # small enough to plan in a moment
    hf["audio_config"]["encoder_layers"] = 2
    (tmp_path / "config.json").write_text(json.dumps(hf))
    out = tmp_path / "p.plan"
    assert main(["plan", "models/qwen3_asr.py", "--preset", "1.7b", "--checkpoint", str(tmp_path), "--gpu", "h100",
                 "-o", str(out), "-q"]) == 0
    plan = load_plan(out)
    assert plan.model.config == hf and len(plan.model.config_sha256) == 64
    changed = json.loads(json.dumps(hf))
    changed["audio_config"]["d_model"] = 512
    assert first_difference(plan.model.config, changed) == "audio_config.d_model: 1024 in the plan, 512 in the checkpoint"
    assert first_difference(plan.model.config, hf) is None
    assert "in the plan, absent in the checkpoint" in first_difference({"a": 1}, {})


def test_the_asr_host_reads_the_audio_token_of_either_layout(tmp_path):
    hf, qwenlm = asr_dicts()
    hf["audio_token_id"], qwenlm["thinker_config"]["audio_token_id"] = 123, 321
    for config, want in ((hf, 123), (qwenlm, 321)):
        (tmp_path / "config.json").write_text(json.dumps(config))
        host = qwen3_asr.host(qwen3_asr.declare("1.7b", config=config), str(tmp_path))
        assert host.media.audio_token_id == want


@pytest.mark.parametrize("where, key, value", [("audio_config", "encoder_layers", 6.2e16),
                                               ("text_config", "num_hidden_layers", 10**7),
                                               ("text_config", "num_attention_heads", 65_537)])
def test_an_absurd_count_is_refused_not_built(tmp_path, capsys, where, key, value):
    """Was a hang: 6.2e16 encoder layers were built until memory ran out (found by fuzzing config.json)."""
    import time

    hf = json.loads(json.dumps(asr_dicts()[0]))
    hf[where][key] = value
    (tmp_path / "config.json").write_text(json.dumps(hf))
    t = time.perf_counter()
    assert main(["plan", "models/qwen3_asr.py", "--preset", "1.7b", "--checkpoint", str(tmp_path), "--gpu", "h100",
                 "-o", str(tmp_path / "p.plan"), "-q"]) == 2
    assert time.perf_counter() - t < 30
    err = capsys.readouterr().err
    assert f" is {int(value):,}; a count of layers, heads or experts is at most 65,536" in err, err   # by its declared name
