"""The Realtime protocol's two dialects on the wire: OpenAI's GA event names and session shape (the default),
or the beta ones (a connection whose upgrade carries `OpenAI-Beta: realtime=v1`). One connection speaks one.

The server works in GA terms; `Wire` renames what it sends and reads the beta session and response fields
into GA ones:
  beta events      response.audio.* / response.audio_transcript.* / response.text.* for GA's
                   response.output_audio.* / response.output_audio_transcript.* / response.output_text.*;
                   a transcription session's session.created / session.updated as transcription_session.*
  beta fields      modalities ["text", "audio"] (GA output_modalities ["audio"]), voice, input_audio_format,
                   output_audio_format ("pcm16": GA's {type: audio/pcm, rate: 24000}), turn_detection,
                   input_audio_transcription, input_audio_noise_reduction, speed, max_response_output_tokens
  item content     an assistant's "text" / "audio" parts (GA "output_text" / "output_audio")
"""
from __future__ import annotations

import json
import uuid

BETA_HEADER = "realtime=v1"
BETA_EVENTS = {
    "response.output_audio.delta": "response.audio.delta",
    "response.output_audio.done": "response.audio.done",
    "response.output_audio_transcript.delta": "response.audio_transcript.delta",
    "response.output_audio_transcript.done": "response.audio_transcript.done",
    "response.output_text.delta": "response.text.delta",
    "response.output_text.done": "response.text.done",
}
BETA_TRANSCRIPTION_EVENTS = {"session.created": "transcription_session.created",
                             "session.updated": "transcription_session.updated"}
PCM = {"type": "audio/pcm", "rate": 24000}
# beta field -> GA path in the session (and in response.create's response)
BETA_FIELDS = {
    "voice": ("audio", "output", "voice"),
    "output_audio_format": ("audio", "output", "format"),
    "speed": ("audio", "output", "speed"),
    "input_audio_format": ("audio", "input", "format"),
    "turn_detection": ("audio", "input", "turn_detection"),
    "input_audio_transcription": ("audio", "input", "transcription"),
    "input_audio_noise_reduction": ("audio", "input", "noise_reduction"),
    "max_response_output_tokens": ("max_output_tokens",),
}
BETA_FORMATS = {"pcm16": PCM, "g711_ulaw": {"type": "audio/pcmu"}, "g711_alaw": {"type": "audio/pcma"}}


class ProtocolError(Exception):
    """A frame that cannot be read as a client event: answered with an error event, the session goes on."""

    def __init__(self, message: str, code: str, event_id: str | None = None, param: str | None = None):
        super().__init__(message)
        self.code, self.event_id, self.param = code, event_id, param


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def read_event(text: str) -> dict:
    """A client frame as an event {type, ...}; ProtocolError when it is not one."""
    try:
        event = json.loads(text)
    except (ValueError, RecursionError) as e:       # RecursionError: nested past what the parser follows
        raise ProtocolError(f"the message is not JSON that can be read ({str(e)[:80]}); send one JSON object an "
                            "event", "invalid_json") from None
    if not isinstance(event, dict):
        raise ProtocolError(f"the message is a JSON {type(event).__name__}; send a JSON object {{\"type\": ...}}",
                            "invalid_event")
    eid = event.get("event_id") if isinstance(event.get("event_id"), str) else None
    if not isinstance(event.get("type"), str):
        raise ProtocolError("the event has no type; send {\"type\": \"session.update\", ...}", "invalid_event", eid,
                            "type")
    return event


class Wire:
    """One connection's dialect: beta names and fields, or GA's."""

    def __init__(self, beta: bool):
        self.beta = beta

    def event(self, kind: str, transcription: bool = False, **fields) -> dict:
        """A server event of GA type `kind`, named in this dialect, with a fresh event_id."""
        if self.beta:
            kind = BETA_EVENTS.get(kind, kind)
            if transcription:
                kind = BETA_TRANSCRIPTION_EVENTS.get(kind, kind)
        return {"type": kind, "event_id": new_id("event"), **fields}

    def error(self, message: str, code: str | None = None, event_id: str | None = None, param: str | None = None,
              kind: str = "invalid_request_error") -> dict:
        return self.event("error", error={"type": kind, "code": code, "message": message, "param": param,
                                          "event_id": event_id})

    def content_type(self, kind: str) -> str:
        """An assistant item's content part type: 'text' or 'audio' (beta), 'output_text' or 'output_audio' (GA)."""
        return kind if self.beta else f"output_{kind}"

    def fields_in(self, given: dict) -> dict:
        """A session.update's session (or response.create's response) in GA fields."""
        if not self.beta:
            return given
        out: dict = {}
        for key, value in given.items():
            if key == "modalities":
                out["output_modalities"] = ["audio"] if isinstance(value, list) and "audio" in value else value
            elif key in BETA_FIELDS:
                if key.endswith("_format") and isinstance(value, str):
                    value = BETA_FORMATS.get(value, {"type": value})
                _put(out, BETA_FIELDS[key], value)
            else:
                out[key] = value
        return out

    def session_out(self, session: dict) -> dict:
        """The whole session (GA shape) as this dialect shows it."""
        if not self.beta:
            return session
        audio_in = session.get("audio", {}).get("input", {})
        audio_out = session.get("audio", {}).get("output", {})
        out = {k: v for k, v in session.items() if k not in ("audio", "output_modalities", "max_output_tokens")}
        out |= {"input_audio_format": "pcm16", "turn_detection": audio_in.get("turn_detection"),
                "input_audio_transcription": audio_in.get("transcription"),
                "input_audio_noise_reduction": audio_in.get("noise_reduction")}
        if session.get("type") != "transcription":
            out |= {"modalities": ["text", "audio"] if "audio" in session["output_modalities"] else ["text"],
                    "voice": audio_out.get("voice"), "output_audio_format": "pcm16",
                    "speed": audio_out.get("speed"), "max_response_output_tokens": session.get("max_output_tokens")}
        return out


def _put(out: dict, path: tuple, value) -> None:
    for key in path[:-1]:
        out = out.setdefault(key, {})
    out[path[-1]] = value
