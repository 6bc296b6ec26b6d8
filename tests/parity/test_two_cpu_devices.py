"""The two commands a user runs on a CPU machine (issue 40), as written, with the default host budget:

    graphc plan models/qwen3_omni.py --checkpoint CKPT --gpu cpu --gpus 2 -o p2.plan
    graphc run p2.plan --checkpoint CKPT --requests ...

on a tiny Qwen3-Omni with talker and Code2Wav written by transformers, so both devices hold nodes and fill
their KV pools to their share. The two devices' planned bytes stay within the host's budget (they once
planned 16 GiB each on a 24 GiB machine and the kernel killed a worker), and the greedy text equals HF's
generate on the same checkpoint (fp32). A module of its own: one process drives one multi-device plan."""
import json

import torch
from transformers import GenerationConfig

from examples.make_tiny_checkpoint import build_tokenizer, omni_model, save
from graphc.cli import main
from graphc.plan import load_plan
from graphc.units import GiB
from tests.parity.weights import randomize

NEW = 8
PROMPTS = ["<|im_start|>user\nthe quick brown fox<|im_end|>\n<|im_start|>assistant\n",
           "<|im_start|>user\nwhat is in the image please<|im_end|>\n<|im_start|>assistant\n"]


def test_a_two_device_cpu_plan_of_a_checkpoint_serves_hf_greedy_text(tmp_path):
    tok = build_tokenizer()
    hf = omni_model(tok, speech=True)
    randomize(hf, seed=3)
    ckpt, p2 = tmp_path / "ckpt", tmp_path / "p2.plan"
    save(hf, tok, ckpt)
    assert main(["plan", "models/qwen3_omni.py", "--checkpoint", str(ckpt), "--gpu", "cpu", "--gpus", "2",
                 "-o", str(p2), "-q"]) == 0
    plan = load_plan(p2)
    assert plan.target.host_bytes == 8 * GiB and all(d.nodes and d.capacity_bytes == 4 * GiB for d in plan.devices)
    assert sum(d.total_bytes for d in plan.devices) <= 8 * GiB

    ids = [tok.encode(p, add_special_tokens=False).ids for p in PROMPTS]
    reqs, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    reqs.write_text("".join(json.dumps({"id": f"r{i}", "prompt_token_ids": x, "max_tokens": NEW, "temperature": 0,
                                        "ignore_eos": True}) + "\n" for i, x in enumerate(ids)))
    assert main(["run", str(p2), "--checkpoint", str(ckpt), "--requests", str(reqs), "--output", str(out)]) == 0
    got = {x["id"]: x["token_ids"] for x in map(json.loads, out.read_text().splitlines())}

    greedy = GenerationConfig(max_new_tokens=NEW, do_sample=False, eos_token_id=None, pad_token_id=0)
    for i, x in enumerate(ids):
        with torch.no_grad():
            g = hf.thinker.generate(input_ids=torch.tensor([x]), attention_mask=torch.ones(1, len(x), dtype=torch.long),
                                    generation_config=greedy)
        assert got[f"r{i}"] == g[0, len(x):].tolist(), i
