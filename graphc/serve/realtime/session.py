"""A realtime session's configuration: what session.update may set, its defaults, and the update itself.

An update is deep-merged into a copy of the session and the whole is validated before it replaces it, so a
bad update changes nothing and a partial one keeps every field it does not name (turn_detection
{"threshold": 0.6} keeps server VAD on with its other settings); a key set to null sets that field to
null (turn_detection null: manual turns). Unknown keys and values graphc does not serve are refused by
name. The fields (GA names; protocol.py maps the beta ones):

  type                 "realtime" (answers spoken or written) or "transcription" (the input transcribed,
                       no responses)
  instructions         the system turn of every response ("" : none)
  output_modalities    ["audio"] (speech and its transcript; the default when the plan speaks) or ["text"]
  max_output_tokens    the most tokens a response generates, or "inf" (what the plan allows)
  temperature          the text's sampling temperature (0: greedy; null: the sampler's default)
  audio.input          format: 24 kHz pcm16 ({type: audio/pcm, rate: 24000}); transcription {model,
                       language, prompt} or null; turn_detection: server_vad {threshold 0.5,
                       prefix_padding_ms 300, silence_duration_ms 500, create_response true,
                       interrupt_response true} or null; noise_reduction: null
  audio.output         format: 24 kHz pcm16; voice: one of the plan's voices; speed: 1.0
"""
from __future__ import annotations

import copy
from typing import Literal

from pydantic import Field, ValidationError, field_validator

from graphc.errors import InvalidInput
from graphc.strict import Strict

MAX_INSTRUCTIONS = 64 * 1024         # characters


class PcmFormat(Strict):
    type: Literal["audio/pcm"] = "audio/pcm"
    rate: Literal[24000] = 24000


class ServerVad(Strict):
    type: Literal["server_vad"] = "server_vad"
    threshold: float = Field(0.5, ge=0.0, le=1.0)
    prefix_padding_ms: int = Field(300, ge=0, le=10_000)
    silence_duration_ms: int = Field(500, ge=32, le=10_000)     # Silero's window is 32 ms
    create_response: bool = True
    interrupt_response: bool = True
    idle_timeout_ms: None = None


class Transcription(Strict):
    model: str | None = None
    language: str | None = None
    prompt: str | None = None


class AudioInput(Strict):
    format: PcmFormat = PcmFormat()
    transcription: Transcription | None = None
    turn_detection: ServerVad | None = ServerVad()
    noise_reduction: None = None


class AudioOutput(Strict):
    format: PcmFormat = PcmFormat()
    voice: str | None = None
    speed: Literal[1.0] = 1.0


class Audio(Strict):
    input: AudioInput = AudioInput()
    output: AudioOutput = AudioOutput()


class Config(Strict):
    """One session's settings, in GA's shape."""

    type: Literal["realtime", "transcription"] = "realtime"
    object: Literal["realtime.session"] = "realtime.session"
    id: str
    model: str
    instructions: str = Field("", max_length=MAX_INSTRUCTIONS)
    output_modalities: list[Literal["text", "audio"]] = ["audio"]
    max_output_tokens: int | Literal["inf"] = "inf"
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    audio: Audio = Audio()
    tools: list[dict] = Field([], max_length=0)
    tool_choice: Literal["auto", "none"] = "auto"

    @field_validator("output_modalities")
    @classmethod
    def _one_modality(cls, v: list) -> list:
        if len(v) != 1:
            raise ValueError(f"output_modalities {v}: give one, ['audio'] (speech with its transcript) or ['text']")
        return v

    @field_validator("max_output_tokens")
    @classmethod
    def _positive(cls, v):
        if v != "inf" and v < 1:
            raise ValueError(f"max_output_tokens {v}: give 1 or more, or 'inf'")
        return v


FIXED = ("id", "object", "model")       # what an update may not change


def merged(base, update):
    """`update` deep-merged into a copy of `base`: dicts key by key, anything else (null too) replaces."""
    if not isinstance(base, dict) or not isinstance(update, dict):
        return copy.deepcopy(update)
    out = copy.deepcopy(base)
    for key, value in update.items():
        out[key] = merged(base.get(key), value) if isinstance(value, dict) else copy.deepcopy(value)
    return out


def updated(config: Config, update, voices: tuple[str, ...], param: str = "session") -> Config:
    """The session with `update` deep-merged and validated, or InvalidInput naming what is wrong (and the
    session unchanged)."""
    if not isinstance(update, dict):
        raise InvalidInput(f"{param} must be an object", f"got {type(update).__name__}",
                           "send {\"type\": \"session.update\", \"session\": {...}}", param=param)
    for key in FIXED:
        if key in update and update[key] != getattr(config, key):
            raise InvalidInput(f"{param}.{key} cannot change", f"this session's is {getattr(config, key)!r}",
                               f"leave {key} out", param=f"{param}.{key}")
    try:
        out = Config.model_validate(merged(config.model_dump(), update))
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InvalidInput(f"{param}{'.' + where if where else ''}: {first['msg'].removeprefix('Value error, ')}",
                           "", "send values the session takes (docs/realtime.md)",
                           param=f"{param}.{where}" if where else param) from None
    check_voice(out.audio.output.voice, voices, f"{param}.audio.output.voice")
    return out


def check_voice(voice: str | None, voices: tuple[str, ...], param: str) -> None:
    if voice is not None and voices and voice.lower() not in voices:
        raise InvalidInput(f"unknown voice '{voice}'", f"this model speaks with: {', '.join(voices)}",
                           "pick one of those voices", param=param)


def new_config(session_id: str, model: str, voice: str | None, transcription: bool, speaks: bool) -> Config:
    """A new session's settings: the defaults, the plan's default voice (written answers when it does not
    speak), server VAD on."""
    kind = "transcription" if transcription else "realtime"
    audio_in = AudioInput(transcription=Transcription() if transcription else None)
    return Config(id=session_id, model=model, type=kind, output_modalities=["audio" if speaks else "text"],
                  audio=Audio(input=audio_in, output=AudioOutput(voice=voice)))
