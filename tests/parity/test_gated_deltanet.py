"""The Gated DeltaNet layer (models/components/gated_deltanet.py) against HF's Qwen3_5GatedDeltaNet in fp32, on
a tiny config with the real layer's traits scaled down: fewer key heads than value heads (2 and 4, value head
h reads key head h // 2), key and value head dims that differ (32 and 16: a transposed [dk, dv] state shows)
and the real conv kernel of 4. Two layers run stacked (L1(L0(x))) so that each must keep to its own layer of the
state pool.

Weights: every HF parameter re-drawn (tests/parity/weights.randomize for the projections, the conv and the
gated norm; A_log and dt_bias, which randomize has no rule for, drawn here: A = exp(A_log) in [0.01, 0.3] and
dt_bias ~ 0.5 N(0, 1), decays of 0.75-0.99 a row, so a state carries over tens of rows and a lost carry shows),
then copied into graphc's layer by name through graphc's checkpoint loader. Expected values are HF's: the
whole prompt in one call for prompts graphc cuts in chunks, and HF's own cache (DynamicCache) stepping for
decode, each sequence alone.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import DynamicCache
from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import (Qwen3_5GatedDeltaNet, torch_chunk_gated_delta_rule,
                                                          torch_recurrent_gated_delta_rule)

from graphc.runtime.checkpoint import TensorShards, load_weights
from models.components.delta_rule import chunked_rule, prepare_qk, recurrent_rule
from models.components.gated_deltanet import GatedDeltaNet
from models.components.gated_deltanet_config import GatedDeltaNetConfig, state_spec
from resources.linear_state import SlotAllocator, StateStep, new_state
from tests.conftest import rel
from tests.parity.weights import assert_norm_eps_match, randomize

HIDDEN, HK, HV, DK, DV, KERNEL, LAYERS, SLOTS = 64, 2, 4, 32, 16, 4, 2, 8
TOL = 1e-5


def hf_config() -> Qwen3_5TextConfig:
    return Qwen3_5TextConfig(hidden_size=HIDDEN, num_hidden_layers=LAYERS, layer_types=["linear_attention"] * LAYERS,
                             linear_num_key_heads=HK, linear_num_value_heads=HV, linear_key_head_dim=DK,
                             linear_value_head_dim=DV, linear_conv_kernel_dim=KERNEL, rms_norm_eps=1e-6,
                             vocab_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=32)


def draw(layer: Qwen3_5GatedDeltaNet, seed: int) -> Qwen3_5GatedDeltaNet:
    """Every parameter of one HF layer re-drawn (module docstring)."""
    randomize(nn.ModuleList(layer.children()), seed=seed)
    g = torch.Generator().manual_seed(1000 + seed)
    with torch.no_grad():
        layer.A_log.copy_((0.01 + 0.29 * torch.rand(HV, generator=g)).log())
        layer.dt_bias.copy_(0.5 * torch.randn(HV, generator=g))
    return layer


class Pair:
    """HF's two layers and graphc's, one state pool for graphc's and a slot allocator."""

    def __init__(self):
        self.cfg = hf_config()
        self.hf = [draw(Qwen3_5GatedDeltaNet(self.cfg, i), seed=i).eval() for i in range(LAYERS)]
        ours_cfg = GatedDeltaNetConfig.from_text_config(self.cfg.to_dict())
        self.ours = [GatedDeltaNet(ours_cfg, i).eval() for i in range(LAYERS)]
        for h, o in zip(self.hf, self.ours):
            load_weights(o, TensorShards(h.state_dict()))
        self.spec = state_spec(ours_cfg, "gdn_state", LAYERS, conv_dtype="float32", state_dtype="float32")
        self.state = new_state(self.spec, SLOTS)
        self.slots = SlotAllocator(SLOTS)

    def hf_run(self, x: torch.Tensor, cache: DynamicCache | None = None) -> torch.Tensor:
        """HF's stack on one sequence's rows [T, hidden] (continuing from cache when given)."""
        with torch.no_grad():
            h = x[None]
            for layer in self.hf:
                h = layer(h, cache=cache)
            return h[0]

    def hf_steps(self, x: torch.Tensor, cuts: list[int]) -> tuple[torch.Tensor, DynamicCache]:
        """HF's stack over x in HF's own cached steps of the given lengths; the rows of every step, and the cache."""
        cache, outs, a = DynamicCache(config=self.cfg), [], 0
        for n in cuts:
            outs.append(self.hf_run(x[a:a + n], cache))
            a += n
        return torch.cat(outs), cache

    def step(self, rows: torch.Tensor, slot_ids: list[int], lens: list[int], has_state: list[bool]) -> torch.Tensor:
        """graphc's stack on one packed step."""
        step = StateStep(self.state, slot_ids, lens, has_state)
        with torch.no_grad():
            h = rows
            for layer in self.ours:
                h = layer(h, step)
            return h

    def chunks(self, x: torch.Tensor, slot: int, cuts: list[int]) -> torch.Tensor:
        """One sequence alone through graphc in chunks of the given lengths, from a fresh start."""
        outs, a = [], 0
        for n in cuts:
            outs.append(self.step(x[a:a + n], [slot], [n], [a > 0]))
            a += n
        return torch.cat(outs)

    def assert_state_is_hf(self, slot: int, cache: DynamicCache) -> None:
        """The slot holds what HF's cache holds: its conv window is HF's last kernel-1 columns."""
        for i in range(LAYERS):
            hf_conv, hf_rec = cache.layers[i].conv_states[0][0], cache.layers[i].recurrent_states[0][0]
            assert rel(self.state.conv[i, slot], hf_conv[:, 1:]) < TOL, f"layer {i} conv state"
            assert rel(self.state.recurrent[i, slot], hf_rec) < TOL, f"layer {i} recurrent state"


@pytest.fixture(scope="module")
def pair() -> Pair:
    torch.manual_seed(0)
    return Pair()


def rows(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, HIDDEN, generator=torch.Generator().manual_seed(seed))


def test_norm_epsilon_matches_hf(pair):
    assert assert_norm_eps_match(pair.ours[0], pair.hf[0]) == 1


@pytest.mark.parametrize("cuts", [[63], [64], [65], [130], [64, 66], [63, 2, 65], [5, 100, 25], [1, 1, 3],
                                  [2, 1, 70], [129, 1]], ids=str)
def test_a_prompt_in_chunks_equals_the_whole_prompt(pair, cuts):
    """Chunks continue from the carried conv window and recurrent state: across HF's 64-row chunk boundaries,
    at non-multiples of 64, with chunks shorter than the conv window and one-row chunks (the recurrent path).
    Measured (transformers 5.24, torch 2.13, CPU): rel 2e-7 to 7e-7, except 4.8e-6 where a one-row first chunk
    starts [1, 1, 3] and [1, 4]: its first row's output is 5e-5 in one head of layer 0 before the gated norm
    scales it to 1, so rounding shows; HF's own fp32 run of that row is 1.6e-6 from float64, graphc's 3.8e-6.
    Without the carry (each chunk from zeros) the error is 0.42."""
    x = rows(sum(cuts), seed=len(cuts) * 1000 + cuts[0])
    slot = pair.slots.allocate()
    try:
        got = pair.chunks(x, slot, cuts)
        want = pair.hf_run(x)
        assert rel(got, want) < TOL, f"{cuts}: rel {rel(got, want):.3g}"
        _, cache = pair.hf_steps(x, [sum(cuts)])
        pair.assert_state_is_hf(slot, cache)
    finally:
        pair.slots.free(slot)


def test_decode_steps_after_a_prefill_carry_the_state(pair):
    x = rows(37 + 6, seed=7)
    slot = pair.slots.allocate()
    try:
        want, cache = pair.hf_steps(x, [37] + [1] * 6)              # HF: prefill, then its decode path
        got = pair.chunks(x, slot, [20, 17] + [1] * 6)
        for t in range(37, 43):
            assert rel(got[t], want[t]) < TOL, f"decode step {t - 36}: rel {rel(got[t], want[t]):.3g}"
        assert rel(got, want) < TOL
        pair.assert_state_is_hf(slot, cache)
    finally:
        pair.slots.free(slot)


def test_a_mixed_step_equals_each_sequence_alone(pair):
    """One step holds a first chunk of 70 rows in a slot another sequence just left (its stale state must not
    be read), a continued prefill (20 then 45), two decode rows (after 30 and after 64) and a one-row first
    chunk; slots out of order. Each sequence's rows and final state equal HF's run of it alone."""
    lens = {"fresh": [70], "cont": [20, 45], "dec30": [30, 1], "dec64": [64, 1], "one": [1]}
    xs = {name: rows(sum(c), seed=50 + i) for i, (name, c) in enumerate(lens.items())}
    slot = {name: pair.slots.allocate() for name in lens}
    stale = pair.slots.allocate()
    pair.chunks(rows(40, seed=99), stale, [40])                      # leaves a state behind, then goes
    pair.slots.free(slot.pop("fresh"))
    pair.slots.free(stale)
    slot["fresh"] = pair.slots.allocate()
    assert slot["fresh"] == stale
    earlier = {name: pair.chunks(xs[name], slot[name], c[:-1]) for name, c in lens.items() if len(c) > 1}
    order = ["dec64", "fresh", "one", "cont", "dec30"]
    packed = torch.cat([xs[n][sum(lens[n][:-1]):] for n in order])
    got = pair.step(packed, [slot[n] for n in order], [lens[n][-1] for n in order],
                    [len(lens[n]) > 1 for n in order])
    a = 0
    for name in order:
        n = lens[name][-1]
        want, cache = pair.hf_steps(xs[name], lens[name])
        mine = torch.cat([earlier[name], got[a:a + n]]) if name in earlier else got[a:a + n]
        assert rel(mine, want) < TOL, f"{name}: rel {rel(mine, want):.3g}"
        pair.assert_state_is_hf(slot[name], cache)
        a += n
    for s in slot.values():
        pair.slots.free(s)
    assert pair.slots.all_free()


def test_the_one_gemm_projection_equals_hf(pair, monkeypatch):
    """The projection a GPU runs (GatedDeltaNet.one_gemm: in_proj_qkv|z|b|a stacked at load, one GEMM, its
    columns split as views) on a CPU: a decode row after a prefill and a fresh chunk in one step, against HF."""
    monkeypatch.setattr(GatedDeltaNet, "one_gemm", staticmethod(lambda x: True))
    lens = {"dec": [33, 1], "fresh": [40]}
    xs = {name: rows(sum(c), seed=70 + i) for i, (name, c) in enumerate(lens.items())}
    slot = {name: pair.slots.allocate() for name in lens}
    try:
        before = pair.chunks(xs["dec"], slot["dec"], [33])
        got = pair.step(torch.cat([xs["dec"][33:], xs["fresh"]]), [slot["dec"], slot["fresh"]], [1, 40], [True, False])
        for name, mine in (("dec", torch.cat([before, got[:1]])), ("fresh", got[1:])):
            want, cache = pair.hf_steps(xs[name], lens[name])
            assert rel(mine, want) < TOL, f"{name}: rel {rel(mine, want):.3g}"
            pair.assert_state_is_hf(slot[name], cache)
    finally:
        for s in slot.values():
            pair.slots.free(s)


def test_the_delta_rules_equal_hf_from_a_carried_state():
    """The two torch rules alone against HF's, on 150 rows (three 64-row chunks, the last short) from a nonzero
    initial state: output and final state."""
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(1, 150, HK, DK, generator=g), torch.randn(1, 150, HK, DK, generator=g)
    v = torch.randn(1, 150, HV, DV, generator=g)
    gate = -0.2 * torch.rand(1, 150, HV, generator=g)
    beta = torch.rand(1, 150, HV, generator=g)
    s0 = 0.3 * torch.randn(1, HV, DK, DV, generator=g)
    want, want_s = torch_chunk_gated_delta_rule(q, k, v, gate, beta, initial_state=s0, output_final_state=True,
                                                use_qk_l2norm_in_kernel=True)
    qp, kp = prepare_qk(q[0], k[0], HV // HK)
    got, got_s = chunked_rule(qp, kp, v[0], gate[0], beta[0], s0[0])
    assert rel(got, want[0]) < TOL and rel(got_s, want_s[0]) < TOL
    want, want_s = torch_recurrent_gated_delta_rule(q, k, v, gate, beta, initial_state=s0, output_final_state=True,
                                                    use_qk_l2norm_in_kernel=True)
    got, got_s = recurrent_rule(qp[None], kp[None], v, gate, beta, s0)
    assert rel(got, want) < TOL and rel(got_s, want_s) < TOL


def test_a_step_whose_rows_do_not_match_its_sequences_is_refused(pair):
    step = StateStep(pair.state, [0, 1], [3, 2], [False, False])
    with pytest.raises(ValueError, match=r"got 4 rows for a step of 5 \(sequence lengths \[3, 2\]\)"):
        pair.ours[0](rows(4, seed=0), step)


def test_a_padded_captured_decode_step_equals_the_unpadded_one(pair):
    """A captured decode rung of 6 sequences run with 2 real ones (CapturedState, padded by pad_state onto the
    padding slot) gives the real rows and real slots of the same step run alone (to rounding: the GEMMs see 6
    rows, not 2), and touches no other slot."""
    from resources.base import StepShape
    from resources.linear_state import CapturedState, pad_state

    for s, n in ((0, 5), (1, 3)):                          # two sequences with a prompt behind them
        pair.step(rows(n, seed=s), [s], [n], [False])
    pad, other = SLOTS - 1, 2
    pair.state.conv[:, other].fill_(0.5)
    pair.state.recurrent[:, other].fill_(0.25)
    before = (pair.state.conv.clone(), pair.state.recurrent.clone())
    x = rows(2, seed=9)
    want = pair.step(x, [0, 1], [1, 1], [True, True])
    want_state = (pair.state.conv.clone(), pair.state.recurrent.clone())
    pair.state.conv.copy_(before[0])
    pair.state.recurrent.copy_(before[1])
    step = CapturedState(pair.state, StepShape(rows=6, seqs=6, kv_len=0, phase="decode"))
    step.plan(*pad_state([0, 1], [1, 1], [True, True], 6, pad))
    assert step.slots.tolist() == [0, 1, pad, pad, pad, pad] and step.has_state.tolist() == [True, True] + [False] * 4
    with torch.no_grad():
        h = torch.cat([x, rows(4, seed=10)])
        for layer in pair.ours:
            h = layer(h, step)
    assert rel(h[:2], want) < 1e-6                         # a batch of 6 rows against 2: the GEMMs may round apart
    keep = [i for i in range(SLOTS) if i != pad]
    for got, ref in zip((pair.state.conv, pair.state.recurrent), want_state):
        assert rel(got[:, keep], ref[:, keep]) < 1e-6
        assert torch.equal(got[:, 2:pad], ref[:, 2:pad])   # slots no sequence ran keep their bytes
    assert pair.state.conv[:, other].eq(0.5).all()


def test_a_captured_state_rung_refuses_what_it_cannot_replay(pair):
    from resources.base import StepShape
    from resources.linear_state import CapturedState, pad_state

    with pytest.raises(ValueError, match="one row per sequence .decode.; this rung has 8 rows for 2 sequences"):
        CapturedState(pair.state, StepShape(rows=8, seqs=2, kv_len=0, phase="prefill"))
    step = CapturedState(pair.state, StepShape(rows=3, seqs=3, kv_len=0, phase="decode"))
    with pytest.raises(ValueError, match=r"takes exactly that many one-row sequences .pad_state pads.; got lengths"):
        step.plan([0, 1], [1, 1], [True, True])
    with pytest.raises(ValueError, match=r"takes exactly that many one-row sequences"):
        step.plan([0, 1, 2], [1, 2, 1], [True, True, True])
    with pytest.raises(ValueError, match=r"slot 3 is the padding slot; a running sequence holds it"):
        pad_state([3, 0], [1, 1], [True, True], 3, 3)
    with pytest.raises(ValueError, match=r"3 sequences do not fit a captured rung of 2"):
        pad_state([0, 1, 2], [1, 1, 1], [True] * 3, 2, 3)
