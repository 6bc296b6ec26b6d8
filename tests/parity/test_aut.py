"""The AuT audio encoder against HF's Qwen3-Omni and Qwen3-ASR (-hf) encoders, loaded through graphc's
checkpoint loader from the safetensors HF itself wrote (every HF weight re-drawn first, LayerNorms and biases
included); several audios packed into one step of W windows."""
import pytest
import torch
from transformers.models.qwen3_asr.configuration_qwen3_asr import Qwen3ASRConfig
from transformers.models.qwen3_asr.feature_extraction_qwen3_asr import Qwen3ASRFeatureExtractor
from transformers.models.qwen3_asr.modeling_qwen3_asr import Qwen3ASRForConditionalGeneration
from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeAudioEncoderConfig
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
    Qwen3OmniMoeAudioEncoder, _get_feat_extract_output_lengths, chunk_and_pad_features, get_audio_cu_seqlens)

import graphc as gc
from graphc.runtime.checkpoint import load_weights
from graphc.simulate import FakeNode
from graphc.step import StepContext
from models.components.audio_inputs import log_mel, num_tokens, pack_audios, window_lengths
from models.components.aut import (QWEN3_ASR_0_6B_AUT, QWEN3_ASR_1_7B_AUT, QWEN3_OMNI_AUT, AuTConfig, AuTEncoder,
                                   AuTEncoderHF, attention_spec, node_ports)
from resources.ragged_attention import RaggedTorch
from tests.conftest import rel
from tests.parity.weights import assert_norm_eps_match, randomize

TINY = dict(num_mel_bins=128, d_model=64, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=128,
            output_dim=32, downsample_hidden_size=16, n_window=50, n_window_infer=800)
CFG = AuTConfig(**TINY)
# >8 s ending in a partial chunk; partial chunks; exactly one chunk; 105 tokens (a 1-token window); 1 token
FRAMES = [1337, 450, 100, 37, 801, 3]
W = 9   # the audios take 8 windows: one window of the step stays empty



@pytest.fixture(scope="module")
def mels():
    torch.manual_seed(1)
    return [torch.randn(128, n) for n in FRAMES]


def run(module, mels, windows=W):
    step = pack_audios(mels, windows, CFG)
    attn = RaggedTorch(attention_spec(CFG, "audio_attn"), step.cu_seqlens)
    with torch.no_grad():
        embeds = module(StepContext({"attn": attn}), mel=step.mel, rows=step.rows)["embeds"]
    return step, [embeds[o:o + n] for o, n in zip(step.offsets, step.num_tokens)]


@pytest.fixture(scope="module")
def omni(tmp_path_factory):
    torch.manual_seed(0)
    hf = Qwen3OmniMoeAudioEncoder(Qwen3OmniMoeAudioEncoderConfig(**TINY)).eval()
    randomize(hf, seed=0)   # every tensor off its init: LayerNorms off 1, biases off 0
    path = tmp_path_factory.mktemp("aut_omni")
    hf.save_pretrained(path)
    ours = AuTEncoder(CFG).eval()
    load_weights(ours, path)
    return hf, ours


def test_omni_encoder_matches_hf(omni, mels):
    hf, ours = omni
    lens = torch.tensor(FRAMES)
    with torch.no_grad():
        ref = hf(input_features=torch.cat(mels, 1), feature_lens=lens).last_hidden_state
    step, got = run(ours, mels)
    chunk_lens = chunk_and_pad_features(torch.cat(mels, 1), lens, 50)[1]
    assert step.cu_seqlens == get_audio_cu_seqlens(chunk_lens, lens, 800, 50).tolist()
    assert step.num_tokens == _get_feat_extract_output_lengths(lens).tolist() == [174, 59, 13, 5, 105, 1]
    assert sum(step.num_tokens) == ref.shape[0]
    start = 0
    for a, rows in enumerate(got):
        assert rel(rows, ref[start:start + rows.shape[0]]) < 1e-5, f"audio {a} ({FRAMES[a]} frames)"
        start += rows.shape[0]


def test_norm_epsilons_match_hf(omni):
    assert assert_norm_eps_match(omni[1], omni[0]) == 2 * CFG.encoder_layers + 1


def test_long_audio_cut_at_a_window_runs_in_pieces(omni, mels):
    """Windows are independent: 8 s pieces of an audio packed apart give the same rows."""
    whole = run(omni[1], mels[:1])[1][0]
    pieces = run(omni[1], [mels[0][:, :800], mels[0][:, 800:]])[1]
    assert rel(torch.cat(pieces), whole) < 1e-6


def test_thirty_seconds_make_windows_104_104_104_78():
    torch.manual_seed(2)
    mel = log_mel(0.1 * torch.randn(30 * 16_000))
    assert mel.shape == (128, 3000)
    assert window_lengths(3000, QWEN3_OMNI_AUT) == [104, 104, 104, 78]
    step = pack_audios([mel], 4, QWEN3_OMNI_AUT)
    assert step.cu_seqlens == [0, 104, 208, 312, 390]
    assert step.num_tokens == [390] and step.offsets == [0]
    assert step.mel.shape == (32, 128, 100) and step.rows.shape == (416,)
    assert sorted(step.rows.tolist()) == list(range(416))    # a permutation of the post-conv grid
    assert num_tokens(100, QWEN3_OMNI_AUT) == 13 and num_tokens(37, QWEN3_OMNI_AUT) == 5


def test_log_mel_matches_qwen3_asr_extractor():
    torch.manual_seed(3)
    for n in (4000, 23_456):     # shorter than Qwen3-ASR's 0.5 s minimum, and 1.47 s
        wave = 0.1 * torch.randn(n)
        ref = Qwen3ASRFeatureExtractor()(wave.numpy(), sampling_rate=16_000, padding="longest",
                                         return_attention_mask=True)
        frames = int(ref["attention_mask"].sum())
        ours = log_mel(wave, min_samples=8000)
        assert ours.shape == (128, frames)
        torch.testing.assert_close(ours, ref["input_features"][0, :, :frames], rtol=0, atol=1e-5)


@pytest.mark.parametrize("n_mels", [128, 80])
def test_log_mel_matches_whisper_extractor(n_mels):
    """Qwen3-Omni's processor uses Whisper's extractor; ours is torch alone (no transformers at run time)."""
    from transformers import WhisperFeatureExtractor

    from models.components.audio_inputs import mel_filters

    fe = WhisperFeatureExtractor(feature_size=n_mels, sampling_rate=16_000, hop_length=160, n_fft=400)
    torch.testing.assert_close(mel_filters(n_mels), torch.from_numpy(fe.mel_filters.T).float(), rtol=0, atol=1e-7)
    torch.manual_seed(4)
    for n in (201, 1000, 16_123, 48_000):        # the shortest it takes, and not a multiple of the hop
        wave = 0.3 * torch.randn(n)
        wave[: n // 3] *= 0.001                   # quiet then loud: the 8-decade floor matters
        ref = fe(wave.numpy(), sampling_rate=16_000, padding="longest", truncation=False,
                 return_tensors="pt")["input_features"][0, :, : n // 160]
        torch.testing.assert_close(log_mel(wave, n_mels), ref, rtol=0, atol=1e-5)


def test_a_waveform_too_short_for_one_frame_is_refused():
    with pytest.raises(ValueError, match="200 samples is too short.*more than 200"):
        log_mel(torch.zeros(200))


def test_too_many_windows_are_refused(mels):
    with pytest.raises(ValueError, match="take 8 windows, the step holds 6"):
        pack_audios(mels, 6, CFG)


def test_qwen3_asr_hf_encoder_matches(tmp_path, mels):
    torch.manual_seed(0)
    hf = Qwen3ASRForConditionalGeneration(Qwen3ASRConfig(
        audio_config=dict(model_type="qwen3_asr_encoder", **TINY),
        text_config=dict(model_type="qwen3", vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=16, intermediate_size=64))).eval()
    randomize(hf, seed=0)   # every tensor off its init: LayerNorms off 1, biases off 0
    hf.save_pretrained(tmp_path)
    ours = AuTEncoderHF(CFG).eval()
    report = load_weights(ours, tmp_path, prefix="model.", strict=False)   # model.language_model.* is another node's
    audio = {k for k in hf.state_dict() if k.startswith(("model.audio_tower.", "model.multi_modal_projector."))}
    assert audio and report.used == audio
    assert_norm_eps_match(ours, hf, lambda name: "model." + name)

    padded = 100 * -(-max(FRAMES) // 100)     # the -hf encoder wants a multiple of 100 frames, zero-padded
    features = torch.zeros(len(FRAMES), 128, padded)
    mask = torch.zeros(len(FRAMES), padded, dtype=torch.long)
    for a, m in enumerate(mels):
        features[a, :, :m.shape[1]] = m
        mask[a, :m.shape[1]] = 1
    with torch.no_grad():
        ref = hf.model.get_audio_features(input_features=features, input_features_mask=mask).pooler_output
    _, got = run(ours, mels)
    start = 0
    for a, rows in enumerate(got):
        assert rel(rows, ref[start:start + rows.shape[0]]) < 1e-5, f"audio {a} ({FRAMES[a]} frames)"
        start += rows.shape[0]
    assert start == ref.shape[0]


@pytest.mark.parametrize("module", [AuTEncoder, AuTEncoderHF])
def test_forward_traces_on_meta_tensors(module):
    inputs, outputs = node_ports(CFG, "float32")
    node = gc.Node(name="audio_encoder", module=module, config=CFG, inputs=inputs, outputs=outputs,
                   resources={"attn": "audio_attn"}, dtype="float32")
    spec = attention_spec(CFG, "audio_attn")
    sizes = {"windows": 2}
    bindings = {"attn": spec.fake(spec.step_shape("windows", sizes, "prefill"))}
    trace = FakeNode(node).trace(node.inputs, sizes, bindings, "audio_encoder")
    assert inputs["mel"].concrete(sizes) == (16, 128, 100) and inputs["rows"].concrete(sizes) == (208,)
    assert trace.output_bytes == 2 * 104 * 32 * 4 and trace.peak_bytes > 0


@pytest.mark.parametrize("cfg, params", [(QWEN3_OMNI_AUT, 647_927_168), (QWEN3_ASR_0_6B_AUT, 186_376_192),
                                         (QWEN3_ASR_1_7B_AUT, 317_477_504)], ids=["omni", "asr-0.6b", "asr-1.7b"])
def test_real_sizes_match_the_checkpoints(cfg, params):
    with torch.device("meta"):
        module = AuTEncoder(cfg)
    assert sum(p.numel() for p in module.parameters()) == params
    if cfg is QWEN3_OMNI_AUT:
        assert len(module.state_dict()) == 525     # the checkpoint's thinker.audio_tower.* tensor count
