"""POST /v1/audio/speech: OpenAI's text to speech over a plan that speaks.

The input is spoken as given: the request carries its token ids to speak, and the LLM generates nothing.
A system turn holds `instructions` when given; the user turn holds the input. The answer is the waveform
in `response_format`: streamed chunk by chunk for wav and pcm (raw bytes, or with stream_format 'sse'
`speech.audio.delta` events then one `speech.audio.done` with usage), whole for the formats encoded once
the speech has ended. Usage counts the prompt's tokens in and the codec frames out.
"""
from __future__ import annotations

import base64
import uuid

from graphc.errors import InvalidInput
from graphc.runtime.speech import SpeechParams
from graphc.serve.audio_out import MEDIA_TYPES, STREAMED, Stream, check_format, encode, whole
from graphc.serve.context import Context
from graphc.serve.errors import error, stream_error, wrong_model
from graphc.serve.middleware import request_id
from graphc.serve.schemas import SpeechBody
from graphc.serve.streaming import collect, sse


def register(app, ctx: Context) -> None:
    """Add the route to `app`."""

    @app.post("/v1/audio/speech")
    async def speech_route(body: SpeechBody):
        """Text to speech: the input is spoken as given (the LLM generates nothing). A system turn holds
        `instructions` when given; the user turn holds the input."""
        return await speak(ctx, body)


def speech_usage(req) -> dict:
    """The prompt's tokens in, the codec frames out."""
    frames = len(req.speech.frames)
    return {"input_tokens": len(req.prompt.ids), "output_tokens": frames, "total_tokens": len(req.prompt.ids) + frames}


async def chunks(ctx: Context, req, events, enc: Stream, as_sse: bool):
    """The waveform's bytes as they come, or as server-sent events; a client that goes away frees the
    request at once."""
    try:
        while True:
            ev = await events.get()
            if ev.audio is not None and len(ev.audio):
                chunk = enc.add(ev.audio)
                yield (sse({"type": "speech.audio.delta", "audio": base64.b64encode(chunk).decode()})
                       if as_sse else chunk)
            if ev.finished:
                if as_sse:
                    yield sse(stream_error(req.error) if req.error else
                              {"type": "speech.audio.done", "usage": speech_usage(req)})
                return
    finally:
        if not req.closed:
            ctx.driver.abort(req.id)


def check(ctx: Context, body: SpeechBody):
    """(the audio format, the input's token ids, None), or (None, None, the refusal)."""
    if (bad := wrong_model(body.model, ctx.names)) is not None:
        return None, None, bad
    if body.speed != 1.0:
        return None, None, error(400, f"speed {body.speed} is not served: the model speaks at its own pace",
                                 param="speed")
    try:
        fmt = check_format(body.response_format, stream=body.stream_format == "sse", param="response_format")
        if not ctx.engine.speaks:
            raise InvalidInput("this plan does not speak", f"its kinds: {', '.join(ctx.engine.kinds())}",
                               "serve a plan of a model that speaks", param="model")
        return fmt, ctx.engine.tokenize(prompt=body.input), None
    except InvalidInput as e:
        return None, None, error(400, str(e), param=e.param)


async def speak(ctx: Context, body: SpeechBody):
    from fastapi.responses import Response, StreamingResponse

    fmt, ids, bad = check(ctx, body)
    if bad is not None:
        return bad
    messages = ([{"role": "system", "content": body.instructions}] if body.instructions else []) + \
        [{"role": "user", "content": body.input}]
    rid = f"speech-{request_id() or uuid.uuid4().hex}"
    speech = SpeechParams(voice=body.voice, seed=body.seed, max_frames=body.max_frames)
    started, bad = await ctx.submit(dict(messages=messages, request_id=rid, speech=speech, speak=ids))
    if bad is not None:
        return bad
    req, events = started
    rate = ctx.engine.sample_rate
    as_sse = body.stream_format == "sse"
    if as_sse or fmt in STREAMED:
        media = "text/event-stream" if as_sse else MEDIA_TYPES[fmt]
        return StreamingResponse(chunks(ctx, req, events, Stream(fmt, rate), as_sse), media_type=media)
    await collect(events)
    if req.error:
        return error(500, req.error, kind="server_error")
    return Response(encode(whole(req.speech.audio), rate, fmt), media_type=MEDIA_TYPES[fmt])
