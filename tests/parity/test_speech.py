"""Speech out (t2s, a2s) through the whole engine against HF's Qwen3OmniMoeForConditionalGeneration.generate
with audio output (transformers 5.24, the talker greedy, its repetition penalty 1.0 or HF's default 1.05,
fp32): a tiny Qwen3-Omni with talker and Code2Wav written by save_pretrained (examples/make_tiny_checkpoint.py
omni-speech), every weight re-drawn (Code2Wav's as test_code2wav draws them), planned from its config.json
and served by graphc.Engine from chat messages.

HF runs the talker after the thinker finished; the engine starts it while the thinker still decodes and
runs Code2Wav chunk by chunk. The codec frames must equal HF's exactly, alone and among other requests;
the waveform equals HF's within 1e-5 when the speech fits one chunk. Streamed in chunks, each chunk is
HF's Code2Wav on the same frames (checked), and the whole differs from HF's chunked_decode only by the
samples HF drops at every chunk boundary (checked against HF's chunked_decode on the same chunking).
Sampled speech (HF's defaults) with a seed gives the same frames alone and among other requests.
"""
import numpy as np
import pytest
import torch

from graphc.runtime.engine import Engine
from graphc.runtime.sampler import SamplingParams
from graphc.runtime.speech import SpeechParams
from models.components.code2wav import stream_chunk_frames, stream_slot
from tests.parity.test_engine import expand, hf_audio
from tests.parity.speaking import serve_all, speaking_omni

TEXT = 8


@pytest.fixture(scope="module")
def omni(tmp_path_factory):
    hf, tok, plan, ckpt = speaking_omni(tmp_path_factory.mktemp("speech"), redraw_code2wav=True)
    return hf, tok, Engine(plan, checkpoint=ckpt), plan.parent


def hf_speak(hf, tok, engine, parts, frames, voice="Ethan", wav=None, penalty=1.05):
    """HF generate with audio out, the talker greedy: (text ids, codes [frames][G], waveform). Frames past an
    end code are not made; talker_max_new_tokens = frames + 1 gives `frames` complete frames (HF completes
    frame k at step k+1). penalty: talker_repetition_penalty (HF's default 1.05)."""
    kw, counts = {}, []
    if wav is not None:
        kw, n = hf_audio(wav)
        counts.append(n)
    out = expand(tok, engine, parts, counts)
    seen = {}
    real = hf.code2wav.chunked_decode

    def spy(codes, **kw2):
        seen["codes"] = codes
        return real(codes, **kw2)

    hf.code2wav.chunked_decode = spy
    try:
        with torch.no_grad():
            seq, audio = hf.generate(input_ids=torch.tensor([out]), attention_mask=torch.ones(1, len(out), dtype=torch.long),
                                     speaker=voice, return_audio=True, thinker_max_new_tokens=TEXT,
                                     thinker_do_sample=False, thinker_eos_token_id=tok.token_to_id("<|im_end|>"),
                                     talker_do_sample=False, talker_max_new_tokens=frames + 1,
                                     talker_repetition_penalty=penalty, **kw)
    finally:
        hf.code2wav.chunked_decode = real
    return seq[0, len(out):].tolist(), seen["codes"][0].T.tolist(), audio.reshape(-1)


def serve(engine, items, arrivals=None):
    """items: (messages, SpeechParams or None), each with greedy text of TEXT tokens at most (serve_all)."""
    return serve_all(engine, [(m, SamplingParams(temperature=0, max_tokens=TEXT), sp) for m, sp in items],
                     arrivals or [0] * len(items))


def rel(a, b) -> float:
    a, b = torch.as_tensor(np.asarray(a)).double(), torch.as_tensor(np.asarray(b)).double()
    return float((a - b).norm() / b.norm())


def msgs(parts):
    return [{"role": "user", "content": parts}]


T2S = [{"type": "text", "text": "hello world, how are you today?"}]


def test_t2s_and_a2s_codes_and_one_chunk_waveform_equal_hf(omni, tmp_path):
    hf, tok, engine, path = omni
    wav = str(path / "ckpt" / "sample.wav")
    a2s = [{"type": "audio", "path": wav}, {"type": "text", "text": "transcribe this audio please"}]
    reasons = set()
    for parts, hf_parts, w, voice, penalty in [(T2S, T2S, None, "chelsie", 1.0),
                                               (a2s, [{"type": "audio"}, a2s[1]], wav, "ethan", 1.05)]:
        text, codes, audio = hf_speak(hf, tok, engine, hf_parts, 20, voice=voice.capitalize(), wav=w, penalty=penalty)
        assert 0 < len(codes) <= 20 and len(codes[0]) == 4
        if penalty != 1.0:            # HF's default penalty (over the frames' earlier first codes) changes these
            assert codes != hf_speak(hf, tok, engine, hf_parts, 20, voice=voice.capitalize(), wav=w, penalty=1.0)[1]
        one = SpeechParams(voice=voice, max_frames=20, first_chunk=20, temperature=0,   # one Code2Wav slot
                           repetition_penalty=penalty)
        out = serve(engine, [(msgs(parts), one)])[0]
        assert out.token_ids == text
        assert out.audio_codes == codes
        assert out.audio_finish_reason == ("length" if len(codes) == 20 else "stop") and out.sample_rate == 24000
        reasons.add(out.audio_finish_reason)
        assert out.audio.shape == audio.shape and rel(out.audio, audio) < 1e-5
    assert reasons == {"stop", "length"}     # weights seed 3: chelsie's talker ends itself at frame 18 (no penalty)


def test_streamed_chunks_are_hf_code2wav_on_the_same_frames_among_other_requests(omni):
    """Default chunking (2 frames, then 4 beside 2 of context in short slots of 8, then 8 beside 4 in middle slots
    of 16, then 16 and the last 15 new frames beside 4 of context in slots of 24), 45 frames, t2s among a second t2s with another voice and a text
    request arriving later: frames equal HF's; each chunk's samples are HF Code2Wav's on that chunk's frames;
    the chunks join without a gap (U*N - tail samples in all)."""
    hf, tok, engine, _ = omni
    _, codes, _ = hf_speak(hf, tok, engine, T2S, 45)
    _, codes_b, _ = hf_speak(hf, tok, engine, T2S, 12, voice="Aiden")
    items = [(msgs(T2S), SpeechParams(max_frames=45, temperature=0)),
             (msgs(T2S), SpeechParams(voice="aiden", max_frames=12, temperature=0)),
             (msgs([{"type": "text", "text": "what is in the image"}]), None)]
    before = dict(engine.scheduler.stats.steps)
    outs = serve(engine, items, arrivals=[0, 3, 5])
    ran = {w: n - before.get(w, 0) for w, n in engine.scheduler.stats.steps.items()}
    # first chunks in 8-frame slots, the third in 16, later ones in 24
    assert ran["code2wav_short"] >= 1 and ran["code2wav_mid"] >= 1 and ran["code2wav_chunk"] >= 1
    assert outs[0].audio_codes == codes and outs[1].audio_codes == codes_b
    assert outs[2].audio is None and len(outs[2].token_ids) == TEXT
    cfg = hf.code2wav.config
    c = torch.tensor(codes).T[None]                                    # [1, G, N]
    vcfg = engine.host.speech.vcfg
    want, start, i = [], 0, 0
    while start < 45:
        end = min(start + stream_chunk_frames(vcfg, i, 2), 45)
        s = stream_slot(vcfg, start, end)
        with torch.no_grad():
            w = hf.code2wav(c[..., s.start:s.start + s.frames])[0, 0]
        want.append(w[s.keep_start:s.keep_stop])
        start, i = end, i + 1
    want = torch.cat(want)
    u = 2 * 2 * 2 ** 4
    assert len(want) == len(outs[0].audio) == u * 45 - (u * 1 - vcfg.samples(1)) and i == 5
    assert engine.host.speech.first_chunk == 2
    assert rel(outs[0].audio, want) < 1e-5
    del cfg


def test_fixed_chunks_differ_from_hf_chunked_decode_only_by_the_samples_it_drops(omni):
    """first_chunk = chunk_frames - left_context (20 for tiny) gives HF chunked_decode's own chunking (20 new
    frames, 4 of context): removing the `tail` samples graphc keeps at each of the 2 boundaries gives HF's."""
    hf, tok, engine, _ = omni
    vcfg = engine.host.speech.vcfg
    new = vcfg.chunk_frames - vcfg.left_context
    _, codes, _ = hf_speak(hf, tok, engine, T2S, 45)
    out = serve(engine, [(msgs(T2S), SpeechParams(max_frames=45, first_chunk=new, temperature=0))])[0]
    with torch.no_grad():
        theirs = hf.code2wav.chunked_decode(torch.tensor(codes).T[None], chunk_size=new,
                                            left_context_size=vcfg.left_context)[0, 0]
    tail = vcfg.total_upsample - vcfg.samples(1)
    ours = torch.as_tensor(out.audio)
    assert len(ours) == len(theirs) + 2 * tail
    # in graphc's waveform, boundary k (k = 1, 2) sits at k * new frames; HF's chunk before it ends `tail` early
    cut = [k * new * vcfg.total_upsample - tail for k in (1, 2)]
    kept = torch.cat([ours[:cut[0]], ours[cut[0] + tail:cut[1]], ours[cut[1] + tail:]])
    assert rel(kept, theirs) < 1e-5
    # the samples HF drops are real audio: they continue the waveform (no click at the joins)
    gap = ours[cut[0]:cut[0] + tail]
    assert gap.abs().max() > 0


def test_unknown_voice_is_refused_with_the_voices(omni):
    engine = omni[2]
    with pytest.raises(Exception) as e:
        engine.add(messages=msgs(T2S), speech=SpeechParams(voice="nobody"))
    assert "aiden, chelsie, ethan" in str(e.value) and getattr(e.value, "param", None) == "voice"


def test_a_seeded_request_samples_the_same_alone_and_among_others(omni):
    """Qwen3-Omni's default sampling (temperature 0.9, top_k 50, repetition penalty 1.05; residual codes top_k
    50, top_p 0.8) with a seed: the same frames alone and beside other requests (another seed, the shared
    generator, greedy speech, text only, the same request twice) arriving at other steps; another seed gives
    other frames, and so does greedy. The request's seen ids are its frames' first codes (and the end code)."""
    engine = omni[2]
    mine = SpeechParams(max_frames=30, seed=11)
    req = engine.add(messages=msgs(T2S), params=SamplingParams(temperature=0, max_tokens=TEXT), speech=mine)
    while engine.has_work():
        engine.step()
    alone = engine.output(req).audio_codes
    assert len(alone) == 30
    seen = set(req.speech.seen.nonzero().flatten().tolist())
    assert {f[0] for f in alone} <= seen <= {f[0] for f in alone} | {engine.host.speech.tcfg.codec_eos_token_id}
    items = [(msgs(T2S), SpeechParams(voice="aiden", max_frames=25, seed=5)), (msgs(T2S), SpeechParams(max_frames=20)),
             (msgs(T2S), mine), (msgs(T2S), SpeechParams(max_frames=15, temperature=0)),
             (msgs([{"type": "text", "text": "what is in the image"}]), None), (msgs(T2S), mine)]
    outs = serve(engine, items, arrivals=[0, 1, 2, 2, 4, 6])
    assert outs[2].audio_codes == alone and outs[5].audio_codes == alone
    assert outs[0].audio_codes != alone[:len(outs[0].audio_codes)]
    again = serve(engine, [(msgs(T2S), SpeechParams(max_frames=30, seed=12)),
                           (msgs(T2S), SpeechParams(max_frames=30, temperature=0))])
    for out in again:
        assert out.audio_codes != alone
