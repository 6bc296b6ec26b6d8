"""How a model is asked to transcribe when its host has no Transcription of its own.

The user message is the audio and an instruction ("Transcribe the audio into text.", naming the
language when given); the caller's `prompt`, when given, is the system message. The answer is the
transcript as it comes; its language is the one asked for, else ''.
"""
from __future__ import annotations


class PassThrough:
    """A reader (graphc.Transcription.reader) that keeps the answer as it comes."""

    def __init__(self, language: str | None = None):
        self.raw, self.language = "", language or ""

    def add(self, text: str, last: bool = False) -> str:
        """The text to stream now: all of it."""
        self.raw += text
        return text

    @property
    def text(self) -> str:
        return self.raw


class DefaultTranscription:
    """graphc.Transcription for a model that transcribes when told to."""

    def prompt(self, template, context: str, language: str | None) -> str:
        """The chat template's rendering of the context's system turn (when given) and a user turn of the
        audio and the instruction."""
        ask = f"Transcribe the {language} audio into text." if language else "Transcribe the audio into text."
        messages = [{"role": "system", "content": context}] if context else []
        messages.append({"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": ask}]})
        return template.render(messages, add_generation_prompt=True)

    def reader(self, language: str | None) -> PassThrough:
        return PassThrough(language)
