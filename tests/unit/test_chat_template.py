"""Chat templates against HF: a tokenizer saved by transformers with a Qwen-Omni-style template is
read back by graphc and by HF's apply_chat_template; the rendered prompts must be equal."""
from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from graphc.errors import InvalidInput
from graphc.runtime.chat import ChatTemplate, load_tokenizer

# shaped like Qwen's: system default, content as a string or a list of parts, media placeholders
TEMPLATE = """{% set audio_count = namespace(value=0) %}{% for message in messages %}{% if loop.first and message['role'] != 'system' %}<|im_start|>system
You are a helpful assistant.<|im_end|>
{% endif %}<|im_start|>{{ message['role'] }}
{% if message['content'] is string %}{{ message['content'] }}<|im_end|>
{% else %}{% for content in message['content'] %}{% if content['type'] == 'audio' or 'audio' in content %}{% set audio_count.value = audio_count.value + 1 %}<|audio_start|><|audio_pad|><|audio_end|>{% elif content['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>{% elif content['type'] == 'text' %}{{ content['text'] }}{% else %}{{ raise_exception('unknown part ' + content['type']) }}{% endif %}{% endfor %}<|im_end|>
{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}{% if tools %}{{ tools | tojson }}{% endif %}{{ eos_token }}"""

MESSAGES = [
    [{"role": "user", "content": "Grüße, 日本?"}],
    [{"role": "system", "content": "Be brief."},
     {"role": "user", "content": [{"type": "audio", "audio": "a.wav"}, {"type": "text", "text": "What is said?"}]},
     {"role": "assistant", "content": "Hello."},
     {"role": "user", "content": [{"type": "image", "image": "x.png"}, {"type": "text", "text": "And here?"}]}],
]


def save(tmp_path, template_where: str):
    tok = Tokenizer(models.WordLevel({"<unk>": 0, "hi": 1, "<|im_end|>": 2}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", unk_token="<unk>")
    hf.chat_template = TEMPLATE
    hf.save_pretrained(tmp_path)
    # transformers writes chat_template.jinja; move the template where the case wants it
    jinja = tmp_path / "chat_template.jinja"
    cfg_path = tmp_path / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    if template_where != "jinja" and jinja.is_file():
        jinja.unlink()
        if template_where == "config":
            cfg["chat_template"] = TEMPLATE
        elif template_where == "config-list":
            cfg["chat_template"] = [{"name": "tool_use", "template": "tools: {{ tools | tojson }}"},
                                    {"name": "default", "template": TEMPLATE}]
        cfg_path.write_text(json.dumps(cfg))
    return PreTrainedTokenizerFast.from_pretrained(tmp_path)


@pytest.mark.parametrize("where", ["jinja", "config", "config-list"])
@pytest.mark.parametrize("gen", [True, False])
def test_rendered_prompts_equal_hf(tmp_path, where, gen):
    hf = save(tmp_path, where)
    ours = ChatTemplate.from_folder(tmp_path)
    for messages in MESSAGES:
        want = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
        assert ours.render(messages, add_generation_prompt=gen) == want
    tools = [{"name": "f", "description": "é"}]
    assert ours.render(MESSAGES[0], tools=tools) == hf.apply_chat_template(
        MESSAGES[0], tokenize=False, add_generation_prompt=True, tools=tools)


def test_a_default_is_needed_among_named_templates():
    with pytest.raises(InvalidInput, match=r"\['tool_use'\] have no 'default'"):
        ChatTemplate({"tool_use": "x"})


def test_the_tokenizer_loads_from_tokenizer_json(tmp_path):
    save(tmp_path, "jinja")
    assert load_tokenizer(tmp_path).encode("hi").ids == [1]


def test_what_the_template_refuses_is_an_error_with_its_message(tmp_path):
    save(tmp_path, "jinja")
    with pytest.raises(InvalidInput, match="refused the messages: unknown part video"):
        ChatTemplate.from_folder(tmp_path).render([{"role": "user", "content": [{"type": "video"}]}])


def test_missing_template_and_tokenizer_are_named(tmp_path):
    with pytest.raises(InvalidInput, match="has no chat template"):
        ChatTemplate.from_folder(tmp_path)
    with pytest.raises(InvalidInput, match="tokenizer.json is not there"):
        load_tokenizer(tmp_path)
    with pytest.raises(InvalidInput, match="does not parse"):
        ChatTemplate("{% if %}")


def test_the_sandbox_holds():
    with pytest.raises(Exception, match="unsafe|access"):
        ChatTemplate("{{ ''.__class__.__mro__[1].__subclasses__() }}").render([])


INDENTED = """{%- for message in messages %}
    {% if message.role == "user" %}
    <|im_start|>user
{{ message.content }}<|im_end|>
    {% endif %}
{% endfor %}
  {% if add_generation_prompt %}
<|im_start|>assistant
  {% endif %}"""


def test_indented_block_tags_render_as_hf(tmp_path):
    # whitespace before a block tag at the start of a line goes (lstrip_blocks), as does the newline after it
    hf = save(tmp_path, "jinja")
    hf.chat_template = INDENTED
    hf.save_pretrained(tmp_path)
    hf = PreTrainedTokenizerFast.from_pretrained(tmp_path)
    messages = [{"role": "user", "content": "hi"}, {"role": "user", "content": "hi again"}]
    want = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert ChatTemplate.from_folder(tmp_path).render(messages) == want


def test_a_developer_message_is_a_system_message_and_tool_results_pass_through():
    """OpenAI's roles: developer renders as system (the templates know system), tool is kept for the template."""
    from graphc.runtime.inputs import split_messages

    sent = [{"role": "developer", "content": "be brief"}, {"role": "user", "content": "hi"},
            {"role": "tool", "content": "42", "tool_call_id": "call_1"}]
    out, media = split_messages(sent)
    assert [m["role"] for m in out] == ["system", "user", "tool"] and media == []
    assert sent[0]["role"] == "developer"                      # the caller's list is left as it was
    with pytest.raises(InvalidInput, match="'wizard' is not a chat role"):
        split_messages([{"role": "wizard", "content": "x"}])


def test_a_variable_of_the_wrong_kind_is_a_refusal_not_a_crash():
    """A chat_template_kwargs value of the wrong kind (here tools, as a number): the render's
    TypeError comes back as InvalidInput (a 400), not as a server error."""
    t = ChatTemplate("{% if messages | length > 5 %}{{ raise_exception('too many') }}{% endif %}{{ tools | length }}")
    with pytest.raises(InvalidInput, match="the chat template failed on this request: TypeError"):
        t.render([{"role": "user", "content": "x"}], variables={"tools": 5})
