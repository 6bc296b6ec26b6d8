"""The tokenizer's routes, as vLLM serves them (issue 38):

  POST /tokenize        {prompt} or {messages, add_generation_prompt, chat_template_kwargs, tools}: the token
                        ids the engine would run, their count and max_model_len (the most rows a request
                        holds); `return_token_strs` adds each id's text. Messages render through the chat
                        template as chat requests do; media parts are refused (their rows depend on the
                        media: send the chat request); tools are checked and rendered as chat renders them
                        with tool_choice auto. `add_special_tokens` may be false (what the engine does: text
                        is encoded without the tokenizer's added special tokens); true is refused, since
                        those ids would not be the ones run
  POST /detokenize      {tokens}: their text (ids outside the tokenizer's vocabulary are a 400)
  GET  /tokenizer_info  the tokenizer's vocabulary size, special tokens, chat template and max_model_len

A server without a tokenizer (--random-weights without --tokenizer) answers each with a 400 that says so.
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from graphc.errors import InvalidInput
from graphc.runtime.inputs import split_messages
from graphc.serve.context import Context
from graphc.serve.errors import error, wrong_model
from graphc.serve.schemas import Tool
from graphc.serve.tools import check as check_tools, variables


class TokenizeBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    model: str | None = None
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[Tool] | None = None
    return_token_strs: bool = False
    add_special_tokens: bool = False


class DetokenizeBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    model: str | None = None
    tokens: list[int] = Field(min_length=0)


def _tokenizer(ctx: Context):
    tok = ctx.engine.tokenizer
    if tok is None:
        raise InvalidInput("this server has no tokenizer", "it was started without a tokenizer.json",
                           "start graphc run with --tokenizer DIR (or --checkpoint DIR) holding tokenizer.json")
    return tok


def _media_parts(messages: list) -> list:
    """The type of every content part that is not text (checked before split_messages would decode it)."""
    parts = [p for m in messages if isinstance(m, dict) and isinstance(m.get("content"), list) for p in m["content"]]
    return [p.get("type") if isinstance(p, dict) else p for p in parts
            if not (isinstance(p, dict) and p.get("type") == "text")]


def tokenize(ctx: Context, body: TokenizeBody) -> dict:
    tok = _tokenizer(ctx)
    if (body.prompt is None) == (body.messages is None):
        raise InvalidInput("send prompt or messages, one of them", "", "e.g. {\"prompt\": \"hello\"}")
    if body.add_special_tokens:
        raise InvalidInput("add_special_tokens is true", "the engine encodes text without the tokenizer's added "
                           "special tokens, so those ids would not be the ones a request runs",
                           "send false or leave it out")
    media = _media_parts(body.messages or [])
    if media:
        raise InvalidInput(f"{len(media)} media part(s) in the messages ({', '.join(map(str, media[:4]))})",
                           "how many rows a media item takes depends on the item, which /tokenize does not decode",
                           "tokenize the text alone, or send the chat request (its usage counts every row)")
    messages = split_messages(body.messages)[0] if body.messages is not None else None
    if body.tools and messages is None:
        raise InvalidInput("tools with a prompt", "tools are rendered by the chat template", "send messages")
    kwargs = variables(body.chat_template_kwargs, check_tools(body.tools, None))
    ids = ctx.engine.tokenize(messages, body.prompt, kwargs, body.add_generation_prompt)
    out = {"count": len(ids), "max_model_len": ctx.engine.max_seq_len, "tokens": ids}
    if body.return_token_strs:
        out["token_strs"] = [tok.id_to_token(i) for i in ids]
    return out


def detokenize(ctx: Context, body: DetokenizeBody) -> dict:
    tok = _tokenizer(ctx)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    bad = [t for t in body.tokens if not 0 <= t < vocab]
    if bad:
        raise InvalidInput(f"tokens {bad[:4]} are outside the vocabulary", f"the tokenizer has {vocab:,} ids",
                           "send ids from /tokenize")
    return {"prompt": tok.decode(body.tokens, skip_special_tokens=False)}


def tokenizer_info(ctx: Context) -> dict:
    tok = _tokenizer(ctx)
    template = ctx.engine.template
    special = {k: v for k, v in (template.special if template is not None else {}).items() if v is not None}
    return {"vocab_size": tok.get_vocab_size(with_added_tokens=True), "max_model_len": ctx.engine.max_seq_len,
            **special, "chat_template": template.source if template is not None else None}


def register(app, ctx: Context) -> None:
    def answer(fn, body):
        bad = wrong_model(getattr(body, "model", None), ctx.names)
        if bad is not None:
            return bad
        try:
            return fn(ctx, body)
        except InvalidInput as e:
            return error(400, str(e))

    @app.post("/tokenize")
    def tokenize_route(body: TokenizeBody):
        """The token ids of a prompt or of chat messages as the chat template renders them."""
        return answer(tokenize, body)

    @app.post("/detokenize")
    def detokenize_route(body: DetokenizeBody):
        """The text of token ids."""
        return answer(detokenize, body)

    @app.get("/tokenizer_info")
    def tokenizer_info_route():
        """The tokenizer's vocabulary size, special tokens, chat template and max_model_len."""
        return answer(lambda c, _: tokenizer_info(c), None)
