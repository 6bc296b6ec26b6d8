"""A video in Qwen3.5: the engine's greedy tokens equal HF's generate on a tiny Qwen3_5ForConditionalGeneration that
HF drew and saved, with the prompt HF's Qwen3VLProcessor lays out (its replace_video_token and timestamps, tokenized
by the checkpoint's own tokenizer.json) and HF's get_rope_index positions. The clip's patches are the host's
(vision_inputs.process_clip: HF's video processor needs torchvision, which the CPU test machine does not have);
its resize rule is held to HF's smart_resize below. Two videos, an image and a text request run at once.
"""
from __future__ import annotations

import itertools
import json
from types import SimpleNamespace

import pytest
import torch

from graphc.cli import main
from tests.parity.test_qwen3_5_serve import IDS, MODEL, cpu_engine, prompt, vl_checkpoint

CHARS = "<>. 0123456789seconds"
# a chat template of the tiny tokenizer's tokens: each message's text and media placeholders, Qwen3-VL's way
TEMPLATE = ("{%- for m in messages -%}<u1>{%- for p in m.content -%}{%- if p.type == 'text' -%}{{ p.text }}"
            "{%- elif p.type == 'image' -%}<|vision_start|><|image_pad|><|vision_end|>"
            "{%- elif p.type == 'video' -%}<|vision_start|><|video_pad|><|vision_end|>{%- endif -%}{%- endfor -%}"
            "<u2>{%- endfor -%}{%- if add_generation_prompt -%}<u3>{%- endif -%}")


def tiny_tokenizer(folder) -> None:
    """A character-level tokenizer.json: the timestamp text's characters at ids 10.., placeholders elsewhere below
    500, and the media tokens 500-503 as the config names them."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    vocab = {f"<u{i}>": i for i in range(500)}
    for i, ch in enumerate(sorted(set(CHARS))):
        del vocab[f"<u{10 + i}>"]
        vocab[ch] = 10 + i
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<u0>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.add_special_tokens(["<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>"])
    assert [tok.token_to_id(t) for t in ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")] == \
        [IDS["image_token_id"], IDS["video_token_id"], IDS["vision_start_token_id"], IDS["vision_end_token_id"]]
    tok.save(str(folder / "tokenizer.json"))


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """vl_checkpoint with the tiny tokenizer, TEMPLATE and a small clip budget, planned for cpu: (HF's model, the
    engine, the checkpoint folder)."""
    d = tmp_path_factory.mktemp("qwen3_5_video")
    hf = vl_checkpoint(d / "ckpt", seed=11)
    tiny_tokenizer(d / "ckpt")
    (d / "ckpt" / "chat_template.jinja").write_text(TEMPLATE)
    (d / "ckpt" / "video_preprocessor_config.json").write_text(json.dumps(
        {"size": {"shortest_edge": 4096, "longest_edge": 64 * 32 * 32}}))      # a small clip budget
    return hf, cpu_engine(d / "ckpt", d / "p.plan"), d / "ckpt"


def hf_video_ids(ckpt, grid: tuple[int, int, int], frames: int, fps: float, meta=None) -> list[int]:
    """The ids HF's Qwen3VLProcessor puts where the video's placeholder was, tokenized by the checkpoint's
    tokenizer (its replace_video_token, with the frames' metadata: `meta`, HF's loader's, else indices
    0..frames-1 at fps)."""
    from tokenizers import Tokenizer
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
    from transformers.video_utils import VideoMetadata

    proc = SimpleNamespace(video_processor=SimpleNamespace(merge_size=2, temporal_patch_size=2),
                           vision_start_token="<|vision_start|>", video_token="<|video_pad|>",
                           vision_end_token="<|vision_end|>")
    proc._calculate_timestamps = lambda *a: Qwen3VLProcessor._calculate_timestamps(proc, *a)
    meta = meta or VideoMetadata(total_num_frames=frames, fps=fps, frames_indices=list(range(frames)))
    text = Qwen3VLProcessor.replace_video_token(proc, {"video_grid_thw": torch.tensor([grid]),
                                                       "video_metadata": [meta]}, 0)
    return Tokenizer.from_file(str(ckpt / "tokenizer.json")).encode(text, add_special_tokens=False).ids


def test_the_clip_resize_is_hf_qwen3_vl_smart_resize():
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize

    from models.components.vision_inputs import clip_smart_resize

    for t, h, w in itertools.product([2, 3, 9, 60, 121], [20, 33, 150, 720], [31, 100, 640, 1920]):
        for lo, hi in ((128 * 32 * 32, 768 * 32 * 32), (4096, 25165824)):
            assert clip_smart_resize(t, h, w, 32, 2, lo, hi) == smart_resize(t, h, w, 2, 32, lo, hi), (t, h, w)


def test_video_prompts_equal_hf_generate(served, leak_oracle):
    from graphc import Media
    from graphc.runtime.sampler import SamplingParams
    from models.components.vision_inputs import process_clip, process_image

    hf, engine, ckpt = served
    leak_oracle.watch(engine)
    g = torch.Generator().manual_seed(2)
    clips = [(torch.randint(0, 256, (5, 3, 90, 120), dtype=torch.uint8, generator=g), 2.0),   # 3 groups, odd frames
             (torch.randint(0, 256, (4, 3, 64, 40), dtype=torch.uint8, generator=g), 0.5)]
    image = torch.randint(0, 256, (3, 70, 100), dtype=torch.uint8, generator=g)
    start, end, video, img = (IDS[k] for k in ("vision_start_token_id", "vision_end_token_id", "video_token_id",
                                               "image_token_id"))
    prompts = [prompt(1, 6) + [start, video, end] + prompt(2, 4), [start, video, end] + prompt(3, 3),
               prompt(4, 5) + [start, img, end], prompt(5, 30)]
    media = [[Media("video", clips[0][0], fps=clips[0][1])], [Media("video", clips[1][0], fps=clips[1][1])],
             [Media("image", image)], []]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    def video_encoder_steps() -> int:      # the module's engine counts the other tests' steps too
        return sum(n for k, n in engine.stats()["rungs"].items() if k.startswith("video_prefill/vision_encoder/"))

    before = video_encoder_steps()
    reqs = [engine.add(prompt_token_ids=ids, media=m, params=params) for ids, m in zip(prompts, media)]
    while engine.has_work():
        engine.step()
    assert [r.kind for r in reqs] == ["v2t", "v2t", "i2t", "t2t"]
    # both clips' groups in one encoder step: 5 frame groups, past the walk's 2 sequences (the tiny preset's videos)
    # but within its 8 segments
    assert video_encoder_steps() - before == 1
    for i, (r, ids) in enumerate(zip(reqs, prompts)):
        kw = {}
        if i < 2:
            frames, fps = clips[i]
            item = process_clip(frames, engine.host.vision)
            k = ids.index(video)
            ids = ids[:k] + hf_video_ids(ckpt, item.grid_thw, len(frames), fps) + ids[k + 1:]
            kw = dict(pixel_values_videos=item.patches, video_grid_thw=torch.tensor([item.grid_thw]))
        elif i == 2:
            item = process_image(image, engine.host.vision)
            k = ids.index(img)
            ids = ids[:k] + [img] * (item.num_patches // 4) + ids[k + 1:]
            kw = dict(pixel_values=item.patches, image_grid_thw=torch.tensor([item.grid_thw]))
        kw["mm_token_type_ids"] = torch.tensor([[1 if t == img else 2 if t == video else 0 for t in ids]])
        assert list(r.prompt.ids) == ids, f"request {i}: the host's prompt differs from HF's processor's"
        want, delta = hf.model.get_rope_index(torch.tensor([ids]), kw["mm_token_type_ids"], kw.get("image_grid_thw"),
                                              kw.get("video_grid_thw"))
        assert torch.equal(r.prompt.positions, want[:, 0]) and r.prompt.delta == int(delta), f"request {i}"
        with torch.no_grad():
            out = hf.generate(torch.tensor([ids]), max_new_tokens=8, min_new_tokens=8, do_sample=False,
                              eos_token_id=None, pad_token_id=0, **kw)
        assert list(r.output) == out[0, len(ids):].tolist(), f"request {i}"


def test_a_video_without_the_tokenizer_its_rate_or_its_times_is_refused(served):
    from graphc import InvalidInput, Media

    _, engine, _ = served
    clip = torch.zeros(4, 3, 64, 64, dtype=torch.uint8)
    ids = [IDS["vision_start_token_id"], IDS["video_token_id"], IDS["vision_end_token_id"]]
    with pytest.raises(InvalidInput, match="a video needs its sampling rate"):
        engine.host.prompt(ids, [Media("video", clip)])
    with pytest.raises(InvalidInput, match="frame times must be one a frame") as e:
        engine.host.prompt(ids, [Media("video", clip, times=(0.0, 0.5, 1.0))])
    assert e.value.why == "3 times for 4 frames"
    keep, engine.host.timestamp_ids = engine.host.timestamp_ids, None
    try:
        with pytest.raises(InvalidInput, match="a video prompt needs a tokenizer"):
            engine.host.prompt(ids, [Media("video", clip, fps=2.0)])
    finally:
        engine.host.timestamp_ids = keep


def test_the_frame_limit_is_safe(served):
    """media_limits' frame bound: a clip of that many of the smallest frames (every group one merged patch) already
    takes more rows than a prompt of the plan holds, so refusing longer clips before decoding refuses none that fit."""
    from graphc import Media

    _, engine, _ = served
    most = engine.executor.kv_spec.max_seq_len
    _, frames = engine.host.media_limits(most)
    ids = [IDS["vision_start_token_id"], IDS["video_token_id"], IDS["vision_end_token_id"]]
    p = engine.host.prompt(ids, [Media("video", torch.zeros(frames, 3, 32, 32, dtype=torch.uint8), fps=2.0)])
    assert len(p.ids) > most


def test_a_video_file_in_chat_messages_equals_hf_generate(served, tmp_path):
    """The user's path: a chat message with an mp4 part (decoded and sampled by graphc's loader as the host's
    SpreadFrames says), the checkpoint's chat template and tokenizer, the host's layout; its prompt ids and
    greedy tokens equal HF's: HF's own loader (PyAV) and Qwen3VLVideoProcessor.sample_frames choose the frames
    (14 at 4 fps, asked 2 a second: indices 0 2 4 6 9 11 13, where frames nearest k / 2 s would be 0 2 ... 12),
    HF's processor lays out their times, HF's generate runs (the template's ids hold 0, the tiny tokenizer's
    unknown token: HF's mask is given, not guessed from the pad id)."""
    import numpy as np
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor
    from transformers.video_utils import load_video as hf_load_video

    from graphc.runtime.sampler import SamplingParams
    from models.components.vision_inputs import process_clip
    from tests.parity.test_engine import write_video

    hf, engine, ckpt = served
    path = tmp_path / "v.mp4"
    write_video(str(path), np.random.default_rng(3).integers(0, 256, (14, 64, 96, 3), dtype=np.uint8), fps=4)
    messages = [{"role": "user", "content": [{"type": "text", "text": "0.5 s"}, {"type": "video", "path": str(path)}]}]
    r = engine.add(messages=messages, params=SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    while engine.has_work():
        engine.step()
    assert r.kind == "v2t"
    sampler = Qwen3VLVideoProcessor()
    frames, meta = hf_load_video(str(path), backend="pyav",
                                 sample_indices_fn=lambda metadata, **_: sampler.sample_frames(metadata, fps=2))
    frames = torch.from_numpy(frames).permute(0, 3, 1, 2)
    frames = torch.cat([frames, frames[-1:]]) if len(frames) % 2 else frames    # HF's processor pads so
    item = process_clip(frames, engine.host.vision)
    ids = engine.tokenize([{"role": "user", "content": [{"type": "text", "text": "0.5 s"}, {"type": "video"}]}])
    k = ids.index(IDS["video_token_id"])
    ids = ids[:k] + hf_video_ids(ckpt, item.grid_thw, len(frames), 2.0, meta) + ids[k + 1:]
    assert list(r.prompt.ids) == ids
    types = torch.tensor([[2 if t == IDS["video_token_id"] else 0 for t in ids]])
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                          max_new_tokens=8, min_new_tokens=8, do_sample=False, eos_token_id=None,
                          pad_token_id=0, pixel_values_videos=item.patches,
                          video_grid_thw=torch.tensor([item.grid_thw]), mm_token_type_ids=types)
    assert list(r.output) == out[0, len(ids):].tolist()


def test_the_example_checkpoint_serves_text_images_and_videos_from_chat_messages(tmp_path):
    """examples/make_tiny_checkpoint.py qwen3_5 (HF's model, a BPE tokenizer, a chat template) planned and run
    offline as its docs say: a text, an image (png) and a video (mp4) request from chat messages each finish
    with their kind and 6 tokens."""
    import importlib.util

    import numpy as np
    from PIL import Image

    from tests.conftest import ROOT
    from tests.parity.test_engine import write_video

    spec = importlib.util.spec_from_file_location("mk", ROOT / "examples" / "make_tiny_checkpoint.py")
    mk = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mk)
    tok = mk.build_tokenizer()
    ckpt = mk.save(mk.qwen3_5_model(tok), tok, tmp_path / "ckpt")
    write_video(str(tmp_path / "v.mp4"), np.random.default_rng(0).integers(0, 256, (12, 64, 96, 3), np.uint8), fps=4)
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (70, 90, 3), np.uint8)).save(tmp_path / "i.png")
    parts = {"t2t": [{"type": "text", "text": "hello world"}],
             "i2t": [{"type": "image", "path": str(tmp_path / "i.png")}, {"type": "text", "text": "what is it"}],
             "v2t": [{"type": "text", "text": "describe"}, {"type": "video", "path": str(tmp_path / "v.mp4")}]}
    reqs = tmp_path / "r.jsonl"
    reqs.write_text("".join(json.dumps({"id": k, "messages": [{"role": "user", "content": v}], "max_tokens": 6,
                                        "ignore_eos": True}) + "\n" for k, v in parts.items()))
    plan = tmp_path / "p.plan"
    assert main(["plan", MODEL, "--preset", "tiny", "--checkpoint", str(ckpt), "--gpu", "cpu", "-o", str(plan),
                 "-q"]) == 0
    assert main(["run", str(plan), "--checkpoint", str(ckpt), "--requests", str(reqs), "--output",
                 str(tmp_path / "o.jsonl")]) == 0
    out = [json.loads(line) for line in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert [(o["id"], o["kind"], len(o["token_ids"]), o["finish_reason"]) for o in out] == \
        [(k, k, 6, "length") for k in parts]
