"""A plan of two replicas served (graphc/runtime/replicas.py, graphc/serve/router.py): the tiny Qwen3.5
checkpoint whose weights HF drew (tests/parity/test_qwen3_5_serve.py's) planned for two cpu devices, where
the compiler puts a replica on each; served over HTTP with nine requests in flight at once, every greedy
answer equals HF's generate, both replicas ran requests, and once idle neither holds a page or a state slot.
Offline, `graphc run --requests` gives the same tokens."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from graphc.cli import main
from graphc.plan import load_plan
from graphc.runtime.replicas import Replicas
from tests.parity.test_qwen3_5_serve import MODEL, REQUESTS, complete, hf_greedy, prompt, text_checkpoint
from tests.unit.loopback import serve


@pytest.fixture(scope="module")
def replicated(tmp_path_factory):
    """(HF's model, the checkpoint, the plan of two replicas)."""
    d = tmp_path_factory.mktemp("replicas")
    hf, ckpt = text_checkpoint(d)
    plan = d / "p.plan"
    assert main(["plan", MODEL, "--preset", "tiny", "--checkpoint", str(ckpt), "--gpu", "cpu", "--gpus", "2",
                 "--memory-cap", "2GiB", "-o", str(plan), "-q"]) == 0
    return hf, ckpt, plan


def test_the_compiler_puts_a_replica_on_each_device(replicated):
    plan = load_plan(replicated[2])
    assert (plan.replicas, len(plan.devices), plan.target.count) == (2, 1, 2)
    assert plan.devices[0].capacity_bytes == 1 << 30            # the 2 GiB host budget split over both


def test_greedy_over_http_equals_hf_generate_on_either_replica(replicated, leak_oracle):
    hf, ckpt, plan = replicated
    engine = Replicas(plan, str(ckpt))
    for e in engine.engines:
        leak_oracle.watch(e)
    server, port = serve(engine)
    try:
        with ThreadPoolExecutor(len(REQUESTS)) as pool:
            got = list(pool.map(lambda a: complete(port, prompt(a[0], a[1][0]), a[1][1]), enumerate(REQUESTS)))
    finally:
        server.should_exit = True
    for i, (n, k) in enumerate(REQUESTS):
        assert got[i] == hf_greedy(hf, prompt(i, n), k), f"request {i} ({n} prompt tokens)"
    ran = [sum(e.stats()["steps"].values()) for e in engine.engines]
    assert all(ran), f"steps per replica: {ran}"
    assert engine.load()["running"] == 0


def test_offline_requests_are_shared_between_the_replicas(replicated, tmp_path):
    hf, ckpt, plan = replicated
    reqs = tmp_path / "r.jsonl"
    reqs.write_text("".join(json.dumps({"id": f"r{i}", "prompt_token_ids": prompt(i, n), "max_tokens": k,
                                        "temperature": 0, "ignore_eos": True}) + "\n"
                            for i, (n, k) in enumerate(REQUESTS[:4])))
    stats = tmp_path / "s.json"
    assert main(["run", str(plan), "--checkpoint", str(ckpt), "--requests", str(reqs), "--output",
                 str(tmp_path / "o.jsonl"), "--stats", str(stats)]) == 0
    out = [json.loads(line) for line in (tmp_path / "o.jsonl").read_text().splitlines()]
    for i, (n, k) in enumerate(REQUESTS[:4]):
        assert out[i]["token_ids"] == hf_greedy(hf, prompt(i, n), k), f"request {i}"
    whole = json.loads(stats.read_text())
    per = whole["replicas"]
    assert [r["steps"].get("llm_prefill", 0) + r["steps"].get("llm_mixed", 0) > 0 for r in per] == [True, True]
    assert "prefix_cache" not in whole          # Qwen3.5's state slots: no replica caches prefixes
