"""Incremental detokenization against decoding everything at once, and stop strings against
str.find, on a byte-level BPE tokenizer (Qwen's kind) that splits emoji and CJK characters over
several tokens."""
from __future__ import annotations

import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from graphc.runtime.detok import REPLACEMENT, Detokenizer

CORPUS = ["hello world, the cat sat on the mat.", "Grüße aus Köln", "日本語のテキスト", "emoji 🎉🐍 and more 🎉",
          "stop here STOP there", "naïve café", "a\nb\tc"] * 20


@functools.cache
def tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|end|>"])
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def stream(ids: list[int], chunks: list[int], stop=()) -> tuple[list[str], Detokenizer]:
    d = Detokenizer(tokenizer(), stop)
    out, i = [], 0
    for n in chunks:
        out.append(d.add(ids[i:i + n]))
        i += n
        if i >= len(ids):
            break
    if i < len(ids):
        out.append(d.add(ids[i:]))
    out.append(d.finish())
    return out, d


TEXTS = ["emoji 🎉🐍 and more", "日本語のテキスト!", "Grüße 🐍 aus Köln", "plain ascii text", "🎉", "x 日 y",
         "\U0001F9EC rare emoji, bytes alone"]


def test_some_characters_really_span_several_tokens():
    # the test means something only if a token ends inside a character
    tok = tokenizer()
    ids = tok.encode("🎉🐍日本\U0001F9EC").ids
    assert any(REPLACEMENT in tok.decode(ids[:k]) for k in range(1, len(ids)))


@pytest.mark.parametrize("text", TEXTS)
def test_one_token_at_a_time_gives_the_whole_text_and_no_broken_character(text):
    ids = tokenizer().encode(text).ids
    pieces, d = stream(ids, [1] * len(ids))
    assert "".join(pieces) == tokenizer().decode(ids) == text
    assert not any(REPLACEMENT in p for p in pieces)
    assert d.text == text


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(TEXTS + ["stop here STOP there"]), st.lists(st.integers(1, 4), min_size=1, max_size=40))
def test_any_chunking_gives_the_same_text(text, chunks):
    ids = tokenizer().encode(text).ids
    pieces, _ = stream(ids, chunks)
    assert "".join(pieces) == text
    assert not any(REPLACEMENT in p for p in pieces)


def test_an_incomplete_character_at_the_end_is_released_by_finish():
    tok = tokenizer()
    ids = tok.encode("ab\U0001F9EC").ids
    cut = next(k for k in range(len(ids), 0, -1) if tok.decode(ids[:k]).endswith(REPLACEMENT))
    d = Detokenizer(tok)
    held = d.add(ids[:cut])
    assert REPLACEMENT not in held
    assert held + d.finish() == tok.decode(ids[:cut])


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["stop here STOP there", "emoji 🎉🐍 and more 🎉", "the cat sat on the mat."]),
       st.lists(st.sampled_from(["STOP", "🐍", "at", "mat.", "zz", "e"]), min_size=1, max_size=3),
       st.lists(st.integers(1, 3), min_size=1, max_size=30))
def test_stop_strings_cut_the_text_before_the_first(text, stops, chunks):
    ids = tokenizer().encode(text).ids
    pieces, d = stream(ids, chunks, tuple(stops))
    hits = [(text.find(s), s) for s in stops if text.find(s) >= 0]
    want = text[:min(hits)[0]] if hits else text
    assert "".join(pieces) == want == d.text
    assert (d.stopped is not None) == bool(hits)
    if hits:
        assert text.find(d.stopped) == min(hits)[0]


def test_a_stop_string_split_over_tokens_is_never_streamed_in_part():
    ids = tokenizer().encode("stop here STOP there").ids
    d = Detokenizer(tokenizer(), ("STOP",))
    seen = ""
    for t in ids:
        seen += d.add([t])
        assert "S" not in seen.replace("s", "")      # nothing of "STOP" left the detokenizer
    assert seen + d.finish() == "stop here "
    assert d.add(tokenizer().encode(" more").ids) == ""        # nothing after a stop


def test_special_tokens_are_skipped():
    tok = tokenizer()
    end = tok.token_to_id("<|end|>")
    pieces, _ = stream(tok.encode("the cat").ids + [end], [1] * 10)
    assert "".join(pieces) == "the cat"


def test_the_earliest_stop_wins_and_its_text_is_released_at_once():
    ids = tokenizer().encode("stop here STOP there").ids
    d = Detokenizer(tokenizer(), ("there", "here"))
    assert d.add(ids) == "stop " and d.stopped == "here"
    # the text before a stop ends with "e ", the start of another stop string: final all the same
    d = Detokenizer(tokenizer(), ("STOP", "e X"))
    assert d.add(ids) == "stop here " and d.stopped == "STOP"
