"""The longest audio and video a plan's prompt can hold (AudioVisualHost.media_limits), which the server
refuses from the header before decoding: checked against brute force over the real Qwen3-Omni
encoders' row counts. Sound: anything longer takes more rows than the prompt holds. Tight for audio: one
chunk shorter fits."""
import math

import pytest

from models import qwen3_omni
from models.components.audio_inputs import HOP_LENGTH, SAMPLE_RATE, num_tokens
from models.components.vision_inputs import smart_resize


@pytest.fixture(scope="module")
def host():
    return qwen3_omni.host(qwen3_omni.declare("30b-a3b"), None)


@pytest.mark.parametrize("max_rows", [1, 12, 13, 14, 1024, 32768])
def test_audio_longer_than_the_limit_takes_more_rows(host, max_rows):
    seconds, _ = host.media_limits(max_rows)
    frames = round(seconds * SAMPLE_RATE / HOP_LENGTH)
    assert num_tokens(frames + 1, host.aut) > max_rows          # 10 ms longer: over
    chunk = host.aut.chunk_frames
    assert num_tokens(frames - chunk, host.aut) <= max_rows      # a chunk shorter: fits
    # brute force: the shortest audio whose rows exceed max_rows is within one chunk of the limit
    shortest = next(f for f in range(0, frames + 2) if num_tokens(f, host.aut) > max_rows)
    assert frames - chunk < shortest <= frames + 1


@pytest.mark.parametrize("max_rows", [64, 1024, 32768])
def test_video_of_more_frames_than_the_limit_takes_more_rows(host, max_rows):
    _, frames = host.media_limits(max_rows)
    v = host.vision
    # the fewest rows a temporal patch can take, over frame sizes from 1 x 1 to 4096 x 4096 (aspect < 200)
    sides = sorted({1, 2, 3, 7, 16, 31, 32, 33, 63, 64, 100, 127, 200, 333, 480, 640, 1080, 1920, 4096})
    least = min(h * w // v.factor ** 2 for a in sides for b in sides if max(a, b) / min(a, b) < 200
                for h, w in [smart_resize(a, b, v.factor, v.video_min_pixels, v.video_max_pixels)])
    grids = math.ceil((frames + 1) / v.temporal_patch_size)
    assert grids * least > max_rows                             # one frame more than the limit: over
