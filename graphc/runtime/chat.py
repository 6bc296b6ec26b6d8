"""The engine's tokenizer and chat template, read as HF reads them, without transformers.

They come from one folder (text_folder): graphc run --tokenizer DIR, else the checkpoint when it holds
tokenizer.json; everything that tokenizes or renders (the chat routes, /tokenize, realtime sessions,
transcription, the model's host) reads the Engine's, loaded from there. The tokenizer is tokenizer.json through the `tokenizers` library. The chat template is the first of
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


def _special(folder: str | Path | None) -> dict[str, str | None]:
    """The special tokens of a text folder's tokenizer_config.json, as templates see them."""
    config = _tokenizer_config(Path(folder)) if folder is not None else {}
    return {k: _token_text(config.get(k)) for k in SPECIAL_KEYS}


SPECIAL_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token", "sep_token", "cls_token", "mask_token")


def text_folder(checkpoint: str | Path | None, tokenizer: str | Path | None) -> Path | None:
    """The one folder the engine's tokenizer and chat template come from: `tokenizer` (graphc run --tokenizer
    DIR) when given, which must hold tokenizer.json; else the checkpoint when it holds tokenizer.json; else None
    (the engine serves token ids only)."""
    if tokenizer is not None:
        d = Path(tokenizer)
        if not (d / "tokenizer.json").is_file():
            raise InvalidInput(f"--tokenizer {d}: {d / 'tokenizer.json'} is not there",
                               "the engine tokenizes with DIR/tokenizer.json and renders chat requests with DIR's "
                               "chat template (chat_template.jinja, chat_template.json or tokenizer_config.json)",
                               "point --tokenizer at a folder holding the model's tokenizer.json, or write one for a "
                               "plan with examples/tools/synthetic_tokenizer.py PLAN DIR")
        return d
    if checkpoint is not None and (Path(checkpoint) / "tokenizer.json").is_file():
        return Path(checkpoint)
    return None


def load_text(folder: Path | None, given: "ChatTemplate | None" = None):
    """(tokenizer, chat template) of a text_folder, each None where it has none; given: the --chat-template."""
    if folder is None:
        return None, None
    tokenizer = load_tokenizer(folder)
    if given is not None:
        return tokenizer, given
    try:
        return tokenizer, ChatTemplate.from_folder(folder)
    except InvalidInput:
        return tokenizer, None


def check_vocabulary(tokenizer, rows: int, folder: Path) -> None:
    """Refuse a tokenizer with an id at or past the LLM's `rows` vocabulary rows (its embedding and logits)."""
    top = max(tokenizer.get_vocab(with_added_tokens=True).values(), default=-1)
    if top >= rows:
        raise InvalidInput(f"the tokenizer in {folder} has ids up to {top:,}, and the plan's LLM has {rows:,} "
                           "vocabulary rows", "every token id indexes a row of the LLM's embedding and logits",
                           "use the model's own tokenizer, or write one for this plan with "
                           "examples/tools/synthetic_tokenizer.py PLAN DIR")


def load_tokenizer(folder: str | Path):
    """folder/tokenizer.json through `tokenizers`."""
    from tokenizers import Tokenizer

    path = Path(folder) / "tokenizer.json"
    if not path.is_file():
        raise InvalidInput(f"{path} is not there", "the engine tokenizes with the text folder's tokenizer.json",
                           "point --checkpoint or --tokenizer at a directory holding the model's tokenizer files")
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
        self.texts = dict(named)                # every template's text by name

    @classmethod
    def given(cls, template: str, folder: str | Path | None) -> "ChatTemplate":
        """graphc run --chat-template: a file's text, or the template itself; the text folder's special tokens."""
        path = Path(template) if len(template) < 4096 and "{" not in template else None
        if path is not None and not path.is_file():
            raise InvalidInput(f"--chat-template {template}: no such file", "it is read as a file unless it holds "
                               "a '{' (then it is the template)", "name a .jinja file, or pass the template's text")
        return cls(path.read_text() if path is not None else template, _special(folder))

    @classmethod
    def from_folder(cls, folder: str | Path) -> "ChatTemplate":
        """The template of a text folder (a checkpoint, or graphc run --tokenizer DIR)."""
        d = Path(folder)
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
            raise InvalidInput(f"{d} has no chat template", "chat requests are rendered with the text folder's template "
                               "(chat_template.jinja, chat_template.json or tokenizer_config.json)",
                               "use a tokenizer folder that ships one, or send prompt_token_ids to /v1/completions")
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
