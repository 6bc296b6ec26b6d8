"""emit_plan's `resources` and `versions`, each computed by hand from the declaration.

The tiny model (models/tiny_omni.py) on an h100 (sm_90): its ragged encoder attention runs on fa3
(first on sm_90, head dim 64 native); its paged decoder_kv prefills on fa3 and decodes on fa2 (first
in sm_90's decode list). fa3 keeps no split-KV partials, so a resource whose every backend is fa3
gets the 1 MiB floor that FlashInfer's wrappers take as their float workspace.
"""
from __future__ import annotations

import importlib.metadata
import sys

import pytest
from packaging.version import Version

import graphc as gc
from graphc.pipeline import compile_model
from graphc.source import ModelSource
from graphc.units import MiB
from resources import WorkspaceSpec


def kv_page_bytes(layers: int, kv_heads: int, head_dim: int, page_size: int = 16) -> int:
    return 2 * layers * page_size * kv_heads * head_dim * 2          # K and V, bf16


# ------------------------------------------------------------------ one device

@pytest.fixture(scope="module")
def fa3_everywhere(tiny):
    """fa3 everywhere (the encoder's 16-row windows would take triton): no resource keeps a float workspace
    need, so every one is the 1 MiB floor."""
    fa3 = {"encoder_attn": {"backend": "fa3"}, "decoder_kv": {"decode_backend": "fa3"}}
    return compile_model(tiny, "h100", 1, {"resources": fa3}).plan


def test_ragged_resource(fa3_everywhere):
    r = fa3_everywhere.resources["encoder_attn"]
    assert (r.kind, r.backend, r.devices) == ("ragged_attention", "fa3", [0])
    assert r.bytes == 1 * MiB, "no KV pages; its own float workspace at the 1 MiB floor on one device"
    assert r.decode_backend is None, "only a paged KV resource has a decode backend"
    assert r.run_head_dim is None, "head dim 64 runs as it is on fa3"
    assert (r.pages, r.page_bytes, r.workspace) == (None, None, None)
    assert r.why.startswith("requested 'fa3'; sm_90 ragged_attention has triton, fa3, fa2, cudnn; ")
    assert "; float workspace need: " in r.why


def test_paged_resource(fa3_everywhere):
    r = fa3_everywhere.resources["decoder_kv"]
    page = kv_page_bytes(layers=2, kv_heads=2, head_dim=64)                     # 16 KiB
    assert (r.kind, r.backend, r.decode_backend, r.devices) == ("paged_kv", "fa3", "fa3", [0])
    assert (r.pages, r.page_bytes, r.max_seq_len, r.min_pages) == ({0: 256}, page, 1024, 1024 // 16)
    assert r.bytes == 256 * page + 1 * MiB == 5 * MiB, "the fixed 256 pages + its 1 MiB float workspace"
    assert r.run_head_dim is None
    assert "decode: requested 'fa3'" in r.why and "; float workspace need: " in r.why


def test_the_plans_pages_and_bytes_agree_with_its_ledger(fa3_everywhere):
    (dev,) = fa3_everywhere.devices
    r = fa3_everywhere.resources["decoder_kv"]
    assert r.pages == {0: dev.kv_pages["decoder_kv"]}
    assert r.bytes == dev.ledger["kv.decoder_kv"] + dev.ledger["workspace.decoder_kv"]
    assert fa3_everywhere.resources["encoder_attn"].bytes == dev.ledger["workspace.encoder_attn"]


def test_versions(fa3_everywhere):
    torch_release = Version(importlib.metadata.version("torch")).public        # '2.13.0' of '2.13.0+cpu'
    assert fa3_everywhere.versions == {"graphc": importlib.metadata.version("graphc"), "torch": torch_release,
                                       "python": "{}.{}".format(*sys.version_info[:2])}
    assert "+" not in fa3_everywhere.versions["torch"]


# ------------------------------------------------------------------ a workspace shared by two devices

def shared_workspace_model(small):
    """tiny 'small' with one declared workspace, 64 MiB x 2 slots, for both attention resources."""
    m = small.model
    ws = WorkspaceSpec(name="ws", bytes=64 * MiB, slots=2)
    enc = m.resource("encoder_attn").model_copy(update={"workspace": "ws"})
    kv = m.resource("decoder_kv").model_copy(update={"workspace": "ws", "pages": 512})
    return ModelSource(small.file, "small", gc.Model.model_validate({**m.__dict__, "resources": (ws, enc, kv)}))


@pytest.fixture(scope="module")
def two_devices(tiny_small):
    pins = {"nodes": {"encoder": {"device": 1}, "decoder": {"device": 0}}}
    return compile_model(shared_workspace_model(tiny_small), "h100", 2, pins).plan


def test_shared_workspace_is_held_on_each_device_of_its_users(two_devices):
    ws = two_devices.resources["ws"]
    assert ws.devices == [0, 1], "the devices of the nodes whose resources name it (decoder on 0, encoder on 1)"
    assert ws.bytes == 2 * (2 * 64 * MiB), "both slots of 64 MiB on each of the two devices"
    assert (ws.kind, ws.backend, ws.decode_backend, ws.run_head_dim, ws.pages) == ("workspace", None, None, None, None)
    assert ws.why.startswith("float workspace need: "), "no backend of its own: the need is its whole why"
    assert [d.ledger["workspace.ws"] for d in two_devices.devices] == [2 * 64 * MiB] * 2


def test_resources_that_share_a_declared_workspace_hold_none_of_their_own(two_devices):
    enc, kv = two_devices.resources["encoder_attn"], two_devices.resources["decoder_kv"]
    assert (enc.devices, enc.bytes, enc.workspace) == ([1], 0, "ws")
    page = kv_page_bytes(layers=4, kv_heads=2, head_dim=64)                     # 32 KiB
    assert (kv.devices, kv.pages, kv.workspace) == ([0], {0: 512}, "ws")
    assert kv.bytes == 512 * page == 16 * MiB, "its pages only; the workspace is counted under ws"
    assert "float workspace need" not in enc.why + kv.why


# ------------------------------------------------------------------ a head dim the kernels pad

@pytest.fixture(scope="module")
def padded(tiny):
    """The tiny model with an encoder of 144 wide on 2 heads: head dim 72, which fa3 (asked for: auto would take
    triton, which runs any head dim up to 256) runs at 128."""
    m = tiny.model
    enc = next(n for n in m.nodes if n.name == "encoder")
    enc = enc.model_copy(update={"config": enc.config.model_copy(update={"hidden_size": 144, "ffn_dim": 576})})
    attn = m.resource("encoder_attn").model_copy(update={"head_dim": 72, "backend": "fa3"})
    nodes = tuple(enc if n.name == "encoder" else n for n in m.nodes)
    resources = tuple(attn if r.name == "encoder_attn" else r for r in m.resources)
    model = gc.Model.model_validate({**m.__dict__, "nodes": nodes, "resources": resources})
    return compile_model(ModelSource(tiny.file, "tiny", model), "h100").plan


def test_run_head_dim_only_when_padded(padded):
    enc, kv = padded.resources["encoder_attn"], padded.resources["decoder_kv"]
    assert (enc.backend, enc.run_head_dim, enc.decode_backend) == ("fa3", 128, None)
    assert "fa3 takes no head_dim 72: runs zero-padded to 128" in enc.why
    assert (kv.backend, kv.decode_backend, kv.run_head_dim) == ("fa3", "triton", None), "64 runs as it is"
