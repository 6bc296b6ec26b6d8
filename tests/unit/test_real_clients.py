"""Real clients against `graphc run` on the tiny Qwen3-Omni checkpoint (issue 38), each run as its own process as
a user runs it, the test reading the result files it writes:

  lm-evaluation-harness  `local-completions` on the two tasks in tests/data/lm_eval: graphc_gen (generate_until:
                         the text /v1/completions generates) and graphc_mc (multiple_choice: each choice scored
                         from the prompt logprobs /v1/completions returns with echo). Its tokenizer is the
                         server's own (/tokenizer_info, /tokenize, /detokenize: tokenizer_backend auto).
  aiperf                 `aiperf profile` of the chat route, streamed with usage: every request answered, none
                         failed, TTFT and throughput measured, and token counts from the server's usage.

Expected values come from the openai client (generated text) and from HF transformers on the same checkpoint
(prompt logprobs, chat-template token counts).
"""
from __future__ import annotations

import glob
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.unit.test_examples import free_port, wait_healthy
from tests.unit.test_lifecycle import stop

openai = pytest.importorskip("openai")
pytest.importorskip("lm_eval", reason="lm-evaluation-harness is the client under test; pip install -e '.[test]'")
pytest.importorskip("aiperf", reason="aiperf is the client under test; pip install -e '.[test]'")

NAME = "graphc-tiny"                   # --served-model-name: what the clients ask for
TASKS = ROOT / "tests" / "data" / "lm_eval"
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}     # lm-eval: the tasks' documents are local


@pytest.fixture(scope="module")
def served(tiny_omni_dir):
    """`graphc run` of the tiny checkpoint on a free port: {port, dir}; stopped with SIGTERM after the module."""
    d, port = tiny_omni_dir, free_port()
    p = subprocess.Popen([sys.executable, "-m", "graphc.cli", "run", str(d / "p.plan"), "--checkpoint", str(d / "ckpt"),
                          "--port", str(port), "--served-model-name", NAME], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    wait_healthy(p, port)
    yield {"port": port, "dir": d}
    stop(p, signal.SIGTERM, 30)


def run_client(args: list[str], tmp: Path, offline: bool, timeout: float = 300) -> None:
    """Run a client's command line from the repository root (the tasks name their documents from there), its
    caches in `tmp`; fail with its output when it does not exit 0. offline: the hub's offline switches set (aiperf
    0.13 then looks a local tokenizer folder up in the hub's cache, and fails; given the folder, it reads no
    other)."""
    env = {**os.environ, **(OFFLINE if offline else {}), "HF_HOME": str(tmp / "hf"),
           "HF_DATASETS_CACHE": str(tmp / "datasets")}
    p = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"{args[:3]} exited {p.returncode}:\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}"


def lm_eval(port: int, task: str, tmp: Path) -> tuple[dict, list[dict]]:
    """lm-eval's local-completions on `task` against the server, as it runs by default (its prompts tokenized by
    the server's /tokenize, sent as batches of token-id lists, two a request): (its results file, its logged
    samples)."""
    args = f"base_url=http://127.0.0.1:{port}/v1/completions,model={NAME},num_concurrent=1,max_retries=1"
    run_client([sys.executable, "-m", "lm_eval", "--model", "local-completions", "--model_args", args,
                "--batch_size", "2", "--tasks", task, "--include_path", str(TASKS), "--output_path", str(tmp / "out"), "--log_samples"],
               tmp, offline=True)
    [results] = glob.glob(str(tmp / "out" / "*" / "results_*.json"))
    [samples] = glob.glob(str(tmp / "out" / "*" / f"samples_{task}_*.jsonl"))
    return json.loads(Path(results).read_text()), [json.loads(line) for line in Path(samples).read_text().splitlines()]


def a_fraction(x) -> bool:
    return isinstance(x, float) and math.isfinite(x) and 0.0 <= x <= 1.0


def test_lm_eval_generate_until_reads_the_text_the_server_generates(served, tmp_path):
    """graphc_gen completes with exact_match a number in [0, 1], and each document's generation is the text the
    openai client gets for the same prompt and settings (greedy: the same text)."""
    results, samples = lm_eval(served["port"], "graphc_gen", tmp_path)
    assert a_fraction(results["results"]["graphc_gen"]["exact_match,none"]), results["results"]
    assert len(samples) == 3
    c = openai.OpenAI(base_url=f"http://127.0.0.1:{served['port']}/v1", api_key="none")
    for s in samples:
        prompt, gen = s["arguments"]["gen_args_0"]["arg_0"], s["arguments"]["gen_args_0"]["arg_1"]
        want = c.completions.create(model=NAME, prompt=prompt, max_tokens=gen["max_gen_toks"], temperature=0,
                                    stop=gen["until"]).choices[0].text
        assert s["resps"] == [[want]], (prompt, s["resps"], want)


def hf_loglikelihood(ckpt: Path):
    """(context, continuation) -> HF's sum of the continuation's token logprobs after the context, and whether
    each of its tokens is the greedy one: lm-eval's loglikelihood computed by HF transformers."""
    import torch
    from transformers import AutoTokenizer, Qwen3OmniMoeForConditionalGeneration

    tok = AutoTokenizer.from_pretrained(str(ckpt))
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(str(ckpt), dtype=torch.float32).thinker.eval()

    def score(context: str, continuation: str) -> tuple[float, bool]:
        whole = tok.encode(context + continuation, add_special_tokens=False)
        n = len(tok.encode(context, add_special_tokens=False))
        with torch.no_grad():
            lp = torch.log_softmax(model(input_ids=torch.tensor([whole])).logits[0].double(), -1)   # [T, V]
        rows = lp[n - 1:len(whole) - 1]                  # row i scores token i + 1
        cont = torch.tensor(whole[n:])
        return rows.gather(1, cont[:, None]).sum().item(), bool((rows.argmax(-1) == cont).all())
    return score


def test_lm_eval_multiple_choice_scores_each_choice_from_the_servers_prompt_logprobs(served, tmp_path):
    """graphc_mc completes, and the loglikelihood and is-greedy flag lm-eval read for each choice (from echo's
    prompt logprobs) are HF's for the same tokens; acc is the share of documents whose answer HF scores
    highest."""
    results, samples = lm_eval(served["port"], "graphc_mc", tmp_path)
    assert len(samples) == 4
    score, right = hf_loglikelihood(served["dir"] / "ckpt"), 0
    for s in samples:
        want = []
        for i, ((lp, greedy),) in enumerate(s["resps"]):           # the samples file holds them as text
            args = s["arguments"][f"gen_args_{i}"]
            want.append(score(args["arg_0"], args["arg_1"]))
            assert float(lp) == pytest.approx(want[-1][0], abs=1e-3) and greedy == str(want[-1][1]), (args, lp, want)
        right += max(range(len(want)), key=lambda i: want[i][0]) == s["doc"]["answer"]
    acc = results["results"]["graphc_mc"]["acc,none"]
    assert a_fraction(acc) and acc == right / 4, (acc, right)


def aiperf(port: int, tmp: Path, ckpt: Path, requests: int, out_tokens: int) -> tuple[dict, list[dict], dict, dict]:
    """`aiperf profile` of the chat route, streamed, token counts from the server's usage: (its summary, its
    per-request records, its payloads by conversation id, its summary of the server's /metrics)."""
    run_client([sys.executable, "-m", "aiperf", "profile", "-m", NAME, "--url", f"http://127.0.0.1:{port}",
                "--endpoint-type", "chat", "--streaming", "--use-server-token-count", "--tokenizer", str(ckpt),
                "--request-count", str(requests), "--concurrency", "1", "--random-seed", "0",
                "--prompt-input-tokens-mean", "16", "--prompt-input-tokens-stddev", "0",
                "--prompt-output-tokens-mean", str(out_tokens), "--prompt-output-tokens-stddev", "0",
                "--extra-inputs", "ignore_eos:true", "--output-artifact-dir", str(tmp / "aiperf"), "--ui-type", "none",
                "--no-gpu-telemetry", "--no-auto-plot", "--workers-max", "1"], tmp, offline=False)
    out = tmp / "aiperf"
    records = [json.loads(line) for line in (out / "profile_export.jsonl").read_text().splitlines()]
    sent = {e["session_id"]: e["payloads"][0] for e in json.loads((out / "inputs.json").read_text())["data"]}
    metrics = json.loads((out / "server_metrics_export.json").read_text())["summary"]
    return json.loads((out / "profile_export_aiperf.json").read_text()), records, sent, metrics


def test_aiperf_profiles_the_streamed_chat_route_with_usage_and_no_errors(served, tmp_path):
    """4 streamed chat requests of 8 tokens each: all 4 counted, none failed, TTFT and output-token throughput
    measured, each request's usage as HF counts it (its messages through the chat template; 8 tokens out), and
    the server's /metrics read beside them."""
    from transformers import AutoTokenizer

    ckpt = served["dir"] / "ckpt"
    summary, records, sent, metrics = aiperf(served["port"], tmp_path, ckpt, requests=4, out_tokens=8)
    assert summary["request_count"]["avg"] == 4 and summary["error_summary"] == [], summary["error_summary"]
    assert not summary["was_cancelled"] and summary["request_error_rate"]["avg"] == 0
    assert all(math.isfinite(summary[k]["avg"]) and summary[k]["avg"] > 0
               for k in ("time_to_first_token", "output_token_throughput", "inter_token_latency"))
    assert summary["total_usage_completion_tokens"]["avg"] == 4 * 8
    assert metrics["endpoints_successful"] == [f"http://127.0.0.1:{served['port']}/metrics"], metrics
    hf = AutoTokenizer.from_pretrained(str(ckpt))
    assert len(records) == 4 and all(r.get("error") is None for r in records)
    for r in records:
        body = sent[r["metadata"]["conversation_id"]]
        assert body["stream"] and body["stream_options"] == {"include_usage": True}
        prompt = hf.apply_chat_template(body["messages"], add_generation_prompt=True, tokenize=False)
        assert r["metrics"]["usage_prompt_tokens"]["value"] == len(hf.encode(prompt, add_special_tokens=False))
        assert r["metrics"]["usage_completion_tokens"]["value"] == 8
