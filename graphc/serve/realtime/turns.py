"""Responses: one engine request each, generated from the conversation and streamed as the protocol's events.

A response is announced (response.created, its output item and content part added), then streams the
answer as it comes: speech as output audio deltas (24 kHz pcm16) with its transcript's deltas, or text
deltas; then the done events and response.done with its status (completed; incomplete with reason
max_output_tokens; failed with the error). Cancelled (response.cancel, or speech that starts while it
speaks), its engine request is aborted at once (the LLM's and the speech stages' pages freed) and
response.done (cancelled, client_cancelled or turn_detected) is the last event it sends.

Per-response overrides (response.create's response): instructions, output_modalities, max_output_tokens,
temperature, audio.output.voice, metadata, conversation "auto" (the answer joins the conversation) or
"none" (out of band), and input: items to answer instead of the conversation.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from graphc.errors import InvalidInput
from graphc.runtime.sampler import SamplingParams
from graphc.runtime.speech import SpeechParams
from graphc.serve.realtime.audio import WIRE_RATE, Resampler, encode_pcm16
from graphc.serve.realtime.conversation import Item, Part, messages
from graphc.serve.realtime.items import show_item
from graphc.serve.realtime.protocol import new_id
from graphc.serve.realtime.session import Config, updated

OPTION_KEYS = {"instructions", "output_modalities", "max_output_tokens", "temperature", "audio", "metadata",
               "conversation", "input"}


@dataclass
class Options:
    instructions: str
    modality: str                       # 'audio' or 'text'
    max_tokens: int | None
    temperature: float | None
    voice: str | None
    metadata: dict | None = None
    conversation: bool = True           # the answer joins the conversation
    input: list[Item] | None = None     # items to answer instead of the conversation


def options(given, config: Config, voices: tuple[str, ...], read_item) -> Options:
    """response.create's response (GA fields) over the session's settings; InvalidInput naming what is wrong."""
    given = given or {}
    if not isinstance(given, dict):
        raise InvalidInput("response must be an object", "", "", param="response")
    for key in given:
        if key not in OPTION_KEYS:
            raise InvalidInput(f"unknown key '{key}' in response", f"taken: {', '.join(sorted(OPTION_KEYS))}",
                               f"leave '{key}' out", param=f"response.{key}")
    picked = {k: given[k] for k in ("instructions", "output_modalities", "max_output_tokens", "temperature")
              if k in given}
    audio = given.get("audio")
    if audio is not None:
        picked["audio"] = {"output": (audio or {}).get("output") or {}}
    merged = updated(config, picked, voices, param="response")
    if merged.output_modalities == ["audio"] and not voices:
        raise InvalidInput("this plan does not speak: output_modalities ['audio'] is not served", "",
                           "ask for output_modalities ['text']", param="response.output_modalities")
    conv = given.get("conversation", "auto")
    if conv not in ("auto", "none"):
        raise InvalidInput(f"response.conversation {conv!r}", "'auto' (the default conversation) or 'none'", "",
                           param="response.conversation")
    meta = given.get("metadata")
    if meta is not None and (not isinstance(meta, dict) or len(meta) > 16 or not all(
            isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512 for k, v in meta.items())):
        raise InvalidInput("response.metadata must map at most 16 keys (64 characters) to strings (512)",
                           f"got {str(meta)[:60]}", "", param="response.metadata")
    items = given.get("input")
    if items is not None and not isinstance(items, list):
        raise InvalidInput("response.input must be a list of items", "", "", param="response.input")
    return Options(merged.instructions, merged.output_modalities[0],
                   None if merged.max_output_tokens == "inf" else merged.max_output_tokens, merged.temperature,
                   merged.audio.output.voice, given.get("metadata"), conv == "auto",
                   [read_item(i) for i in items] if items is not None else None)


@dataclass
class Response:
    """One response of a session (conn: the Connection it streams on)."""
    conn: object
    opts: Options
    since: float | None = None          # when the speech it answers stopped (perf_counter), for /metrics
    id: str = field(default_factory=lambda: new_id("resp"))
    task: asyncio.Task | None = None
    cancelled: str | None = None        # why it was cancelled
    req: object = None
    item: Item | None = None
    text: str = ""

    def shape(self, status: str, details: dict | None = None, usage: dict | None = None) -> dict:
        out = [show_item(self.item, self.conn.wire)] if self.item is not None and status != "in_progress" else []
        shape = {"id": self.id, "object": "realtime.response", "status": status, "status_details": details,
                 "output": out, "conversation_id": self.conn.conversation_id if self.opts.conversation else None,
                 "output_modalities": [self.opts.modality], "max_output_tokens": self.opts.max_tokens or "inf",
                 "metadata": self.opts.metadata, "usage": usage}
        if self.opts.modality == "audio":
            shape["audio"] = {"output": {"format": {"type": "audio/pcm", "rate": WIRE_RATE},
                                         "voice": self.opts.voice}}
        return shape

    def send(self, kind: str, **fields) -> None:
        self.conn.send(self.conn.wire.event(kind, **fields))

    def ids(self) -> dict:
        return {"response_id": self.id, "item_id": self.item.id, "output_index": 0, "content_index": 0}

    def start(self) -> None:
        """Announce the response and start generating it."""
        self._announce()
        self.task = asyncio.create_task(self.run())

    async def run(self) -> None:
        try:
            await self._run()
        except asyncio.CancelledError:
            self.end_cancelled()
        finally:
            self._abort()
            self.conn.response_ended(self)

    def end_cancelled(self) -> None:
        """Abort its engine request; response.done (cancelled) is the last event it sends."""
        self._abort()
        self.item.status = "incomplete"
        self.send("response.done", response=self.shape(
            "cancelled", {"type": "cancelled", "reason": self.cancelled or "client_cancelled"}))
        self.conn.response_ended(self)

    def _abort(self) -> None:
        """Abort its engine request (its id is the response's) unless it has closed."""
        if self.req is None or not self.req.closed:
            self.conn.ctx.driver.abort(self.id)

    def _announce(self) -> None:
        self.send("response.created", response=self.shape("in_progress"))
        kind = self.opts.modality
        self.item = Item(new_id("item"), "assistant", [Part(kind, "")], status="in_progress")
        self.send("response.output_item.added", response_id=self.id, output_index=0,
                  item=show_item(self.item, self.conn.wire))
        if self.opts.conversation:
            before = self.conn.conversation.add(self.item)
            self.send("conversation.item.created", previous_item_id=before, item=show_item(self.item, self.conn.wire))
        part = {"type": kind, "transcript": ""} if kind == "audio" else {"type": "text", "text": ""}
        self.send("response.content_part.added", **self.ids(), part=part)

    def _request(self) -> dict:
        conn, opts = self.conn, self.opts
        items = opts.input if opts.input is not None else [i for i in conn.conversation.items if i is not self.item]
        msgs, media = messages(items, opts.instructions, conn.audio_budget_s)
        params = SamplingParams(max_tokens=opts.max_tokens,
                                **({"temperature": opts.temperature} if opts.temperature is not None else {}))
        speech = SpeechParams(voice=opts.voice) if opts.modality == "audio" else None
        return dict(messages=msgs, media=media, split=True, params=params, request_id=self.id, speech=speech)

    async def _run(self) -> None:
        started, bad = await self.conn.ctx.submit(self._request())
        if bad is not None:
            import json
            err = json.loads(bad.body)["error"]
            return self._failed(err["message"], err.get("code"))
        self.req, events = started
        await self._stream(events)
        req = self.req
        if req.error:
            return self._failed(req.error, None)
        self._finish("incomplete" if req.finish_reason == "length" else "completed")

    async def _stream(self, events) -> None:
        audio = self.opts.modality == "audio"
        rate = self.conn.ctx.engine.sample_rate or WIRE_RATE
        resample = Resampler(rate, WIRE_RATE)
        part = self.item.parts[0]
        while True:
            ev = await events.get()
            if ev.text:
                self.text += ev.text
                part.text = self.text
                self.send("response.output_audio_transcript.delta" if audio else "response.output_text.delta",
                          **self.ids(), delta=ev.text)
            if audio and (ev.audio is not None and len(ev.audio) or ev.finished):
                self._audio(resample(ev.audio if ev.audio is not None else [], last=ev.finished))
            if ev.finished:
                return

    def _audio(self, samples) -> None:
        if not len(samples):
            return
        part = self.item.parts[0]
        if part.spoken == 0 and self.since is not None:
            self.conn.metrics.first_audio(self.since, time.perf_counter(), self.req.times)
        part.spoken += len(samples)
        self.send("response.output_audio.delta", **self.ids(), delta=encode_pcm16(samples))

    def _finish(self, status: str) -> None:
        self.item.status = "completed" if status == "completed" else "incomplete"
        if self.opts.modality == "audio":
            self.send("response.output_audio.done", **self.ids())
            self.send("response.output_audio_transcript.done", **self.ids(), transcript=self.text)
            part = {"type": "audio", "transcript": self.text}
        else:
            self.send("response.output_text.done", **self.ids(), text=self.text)
            part = {"type": "text", "text": self.text}
        self.send("response.content_part.done", **self.ids(), part=part)
        self.send("response.output_item.done", response_id=self.id, output_index=0,
                  item=show_item(self.item, self.conn.wire))
        details = {"type": "incomplete", "reason": "max_output_tokens"} if status == "incomplete" else None
        self.send("response.done", response=self.shape(status, details, usage(self.req)))

    def _failed(self, message: str, code: str | None) -> None:
        self.item.status = "incomplete"
        self.send("response.done", response=self.shape(
            "failed", {"type": "failed", "error": {"type": "server_error", "code": code, "message": message}}))


def usage(req) -> dict:
    """Tokens in (audio rows apart) and out (codec frames as audio tokens)."""
    audio_in = sum(len(p.rows) for m in req.prompt.media for p in m.pieces if m.kind == "audio")
    n_in, text_out = len(req.prompt.ids), len(req.output)
    audio_out = len(req.speech.frames) if req.speech is not None else 0
    return {"total_tokens": n_in + text_out + audio_out, "input_tokens": n_in, "output_tokens": text_out + audio_out,
            "input_token_details": {"text_tokens": n_in - audio_in, "audio_tokens": audio_in},
            "output_token_details": {"text_tokens": text_out, "audio_tokens": audio_out}}
