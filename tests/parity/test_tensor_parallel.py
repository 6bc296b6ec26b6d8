"""A plan of two tensor-parallel ranks (graphc/runtime/tensor_parallel.py): the tiny Qwen3.5 checkpoint whose
weights HF drew (tests/parity/test_qwen3_5_serve.py's) planned with --tp 2 for two cpu devices and served by two
processes, rank 1 mirroring every step and both summing their partial outputs through gloo. Greedy answers over
HTTP, nine requests in flight at once, equal HF's generate; offline `graphc run` too; `graphc check` boots both
ranks within their ledger; a killed rank stops the engine naming it. The plan's per-rank numbers are worked from
HF's tensor names and the config, not from the compiler."""
from __future__ import annotations

import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from graphc.cli import main
from graphc.errors import InvalidInput
from graphc.plan import load_plan
from graphc.runtime.engine import Engine
from graphc.runtime.request import SamplingParams
from graphc.runtime.workers import WorkerDied
from tests.conftest import TINY
from tests.parity.test_qwen3_5_serve import (MODEL, REQUESTS, complete, hf_greedy, image_prompts_equal_hf, prompt,
                                             text_checkpoint, vl_checkpoint)
from tests.leak import released
from tests.unit.loopback import serve

# HF's names of the tensors a rank holds a half of (the heads and the MLP); the rest every rank holds whole
SPLIT = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "in_proj_qkv", "in_proj_z",
         "in_proj_b", "in_proj_a", "conv1d", "A_log", "dt_bias", "out_proj")


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    """(HF's model, the checkpoint, the plan of two ranks, the one-device plan)."""
    d = tmp_path_factory.mktemp("tp")
    hf, ckpt = text_checkpoint(d, num_key_value_heads=2)       # 2 KV heads: one a rank
    plans = {}
    for name, extra in (("tp", ["--gpus", "2", "--tp", "2"]), ("one", [])):
        plans[name] = d / f"{name}.plan"
        assert main(["plan", MODEL, "--preset", "tiny", "--checkpoint", str(ckpt), "--gpu", "cpu", "--memory-cap",
                     "2GiB", "-o", str(plans[name]), "-q", *extra]) == 0
    return hf, ckpt, plans["tp"], plans["one"]


def test_each_rank_holds_half_the_heads_and_mlp(split):
    hf, _, tp_plan, one_plan = split
    tp, one = load_plan(tp_plan), load_plan(one_plan)
    assert (tp.tensor_parallel, tp.replicas, len(tp.devices), tp.target.count) == (2, 1, 1, 2)
    assert tp.devices[0].capacity_bytes == 1 << 30                       # the 2 GiB host budget over both ranks
    want = sum(t.numel() * t.element_size() // (2 if any(f".{s}." in n + "." for s in SPLIT) else 1)
               for n, t in hf.state_dict().items())
    assert tp.nodes["llm"].weights_bytes == want
    cfg = hf.config
    full_layers = sum(t == "full_attention" for t in cfg.layer_types)
    # one page: 16 rows of K and V of each full layer, each rank its half of the KV heads (fp32)
    assert tp.resources["llm_kv"].page_bytes == 2 * full_layers * 16 * cfg.num_key_value_heads // 2 \
        * cfg.head_dim * 4 == one.resources["llm_kv"].page_bytes // 2
    assert tp.resources["llm_state"].slot_bytes == one.resources["llm_state"].slot_bytes // 2
    assert "one copy split over 2 tensor-parallel ranks (--tp 2)" in tp.placement


def test_explain_says_what_each_rank_holds(split, capsys):
    assert main(["explain", str(split[2])]) == 0
    out = capsys.readouterr().out
    assert "tensor-parallel ranks: 2, each a process on a device of its own holding the ledger below" in out
    assert "on 2 x cpu" in out


def test_the_compiler_weighs_ranks_against_replicas(split):
    """Without --tp the choice is recorded with the ranks' score. The tiny preset's KV pool is 256 pages of 16
    rows, and its longest request 1,024 rows (64 pages): each copy holds 4 of them, whatever its heads; two
    replicas hold 8."""
    _, ckpt, _, _ = split
    from graphc.pipeline import compile_model
    from graphc.source import load_model, read_config

    src = load_model(MODEL, "tiny", read_config(ckpt))
    plan = compile_model(src, "cpu", 2, memory_cap=2 << 30, remedies=False).plan
    assert plan.replicas == 2 and plan.tensor_parallel == 1
    assert plan.placement.startswith("2 replicas of one device each chosen: 8.0 longest requests at once")
    assert "one copy split over 2 tensor-parallel ranks: 4.0 longest requests at once" in plan.placement


def test_greedy_over_http_equals_hf_generate(split):
    hf, ckpt, plan, _ = split
    engine = Engine(plan, str(ckpt))
    server, port = serve(engine)
    try:
        assert "x2 (tensor-parallel ranks)" in engine.summary()
        with ThreadPoolExecutor(len(REQUESTS)) as pool:
            got = list(pool.map(lambda a: complete(port, prompt(a[0], a[1][0]), a[1][1]), enumerate(REQUESTS)))
    finally:
        server.should_exit = True
    try:
        for i, (n, k) in enumerate(REQUESTS):
            assert got[i] == hf_greedy(hf, prompt(i, n), k), f"request {i} ({n} prompt tokens)"
        assert released(engine) == []              # every page and slot free once idle (the leak oracle)
    finally:
        engine.close()


def test_an_image_prompt_equals_hf_generate(tmp_path):
    """The tower is whole on each rank: each runs it on the same patches and splices its own rows (named in
    the step message, not sent)."""
    hf = vl_checkpoint(tmp_path / "ckpt", seed=7, num_key_value_heads=2)
    plan = tmp_path / "p.plan"
    assert main(["plan", MODEL, "--preset", "tiny", "--checkpoint", str(tmp_path / "ckpt"), "--gpu", "cpu",
                 "--gpus", "2", "--tp", "2", "-o", str(plan), "-q"]) == 0
    engine = Engine(plan, str(tmp_path / "ckpt"))
    try:
        image_prompts_equal_hf(hf, engine)
    finally:
        engine.close()


def test_offline_run_and_check_boot_both_ranks(split, tmp_path, capsys):
    hf, ckpt, plan, _ = split
    reqs = tmp_path / "r.jsonl"
    reqs.write_text("".join(json.dumps({"id": f"r{i}", "prompt_token_ids": prompt(i, n), "max_tokens": k,
                                        "temperature": 0, "ignore_eos": True}) + "\n"
                            for i, (n, k) in enumerate(REQUESTS[:3])))
    assert main(["run", str(plan), "--checkpoint", str(ckpt), "--requests", str(reqs), "--output",
                 str(tmp_path / "o.jsonl")]) == 0
    out = [json.loads(line) for line in (tmp_path / "o.jsonl").read_text().splitlines()]
    for i, (n, k) in enumerate(REQUESTS[:3]):
        assert out[i]["token_ids"] == hf_greedy(hf, prompt(i, n), k), f"request {i}"
    capsys.readouterr()
    assert main(["check", str(plan), "--checkpoint", str(ckpt), "-q"]) == 0
    assert "rank 1: 0 of 0 graphs captured" in capsys.readouterr().out


def test_a_killed_rank_stops_the_engine_naming_it(split):
    _, ckpt, plan, _ = split
    engine = Engine(plan, str(ckpt))
    try:
        engine.add(prompt_token_ids=prompt(0, 40), params=SamplingParams(temperature=0, max_tokens=50, ignore_eos=True))
        engine.step()
        pid = next(iter(engine.ranks.links.values())).proc.pid
        os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(WorkerDied, match="tensor-parallel rank 1"):
            while engine.has_work():
                engine.step()
        assert time.monotonic() - t0 < 10
    finally:
        engine.close()


def test_a_model_that_declares_no_ranks_is_refused(tmp_path, capsys):
    assert main(["plan", TINY, "--gpu", "cpu", "--gpus", "2", "--tp", "2", "-o", str(tmp_path / "x.plan")]) == 2
    err = capsys.readouterr().err
    assert "does not split its nodes over tensor-parallel ranks" in err and "--replicas" in err


@pytest.mark.parametrize("args,message", [(["--gpus", "3", "--tp", "2"], "--tp 2 with --gpus 3"),
                                          (["--gpus", "2", "--tp", "2", "--replicas", "2"], "--tp 2 with --replicas 2")])
def test_impossible_rank_counts_are_refused(args, message, capsys):
    assert main(["plan", MODEL, "--preset", "tiny", "--gpu", "cpu", *args, "-o", os.devnull]) == 2
    assert message in capsys.readouterr().err


def test_a_rank_count_the_heads_do_not_divide_is_refused(capsys):
    from graphc.source import load_model

    with pytest.raises(InvalidInput, match="does not divide num_key_value_heads 2"):
        load_model(MODEL, "tiny", tp=4)           # the tiny preset's 2 KV heads
    assert main(["plan", MODEL, "--preset", "tiny", "--gpu", "cpu", "--gpus", "4", "--tp", "4", "-o", os.devnull]) == 2
    assert "Fix: use a tp that divides them all: 1, 2" in capsys.readouterr().err
