"""POST /v1/chat/completions and POST /v1/completions: text out, streamed or whole.

Chat takes OpenAI's messages (text, and the media parts the plan's kinds take: decoded in a worker
thread, never in the engine's, and bounded by what the plan's prompts can hold); with modalities
["text", "audio"] and audio {voice, format} the answer is spoken too (message.audio: the waveform and
its transcript). With tools, chat answers' `<tool_call>` blocks become tool_calls (graphc/serve/tools.py).
Completions take a text prompt or token ids. Both stream as server-sent events ending in `data: [DONE]`,
with a usage chunk when stream_options.include_usage (and the usage so far in every chunk with
continuous_usage_stats). A completions prompt may be a batch: each prompt's n choices in turn. Both take
response_format (text, json_object, json_schema): the answer is then decoded under its grammar
(graphc/runtime/grammar.py).
"""
from __future__ import annotations

import base64
import time
import uuid
from dataclasses import dataclass

from pydantic import ValidationError

from graphc.errors import InvalidInput
from graphc.runtime.inputs import split_messages
from graphc.runtime.speech import SpeechParams
from graphc.serve.audio_out import Stream, check_format, encode, whole
from graphc.serve.context import Context
from graphc.serve.errors import error, refusal, stream_error, wrong_model
from graphc.serve.logprobs import chat_logprobs, completion_logprobs, output_entries, prompt_entries, prompt_logprobs
from graphc.serve.middleware import request_id
from graphc.serve.schemas import Body, ChatBody, CompletionBody, StreamOptions
from graphc.serve.streaming import collect, sse
import graphc.serve.tools as tools

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
    if body.stream_options is not None and not body.stream:
        return error(400, "stream_options is for streamed requests: send stream true, or leave it out",
                     param="stream_options")
    if body.stream and body.prompt_logprobs is not None:
        return error(400, "prompt_logprobs is served on whole answers, not streamed ones; stream /v1/completions "
                     "with echo and logprobs to see the prompt's logprobs in its first chunk", param="prompt_logprobs")
    return None


def usage_of(reqs: list, n: int = 1) -> dict:
    """The usage of a request's choices, n to a prompt: each prompt (and its cached rows) counted once, every
    choice's tokens."""
    out = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0, "prompt_tokens_details": {"cached_tokens": 0}}
    for i, req in enumerate(reqs):
        one = usage(req)
        first = i % n == 0
        out["prompt_tokens"] += one["prompt_tokens"] if first else 0
        out["prompt_tokens_details"]["cached_tokens"] += req.cached if first else 0
        out["completion_tokens"] += one["completion_tokens"]
        if "completion_tokens_details" in one:
            out["completion_tokens_details"] = one["completion_tokens_details"]     # speech: one choice
    out["total_tokens"] = out["prompt_tokens"] + out["completion_tokens"]
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


def batch_kwargs(prompts: list[dict], rid: str, n: int) -> list[dict]:
    """The engine requests of every prompt's n choices, in turn: prompt p's ids based on rid-p (rid alone for one
    prompt)."""
    if len(prompts) == 1:
        return choice_kwargs(prompts[0], rid, n)
    return [kw for p, one in enumerate(prompts) for kw in choice_kwargs({**one, "request_id": f"{rid}-{p}"},
                                                                          f"{rid}-{p}", n)]


def usage(req) -> dict:
    """OpenAI's token usage; a speaking request's codec frames (12.5 a second of audio) as audio tokens."""
    done = len(req.known)             # streamed, a token still in flight is not counted yet
    out = {"prompt_tokens": len(req.prompt.ids), "completion_tokens": done, "total_tokens": len(req.prompt.ids) + done}
    if req.speech is not None:
        out["completion_tokens_details"] = {"audio_tokens": len(req.speech.frames), "text_tokens": done}
    return out


@dataclass(frozen=True)
class TextView:
    """How /v1/completions shows each choice: the prompt's text first when echoed, logprobs of `top`
    alternatives when asked (the echoed prompt's first)."""
    echo: tuple[str, ...] | None = None      # each prompt's text, when echoed
    top: int | None = None                   # logprobs asked for (None: none)
    n: int = 1                               # choices a prompt

    def show(self, tokenizer, req, index: int, start: int, end: int, offset: int,
             first: bool) -> tuple[str, dict | None, int]:
        """(the text before output tokens start..end's own, their logprobs, the character offset after them) of
        choice `index`; first: the choice's first piece, where an echoed prompt goes."""
        echo = first and self.echo is not None
        prefix = self.echo[index // self.n] if echo else ""
        if self.top is None:
            return prefix, None, offset
        out = None
        if echo:
            out, offset = completion_logprobs(tokenizer, prompt_entries(req), self.top, offset)
        out, offset = completion_logprobs(tokenizer, output_entries(req, start, end), self.top, offset, out)
        return prefix, out, offset


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


async def chunks(ctx: Context, subs: list, head: dict, opts: StreamOptions, n: int, audio: AudioDeltas | None,
                 view: TextView = TextView(), calls: tools.Calls = tools.Calls()):
    """The stream's events, each choice's under its index (n to a prompt; a completion's as `view` shows it; a
    chat answer's text parsed for tool calls where `calls` says), with the usage as `opts` asks; a client that
    goes away frees every choice's pages."""
    chat = head["object"] == "chat.completion.chunk"
    reqs = [req for req, _ in subs]
    streams = [tools.CallStream(calls.most, calls.render) for _ in reqs] if calls.parse else None
    sent, offset = [0] * len(reqs), [0] * len(reqs)    # tokens sent; characters of their logprobs' text
    shown = [False] * len(reqs)                        # a piece of the choice went (an echoed prompt with it)
    try:
        if chat:
            yield sse({**head, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""},
                                            "finish_reason": None} for i in range(len(reqs))]})
        async for i, ev in merged(subs):
            req, known = reqs[i], len(reqs[i].known)    # the engine thread may add more meanwhile
            piece = choice(ctx.engine.tokenizer, req, ev, chat, audio, sent[i], known, i)
            if streams:
                piece = tools.stream_piece(streams[i], piece, ev.text, ev.finished)
            if not chat:
                prefix, piece["logprobs"], offset[i] = view.show(ctx.engine.tokenizer, req, i, sent[i], known,
                                                                 offset[i], not shown[i])
                piece["text"] = prefix + piece["text"]
            if ev.token_ids or ev.text or ev.finished or piece.get("delta") or piece.get("text"):
                shown[i] = True
                yield sse({**head, "choices": [piece]} | ({"usage": usage_of(reqs, n)} if opts.continuous_usage_stats
                                                         else {}))
            sent[i] = known
            if ev.finished and req.error:
                yield sse(stream_error(req.error))
        if opts.include_usage:
            yield sse({**head, "choices": [], "usage": usage_of(reqs, n)})
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


async def answer(ctx: Context, chat: bool, rid: str, body: Body, prompts: list[dict], audio: str | None = None,
                 view: TextView = TextView(), calls: tools.Calls = tools.Calls()):
    """Submit body.n choices of each prompt (the engine's add() kwargs of each); a streamed response, an error
    response, or ([(request, its events)], created) once every choice finished. audio: the format of a speaking
    request's audio; view: how completions show a choice; calls: how chat parses its tool calls."""
    from fastapi.responses import StreamingResponse

    if (bad := await compile_guide(ctx, prompts[0]["params"])) is not None:
        return bad
    subs = []
    for kw in batch_kwargs(prompts, rid, body.n):
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
        return StreamingResponse(chunks(ctx, subs, head, body.stream_options or StreamOptions(), body.n, deltas, view,
                                        calls),
                                 media_type="text/event-stream")
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
    if body.chat_template is not None and not ctx.own_templates:
        return error(400, "a request's own chat_template is refused: requests render with the server's template; "
                     "start graphc run with --trust-request-chat-template to let requests bring their own",
                     param="chat_template")
    if body.max_tokens is not None and body.max_completion_tokens is not None:
        return error(400, "give max_tokens or max_completion_tokens, not both", param="max_tokens")
    try:
        extra = {"max_tokens": body.max_completion_tokens} if body.max_completion_tokens else {}
        params = body.params(logprobs=body.logprobs, top_logprobs=body.top_logprobs or 0, **extra)
    except ValidationError as e:
        return error(400, str(e.errors()[0]["msg"]))
    try:
        calls = tools.check(body.tools, body.tool_choice, body.parallel_tool_calls, speaking=speech is not None,
                            form=tools.form_of(ctx.engine.template, body.chat_template),
                            xml_style=ctx.engine.host.tool_xml_style)
        params = tools.constrained(params, calls.guide)
        template_kwargs = tools.variables(body.chat_template_kwargs, calls)
    except InvalidInput as e:
        return error(400, str(e), param=e.param)
    parsed, bad = await decode(ctx, body)
    if bad is not None:
        return bad
    messages, media = parsed
    rid = f"chatcmpl-{request_id() or uuid.uuid4().hex}"
    fmt = body.audio.format if speech is not None else None
    done = await answer(ctx, True, rid, body, [dict(messages=messages, media=media, split=True, params=params,
                                                    template_kwargs=template_kwargs, chat_template=body.chat_template,
                                                    request_id=rid, speech=speech)], audio=fmt, calls=calls)
    if not isinstance(done, tuple):
        return done
    return chat_response(ctx, body, rid, *done, fmt, calls)


def chat_response(ctx: Context, body: ChatBody, rid: str, subs: list, created: int, fmt: str | None,
                  calls: tools.Calls) -> dict:
    """A whole chat answer: each choice's message (tool calls parsed where `calls` says), logprobs and finish
    reason; the usage; the prompt's logprobs when asked."""
    parsed = (lambda c: tools.whole_choice(c, calls)) if calls.parse else (lambda c: c)
    out = {"id": rid, "object": "chat.completion", "created": created, "model": ctx.model_name,
           "choices": [parsed({"index": i, "message": chat_message(ctx, req, evs, fmt, created),
                               "logprobs": chat_logprobs(ctx.engine.tokenizer, req, 0, len(req.output)),
                               "finish_reason": req.finish_reason}) for i, (req, evs) in enumerate(subs)],
           "usage": usage_of([req for req, _ in subs], body.n)}
    if body.prompt_logprobs is not None:
        out["prompt_logprobs"] = prompt_logprobs(ctx.engine.tokenizer, subs[0][0], body.prompt_logprobs)
    return out


async def completion(ctx: Context, body: CompletionBody):
    if (bad := check_model(ctx, body)) is not None:
        return bad
    tokenizer = ctx.engine.tokenizer
    prompts = batch_of(body.prompt)
    if not prompts:
        return error(400, "prompt is an empty batch: send a prompt, or a list of them", param="prompt")
    if body.echo and tokenizer is None and any(isinstance(p, list) for p in prompts):
        return error(400, "echo of token ids needs a tokenizer, and this server has none; start graphc run with "
                     "--tokenizer DIR (or --checkpoint DIR) holding tokenizer.json", param="echo")
    scored = [k for k in (body.prompt_logprobs, body.logprobs if body.echo else None) if k is not None]
    try:
        params = body.params(logprobs=body.logprobs is not None, top_logprobs=body.logprobs or 0,
                             prompt_logprobs=max(scored) if scored else None)
    except ValidationError as e:
        return error(400, str(e.errors()[0]["msg"]))
    rid = f"cmpl-{request_id() or uuid.uuid4().hex}"
    echo = None if not body.echo else tuple(
        p if isinstance(p, str) else tokenizer.decode(p, skip_special_tokens=False) for p in prompts)
    view = TextView(echo, body.logprobs, body.n)
    done = await answer(ctx, False, rid, body, [dict(prompt_token_ids=p, params=params, request_id=rid)
                                                if isinstance(p, list) else dict(prompt=p, params=params, request_id=rid)
                                                for p in prompts], view=view)
    if not isinstance(done, tuple):
        return done
    subs, created = done
    return {"id": rid, "object": "text_completion", "created": created, "model": ctx.model_name,
            "choices": [text_choice(tokenizer, req, i, view, body.prompt_logprobs) for i, (req, _) in enumerate(subs)],
            "usage": usage_of([req for req, _ in subs], body.n)}


def batch_of(prompt) -> list:
    """A completions prompt as a batch: one text, one list of ids, or a list of either."""
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        return [prompt]
    return list(prompt)


def text_choice(tokenizer, req, index: int, view: TextView, prompt_top: int | None) -> dict:
    """A whole /v1/completions choice: its text (after the echoed prompt), token ids, logprobs, and the
    prompt's logprobs when asked (prompt_logprobs)."""
    prefix, logprobs, _ = view.show(tokenizer, req, index, 0, len(req.output), 0, True)
    out = {"index": index, "text": prefix + (req.detok.text if req.detok is not None else ""),
           "token_ids": list(req.output), "logprobs": logprobs, "finish_reason": req.finish_reason}
    if prompt_top is not None:
        out["prompt_logprobs"] = prompt_logprobs(tokenizer, req, prompt_top)
    return out
