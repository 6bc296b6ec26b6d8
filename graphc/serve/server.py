"""graphc run's OpenAI-compatible server (FastAPI + uvicorn) over one Engine.

Endpoints: POST /v1/chat/completions (text, or text and audio with modalities ["text", "audio"]),
POST /v1/completions (stream or not), POST /v1/audio/speech, GET /v1/models, GET /health; and
graphc/serve/ops.py's /metrics and /v1/audio/transcriptions.
One engine thread steps the engine; handlers hand it requests through a queue and read their tokens
from per-request asyncio queues. Request bodies are strict (unknown fields are refused); errors use
OpenAI's body {"error": {message, type, param, code}}. Media parts are decoded in the handlers (a thread
pool), never in the engine's thread, and bounded by what the plan's prompts can hold.

Saturation: requests wait for the engine in order of arrival; at most `max_waiting` may wait (default:
8 times the sequences the decode walk runs at once), beyond that a request is refused at once with 429
and Retry-After (the seconds in which, at the rate requests have been finishing, one leaves the queue).
"""
from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import queue
import threading
import time
import uuid
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from graphc.errors import InvalidInput
from graphc.runtime.engine import Engine, Event
from graphc.runtime.inputs import Sources
from graphc.runtime.sampler import MAX_TOP_LOGPROBS, SamplingParams
from graphc.runtime.workers import WorkerDied
from graphc.serve.transcribe import DEFAULT_MAX_AUDIO_BYTES

log = logging.getLogger("graphc.server")
JSON_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/audio/speech")
AUDIO_EXPIRES_S = 3600            # message.audio.expires_at: graphc keeps no audio, so this only follows OpenAI's shape


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")
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
    stream_options: dict | None = None
    n: int = Field(1, ge=1)
    user: str | None = None

    def params(self, **extra) -> SamplingParams:
        given = {k: v for k, v in self.model_dump(exclude_unset=True, exclude={"logprobs", "top_logprobs"}).items()
                 if k in SamplingParams.model_fields}
        if isinstance(given.get("stop"), str):
            given["stop"] = [given["stop"]]
        return SamplingParams(**(given | extra))        # max_completion_tokens over a max_tokens sent as null


class AudioOut(BaseModel):
    """OpenAI's audio {voice, format}; max_frames (graphc's): the most codec frames (12.5 a second)."""

    model_config = ConfigDict(extra="forbid")
    voice: str
    format: str = "wav"
    max_frames: int | None = Field(None, ge=1)


class ChatBody(Body):
    messages: list[dict[str, Any]]
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    modalities: list[Literal["text", "audio"]] | None = None
    audio: AudioOut | None = None
    use_audio_in_video: bool = False          # Qwen3-Omni: hear each video's own sound track


class SpeechBody(BaseModel):
    """POST /v1/audio/speech: OpenAI's fields (speed other than 1 is refused: the talker speaks at its pace),
    and graphc's seed (the talker's draws) and max_frames (the most codec frames, 12.5 a second)."""

    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    input: str = Field(min_length=1, max_length=4096)
    voice: str
    instructions: str | None = None
    response_format: str = "mp3"
    speed: float = Field(1.0, ge=0.25, le=4.0)
    stream_format: Literal["audio", "sse"] = "audio"
    seed: int | None = Field(None, ge=0)
    max_frames: int | None = Field(None, ge=1)


class CompletionBody(Body):
    prompt: str | list[int]
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool = False


def error(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
          code: str | None = None):
    from fastapi.responses import JSONResponse

    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}}, status_code=status)


def wrong_model(asked: str | None, served: str):
    """A 404 in OpenAI's body when a request names a model this server does not serve, else None."""
    if asked is None or asked == served:
        return None
    return error(404, f"model '{asked}' is not served here; this server serves '{served}'", param="model",
                 code="model_not_found")


class EngineFailed(WorkerDied):
    """The engine's own step raised (a bug, or the device failed): what was in flight is failed and the
    server ends as when a device's worker died, rather than hang with requests nobody steps."""


class QueueFull(Exception):
    """More requests wait for the engine than the server queues: refused with 429 and Retry-After."""

    def __init__(self, waiting: int, most: int, retry_after: int):
        self.waiting, self.most, self.retry_after = waiting, most, retry_after
        super().__init__(f"the server is full: {waiting} requests wait for the engine, at most {most} may; "
                         f"retry after {retry_after} s, or start the server with a larger --max-waiting")


class Driver:
    """The engine thread: adds submitted requests, steps while there is work, routes events. Observers
    (graphc/serve/ops.py's metrics) are called in it with each Event, and with a finished one when an
    abort frees a request."""

    RATE_WINDOW = 64          # the finished requests the Retry-After estimate looks at

    def __init__(self, engine: Engine, on_death=None, max_waiting: int | None = None):
        """on_death(WorkerDied): what ends the server when a device's worker died (default: exit 3);
        max_waiting: the most requests waiting for the engine (default: 8 x the decode walk's sequences)."""
        self.engine = engine
        self.on_death = on_death or self._die
        self.max_waiting = max_waiting if max_waiting is not None else 8 * engine.scheduler.max_running
        if self.max_waiting < 1:
            raise InvalidInput(f"max_waiting is {self.max_waiting}", "at least one request must be able to wait",
                               "give --max-waiting 1 or more")
        self.observers: list = []
        self.inbox: queue.Queue = queue.Queue()
        self.pending = 0                  # submitted, not yet taken by the engine thread
        self.lock = threading.RLock()      # submit() holds it while admit() reads the finishing rate
        self.finished: list[float] = []   # monotonic times of the last RATE_WINDOW finished requests
        self.wake = threading.Event()
        self.stopping = False
        self.thread = threading.Thread(target=self._loop, name="graphc-engine", daemon=True)
        self.thread.start()

    def close(self, timeout: float = 10.0) -> None:
        """Stop the engine thread after the step it is in (the server shuts down): the engine is then
        its owner's again, to step or close."""
        self.stopping = True
        self.wake.set()
        if threading.current_thread() is not self.thread:
            self.thread.join(timeout)

    def waiting(self) -> int:
        """Requests submitted and not yet running: the server's queue."""
        return self.pending + len(self.engine.scheduler.waiting)

    def retry_after(self) -> int:
        """Seconds in which one waiting request should leave the queue, at the rate they have been finishing."""
        with self.lock:
            done = list(self.finished)
        if len(done) < 2 or done[-1] <= done[0]:
            return 1
        per = (done[-1] - done[0]) / (len(done) - 1)
        return max(1, min(60, int(per + 0.999)))

    def admit(self) -> None:
        """Raise QueueFull when the queue is full (the server checks before it decodes any media)."""
        waiting = self.waiting()
        if waiting >= self.max_waiting:
            raise QueueFull(waiting, self.max_waiting, self.retry_after())

    def submit(self, loop, kwargs: dict) -> tuple[asyncio.Future, asyncio.Queue]:
        """Hand a request to the engine thread; the future fails at once with QueueFull when the queue is full."""
        fut, events = loop.create_future(), asyncio.Queue()
        with self.lock:
            try:
                self.admit()
            except QueueFull as e:
                fut.set_exception(e)
                return fut, events
            self.pending += 1
        self.inbox.put(("add", loop, kwargs, fut, events))
        self.wake.set()
        return fut, events

    def abort(self, request_id: str) -> None:
        self.inbox.put(("abort", request_id))
        self.wake.set()

    def _observe(self, ev: Event) -> None:
        for observer in self.observers:
            try:
                observer(ev)
            except Exception:                 # an observer never stops the engine
                log.exception("observer %r failed", observer)

    def _abort(self, request_id: str) -> None:
        req = self.engine.requests.get(request_id)
        self.engine.abort(request_id)
        if req is not None and req.finish_reason == "abort":
            self._observe(Event(req, [], "", True))

    def _loop(self) -> None:
        while not self.stopping:
            while True:
                try:
                    item = self.inbox.get_nowait()
                except queue.Empty:
                    break
                if item[0] == "abort":
                    self._abort(item[1])
                    continue
                _, loop, kwargs, fut, events = item
                try:
                    req = self.engine.add(**kwargs, user=(loop, events))
                    loop.call_soon_threadsafe(_settle, fut, req, None)
                except Exception as e:            # refused: InvalidInput with the numbers, or a bad input
                    loop.call_soon_threadsafe(_settle, fut, None, e)
                finally:
                    with self.lock:
                        self.pending -= 1
            if not self.engine.has_work():
                self.wake.wait(0.05)
                self.wake.clear()
                if self.engine.workers is None:
                    continue                      # else an idle step: it looks at the devices' workers
            dead = None
            try:
                events = self.engine.step()
            except WorkerDied as e:              # a device's worker died: fail what is in flight, then exit
                events, dead = e.events, e
            except Exception as e:               # the step itself failed: the same, with its traceback logged
                log.exception("graphc: the engine's step failed")
                what = f"the engine's step failed ({type(e).__name__}: {e})"
                events = self.engine.fail_all(what)
                dead = EngineFailed(what, "the engine cannot go on", "see the log above; restart the server")
            for ev in events:
                if ev.finished:
                    with self.lock:
                        self.finished = self.finished[-(self.RATE_WINDOW - 1):] + [time.monotonic()]
                self._observe(ev)
                if ev.request.user is None:       # added to the engine directly, not through this server
                    continue
                loop, events = ev.request.user
                try:
                    loop.call_soon_threadsafe(events.put_nowait, ev)
                except RuntimeError:              # its event loop is gone (shutdown): nobody reads it any more
                    self._abort(ev.request.id)
            if dead is not None:
                self.on_death(dead)
                return

    @staticmethod
    def _die(e: WorkerDied) -> None:
        log.critical("graphc: %s; the server exits with code %d", e, e.exit_code)
        threading.Timer(1.0, os._exit, (e.exit_code,)).start()       # a moment to send the errors


def _settle(fut: asyncio.Future, value, exc) -> None:
    if not fut.done():
        fut.set_exception(exc) if exc is not None else fut.set_result(value)


def refusal(e: Exception):
    """The error response of a request the server or engine refused: 429 when the queue is full, 400
    for what the request asked; None for anything else (a fault, raised on)."""
    if isinstance(e, QueueFull):
        r = error(429, str(e), kind="requests", code="rate_limit_exceeded")
        r.headers["Retry-After"] = str(e.retry_after)
        return r
    if isinstance(e, InvalidInput):
        return error(400, str(e), param=e.param)
    if isinstance(e, ValueError):
        return error(400, str(e))
    return None


async def submitted(driver: Driver, kwargs: dict):
    """((request, its events), None) once the engine took it, or (None, the refusal's response)."""
    fut, events = driver.submit(asyncio.get_running_loop(), kwargs)
    try:
        return (await fut, events), None
    except Exception as e:
        bad = refusal(e)
        if bad is None:
            raise
        return None, bad


def build_app(engine: Engine, name: str | None = None, *, api_key: str | None = None, access_log: bool = False,
              max_audio_bytes: int = DEFAULT_MAX_AUDIO_BYTES, on_death=None, max_waiting: int | None = None,
              sources: Sources = Sources(paths=False)):
    """api_key: every route but /health wants it as a bearer token; access_log: a JSON line a request on
    `graphc.access`; max_audio_bytes: the largest transcription upload (graphc/serve/ops.py,
    transcribe.py); on_death: Driver's; max_waiting: the queue's bound (Driver's); sources: where media
    parts may be read from (default: their bytes only, no file and no URL)."""
    from fastapi import FastAPI
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import StreamingResponse
    from starlette.concurrency import run_in_threadpool

    from graphc.runtime.inputs import split_messages

    model_name = name or engine.plan.model.name
    app = FastAPI(title="graphc", version="1")
    driver = Driver(engine, on_death, max_waiting)
    app.state.driver = driver
    app.router.on_shutdown.append(driver.close)
    limits = engine.media_limits()

    @app.exception_handler(RequestValidationError)
    async def _invalid(_req, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        if first.get("type") == "json_invalid":
            where = first.get("ctx", {}).get("error", "")
            return error(400, f"the body is not valid JSON ({where or first.get('msg')}, at character "
                              f"{first.get('loc', ('body', '?'))[-1]})", param=None)
        loc = ".".join(str(x) for x in first.get("loc", ())[1:])
        return error(400, f"{loc or 'body'}: {first.get('msg', 'invalid')}", param=loc or None)

    from starlette.exceptions import HTTPException

    @app.exception_handler(HTTPException)
    async def _http(_req, exc: HTTPException):
        """Starlette's own refusals (a body that does not parse, no such route, a method not allowed) in
        OpenAI's body, not FastAPI's {"detail": ...}."""
        message = str(exc.detail)
        if exc.status_code == 400 and "parsing the body" in message:
            message = "the body could not be read: send JSON in UTF-8 (Content-Type: application/json)"
        elif exc.status_code == 404:
            message = "no such route: this server answers /v1/chat/completions, /v1/completions, /v1/audio/speech, " \
                      "/v1/audio/transcriptions, /v1/models, /health and /metrics"
        r = error(exc.status_code, message, code="not_found" if exc.status_code == 404 else None)
        for k, v in (exc.headers or {}).items():
            r.headers[k] = v
        return r

    max_body = max_audio_bytes * 4 // 3 + (1 << 20)        # base64 media parts in JSON, and the rest of the body

    @app.middleware("http")
    async def _body_limit(request, call_next):
        """413 before a byte of an oversized JSON body is read (Content-Length), so before any GPU work."""
        size = request.headers.get("content-length", "")
        if request.method == "POST" and request.url.path in JSON_ROUTES and size.isdigit() and int(size) > max_body:
            return error(413, f"the request body is {int(size):,} bytes; this server takes at most {max_body:,} "
                              f"(media up to {max_audio_bytes:,} bytes, base64-encoded)", code="request_too_large")
        return await call_next(request)

    @app.get("/health")
    def health():
        """The thinker's KV pages and requests; with a talker, its pages and the requests still speaking."""
        s = engine.scheduler
        out = {"status": "ok", "running": len(s.running), "waiting": len(s.waiting),
               "free_pages": s.pages.num_free, "pages": s.capacity}
        if engine.speech is not None:
            out |= {"speaking": len(engine.talking), "talker_free_pages": engine.speech.pages.num_free,
                    "talker_pages": engine.speech.capacity}
        return out

    @app.get("/v1/models")
    def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "graphc"}]}

    def check_model(body: Body):
        if (bad := wrong_model(body.model, model_name)) is not None:
            return bad
        if body.n != 1:
            return error(400, f"n={body.n}: one choice per request is served", param="n")
        return None

    async def start(kwargs: dict):
        return await submitted(driver, kwargs)

    async def parse(body: ChatBody):
        """The messages and their decoded media (in a worker thread), or a refusal: 429 before any
        decoding when the queue is full."""
        try:
            driver.admit()
            return await run_in_threadpool(split_messages, body.messages, body.use_audio_in_video, sources, limits), None
        except Exception as e:
            bad = refusal(e)
            if bad is None:
                raise
            return None, bad

    async def collect(req, events) -> list[Event]:
        out = []
        while True:
            ev = await events.get()
            out.append(ev)
            if ev.finished:
                return out

    def usage(req) -> dict:
        out = {"prompt_tokens": len(req.prompt.ids), "completion_tokens": len(req.output),
               "total_tokens": len(req.prompt.ids) + len(req.output)}
        if req.speech is not None:           # codec frames (12.5 a second of audio) as audio tokens
            out["completion_tokens_details"] = {"audio_tokens": len(req.speech.frames), "text_tokens": len(req.output)}
        return out

    def chat_logprobs(req, start: int, end: int) -> dict | None:
        if req.logprobs is None:
            return None
        tok = engine.tokenizer

        def entry(tid, lp):
            text = tok.decode([tid], skip_special_tokens=False) if tok else str(tid)
            return {"token": text, "logprob": lp, "bytes": list(text.encode())}
        return {"content": [{**entry(e["token_id"], e["logprob"]),
                             "top_logprobs": [entry(t, v) for t, v in e["top"]]} for e in req.logprobs[start:end]]}

    def audio_id() -> str:
        return f"audio_{uuid.uuid4().hex}"

    def stream(req, events, chat: bool, rid: str, created: int, include_usage: bool, audio: str | None = None):
        """audio: the format of a speaking request's audio deltas (its transcript goes in delta.audio too)."""
        from graphc.serve.audio_out import Stream

        enc = Stream(audio, engine.host.speech.sample_rate) if audio else None
        aid, expires = audio_id(), created + AUDIO_EXPIRES_S

        async def gen():
            obj = "chat.completion.chunk" if chat else "text_completion"
            sent = 0
            try:
                if chat:
                    yield _sse({"id": rid, "object": obj, "created": created, "model": model_name,
                                "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                             "finish_reason": None}]})
                while True:
                    ev = await events.get()
                    n = len(req.output)
                    piece = {"index": 0, "finish_reason": req.finish_reason if ev.finished else None}
                    if chat and enc is not None:
                        delta = {}
                        if ev.text:
                            delta["transcript"] = ev.text
                        if ev.audio is not None and len(ev.audio):
                            delta |= {"id": aid, "data": base64.b64encode(enc.add(ev.audio)).decode(),
                                      "expires_at": expires}
                        piece["delta"] = {"audio": delta} if delta else {}
                        piece["logprobs"] = chat_logprobs(req, sent, n)
                    elif chat:
                        piece["delta"] = {"content": ev.text} if ev.text else {}
                        piece["logprobs"] = chat_logprobs(req, sent, n)
                    else:
                        piece["text"] = ev.text
                    if ev.token_ids or ev.text or ev.finished or piece.get("delta"):
                        yield _sse({"id": rid, "object": obj, "created": created, "model": model_name,
                                    "choices": [piece]})
                    sent = n
                    if ev.finished:
                        if req.error:
                            yield _sse({"error": {"message": req.error, "type": "server_error", "param": None,
                                                  "code": None}})
                        if include_usage:
                            yield _sse({"id": rid, "object": obj, "created": created, "model": model_name,
                                        "choices": [], "usage": usage(req)})
                        yield "data: [DONE]\n\n"
                        return
            finally:
                if not req.closed:                     # the client went away: free its pages now
                    driver.abort(req.id)
        return StreamingResponse(gen(), media_type="text/event-stream")

    async def answer(chat: bool, rid: str, body: Body, kwargs: dict, audio: str | None = None):
        """Submit; a streamed response, an error response, or (request, its events, created) once it finished."""
        started, bad = await start(kwargs)
        if bad is not None:
            return bad
        req, events = started
        created = int(time.time())
        if body.stream:
            return stream(req, events, chat, rid, created, bool((body.stream_options or {}).get("include_usage")),
                          audio)
        evs = await collect(req, events)
        if req.error:
            return error(500, req.error, kind="server_error")
        return req, evs, created

    @app.post("/v1/chat/completions")
    async def chat(body: ChatBody):
        if (bad := check_model(body)) is not None:
            return bad
        speak = bool(body.modalities and "audio" in body.modalities)
        if speak != (body.audio is not None):
            return error(400, "audio output needs both modalities [\"text\", \"audio\"] and audio {voice, format}",
                         param="audio" if speak else "modalities")
        speech = None
        if speak:
            from graphc.serve.audio_out import check_format
            from graphc.runtime.speech import SpeechParams
            try:
                check_format(body.audio.format, stream=body.stream, param="audio.format")
            except InvalidInput as e:
                return error(400, str(e), param=e.param)
            speech = SpeechParams(voice=body.audio.voice, max_frames=body.audio.max_frames, seed=body.seed)
        if body.max_tokens is not None and body.max_completion_tokens is not None:
            return error(400, "give max_tokens or max_completion_tokens, not both", param="max_tokens")
        try:
            extra = {"max_tokens": body.max_completion_tokens} if body.max_completion_tokens else {}
            params = body.params(logprobs=body.logprobs, top_logprobs=body.top_logprobs or 0, **extra)
        except ValidationError as e:
            return error(400, str(e.errors()[0]["msg"]))
        parsed, bad = await parse(body)
        if bad is not None:
            return bad
        messages, media = parsed
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        done = await answer(True, rid, body, dict(messages=messages, media=media, split=True, params=params,
                                                  request_id=rid, speech=speech),
                            audio=body.audio.format if speak else None)
        if not isinstance(done, tuple):
            return done
        req, evs, created = done
        text = req.detok.text if req.detok is not None else "".join(e.text for e in evs)
        message = {"role": "assistant", "content": text}
        if speak:
            from graphc.serve.audio_out import encode
            wave = np.concatenate(req.speech.audio) if req.speech.audio else np.zeros(0, np.float32)
            data = encode(wave, engine.host.speech.sample_rate, body.audio.format)
            message = {"role": "assistant", "content": None,
                       "audio": {"id": audio_id(), "data": base64.b64encode(data).decode(),
                                 "expires_at": created + AUDIO_EXPIRES_S, "transcript": text}}
        return {"id": rid, "object": "chat.completion", "created": created, "model": model_name,
                "choices": [{"index": 0, "message": message,
                             "logprobs": chat_logprobs(req, 0, len(req.output)), "finish_reason": req.finish_reason}],
                "usage": usage(req)}

    @app.post("/v1/completions")
    async def completions(body: CompletionBody):
        if (bad := check_model(body)) is not None:
            return bad
        if body.echo:
            return error(400, "echo is not served", param="echo")
        try:
            params = body.params(logprobs=body.logprobs is not None, top_logprobs=body.logprobs or 0)
        except ValidationError as e:
            return error(400, str(e.errors()[0]["msg"]))
        rid = f"cmpl-{uuid.uuid4().hex}"
        kw = dict(prompt_token_ids=body.prompt) if isinstance(body.prompt, list) else dict(prompt=body.prompt)
        done = await answer(False, rid, body, dict(**kw, params=params, request_id=rid))
        if not isinstance(done, tuple):
            return done
        req, _, created = done
        text = req.detok.text if req.detok is not None else ""
        lp = None
        if req.logprobs is not None:
            lp = {"tokens": [str(e["token_id"]) for e in req.logprobs],
                  "token_logprobs": [e["logprob"] for e in req.logprobs],
                  "top_logprobs": [{str(t): v for t, v in e["top"]} for e in req.logprobs]}
        return {"id": rid, "object": "text_completion", "created": created, "model": model_name,
                "choices": [{"index": 0, "text": text, "token_ids": list(req.output), "logprobs": lp,
                             "finish_reason": req.finish_reason}], "usage": usage(req)}

    @app.post("/v1/audio/speech")
    async def speech_route(body: SpeechBody):
        """Text to speech: the input is spoken as given (the talker reads the text's embeddings; the thinker
        does not run). A system turn holds `instructions` when given; the user turn holds the input."""
        from fastapi.responses import Response

        from graphc.serve.audio_out import MEDIA_TYPES, STREAMED, Stream, check_format, encode
        from graphc.runtime.speech import SpeechParams

        if (bad := wrong_model(body.model, model_name)) is not None:
            return bad
        if body.speed != 1.0:
            return error(400, f"speed {body.speed} is not served: the talker speaks at its own pace", param="speed")
        try:
            fmt = check_format(body.response_format, stream=body.stream_format == "sse", param="response_format")
            if engine.speech is None:
                raise InvalidInput("this plan does not speak", f"its kinds: {', '.join(engine.kinds())}",
                                   "serve a plan of a model with a talker", param="model")
            ids = engine.tokenize(prompt=body.input)
        except InvalidInput as e:
            return error(400, str(e), param=e.param)
        messages = ([{"role": "system", "content": body.instructions}] if body.instructions else []) + \
            [{"role": "user", "content": body.input}]
        rid = f"speech-{uuid.uuid4().hex}"
        speech = SpeechParams(voice=body.voice, seed=body.seed, max_frames=body.max_frames)
        started, bad = await start(dict(messages=messages, request_id=rid, speech=speech, speak=ids))
        if bad is not None:
            return bad
        req, events = started
        rate = engine.host.speech.sample_rate

        def speech_usage() -> dict:
            frames = len(req.speech.frames)
            return {"input_tokens": len(req.prompt.ids), "output_tokens": frames,
                    "total_tokens": len(req.prompt.ids) + frames}

        if body.stream_format == "sse" or fmt in STREAMED:
            enc = Stream(fmt, rate)

            async def gen():
                try:
                    while True:
                        ev = await events.get()
                        if ev.audio is not None and len(ev.audio):
                            chunk = enc.add(ev.audio)
                            yield (_sse({"type": "speech.audio.delta", "audio": base64.b64encode(chunk).decode()})
                                   if body.stream_format == "sse" else chunk)
                        if ev.finished:
                            if body.stream_format == "sse":
                                yield _sse({"error": {"message": req.error, "type": "server_error", "param": None,
                                                      "code": None}} if req.error else
                                           {"type": "speech.audio.done", "usage": speech_usage()})
                            return
                finally:
                    if not req.closed:
                        driver.abort(req.id)
            media = "text/event-stream" if body.stream_format == "sse" else MEDIA_TYPES[fmt]
            return StreamingResponse(gen(), media_type=media)
        await collect(req, events)
        if req.error:
            return error(500, req.error, kind="server_error")
        wave = np.concatenate(req.speech.audio) if req.speech.audio else np.zeros(0, np.float32)
        return Response(encode(wave, rate, fmt), media_type=MEDIA_TYPES[fmt])

    from graphc.serve.ops import install
    install(app, engine, driver, model_name, api_key=api_key, access_log=access_log, max_audio_bytes=max_audio_bytes)

    def openapi() -> dict:
        if app.openapi_schema is None:
            from fastapi.openapi.utils import get_openapi

            app.openapi_schema = document(get_openapi(title=app.title, version=app.version, routes=app.routes),
                                          bool(api_key))
        return app.openapi_schema
    app.openapi = openapi
    return app


ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type", "param", "code"],
    "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                   "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}}}
ERRORS = {"400": "the request is malformed or asks what the plan cannot serve (the message says which and why)",
          "404": "the model named is not served here", "413": "the body is over the size limit",
          "429": "the queue is full; Retry-After says when to try again",
          "500": "the engine failed this request (a device's worker died, or a step raised): the server ends"}
OBJECT = {"type": "object"}
ANSWERS = {  # route -> (the JSON answer's required fields, further media types of a 200)
    "/v1/chat/completions": (["id", "object", "created", "model", "choices"], ["text/event-stream"]),
    "/v1/completions": (["id", "object", "created", "model", "choices"], ["text/event-stream"]),
    "/v1/audio/speech": (None, ["text/event-stream", "audio/wav", "audio/pcm", "audio/flac", "audio/mpeg",
                                "audio/ogg"]),
    "/v1/models": (["object", "data"], []),
    "/health": (["status", "running", "waiting", "free_pages", "pages"], []),
}


def document(schema: dict, keyed: bool) -> dict:
    """FastAPI's schema of this app, told what the routes answer: OpenAI's error body for 400 (not
    FastAPI's 422: validation errors are 400 here), 404, 413, 429 (with Retry-After) and 500; 401 on every
    route but /health when an API key is set; the media types and required fields of a 200."""
    for path, ops in schema.get("paths", {}).items():
        for op in ops.values():
            responses = op.setdefault("responses", {})
            responses.pop("422", None)
            required, media = ANSWERS.get(path, (None, []))
            ok = responses.setdefault("200", {"description": "the answer"})
            content = ok.setdefault("content", {})
            if path == "/v1/audio/speech":
                content.pop("application/json", None)
            elif required:
                content["application/json"] = {"schema": {**OBJECT, "required": required}}
            for m in media:
                content[m] = {"schema": {"type": "string"}}
            if path in JSON_ROUTES:
                for code, what in ERRORS.items():
                    responses[code] = {"description": what, "content": {"application/json": {"schema": ERROR}}}
                responses["429"]["headers"] = {"Retry-After": {"schema": {"type": "integer"},
                                                               "description": "seconds"}}
            if keyed and path != "/health":
                responses["401"] = {"description": "no API key, or not this server's",
                                    "content": {"application/json": {"schema": ERROR}}}
    for name in ("HTTPValidationError", "ValidationError"):
        schema.get("components", {}).get("schemas", {}).pop(name, None)
    return schema


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def serve(engine: Engine, host: str = "127.0.0.1", port: int = 8000, *, api_key: str | None = None,
          access_log: bool = False, max_audio_bytes: int = DEFAULT_MAX_AUDIO_BYTES, max_waiting: int | None = None,
          media_dir: str | None = None, media_urls: bool = False, exit_on_death: bool = True) -> WorkerDied | None:
    """Serve until stopped. A device's worker that dies ends it: the process exits with code 3 a moment
    after the requests in flight got their error, or, with exit_on_death=False (graphc run --ray: the
    server runs in a Ray actor), the server stops and the WorkerDied is returned."""
    import uvicorn

    died: list[WorkerDied] = []

    def stop(e: WorkerDied) -> None:
        log.critical("graphc: %s; the server stops", e)
        died.append(e)
        threading.Timer(1.0, setattr, (server, "should_exit", True)).start()     # a moment to send the errors

    app = build_app(engine, api_key=api_key, access_log=access_log, max_audio_bytes=max_audio_bytes,
                    on_death=None if exit_on_death else stop, max_waiting=max_waiting,
                    sources=media_sources(media_dir, media_urls))
    if access_log:
        from graphc.serve.ops import access_log_to_stderr
        access_log_to_stderr()
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
    server.run()
    return died[0] if died else None


def media_sources(media_dir: str | None, media_urls: bool) -> Sources:
    """graphc run's --media-dir and --media-urls as inputs.Sources (neither: a request's own bytes only)."""
    from pathlib import Path

    paths: bool | Path = False
    if media_dir is not None:
        paths = Path(media_dir).resolve()
        if not paths.is_dir():
            raise InvalidInput(f"--media-dir {media_dir} is not a folder", "", "name an existing folder")
    fetch = None
    if media_urls:
        from graphc.serve.fetch import Fetcher
        fetch = Fetcher()
    return Sources(paths=paths, urls=fetch)
