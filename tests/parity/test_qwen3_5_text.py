"""The Qwen3.5 dense text node (models/components/qwen3_5_text.py) against HF's Qwen3_5ForCausalLM in fp32, on two tiny
configs of 8 layers (full attention at layers 3 and 7, so Gated DeltaNet layers follow a full one):
  tied:   4 q / 2 kv heads of 64, rotary 16 dims (M-RoPE sections [3, 3, 2]); 2 key and 2 value GDN heads of 16
  untied: 4 q / 1 kv head of 32, rotary 8 dims ([2, 1, 1]); 2 key and 4 value GDN heads (value head h reads key
          head h // 2), key dim 32, value dim 16
Weights: every HF parameter re-drawn (tests/parity/weights.randomize; the zero-centred norms' offsets then moved to
0.1 N(0, 1), as a checkpoint's lie near 0, so a missing 1 + w scales by 0.1 instead of 1; A_log and dt_bias drawn
as in test_gated_deltanet.py), saved by HF and loaded into graphc's node under the checkpoint's names
(model.language_model.*: HF's causal LM saves model.*, a Qwen3.5 checkpoint holds model.language_model.*).
The node runs through a paged KV pool (the full layers only) and a state slot pool (the linear layers only), the
way the runtime binds them; expected logits are HF's over each whole sequence alone.
Tolerance: rel (tests.conftest.rel: |got - want| / |want| over a comparison's logits) < 1e-5, and every logit within
1e-4 absolute. Not 1e-5 absolute: the logits are O(1) (std 1, max |logit| about 4) and HF's own fp32 logits lie up to
2e-5 (5 rows) to 6.5e-5 (130 rows) from its float64 run of the same weights, the error growing through the 8
layers, so an fp32 node that computes the same ops in another order can be no closer. Measured (transformers
5.24, torch 2.13, CPU): rel 1.1e-6 to 6.2e-6, max abs 4.4e-6 to 3.6e-5; graphc's own distance from HF's float64
run is of the same size as HF's.
"""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from torch import nn
from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig as HFConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import (Qwen3_5ForCausalLM, Qwen3_5GatedDeltaNet,
                                                          Qwen3_5RMSNorm)

from graphc.runtime.checkpoint import TensorShards, load_weights
from graphc.step import StepContext
from models.components.qwen3_5_text import Qwen3_5LM
from models.components.qwen3_5_text_config import QWEN3_5_0_8B, QWEN3_5_9B, Qwen3_5TextConfig
from resources.linear_state import SlotAllocator, StateStep, new_state
from resources.paged_kv import PageAllocator, PagedTorch, new_cache
from tests.conftest import rel
from tests.parity.weights import assert_norm_eps_match, randomize

TOL, ABS_TOL = 1e-5, 1e-4
VOCAB, PAGES, SLOTS = 96, 160, 6
TINY = {"tied": dict(num_attention_heads=4, num_key_value_heads=2, head_dim=64, mrope_section=[3, 3, 2],
                     linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=16,
                     linear_value_head_dim=16, tie_word_embeddings=True),
        "untied": dict(num_attention_heads=4, num_key_value_heads=1, head_dim=32, mrope_section=[2, 1, 1],
                       linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
                       linear_value_head_dim=16, tie_word_embeddings=False)}


def hf_config(name: str) -> HFConfig:
    kw = dict(TINY[name])
    rope = {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
            "mrope_section": kw.pop("mrope_section"), "mrope_interleaved": True}
    return HFConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=80, num_hidden_layers=8,
                    full_attention_interval=4, linear_conv_kernel_dim=4, rms_norm_eps=1e-6, rope_parameters=rope,
                    **kw)


def draw(hf: nn.Module, seed: int, deltanet: type = Qwen3_5GatedDeltaNet, norm: type = Qwen3_5RMSNorm) -> nn.Module:
    """Every parameter of HF's model re-drawn (module docstring); deltanet and norm: the model's classes of
    those (HF's qwen3_5_moe has its own)."""
    owners = [m for m in hf.modules() if not isinstance(m, deltanet) and list(m.parameters(False))]
    randomize(nn.ModuleList(owners), seed=seed)
    g = torch.Generator().manual_seed(1000 + seed)
    with torch.no_grad():
        for m in hf.modules():
            if isinstance(m, norm):
                m.weight.sub_(1.0)                                            # 1 + 0.1 N -> 0.1 N offsets
            if isinstance(m, deltanet):
                m.A_log.copy_((0.01 + 0.29 * torch.rand(m.num_v_heads, generator=g)).log())
                m.dt_bias.copy_(0.5 * torch.randn(m.num_v_heads, generator=g))
    return hf


def language_model_names(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """HF's causal LM names under a Qwen3.5 checkpoint's: model.X -> model.language_model.X."""
    return {("model.language_model." + k[6:] if k.startswith("model.") else k): v for k, v in tensors.items()}


def checkpoint_names(folder) -> TensorShards:
    """HF's saved tensors under a Qwen3.5 checkpoint's names."""
    return TensorShards(language_model_names(load_file(str(folder / "model.safetensors"))))


@pytest.fixture(scope="module", params=sorted(TINY))
def pair(request, tmp_path_factory):
    torch.manual_seed(0)
    hf = draw(Qwen3_5ForCausalLM(hf_config(request.param)), seed=0).eval()
    folder = tmp_path_factory.mktemp(f"qwen3_5_{request.param}")
    hf.save_pretrained(folder)
    cfg = Qwen3_5TextConfig.from_text_config(hf.config.to_dict())
    ours = Qwen3_5LM(cfg).eval()
    load_weights(ours, checkpoint_names(folder))
    return hf, ours


class Engine:
    """A minimal driver: paged KV for the full layers and a state slot per sequence for the linear ones; any mix
    of first chunks, continued chunks and decode rows in one step, as the runtime builds them."""

    def __init__(self, model: Qwen3_5LM, reduce=None):
        """reduce: the StepContext's sum over tensor-parallel ranks (None: the model runs whole)."""
        cfg = model.cfg
        self.reduce = reduce
        self.model, self.spec = model, cfg.kv_spec("kv", max_seq_len=256, dtype="float32", page_size=4)
        self.cache, self.pages = new_cache(self.spec, PAGES), PageAllocator(PAGES)
        self.state = new_state(cfg.state_spec("state", conv_dtype="float32"), SLOTS)
        self.slots = SlotAllocator(SLOTS)
        self.tables, self.lens, self.slot = {}, {}, {}

    def bind(self, chunks: dict[int, list[int]]) -> StepContext:
        """Pages and slots for this step's rows (a new sequence gets a slot), then its two resources bound."""
        qo, kv, tables, has_state = [], [], [], []
        for sid, toks in chunks.items():
            start = self.lens.get(sid, 0)
            table = self.tables.setdefault(sid, [])
            table += self.pages.allocate(self.spec.pages_for(start + len(toks)) - len(table))
            if sid not in self.slot:
                self.slot[sid] = self.slots.allocate()
            self.lens[sid] = start + len(toks)
            qo.append(len(toks)), kv.append(self.lens[sid]), tables.append(table), has_state.append(start > 0)
        state = StateStep(self.state, [self.slot[s] for s in chunks], qo, has_state)
        return StepContext({"kv": PagedTorch(self.spec, self.cache, qo, kv, tables), "state": state}, self.reduce)

    def step(self, chunks: dict[int, list[int]], positions: dict[int, torch.Tensor] | None = None,
             every_row: bool = True, **mm) -> torch.Tensor:
        """Logits of every row of the step (or of each sequence's last row); positions: a sequence's [3, n] rows
        (default: its text positions on all three rows)."""
        ids, pos, sample = [], [], []
        for sid, toks in chunks.items():
            start = self.lens.get(sid, 0)
            ids += toks
            pos.append(positions[sid] if positions and sid in positions else
                       torch.arange(start, start + len(toks)).expand(3, -1))
            sample += range(len(ids) - len(toks), len(ids)) if every_row else [len(ids) - 1]
        ctx = self.bind(chunks)
        with torch.no_grad():
            return self.model(ctx, token_ids=torch.tensor(ids), positions=torch.cat(pos, 1),
                              sample_rows=torch.tensor(sample), **mm)["logits"]

    def finish(self, sid: int) -> None:
        self.pages.free(self.tables.pop(sid))
        self.slots.free(self.slot.pop(sid))
        del self.lens[sid]


def hf_logits(hf: Qwen3_5ForCausalLM, tokens: list[int], **kw) -> torch.Tensor:
    """HF's logits of every row of one whole sequence: [n, V]."""
    with torch.no_grad():
        return hf(torch.tensor([tokens]) if "inputs_embeds" not in kw else None, **kw).logits[0]


def tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max())


def assert_close(got: torch.Tensor, want: torch.Tensor, what: str = "") -> None:
    """rel (|got - want| / |want| over all the logits) < TOL and every logit within ABS_TOL (module docstring)."""
    r, e = rel(got, want), err(got, want)
    print(f"{what}: rel {r:.2g}, max abs {e:.2g}")
    assert r < TOL and e < ABS_TOL, f"{what}: rel {r:.3g}, max abs {e:.3g}"


def test_norm_epsilons_match_hf(pair):
    hf, ours = pair
    norms = assert_norm_eps_match(ours, hf, lambda name: name.replace("language_model.", ""))
    assert norms == 2 * 8 + 2 * 2 + 6 + 1       # layer norms, q/k norms of 2 full layers, 6 GDN norms, final


def test_several_sequences_packed_in_one_prefill_step(pair):
    hf, ours = pair
    seqs = [tokens(n, seed=n) for n in (5, 33, 70, 1)]
    got = Engine(ours).step(dict(enumerate(seqs)))
    want = torch.cat([hf_logits(hf, s) for s in seqs])
    assert_close(got, want, "packed")


@pytest.mark.parametrize("cuts", [[64, 66], [63, 2, 65], [5, 100, 25], [1, 1, 70]], ids=str)
def test_a_prompt_prefilled_in_chunks_equals_the_whole_prompt(pair, cuts):
    """Chunks continue from the slot's state and the pages' KV, across HF's 64-row GDN chunks and page ends."""
    hf, ours = pair
    prompt, eng, a, got = tokens(sum(cuts), seed=sum(cuts) + len(cuts)), Engine(ours), 0, []
    for n in cuts:
        got.append(eng.step({0: prompt[a:a + n]}))
        a += n
    got, want = torch.cat(got), hf_logits(hf, prompt)
    assert_close(got, want, str(cuts))


def test_decode_steps_carry_state_and_kv(pair):
    """A 37-token prefill in two chunks, then 8 decode steps, each against HF's whole sequence up to it."""
    hf, ours = pair
    seq, eng = tokens(45, seed=7), Engine(ours)
    got = [eng.step({0: seq[:20]}), eng.step({0: seq[20:37]})] + [eng.step({0: [t]}) for t in seq[37:]]
    got, want = torch.cat(got), hf_logits(hf, seq)
    for t in range(37, 45):
        assert_close(got[t], want[t], f"decode step {t - 36}")
    assert_close(got, want, "prefill and decode")


def test_a_mixed_step_of_decode_rows_and_prefill_chunks(pair):
    """One step holds a decode row of one sequence, a continued chunk of another and the first chunk of a third
    that takes the slot and pages a finished sequence left dirty (its stale state must not be read)."""
    hf, ours = pair
    dec, cont, fresh, eng = tokens(31, seed=1), tokens(60, seed=2), tokens(40, seed=3), Engine(ours)
    eng.step({9: tokens(50, seed=4), 0: dec[:30], 1: cont[:25]})
    stale = eng.slot[9]
    eng.finish(9)
    mixed = eng.step({0: dec[30:], 2: fresh[:17], 1: cont[25:]})
    assert eng.slot[2] == stale
    rest = eng.step({2: fresh[17:], 0: [5]})
    checks = {"decode row": (mixed[:1], hf_logits(hf, dec)[30:]),
              "first chunk": (torch.cat([mixed[1:18], rest[:23]]), hf_logits(hf, fresh)),
              "continued chunk": (mixed[18:], hf_logits(hf, cont)[25:]),
              "decode after it": (rest[23:], hf_logits(hf, dec + [5])[31:])}
    for what, (got, want) in checks.items():
        assert_close(got, want, what)


def test_greedy_tokens_match_hf_generate(pair):
    hf, ours = pair
    prompt, eng = tokens(11, seed=11), Engine(ours)
    with torch.no_grad():
        want = hf.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False)[0, len(prompt):].tolist()
    got, logits = [], eng.step({0: prompt}, every_row=False)
    for _ in range(8):
        got.append(int(logits[0].argmax()))
        logits = eng.step({0: [got[-1]]}, every_row=False)
    assert got == want


def image_like_positions(n_text: int, grid: tuple[int, int], n_after: int) -> torch.Tensor:
    """[3, n] M-RoPE rows of text, a grid of h x w rows at one time step, then text from the max + 1."""
    h, w = grid
    before = torch.arange(n_text).expand(3, -1)
    hh, ww = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    image = torch.stack([torch.zeros(h * w, dtype=torch.long), hh.flatten(), ww.flatten()]) + n_text
    after = torch.arange(n_after).expand(3, -1) + int(image.max()) + 1
    return torch.cat([before, image, after], 1)


def test_distinct_mrope_rows_and_spliced_embeddings(pair):
    """Rows T, H, W differ over an image-like span (each frequency slot must read its section's row) and the
    span's inputs are spliced encoder rows (mm_embeds); prefill in two chunks that cut the span, then 3 decode
    rows. HF gets the 4-row position_ids [text, T, H, W] and inputs_embeds with the same rows spliced."""
    hf, ours = pair
    pos = image_like_positions(6, (3, 5), 7)                         # 28 rows
    n, img = pos.shape[1], slice(6, 21)
    seq = tokens(n, seed=21)
    mm = torch.randn(15, 64, generator=torch.Generator().manual_seed(5))
    mm_rows = torch.full((n,), -1)
    mm_rows[img] = torch.arange(15)
    eng, got = Engine(ours), []
    for a, b in ((0, 12), (12, 25), (25, 26), (26, 27), (27, 28)):
        got.append(eng.step({0: seq[a:b]}, {0: pos[:, a:b]}, mm_embeds=mm, mm_rows=mm_rows[a:b]))
    embeds = hf.model.embed_tokens(torch.tensor([seq])).detach()
    embeds[0, img] = mm
    hf_pos = torch.cat([torch.arange(n)[None], pos])[:, None]       # [4, 1, n]
    want = hf_logits(hf, seq, inputs_embeds=embeds, position_ids=hf_pos)
    got = torch.cat(got)
    assert_close(got, want, "distinct rows")
    assert err(want, hf_logits(hf, seq, inputs_embeds=embeds)) > 1e-3, "the H/W rows must change HF's logits"


# ---------------------------------------------------------------- the config

REAL_0_8B_TEXT_CONFIG = {      # Qwen/Qwen3.5-0.8B config.json text_config (../shared/reference/qwen3_5.md 2.1)
    "model_type": "qwen3_5_text", "dtype": "bfloat16", "eos_token_id": 248044, "vocab_size": 248320,
    "hidden_size": 1024, "intermediate_size": 3584, "num_hidden_layers": 24, "num_attention_heads": 8,
    "num_key_value_heads": 2, "head_dim": 256, "attention_bias": False, "attention_dropout": 0.0,
    "attn_output_gate": True, "hidden_act": "silu", "full_attention_interval": 4,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"], "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_num_key_heads": 16,
    "linear_num_value_heads": 16, "mamba_ssm_dtype": "float32", "max_position_embeddings": 262144,
    "mlp_only_layers": [], "mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": False, "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True, "use_cache": True, "initializer_range": 0.02,
    "rope_parameters": {"mrope_interleaved": True, "mrope_section": [11, 11, 10], "rope_type": "default",
                        "rope_theta": 10000000, "partial_rotary_factor": 0.25}}
REAL_0_8B_TEXT_CONFIG["layer_types"] = REAL_0_8B_TEXT_CONFIG["layer_types"] * 6


def test_the_real_configs_resources():
    """0.8B read from its config.json: 6 full + 18 linear layers; per token KV (bf16) 12 KiB, state slot 18.63 MiB;
    9B: 8 + 24, 32 KiB, 49.12 MiB (the reference's sections 2.3 and 7.1)."""
    assert Qwen3_5TextConfig.from_text_config(REAL_0_8B_TEXT_CONFIG) == QWEN3_5_0_8B
    for cfg, full, kv_kib, slot_mib in ((QWEN3_5_0_8B, 6, 12, 18.63), (QWEN3_5_9B, 8, 32, 49.12)):
        assert (cfg.num_full_layers, cfg.num_linear_layers, cfg.full_layers[:2]) == (full, 3 * full, [3, 7])
        kv = cfg.kv_spec("kv", max_seq_len=4096, page_size=16)
        assert (kv.num_layers, kv.num_kv_heads, kv.head_dim) == (full, cfg.num_key_value_heads, 256)
        assert kv.page_bytes // 16 == kv_kib * 1024
        assert round(cfg.state_spec("state").slot_bytes / 2**20, 2) == slot_mib
        assert cfg.rotary_dim == 64 and cfg.kind_index(7) == 1 and cfg.kind_index(6) == 5


@pytest.mark.parametrize("change, message", [
    ({"num_experts": 256}, "MoE text config"),
    ({"rope_parameters": {**REAL_0_8B_TEXT_CONFIG["rope_parameters"], "rope_type": "yarn"}}, "rope_type 'yarn'"),
    ({"rope_parameters": {**REAL_0_8B_TEXT_CONFIG["rope_parameters"], "mrope_section": [11, 11, 11]}},
     "summing to head_dim/2 = 32"),
    ({"layer_types": ["linear_attention"] * 24}, "must hold both kinds"),
    ({"layer_types": ["linear_attention", "full_attention"]}, "2 entries for num_hidden_layers 24"),
    ({"attention_bias": True}, "attention_bias True is not supported"),
    ({"linear_num_value_heads": 24}, "must be a multiple of linear_num_key_heads"),
], ids=lambda x: x if isinstance(x, str) else None)
def test_a_config_the_node_cannot_run_is_refused(change, message):
    with pytest.raises(ValueError, match=message):
        Qwen3_5TextConfig.from_text_config({**REAL_0_8B_TEXT_CONFIG, **change})


def test_layer_types_default_to_every_fourth_layer_full():
    d = {k: v for k, v in REAL_0_8B_TEXT_CONFIG.items() if k != "layer_types"}
    assert Qwen3_5TextConfig.from_text_config(d).layer_types == QWEN3_5_0_8B.layer_types
    assert Qwen3_5TextConfig.from_text_config({**d, "full_attention_interval": 2}).full_layers == list(range(1, 24, 2))
