"""Video as users have it (graphc/runtime/media.py): frames sampled at the asked rate or spread over the clip
(graphc.SpreadFrames, against HF's Qwen3-VL sampler), a video's sound track to 16 kHz mono, and what is refused,
on files written here with PyAV."""
import numpy as np
import pytest
import soundfile as sf
from hypothesis import given, settings
from hypothesis import strategies as st

from graphc import InvalidInput, SpreadFrames
from graphc.runtime.media import VIDEO_FPS, MediaError, load_video, video_audio
from tests.parity.test_engine import write_video


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    d = tmp_path_factory.mktemp("clips")
    rng = np.random.default_rng(0)
    frames = np.stack([np.full((32, 48, 3), 20 * i, dtype=np.uint8) for i in range(9)])   # frame i is grey 20 i
    write_video(str(d / "silent.mp4"), frames, fps=4)
    t = np.arange(2 * 44100) / 44100
    sound = np.stack([0.5 * np.sin(2 * np.pi * 440 * t), -0.5 * np.sin(2 * np.pi * 440 * t) + 0.2]).astype(np.float32)
    write_video(str(d / "sound.mkv"), frames, fps=4, sound=sound)
    greys = np.stack([np.full((32, 48, 3), 8 * i, dtype=np.uint8) for i in range(30)])    # frame i is grey 8 i
    write_video(str(d / "greys.mp4"), greys, fps=10)       # its header counts its 30 frames
    write_video(str(d / "greys.mkv"), greys, fps=10)       # its header does not: the packets are counted
    sf.write(d / "a.wav", rng.standard_normal(4000).astype(np.float32) * 0.1, 16000)
    return d


def test_frames_are_sampled_at_the_asked_rate(clips):
    clip = load_video(clips / "silent.mp4", fps=2)      # 9 frames at 4 fps: t = 0, 0.5, 1.0, 1.5, 2.0
    frames, fps = clip.data, clip.fps
    assert fps == 2 and frames.shape == (6, 3, 32, 48)         # 5 taken, the last repeated to an even count
    means = frames.float().mean(dim=(1, 2, 3)).tolist()
    assert [round(m / 20) for m in means] == [0, 2, 4, 6, 8, 8]   # lossy codec: greys within a few levels


def test_a_videos_sound_is_averaged_and_resampled(clips):
    wave = video_audio(clips / "sound.mkv")
    assert wave.dtype == np.float32 and abs(wave.size - 32000) <= 16
    assert abs(float(wave[1000:-1000].mean()) - 0.1) < 0.01      # the channels' mean: 0.2 / 2, the sines cancel
    assert float(np.abs(wave[1000:-1000] - 0.1).max()) < 0.01


def test_what_is_not_a_usable_video_is_refused(clips):
    with pytest.raises(MediaError, match="does not decode"):
        load_video(b"not a video at all")
    with pytest.raises(MediaError, match="no video stream"):
        load_video(clips / "a.wav")
    with pytest.raises(MediaError, match="no audio stream"):
        video_audio(clips / "silent.mp4")
    with pytest.raises(MediaError, match="fps 0.0 is out of range"):
        load_video(clips / "silent.mp4", fps=0)


@settings(max_examples=300, deadline=None)
@given(total=st.integers(1, 4000), rate=st.sampled_from([1.0, 12.5, 23.976, 25.0, 29.97, 30.0, 60.0]),
       fps=st.sampled_from([0.5, 1.0, 2.0, 3.0, 4.0]), lo=st.integers(1, 8), extra=st.integers(0, 900))
def test_spread_indices_are_hf_qwen3_vl_sample_frames(total, rate, fps, lo, extra):
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor
    from transformers.video_utils import VideoMetadata

    hf = Qwen3VLVideoProcessor(min_frames=lo, max_frames=lo + extra)
    want = hf.sample_frames(VideoMetadata(total_num_frames=total, fps=rate), fps=fps).tolist()
    assert SpreadFrames(lo, lo + extra).indices(total, rate, fps) == want


@pytest.mark.parametrize("name", ["greys.mp4", "greys.mkv"])
def test_spread_frames_are_the_clips_frames_at_their_indices(clips, name):
    """30 frames at 10 fps asked 2 a second: int(3 s x 2) = 6 frames at linspace(0, 29, 6) = 0, 5.8, 11.6, 17.4,
    23.2, 29 rounded: 0 6 12 17 23 29, each at its index / 10 s; the same whether the header counts the frames."""
    clip = load_video(clips / name, fps=2, spread=SpreadFrames(4, 768))
    assert clip.data.shape == (6, 3, 32, 48) and clip.fps == 2
    assert clip.times == pytest.approx((0.0, 0.6, 1.2, 1.7, 2.3, 2.9))
    means = clip.data.float().mean(dim=(1, 2, 3)).tolist()
    assert [round(m / 8) for m in means] == [0, 6, 12, 17, 23, 29]      # lossy codec: greys within a few levels


def test_spread_frames_are_padded_to_an_even_count_and_bounded(clips):
    """9 frames at 4 fps asked 2 a second: int(2.25 x 2) = 4, raised to min_frames 5: 0 2 4 6 8, the last repeated
    (index and time too); with max_frames 4 the clip is refused before decoding, with the numbers."""
    clip = load_video(clips / "silent.mp4", fps=2, spread=SpreadFrames(5, 768))
    assert [round(m / 20) for m in clip.data.float().mean(dim=(1, 2, 3)).tolist()] == [0, 2, 4, 6, 8, 8]
    assert clip.times == (0.0, 0.5, 1.0, 1.5, 2.0, 2.0)
    with pytest.raises(MediaError, match="gives 5 frames at 2 fps, at most 4 are taken of a 48 x 32 video"):
        load_video(clips / "silent.mp4", fps=2, max_frames=4, spread=SpreadFrames(5, 768))
    with pytest.raises(InvalidInput, match="min_frames at most max_frames"):
        SpreadFrames(8, 4)


def test_a_spread_with_its_own_rate_samples_at_it_when_asked_none(clips):
    """30 frames at 10 fps, the spread's 1 a second: int(3 s x 1) = 3, raised to min_frames 4: linspace(0, 29, 4)
    = 0, 9.67, 19.33, 29 rounded: 0 10 19 29; a request's own fps (2) comes first."""
    clip = load_video(clips / "greys.mp4", spread=SpreadFrames(4, 768, fps=1.0))
    assert [round(m / 8) for m in clip.data.float().mean(dim=(1, 2, 3)).tolist()] == [0, 10, 19, 29]
    assert clip.fps == 1.0
    assert load_video(clips / "greys.mp4", fps=2, spread=SpreadFrames(4, 768, fps=1.0)).data.shape[0] == 6
    with pytest.raises(InvalidInput, match="fps 0"):
        SpreadFrames(fps=0)


def test_the_checkpoints_sampling_is_what_hf_reads_from_it(tmp_path):
    """vl_host.spread_frames reads video_preprocessor_config.json's min_frames, max_frames and fps as HF's
    Qwen3VLVideoProcessor.from_pretrained does; absent keys are the class defaults (fps None: the loader's 2)."""
    import json

    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    from models.components.vl_host import spread_frames

    for i, keys in enumerate([{"min_frames": 2, "max_frames": 10, "fps": 1}, {"fps": 4}, {}]):
        d = tmp_path / str(i)
        d.mkdir()
        (d / "video_preprocessor_config.json").write_text(json.dumps(keys))
        hf = Qwen3VLVideoProcessor.from_pretrained(str(d))
        got = spread_frames(str(d))
        assert (got.min_frames, got.max_frames, got.fps or VIDEO_FPS) == (hf.min_frames, hf.max_frames, hf.fps), keys
