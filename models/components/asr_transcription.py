"""Qwen3-ASR's transcription (graphc.Transcription, graphc/serving.py): how it is asked, how its answer reads.

The system message is the caller's prompt (its context), the user message the audio alone, as QwenLM's
qwen_asr builds them. The model answers `language English<asr_text>the text`: the transcript is what
follows the tag, the language what the header names ('language None' when it heard no speech). A given
language is forced the way qwen_asr forces it: the prompt ends in `language English<asr_text>`, and the
answer is the text alone.
"""
from __future__ import annotations

ASR_TAG = "<asr_text>"
LANG_PREFIX = "language "


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

    @property
    def language(self) -> str:
        """The language the answer's header names, or the forced one ('' when neither)."""
        return split_asr(self.raw, self.forced)[0]


class AsrTranscription:
    """graphc.Transcription of Qwen3-ASR: its prompt, and AsrStream to read its answer."""

    def prompt(self, template, context: str, language: str | None) -> str:
        """The system turn holds the context, the user turn the audio alone; a given language is forced."""
        text = template.render([{"role": "system", "content": context},
                                {"role": "user", "content": [{"type": "audio"}]}], add_generation_prompt=True)
        return text + (f"{LANG_PREFIX}{language}{ASR_TAG}" if language else "")

    def reader(self, language: str | None) -> AsrStream:
        return AsrStream(language)
