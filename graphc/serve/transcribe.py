"""POST /v1/audio/transcriptions: OpenAI's transcription API over the engine.

A multipart form as OpenAI takes it: `file` (WAV, FLAC, OGG, MP3: whatever media.load_audio decodes;
resampled to 16 kHz), `model`, `language` (ISO-639-1 such as 'en', or the English name), `prompt`,
`response_format` (json | text | verbose_json), `temperature` (0..1, 0 greedy, the default) and `stream`.
Any other field is refused by name. The body is counted while it is read: past `max_audio_bytes` (and a
little for the form's other fields) it is a 413 before anything is decoded, from Content-Length when the
client sends one.

How the engine hears it: the chat template renders a system message and a user message holding one
audio part, and the request goes through the server's Driver like a chat request (its kind is the
plan's a2t).
  Qwen3-ASR: the system message is the `prompt` (its context), the user message the audio alone (as
    QwenLM's qwen_asr builds it). The model answers `language English<asr_text>the text`; the text is
    what follows the tag (split_asr). A given language is forced the way qwen_asr forces it: the
    prompt ends in `language English<asr_text>`, and the answer is the text alone.
  Other models with an a2t kind (Qwen3-Omni): the user message is the audio and an instruction
    ("Transcribe the audio into text.", naming the language when given); the `prompt`, when given,
    is the system message. The answer is returned as it is.
Output is capped at 64 + 30 tokens a second of audio (about four times the fastest speech, so a model
stuck repeating stops early; finish_reason 'length') when the prompt surely leaves that much room in the
plan's max_seq_len (counting 100 audio rows a second, a mel frame's rate); a longer clip may generate what
the plan allows, as a chat request without max_tokens does.

verbose_json: {task, language, duration, text, segments, usage}. `language` is the lowercase English
name (as OpenAI gives it): what Qwen3-ASR reported or was told, the asked one for other models, else ''.
`segments` holds one segment for the whole clip (start 0, end = duration) with the generated token ids,
their mean logprob and the text's compression ratio; no_speech_prob is not estimated (0.0). Its usage
is OpenAI's verbose shape {type: duration, seconds}; json and the stream's done event carry token usage
{type: tokens, input_tokens, output_tokens, total_tokens, input_token_details: {audio_tokens, text_tokens}}.
Streamed: `transcript.text.delta` events, then one `transcript.text.done` with the text and usage.
"""
from __future__ import annotations

import json
import uuid
import zlib
from pathlib import Path

from graphc.errors import InvalidInput

DEFAULT_MAX_AUDIO_BYTES = 25 * 1024 * 1024     # OpenAI's 25 MB upload limit
FORM_SLACK = 64 * 1024                         # the form's other fields and boundaries, on top of the file
FIELDS = ("file", "model", "language", "prompt", "response_format", "temperature", "stream")
NOT_SERVED = ("include", "timestamp_granularities", "chunking_strategy", "known_speaker_names",
              "known_speaker_references")
FORMATS = ("json", "text", "verbose_json")
SAMPLE_RATE = 16_000
ASR_TAG = "<asr_text>"
LANG_PREFIX = "language "
MIN_TOKENS, TOKENS_PER_SECOND = 64, 30
ROWS_PER_SECOND = 100          # audio rows a second the encoders give at most (mel frames; Qwen's AuT gives 12.5)

# ISO-639-1 codes of the languages Qwen3-ASR names (its SUPPORTED_LANGUAGES); the name is what it writes
LANGUAGES = {
    "zh": "Chinese", "en": "English", "yue": "Cantonese", "ar": "Arabic", "de": "German", "fr": "French",
    "es": "Spanish", "pt": "Portuguese", "id": "Indonesian", "it": "Italian", "ko": "Korean", "ru": "Russian",
    "th": "Thai", "vi": "Vietnamese", "ja": "Japanese", "tr": "Turkish", "hi": "Hindi", "ms": "Malay",
    "nl": "Dutch", "sv": "Swedish", "da": "Danish", "fi": "Finnish", "pl": "Polish", "cs": "Czech",
    "tl": "Filipino", "fil": "Filipino", "fa": "Persian", "el": "Greek", "ro": "Romanian", "hu": "Hungarian",
    "mk": "Macedonian",
}


class TooLarge(Exception):
    pass


def language_name(given: str) -> str:
    """'en' or 'English' (any case) -> 'English'; anything else is refused with the accepted codes."""
    g = given.strip()
    if g.lower() in LANGUAGES:
        return LANGUAGES[g.lower()]
    names = {v.lower(): v for v in LANGUAGES.values()}
    if g.lower() in names:
        return names[g.lower()]
    raise InvalidInput(f"language '{given}' is not one this server names",
                       f"ISO-639-1 codes taken: {', '.join(sorted(LANGUAGES))}", "send one of those, or leave it out")


def split_asr(raw: str, forced: str | None = None) -> tuple[str, str]:
    """Qwen3-ASR's answer -> (language, text). 'language English<asr_text>hello' -> ('English', 'hello');
    'language None<asr_text>' (no speech) -> ('', ''); an answer that does not start with the language
    header and its tag is all text. With a forced language the answer is the text alone."""
    s = raw.strip()
    if forced:
        return forced, s
    if s[:len(LANG_PREFIX)].lower() == LANG_PREFIX and ASR_TAG in s:
        meta, text = s.split(ASR_TAG, 1)
        lines = meta[len(LANG_PREFIX):].strip().splitlines()
        lang = lines[0].strip() if lines else ""
        if lang.lower() == "none":
            lang = ""
        return (lang[:1].upper() + lang[1:].lower()), text.strip()
    return "", s


class AsrStream:
    """Streams what split_asr will return, piece by piece: the header is held until its tag arrives,
    trailing whitespace until something follows it. The pieces join to split_asr(all of it)[1]."""

    def __init__(self, forced: str | None = None):
        self.forced, self.raw, self.sent = forced, "", ""

    def _final_prefix(self) -> str:
        s = self.raw.lstrip()
        if self.forced:
            return s.rstrip()
        head = s[:len(LANG_PREFIX)].lower()
        if not LANG_PREFIX.startswith(head):          # not the header: all of it is text
            return s.rstrip()
        if len(head) == len(LANG_PREFIX) and ASR_TAG in s:
            return s.split(ASR_TAG, 1)[1].strip()
        return ""                                     # maybe the header: wait for its tag

    def _emit(self, text: str) -> str:
        assert text.startswith(self.sent), (text, self.sent)
        out = text[len(self.sent):]
        self.sent = text
        return out

    def add(self, text: str, last: bool = False) -> str:
        """The text that became final; `last`: the answer ended, all that is left."""
        self.raw += text
        if last:
            return self._emit(split_asr(self.raw, self.forced)[1])
        now = self._final_prefix()
        return self._emit(now) if len(now) > len(self.sent) else ""

    @property
    def text(self) -> str:
        return split_asr(self.raw, self.forced)[1]


class PassThrough:
    """Other models' answers: as they come."""

    def __init__(self):
        self.raw = ""

    def add(self, text: str, last: bool = False) -> str:
        self.raw += text
        return text

    @property
    def text(self) -> str:
        return self.raw


def is_qwen3_asr(engine) -> bool:
    m = engine.plan.model
    return Path(m.file).stem == "qwen3_asr" or m.name.startswith("qwen3_asr")


def build_prompt(template, asr: bool, context: str, language: str | None) -> str:
    """The text prompt for one audio item (its placeholder written by the chat template)."""
    if asr:
        text = template.render([{"role": "system", "content": context},
                                {"role": "user", "content": [{"type": "audio"}]}], add_generation_prompt=True)
        return text + (f"{LANG_PREFIX}{language}{ASR_TAG}" if language else "")
    ask = f"Transcribe the {language} audio into text." if language else "Transcribe the audio into text."
    messages = [{"role": "system", "content": context}] if context else []
    messages.append({"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": ask}]})
    return template.render(messages, add_generation_prompt=True)


def output_cap(prompt: str, seconds: float, max_seq_len: int) -> int | None:
    """64 + 30 tokens a second of audio, when the prompt surely leaves that much room (its bytes bound its
    tokens; an encoder gives at most ROWS_PER_SECOND rows a second); else None: what the plan allows."""
    cap = MIN_TOKENS + int(TOKENS_PER_SECOND * seconds + 0.5)
    return cap if len(prompt.encode()) + ROWS_PER_SECOND * seconds + cap <= max_seq_len else None


def _bool(value: str) -> bool | None:
    return {"true": True, "1": True, "false": False, "0": False}.get(value.strip().lower())


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def register(app, ctx) -> None:
    """Add POST /v1/audio/transcriptions to `app` (ctx: context.Context)."""
    from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
    from starlette.concurrency import run_in_threadpool
    from starlette.datastructures import UploadFile
    from starlette.formparsers import MultiPartException, MultiPartParser

    from graphc.serving import Media
    from graphc.runtime.media import MediaError, load_audio
    from graphc.runtime.sampler import SamplingParams
    from graphc.serve.errors import error, refusal, wrong_model

    engine, driver, model_name, max_audio_bytes = ctx.engine, ctx.driver, ctx.model_name, ctx.max_audio_bytes
    asr = is_qwen3_asr(engine)

    def too_large():
        return error(413, f"the upload is over {max_audio_bytes:,} bytes, the most this server takes",
                     param="file")

    async def read_form(request):
        limit = max_audio_bytes + FORM_SLACK

        async def counted():
            size = 0
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise TooLarge
                yield chunk
        parser = MultiPartParser(request.headers, counted(), max_files=1, max_fields=len(FIELDS) + 8)
        return await parser.parse()

    def usage(req) -> dict:
        audio = sum(len(p.rows) for m in req.prompt.media for p in m.pieces)
        n_in, n_out = len(req.prompt.ids), len(req.output)
        return {"type": "tokens", "input_tokens": n_in, "output_tokens": n_out, "total_tokens": n_in + n_out,
                "input_token_details": {"audio_tokens": audio, "text_tokens": n_in - audio}}

    async def transcriptions(request):
        """A plain Starlette route: the form is read here, counted as it arrives."""
        n = request.headers.get("content-length", "")
        if n.isdigit() and int(n) > max_audio_bytes + FORM_SLACK:
            return too_large()
        ctype = request.headers.get("content-type", "")
        if not ctype.lower().startswith("multipart/form-data"):
            return error(400, f"the body is '{ctype or 'no content type'}'; send multipart/form-data with the "
                              "audio in `file`")
        try:
            form = await read_form(request)
        except TooLarge:
            return too_large()
        except MultiPartException as e:
            return error(400, f"the multipart form does not parse: {e.message}")
        try:
            out = await transcribe(form)
        finally:
            await form.close()
        return JSONResponse(out) if isinstance(out, dict) else out

    async def transcribe(form):
        fields: dict = {}
        for key, value in form.multi_items():
            base = key.removesuffix("[]")
            if base in NOT_SERVED:
                return error(400, f"{key} is not served here; fields taken: {', '.join(FIELDS)}", param=key)
            if key not in FIELDS:
                return error(400, f"unknown field '{key}'; fields taken: {', '.join(FIELDS)}", param=key)
            if key in fields:
                return error(400, f"{key} is given twice", param=key)
            fields[key] = value
        upload = fields.get("file")
        if not isinstance(upload, UploadFile):
            return error(400, "send the audio as a file upload in `file`", param="file")
        for key in FIELDS[1:]:
            if key in fields and not isinstance(fields[key], str):
                return error(400, f"{key} must be a form value, not a file", param=key)
        if (bad := wrong_model(fields.get("model"), model_name)) is not None:
            return bad
        fmt = fields.get("response_format", "json")
        if fmt not in FORMATS:
            return error(400, f"response_format '{fmt}' is not served; use one of {', '.join(FORMATS)}",
                         param="response_format")
        stream = _bool(fields.get("stream", "false"))
        if stream is None:
            return error(400, f"stream must be true or false, not '{fields['stream']}'", param="stream")
        try:
            temperature = float(fields.get("temperature", "0"))
        except ValueError:
            temperature = float("nan")
        if not 0 <= temperature <= 1:
            return error(400, f"temperature must be a number from 0 to 1, not '{fields['temperature']}'",
                         param="temperature")
        language = None
        if fields.get("language", "").strip():
            try:
                language = language_name(fields["language"])
            except InvalidInput as e:
                return error(400, str(e), param="language")
        if "a2t" not in engine.kinds():
            return error(400, f"this server's model ({model_name}) takes no audio: its kinds are "
                              f"{', '.join(engine.kinds())}; transcription needs a plan with an a2t kind",
                         param="model")
        if engine.template is None or engine.tokenizer is None:
            return error(400, "transcription needs the checkpoint's tokenizer.json and chat template; start the "
                              "server with --checkpoint DIR holding them")
        if upload.size is not None and upload.size > max_audio_bytes:
            return too_large()
        data = await upload.read()
        if len(data) > max_audio_bytes:
            return too_large()
        try:
            driver.admit()                 # a full queue refuses before the audio is decoded
            wave = await run_in_threadpool(load_audio, data, SAMPLE_RATE, ctx.limits.audio_seconds, ctx.limits.why)
        except MediaError as e:
            return error(400, f"file: {e}", param="file")
        except Exception as e:
            if (bad := refusal(e)) is None:
                raise
            return bad
        duration = len(wave) / SAMPLE_RATE
        prompt = build_prompt(engine.template, asr, fields.get("prompt", ""), language)
        params = SamplingParams(temperature=temperature, logprobs=fmt == "verbose_json",
                                max_tokens=output_cap(prompt, duration, engine.max_seq_len))
        rid = f"trsc-{uuid.uuid4().hex}"
        started, bad = await ctx.submit(dict(prompt=prompt, media=[Media("audio", wave)], params=params, request_id=rid))
        if bad is not None:
            return bad
        req, events = started
        if stream:
            reader = AsrStream(language) if asr else PassThrough()
            return StreamingResponse(sse(req, events, reader), media_type="text/event-stream")
        while not (await events.get()).finished:
            pass
        if req.error:
            return error(500, req.error, kind="server_error")
        raw = req.detok.text
        spoken, text = split_asr(raw, language) if asr else (language or "", raw)
        if fmt == "text":
            return PlainTextResponse(text)
        if fmt == "json":
            return {"text": text, "usage": usage(req)}
        lps = [e["logprob"] for e in req.logprobs or []]
        blob = text.encode()
        segment = {"id": 0, "seek": 0, "start": 0.0, "end": duration, "text": text, "tokens": list(req.output),
                   "temperature": temperature, "avg_logprob": sum(lps) / len(lps) if lps else 0.0,
                   "compression_ratio": len(blob) / len(zlib.compress(blob)) if blob else 0.0,
                   "no_speech_prob": 0.0}
        return {"task": "transcribe", "language": spoken.lower(), "duration": duration, "text": text,
                "segments": [segment], "usage": {"type": "duration", "seconds": duration}}

    app.add_route("/v1/audio/transcriptions", transcriptions, methods=["POST"])

    def sse(req, events, reader):
        async def gen():
            try:
                while True:
                    ev = await events.get()
                    if ev.finished and req.error:
                        yield _sse({"error": {"message": req.error, "type": "server_error", "param": None,
                                              "code": None}})
                        return
                    delta = reader.add(ev.text, last=ev.finished)
                    if delta:
                        yield _sse({"type": "transcript.text.delta", "delta": delta})
                    if ev.finished:
                        yield _sse({"type": "transcript.text.done", "text": reader.text, "usage": usage(req)})
                        return
            finally:
                if req.finish_reason is None:          # the client went away: free its pages now
                    driver.abort(req.id)
        return gen()
