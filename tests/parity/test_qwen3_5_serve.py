"""Qwen3.5 served: a tiny Qwen3.5 checkpoint whose weights HF drew and saved is planned by `graphc plan` (cpu),
served by `graphc run`'s HTTP server, and its greedy tokens equal HF's generate, request by request, with
several requests of different lengths in flight at once (prefill chunks, mixed and batched decode steps,
state slots reused after requests end). Once idle, every page and every state slot is free (the leak oracle).

The checkpoint's text weights are HF Qwen3_5ForCausalLM's, saved under a Qwen3.5 checkpoint's names
(model.language_model.*, as tests/parity/test_qwen3_5_text.py does); the vision tower is not in it yet.
"""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM

from graphc.cli import main
from graphc.runtime.engine import Engine
from tests.conftest import ROOT
from tests.parity.test_qwen3_5_text import draw, hf_config
from tests.unit.loopback import post_json, serve

MODEL = str(ROOT / "models" / "qwen3_5.py")
# (prompt length, tokens to generate): 9 requests on a plan of 8 decode sequences, 128-token prefill steps
REQUESTS = [(5, 12), (140, 6), (33, 9), (1, 7), (70, 10), (12, 5), (200, 4), (9, 11), (51, 8)]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(HF's model, the engine serving the plan of its checkpoint, the server's port)."""
    d = tmp_path_factory.mktemp("qwen3_5")
    cfg = hf_config("untied")
    cfg.vocab_size = 512                  # the tiny preset's shapes are read from the checkpoint's config
    torch.manual_seed(0)
    hf = draw(Qwen3_5ForCausalLM(cfg).eval(), seed=5)
    hf.save_pretrained(d / "hf")
    tensors = load_file(str(d / "hf" / "model.safetensors"))
    ckpt = d / "ckpt"
    ckpt.mkdir()
    save_file({("model.language_model." + k[6:] if k.startswith("model.") else k): v.contiguous()
               for k, v in tensors.items()}, str(ckpt / "model.safetensors"))
    text = json.loads((d / "hf" / "config.json").read_text()) | {"model_type": "qwen3_5_text", "dtype": "float32"}
    (ckpt / "config.json").write_text(json.dumps({"model_type": "qwen3_5", "text_config": text,
                                                  "tie_word_embeddings": False}))
    plan = d / "p.plan"
    assert main(["plan", MODEL, "--preset", "tiny", "--checkpoint", str(ckpt), "--gpu", "cpu", "-o", str(plan),
                 "-q"]) == 0
    engine = Engine(plan, str(ckpt))
    server, port = serve(engine)
    yield hf, engine, port, ckpt
    server.should_exit = True


def prompt(i: int, n: int) -> list[int]:
    return [(13 * i + 7 * j + 3) % 500 for j in range(n)]


def hf_greedy(hf, ids: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                          eos_token_id=None, pad_token_id=0)
    return out[0, len(ids):].tolist()


def complete(port: int, ids: list[int], n: int) -> list[int]:
    status, body, _ = post_json(port, "/v1/completions", {"model": "qwen3_5-tiny-checkpoint", "prompt": ids, "max_tokens": n,
                                                          "temperature": 0, "ignore_eos": True})
    assert status == 200, body
    return body["choices"][0]["token_ids"]


def test_greedy_over_http_equals_hf_generate(served, leak_oracle):
    hf, engine, port, _ = served
    leak_oracle.watch(engine)
    with ThreadPoolExecutor(len(REQUESTS)) as pool:
        got = list(pool.map(lambda a: complete(port, prompt(a[0], a[1][0]), a[1][1]), enumerate(REQUESTS)))
    for i, (n, k) in enumerate(REQUESTS):
        assert got[i] == hf_greedy(hf, prompt(i, n), k), f"request {i} ({n} prompt tokens)"
    steps = engine.stats()["steps"]
    assert steps.get("llm_mixed", 0) > 0 and steps.get("llm_decode", 0) > 0, steps
    assert engine.scheduler.pool_full()


def test_preempted_requests_start_their_state_again(served, tmp_path, leak_oracle):
    """A pool of 18 pages cannot hold the requests' rows at once: decode preempts the youngest, which frees its
    slot and is recomputed from its first row (its state from zeros); the tokens are still HF's."""
    from graphc.runtime.sampler import SamplingParams

    hf, _, _, ckpt = served
    plan = tmp_path / "small.plan"
    assert main(["plan", MODEL, "--preset", "tiny", "--checkpoint", str(ckpt), "--gpu", "cpu", "-o", str(plan), "-q",
                 "--set", "resources.llm_kv.pages=18", "--set", "resources.llm_kv.max_seq_len=256"]) == 0
    engine = leak_oracle.watch(Engine(plan, str(ckpt)))
    long = [(5, 40), (100, 30), (33, 40), (1, 40), (70, 30), (12, 40)]
    reqs = [engine.add(prompt_token_ids=prompt(i, n), params=SamplingParams(temperature=0, max_tokens=k,
                                                                              ignore_eos=True))
            for i, (n, k) in enumerate(long)]
    while engine.has_work():
        engine.step()
    assert engine.stats()["preemptions"] > 0
    for i, (r, (n, k)) in enumerate(zip(reqs, long)):
        assert list(r.output) == hf_greedy(hf, prompt(i, n), k), f"request {i}"
