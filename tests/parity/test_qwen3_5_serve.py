"""Qwen3.5 served: a tiny Qwen3.5 checkpoint whose weights HF drew and saved is planned by `graphc plan` (cpu),
served by `graphc run`'s HTTP server, and its greedy tokens equal HF's generate, request by request, with
several requests of different lengths in flight at once (prefill chunks, mixed and batched decode steps,
state slots reused after requests end). Once idle, every page and every state slot is free (the leak oracle).

The text checkpoint's weights are HF Qwen3_5ForCausalLM's, saved under a Qwen3.5 checkpoint's names
(model.language_model.*, as tests/parity/test_qwen3_5_text.py does), without a tower, and with mtp.* tensors as
the real checkpoints have (a head the engine does not run: the model declares them ignored). The image test's checkpoint
is HF's Qwen3_5ForConditionalGeneration saved by HF itself (model.visual.* too).
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
from tests.parity.test_qwen3_5_text import draw, hf_config, language_model_names
from tests.unit.loopback import post_json, serve

MODEL = str(ROOT / "models" / "qwen3_5.py")
# (prompt length, tokens to generate): 9 requests on a plan of 8 decode sequences, 128-token prefill steps
REQUESTS = [(5, 12), (140, 6), (33, 9), (1, 7), (70, 10), (12, 5), (200, 4), (9, 11), (51, 8)]


def text_checkpoint(d, **config):
    """(HF's tiny Qwen3_5ForCausalLM, d/ckpt: its weights under a Qwen3.5 checkpoint's names, as the module
    docstring says). config: fields of HF's config to set."""
    cfg = hf_config("untied")
    cfg.vocab_size = 512                  # the tiny preset's shapes are read from the checkpoint's config
    for k, v in config.items():
        setattr(cfg, k, v)
    torch.manual_seed(0)
    hf = draw(Qwen3_5ForCausalLM(cfg).eval(), seed=5)
    hf.save_pretrained(d / "hf")
    tensors = load_file(str(d / "hf" / "model.safetensors"))
    ckpt = d / "ckpt"
    ckpt.mkdir()
    renamed = {k: v.contiguous() for k, v in language_model_names(tensors).items()}
    mtp = {"mtp.fc.weight": torch.zeros(8, 8), "mtp.norm.weight": torch.ones(8)}     # the real ones carry this head
    save_file(renamed | mtp, str(ckpt / "model.safetensors"))
    text = json.loads((d / "hf" / "config.json").read_text()) | {"model_type": "qwen3_5_text", "dtype": "float32"}
    (ckpt / "config.json").write_text(json.dumps({"model_type": "qwen3_5", "text_config": text,
                                                  "tie_word_embeddings": False}))
    return hf, ckpt


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(HF's model, the engine serving the plan of its checkpoint, the server's port)."""
    d = tmp_path_factory.mktemp("qwen3_5")
    hf, ckpt = text_checkpoint(d)
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
    assert engine.scheduler.shared is None and "prefix_cache" not in engine.stats()    # state: never cached
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


# ---- an image in: the tower's rows spliced into the prompt, M-RoPE's image positions
VISION = dict(depth=2, hidden_size=32, num_heads=4, intermediate_size=48, out_hidden_size=64,
              num_position_embeddings=16)
IDS = dict(image_token_id=500, video_token_id=501, vision_start_token_id=502, vision_end_token_id=503)


def vl_checkpoint(folder, seed: int, **config):
    """HF's tiny Qwen3_5ForConditionalGeneration (text as above, a 2-block tower), drawn with `seed` and saved by HF
    under its own names (model.language_model.*, model.visual.*, lm_head) in folder: HF's model. config: fields of
    the text config to set."""
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5Config
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForConditionalGeneration

    text = hf_config("untied").to_dict() | {"vocab_size": 512, "dtype": "float32"} | config
    torch.manual_seed(0)
    hf = Qwen3_5ForConditionalGeneration(Qwen3_5Config(text_config=text, vision_config=VISION,
                                                       tie_word_embeddings=False, **IDS)).eval()
    draw(hf, seed=seed)
    hf.save_pretrained(folder)
    return hf


def cpu_engine(ckpt, plan) -> Engine:
    """The tiny preset planned for cpu from ckpt's config.json, booted on ckpt."""
    assert main(["plan", MODEL, "--preset", "tiny", "--checkpoint", str(ckpt), "--gpu", "cpu", "-o", str(plan),
                 "-q"]) == 0
    return Engine(plan, str(ckpt))


@pytest.fixture(scope="module")
def with_vision(tmp_path_factory):
    """vl_checkpoint planned for cpu: (HF's model, the engine)."""
    d = tmp_path_factory.mktemp("qwen3_5_vl")
    hf = vl_checkpoint(d / "ckpt", seed=7)
    return hf, cpu_engine(d / "ckpt", d / "p.plan")


def test_an_image_prompt_equals_hf_generate(with_vision, leak_oracle):
    """Two image requests (64 x 96 and 160 x 64 after resizing) and a text one at once; each one's greedy tokens
    equal HF's generate given the same patches (the host's preprocessing: HF's image processor needs
    torchvision, which the CPU test machine does not have)."""
    hf, engine = with_vision
    leak_oracle.watch(engine)
    image_prompts_equal_hf(hf, engine)


def image_prompts_equal_hf(hf, engine) -> None:
    """The image test's requests through engine, each one's greedy tokens against HF's generate."""
    from graphc import Media
    from graphc.runtime.sampler import SamplingParams
    from models.components.vision_inputs import process_image

    g = torch.Generator().manual_seed(1)
    images = [torch.randint(0, 256, (3, 70, 100), dtype=torch.uint8, generator=g),
              torch.randint(0, 256, (3, 150, 60), dtype=torch.uint8, generator=g)]
    start, image, end = IDS["vision_start_token_id"], IDS["image_token_id"], IDS["vision_end_token_id"]
    prompts = [prompt(1, 9) + [start, image, end] + prompt(2, 5), prompt(3, 4) + [start, image, end], prompt(4, 20)]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    reqs = [engine.add(prompt_token_ids=ids, media=[Media("image", img)] if i < 2 else [], params=params)
            for i, (ids, img) in enumerate(zip(prompts, images + [None]))]
    while engine.has_work():
        engine.step()
    assert [r.kind for r in reqs] == ["i2t", "i2t", "t2t"]
    got = []
    for i, (r, ids) in enumerate(zip(reqs, prompts)):
        kw = {}
        if i < 2:
            item = process_image(images[i], engine.host.vision)
            n = item.num_patches // 4
            k = ids.index(image)
            ids = ids[:k] + [image] * n + ids[k + 1:]
            kw = dict(pixel_values=item.patches, image_grid_thw=torch.tensor([item.grid_thw]))
        kw["mm_token_type_ids"] = torch.tensor([[int(t == image) for t in ids]])     # what HF's processor returns
        with torch.no_grad():
            out = hf.generate(torch.tensor([ids]), max_new_tokens=8, min_new_tokens=8, do_sample=False,
                              eos_token_id=None, pad_token_id=0, **kw)
        got.append((list(r.output), out[0, len(ids):].tolist()))
    assert all(a == b for a, b in got), got
    assert engine.stats()["steps"].get("image_prefill", 0) > 0
