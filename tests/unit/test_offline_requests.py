"""Offline requests' media (graphc/runtime/engine.py parse_or_refuse: `graphc run --requests`, Engine.generate):
loaded by the same path as a chat message's over HTTP, within the engine's limits and with its host's sampling;
what cannot be loaded refuses that request, with the media item named, and the batch goes on."""
import numpy as np
import pytest

from graphc import SpreadFrames
from graphc.runtime.engine import parse_or_refuse
from graphc.runtime.inputs import Limits
from tests.parity.test_engine import write_video


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    path = tmp_path_factory.mktemp("offline") / "v.mp4"
    write_video(str(path), np.stack([np.full((32, 48, 3), 8 * i, np.uint8) for i in range(30)]), fps=10)
    return path


def item(*media) -> dict:
    return {"id": "r", "prompt": "hi", "max_tokens": 2, "media": list(media)}


def refusal(got) -> str:
    assert not isinstance(got, dict), "loaded where it should be refused"
    assert got.finish_reason == "refused"
    return got.error


def test_a_video_is_sampled_as_the_limits_say(clip):
    """30 frames at 10 fps: 6 at 2 a second, at k / 2 s without a spread; spread: linspace(0, 29, 6) rounded."""
    plain = parse_or_refuse(item({"type": "video", "path": str(clip)}), 0)["media"][0]
    assert plain.data.shape[0] == 6 and plain.times is None and plain.fps == 2.0
    spread = parse_or_refuse(item({"type": "video", "path": str(clip)}), 0, Limits(spread=SpreadFrames()))
    assert spread["media"][0].times == pytest.approx((0.0, 0.6, 1.2, 1.7, 2.3, 2.9))


def test_media_past_the_limits_or_unreadable_refuse_their_request(clip, tmp_path):
    limits = Limits(video_frames=4, why="a prompt of this plan holds at most 64 rows")
    error = refusal(parse_or_refuse(item({"type": "video", "path": str(clip)}), 3, limits))
    assert "request 3: media[0]" in error and "at most 4 are taken" in error and "64 rows" in error
    spread = Limits(video_frames=4, why="a prompt of this plan holds at most 64 rows", spread=SpreadFrames())
    assert "gives 6 frames at 2 fps" in refusal(parse_or_refuse(item({"type": "video", "path": str(clip)}), 0, spread))
    (tmp_path / "junk.mp4").write_bytes(b"not a video")
    error = refusal(parse_or_refuse(item({"type": "image", "path": str(tmp_path / "missing.png")},
                                         {"type": "video", "path": str(tmp_path / "junk.mp4")}), 0))
    assert "media[0]" in error and "cannot be read" in error
    assert "does not decode" in refusal(parse_or_refuse(item({"type": "video", "path": str(tmp_path / "junk.mp4")}), 0))
    assert "media type 'gif'" in refusal(parse_or_refuse(item({"type": "gif", "path": "x.gif"}), 0))
