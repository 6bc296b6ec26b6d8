"""The JSON request bodies of the server's routes, as OpenAI's API takes them.

Every body is strict: a field that is not declared here is refused (400, naming it), and so is a value of
another JSON type than the field's (true for a number, 1 for a boolean, "2" for an integer). graphc's own fields
beside OpenAI's: the sampling knobs SamplingParams takes (top_k, min_p, repetition_penalty,
stop_token_ids, ignore_eos, prompt_logprobs), max_frames and seed on speech, use_audio_in_video on chat. Chat's
tools and tool_choice are checked beyond their shapes (unique names, schemas, a named choice declared) in
graphc/serve/tools.py. response_format (chat and completions) becomes the request's guide
(graphc/runtime/grammar.py).
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from graphc.runtime.grammar import Guide
from graphc.runtime.sampler import MAX_TOP_LOGPROBS, SamplingParams

JSON_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/audio/speech", "/tokenize",
               "/detokenize")                                          # the routes whose body is JSON


class StreamOptions(BaseModel):
    """stream_options: include_usage (a last chunk with the usage), continuous_usage_stats (vLLM's: every
    chunk carries the usage so far)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    include_usage: bool = False
    continuous_usage_stats: bool = False


class JSONSchemaSpec(BaseModel):
    """response_format's json_schema: OpenAI's name, description, schema and strict (the output always
    follows the schema, keys it does not declare refused, strict or not)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, strict=True)
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    json_schema: dict[str, Any] = Field(default_factory=dict, alias="schema")   # {}: any JSON value
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """OpenAI's response_format: text (no guide), json_object, or json_schema with its json_schema."""

    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaSpec | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self) -> "ResponseFormat":
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError(f"type {self.type!r} " + ("takes json_schema {name, schema}" if self.type == "json_schema"
                                                        else "takes no json_schema (that is type 'json_schema')"))
        return self

    def guide(self) -> Guide | None:
        if self.type == "text":
            return None
        if self.type == "json_object":
            return Guide(kind="json_object")
        return Guide(kind="json_schema", json_schema=self.json_schema.json_schema)


class Body(BaseModel):
    """What chat and completion requests share: the model's name, sampling, stop, streaming."""

    model_config = ConfigDict(extra="forbid", strict=True)
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0, le=1)
    repetition_penalty: float | None = Field(None, gt=0)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    seed: int | None = Field(None, ge=0)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1)
    user: str | None = None
    logit_bias: dict[str, float] | None = None     # token id (as text, OpenAI's keys) -> bias, clamped to +-100
    prompt_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)   # each prompt token's (vLLM's field)
    response_format: ResponseFormat | None = None

    def params(self, **extra) -> SamplingParams:
        """The engine's SamplingParams of the fields sent, with `extra` over them."""
        given = {k: v for k, v in self.model_dump(exclude_unset=True, exclude={"logprobs", "top_logprobs"}).items()
                 if k in SamplingParams.model_fields}
        if isinstance(given.get("stop"), str):
            given["stop"] = [given["stop"]]
        if self.response_format is not None:
            given["guide"] = self.response_format.guide()
        return SamplingParams(**(given | extra))        # max_completion_tokens over a max_tokens sent as null


class AudioOut(BaseModel):
    """OpenAI's audio {voice, format}; max_frames (graphc's): the most codec frames (12.5 a second)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    voice: str
    format: str = "wav"
    max_frames: int | None = Field(None, ge=1)


class FunctionDef(BaseModel):
    """A tool's function: its name, what it does, its arguments as a JSON schema of an object."""

    model_config = ConfigDict(extra="forbid", strict=True)
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(BaseModel):
    """One of chat's tools, OpenAI's {"type": "function", "function": {...}}."""

    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["function"]
    function: FunctionDef


class FunctionName(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    name: str


class NamedToolChoice(BaseModel):
    """tool_choice naming the function that must be called."""

    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["function"]
    function: FunctionName


class ChatBody(Body):
    """POST /v1/chat/completions."""

    messages: list[dict[str, Any]]
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    modalities: list[Literal["text", "audio"]] | None = None
    audio: AudioOut | None = None
    use_audio_in_video: bool = False          # hear each video's own sound track (where the model takes it)
    chat_template_kwargs: dict[str, Any] | None = None    # the template's own variables (enable_thinking, ...)
    chat_template: str | None = None          # the request's own template: refused unless --trust-request-chat-template
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None   # auto when tools are sent
    parallel_tool_calls: bool = True


class CompletionBody(Body):
    """POST /v1/completions: a text prompt or its token ids, or a batch of either (each prompt's n choices in
    turn: choice index = prompt index x n + its own)."""

    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool = False                        # the prompt first in each choice's text (and logprobs)


class SpeechBody(BaseModel):
    """POST /v1/audio/speech: OpenAI's fields (speed other than 1 is refused: the model speaks at its own
    pace), and graphc's seed (the speech stage's draws) and max_frames (the most codec frames, 12.5 a
    second)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    model: str | None = None
    input: str = Field(min_length=1, max_length=4096)
    voice: str
    instructions: str | None = None
    response_format: str = "mp3"
    speed: float = Field(1.0, ge=0.25, le=4.0)
    stream_format: Literal["audio", "sse"] = "audio"
    seed: int | None = Field(None, ge=0)
    max_frames: int | None = Field(None, ge=1)
