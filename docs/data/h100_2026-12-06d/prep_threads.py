"""16 clips of 360 x 640 uint8 frames at 2 fps through process_clip (Qwen3.5's default video bounds): one alone,
16 at once on 16 threads, 16 at once on 16 spawned processes of one intra-op thread (each clip made in its process). Run under malloc
settings to see whether the threads' page faults (fresh mmaps of large temporaries) serialise them."""
import os, sys, time
from concurrent.futures import ThreadPoolExecutor, ProcessPoolExecutor
import multiprocessing as mp
import numpy as np, torch
sys.path.insert(0, os.getcwd())
from models.components.vision_inputs import process_clip, VisionProcessing
cfg = VisionProcessing()
N = int(os.environ.get("CLIPS", 16))


def clip(i, sec):
    return torch.from_numpy(np.random.default_rng(i).integers(0, 256, (2 * sec, 3, 360, 640), dtype=np.uint8))


def timed(i, sec, c=None):
    c = clip(i, sec) if c is None else c
    t = time.perf_counter(); process_clip(c, cfg); return time.perf_counter() - t


if __name__ == "__main__":
    tag = " ".join(f"{k}={v}" for k, v in os.environ.items() if k.startswith("MALLOC_")) or "glibc defaults"
    for sec in (60, 8):
        clips = [clip(i, sec) for i in range(N)]
        one = min(timed(0, sec, clips[0]) for _ in range(3))
        with ThreadPoolExecutor(N) as ex:
            list(ex.map(lambda c: timed(0, sec, c), clips))
            t = time.perf_counter(); th = list(ex.map(lambda c: timed(0, sec, c), clips)); thr = time.perf_counter() - t
        with ProcessPoolExecutor(N, mp_context=mp.get_context("spawn"), initializer=torch.set_num_threads, initargs=(1,)) as ex:
            list(ex.map(timed, range(N), [sec] * N))
            pr = list(ex.map(timed, range(N), [sec] * N))
        print(f"[{tag}] {sec} s clip: one {1e3 * one:.0f} ms; {N} threads: round {1e3 * thr:.0f} ms, a clip "
              f"{1e3 * float(np.median(th)):.0f} ms; {N} processes: a clip {1e3 * float(np.median(pr)):.0f} ms", flush=True)
