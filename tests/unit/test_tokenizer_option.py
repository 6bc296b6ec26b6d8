"""graphc run --tokenizer DIR (Engine(tokenizer=)): seeded weights serving text through a tokenizer folder, the
refusals, and examples/tools/synthetic_tokenizer.py's folders for a tiny plan and the shipped real plans (ids
hand-copied from /work/shared/reference: qwen3_omni.md section 1g and 1e, qwen3_5.md sections 2.1 and the vision
tower's special ids; Qwen3.5's turn markers from its generation_config eos [248046, 248044])."""
import json
import subprocess
import sys

import pytest
from tokenizers import Tokenizer

from graphc.errors import InvalidInput
from graphc.runtime.engine import Engine, check_options
from tests.unit.loopback import post, serve

openai = pytest.importorskip("openai")
TOOL = "examples/tools/synthetic_tokenizer.py"

OMNI_IDS = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<|vision_start|>": 151652,
            "<|vision_end|>": 151653, "<|image_pad|>": 151655, "<|video_pad|>": 151656, "<|audio_start|>": 151669,
            "<|audio_end|>": 151670, "<tts_pad>": 151671, "<tts_text_bos>": 151672, "<tts_text_eod>": 151673,
            "<|audio_pad|>": 151675, "user": 872, "assistant": 77091}
QWEN3_5_IDS = {"<|endoftext|>": 248044, "<|im_start|>": 248045, "<|im_end|>": 248046, "<|vision_start|>": 248053,
               "<|vision_end|>": 248054, "<|image_pad|>": 248056, "<|video_pad|>": 248057}


def synthetic(plan: str, out) -> str:
    subprocess.run([sys.executable, TOOL, plan, str(out)], check=True, capture_output=True)
    return str(out)


def hf(folder: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


@pytest.mark.parametrize("plan, want, part, media", [
    ("plans/qwen3_omni_h200.plan", OMNI_IDS, {"type": "audio", "audio": "a.wav"}, ("<|audio_start|>", "<|audio_pad|>",
                                                                                   "<|audio_end|>")),
    ("plans/qwen3_5_9b_h200.plan", QWEN3_5_IDS, {"type": "image", "image": "a.png"},
     ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>"))])
def test_synthetic_tokenizer_of_a_real_plan(tmp_path, plan, want, part, media):
    d = synthetic(plan, tmp_path / "tok")
    tok = Tokenizer.from_file(f"{d}/tokenizer.json")
    for text, i in want.items():
        assert tok.encode(text, add_special_tokens=False).ids == [i], text
        assert tok.decode([i], skip_special_tokens=False) == text
    text = "hello world, naïve café 😀"
    assert tok.decode(tok.encode(text, add_special_tokens=False).ids) == text
    # the chat template as HF renders it: the media part's run sits at the plan's ids
    ids = hf(d).apply_chat_template([{"role": "user", "content": [part, {"type": "text", "text": "what is it?"}]}],
                                    add_generation_prompt=True, tokenize=True, return_dict=False)
    run = [want[t] for t in media]
    assert any(ids[k:k + 3] == run for k in range(len(ids))), ids
    assert ids[:2] == [want["<|im_start|>"], want["user"]] if "user" in want else ids[0] == want["<|im_start|>"]


@pytest.fixture(scope="module")
def tiny_tok(tmp_path_factory):
    return synthetic("plans/tiny_cpu.plan", tmp_path_factory.mktemp("tok") / "tiny")


def test_random_weights_with_a_tokenizer_serve_chat_and_tokenize(tiny_tok):
    engine = Engine("plans/tiny_cpu.plan", random_weights=True, tokenizer=tiny_tok)
    server, port = serve(engine)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
        messages = [{"role": "user", "content": "the quick brown fox"}]
        answer = client.chat.completions.create(model="tiny_omni-tiny", messages=messages, max_tokens=4, temperature=0)
        want = hf(tiny_tok).apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                return_dict=False)
        assert answer.usage.prompt_tokens == len(want) and answer.usage.completion_tokens == 4
        assert isinstance(answer.choices[0].message.content, str)
        status, body = post(port, "/tokenize", {"messages": messages})
        assert status == 200 and body["tokens"] == want
        status, body = post(port, "/tokenize", {"prompt": "hello world"})
        assert body["tokens"] == Tokenizer.from_file(f"{tiny_tok}/tokenizer.json").encode("hello world").ids
    finally:
        server.should_exit = True


def test_a_folder_without_tokenizer_json_is_refused(tmp_path):
    with pytest.raises(InvalidInput, match=r"--tokenizer .*tokenizer.json is not there") as e:
        Engine("plans/tiny_cpu.plan", random_weights=True, tokenizer=tmp_path)
    assert str(tmp_path / "tokenizer.json") in str(e.value) and "synthetic_tokenizer.py" in str(e.value)


def test_a_tokenizer_past_the_vocabulary_is_refused(tmp_path):
    d = synthetic("plans/qwen3_5_9b_h200.plan", tmp_path / "big")
    with pytest.raises(InvalidInput, match=r"ids up to 248,319, and the plan's LLM has 512 vocabulary rows"):
        Engine("plans/tiny_cpu.plan", random_weights=True, tokenizer=d)


def test_the_tokenizer_folder_is_the_one_source(tmp_path, tiny_tok):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "tokenizer.json").write_text("{}")
    assert str(check_options(ckpt, False, None, None, tiny_tok)[0]) == tiny_tok       # over the checkpoint's
    assert check_options(ckpt, False, None, None)[0] == ckpt
    assert check_options(None, True, None, None) == (None, None)
    folder, template = check_options(None, True, None, "{{ 'x' }}", tiny_tok)        # --chat-template: its special
    assert template.special["eos_token"] == "<|im_end|>"                             # tokens from the folder
    with pytest.raises(InvalidInput, match="--tokenizer DIR"):
        check_options(None, True, None, "{{ 'x' }}")


def test_the_host_takes_the_engines_tokenizer(tmp_path):
    """A tokenizer whose <|audio_end|> is not where the seeded tiny Qwen3-Omni host puts it: the host follows it."""
    from examples.make_tiny_checkpoint import build_tokenizer

    tok = build_tokenizer()
    (tmp_path / "tokenizer.json").write_text(tok.to_str())
    engine = Engine("plans/qwen3_omni_tiny_cpu.plan", random_weights=True, tokenizer=tmp_path)
    assert engine.host.audio_end == tok.token_to_id("<|audio_end|>") != 512 - 6


def test_video_times_are_the_tokenizers():
    from examples.make_tiny_checkpoint import build_tokenizer
    from graphc.source import load_model

    src = load_model("models/qwen3_5.py", "tiny")
    host = src.module.host(src.model, None)
    assert host.timestamp_ids is None
    tok = build_tokenizer()
    host.use_tokenizer(tok)
    assert host.timestamp_ids("<0.5 seconds>") == tok.encode("<0.5 seconds>", add_special_tokens=False).ids


def test_synthetic_tokenizer_of_the_tiny_plan(tiny_tok):
    tok = Tokenizer.from_file(f"{tiny_tok}/tokenizer.json")
    ids = {t: tok.token_to_id(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "system", "user", "assistant")}
    assert sorted(ids.values()) == list(range(506, 512))       # the top of its 512 ids, nothing else there
    assert max(tok.get_vocab(with_added_tokens=True).values()) == 511
    config = json.loads(open(f"{tiny_tok}/tokenizer_config.json").read())
    from examples.make_tiny_checkpoint import TEMPLATE
    assert config["chat_template"] == TEMPLATE and config["eos_token"] == "<|im_end|>"


def test_graphc_run_random_weights_tokenizer_offline(tmp_path, tiny_tok):
    from graphc.cli import main

    messages = [{"role": "user", "content": "hello world"}]
    (tmp_path / "in.jsonl").write_text(json.dumps({"id": "a", "messages": messages, "max_tokens": 3}) + "\n")
    assert main(["run", "plans/tiny_cpu.plan", "--random-weights", "--tokenizer", tiny_tok, "--requests",
                 str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "out.jsonl"), "-q"]) == 0
    out = json.loads((tmp_path / "out.jsonl").read_text())
    want = hf(tiny_tok).apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert out["prompt_tokens"] == len(want) and isinstance(out["text"], str) and len(out["token_ids"]) == 3
