"""Qwen3.5 over HTTP against HF end to end: a tiny checkpoint HF wrote (examples/make_tiny_checkpoint.py qwen3_5),
served by `graphc run`'s app; a chat message with a PNG as an image_url data URL. HF's side uses none of graphc:
its tokenizer renders the checkpoint's chat template, its image processor makes the patches, Qwen3VLProcessor's
replace_image_token expands the placeholder, its model generates greedily. The greedy tokens must be equal.

Two images: 64 x 96 (sides multiples of 32 within the checkpoint's pixel bounds, so no resize: HF's PIL image
processor, which runs without torchvision, gives the same pixels as its torchvision one), and 70 x 90 (resized
to 64 x 96 by bicubic interpolation: HF's torchvision image processor only, skipped where torchvision is absent,
as in CI; the GPU machine's environment has it).
"""
from __future__ import annotations

import base64
import importlib.util
import io
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from graphc.cli import main
from graphc.runtime.engine import Engine
from tests.conftest import ROOT
from tests.unit.loopback import post_json, serve

MODEL = "models/qwen3_5.py"
TOKENS = 8


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForConditionalGeneration

    d = tmp_path_factory.mktemp("qwen3_5_hf_processor")
    spec = importlib.util.spec_from_file_location("mk", ROOT / "examples" / "make_tiny_checkpoint.py")
    mk = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mk)
    tok = mk.build_tokenizer()
    ckpt = mk.save(mk.qwen3_5_model(tok), tok, d / "ckpt")
    plan = d / "p.plan"
    assert main(["plan", MODEL, "--preset", "tiny", "--checkpoint", str(ckpt), "--gpu", "cpu", "-o", str(plan),
                 "-q"]) == 0
    engine = Engine(plan, str(ckpt))
    server, port = serve(engine)
    hf = Qwen3_5ForConditionalGeneration.from_pretrained(str(ckpt), dtype=torch.float32).eval()
    yield hf, port, ckpt
    server.should_exit = True


def image_processor(ckpt, torchvision: bool):
    """HF's Qwen2-VL image processor from the checkpoint's preprocessor_config.json (the class Qwen3.5's
    processor uses): its torchvision backend, or its PIL one."""
    if torchvision:
        pytest.importorskip("torchvision")
        from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor as cls
    else:
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil as cls
    return cls.from_pretrained(str(ckpt))


def hf_greedy(hf, ckpt, image, text: str, torchvision: bool) -> list[int]:
    """HF's greedy tokens for one user message: the image, then the text."""
    from transformers import AutoTokenizer
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor

    tok = AutoTokenizer.from_pretrained(str(ckpt))
    pixels = image_processor(ckpt, torchvision)(images=[image], return_tensors="pt")
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]
    rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                       chat_template=(ckpt / "chat_template.jinja").read_text())
    fake = SimpleNamespace(image_token="<|image_pad|>", image_processor=SimpleNamespace(merge_size=2))
    assert rendered.count(fake.image_token) == 1
    rendered = rendered.replace(fake.image_token, Qwen3VLProcessor.replace_image_token(fake, pixels, 0))
    ids = tok(rendered, add_special_tokens=False, return_tensors="pt")["input_ids"]
    types = (ids == tok.convert_tokens_to_ids(fake.image_token)).long()
    with torch.no_grad():
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), pixel_values=pixels["pixel_values"],
                          image_grid_thw=pixels["image_grid_thw"], mm_token_type_ids=types, max_new_tokens=TOKENS,
                          min_new_tokens=TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0)
    return [tok.decode([t], skip_special_tokens=False) for t in out[0, ids.shape[1]:].tolist()]


def graphc_tokens(port: int, png: bytes, text: str) -> list[str]:
    """The served answer's tokens (their texts, from chat logprobs) for the same message over HTTP."""
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    body = {"model": "qwen3_5-tiny-checkpoint", "max_tokens": TOKENS, "temperature": 0, "ignore_eos": True,
            "logprobs": True, "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}]}]}
    status, answer, _ = post_json(port, "/v1/chat/completions", body)
    assert status == 200, answer
    return [e["token"] for e in answer["choices"][0]["logprobs"]["content"]]


@pytest.mark.parametrize("shape, torchvision", [((64, 96), False), ((70, 90), True)],
                         ids=["64x96-no-resize", "70x90-resized"])
def test_an_image_over_http_equals_hf_with_its_own_processor(served, shape, torchvision):
    from PIL import Image

    hf, port, ckpt = served
    image = Image.fromarray(np.random.default_rng(shape[0]).integers(0, 256, (*shape, 3), np.uint8))
    png = io.BytesIO()
    image.save(png, format="PNG")
    want = hf_greedy(hf, ckpt, image, "what is it", torchvision)
    assert graphc_tokens(port, png.getvalue(), "what is it") == want
