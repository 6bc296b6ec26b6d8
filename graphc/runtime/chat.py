"""A checkpoint's tokenizer and chat template, read as HF reads them, without transformers.

The tokenizer is tokenizer.json through the `tokenizers` library. The chat template is the first of
chat_template.jinja, chat_template.json and tokenizer_config.json's "chat_template" (a name ->
template list takes "default", or "tool_use" for a request with tools, as HF does), rendered in a sandboxed jinja2 environment with HF's settings
(trim_blocks, lstrip_blocks, loop controls, a tojson that keeps non-ASCII, raise_exception and
strftime_now), with the special tokens of tokenizer_config.json in scope.
"""
from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from graphc.errors import InvalidInput

def _tokenizer_config(d: Path) -> dict:
    return json.loads((d / "tokenizer_config.json").read_text()) if (d / "tokenizer_config.json").is_file() else {}


def _special(checkpoint: str | Path | None) -> dict[str, str | None]:
    """The special tokens of a checkpoint's tokenizer_config.json, as templates see them."""
    config = _tokenizer_config(Path(checkpoint)) if checkpoint is not None else {}
    return {k: _token_text(config.get(k)) for k in SPECIAL_KEYS}


SPECIAL_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token", "sep_token", "cls_token", "mask_token")


def load_tokenizer(checkpoint: str | Path):
    from tokenizers import Tokenizer

    path = Path(checkpoint) / "tokenizer.json"
    if not path.is_file():
        raise InvalidInput(f"{path} is not there", "the engine tokenizes with the checkpoint's tokenizer.json",
                           "point --checkpoint at a directory holding the model's tokenizer files")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:
        raise InvalidInput(f"{path} does not load: {e}", "", "use the tokenizer.json the model was released with") from e


def _token_text(v: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    return v.get("content") if isinstance(v, dict) else v


class ChatTemplate:
    def __init__(self, source: str | dict[str, str], special: dict[str, str | None] | None = None):
        import jinja2
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise jinja2.exceptions.TemplateError(message)

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        named = source if isinstance(source, dict) else {"default": source}
        if "default" not in named:
            raise InvalidInput(f"the chat templates {sorted(named)} have no 'default'", "",
                               "name the template for plain chat 'default'")
        try:
            self.templates = {name: env.from_string(text) for name, text in named.items()}
        except jinja2.TemplateSyntaxError as e:
            raise InvalidInput(f"the chat template does not parse: {e.message} (line {e.lineno})", "",
                               "use the template the model was released with") from e
        self.special = dict(special or {})
        self.source = named["default"]          # the plain chat template's text (/tokenizer_info shows it)

    @classmethod
    def given(cls, template: str, checkpoint: str | Path | None) -> "ChatTemplate":
        """graphc run --chat-template: a file's text, or the template itself; the checkpoint's special tokens."""
        path = Path(template) if len(template) < 4096 and "{" not in template else None
        if path is not None and not path.is_file():
            raise InvalidInput(f"--chat-template {template}: no such file", "it is read as a file unless it holds "
                               "a '{' (then it is the template)", "name a .jinja file, or pass the template's text")
        return cls(path.read_text() if path is not None else template, _special(checkpoint))

    @classmethod
    def from_checkpoint(cls, checkpoint: str | Path) -> "ChatTemplate":
        d = Path(checkpoint)
        config = _tokenizer_config(d)
        special = _special(d)
        if (d / "chat_template.jinja").is_file():
            return cls((d / "chat_template.jinja").read_text(), special)
        source = None
        if (d / "chat_template.json").is_file():
            source = json.loads((d / "chat_template.json").read_text()).get("chat_template")
        source = source if source is not None else config.get("chat_template")
        if isinstance(source, list):
            source = {t["name"]: t["template"] for t in source}
        if not isinstance(source, (str, dict)):
            raise InvalidInput(f"{d} has no chat template", "chat requests are rendered with the checkpoint's template "
                               "(chat_template.jinja, chat_template.json or tokenizer_config.json)",
                               "use a checkpoint that ships one, or send prompt_token_ids to /v1/completions")
        return cls(source, special)

    def render(self, messages: list[dict], add_generation_prompt: bool = True, variables: dict | None = None,
               **kwargs: Any) -> str:
        """variables: the template's own variables a request sets (chat_template_kwargs, e.g. enable_thinking)."""
        import jinja2

        kwargs = {**kwargs, **(variables or {})}
        taken = sorted(set(variables or {}) & {"messages", "add_generation_prompt", *self.special})
        if taken:
            raise InvalidInput(f"chat_template_kwargs {taken} are the template's own inputs", "",
                               "send messages and add_generation_prompt as themselves; leave the special tokens")
        template = self.templates.get("tool_use") if kwargs.get("tools") else None
        try:
            return (template or self.templates["default"]).render(
                messages=messages, add_generation_prompt=add_generation_prompt, **self.special, **kwargs)
        except jinja2.exceptions.TemplateError as e:
            raise InvalidInput(f"the chat template refused the messages: {e}", "",
                               "change the messages as the message says") from e
        except (TypeError, ValueError, AttributeError, KeyError, IndexError) as e:    # what the request put in scope
            raise InvalidInput(f"the chat template failed on this request: {type(e).__name__}: {e}",
                               "a message or a chat_template_kwargs value is not of the kind the template reads",
                               "send messages as OpenAI's API has them, and template variables of the kinds it uses") from e
