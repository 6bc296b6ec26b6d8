"""Constrained decoding: a request's guide, compiled by xgrammar, masks the tokens its grammar refuses.

A guide (SamplingParams.guide) is one of

    {"kind": "json_object"}                               one JSON object (any keys)
    {"kind": "json_schema", "json_schema": {...}}         JSON valid against the schema; keys it does not
                                                          declare are refused (xgrammar's strict mode)
    {"kind": "regex", "regex": "[0-9]{3}-[a-z]+"}         text the regex matches whole
    {"kind": "ebnf", "ebnf": "root ::= \"yes\" | \"no\""}   text of the grammar's `root` rule (GBNF, llama.cpp's
                                                          dialect)
    {"kind": "tool_calls", "functions": [{"name": "get_weather", "parameters": {...}}],
     "required": true, "parallel": true, "form": "json", "xml_style": null}

tool_calls is, with form "json", the `<tool_call>` JSON form (Hermes', as chat templates teach it): blocks
`<tool_call>\\n{"name": NAME, "arguments": ARGS}\\n</tool_call>`, ARGS valid against that function's
parameters (a JSON schema; none: an empty object); with form "xml", the XML form other templates
teach: `<tool_call>\\n<function=NAME>\\n<parameter=P>VALUE</parameter>...\\n</function>\\n</tool_call>`,
the parameters valid against the schema, in xml_style (xgrammar's name for that form of arguments, which the
model's host declares: graphc.Host.tool_xml_style). required: the answer is one or more
blocks joined by "\\n" and nothing else (OpenAI's tool_choice "required"; with a single function,
tool_choice naming it). Not required: free text, in which every `<tool_call>` opens a well-formed block
(tool_choice "auto"). parallel false: at most one block (parallel_tool_calls false).

JSON takes at most MAX_WHITESPACE whitespace characters between two tokens of its syntax, so a model that
loops on blank space still ends. A guided request ends (finish_reason "stop") when its grammar is complete
and the model's end-of-text token is taken, the only token the mask then allows, whatever ignore_eos says.

Each request holds a Matcher: it accepts each token the host reads back and fills the request's row of the
step's bitmask before the step samples (graphc/runtime/sampler.py applies it to the logits, on their device,
before every other processor). Grammars compile once per engine (xgrammar's compiler caches them by content);
the server compiles a request's guide in a worker thread before the engine thread takes the request.
"""
from __future__ import annotations

import functools

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

import torch
from pydantic import Field, model_validator

from graphc.errors import InvalidInput
from graphc.strict import Strict

MAX_WHITESPACE = 16               # whitespace characters between JSON tokens (xgrammar's max_whitespace_cnt)
CACHE_BYTES = 256 << 20           # compiled grammars kept (the least recently used go first)
KIND_FIELDS = {"json_object": set(), "json_schema": {"json_schema"}, "regex": {"regex"}, "ebnf": {"ebnf"},
               "tool_calls": {"functions"}}
TOOL_FIELDS = {"functions", "required", "parallel", "form", "xml_style"}


class ToolFunction(Strict):
    """A function the model may call: its name and the JSON schema of its arguments."""

    name: str = Field(min_length=1, max_length=256)
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class Guide(Strict):
    """What a request's output must match (the module docstring lists the kinds)."""

    kind: Literal["json_object", "json_schema", "regex", "ebnf", "tool_calls"]
    json_schema: dict[str, Any] | None = None
    regex: str | None = Field(None, min_length=1)
    ebnf: str | None = Field(None, min_length=1)
    functions: tuple[ToolFunction, ...] = ()
    required: bool = False
    parallel: bool = True
    form: Literal["json", "xml"] = "json"
    xml_style: str | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _fields_of_kind(self) -> "Guide":
        given = {k for k in ("json_schema", "regex", "ebnf") if getattr(self, k) is not None}
        given |= {k for k in TOOL_FIELDS if k in self.model_fields_set}
        want = KIND_FIELDS[self.kind]
        missing, extra = want - given, given - want - (TOOL_FIELDS if self.kind == "tool_calls" else set())
        if missing or extra:
            raise ValueError(f"a {self.kind} guide takes {', '.join(sorted(want)) or 'no other field'}"
                             + (f"; {', '.join(sorted(extra))} belong to other kinds" if extra else "")
                             + (f"; {', '.join(sorted(missing))} missing" if missing else ""))
        names = [f.name for f in self.functions]
        if self.kind == "tool_calls" and (not names or len(set(names)) != len(names)):
            raise ValueError(f"a tool_calls guide takes one or more functions of distinct names, not {names}")
        if self.form == "xml" and self.xml_style is None:
            raise ValueError("a tool_calls guide of form xml takes xml_style (xgrammar's name for its arguments)")
        return self


def vocab_type(tokenizer) -> tuple[Any, bool]:
    """xgrammar's VocabType of a `tokenizers` Tokenizer and whether it prepends a space: byte-level BPE (its
    decoder ByteLevel), byte fallback (a ByteFallback decoder step, as SentencePiece models), else raw."""
    import xgrammar as xgr

    decoder = json.loads(tokenizer.to_str()).get("decoder") or {}
    steps = decoder.get("decoders", [decoder]) if decoder.get("type") == "Sequence" else [decoder]
    kinds = {s.get("type") for s in steps}
    if "ByteLevel" in kinds:
        return xgr.VocabType.BYTE_LEVEL, False
    if "ByteFallback" in kinds:
        first = tokenizer.encode("a", add_special_tokens=False).tokens[:1]
        return xgr.VocabType.BYTE_FALLBACK, bool(first) and first[0].startswith("\u2581")
    return xgr.VocabType.RAW, False


def tokenizer_info(tokenizer, vocab_size: int, stop_ids: list[int]):
    """xgrammar's TokenizerInfo of a `tokenizers` Tokenizer, its vocabulary padded to vocab_size (the logits'
    width). Ids without a token and special tokens (media pads, role markers) are never allowed: a token
    xgrammar sees as empty is special to it; stop_ids end a complete grammar."""
    import xgrammar as xgr

    encoded = [""] * vocab_size
    special = {i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special}
    for token, i in tokenizer.get_vocab(with_added_tokens=True).items():
        if i < vocab_size and i not in special:
            encoded[i] = token
    kind, prefix_space = vocab_type(tokenizer)
    return xgr.TokenizerInfo(encoded, kind, vocab_size=vocab_size, stop_token_ids=list(stop_ids),
                             add_prefix_space=prefix_space)


def tool_format(guide: Guide) -> dict:
    """The structural tag (xgrammar's format) of a tool_calls guide."""
    content = {"type": "json_schema", "max_whitespace_cnt": MAX_WHITESPACE}
    if guide.form == "json":
        tags = [{"type": "tag", "begin": '<tool_call>\n{"name": ' + json.dumps(f.name) + ', "arguments": ',
                 "content": content | {"json_schema": f.parameters}, "end": "}\n</tool_call>"}
                for f in guide.functions]
    else:
        tags = [{"type": "tag", "begin": f"<tool_call>\n<function={f.name}>\n",
                 "content": content | {"json_schema": f.parameters, "style": guide.xml_style},
                 "end": "\n</function>\n</tool_call>"} for f in guide.functions]
    if guide.required:
        fmt = {"type": "tags_with_separator", "tags": tags, "separator": "\n", "at_least_one": True}
    else:
        fmt = {"type": "triggered_tags", "triggers": ["<tool_call>"], "tags": tags}
    return {"type": "structural_tag", "format": fmt | {"stop_after_first": not guide.parallel}}


class Grammars:
    """One engine's grammar compiler: guides to compiled grammars (cached), and matchers of them."""

    def __init__(self, tokenizer, vocab_size: int, stop_ids: list[int]):
        import xgrammar as xgr

        self.vocab_size = vocab_size
        self.compiler = xgr.GrammarCompiler(tokenizer_info(tokenizer, vocab_size, stop_ids), max_threads=2,
                                            cache_limit_bytes=CACHE_BYTES)

    def compile(self, guide: Guide):
        """The compiled grammar of a guide; a schema, regex or grammar xgrammar cannot compile is refused."""
        c = self.compiler
        try:
            if guide.kind == "json_object":
                return c.compile_json_schema({"type": "object"}, strict_mode=False,
                                             max_whitespace_cnt=MAX_WHITESPACE)
            if guide.kind == "json_schema":
                return c.compile_json_schema(guide.json_schema, max_whitespace_cnt=MAX_WHITESPACE)
            if guide.kind == "regex":
                return c.compile_regex(guide.regex)
            if guide.kind == "ebnf":
                return c.compile_grammar(guide.ebnf)
            return c.compile_structural_tag(json.dumps(tool_format(guide)))
        except (RuntimeError, ValueError, TypeError) as e:
            why = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
            raise InvalidInput(f"the {guide.kind} guide does not compile", re.sub(r"^(\[[^]]*\] )?\S+\.cc:\d+: ", "", why),
                               FIXES[guide.kind], param="response_format") from None

    def matcher(self, guide: Guide) -> "Matcher":
        import xgrammar as xgr

        return Matcher(xgr.GrammarMatcher(self.compile(guide)))


FIXES = {"json_object": "send response_format {\"type\": \"json_object\"}",
         "json_schema": "send a JSON schema (draft 2020-12) of the types xgrammar takes",
         "regex": "send a regex of the syntax Python's re takes, without lookaround or backreferences",
         "ebnf": "send a GBNF grammar (llama.cpp's dialect) whose start rule is named root",
         "tool_calls": "give each function a name and a JSON schema of its parameters"}


class Matcher:
    """One request's place in its grammar: the tokens accepted so far, and the mask of the next."""

    def __init__(self, matcher):
        self.matcher = matcher
        self.accepted = 0

    def accept(self, token: int) -> bool:
        """Take the request's next token; False when the grammar refuses it (then nothing changes)."""
        ok = self.matcher.accept_token(token)
        self.accepted += ok
        return ok

    @property
    def terminated(self) -> bool:
        """Its grammar is complete and took its end token: no more tokens."""
        return self.matcher.is_terminated()


@dataclass(frozen=True)
class Mask:
    """One step's token bitmask: row i of `bits` (int32 words, bit k of word w is token 32 w + k) for each
    batch row i in `rows` (the guided ones; the others' rows are not read)."""

    bits: torch.Tensor                   # [B, ceil(V / 32)] int32, on the host
    rows: list[int]


def step_mask(matchers: list[Matcher | None], known: list[int], vocab_size: int) -> Mask | None:
    """The bitmask of a step's rows whose request is guided (None when none is), each filled by its matcher;
    known[i]: the tokens row i's request has read back, which its matcher must have accepted."""
    rows = [i for i, m in enumerate(matchers) if m is not None]
    if not rows:
        return None
    import xgrammar as xgr                 # at the first guided step only (pyproject: imported at the first guide)

    bits = xgr.allocate_token_bitmask(len(matchers), vocab_size)
    for i in rows:
        if matchers[i].accepted != known[i]:
            raise RuntimeError(f"a guided request's matcher took {matchers[i].accepted} tokens of its {known[i]}: "
                               f"its tokens must be read back before its next step")
    if len(rows) == 1:
        matchers[rows[0]].matcher.fill_next_token_bitmask(bits, rows[0])
    else:           # rows in parallel on xgrammar's threads
        _batch_matcher().batch_fill_next_token_bitmask([matchers[i].matcher for i in rows], bits, indices=rows)
    return Mask(bits, rows)


@functools.lru_cache(maxsize=1)
def _batch_matcher():
    """xgrammar's batch filler: several matchers' bitmasks at once on its thread pool (half the host's cores)."""
    import xgrammar as xgr

    return xgr.BatchGrammarMatcher(max_threads="auto")


def apply_mask(logits: torch.Tensor, mask: Mask) -> torch.Tensor:
    """A copy of logits [B, V] with the tokens each guided row's grammar refuses at -inf (the rows not in the
    mask as they were); the mask goes to the logits' device without a host sync."""
    import xgrammar as xgr

    out = logits.clone()
    bits = mask.bits
    if out.device.type != "cpu":
        bits = bits.pin_memory().to(out.device, non_blocking=True)
    xgr.apply_token_bitmask_inplace(out, bits, vocab_size=out.shape[1], indices=mask.rows)
    return out
