"""Node configs from a checkpoint's config.json (HF field names), for `graphc plan --checkpoint DIR`.

Each function takes the sub-dict HF writes for one module and keeps the fields our config declares;
fields of the HF config that change the computation but that our modules do not implement are refused
by name rather than ignored."""
from __future__ import annotations

from typing import Any

from graphc import InvalidInput
from graphc import Strict
from models.components.aut_config import AuTConfig
from models.components.qwen3_dense_config import Qwen3Config
from models.components.thinker_config import ThinkerConfig
from models.components.vision_config import VisionConfig

DTYPES = ("float32", "bfloat16", "float16")


def sub(cfg: dict, *path: str) -> dict:
    """cfg[path[0]][path[1]]..., refused by name when absent."""
    at = cfg
    for i, key in enumerate(path):
        if not isinstance(at, dict) or key not in at:
            raise InvalidInput(f"config.json has no {'.'.join(path[:i + 1])}",
                               "graphc reads the model's shapes from it", "pass the checkpoint of a supported model")
        at = at[key]
    return at


def _pick(cls: type[Strict], d: dict, extra: dict[str, Any] | None = None) -> Any:
    fields = {k: d[k] for k in cls.model_fields if k in d and d[k] is not None}
    return cls(**{**fields, **(extra or {})})


def rope(d: dict, kinds: tuple[str, ...] = ("default",)) -> dict[str, Any]:
    """rope_theta and mrope_section from rope_parameters (transformers 5) or rope_theta + rope_scaling."""
    params = d.get("rope_parameters") or d.get("rope_scaling") or {}
    out = {}
    theta = params.get("rope_theta", d.get("rope_theta"))
    if theta is not None:
        out["rope_theta"] = float(theta)
    if params.get("mrope_section") is not None:
        out["mrope_section"] = tuple(params["mrope_section"])
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in kinds:
        raise InvalidInput(f"rope type '{kind}' is not supported", f"from {params}", "use a checkpoint with default rope")
    return out


def dtype(cfg: dict, *subs: dict) -> str:
    """The checkpoint's float dtype ('dtype' or 'torch_dtype', nearest first), bfloat16 if none."""
    for d in (*subs, cfg):
        v = d.get("dtype", d.get("torch_dtype"))
        if v is not None:
            if v not in DTYPES:
                raise InvalidInput(f"config.json dtype '{v}'", f"graphc serves {sorted(DTYPES)}", "convert the checkpoint")
            return v
    return "bfloat16"


def aut(d: dict) -> AuTConfig:
    act = d.get("activation_function", "gelu")
    if act != "gelu":
        raise InvalidInput(f"audio encoder activation '{act}'", "the AuT node runs GELU", "")
    return _pick(AuTConfig, d)


def vision(d: dict) -> VisionConfig:
    return _pick(VisionConfig, d, {k: v for k, v in rope(d, ("default", "axial")).items() if k == "rope_theta"})


ALIASES = {"num_experts": "num_local_experts"}     # transformers 5 writes some MoE configs with the new name


def moe_text(d: dict) -> dict:
    """A MoE text config's fields under the names our configs use."""
    return {**d, **{ours: d[theirs] for ours, theirs in ALIASES.items() if ours not in d and theirs in d}}


def thinker(text: dict, accept_hidden_layer: int | None) -> ThinkerConfig:
    return _pick(ThinkerConfig, moe_text(text), {**rope(text), "accept_hidden_layer": accept_hidden_layer})


def qwen3(text: dict, tie: bool | None = None) -> Qwen3Config:
    extra = {"num_layers": text["num_hidden_layers"], "num_heads": text["num_attention_heads"],
             "num_kv_heads": text["num_key_value_heads"],
             "head_dim": text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]}
    extra.update({k: v for k, v in rope(text).items() if k == "rope_theta"})
    if tie is not None:
        extra["tie_word_embeddings"] = tie
    return _pick(Qwen3Config, text, extra)


def talker(d: dict):
    """Qwen3-Omni's talker (talker_config: text_config, code_predictor_config and the talker's own ids)."""
    from models.components.talker_config import CodePredictorConfig, TalkerConfig, TalkerTextConfig

    text, cp = sub(d, "text_config"), sub(d, "code_predictor_config")
    own = {k: d[k] for k in ("thinker_hidden_size", "num_code_groups", "codec_eos_token_id") if d.get(k) is not None}
    return TalkerConfig(text_config=_pick(TalkerTextConfig, moe_text(text), rope(text)),
                        code_predictor_config=_pick(CodePredictorConfig, cp,
                                                    {k: v for k, v in rope(cp).items() if k == "rope_theta"}),
                        **own)


def code2wav(d: dict, serving):
    """Code2Wav from code2wav_config; how it is chunked for serving (chunk_frames, left_context) stays the
    preset's, `serving`."""
    from models.components.code2wav_config import Code2WavConfig

    extra = {"chunk_frames": serving.chunk_frames, "left_context": serving.left_context}
    extra |= {k: v for k, v in rope(d).items() if k == "rope_theta"}
    return _pick(Code2WavConfig, d, extra)
