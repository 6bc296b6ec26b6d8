"""Video as users have it (graphc/runtime/media.py): frames sampled at the asked rate, a video's sound track
to 16 kHz mono, and what is refused, on files written here with PyAV."""
import numpy as np
import pytest
import soundfile as sf

from graphc.runtime.media import MediaError, load_video, video_audio
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
    sf.write(d / "a.wav", rng.standard_normal(4000).astype(np.float32) * 0.1, 16000)
    return d


def test_frames_are_sampled_at_the_asked_rate(clips):
    frames, fps = load_video(clips / "silent.mp4", fps=2)      # 9 frames at 4 fps: t = 0, 0.5, 1.0, 1.5, 2.0
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
