"""The Qwen3.5 text node split over two tensor-parallel ranks (models/qwen3_5.py declare(tp=2), Qwen3_5LM.tp_splits,
graphc/runtime/checkpoint.py load_weights(rank, tp)) against HF's Qwen3_5ForCausalLM / Qwen3_5MoeForCausalLM in fp32,
on the tiny and tiny-moe presets' shapes (8 layers, full attention at 3 and 7; 4 q / 2 kv heads of 32; 2 key and 4
value GDN heads of 16; MLP 128, or 8 experts of 32, top 3, and a shared expert of 48). Each rank holds half the
heads and widths; nothing is compared against graphc's one-rank node, only against HF.

HF's model (every parameter re-drawn: test_qwen3_5_text.draw) is saved under a Qwen3.5 checkpoint's names, to a
safetensors file (dense) or in memory (MoE: HF's per-expert save and its fused in-memory layout). Two rank modules
load it, built from the node config that declare(..., tp=2) gives, and run the same steps in two threads, each
with its own paged KV and state pools of the rank's heads; their StepContext.reduce sums the two ranks' tensors
(Exchange: both add rank 0's then rank 1's, so both ranks get the same bits). Expected: HF's logits of each whole
sequence, within the single-rank parity tests' tolerance (rel < 1e-5, every logit within 1e-4: their docstring
says why), both ranks' logits identical, and HF generate's greedy tokens.
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig as HFConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM
from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeTextConfig as HFMoeConfig
from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeForCausalLM

from graphc.errors import InvalidInput
from graphc.runtime.checkpoint import Shards, TensorShards, load_weights
from graphc.source import load_model
from models.components.qwen3_5_text import Qwen3_5LM
from tests.parity.test_qwen3_5_moe import draw as moe_draw
from tests.parity.test_qwen3_5_text import Engine, assert_close, draw, hf_logits, language_model_names

MODEL = str(Path(__file__).resolve().parents[2] / "models" / "qwen3_5.py")
TP = 2


def hf_config(preset: str):
    """HF's text config of the preset's LLM node (models/qwen3_5.py TINY, TINY_MOE)."""
    c = load_model(MODEL, preset).model.node("llm").config
    rope = {"rope_type": "default", "rope_theta": c.rope_theta, "partial_rotary_factor": c.partial_rotary_factor,
            "mrope_section": list(c.mrope_section), "mrope_interleaved": True}
    kw = {k: getattr(c, k) for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                                     "num_key_value_heads", "head_dim", "linear_num_key_heads",
                                     "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
                                     "linear_conv_kernel_dim", "rms_norm_eps", "tie_word_embeddings")}
    if not c.is_moe:
        return HFConfig(intermediate_size=c.intermediate_size, rope_parameters=rope, **kw)
    return HFMoeConfig(moe_intermediate_size=c.moe_intermediate_size, num_experts=c.num_experts,
                       num_experts_per_tok=c.num_experts_per_tok,
                       shared_expert_intermediate_size=c.shared_expert_intermediate_size, rope_parameters=rope, **kw)


def hf_model(preset: str):
    torch.manual_seed(0)
    if preset == "tiny":
        return draw(Qwen3_5ForCausalLM(hf_config(preset)), seed=3).eval()
    return moe_draw(Qwen3_5MoeForCausalLM(hf_config(preset)), seed=3).eval()


def rank_modules(preset: str, source) -> list[Qwen3_5LM]:
    """The two ranks' modules of declare(preset, tp=2)'s node config, each loaded with its part of source."""
    from models.qwen3_5 import declare

    cfg = declare(preset, tp=TP).node("llm").config
    out = []
    for rank in range(TP):
        m = Qwen3_5LM(cfg).eval()
        load_weights(m, source, rank=rank, tp=TP)
        out.append(m)
    return out


@pytest.fixture(scope="module", params=["tiny", "tiny-moe"])
def setup(request, tmp_path_factory):
    """(HF's model, the two rank modules): dense from a safetensors file, MoE from HF's per-expert save."""
    hf = hf_model(request.param)
    folder = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(folder)
    tensors = language_model_names(load_file(str(folder / "model.safetensors")))
    if request.param == "tiny":
        save_file(tensors, str(folder / "renamed.safetensors"))
        source = Shards(folder / "renamed.safetensors")
    else:
        source = TensorShards(tensors)
    return hf, rank_modules(request.param, source)


class Exchange:
    """Each rank's StepContext.reduce: every rank posts its tensor, all wait, each sums rank 0's + rank 1's + ...
    (the same order on every rank), all wait again before the next exchange reuses the posts."""

    def __init__(self, n: int):
        self.barrier, self.posted = threading.Barrier(n, timeout=120), [None] * n

    def reduce_for(self, rank: int):
        def reduce(x: torch.Tensor) -> torch.Tensor:
            self.posted[rank] = x
            self.barrier.wait()
            out = self.posted[0]
            for y in self.posted[1:]:
                out = out + y
            self.barrier.wait()
            return out
        return reduce


def run_ranks(modules: list[Qwen3_5LM], script) -> list:
    """script(engine) run on every rank's Engine (its own KV and state pools) in its own thread; each rank's
    result. A rank that fails breaks the barrier, so the others fail too instead of waiting."""
    ex = Exchange(len(modules))

    def one(rank: int):
        try:
            return script(Engine(modules[rank], ex.reduce_for(rank)))
        except BaseException:
            ex.barrier.abort()
            raise

    with ThreadPoolExecutor(len(modules)) as pool:
        return [f.result() for f in [pool.submit(one, r) for r in range(len(modules))]]


def tokens(n: int, seed: int, vocab: int = 512) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


A, B, C = tokens(74, seed=1), tokens(12, seed=2), tokens(25, seed=3)


def mixed_steps(eng: Engine) -> list[torch.Tensor]:
    """A's prompt across a 64-row GDN chunk (63 + 7) beside B's in two chunks, 4 decode steps of both, then a
    mixed step: A's decode row beside C's first chunk, and C's rest beside B's decode row."""
    out = [eng.step({0: A[:63], 1: B[:5]}), eng.step({0: A[63:70], 1: B[5:8]})]
    out += [eng.step({0: [A[70 + i]], 1: [B[8 + i]]}) for i in range(4)]
    out += [eng.step({0: [5], 2: C[:17]}), eng.step({2: C[17:], 1: [7]})]
    return out


def test_both_ranks_equal_hf_over_prefill_decode_and_mixed_steps(setup):
    hf, modules = setup
    r0, r1 = run_ranks(modules, mixed_steps)
    for a, b in zip(r0, r1):
        assert torch.equal(a, b), "the ranks' logits differ: their reduce must give both the same sum"
    s = r0
    got_a = torch.cat([s[0][:63], s[1][:7]] + [s[i][:1] for i in range(2, 6)] + [s[6][:1]])
    got_b = torch.cat([s[0][63:], s[1][7:]] + [s[i][1:] for i in range(2, 6)] + [s[7][8:]])
    got_c = torch.cat([s[6][1:], s[7][:8]])
    assert_close(got_a, hf_logits(hf, A + [5]), "A: prefill across a chunk, decode")
    assert_close(got_b, hf_logits(hf, B + [7]), "B: two chunks, decode")
    assert_close(got_c, hf_logits(hf, C), "C: chunks beside decode rows")


def test_greedy_tokens_of_both_ranks_match_hf_generate(setup):
    hf, modules = setup
    prompt = tokens(11, seed=11)
    with torch.no_grad():
        want = hf.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False)[0, len(prompt):].tolist()

    def greedy(eng: Engine) -> list[int]:
        got, logits = [], eng.step({0: prompt}, every_row=False)
        for _ in range(8):
            got.append(int(logits[0].argmax()))
            logits = eng.step({0: [got[-1]]}, every_row=False)
        return got

    assert run_ranks(modules, greedy) == [want, want]


def test_each_rank_holds_its_half_of_the_heads(setup):
    """Rank r's first GDN layer holds key heads r and value heads 2r, 2r+1 of HF's (rows of q, k, v in
    in_proj_qkv, then of z, b and a, stacked; conv channels alike); its first full layer q/gate rows of heads
    2r, 2r+1 and KV head r; MLP columns of down_proj r's half. Read straight off HF's parameters."""
    hf, modules = setup
    lin, full = hf.model.layers[0].linear_attn, hf.model.layers[3].self_attn
    for r, m in enumerate(modules):
        gdn, att = m.body.layers[0].linear_attn, m.body.layers[3].self_attn
        qkv = lin.in_proj_qkv.weight                                  # [2 x 2 x 16 + 4 x 16, 64]
        want = torch.cat([qkv[16 * r:16 * r + 16], qkv[32 + 16 * r:48 + 16 * r], qkv[64 + 32 * r:96 + 32 * r]])
        want = torch.cat([want, lin.in_proj_z.weight[32 * r:32 * r + 32], lin.in_proj_b.weight[2 * r:2 * r + 2],
                          lin.in_proj_a.weight[2 * r:2 * r + 2]])          # then z's rows of its heads, b's, a's
        assert torch.equal(gdn.in_proj_qkvzba.weight, want)
        assert torch.equal(gdn.conv1d.weight[:, 0], torch.cat([lin.conv1d.weight[16 * r:16 * r + 16, 0],
                                                                lin.conv1d.weight[32 + 16 * r:48 + 16 * r, 0],
                                                                lin.conv1d.weight[64 + 32 * r:96 + 32 * r, 0]]))
        assert torch.equal(gdn.A_log, lin.A_log[2 * r:2 * r + 2])
        assert torch.equal(gdn.out_proj.weight, lin.out_proj.weight[:, 32 * r:32 * r + 32])
        assert torch.equal(att.qkv_proj.weight, torch.cat([full.q_proj.weight[128 * r:128 * r + 128],
                                                           full.k_proj.weight[32 * r:32 * r + 32],
                                                           full.v_proj.weight[32 * r:32 * r + 32]]))
        assert torch.equal(att.o_proj.weight, full.o_proj.weight[:, 64 * r:64 * r + 64])


def test_the_fused_expert_layout_loads_the_same_parts():
    """HF's in-memory MoE state dict (fused experts.gate_up_proj [E, 2I, H], down_proj [E, H, I], the published
    checkpoints' layout) gives each rank the same tensors as HF's per-expert save: gate rows r*16.. and up rows
    32 + r*16.. of each expert, down_proj columns r*16..; the router and shared_expert_gate whole."""
    hf = hf_model("tiny-moe")
    fused = TensorShards(language_model_names({k: v.detach() for k, v in hf.state_dict().items()
                                               if k != "lm_head.weight"}))          # tied: the embeddings
    assert "model.language_model.layers.0.mlp.experts.gate_up_proj" in fused
    experts = hf.model.layers[0].mlp.experts
    for r, m in enumerate(rank_modules("tiny-moe", fused)):
        mine = m.body.layers[0].mlp
        want = torch.cat([experts.gate_up_proj[:, 16 * r:16 * r + 16], experts.gate_up_proj[:, 32 + 16 * r:48 + 16 * r]], 1)
        assert torch.equal(mine.experts.gate_up_proj, want)
        assert torch.equal(mine.experts.down_proj, experts.down_proj[:, :, 16 * r:16 * r + 16])
        assert torch.equal(mine.gate.weight, hf.model.layers[0].mlp.gate.weight)
        assert torch.equal(mine.shared_expert_gate.weight, hf.model.layers[0].mlp.shared_expert_gate.weight)
        assert mine.shared_expert.gate_up_proj.weight.shape == (48, 64)


# ---------------------------------------------------------------- the declaration

def test_a_rank_declares_half_the_kv_heads_and_half_the_state():
    """tiny at tp 2: 2 q / 1 kv head of 32 per rank, so a KV page is 2 (K, V) x 2 full layers x 16 tokens x 1 head x
    32 x 2 B (bf16) = 4096 B, half tp 1's 8192; a state slot 6 linear layers x ((2 x 1 x 16 + 2 x 16) channels x 3
    x 2 B + 2 heads x 16 x 16 x 4 B) = 14592 B, half of 29184. The vision tower, the name, vocab and hidden size
    are tp 1's; MoE: experts' and shared widths 16 and 24, 8 experts, top 3 each."""
    from models.qwen3_5 import declare

    one, two = declare("tiny"), declare("tiny", tp=TP)
    assert (one.resource("llm_kv").page_bytes, two.resource("llm_kv").page_bytes) == (8192, 4096)
    assert (one.resource("llm_state").slot_bytes, two.resource("llm_state").slot_bytes) == (29184, 14592)
    kv, state = two.resource("llm_kv"), two.resource("llm_state")
    assert (kv.num_qo_heads, kv.num_kv_heads, state.num_key_heads, state.num_value_heads) == (2, 1, 1, 2)
    cfg = two.node("llm").config
    assert (cfg.tp, cfg.intermediate_size, cfg.hidden_size, cfg.vocab_size) == (2, 64, 64, 512)
    assert two.node("vision_encoder") == one.node("vision_encoder") and two.name == one.name == "qwen3_5-tiny"
    assert declare("tiny", tp=1) == one
    moe = declare("tiny-moe", tp=TP).node("llm").config
    assert (moe.moe_intermediate_size, moe.shared_expert_intermediate_size, moe.num_experts, moe.num_experts_per_tok) \
        == (16, 24, 8, 3)
    assert moe.whole() == declare("tiny-moe").node("llm").config


@pytest.mark.parametrize("tp, message", [(4, "does not divide num_key_value_heads 2"), (3, "tp that divides them "
                                         "all: 1, 2"), (0, "tensor-parallel size 0")], ids=str)
def test_a_tp_that_does_not_divide_the_heads_is_refused(tp, message):
    from models.qwen3_5 import declare

    with pytest.raises(InvalidInput, match=message):
        declare("tiny", tp=tp)
