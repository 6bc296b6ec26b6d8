"""Transcription of committed input audio (a transcription session's, or a realtime session's with
audio.input.transcription set): one engine request per item, the plan's a2t kind, asked as
/v1/audio/transcriptions asks (the model's Transcription prompt and reader); its text streams as
conversation.item.input_audio_transcription.delta events, then .completed with the transcript and usage
(or .failed)."""
from __future__ import annotations

import asyncio
import json

from graphc.errors import InvalidInput
from graphc.runtime.sampler import SamplingParams
from graphc.serve.default_transcription import DefaultTranscription
from graphc.serve.languages import language_name
from graphc.runtime.media import AUDIO_RATE
from graphc.serve.realtime.conversation import Item
from graphc.serve.realtime.protocol import new_id
from graphc.serve.transcriptions import can_transcribe, output_cap, usage
from graphc.serving import Media


def check(ctx, language: str | None) -> str | None:
    """The language's English name (None: any); InvalidInput when the plan cannot transcribe or the language
    is unknown."""
    bad = can_transcribe(ctx)
    if bad is not None:
        raise InvalidInput(json.loads(bad.body)["error"]["message"], "", "", param="session.type")
    return language_name(language) if language else None


async def transcribe(conn, item: Item) -> None:
    """Transcribe the item's audio; its part's transcript becomes the text."""
    ctx, spec = conn.ctx, conn.config.audio.input.transcription
    ids = {"item_id": item.id, "content_index": 0}
    rid = new_id("trsc")
    req = None
    try:
        language = check(ctx, spec.language)
        how = ctx.engine.transcription or DefaultTranscription()
        prompt = how.prompt(ctx.engine.template, spec.prompt or "", language)
        wave = item.parts[0].media.data
        params = SamplingParams(temperature=0, max_tokens=output_cap(prompt, len(wave) / AUDIO_RATE,
                                                                        ctx.engine.max_seq_len))
        started, bad = await ctx.submit(dict(prompt=prompt, media=[Media("audio", wave)], params=params,
                                             request_id=rid))
        if bad is not None:
            raise InvalidInput(json.loads(bad.body)["error"]["message"])
        req, events = started
        reader = how.reader(language)
        while True:
            ev = await events.get()
            delta = reader.add(ev.text, last=ev.finished)
            if delta:
                conn.send(conn.wire.event("conversation.item.input_audio_transcription.delta", **ids, delta=delta))
            if ev.finished:
                break
        if req.error:
            raise InvalidInput(req.error)
        item.parts[0].text = reader.text
        conn.send(conn.wire.event("conversation.item.input_audio_transcription.completed", **ids,
                                  transcript=reader.text, usage=usage(req)))
    except InvalidInput as e:
        conn.send(conn.wire.event("conversation.item.input_audio_transcription.failed", **ids, error={
            "type": "transcription_error", "code": None, "message": str(e), "param": e.param}))
    except asyncio.CancelledError:
        pass
    finally:
        if req is None or not req.closed:
            ctx.driver.abort(rid)
