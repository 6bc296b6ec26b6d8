"""The Qwen3.5 text node with a MoE config (models/components/qwen3_5_text.py, Qwen3_5MoeTextConfig) against HF's
Qwen3_5MoeForCausalLM in fp32, on a tiny config of 8 layers (full attention at layers 3 and 7): 4 q / 1 kv head of
32, rotary 8 dims (M-RoPE sections [2, 1, 1]); 2 key and 4 value GDN heads; every layer's MLP a sparse MoE block of
8 experts of 24, top 3 renormalised, and a shared expert of 40 scaled by sigmoid(shared_expert_gate).
Weights: every HF parameter re-drawn as test_qwen3_5_text.py draws them (the router [8, 64] and the shared expert's
gate [1, 64] too: N(0, 1) / sqrt(64), so router logits and the shared gate's logit are O(1): rows pick different
experts with unequal weights, and sigmoid(gate) lies well inside (0, 1); test_routing_is_not_trivial checks it).
Two checkpoint layouts, both loaded by graphc/runtime/checkpoint.py into the same node: HF's save_pretrained
(per-expert experts.N.{gate,up,down}_proj, as Qwen3_5MoeForCausalLM saves them) and HF's in-memory names (fused
experts.gate_up_proj [E, 2I, H] and experts.down_proj [E, H, I], the layout of the published qwen3_5_moe
checkpoints), both renamed model.X -> model.language_model.X.
The node runs through the dense test's driver (test_qwen3_5_text.Engine: paged KV for the full layers, a state slot
per sequence for the linear ones); expected logits are HF's over each whole sequence alone. Tolerance as the dense
test's: rel < 1e-5 and every logit within 1e-4 absolute. Measured (transformers 5.24, torch 2.13, CPU; printed with
-s): rel 1.3e-6 to 5.3e-6, max abs 3.6e-6 to 6.1e-5 (logits O(1), max |logit| about 4). That is HF's own fp32 noise:
HF's fp32 logits lie 4.6e-6 to 1.5e-5 rel (2.3e-5 to 1.5e-4 max abs) from its float64 run of the same weights
(17, 70 and 130 rows; experts in its eager loop), graphc's fp32 node 5e-6 to 2.3e-5 from it.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeTextConfig as HFConfig
from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import (Qwen3_5MoeForCausalLM, Qwen3_5MoeGatedDeltaNet,
                                                                  Qwen3_5MoeRMSNorm, Qwen3_5MoeTopKRouter)

from graphc.pipeline import compile_model
from graphc.runtime.checkpoint import TensorShards, load_weights
from graphc.source import load_model
from models.components.moe import SparseMoE
from models.components.qwen3_5_text import Qwen3_5LM
from models.components.qwen3_5_text_config import QWEN3_5_35B_A3B, Qwen3_5MoeTextConfig, Qwen3_5TextConfig
from tests.parity.test_qwen3_5_text import VOCAB, hf_logits, language_model_names, tokens
from tests.parity.test_qwen3_5_text import draw as text_draw
from tests.parity.weights import assert_norm_eps_match

EXPERTS, TOP_K, LAYERS = 8, 3, 8


def hf_config() -> HFConfig:
    rope = {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1],
            "mrope_interleaved": True}
    return HFConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=LAYERS, num_attention_heads=4,
                    num_key_value_heads=1, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
                    linear_key_head_dim=32, linear_value_head_dim=16, linear_conv_kernel_dim=4,
                    moe_intermediate_size=24, shared_expert_intermediate_size=40, num_experts=EXPERTS,
                    num_experts_per_tok=TOP_K, rms_norm_eps=1e-6, rope_parameters=rope, tie_word_embeddings=False)


def draw(hf: Qwen3_5MoeForCausalLM, seed: int) -> Qwen3_5MoeForCausalLM:
    """Every parameter re-drawn (test_qwen3_5_text.draw's rules, on HF's MoE classes)."""
    return text_draw(hf, seed, Qwen3_5MoeGatedDeltaNet, Qwen3_5MoeRMSNorm)


def renamed(tensors: dict[str, torch.Tensor]) -> TensorShards:
    return TensorShards(language_model_names(tensors))


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    torch.manual_seed(0)
    hf = draw(Qwen3_5MoeForCausalLM(hf_config()), seed=0).eval()
    folder = tmp_path_factory.mktemp("qwen3_5_moe")
    hf.save_pretrained(folder)
    cfg = Qwen3_5MoeTextConfig.from_text_config(hf.config.to_dict())
    ours = Qwen3_5LM(cfg).eval()
    report = load_weights(ours, renamed(load_file(str(folder / "model.safetensors"))))
    assert report.fused == LAYERS * 3 + 2 + 6     # per layer experts' gate_up and down, shared gate_up; 2 full
    #                                               layers' qkv; 6 linear layers' in_proj_qkv|z|b|a
    return hf, ours


def test_the_node_runs_sparse_moe_blocks_with_the_shared_expert(pair):
    _, ours = pair
    blocks = [layer.mlp for layer in ours.body.layers]
    assert all(isinstance(b, SparseMoE) and b.shared and b.norm_topk_prob and b.top_k == TOP_K for b in blocks)
    assert blocks[0].experts.gate_up_proj.shape == (EXPERTS, 2 * 24, 64)
    assert blocks[0].shared_expert.gate_up_proj.weight.shape == (2 * 40, 64)


def test_the_published_fused_expert_layout_loads_the_same_weights(pair):
    """HF's in-memory state dict holds the experts fused, as the published checkpoints do: it loads through the
    same loader (directly, no per-expert stacking) into the same tensors as the per-expert save."""
    hf, ours = pair
    fused = renamed({k: v.detach().clone() for k, v in hf.state_dict().items()})
    assert "model.language_model.layers.0.mlp.experts.gate_up_proj" in fused
    other = Qwen3_5LM(ours.cfg).eval()
    report = load_weights(other, fused)
    assert report.fused == LAYERS + 2 + 6         # each shared expert's gate_up, 2 qkv, 6 in_proj_qkvzba; experts as is
    mine, theirs = ours.state_dict(), other.state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)


def test_norm_epsilons_match_hf(pair):
    hf, ours = pair
    norms = assert_norm_eps_match(ours, hf, lambda name: name.replace("language_model.", ""))
    assert norms == 2 * LAYERS + 2 * 2 + 6 + 1   # layer norms, q/k norms of 2 full layers, 6 GDN norms, final


def test_routing_is_not_trivial(pair):
    """Over 70 rows, each of HF's layers picks every expert somewhere and no expert everywhere, rows' expert sets
    differ, the renormalised weights are unequal, and the shared expert's sigmoid gate spreads inside (0, 1)."""
    hf, _ = pair
    routes, gates = [], []
    hooks = [m.register_forward_hook(lambda m, i, o: routes.append(o)) for m in hf.modules()
             if isinstance(m, Qwen3_5MoeTopKRouter)]
    hooks += [layer.mlp.shared_expert_gate.register_forward_hook(lambda m, i, o: gates.append(torch.sigmoid(o)))
              for layer in hf.model.layers]
    hf_logits(hf, tokens(70, seed=70))
    for h in hooks:
        h.remove()
    assert len(routes) == LAYERS
    for _, weights, experts in routes:
        counts = torch.bincount(experts.flatten(), minlength=EXPERTS)
        assert (counts > 0).all() and (counts < len(experts)).all(), counts.tolist()
        assert len({tuple(sorted(r)) for r in experts.tolist()}) > 10
        assert weights[:, 0].min() < 0.5 and weights[:, -1].max() > 0.2 and float(weights.std()) > 0.05
    g = torch.cat(gates)
    assert g.min() < 0.35 and g.max() > 0.65, (float(g.min()), float(g.max()))


# the dense node's parity cases, run here on this module's MoE pair (packed prefill, chunked prompts, decode,
# a mixed step with a reused slot, greedy tokens against HF generate)
from tests.parity.test_qwen3_5_text import (  # noqa: E402,F401
    test_a_mixed_step_of_decode_rows_and_prefill_chunks, test_a_prompt_prefilled_in_chunks_equals_the_whole_prompt,
    test_decode_steps_carry_state_and_kv, test_greedy_tokens_match_hf_generate,
    test_several_sequences_packed_in_one_prefill_step)


# ---------------------------------------------------------------- the config

REAL_35B_A3B_TEXT_CONFIG = {   # Qwen/Qwen3.5-35B-A3B config.json text_config's fields (the module's QWEN3_5_35B_A3B)
    "model_type": "qwen3_5_moe_text", "dtype": "bfloat16", "vocab_size": 248320, "hidden_size": 2048,
    "num_hidden_layers": 40, "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
    "attention_bias": False, "attn_output_gate": True, "hidden_act": "silu", "full_attention_interval": 4,
    "layer_types": ["linear_attention"] * 3 * 10 + ["full_attention"] * 10, "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_num_key_heads": 16,
    "linear_num_value_heads": 32, "mamba_ssm_dtype": "float32", "max_position_embeddings": 262144,
    "mlp_only_layers": [], "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
    "num_experts": 256, "num_experts_per_tok": 8, "router_aux_loss_coef": 0.001, "mtp_num_hidden_layers": 1,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
    "rope_parameters": {"mrope_interleaved": True, "mrope_section": [11, 11, 10], "rope_type": "default",
                        "rope_theta": 10000000, "partial_rotary_factor": 0.25}}
REAL_35B_A3B_TEXT_CONFIG["layer_types"] = (["linear_attention"] * 3 + ["full_attention"]) * 10


def test_the_real_35b_a3b_config_and_its_resources():
    """40 layers: 10 full (KV 2 x 10 x 2 heads x 256 x 2 B = 20 KiB a token, bf16) and 30 linear (a state slot of
    30 x ((2 x 16 x 128 + 32 x 128) x 3 x 2 B + 32 x 128 x 128 x 4 B) = 61.41 MiB)."""
    cfg = Qwen3_5MoeTextConfig.from_text_config(REAL_35B_A3B_TEXT_CONFIG)
    assert cfg == QWEN3_5_35B_A3B and cfg.intermediate_size is None
    assert Qwen3_5MoeTextConfig.from_text_config({**REAL_35B_A3B_TEXT_CONFIG, "intermediate_size": 512}) \
        .intermediate_size == 512                  # some copies carry one; no layer reads it
    assert (cfg.num_full_layers, cfg.num_linear_layers, cfg.full_layers[:2]) == (10, 30, [3, 7])
    assert cfg.kv_spec("kv", max_seq_len=4096, page_size=16).page_bytes // 16 == 20 * 1024
    assert cfg.state_spec("state").slot_bytes == 30 * ((2 * 16 * 128 + 32 * 128) * 3 * 2 + 32 * 128 * 128 * 4)


def test_the_real_35b_a3b_node_takes_hf_names_and_shapes_on_meta():
    """HF's Qwen3_5MoeForCausalLM of the real config, on the meta device: its state dict (fused experts, the
    published layout) loads into graphc's node with every name and shape matched, none left over; 34.66 B
    parameters in both (the text model: the vision tower and mtp.* aside)."""
    hf_cfg = HFConfig(**{k: v for k, v in REAL_35B_A3B_TEXT_CONFIG.items() if k not in ("model_type", "dtype",
                                                                                       "mtp_num_hidden_layers")})
    with torch.device("meta"):
        hf, ours = Qwen3_5MoeForCausalLM(hf_cfg), Qwen3_5LM(QWEN3_5_35B_A3B)
    load_weights(ours, renamed(hf.state_dict()))
    count = sum(p.numel() for p in ours.parameters())
    assert count == sum(p.numel() for p in hf.parameters()) and round(count / 1e9, 2) == 34.66


@pytest.mark.parametrize("change, message", [
    ({"norm_topk_prob": False}, "always renormalises"),
    ({"mlp_only_layers": [0]}, "sparse MoE block on every layer"),
    ({"decoder_sparse_step": 2}, "decoder_sparse_step 2 is not supported"),
    ({"num_experts_per_tok": 300}, "num_experts_per_tok 300 > num_experts 256"),
    ({"moe_intermediate_size": None}, "moe_intermediate_size"),
    ({"rope_parameters": {**REAL_35B_A3B_TEXT_CONFIG["rope_parameters"], "rope_type": "yarn"}}, "rope_type 'yarn'"),
], ids=lambda x: x if isinstance(x, str) else None)
def test_a_moe_config_the_node_cannot_run_is_refused(change, message):
    with pytest.raises(ValueError, match=message):
        Qwen3_5MoeTextConfig.from_text_config({**REAL_35B_A3B_TEXT_CONFIG, **change})


def test_the_dense_config_refuses_a_moe_text_config():
    with pytest.raises(ValueError, match="read it with Qwen3_5MoeTextConfig"):
        Qwen3_5TextConfig.from_text_config(REAL_35B_A3B_TEXT_CONFIG)


# ---------------------------------------------------------------- the presets (models/qwen3_5.py)

MODEL = str(Path(__file__).resolve().parents[2] / "models" / "qwen3_5.py")


def test_the_35b_a3b_preset_declares_the_real_model():
    """35B-A3B: the state slot and KV page of the real config (bf16, 16-token pages), the MoE text config, and the
    vision tower projecting to the LLM's 2048."""
    model = load_model(MODEL, "35b-a3b").model
    state, kv = model.resource("llm_state"), model.resource("llm_kv")
    assert state.slot_bytes == 30 * ((2 * 16 * 128 + 32 * 128) * 3 * 2 + 32 * 128 * 128 * 4) == 64_389_120
    assert (state.num_layers, kv.num_layers, kv.page_bytes) == (30, 10, 2 * 10 * 16 * 2 * 256 * 2)
    assert model.node("llm").config == QWEN3_5_35B_A3B
    assert model.node("vision_encoder").config.out_hidden_size == 2048


def test_the_tiny_moe_preset_plans_on_a_cpu():
    """tiny-moe is tiny with sparse MLPs: the same KV and state lines; its weights line holds the MoE node's
    parameters (bf16; each tensor's bytes rounded up to the arena's alignment at most)."""
    lines = {}
    for preset in ("tiny", "tiny-moe"):
        c = compile_model(load_model(MODEL, preset), "cpu")
        lines[preset] = {i.component: i.bytes for i in c.result.placement.devices[0].items}
    for name in ("kv.llm_kv", "state.llm_state.conv", "state.llm_state.recurrent"):
        assert lines["tiny"][name] == lines["tiny-moe"][name]
    with torch.device("meta"):
        params = list(Qwen3_5LM(load_model(MODEL, "tiny-moe").model.node("llm").config).parameters())
    exact = 2 * sum(p.numel() for p in params)
    assert exact <= lines["tiny-moe"]["weights.llm"] < exact + 256 * len(params)
