"""Code2Wav parity vs HF's Qwen3OmniMoeCode2Wav (the reference), on a tiny config in fp32.

The reference keeps the real upsampling structure (ratios 2, 2; rates 8, 5, 4, 3: 1920 samples
per frame) with narrow channels. Weights are re-drawn with a fixed seed so that every part
matters (HF's init leaves LayerScale at 0.01 and ConvNeXt's gamma at 1e-6), saved with
save_pretrained and loaded by name with load_weights.
"""
import pytest
import torch
from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeCode2WavConfig
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav

import graphc as gc
from graphc.errors import InvalidInput
from graphc.runtime.checkpoint import load_weights
from graphc.simulate import FakeNode
from graphc.step import StepContext
from models.components.code2wav import (Code2Wav, Code2WavConfig, attention_spec, cu_seqlens, pack_slots,
                                        plan_chunks, ports)
from resources.ragged_attention import RaggedTorch
from tests.conftest import rel
from tests.parity.weights import assert_norm_eps_match, randomize

CHUNK, CONTEXT, WINDOW = 8, 2, 4       # slots of 8 frames, 2 of them left context; the window is smaller
TINY = dict(codebook_size=32, num_quantizers=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, intermediate_size=64, sliding_window=WINDOW, decoder_dim=32)
CFG = Code2WavConfig(**TINY, chunk_frames=CHUNK, left_context=CONTEXT)


def hf_model(sliding_window: int = WINDOW) -> Qwen3OmniMoeCode2Wav:
    cfg = Qwen3OmniMoeCode2WavConfig(**{**TINY, "sliding_window": sliding_window}, attn_implementation="sdpa")
    return Qwen3OmniMoeCode2Wav(cfg).eval()


def redraw(model: torch.nn.Module) -> None:
    """weights.randomize (norms, LayerScale and gamma near 1, every bias nonzero) with small biases and unit-gain
    weights except in the decoder: at unit gain its Snake stack turns fp32 rounding (1e-7) into 6e-5 of waveform;
    at gain 0.5 only about 5x. The last conv is scaled so that about 1% of the samples reach the clamp."""
    randomize(model, seed=0, bias_std=0.01,
              gain=lambda name: 20.0 if name.startswith("decoder.6.") else 0.5 if name.startswith("decoder.") else 1.0)


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    torch.manual_seed(0)
    model = hf_model()
    redraw(model)
    path = tmp_path_factory.mktemp("code2wav")
    model.save_pretrained(path)
    return model, path


def ours(path, cfg: Code2WavConfig = CFG) -> Code2Wav:
    module = Code2Wav(cfg).eval()
    load_weights(module, path)
    return module


def decode(module: Code2Wav, codes: torch.Tensor, filled: torch.Tensor | None = None,
           slot_frames: int = CHUNK) -> torch.Tensor:
    """codes [slots * slot_frames, Q] (every slot full unless `filled` says) -> wav [slots, U * slot_frames]."""
    slots = codes.shape[0] // slot_frames
    filled = torch.full((slots,), slot_frames) if filled is None else filled
    attn = RaggedTorch(attention_spec(module.cfg, "code2wav_attn"), cu_seqlens(slot_frames, slots))
    with torch.no_grad():
        return module(StepContext({"attn": attn}), codes=codes, filled=filled)["wav"].view(slots, -1)



def random_codes(*shape: int, seed: int) -> torch.Tensor:
    return torch.randint(0, CFG.codebook_size, shape, generator=torch.Generator().manual_seed(seed))


def test_two_chunks_in_one_packed_step_match_hf(hf):
    model, path = hf
    codes = random_codes(2, 16, CHUNK, seed=1)                   # HF layout [B, Q, F]
    with torch.no_grad():
        want = model(codes)[:, 0]                                # [2, S]
    wav = decode(ours(path), codes.transpose(1, 2).reshape(2 * CHUNK, 16))
    assert wav.shape == (2, 1920 * CHUNK)
    got = wav[:, :CFG.samples_per_chunk]
    assert want.shape == got.shape == (2, 1920 * CHUNK - 555)
    assert (wav[:, CFG.samples_per_chunk:] == 0).all()             # the tail the next frame owes: zero
    assert 0 < (want.abs() >= 1).float().mean() < 0.2           # the clamp is exercised, not everywhere
    assert rel(got[0], got[1]) > 0.5                            # the two chunks differ
    assert rel(got, want) < 1e-5


def test_norm_epsilons_match_hf(hf):
    assert assert_norm_eps_match(ours(hf[1]), hf[0]) == 7       # 2 x 2 in the layers, the final one, 2 ConvNeXt


def test_chunked_decode_of_two_requests_matches_hf(hf):
    """HF's chunked_decode (new = CHUNK - CONTEXT frames per chunk, CONTEXT frames of left context)
    for two requests, as slots of one step (plus an unfilled slot), trimmed by the plan."""
    model, path = hf
    requests = [random_codes(16, 17, seed=2), random_codes(16, 5, seed=3)]
    filled = [(codes, slot) for codes in requests for slot in plan_chunks(CFG, codes.shape[1])]
    assert [(s.start, s.frames) for _, s in filled] == [(0, 6), (4, 8), (10, 7), (0, 5)]
    step = pack_slots(CFG, filled, total_slots=len(filled) + 1)
    assert step["filled"].tolist() == [6, 8, 7, 5, 0]
    wav = decode(ours(path), step["codes"], step["filled"])
    assert (wav[-1] == 0).all()                                    # an unfilled slot gives silence
    for codes in requests:
        got = torch.cat([wav[i, s.keep_start:s.keep_stop] for i, (c, s) in enumerate(filled) if c is codes])
        with torch.no_grad():
            want = model.chunked_decode(codes[None], chunk_size=CHUNK - CONTEXT, left_context_size=CONTEXT)[0, 0]
        assert got.shape == want.shape
        assert rel(got, want) < 1e-5


def test_short_slots_match_hf_and_pad_with_silence(hf):
    """Slots shorter than chunk_frames (a model's walk for first chunks): 3 slots of 5 frames holding
    5, 3 and 0 frames give HF's call on those frames, then exact zeros."""
    model, path = hf
    codes = random_codes(2, 16, 5, seed=5)
    packed = torch.zeros(15, 16, dtype=torch.int64)
    packed[:5], packed[5:8] = codes[0].T, codes[1, :, :3].T
    wav = decode(ours(path), packed, torch.tensor([5, 3, 0]), slot_frames=5)
    assert wav.shape == (3, 1920 * 5)
    with torch.no_grad():
        want = [model(codes[:1])[0, 0], model(codes[1:, :, :3])[0, 0]]
    for row, w in zip(wav, want):
        assert rel(row[:len(w)], w) < 1e-5
        assert (row[len(w):] == 0).all()
    assert (wav[2] == 0).all()


def test_sliding_window_matters_and_counts_keys_like_hf(hf):
    """A full-causal module differs from the windowed one, and equals HF with a window wider than
    the slot; off-by-one windows miss HF: RaggedAttentionSpec's window is HF's sliding_window."""
    model, path = hf
    codes = random_codes(2, 16, CHUNK, seed=4)
    packed = codes.transpose(1, 2).reshape(2 * CHUNK, 16)
    with torch.no_grad():
        want = model(codes)[:, 0]
        full_hf = hf_model(sliding_window=4 * CHUNK)
        full_hf.load_state_dict(model.state_dict())
        want_full = full_hf(codes)[:, 0]
    n = CFG.samples_per_chunk
    windowed = decode(ours(path), packed)[:, :n]
    full = decode(ours(path, CFG.model_copy(update={"sliding_window": None})), packed)[:, :n]
    assert rel(windowed, want) < 1e-5 and rel(full, want_full) < 1e-5
    assert rel(full, windowed) > 0.1
    for w in (WINDOW - 1, WINDOW + 1):
        assert rel(decode(ours(path, CFG.model_copy(update={"sliding_window": w})), packed)[:, :n], want) > 1e-2


def real_node() -> gc.Node:
    cfg = Code2WavConfig()
    inputs, outputs = ports(cfg)
    return gc.Node(name="code2wav", module=Code2Wav, config=cfg, inputs=inputs, outputs=outputs,
                   resources={"attn": "code2wav_attn"}, dtype="float32", weight_prefix="code2wav.")


def test_real_config_shapes_and_weight_count():
    cfg = Code2WavConfig()
    assert cfg.total_upsample == 1920 and cfg.samples(300) == 1920 * 300 - 555
    with torch.device("meta"):
        module = Code2Wav(cfg)
    # the checkpoint's 230 code2wav tensors: each stacked gate_up_proj stands for its gate_proj and up_proj
    names = module.state_dict()
    assert len(names) + sum(n.endswith("gate_up_proj.weight") for n in names) == 230
    assert sum(p.numel() for p in module.parameters()) == 216_016_577


def test_forward_traces_on_meta_tensors():
    node = real_node()
    spec = attention_spec(node.config, "code2wav_attn")
    sizes = {"frames": 2 * node.config.chunk_frames, "seqs": 2}
    fake = spec.fake(spec.step_shape("frames", sizes, "chunk"))
    trace = FakeNode(node).trace(node.inputs, sizes, {"attn": fake}, "code2wav")
    assert trace.output_bytes == 2 * node.config.chunk_frames * 1920 * 4
    assert trace.peak_bytes > trace.output_bytes
    for bad in ({"frames": 301, "seqs": 2}, {"frames": 2 * 326, "seqs": 2}):
        with pytest.raises(InvalidInput, match="must be whole slots"):
            FakeNode(node).trace(node.inputs, bad, {"attn": fake}, "code2wav")
