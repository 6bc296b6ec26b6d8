"""POST /v1/chat/completions and POST /v1/completions: text out, streamed or whole.

Chat takes OpenAI's messages (text, and the media parts the plan's kinds take: decoded in a worker
thread, never in the engine's, and bounded by what the plan's prompts can hold); with modalities
["text", "audio"] and audio {voice, format} the answer is spoken too (message.audio: the waveform and
its transcript). Completions take a text prompt or token ids. Both stream as server-sent events ending
in `data: [DONE]`, with a usage chunk when stream_options.include_usage. Both take response_format (text,
json_object, json_schema): the answer is then decoded under its grammar (graphc/runtime/grammar.py).
"""
from __future__ import annotations

import base64
import time
import uuid

from pydantic import ValidationError

from graphc.errors import InvalidInput
from graphc.runtime.inputs import split_messages
from graphc.runtime.speech import SpeechParams
from graphc.serve.audio_out import Stream, check_format, encode, whole
from graphc.serve.context import Context
from graphc.serve.errors import error, refusal, stream_error, wrong_model
from graphc.serve.middleware import request_id
from graphc.serve.schemas import Body, ChatBody, CompletionBody
from graphc.serve.streaming import collect, sse

AUDIO_EXPIRES_S = 3600            # message.audio.expires_at: graphc keeps no audio, so this only follows OpenAI's shape


def register(app, ctx: Context) -> None:
    """Add the two routes to `app`."""

    @app.post("/v1/chat/completions")
    async def chat(body: ChatBody):
        return await chat_completion(ctx, body)

    @app.post("/v1/completions")
    async def completions(body: CompletionBody):
        return await completion(ctx, body)


MAX_N = 16                        # choices one request may ask for (each is an engine request)


def check_model(ctx: Context, body: Body):
    """A refusal of a model not served here or of n past MAX_N, else None."""
    if (bad := wrong_model(body.model, ctx.names)) is not None:
        return bad
    if body.n > MAX_N:
        return error(400, f"n={body.n}: at most {MAX_N} choices a request", param="n")
    return None


def usage_of(reqs: list) -> dict:
    """The usage of a request's choices: the prompt counted once, every choice's tokens."""
    out = usage(reqs[0])
    for req in reqs[1:]:
        more = usage(req)
        out["completion_tokens"] += more["completion_tokens"]
        out["total_tokens"] += more["completion_tokens"]
    return out


def choice_kwargs(kwargs: dict, rid: str, n: int) -> list[dict]:
    """The engine requests of n choices: request ids rid-0 .. rid-(n-1) (rid alone for one), and a seeded
    request's choice i seeded seed + i, so that choices differ and repeat as the request does."""
    if n == 1:
        return [kwargs]
    params = kwargs["params"]
    return [{**kwargs, "request_id": f"{rid}-{i}",
             "params": params if params.seed is None else params.model_copy(update={"seed": params.seed + i})}
            for i in range(n)]


def usage(req) -> dict:
    """OpenAI's token usage; a speaking request's codec frames (12.5 a second of audio) as audio tokens."""
    out = {"prompt_tokens": len(req.prompt.ids), "completion_tokens": len(req.output),
           "total_tokens": len(req.prompt.ids) + len(req.output)}
    if req.speech is not None:
        out["completion_tokens_details"] = {"audio_tokens": len(req.speech.frames), "text_tokens": len(req.output)}
    return out


def chat_logprobs(tokenizer, req, start: int, end: int) -> dict | None:
    """Chat's logprobs {content: [...]} of output tokens start..end, None when not asked for."""
    if req.logprobs is None:
        return None

    def entry(tid, lp):
        text = tokenizer.decode([tid], skip_special_tokens=False) if tokenizer else str(tid)
        return {"token": text, "logprob": lp, "bytes": list(text.encode())}
    return {"content": [{**entry(e["token_id"], e["logprob"]),
                         "top_logprobs": [entry(t, v) for t, v in e["top"]]} for e in req.logprobs[start:end]]}


def completion_logprobs(tokenizer, req, start: int, end: int, offset: int) -> tuple[dict | None, int]:
    """/v1/completions' logprobs of output tokens start..end as OpenAI shows them (each token's text, its logprob,
    the top alternatives keyed by text, each token's character offset from `offset`), and the offset after them;
    (None, offset) when not asked for. Text is the token's own decoding (its id without a tokenizer)."""
    if req.logprobs is None:
        return None, offset

    def text(tid: int) -> str:
        return tokenizer.decode([tid], skip_special_tokens=False) if tokenizer else str(tid)
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for e in req.logprobs[start:end]:
        t = text(e["token_id"])
        out["tokens"].append(t)
        out["token_logprobs"].append(e["logprob"])
        out["top_logprobs"].append({text(i): v for i, v in e["top"]})
        out["text_offset"].append(offset)
        offset += len(t)
    return out, offset


def audio_id() -> str:
    return f"audio_{uuid.uuid4().hex}"


class AudioDeltas:
    """A speaking request's streamed audio: each chunk encoded in its format, under one audio id."""

    def __init__(self, fmt: str, rate: int, created: int):
        self.enc, self.id, self.expires = Stream(fmt, rate), audio_id(), created + AUDIO_EXPIRES_S

    def delta(self, samples) -> dict:
        return {"id": self.id, "data": base64.b64encode(self.enc.add(samples)).decode(), "expires_at": self.expires}


def choice(tokenizer, req, ev, chat: bool, audio: AudioDeltas | None, sent: int, n: int, index: int) -> dict:
    """Choice `index`'s streamed piece of one event: its text (or transcript and audio), chat's logprobs of
    output tokens sent..n, finish_reason."""
    piece = {"index": index, "finish_reason": req.finish_reason if ev.finished else None}
    if not chat:
        piece["text"] = ev.text
        return piece
    if audio is not None:
        delta = {"transcript": ev.text} if ev.text else {}
        if ev.audio is not None and len(ev.audio):
            delta |= audio.delta(ev.audio)
        piece["delta"] = {"audio": delta} if delta else {}
    else:
        piece["delta"] = {"content": ev.text} if ev.text else {}
    piece["logprobs"] = chat_logprobs(tokenizer, req, sent, n)
    return piece


async def merged(subs: list):
    """(choice index, event) as each choice's events come, until every choice has finished."""
    import asyncio

    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, events) -> None:
        while True:
            ev = await events.get()
            await queue.put((i, ev))
            if ev.finished:
                return
    tasks = [asyncio.create_task(pump(i, events)) for i, (_, events) in enumerate(subs)]
    left = len(subs)
    try:
        while left:
            i, ev = await queue.get()
            yield i, ev
            left -= ev.finished
    finally:
        for t in tasks:
            t.cancel()


async def chunks(ctx: Context, subs: list, head: dict, include_usage: bool, audio: AudioDeltas | None):
    """The stream's events, each choice's under its index; a client that goes away frees every choice's pages."""
    chat = head["object"] == "chat.completion.chunk"
    reqs = [req for req, _ in subs]
    sent, offset = [0] * len(reqs), [0] * len(reqs)    # tokens sent; characters of their logprobs' text
    try:
        if chat:
            yield sse({**head, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""},
                                            "finish_reason": None} for i in range(len(reqs))]})
        async for i, ev in merged(subs):
            req, n = reqs[i], len(reqs[i].known)    # the engine thread may add more meanwhile
            piece = choice(ctx.engine.tokenizer, req, ev, chat, audio, sent[i], n, i)
            if not chat:
                piece["logprobs"], offset[i] = completion_logprobs(ctx.engine.tokenizer, req, sent[i], n, offset[i])
            if ev.token_ids or ev.text or ev.finished or piece.get("delta"):
                yield sse({**head, "choices": [piece]})
            sent[i] = n
            if ev.finished and req.error:
                yield sse(stream_error(req.error))
        if include_usage:
            yield sse({**head, "choices": [], "usage": usage_of(reqs)})
        yield "data: [DONE]\n\n"
    finally:
        for req in reqs:
            if not req.closed:
                ctx.driver.abort(req.id)


async def compile_guide(ctx: Context, params):
    """The refusal of a guide (response_format) that does not compile, else None: compiled in a worker thread,
    so that the engine thread's compile of it is a cache hit (a large schema takes long to compile)."""
    from starlette.concurrency import run_in_threadpool

    if params.guide is None:
        return None
    try:
        await run_in_threadpool(ctx.engine.compile_guide, params.guide)
    except InvalidInput as e:
        return error(400, str(e), param=e.param)
    return None


async def answer(ctx: Context, chat: bool, rid: str, body: Body, kwargs: dict, audio: str | None = None):
    """Submit body.n choices; a streamed response, an error response, or ([(request, its events)], created)
    once every choice finished. audio: the format of a speaking request's audio."""
    from fastapi.responses import StreamingResponse

    if (bad := await compile_guide(ctx, kwargs["params"])) is not None:
        return bad
    subs = []
    for kw in choice_kwargs(kwargs, rid, body.n):
        started, bad = await ctx.submit(kw)
        if bad is not None:
            for req, _ in subs:
                ctx.driver.abort(req.id)
            return bad
        subs.append(started)
    created = int(time.time())
    if body.stream:
        head = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion", "created": created,
                "model": ctx.model_name}
        deltas = AudioDeltas(audio, ctx.engine.sample_rate, created) if audio else None
        include_usage = bool((body.stream_options or {}).get("include_usage"))
        return StreamingResponse(chunks(ctx, subs, head, include_usage, deltas), media_type="text/event-stream")
    done = [(req, await collect(events)) for req, events in subs]
    failed = next((req.error for req, _ in done if req.error), None)
    if failed:
        return error(500, failed, kind="server_error")
    return done, created


def speech_out(body: ChatBody):
    """(SpeechParams or None, None), or (None, the refusal) when audio out is asked for amiss."""
    speak = bool(body.modalities and "audio" in body.modalities)
    if speak != (body.audio is not None):
        return None, error(400, "audio output needs both modalities [\"text\", \"audio\"] and audio {voice, format}",
                           param="audio" if speak else "modalities")
    if not speak:
        return None, None
    try:
        check_format(body.audio.format, stream=body.stream, param="audio.format")
    except InvalidInput as e:
        return None, error(400, str(e), param=e.param)
    return SpeechParams(voice=body.audio.voice, max_frames=body.audio.max_frames, seed=body.seed), None


async def decode(ctx: Context, body: ChatBody):
    """(the messages and their decoded media, None) decoded in a worker thread, or (None, a refusal): 429
    before any decoding when the queue is full."""
    from starlette.concurrency import run_in_threadpool

    try:
        ctx.driver.admit()
        return await run_in_threadpool(split_messages, body.messages, body.use_audio_in_video, ctx.sources,
                                       ctx.limits), None
    except Exception as e:
        bad = refusal(e)
        if bad is None:
            raise
        return None, bad


def chat_message(ctx: Context, req, evs, fmt: str | None, created: int) -> dict:
    """The finished answer's message: its text, or with audio format `fmt` the audio and its transcript."""
    text = req.detok.text if req.detok is not None else "".join(e.text for e in evs)
    if fmt is None:
        return {"role": "assistant", "content": text}
    data = encode(whole(req.speech.audio), ctx.engine.sample_rate, fmt)
    return {"role": "assistant", "content": None,
            "audio": {"id": audio_id(), "data": base64.b64encode(data).decode(),
                      "expires_at": created + AUDIO_EXPIRES_S, "transcript": text}}


async def chat_completion(ctx: Context, body: ChatBody):
    if (bad := check_model(ctx, body)) is not None:
        return bad
    speech, bad = speech_out(body)
    if bad is not None:
        return bad
    if speech is not None and body.n > 1:
        return error(400, f"n={body.n} with audio out: a spoken answer is served for one choice", param="n")
    if body.chat_template is not None:
        return error(400, "a request's own chat_template is not served: requests render with the server's template",
                     param="chat_template")
    if body.max_tokens is not None and body.max_completion_tokens is not None:
        return error(400, "give max_tokens or max_completion_tokens, not both", param="max_tokens")
    try:
        extra = {"max_tokens": body.max_completion_tokens} if body.max_completion_tokens else {}
        params = body.params(logprobs=body.logprobs, top_logprobs=body.top_logprobs or 0, **extra)
    except ValidationError as e:
        return error(400, str(e.errors()[0]["msg"]))
    parsed, bad = await decode(ctx, body)
    if bad is not None:
        return bad
    messages, media = parsed
    rid = f"chatcmpl-{request_id() or uuid.uuid4().hex}"
    fmt = body.audio.format if speech is not None else None
    done = await answer(ctx, True, rid, body, dict(messages=messages, media=media, split=True, params=params,
                                                   template_kwargs=body.chat_template_kwargs,
                                                   request_id=rid, speech=speech), audio=fmt)
    if not isinstance(done, tuple):
        return done
    subs, created = done
    return {"id": rid, "object": "chat.completion", "created": created, "model": ctx.model_name,
            "choices": [{"index": i, "message": chat_message(ctx, req, evs, fmt, created),
                         "logprobs": chat_logprobs(ctx.engine.tokenizer, req, 0, len(req.output)),
                         "finish_reason": req.finish_reason} for i, (req, evs) in enumerate(subs)],
            "usage": usage_of([req for req, _ in subs])}


async def completion(ctx: Context, body: CompletionBody):
    if (bad := check_model(ctx, body)) is not None:
        return bad
    if body.echo:
        return error(400, "echo is not served", param="echo")
    try:
        params = body.params(logprobs=body.logprobs is not None, top_logprobs=body.logprobs or 0)
    except ValidationError as e:
        return error(400, str(e.errors()[0]["msg"]))
    rid = f"cmpl-{request_id() or uuid.uuid4().hex}"
    kw = dict(prompt_token_ids=body.prompt) if isinstance(body.prompt, list) else dict(prompt=body.prompt)
    done = await answer(ctx, False, rid, body, dict(**kw, params=params, request_id=rid))
    if not isinstance(done, tuple):
        return done
    subs, created = done
    return {"id": rid, "object": "text_completion", "created": created, "model": ctx.model_name,
            "choices": [{"index": i, "text": req.detok.text if req.detok is not None else "",
                         "token_ids": list(req.output),
                         "logprobs": completion_logprobs(ctx.engine.tokenizer, req, 0, len(req.output), 0)[0],
                         "finish_reason": req.finish_reason} for i, (req, _) in enumerate(subs)],
            "usage": usage_of([req for req, _ in subs])}
