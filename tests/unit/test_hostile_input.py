"""Bad input at the HTTP boundary (issue 15): each case issue 15 names, sent as raw HTTP to a tiny
Qwen3-Omni served on loopback, gets OpenAI's error body with the right status and a message that says
what and why, never a traceback, and runs no engine step. Also where media may come from: no file on the
server's disk unless --media-dir, and only under it; no URL unless --media-urls."""
import base64
import io
import json
import struct
import time
import zlib

import numpy as np
import pytest
import soundfile as sf

from graphc.runtime.engine import Engine
from graphc.runtime.inputs import Sources
from tests.parity.test_engine import write_video
from tests.unit.loopback import answer_to_header, post_json as post, serve

UPLOAD = 200_000                # the server's max_audio_bytes: its JSON bodies may be 200000 * 4/3 + 1 MiB


@pytest.fixture(scope="module")
def served(tiny_omni_dir, tmp_path_factory):
    d, here = tiny_omni_dir, tmp_path_factory.mktemp("hostile")
    engine = Engine(d / "p.plan", checkpoint=d / "ckpt")
    media = here / "media"
    media.mkdir()
    (here / "secret.png").write_bytes(png(8, 8))
    (media / "ok.png").write_bytes(png(8, 8))
    server, port = serve(engine, max_audio_bytes=UPLOAD)
    dir_server, dir_port = serve(engine_of(d), max_audio_bytes=UPLOAD, sources=Sources(paths=media))
    yield dict(engine=engine, port=port, dir=here, media=media, dir_port=dir_port)
    server.should_exit = dir_server.should_exit = True


def engine_of(d):
    return Engine(d / "p.plan", checkpoint=d / "ckpt")


def png(w: int, h: int) -> bytes:
    """A real PNG of w x h grey pixels when small; for huge sizes only its header is honest (Pillow reads the
    size from IHDR and decodes nothing until asked)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    rows = b"".join(b"\x00" + b"\x80" * (3 * w) for _ in range(h)) if w * h <= 1 << 16 else b"\x00"
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def wav(samples: np.ndarray, rate: int = 16000, fmt: str = "WAV") -> bytes:
    buf = io.BytesIO()
    sf.write(buf, samples, rate, format=fmt, subtype="PCM_16")
    return buf.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def chat(*parts, **fields) -> dict:
    return {"messages": [{"role": "user", "content": list(parts) + [{"type": "text", "text": "what is it?"}]}],
            "max_tokens": 2, **fields}


def audio_part(data: bytes) -> dict:
    return {"type": "input_audio", "input_audio": {"data": b64(data), "format": "wav"}}


def image_url(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def long_video(path) -> str:
    """400 s at 2 frames a second, 16 x 16: 800 frames, over the 768 graphc takes of a video (the tiny plan's
    prompts would hold more: its vision bound is loose, tests/unit/test_media_limits.py)."""
    write_video(str(path), np.zeros((800, 16, 16, 3), np.uint8), fps=2)
    return "data:video/mp4;base64," + b64(path.read_bytes())


ROUTE = "/v1/chat/completions"
SILENCE_2H = wav(np.zeros(2 * 3600 * 8000, np.int16), 8000, "FLAC")       # 180 kB of FLAC, 2 hours long
CASES = {
    # name: (route, body, status, words the message must hold)
    "malformed JSON": (ROUTE, b'{"messages": [', 400, "not valid JSON"),
    "not JSON at all": (ROUTE, b"\xff\xfe\x00garbage", 400, "not valid JSON"),
    "a JSON array": (ROUTE, b"[1, 2]", 400, "body"),
    "unknown field": (ROUTE, chat(bogus=1), 400, "bogus"),
    "wrong type: max_tokens": (ROUTE, chat(max_tokens="many"), 400, "max_tokens"),
    "wrong type: messages": (ROUTE, {"messages": "hello"}, 400, "messages"),
    "wrong type: role": (ROUTE, {"messages": [{"role": 5, "content": "x"}]}, 400, "role must be a string"),
    "unknown role": (ROUTE, {"messages": [{"role": "wizard", "content": "x"}]}, 400, "'wizard' is not a chat role"),
    "wrong type: text part": (ROUTE, {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, 400,
                              "text must be a string"),
    "wrong type: image_url": (ROUTE, chat({"type": "image_url", "image_url": "x.png"}), 400, "must be an object"),
    "wrong type: fps": (ROUTE, chat({**image_url("data:video/mp4;base64,AAAA"), "type": "video_url",
                                     "video_url": {"url": "data:video/mp4;base64,AAAA"}, "fps": "fast"}), 400,
                        "fps must be a number"),
    "malformed base64": (ROUTE, chat({"type": "input_audio", "input_audio": {"data": "@@not base64@@"}}), 400,
                         "not valid base64"),
    "input_audio without data": (ROUTE, chat({"type": "input_audio", "input_audio": {"format": "wav"}}), 400,
                                 "needs data"),
    "data URL of the wrong media type": (ROUTE, chat(image_url("data:audio/wav;base64," + b64(wav(np.zeros(800))))),
                                         400, "data URL of 'audio/wav;base64'"),
    "audio that does not decode": (ROUTE, chat(audio_part(b"RIFF....WAVEjunkjunkjunk")), 400, "does not decode"),
    "0-sample audio": (ROUTE, chat(audio_part(wav(np.zeros(0, np.int16))), max_tokens=2), 400, "no samples"),
    "2-hour audio": (ROUTE, chat(audio_part(SILENCE_2H)), 400, "is 7200.0 s long, at most"),
    "image that does not decode": (ROUTE, chat(image_url("data:image/png;base64," + b64(b"\x89PNG junk"))), 400,
                                   "does not decode"),
    "image of 20000 x 20000": (ROUTE, chat(image_url("data:image/png;base64," + b64(png(20000, 20000)))), 400,
                               "too large to open"),
    "image of 9000 x 9000": (ROUTE, chat(image_url("data:image/png;base64," + b64(png(9000, 9000)))), 400,
                             "9000 x 9000 = 81,000,000 pixels, at most 67,108,864"),
    "image 300 times wider than high": (ROUTE, chat(image_url("data:image/png;base64," + b64(png(600, 2)))), 400,
                                        "aspect ratio"),
    "prompt longer than the plan allows": ("/v1/completions", {"prompt": [5] * 1000, "max_tokens": 100}, 400,
                                           "asks for 1100 tokens (1000 prompt + 100 to generate); the plan allows "
                                           "1024"),
    "max_tokens 0": (ROUTE, chat(max_tokens=0), 400, "max_tokens"),
    "max_tokens 10^9": (ROUTE, chat(max_tokens=10**9), 400, "to generate); the plan allows 1024"),
    "n 17": (ROUTE, chat(n=17), 400, "n=17: at most 16"),
    "a file path": (ROUTE, chat(image_url("/etc/hostname")), 400, "names a file on the server"),
    "a file URL": (ROUTE, chat(image_url("file:///etc/hostname")), 400, "names a file on the server"),
    "an offline path part": (ROUTE, chat({"type": "image", "path": "/etc/hostname"}), 400, "names a file on the server"),
    "a web address": (ROUTE, chat(image_url("http://169.254.169.254/latest/meta-data")), 400, "fetches no URLs"),
    "another scheme": (ROUTE, chat(image_url("ftp://example.com/a.png")), 400, "has the scheme 'ftp'"),
    "speech of empty input": ("/v1/audio/speech", {"input": "", "voice": "ethan"}, 400, "input"),
}


def steps(engine) -> int:
    return sum(engine.stats()["steps"].values())


@pytest.mark.parametrize("name", CASES)
def test_refused_with_openai_body_and_no_engine_step(served, name):
    route, body, status, words = CASES[name]
    before = steps(served["engine"])
    got, out, _ = post(served["port"], route, body)
    assert got == status, out
    err = out["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    assert words in err["message"], err["message"]
    assert "Traceback" not in err["message"] and "File \"" not in err["message"]
    assert steps(served["engine"]) == before, "a refused request ran an engine step"


def test_a_body_over_the_limit_is_413(served):
    """A chat body of more than 1 MiB past the media limit: 413 from its Content-Length, before a byte of it is
    read (sending it too races the server's close: the full suite once saw a broken pipe instead of the answer)."""
    length = len(json.dumps(chat(audio_part(b"\0" * (UPLOAD + (1 << 20))))).encode())
    got, out = answer_to_header(served["port"], ROUTE, length)
    assert got == 413 and out["error"]["code"] == "request_too_large" and "bytes; this server takes at most" in \
        out["error"]["message"]


def test_a_video_of_more_frames_than_taken_is_refused_from_its_header(served, tmp_path):
    got, out, _ = post(served["port"], ROUTE, chat({"type": "video_url", "video_url": {"url": long_video(tmp_path / "v.mp4")}}))
    # the header's words ("is 400.0 s long"), not the decoding loop's ("gives more than"): nothing was decoded
    assert got == 400 and "the video is 400.0 s long: 800 frames at 2 fps, at most 768 are taken of a 16 x 16 video " \
        "(the most frames graphc takes of a video)" in out["error"]["message"], out


def test_a_two_hour_transcription_is_refused_from_its_header(served):
    import uuid

    boundary = uuid.uuid4().hex
    form = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.flac\"\r\n"
            "Content-Type: audio/flac\r\n\r\n").encode() + SILENCE_2H + f"\r\n--{boundary}--\r\n".encode()
    t = time.perf_counter()
    got, out, _ = post(served["port"], "/v1/audio/transcriptions", form,
                       headers={"content-type": f"multipart/form-data; boundary={boundary}"})
    assert got == 400 and "is 7200.0 s long, at most" in out["error"]["message"]
    assert time.perf_counter() - t < 2.0          # decoding and resampling two hours takes longer than this


def test_media_dir_serves_files_under_it_only(served):
    port, media = served["dir_port"], served["media"]
    ok, out, _ = post(port, ROUTE, chat(image_url(str(media / "ok.png"))))
    assert ok == 200, out
    ok, out, _ = post(port, ROUTE, chat({"type": "image", "path": "ok.png"}))       # relative to the folder
    assert ok == 200, out
    for escape in ["../secret.png", str(served["dir"] / "secret.png"), "file://" + str(served["dir"] / "secret.png"),
                   "/etc/hostname"]:
        got, out, _ = post(port, ROUTE, chat(image_url(escape)))
        assert got == 400 and "outside the media folder" in out["error"]["message"], (escape, out)
    link = media / "link.png"
    link.symlink_to(served["dir"] / "secret.png")
    got, out, _ = post(port, ROUTE, chat(image_url("link.png")))
    assert got == 400 and "outside the media folder" in out["error"]["message"]
