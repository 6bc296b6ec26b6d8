"""The host's preprocessing of one request's media, the work Engine.prepare does in a worker thread before a
request reaches the engine: a clip of random frames (resize, patches, normalisation, positions) and an image,
through the model file's host() without a checkpoint (its default pixel bounds). No GPU, no weights. --model: a
model whose host takes a clip without a tokenizer (Qwen3-Omni's; Qwen3.5's writes its frames' times as text).

    python examples/bench/bench_prepare.py [--model models/qwen3_omni.py --preset 30b-a3b] [--seconds 30 --fps 2]
        [--size 360 640] [--image 768 1024] [--repeats 7] [--threads N]

Prints the median wall time of host.prompt() per item over --repeats runs after one warm-up, and the prompt rows.

--concurrent N: also N clips prepared at once in N threads (as `graphc run` prepares requests that arrive
together), first with torch's intra-op threads as they are in every thread, then with one each (whether N teams
of every core contend for the cores): the round's wall time and the clips' median, each the median of --repeats
rounds. --tokenizer DIR: a tokenizer for hosts that write a clip's
frame times as text (Qwen3.5's: `--model models/qwen3_5.py --preset 9b --tokenizer DIR`); --video-pixels MIN
MAX: the processor's pixel bounds over a clip (bench_video.py's).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from graphc.serving import Media  # noqa: E402
from graphc.source import load_model  # noqa: E402


def host_of(file: str, preset: str):
    """The model file's host without a checkpoint (ModelSource keeps the imported file)."""
    src = load_model(file, preset)
    return src.module.host(src.model, None)


def timed(host, ids: list[int], media: Media, repeats: int) -> tuple[float, int]:
    """(median ms of host.prompt, prompt rows), after one warm-up call."""
    rows = len(host.prompt(ids, [media]).ids)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        host.prompt(ids, [media])
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times), rows


def concurrent(host, ids: list[int], clips: list[Media], repeats: int, share: int | None) -> tuple[float, float]:
    """(median round wall ms, median per-clip ms) of len(clips) host.prompt calls at once, each thread with
    `share` intra-op threads (None: as torch has them)."""
    from concurrent.futures import ThreadPoolExecutor

    def one(media: Media) -> float:
        if share is not None:            # torch's first use in a thread takes the process's last setting: first
            torch.get_num_threads()
            torch.set_num_threads(share)
        t0 = time.perf_counter()
        host.prompt(ids, [media])
        return time.perf_counter() - t0

    walls, each = [], []
    with ThreadPoolExecutor(len(clips)) as pool:
        for _ in range(repeats):
            t0 = time.perf_counter()
            each += list(pool.map(one, clips))
            walls.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(walls), 1e3 * statistics.median(each)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="models/qwen3_omni.py")
    ap.add_argument("--preset", default="30b-a3b")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--fps", type=float, default=2.0)
    ap.add_argument("--size", type=int, nargs=2, default=[360, 640], help="the clip's frame height and width")
    ap.add_argument("--image", type=int, nargs=2, default=[768, 1024], help="the image's height and width")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=None, help="torch's intra-op threads (default: its own)")
    ap.add_argument("--concurrent", type=int, default=None, metavar="N", help="N clips prepared at once, too")
    ap.add_argument("--tokenizer", default=None, metavar="DIR", help="a tokenizer folder (Qwen3.5's clips)")
    ap.add_argument("--video-pixels", type=int, nargs=2, default=None, metavar=("MIN", "MAX"))
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    host, rng = configured(a), np.random.default_rng(0)
    frames = round(a.seconds * a.fps)
    clip = torch.from_numpy(rng.integers(0, 256, (frames, 3, *a.size), dtype=np.uint8))
    image = torch.from_numpy(rng.integers(0, 256, (3, *a.image), dtype=np.uint8))
    for kind, media in (("video", Media("video", clip, a.fps)), ("image", Media("image", image))):
        ms, rows = timed(host, [1, 2, 3, host.token_of[kind]], media, a.repeats)
        print(f"{kind}: {ms:.0f} ms, {rows} prompt rows ({torch.get_num_threads()} threads)", flush=True)
    if a.concurrent:
        clips = [Media("video", clip.clone(), a.fps) for _ in range(a.concurrent)]
        for share in (None, 1):
            wall, each = concurrent(host, [1, 2, 3, host.token_of["video"]], clips, a.repeats, share)
            print(f"{a.concurrent} clips at once, {share or torch.get_num_threads()} threads each: round {wall:.0f} "
                  f"ms, a clip {each:.0f} ms (median)", flush=True)


def configured(a):
    """The model's host with --tokenizer and --video-pixels applied."""
    host = host_of(a.model, a.preset)
    if a.tokenizer:
        from graphc.runtime.chat import load_tokenizer
        host.use_tokenizer(load_tokenizer(a.tokenizer))
    if a.video_pixels:
        from models.components.vision_inputs import VisionProcessing
        bounds = dict(zip(("video_min_pixels", "video_max_pixels"), a.video_pixels))
        host.vision = VisionProcessing(**{**host.vision.model_dump(), **bounds})
    return host


if __name__ == "__main__":
    main()
