"""What every route of one app reads: the engine, the Driver that steps it, the served model's name and
the bounds on media; and submit(), which hands a request to the engine thread."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass

from graphc.runtime.engine import Engine
from graphc.runtime.inputs import Limits, Sources
from graphc.serve.driver import Driver
from graphc.serve.errors import refusal


@dataclass
class Context:
    engine: Engine
    driver: Driver
    model_name: str
    max_audio_bytes: int           # the largest transcription upload, and media in a JSON body (base64)
    sources: Sources               # where media parts may be read from
    limits: Limits                 # the longest audio and video a prompt of the plan can hold
    aliases: tuple[str, ...] = ()  # other names the routes answer to (--served-model-name's after the first)
    own_templates: bool = False    # a chat request may bring its own chat_template (--trust-request-chat-template)

    @property
    def names(self) -> tuple[str, ...]:
        """Every name a request may give its model: responses carry the first."""
        return (self.model_name, *self.aliases)

    async def submit(self, kwargs: dict):
        """((request, its events), None) once the engine took it, or (None, the refusal's response)."""
        fut, events = self.driver.submit(asyncio.get_running_loop(), kwargs)
        try:
            return (await fut, events), None
        except Exception as e:
            bad = refusal(e)
            if bad is None:
                raise
            return None, bad
