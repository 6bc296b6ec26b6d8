"""POST /v1/audio/transcriptions: OpenAI's transcription API over the engine.

A multipart form as OpenAI takes it: `file` (WAV, FLAC, OGG, MP3: whatever media.load_audio decodes;
resampled to 16 kHz), `model`, `language` (an ISO-639-1 code such as 'en', or the English name:
languages.py), `prompt`, `response_format` (json | text | verbose_json), `temperature` (0..1, 0 greedy,
the default) and `stream`. Any other field is refused by name. The body is counted while it is read: past
`max_audio_bytes` (and a little for the form's other fields) it is a 413 before anything is decoded, from
Content-Length when the client sends one.

How the engine hears it: the model's Transcription (graphc.Transcription: the engine's `transcription`,
else default_transcription.py's instruction) writes the text prompt around one audio item and reads the
answer; the request goes through the Driver like a chat request (its kind is the plan's a2t).
Output is capped at 64 + 30 tokens a second of audio (about four times the fastest speech, so a model
stuck repeating stops early; finish_reason 'length') when the prompt surely leaves that much room in the
plan's max_seq_len (counting 100 audio rows a second, a mel frame's rate); a longer clip may generate what
the plan allows, as a chat request without max_tokens does.

verbose_json: {task, language, duration, text, segments, usage}. `language` is the lowercase English
name (as OpenAI gives it): what the reader reports (the model's own word, or the one asked for), else ''.
`segments` holds one segment for the whole clip (start 0, end = duration) with the generated token ids,
their mean logprob and the text's compression ratio; no_speech_prob is not estimated (0.0). Its usage
is OpenAI's verbose shape {type: duration, seconds}; json and the stream's done event carry token usage
{type: tokens, input_tokens, output_tokens, total_tokens, input_token_details: {audio_tokens, text_tokens}}.
Streamed: `transcript.text.delta` events, then one `transcript.text.done` with the text and usage.
"""
from __future__ import annotations

import uuid
import zlib
from dataclasses import dataclass

from graphc.errors import InvalidInput
from graphc.runtime.media import AUDIO_RATE, MediaError, load_audio
from graphc.runtime.sampler import SamplingParams
from graphc.serve.context import Context
from graphc.serve.default_transcription import DefaultTranscription
from graphc.serve.errors import error, refusal, stream_error, wrong_model
from graphc.serve.middleware import request_id
from graphc.serve.languages import language_name
from graphc.serve.streaming import sse
from graphc.serving import Media

DEFAULT_MAX_AUDIO_BYTES = 25 * 1024 * 1024     # OpenAI's 25 MB upload limit
FORM_SLACK = 64 * 1024                         # the form's other fields and boundaries, on top of the file
FIELDS = ("file", "model", "language", "prompt", "response_format", "temperature", "stream")
NOT_SERVED = ("include", "timestamp_granularities", "chunking_strategy", "known_speaker_names",
              "known_speaker_references")
FORMATS = ("json", "text", "verbose_json")
MIN_TOKENS, TOKENS_PER_SECOND = 64, 30
ROWS_PER_SECOND = 100          # audio rows a second the encoders give at most (mel frames; most give fewer)


class TooLarge(Exception):
    pass


@dataclass
class Options:
    """A request's form values, checked."""

    fmt: str
    stream: bool
    temperature: float
    language: str | None       # the English name
    context: str               # the caller's prompt


def output_cap(prompt: str, seconds: float, max_seq_len: int) -> int | None:
    """64 + 30 tokens a second of audio, when the prompt surely leaves that much room (its bytes bound its
    tokens; an encoder gives at most ROWS_PER_SECOND rows a second); else None: what the plan allows."""
    cap = MIN_TOKENS + int(TOKENS_PER_SECOND * seconds + 0.5)
    return cap if len(prompt.encode()) + ROWS_PER_SECOND * seconds + cap <= max_seq_len else None


def register(app, ctx: Context) -> None:
    """Add POST /v1/audio/transcriptions to `app`, a plain Starlette route: the form is read in it,
    counted as it arrives."""
    how = ctx.engine.transcription or DefaultTranscription()

    async def transcriptions(request):
        return await route(ctx, how, request)
    app.add_route("/v1/audio/transcriptions", transcriptions, methods=["POST"])


def too_large(ctx: Context):
    return error(413, f"the upload is over {ctx.max_audio_bytes:,} bytes, the most this server takes", param="file")


async def read_form(request, limit: int):
    """The multipart form, read as it arrives; TooLarge once more than `limit` bytes came."""
    from starlette.formparsers import MultiPartParser

    async def counted():
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise TooLarge
            yield chunk
    parser = MultiPartParser(request.headers, counted(), max_files=1, max_fields=len(FIELDS) + 8)
    return await parser.parse()


async def route(ctx: Context, how, request):
    from fastapi.responses import JSONResponse
    from starlette.formparsers import MultiPartException

    n = request.headers.get("content-length", "")
    if n.isdigit() and int(n) > ctx.max_audio_bytes + FORM_SLACK:
        return too_large(ctx)
    ctype = request.headers.get("content-type", "")
    if not ctype.lower().startswith("multipart/form-data"):
        return error(400, f"the body is '{ctype or 'no content type'}'; send multipart/form-data with the "
                          "audio in `file`")
    try:
        form = await read_form(request, ctx.max_audio_bytes + FORM_SLACK)
    except TooLarge:
        return too_large(ctx)
    except MultiPartException as e:
        return error(400, f"the multipart form does not parse: {e.message}")
    try:
        out = await transcribe(ctx, how, form)
    finally:
        await form.close()
    return JSONResponse(out) if isinstance(out, dict) else out


def read_fields(form):
    """(the form's fields by name, None), or (None, the refusal) of a field unknown, not served, given
    twice or of the wrong kind, or of a missing file."""
    from starlette.datastructures import UploadFile

    fields: dict = {}
    for key, value in form.multi_items():
        if key.removesuffix("[]") in NOT_SERVED:
            return None, error(400, f"{key} is not served here; fields taken: {', '.join(FIELDS)}", param=key)
        if key not in FIELDS:
            return None, error(400, f"unknown field '{key}'; fields taken: {', '.join(FIELDS)}", param=key)
        if key in fields:
            return None, error(400, f"{key} is given twice", param=key)
        fields[key] = value
    if not isinstance(fields.get("file"), UploadFile):
        return None, error(400, "send the audio as a file upload in `file`", param="file")
    for key in FIELDS[1:]:
        if key in fields and not isinstance(fields[key], str):
            return None, error(400, f"{key} must be a form value, not a file", param=key)
    return fields, None


def _bool(value: str) -> bool | None:
    return {"true": True, "1": True, "false": False, "0": False}.get(value.strip().lower())


def read_options(ctx: Context, fields: dict):
    """(Options, None), or (None, the refusal) of a value amiss or of a plan that cannot transcribe."""
    if (bad := wrong_model(fields.get("model"), ctx.names)) is not None:
        return None, bad
    fmt = fields.get("response_format", "json")
    if fmt not in FORMATS:
        return None, error(400, f"response_format '{fmt}' is not served; use one of {', '.join(FORMATS)}",
                           param="response_format")
    stream = _bool(fields.get("stream", "false"))
    if stream is None:
        return None, error(400, f"stream must be true or false, not '{fields['stream']}'", param="stream")
    try:
        temperature = float(fields.get("temperature", "0"))
    except ValueError:
        temperature = float("nan")
    if not 0 <= temperature <= 1:
        return None, error(400, f"temperature must be a number from 0 to 1, not '{fields['temperature']}'",
                           param="temperature")
    language = None
    if fields.get("language", "").strip():
        try:
            language = language_name(fields["language"])
        except InvalidInput as e:
            return None, error(400, str(e), param="language")
    if (bad := can_transcribe(ctx)) is not None:
        return None, bad
    return Options(fmt, stream, temperature, language, fields.get("prompt", "")), None


def can_transcribe(ctx: Context):
    """None when the plan and checkpoint can transcribe, else the refusal."""
    engine = ctx.engine
    if "a2t" not in engine.kinds():
        return error(400, f"this server's model ({ctx.model_name}) takes no audio: its kinds are "
                          f"{', '.join(engine.kinds())}; transcription needs a plan with an a2t kind", param="model")
    if engine.template is None or engine.tokenizer is None:
        return error(400, "transcription needs a tokenizer.json and chat template; start the server with "
                          "--tokenizer DIR (or --checkpoint DIR) holding them")
    return None


async def read_audio(ctx: Context, upload):
    """(the upload's waveform at 16 kHz, None) decoded in a worker thread, or (None, a refusal): too large,
    not audio, or 429 before decoding when the queue is full."""
    from starlette.concurrency import run_in_threadpool

    if upload.size is not None and upload.size > ctx.max_audio_bytes:
        return None, too_large(ctx)
    data = await upload.read()
    if len(data) > ctx.max_audio_bytes:
        return None, too_large(ctx)
    try:
        ctx.driver.admit()                 # a full queue refuses before the audio is decoded
        return await run_in_threadpool(load_audio, data, AUDIO_RATE, ctx.limits.audio_seconds, ctx.limits.why), None
    except MediaError as e:
        return None, error(400, f"file: {e}", param="file")
    except Exception as e:
        if (bad := refusal(e)) is None:
            raise
        return None, bad


async def transcribe(ctx: Context, how, form):
    from fastapi.responses import StreamingResponse

    fields, bad = read_fields(form)
    if bad is not None:
        return bad
    opts, bad = read_options(ctx, fields)
    if bad is not None:
        return bad
    wave, bad = await read_audio(ctx, fields["file"])
    if bad is not None:
        return bad
    duration = len(wave) / AUDIO_RATE
    prompt = how.prompt(ctx.engine.template, opts.context, opts.language)
    params = SamplingParams(temperature=opts.temperature, logprobs=opts.fmt == "verbose_json",
                            max_tokens=output_cap(prompt, duration, ctx.engine.max_seq_len))
    rid = f"trsc-{request_id() or uuid.uuid4().hex}"
    started, bad = await ctx.submit(dict(prompt=prompt, media=[Media("audio", wave)], params=params,
                                         request_id=rid))
    if bad is not None:
        return bad
    req, events = started
    reader = how.reader(opts.language)
    if opts.stream:
        return StreamingResponse(deltas(ctx, req, events, reader), media_type="text/event-stream")
    while not (await events.get()).finished:
        pass
    if req.error:
        return error(500, req.error, kind="server_error")
    reader.add(req.detok.text, last=True)
    return answer(req, reader, opts, duration)


def usage(req) -> dict:
    """Token usage, the prompt's audio rows and text tokens apart."""
    audio = sum(len(p.rows) for m in req.prompt.media for p in m.pieces)
    n_in, n_out = len(req.prompt.ids), len(req.output)
    return {"type": "tokens", "input_tokens": n_in, "output_tokens": n_out, "total_tokens": n_in + n_out,
            "input_token_details": {"audio_tokens": audio, "text_tokens": n_in - audio}}


def answer(req, reader, opts: Options, duration: float):
    """The finished transcription in the response format asked for."""
    from fastapi.responses import PlainTextResponse

    text = reader.text
    if opts.fmt == "text":
        return PlainTextResponse(text)
    if opts.fmt == "json":
        return {"text": text, "usage": usage(req)}
    lps = [e["logprob"] for e in req.logprobs or []]
    blob = text.encode()
    segment = {"id": 0, "seek": 0, "start": 0.0, "end": duration, "text": text, "tokens": list(req.output),
               "temperature": opts.temperature, "avg_logprob": sum(lps) / len(lps) if lps else 0.0,
               "compression_ratio": len(blob) / len(zlib.compress(blob)) if blob else 0.0, "no_speech_prob": 0.0}
    return {"task": "transcribe", "language": reader.language.lower(), "duration": duration, "text": text,
            "segments": [segment], "usage": {"type": "duration", "seconds": duration}}


async def deltas(ctx: Context, req, events, reader):
    """The streamed transcript: a delta event as text becomes final, then the done event; a client that
    goes away frees the request at once."""
    try:
        while True:
            ev = await events.get()
            if ev.finished and req.error:
                yield sse(stream_error(req.error))
                return
            delta = reader.add(ev.text, last=ev.finished)
            if delta:
                yield sse({"type": "transcript.text.delta", "delta": delta})
            if ev.finished:
                yield sse({"type": "transcript.text.done", "text": reader.text, "usage": usage(req)})
                return
    finally:
        if req.finish_reason is None:          # the client went away: free its pages now
            ctx.driver.abort(req.id)
