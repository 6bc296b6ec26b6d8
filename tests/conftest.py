"""Shared fixtures: the tiny model loaded once, and a helper to compile it."""
from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "models" / "tiny_omni.py")


def rel(a, b) -> float:
    """Relative error of a against the reference b, in float64: |a - b| / |b|."""
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.fixture(scope="session")
def tiny():
    from graphc.source import load_model

    return load_model(TINY)


@pytest.fixture(scope="session")
def tiny_small():
    from graphc.source import load_model

    return load_model(TINY, "small")


@pytest.fixture(scope="session")
def tiny_omni_dir(tmp_path_factory):
    """A tiny Qwen3-Omni checkpoint (ckpt/) and its CPU plan (p.plan), made once for the served tests; each
    test module boots its own Engine of it. Read-only: write elsewhere."""
    from tests.unit.loopback import tiny_omni

    return tiny_omni(tmp_path_factory.mktemp("tiny_omni"))


def pytest_configure(config):
    """The compiler's disk memo (graphc/memo.py) in a directory of this session's own: no test reads
    an entry another run wrote, and the user's cache is left alone."""
    import os
    import tempfile

    if "GRAPHC_CACHE_DIR" not in os.environ:
        config._graphc_cache = os.environ["GRAPHC_CACHE_DIR"] = tempfile.mkdtemp(prefix="graphc-cache-")


def pytest_unconfigure(config):
    import shutil

    where = getattr(config, "_graphc_cache", None)
    if where:
        shutil.rmtree(where, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def leak_oracle():
    """Watch engines whose test aborts, disconnects, fails or times out requests: when the test ends, each
    must hold no page and no request state once idle (issue 15's leak oracle; tests/leak.py)."""
    from tests.leak import released

    class Oracle:
        def __init__(self):
            self.engines = []

        def watch(self, engine):
            self.engines.append(engine)
            return engine

    oracle = Oracle()
    yield oracle
    for engine in oracle.engines:
        left = released(engine)
        assert not left, "the engine still holds, once idle: " + "; ".join(left)
