"""The Qwen3.5 text decoder's declaration half (models/components/qwen3_5_text.py): its config, read from a
checkpoint's config.json `text_config` (HF's Qwen3_5TextConfig field names; Qwen3_5MoeTextConfig for the MoE sizes,
HF's qwen3_5_moe_text), the two resources its layers share (paged KV for the full-attention layers, state slots
for the Gated DeltaNet layers) and the node's ports. No torch.
"""
from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from graphc import InvalidInput, Port, Strict
from models.components.gated_deltanet_config import GatedDeltaNetConfig, state_spec
from models.components.thinker_config import check_mrope_section
from resources.linear_state import LinearStateSpec
from resources.paged_kv import PagedKVSpec

LayerType = Literal["linear_attention", "full_attention"]

# text_config keys that change the dense config's computation, and why Qwen3_5TextConfig refuses them
REFUSED = {"num_experts": "a MoE text config (qwen3_5_moe_text): read it with Qwen3_5MoeTextConfig (model_type "
                          "qwen3_5_moe), not the dense config",
           "mlp_only_layers": "a MoE layer list: the dense config has no sparse layers"}


class Qwen3_5TextConfig(Strict):
    """Qwen3.5-9B: hidden 4096, 32 layers (24 Gated DeltaNet + 8 gated full attention), 16 q / 4 kv heads of 256;
    0.8B: hidden 1024, 24 layers (18 + 6), 8 / 2 heads of 256, tied LM head (QWEN3_5_0_8B, QWEN3_5_9B below)."""

    vocab_size: int = Field(ge=1)
    hidden_size: int = Field(ge=1)
    intermediate_size: int = Field(ge=1)
    num_hidden_layers: int = Field(ge=1)
    num_attention_heads: int = Field(ge=1)
    num_key_value_heads: int = Field(ge=1)
    head_dim: int = Field(ge=2)
    linear_num_key_heads: int = Field(ge=1)
    linear_num_value_heads: int = Field(ge=1)
    linear_key_head_dim: int = Field(ge=1)
    linear_value_head_dim: int = Field(ge=1)
    linear_conv_kernel_dim: int = Field(4, ge=2)
    layer_types: tuple[LayerType, ...] | None = None     # None: every full_attention_interval-th layer is full
    full_attention_interval: int = Field(4, ge=1)
    rms_norm_eps: float = 1e-6
    hidden_act: str = "silu"
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    attn_output_gate: bool = True
    rope_theta: float = 10_000_000.0
    partial_rotary_factor: float = Field(0.25, gt=0, le=1)
    mrope_section: tuple[int, int, int] = (11, 11, 10)
    mrope_interleaved: bool = True
    mamba_ssm_dtype: str = "float32"                      # the recurrent state's dtype
    tp: int = Field(1, ge=1)       # tensor-parallel ranks this config is one rank's part of (rank_part); 1: whole

    REFUSED: ClassVar[dict[str, str]] = REFUSED
    is_moe: ClassVar[bool] = False                        # every layer's MLP: dense SwiGLU here, SparseMoE in the MoE
    # the counts a tensor-parallel rank holds a 1/tp part of (rank_part): heads, and the MLP's width
    SPLIT: ClassVar[tuple[str, ...]] = ("num_attention_heads", "num_key_value_heads", "linear_num_key_heads",
                                        "linear_num_value_heads", "intermediate_size")

    @model_validator(mode="before")
    @classmethod
    def _derive_layer_types(cls, data: Any) -> Any:
        """HF's rule when layer_types is absent: layer i is full attention iff (i + 1) % interval == 0."""
        if isinstance(data, dict) and data.get("layer_types") is None and "num_hidden_layers" in data:
            every = data.get("full_attention_interval", 4)
            data = {**data, "layer_types": tuple("full_attention" if (i + 1) % every == 0 else "linear_attention"
                                                 for i in range(data["num_hidden_layers"]))}
        return data

    @model_validator(mode="after")
    def _check(self) -> "Qwen3_5TextConfig":
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(f"layer_types has {len(self.layer_types)} entries for num_hidden_layers "
                             f"{self.num_hidden_layers}: one per layer")
        if not self.full_layers or not self.linear_layers:
            raise ValueError(f"layer_types {list(self.layer_types)} must hold both kinds: the node binds a paged KV "
                             "resource for the full-attention layers and a state resource for the linear ones")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads {self.num_attention_heads} must be a multiple of "
                             f"num_key_value_heads {self.num_key_value_heads}")
        if self.rotary_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} x partial_rotary_factor {self.partial_rotary_factor} = "
                             f"{self.head_dim * self.partial_rotary_factor} rotary dims must be a whole even number")
        check_mrope_section(self.rotary_dim, self.mrope_section)
        for name, want, why in (("attention_bias", False, "no Qwen3.5 checkpoint has attention biases"),
                                ("attn_output_gate", True, "every Qwen3.5 checkpoint gates its attention output"),
                                ("mrope_interleaved", True, "Qwen3.5's M-RoPE is interleaved (HF runs only that)")):
            if getattr(self, name) != want:
                raise ValueError(f"{name} {getattr(self, name)} is not supported: {why}")
        self.gdn                                              # its own checks (value heads per key head, silu)
        return self

    @classmethod
    def from_text_config(cls, text_config: dict) -> "Qwen3_5TextConfig":
        """The fields this node reads from a checkpoint's text_config (which holds many more: dtype, eos ids,
        mtp_* for the speculative head HF and graphc ignore); rope from rope_parameters (or rope_scaling). A MoE
        text_config (num_experts set) is refused here: Qwen3_5MoeTextConfig.from_text_config reads it."""
        for key, why in cls.REFUSED.items():
            if text_config.get(key):
                raise ValueError(f"text_config has {key} {text_config[key]!r}: {why}")
        params = text_config.get("rope_parameters") or text_config.get("rope_scaling") or {}
        kind = params.get("rope_type", params.get("type", "default"))
        if kind != "default":
            raise ValueError(f"rope_type '{kind}' is not supported: the node runs default (M-)RoPE")
        rope = {k: params.get(k, text_config.get(k)) for k in ("rope_theta", "partial_rotary_factor",
                                                               "mrope_section", "mrope_interleaved")}
        fields = {k: v for k, v in {**text_config, **rope}.items()
                  if k in cls.model_fields and k != "tp" and v is not None}
        return cls(**fields)

    def rank_part(self, tp: int) -> "Qwen3_5TextConfig":
        """One of tp tensor-parallel ranks' part of this (whole) config: every SPLIT count divided by tp, tp
        recorded (whole() multiplies back). Every rank's part is the same shape; which heads it holds is its rank
        (the loader's Splits). tp 1: this config. Refused (InvalidInput): tp < 1, a config already split, a tp
        that does not divide every count."""
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            raise InvalidInput(f"tensor-parallel size {tp!r}", "it counts the ranks a node is split over",
                               "pass a whole number, 1 or more")
        if tp == 1:
            return self
        if self.tp != 1:
            raise InvalidInput(f"rank_part({tp}) of a config that is already one of {self.tp} ranks' parts",
                               "a part is cut from the whole config", "call rank_part on config.whole()")
        counts = {k: getattr(self, k) for k in self.SPLIT if getattr(self, k) is not None}
        bad = {k: n for k, n in counts.items() if n % tp}
        if bad:
            g = math.gcd(*counts.values())
            fits = [t for t in range(2, g + 1) if g % t == 0]
            raise InvalidInput(f"tensor-parallel size {tp} does not divide " + ", ".join(f"{k} {n}" for k, n in
                                                                                           bad.items()),
                               "each rank holds an equal part of every head count and of the MLP's width: "
                               + ", ".join(f"{k} {n}" for k, n in counts.items()),
                               f"use a tp that divides them all: {', '.join(map(str, [1] + fits))}")
        return type(self)(**{**self.model_dump(), **{k: n // tp for k, n in counts.items()}, "tp": tp})

    def whole(self) -> "Qwen3_5TextConfig":
        """The whole config this one is a rank's part of (itself when tp is 1)."""
        if self.tp == 1:
            return self
        grown = {k: getattr(self, k) * self.tp for k in self.SPLIT if getattr(self, k) is not None}
        return type(self)(**{**self.model_dump(), **grown, "tp": 1})

    @property
    def gdn(self) -> GatedDeltaNetConfig:
        """The Gated DeltaNet layers' config."""
        return GatedDeltaNetConfig.from_text_config(self.model_dump())

    @property
    def rotary_dim(self) -> int:
        """Leading dims of each q/k head that rotate (64 of 256 in the real models); the rest pass through."""
        return round(self.head_dim * self.partial_rotary_factor)

    @property
    def full_layers(self) -> list[int]:
        """Decoder layer indices of the gated full-attention layers (3, 7, 11, ... in the real models)."""
        return [i for i, kind in enumerate(self.layer_types) if kind == "full_attention"]

    @property
    def linear_layers(self) -> list[int]:
        """Decoder layer indices of the Gated DeltaNet layers."""
        return [i for i, kind in enumerate(self.layer_types) if kind == "linear_attention"]

    @property
    def num_full_layers(self) -> int:
        return len(self.full_layers)

    @property
    def num_linear_layers(self) -> int:
        return len(self.linear_layers)

    def kind_index(self, layer: int) -> int:
        """Decoder layer `layer`'s index among the layers of its kind: its layer index into its resource."""
        return (self.full_layers if self.layer_types[layer] == "full_attention" else self.linear_layers).index(layer)

    def state_spec(self, name: str, conv_dtype: str = "bfloat16", state_dtype: str | None = None,
                   slots: int | None = None) -> LinearStateSpec:
        """The 'state' role's resource: one slot per running sequence for every linear layer (conv window in
        conv_dtype, the model's dtype; recurrent state in state_dtype, mamba_ssm_dtype unless given)."""
        return state_spec(self.gdn, name, self.num_linear_layers, conv_dtype=conv_dtype,
                          state_dtype=state_dtype or self.mamba_ssm_dtype, slots=slots)

    def kv_spec(self, name: str, max_seq_len: int, dtype: str = "bfloat16", **kw: Any) -> PagedKVSpec:
        """The 'kv' role's resource: paged K and V of the full-attention layers only (kw: page_size, pages, ...)."""
        return PagedKVSpec(name=name, num_layers=self.num_full_layers, num_qo_heads=self.num_attention_heads,
                           num_kv_heads=self.num_key_value_heads, head_dim=self.head_dim, max_seq_len=max_seq_len,
                           dtype=dtype, **kw)


class Qwen3_5MoeTextConfig(Qwen3_5TextConfig):
    """The MoE sizes (HF's Qwen3_5MoeTextConfig, model_type qwen3_5_moe_text): the same hybrid decoder with every
    layer's MLP a sparse MoE block (HF's Qwen3_5MoeSparseMoeBlock): a softmax router over num_experts, the top
    num_experts_per_tok renormalised, experts of moe_intermediate_size, plus one shared SwiGLU expert of
    shared_expert_intermediate_size scaled by sigmoid(shared_expert_gate). Qwen3.5-35B-A3B: QWEN3_5_35B_A3B below.

    intermediate_size (a dense MLP's width) is read where a config.json carries it and unused: HF builds no dense
    MLP in a qwen3_5_moe decoder. Refused, with the reason: a router that does not renormalise, dense layers
    (mlp_only_layers, decoder_sparse_step): HF's qwen3_5_moe runs neither (it ignores those keys), so a checkpoint
    that sets them has no reference to match and its meaning depends on the runtime that reads it."""

    REFUSED: ClassVar[dict[str, str]] = {}
    is_moe: ClassVar[bool] = True
    # no dense MLP: the routed experts' and the shared expert's widths split instead (intermediate_size is unused)
    SPLIT: ClassVar[tuple[str, ...]] = ("num_attention_heads", "num_key_value_heads", "linear_num_key_heads",
                                        "linear_num_value_heads", "moe_intermediate_size",
                                        "shared_expert_intermediate_size")

    intermediate_size: int | None = Field(None, ge=1)
    num_experts: int = Field(ge=1)
    num_experts_per_tok: int = Field(ge=1)
    moe_intermediate_size: int = Field(ge=1)
    shared_expert_intermediate_size: int = Field(ge=1)
    norm_topk_prob: bool = True
    mlp_only_layers: tuple[int, ...] = ()
    decoder_sparse_step: int = Field(1, ge=1)

    @model_validator(mode="after")
    def _check_moe(self) -> "Qwen3_5MoeTextConfig":
        if self.num_experts_per_tok > self.num_experts:
            raise ValueError(f"num_experts_per_tok {self.num_experts_per_tok} > num_experts {self.num_experts}")
        hf = "HF's Qwen3_5Moe (transformers.models.qwen3_5_moe)"
        for name, want, why in (
                ("norm_topk_prob", True, f"{hf} always renormalises the top-k router weights"),
                ("mlp_only_layers", (), f"{hf} runs the sparse MoE block on every layer and its checkpoints hold "
                                        "no dense MLP weights"),
                ("decoder_sparse_step", 1, f"{hf} runs the sparse MoE block on every layer")):
            if getattr(self, name) != want:
                raise ValueError(f"{name} {getattr(self, name)!r} is not supported: {why}")
        return self


def qwen3_5_ports(cfg: Qwen3_5TextConfig, mm_rows: str, dtype: str = "bfloat16"
                  ) -> tuple[dict[str, Port], dict[str, Port]]:
    """Qwen3_5LM's (inputs, outputs): tokens of a step with their M-RoPE positions [3, tokens] (T, H, W rows; equal
    for text), sample rows, and the optional 'mm' group that splices an encoder's output rows (mm_rows: that
    encoder's row axis, e.g. 'patches/4')."""
    inputs = {"token_ids": Port(shape=("tokens",), dtype="int64"),
              "positions": Port(shape=(3, "tokens"), dtype="int64"),
              "sample_rows": Port(shape=("seqs",), dtype="int64"),
              "mm_embeds": Port(shape=(mm_rows, cfg.hidden_size), dtype=dtype, optional="mm"),
              "mm_rows": Port(shape=("tokens",), dtype="int64", optional="mm")}
    return inputs, {"logits": Port(shape=("seqs", cfg.vocab_size), dtype="float32")}


# The real text configs (docs: ../shared/reference/qwen3_5.md section 2.1; 0.8B verbatim from its config.json)
QWEN3_5_0_8B = Qwen3_5TextConfig(vocab_size=248320, hidden_size=1024, intermediate_size=3584, num_hidden_layers=24,
                                 num_attention_heads=8, num_key_value_heads=2, head_dim=256, linear_num_key_heads=16,
                                 linear_num_value_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,
                                 tie_word_embeddings=True)
QWEN3_5_9B = Qwen3_5TextConfig(vocab_size=248320, hidden_size=4096, intermediate_size=12288, num_hidden_layers=32,
                               num_attention_heads=16, num_key_value_heads=4, head_dim=256, linear_num_key_heads=16,
                               linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128)
# Qwen/Qwen3.5-35B-A3B's text_config (the reference's section 1 table; HF's Qwen3_5MoeTextConfig defaults, and the
# published config.json as several independent fixtures copy it): 40 layers (30 + 10), 256 experts of 512, top 8
QWEN3_5_35B_A3B = Qwen3_5MoeTextConfig(vocab_size=248320, hidden_size=2048, num_hidden_layers=40,
                                       num_attention_heads=16, num_key_value_heads=2, head_dim=256,
                                       linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
                                       linear_value_head_dim=128, num_experts=256, num_experts_per_tok=8,
                                       moe_intermediate_size=512, shared_expert_intermediate_size=512)
