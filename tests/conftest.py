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


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
