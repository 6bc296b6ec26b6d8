"""One realtime session on its socket: the client's events read in order and answered, the server's events
written by one writer in the order they were made, the input buffer, server VAD, the conversation and the
response under way.

Client events: session.update (transcription_session.update on a beta transcription session),
input_audio_buffer.append / .commit / .clear, conversation.item.create / .truncate / .delete / .retrieve,
response.create, response.cancel. A bad event gets an `error` event naming what is wrong and the session
goes on; a binary frame ends it (close 1003).
"""
from __future__ import annotations

import asyncio
import json
import logging
import time

from graphc.errors import InvalidInput
from graphc.runtime.media import AUDIO_RATE
from graphc.serve.realtime.audio import WIRE_RATE, Resampler, decode_pcm16
from graphc.serve.realtime.buffer import InputBuffer
from graphc.serve.realtime.conversation import Conversation, audio_item
from graphc.serve.realtime.items import read_item, show_item
from graphc.serve.realtime.protocol import ProtocolError, Wire, new_id, read_event
from graphc.serve.realtime.session import Config, updated
from graphc.serve.realtime.transcribe import check as check_transcription
from graphc.serve.realtime.transcribe import transcribe
from graphc.serve.realtime.turns import Response, options
from graphc.serve.realtime.vad import WINDOW, Vad, vad_pool

log = logging.getLogger("graphc.server")
MIN_COMMIT_MS = 100          # OpenAI's least audio a commit takes
EVENT_KEYS = {
    "session.update": {"session"}, "transcription_session.update": {"session"},
    "input_audio_buffer.append": {"audio"}, "input_audio_buffer.commit": set(), "input_audio_buffer.clear": set(),
    "conversation.item.create": {"item", "previous_item_id"},
    "conversation.item.truncate": {"item_id", "content_index", "audio_end_ms"},
    "conversation.item.delete": {"item_id"}, "conversation.item.retrieve": {"item_id"},
    "response.create": {"response"}, "response.cancel": {"response_id"},
}


class Connection:
    def __init__(self, ws, ctx, wire: Wire, config: Config, metrics, vad_model, idle_s: float, voices: tuple):
        self.ws, self.ctx, self.wire, self.config, self.metrics = ws, ctx, wire, config, metrics
        self.vad_model, self.idle_s, self.voices = vad_model, idle_s, voices
        self.out: asyncio.Queue = asyncio.Queue()
        self.conversation, self.conversation_id = Conversation(), new_id("conv")
        self.buffer, self.resample = InputBuffer(), Resampler(WIRE_RATE, AUDIO_RATE)
        self.max_buffer = int((ctx.limits.audio_seconds or 900.0) * AUDIO_RATE)
        self.audio_budget_s = (ctx.limits.audio_seconds or 900.0) / 2
        self.vad: Vad | None = None
        self.speech_item: str | None = None        # the id the speech under way will commit as
        self.response: Response | None = None
        self.tasks: set[asyncio.Task] = set()      # transcriptions under way
        self._new_vad()

    # ---- the socket
    def send(self, event: dict) -> None:
        self.out.put_nowait(event)

    async def _writer(self) -> None:
        while True:
            event = await self.out.get()
            await self.ws.send_text(json.dumps(event))

    async def run(self) -> None:
        """Serve the session until the client goes, it idles past idle_s, or a frame ends it; then abort
        whatever it still has in the engine."""
        self.send(self._session_event("session.created"))
        writer = asyncio.create_task(self._writer())
        try:
            await self._read()
        finally:
            if self.response is not None:
                await self.cancel_response("client_cancelled")
            for t in list(self.tasks):
                t.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)
            self.vad_seconds()
            await asyncio.sleep(0)
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)

    async def _read(self) -> None:
        while True:
            try:
                msg = await asyncio.wait_for(self.ws.receive(), self.idle_s)
            except asyncio.TimeoutError:
                if self.response is None and not self.tasks:
                    await self._close(1000, f"idle for {self.idle_s:g} s")
                    return
                continue
            if msg["type"] == "websocket.disconnect":
                return
            if msg.get("text") is None:
                await self._close(1003, "binary frames are not taken: send JSON events as text")
                return
            await self.handle(msg["text"])

    async def _close(self, code: int, reason: str) -> None:
        """Say why, give the writer a moment to send what is queued, close."""
        self.send(self.wire.error(reason, "session_closed"))
        for _ in range(100):
            if self.out.empty():
                break
            await asyncio.sleep(0.01)
        await self.ws.close(code, reason)

    async def handle(self, text: str) -> None:
        """One client frame; a fault in it is an error event."""
        eid = None
        try:
            event = read_event(text)
            eid = event.get("event_id")
            kind = event["type"]
            if kind not in EVENT_KEYS:
                raise ProtocolError(f"unknown event type '{kind}'; taken: {', '.join(EVENT_KEYS)}",
                                    "unknown_event", eid, "type")
            for key in event:
                if key not in EVENT_KEYS[kind] | {"type", "event_id"}:
                    raise ProtocolError(f"unknown key '{key}' in {kind}; it takes "
                                        f"{', '.join(sorted(EVENT_KEYS[kind])) or 'no fields'}", "unknown_parameter",
                                        eid, key)
            name = kind.replace("transcription_session.", "session.").replace(".", "_")
            await getattr(self, f"on_{name}")(event)
        except ProtocolError as e:
            self.send(self.wire.error(str(e), e.code, e.event_id, e.param))
        except InvalidInput as e:
            self.send(self.wire.error(str(e), "invalid_value", eid, e.param))
        except Exception as e:                   # a fault of the server's: said, logged, and the session goes on
            log.exception("realtime: handling an event failed")
            self.send(self.wire.error(f"the server failed on this event ({type(e).__name__}: {e})", None, eid,
                                      kind="server_error"))

    # ---- the session
    def _session_event(self, kind: str) -> dict:
        transcription = self.config.type == "transcription"
        shown = self.config.model_dump()
        if transcription:
            shown = {k: shown[k] for k in ("type", "object", "id", "model", "audio")}
            del shown["audio"]["output"]
        return self.wire.event(kind, transcription, session=self.wire.session_out(shown))

    def _new_vad(self) -> None:
        vad = self.config.audio.input.turn_detection
        self.vad_seconds()
        self.vad = None if vad is None or self.vad_model is None else \
            Vad(self.vad_model, vad.threshold, vad.prefix_padding_ms, vad.silence_duration_ms)
        self.speech_item = None

    def vad_seconds(self) -> None:
        """Count the VAD time so far into /metrics."""
        if getattr(self, "vad", None) is not None:
            self.metrics.vad.inc(self.vad.seconds)
            self.vad.seconds = 0.0

    async def on_session_update(self, event: dict) -> None:
        new = updated(self.config, self.wire.fields_in(event.get("session") or {}), self.voices)
        if new.type == "transcription" and self.config.type != "transcription":
            check_transcription(self.ctx, None)
            if new.audio.input.transcription is None:
                new = updated(new, {"audio": {"input": {"transcription": {}}}}, self.voices)
        if new.audio.input.transcription is not None:
            check_transcription(self.ctx, new.audio.input.transcription.language)
        if new.type == "realtime" and not self.ctx.engine.speaks and "audio" in new.output_modalities:
            raise InvalidInput("this plan does not speak: output_modalities ['audio'] is not served", "",
                               "send output_modalities ['text']", param="session.output_modalities")
        vad_changed = new.audio.input.turn_detection != self.config.audio.input.turn_detection
        self.config = new
        if vad_changed:
            self._new_vad()
        self.send(self._session_event("session.updated"))

    # ---- the input buffer
    async def on_input_audio_buffer_append(self, event: dict) -> None:
        samples = self.resample(decode_pcm16(event.get("audio"), "audio"))
        if self.buffer.total + len(samples) > self.max_buffer:
            if self.vad is None or self.vad.turn is None:
                raise InvalidInput(f"the input buffer holds {self.buffer.total / AUDIO_RATE:.1f} s", "at most "
                                   f"{self.max_buffer / AUDIO_RATE:.1f} s of audio fit a prompt of this plan",
                                   "commit or clear it", param="audio")
            self.vad.turn.stop = self.vad.seen      # a turn as long as a prompt holds ends here
            await self._speech_stopped(self.vad.turn)
            self.vad.reset()
        self.buffer.append(samples)
        if self.vad is None:
            return
        turns = await asyncio.get_running_loop().run_in_executor(vad_pool(), self.vad.feed, samples)
        for turn in turns:
            await (self._speech_started(turn) if turn.stop is None else self._speech_stopped(turn))
        if self.vad.turn is None:
            self.buffer.keep_last(self.vad.padding + 2 * WINDOW + len(self.vad.pending), AUDIO_RATE)

    async def _speech_started(self, turn) -> None:
        self.speech_item = new_id("item")
        self.send(self.wire.event("input_audio_buffer.speech_started", audio_start_ms=turn.start * 1000 // AUDIO_RATE,
                                  item_id=self.speech_item))
        if self.response is not None and self.config.audio.input.turn_detection.interrupt_response:
            await self.cancel_response("turn_detected")

    async def _speech_stopped(self, turn) -> None:
        item_id, self.speech_item = self.speech_item or new_id("item"), None
        self.send(self.wire.event("input_audio_buffer.speech_stopped", audio_end_ms=turn.stop * 1000 // AUDIO_RATE,
                                  item_id=item_id))
        stopped = time.perf_counter()
        self._commit(item_id, self.buffer.take(turn.start, turn.stop))
        vad = self.config.audio.input.turn_detection
        if self.config.type == "realtime" and vad.create_response and self.response is None:
            self._respond(options(None, self.config, self.voices, self._read_item), stopped)

    async def on_input_audio_buffer_commit(self, event: dict) -> None:
        self.buffer.append(self.resample([], last=True))
        self.resample = Resampler(WIRE_RATE, AUDIO_RATE)
        if self.buffer.total * 1000 < MIN_COMMIT_MS * AUDIO_RATE:
            raise InvalidInput(f"the input buffer holds {self.buffer.total * 1000 // AUDIO_RATE} ms of audio",
                               f"a commit takes at least {MIN_COMMIT_MS} ms", "append more audio first")
        item_id = self.speech_item or new_id("item")
        self._commit(item_id, self.buffer.take(self.buffer.base, self.buffer.end))
        if self.vad is not None:
            self.vad.reset()
        self.speech_item = None

    async def on_input_audio_buffer_clear(self, event: dict) -> None:
        self.buffer.clear()
        if self.vad is not None:
            self.vad.reset()
        self.speech_item = None
        self.send(self.wire.event("input_audio_buffer.cleared"))

    def _commit(self, item_id: str, samples) -> None:
        item = audio_item(item_id, samples)
        before = self.conversation.add(item)
        self.send(self.wire.event("input_audio_buffer.committed", item_id=item_id, previous_item_id=before))
        self.send(self.wire.event("conversation.item.created", previous_item_id=before,
                                  item=show_item(item, self.wire)))
        if self.config.audio.input.transcription is not None:
            task = asyncio.create_task(transcribe(self, item))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    # ---- the conversation
    def _read_item(self, item):
        return read_item(item, self.wire, self.ctx.sources, self.ctx.limits)

    async def on_conversation_item_create(self, event: dict) -> None:
        from starlette.concurrency import run_in_threadpool

        item = await run_in_threadpool(self._read_item, event.get("item"))      # images decode off the loop
        before = self.conversation.add(item, event.get("previous_item_id"))
        self.send(self.wire.event("conversation.item.created", previous_item_id=before, item=show_item(item, self.wire)))

    async def on_conversation_item_truncate(self, event: dict) -> None:
        item = self.conversation.find(event.get("item_id"))
        index, end = event.get("content_index"), event.get("audio_end_ms")
        if item.role != "assistant" or index != 0 or item.parts[0].kind != "audio":
            raise InvalidInput(f"item {item.id} content {index!r} is not an assistant's audio",
                               "truncate cuts an assistant's spoken answer (content_index 0)", "", param="content_index")
        if self.response is not None and self.response.item is item:
            raise InvalidInput(f"item {item.id} is still being spoken", "its response is in progress",
                               "cancel the response (response.cancel) first", param="item_id")
        part = item.parts[0]
        if not isinstance(end, int) or isinstance(end, bool) or not 0 <= end <= part.spoken_ms:
            raise InvalidInput(f"audio_end_ms {end!r}", f"the item's audio is {part.spoken_ms} ms long",
                               f"give 0 to {part.spoken_ms}", param="audio_end_ms")
        part.spoken, part.text = end * WIRE_RATE // 1000, ""     # what was not heard is gone, and the transcript
        self.send(self.wire.event("conversation.item.truncated", item_id=item.id, content_index=0, audio_end_ms=end))

    async def on_conversation_item_delete(self, event: dict) -> None:
        self.conversation.delete(event.get("item_id"))
        self.send(self.wire.event("conversation.item.deleted", item_id=event.get("item_id")))

    async def on_conversation_item_retrieve(self, event: dict) -> None:
        item = self.conversation.find(event.get("item_id"))
        self.send(self.wire.event("conversation.item.retrieved", item=show_item(item, self.wire)))

    # ---- responses
    async def on_response_create(self, event: dict) -> None:
        if self.config.type == "transcription":
            raise InvalidInput("a transcription session makes no responses", "", "open a realtime session")
        if self.response is not None:
            raise ProtocolError(f"response {self.response.id} is in progress; cancel it or wait for its "
                                "response.done", "conversation_already_has_active_response", event.get("event_id"))
        given = event.get("response")
        given = self.wire.fields_in(given) if isinstance(given, dict) else given
        self._respond(options(given, self.config, self.voices, self._read_item), None)

    def _respond(self, opts, since: float | None) -> None:
        self.response = Response(self, opts, since)
        self.response.start()

    async def on_response_cancel(self, event: dict) -> None:
        rid = event.get("response_id")
        if self.response is None or (rid is not None and rid != self.response.id):
            raise ProtocolError(f"no response {rid or ''} is in progress".replace("  ", " "),
                                "response_cancel_not_active", event.get("event_id"))
        await self.cancel_response("client_cancelled")

    async def cancel_response(self, reason: str) -> None:
        """Cancel the response under way at once: its engine request aborted, response.done its last event."""
        resp = self.response
        if resp is None or resp.task is None:
            return
        resp.cancelled = reason
        resp.task.cancel()
        await asyncio.gather(resp.task, return_exceptions=True)
        if resp.task.cancelled():            # cancelled before its task began: nothing in the engine yet
            resp.end_cancelled()
        self.metrics.cancelled.labels(reason).inc()

    def response_ended(self, resp: Response) -> None:
        if self.response is resp:
            self.response = None
