"""The whole engine against HF generate (greedy, fp32): tiny Qwen3-ASR and a tiny Qwen3-Omni thinker written
by transformers' save_pretrained with a tokenizer built by `tokenizers` and a chat template
(examples/make_tiny_checkpoint.py), every weight re-drawn, planned with `graphc plan --checkpoint`, served by
graphc.Engine from chat messages with audio from a WAV file (our log-mel; HF gets its own extractor's
features) and an image from a PNG (HF gets the patches our processor made: tests/parity/test_vision.py holds
the processor to HF's). Each request alone, then again among others of every kind arriving at other steps.
"""
import numpy as np
import pytest
import soundfile as sf
import torch
from PIL import Image
from transformers import GenerationConfig, WhisperFeatureExtractor
from transformers.models.qwen3_asr.feature_extraction_qwen3_asr import Qwen3ASRFeatureExtractor
from transformers.models.qwen3_asr.processing_qwen3_asr import Qwen3ASRProcessor
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import _get_feat_extract_output_lengths

from examples.make_tiny_checkpoint import asr_model, build_tokenizer, omni_model, save
from graphc.cli import main
from graphc.runtime.engine import Engine
from graphc.runtime.media import load_audio, load_image, load_video
from graphc.runtime.sampler import SamplingParams
from models.components.hosting import vision_processing
from models.components.vision_inputs import process_image, process_video
from tests.parity.weights import randomize

NEW = 10
GREEDY = GenerationConfig(max_new_tokens=NEW, do_sample=False, eos_token_id=None, pad_token_id=0)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("media")
    rng = np.random.default_rng(0)
    t = np.arange(16000 * 3) / 16000
    waves = {"short": (0.1 * rng.standard_normal(16000 * 2)).astype(np.float32),
             "long": (0.3 * np.sin(2 * np.pi * 330 * t) * np.exp(-t) + 0.05 * rng.standard_normal(t.size))
             .astype(np.float32)[: int(16000 * 2.7)],
             "minute": (0.1 * rng.standard_normal(16000 * 35)).astype(np.float32)}     # past 30 s: 5 windows of 8 s
    out = {}
    for k, w in waves.items():
        sf.write(d / f"{k}.wav", w, 16000)
        out[k] = str(d / f"{k}.wav")
    pixels = rng.integers(0, 256, (40, 56, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(d / "img.png")
    out["img"] = str(d / "img.png")
    out["video"] = str(d / "clip.mp4")
    write_video(out["video"], rng.integers(0, 256, (8, 64, 96, 3), dtype=np.uint8), fps=4)
    out["av"] = str(d / "av.mkv")                  # 3 s of frames with 3 s of 44.1 kHz stereo sound
    write_video(out["av"], rng.integers(0, 256, (12, 64, 96, 3), dtype=np.uint8), fps=4,
                sound=(0.3 * np.sin(2 * np.pi * np.arange(3 * 44100) / 44100 * np.array([[440.0], [660.0]])))
                .astype(np.float32))
    return out


def write_video(path: str, frames: np.ndarray, fps: int, sound: np.ndarray | None = None) -> None:
    """frames [F, H, W, 3] uint8; sound [2, n] float32 at 44.1 kHz, written as 16-bit PCM."""
    import av

    with av.open(path, "w") as out:
        stream = out.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
        audio = out.add_stream("pcm_s16le", rate=44100, layout="stereo") if sound is not None else None
        for f in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(f, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
        if audio is not None:
            pcm = (sound.T.reshape(1, -1) * 32767).astype(np.int16)          # packed: L R L R ...
            frame = av.AudioFrame.from_ndarray(pcm, format="s16", layout="stereo")
            frame.sample_rate = 44100
            for packet in audio.encode(frame):
                out.mux(packet)
            for packet in audio.encode():
                out.mux(packet)


def build(tmp_path_factory, kind):
    tok = build_tokenizer()
    hf = asr_model(tok) if kind == "asr" else omni_model(tok)
    randomize(hf, seed=1)
    path = tmp_path_factory.mktemp(kind)
    save(hf, tok, path / "ckpt")
    model = "models/qwen3_asr.py" if kind == "asr" else "models/qwen3_omni.py"
    assert main(["plan", model, "--preset", "tiny", "--checkpoint", str(path / "ckpt"), "--gpu", "cpu",
                 "-o", str(path / "p.plan"), "-q"]) == 0
    return hf, tok, Engine(path / "p.plan", checkpoint=path / "ckpt")


@pytest.fixture(scope="module")
def asr(tmp_path_factory):
    return build(tmp_path_factory, "asr")


@pytest.fixture(scope="module")
def omni(tmp_path_factory):
    return build(tmp_path_factory, "omni")


def greedy(**kw) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True, **kw)


def expand(tok, engine, parts, counts) -> list[int]:
    """The chat template's ids with each placeholder repeated as HF's processor counts it."""
    ids = tok.encode(engine.template.render([{"role": "user", "content": parts}]), add_special_tokens=False).ids
    pads = {tok.token_to_id(f"<|{k}_pad|>") for k in ("audio", "image", "video")}
    out, k = [], 0
    for t in ids:
        if t in pads:
            out += [t] * counts[k]
            k += 1
        else:
            out.append(t)
    return out


def run(engine, messages_list, arrivals=None):
    """Serve requests, adding request i before step arrivals[i]; token ids by request."""
    arrivals = arrivals or [0] * len(messages_list)
    reqs, step = {}, 0
    while len(reqs) < len(messages_list) or engine.has_work():
        for i, (msgs, at) in enumerate(zip(messages_list, arrivals)):
            if at == step and i not in reqs:
                kw = msgs if isinstance(msgs, dict) else {"messages": msgs}    # a dict: add()'s arguments
                reqs[i] = engine.add(**kw, params=greedy())
        engine.step()
        step += 1
    assert engine.scheduler.idle() and engine.scheduler.pool_full()
    return [reqs[i].output for i in range(len(messages_list))]


# ---- Qwen3-ASR (transformers' layout): a2t
def hf_asr(hf, tok, engine, wav, text) -> list[int]:
    w = load_audio(wav)
    fe = Qwen3ASRFeatureExtractor()(w, sampling_rate=16000, padding="longest", truncation=False,
                                    return_attention_mask=True, return_tensors="pt")
    pad = -fe["input_features"].shape[-1] % 100         # the -hf encoder takes whole 100-frame chunks
    feats = torch.nn.functional.pad(fe["input_features"], (0, pad))
    mask = torch.nn.functional.pad(fe["attention_mask"], (0, pad))
    n = int(Qwen3ASRProcessor._get_audio_token_length(None, mask.sum(-1))[0])
    ids = expand(tok, engine, [{"type": "audio"}, {"type": "text", "text": text}], [n])
    with torch.no_grad():
        g = hf.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                        input_features=feats, input_features_mask=mask, generation_config=GREEDY)
    return g[0, len(ids):].tolist()


def asr_messages(wav, text):
    return [{"role": "user", "content": [{"type": "audio", "path": wav}, {"type": "text", "text": text}]}]


def test_asr_a2t_alone_and_mixed_equal_hf(asr, files):
    hf, tok, engine = asr
    cases = [(files["short"], "transcribe this audio please"), (files["long"], "hello world"),
             (files["minute"], "transcribe")]
    want = [hf_asr(hf, tok, engine, w, t) for w, t in cases]
    assert [run(engine, [asr_messages(*c)])[0] for c in cases] == want
    mixed = [asr_messages(*cases[i % 3]) for i in range(9)]
    got = run(engine, mixed, arrivals=[0, 0, 1, 2, 2, 3, 5, 8, 9])
    assert got == [want[i % 3] for i in range(9)]


# ---- Qwen3-Omni thinker: t2t, a2t, i2t
def hf_audio(wav) -> tuple[dict, int]:
    """HF Qwen3-Omni's inputs for a WAV (its own Whisper features) and the audio tokens it expands to."""
    w = load_audio(wav)
    fe = WhisperFeatureExtractor(feature_size=128)(w, sampling_rate=16000, padding="longest",
                                                   return_attention_mask=True, return_tensors="pt")
    frames = int(fe["attention_mask"].sum())
    kw = dict(input_features=fe["input_features"][:, :, :frames],
              feature_attention_mask=torch.ones(1, frames, dtype=torch.long))
    return kw, int(_get_feat_extract_output_lengths(torch.tensor(frames)))


def hf_omni(hf, tok, engine, parts, wav=None, img=None, video=None) -> list[int]:
    kw, counts = {}, []
    if wav is not None:
        audio, n = hf_audio(wav)
        kw |= audio
        counts.append(n)
    proc = vision_processing(str(engine.checkpoint))        # the checkpoint's pixel bounds, as HF's processor reads them
    if img is not None:
        item = process_image(load_image(img), proc)
        kw |= dict(pixel_values=item.patches, image_grid_thw=torch.tensor([item.grid_thw]))
        counts.append(item.num_patches // 4)
    if video is not None:
        clip = load_video(video)
        frames, fps = clip.data, clip.fps
        item = process_video(frames, proc)
        kw |= dict(pixel_values_videos=item.patches, video_grid_thw=torch.tensor([item.grid_thw]),
                   video_second_per_grid=torch.tensor([proc.temporal_patch_size / fps]))
        counts.append(item.num_patches // 4)
    ids = expand(tok, engine, parts, counts)
    with torch.no_grad():
        g = hf.thinker.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                generation_config=GREEDY, **kw)
    return g[0, len(ids):].tolist()


def omni_cases(files):
    return {
        "t2t": ([{"type": "text", "text": "what is in the image"}], None, None),
        "a2t": ([{"type": "audio"}, {"type": "text", "text": "transcribe this audio please"}], files["long"], None),
        "i2t": ([{"type": "text", "text": "describe"}, {"type": "image"}], None, files["img"]),
        "v2t": ([{"type": "video"}, {"type": "text", "text": "describe the video"}], None, None, files["video"]),
    }


def omni_messages(parts, wav, img, video=None):
    content = []
    for p in parts:
        if p["type"] == "audio":
            content.append({"type": "audio", "path": wav})
        elif p["type"] == "image":
            content.append({"type": "image", "path": img})
        elif p["type"] == "video":
            content.append({"type": "video", "path": video})
        else:
            content.append(p)
    return [{"role": "user", "content": content}]


def test_omni_t2t_a2t_i2t_v2t_alone_and_mixed_equal_hf(omni, files):
    hf, tok, engine = omni
    cases = omni_cases(files)
    want = {k: hf_omni(hf, tok, engine, *c) for k, c in cases.items()}
    for k, c in cases.items():
        assert run(engine, [omni_messages(*c)])[0] == want[k], k
    kinds = ["t2t", "a2t", "i2t", "v2t"] * 2 + ["v2t"]
    got = run(engine, [omni_messages(*cases[k]) for k in kinds], arrivals=[0, 0, 0, 1, 3, 3, 4, 6, 7])
    assert got == [want[k] for k in kinds]
    walks = engine.scheduler.stats.steps
    assert walks["audio_prefill"] and walks["image_prefill"] and walks["video_prefill"] and walks["thinker_decode"]


def test_omni_video_heard_with_its_sound_equals_hf(omni, files):
    """use_audio_in_video: the video's frames and its sound track (decoded by PyAV, averaged to mono,
    resampled by soxr) interleave in the prompt as HF's processor lays them out, and both encoders run in
    one av_prefill step. HF gets the layout from its processor's own function, its extractor's features of
    the same 16 kHz waveform, and our patches (tests/parity/test_vision.py holds them to HF's)."""
    from types import SimpleNamespace

    from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import Qwen3OmniMoeProcessor

    from graphc.runtime.media import video_audio

    hf, tok, engine = omni
    parts = [{"type": "video"}, {"type": "text", "text": "describe the video"}]
    wave = video_audio(files["av"])
    assert abs(wave.size / 16000 - 3.0) < 0.01
    fe = WhisperFeatureExtractor(feature_size=128)(wave, sampling_rate=16000, padding="longest",
                                                   return_attention_mask=True, return_tensors="pt")
    frames_mel = int(fe["attention_mask"].sum())
    n_audio = int(_get_feat_extract_output_lengths(torch.tensor(frames_mel)))
    proc = vision_processing(str(engine.checkpoint))
    clip = load_video(files["av"])
    frames, fps = clip.data, clip.fps
    item = process_video(frames, proc)
    seconds = proc.temporal_patch_size / fps
    fake = SimpleNamespace(audio_bos_token="<|audio_start|>", audio_eos_token="<|audio_end|>", video_token="<|video_pad|>",
                           audio_token="<|audio_pad|>", video_processor=SimpleNamespace(merge_size=2))
    layout = Qwen3OmniMoeProcessor.replace_video_with_audio_token(
        fake, {"video_grid_thw": [torch.tensor(item.grid_thw)], "video_second_per_grid": [seconds]}, 0,
        {"num_audio_tokens": [n_audio]}, 0, position_id_per_seconds=13)
    text = engine.template.render([{"role": "user", "content": parts}]).replace("<|video_pad|>", layout)
    ids = tok.encode(text, add_special_tokens=False).ids
    with torch.no_grad():
        want = hf.thinker.generate(
            input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            generation_config=GREEDY, input_features=fe["input_features"][:, :, :frames_mel],
            feature_attention_mask=torch.ones(1, frames_mel, dtype=torch.long), pixel_values_videos=item.patches,
            video_grid_thw=torch.tensor([item.grid_thw]), video_second_per_grid=torch.tensor([seconds]),
            use_audio_in_video=True)[0, len(ids):].tolist()
    msgs = [{"role": "user", "content": [{"type": "video", "path": files["av"]},
                                         {"type": "text", "text": "describe the video"}]}]
    req = engine.add(messages=msgs, params=greedy(), use_audio_in_video=True)
    assert req.kind == "av2t" and req.prompt.ids == ids
    while engine.has_work():
        engine.step()
    assert req.output == want
    assert engine.scheduler.stats.steps["av_prefill"] >= 1 and engine.scheduler.pool_full()
    others = [omni_messages(*c) for c in omni_cases(files).values()] * 2
    got = run(engine, others[:3] + [{"messages": msgs, "use_audio_in_video": True}] + others[3:],
              arrivals=[0, 0, 1, 1, 2, 2, 4, 5, 5])
    assert got[3] == want                                    # among 8 others of every kind, arriving apart
