"""The `language` of a transcription request: an ISO-639 code (or its English name) -> the English name.

OpenAI's API takes the language as an ISO-639-1 code and names it in English in verbose_json; a prompt
names it in English too. The table is the API's, so it sits with the server rather than in a model file:
every model is told a language the same way, and a model that transcribes in its own way gets the name
(graphc.Transcription.prompt and reader). It holds the 30 languages of the transcription checkpoints
graphc serves, by their ISO-639-1 codes where one exists ('yue' Cantonese and 'fil' Filipino are
ISO-639-3).
"""
from __future__ import annotations

from graphc.errors import InvalidInput

LANGUAGES = {
    "zh": "Chinese", "en": "English", "yue": "Cantonese", "ar": "Arabic", "de": "German", "fr": "French",
    "es": "Spanish", "pt": "Portuguese", "id": "Indonesian", "it": "Italian", "ko": "Korean", "ru": "Russian",
    "th": "Thai", "vi": "Vietnamese", "ja": "Japanese", "tr": "Turkish", "hi": "Hindi", "ms": "Malay",
    "nl": "Dutch", "sv": "Swedish", "da": "Danish", "fi": "Finnish", "pl": "Polish", "cs": "Czech",
    "tl": "Filipino", "fil": "Filipino", "fa": "Persian", "el": "Greek", "ro": "Romanian", "hu": "Hungarian",
    "mk": "Macedonian",
}


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
