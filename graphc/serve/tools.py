"""Tool calling on /v1/chat/completions, in the `<tool_call>` JSON form chat templates such as Hermes' teach.

A request's `tools` are checked (names unique and of OpenAI's form, parameters a JSON schema of an
object) and rendered by the chat template as its `tools` variable, as HF's apply_chat_template passes
them. tool_choice:
  auto (the default with tools)   rendered; the answer's calls parsed
  none                            not rendered and not parsed: the model answers as if no tools were sent
  required, {"type": "function", "function": {"name": N}}
                                  need constrained decoding (guide_of: the constraint they map to)
The answer's text is parsed into calls: each block `<tool_call>{"name": N, "arguments": {...}}</tool_call>`
whose JSON is an object of exactly a non-empty name and an object of arguments becomes a call {id, type,
function {name, arguments as JSON text}}. The XML form other chat templates teach is read too: a block
`<tool_call><function=N><parameter=P>VALUE</parameter>...</function></tool_call>` (newlines between the tags
allowed, the whitespace around a value dropped, as the form's grammar places it freely), each value read as
its parameter's schema type: a string as written; an integer, number, boolean, null, object or array as
JSON; a value that does not read so, or a parameter the schema does not name, as a string. A parameter given
twice, or text between the tags, makes the block malformed. Constrained decoding (required, a named function)
keeps to the form the chat template teaches (form_of). The whitespace before a parsed block, and after the
last one at the end of the answer, is dropped; every other text, a malformed block and an unclosed one
included, stays content. finish_reason stop becomes tool_calls when calls were parsed. With
parallel_tool_calls false the calls after the first are dropped. Streamed, text goes out as content as soon
as it cannot be the start of a block, and a call goes out whole in one delta.tool_calls entry once its block
closes.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from graphc.errors import InvalidInput
from graphc.runtime.grammar import Guide, ToolFunction

OPEN, CLOSE = "<tool_call>", "</tool_call>"
XML_FUNCTION = "<function="
XML_CALL = re.compile(r"\s*<function=([^>\n]+)>(.*)</function>\s*", re.DOTALL)
XML_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")          # OpenAI's function names
NO_ARGUMENTS = {"type": "object", "properties": {}, "additionalProperties": False}   # a tool sent without parameters


@dataclass(frozen=True)
class Calls:
    """What a chat request's tool fields ask: the tools the template renders (None: none), whether the
    answer is parsed for calls, the constraint decoding needs (guide_of), the most calls kept (None: all)."""

    render: list[dict] | None = None
    parse: bool = False
    guide: dict | None = None
    most: int | None = None


def form_of(template, own: str | None = None) -> str:
    """The tool-call form a chat template teaches (the server's ChatTemplate, or a request's own template
    text): xml where it writes `<function=`, else json."""
    texts = [own] if own is not None else list(template.texts.values()) if template is not None else []
    return "xml" if any(XML_FUNCTION in t for t in texts) else "json"


def check(tools: list | None, tool_choice, parallel: bool = True, speaking: bool = False,
          form: str = "json", xml_style: str | None = None) -> Calls:
    """A request's tools and tool_choice (pydantic models of graphc/serve/schemas.py) checked: what it asks;
    form: the calls' form the template teaches (form_of), which constrained decoding keeps to, the XML form's
    arguments in the host's xml_style (Host.tool_xml_style)."""
    if not tools:
        if tool_choice is not None:
            raise InvalidInput("tool_choice without tools", "a tool can be chosen only among the request's tools",
                               "send tools, or leave tool_choice out", param="tool_choice")
        return Calls()
    names = [_checked(t.function, i) for i, t in enumerate(tools)]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise InvalidInput(f"tools name {', '.join(twice)} more than once", "a call names the function it calls",
                           "give each tool its own name", param="tools")
    choice = tool_choice if tool_choice is not None else "auto"
    if not isinstance(choice, str) and choice.function.name not in names:
        raise InvalidInput(f"tool_choice names '{choice.function.name:.64}', which is not among the tools",
                           f"the tools are {', '.join(names)}", "name one of them", param="tool_choice")
    if choice == "none":
        return Calls()
    if speaking:
        raise InvalidInput("tools with audio output", "a spoken answer would speak the calls' text",
                           "send tools without modalities [\"text\", \"audio\"], or tool_choice none", param="tools")
    rendered = [t.model_dump(exclude_unset=True) for t in tools]
    if form == "xml" and xml_style is None and choice != "auto":
        raise InvalidInput(f"tool_choice {choice if isinstance(choice, str) else 'naming a function'} with a chat "
                           "template that writes XML tool calls (<function=NAME>)", "this model's host declares no "
                           "grammar style for their arguments (graphc.Host.tool_xml_style)", "send tool_choice auto, "
                           "or declare tool_xml_style in the model file's host", param="tool_choice")
    return Calls(render=rendered, parse=True, guide=guide_of(rendered, choice, parallel, form, xml_style),
                 most=None if parallel else 1)


def _checked(fn, i: int) -> str:
    """tools[i].function's name, after its name and parameters are checked."""
    if not NAME.fullmatch(fn.name):
        raise InvalidInput(f"tools[{i}].function.name '{fn.name:.80}' is not a function name", "names are 1 to 64 "
                           "letters, digits, _ or -, as OpenAI takes them", "rename the tool", param="tools")
    if fn.parameters is not None and fn.parameters != {}:
        from jsonschema.exceptions import SchemaError
        from jsonschema.validators import validator_for

        where = f"tools[{i}].function.parameters"
        try:
            validator_for(fn.parameters).check_schema(fn.parameters)
        except SchemaError as e:
            raise InvalidInput(f"{where} is not a JSON schema: {e.message:.200}", "", "send a JSON schema of an "
                               "object, e.g. {\"type\": \"object\", \"properties\": {...}}", param="tools") from None
        if fn.parameters.get("type") != "object":
            raise InvalidInput(f"{where} has type {fn.parameters.get('type')!r}", "a function's arguments are an "
                               "object", "send {\"type\": \"object\", \"properties\": {...}}", param="tools")
    return fn.name


def guide_of(tools: list[dict], tool_choice, parallel: bool = True, form: str = "json",
             xml_style: str | None = None) -> Guide | None:
    """The constraint on decoding that tool_choice asks (None for auto): required, calls to any of the tools; a
    named function, calls to that one; parallel false, one call (graphc/runtime/grammar.py, kind tool_calls)."""
    if isinstance(tool_choice, str) and tool_choice != "required":
        return None
    wanted = None if isinstance(tool_choice, str) else tool_choice.function.name
    functions = [ToolFunction(name=t["function"]["name"], parameters=t["function"].get("parameters") or NO_ARGUMENTS)
                 for t in tools if wanted in (None, t["function"]["name"])]
    return Guide(kind="tool_calls", functions=functions, required=True, parallel=parallel, form=form,
                 xml_style=xml_style if form == "xml" else None)


def constrained(params, guide: Guide | None):
    """params (SamplingParams) decoded under `guide`; a request's response_format beside a tool_choice that
    constrains is refused (one grammar a request)."""
    if guide is None:
        return params
    if params.guide is not None:
        raise InvalidInput("response_format with tool_choice required or a named function",
                           "the answer is either calls or the format's JSON, not both", "send one of them",
                           param="tool_choice")
    return params.model_copy(update={"guide": guide})


def variables(kwargs: dict | None, calls: Calls) -> dict | None:
    """The template's variables: chat_template_kwargs, and the tools rendered."""
    if kwargs and "tools" in kwargs:
        raise InvalidInput("chat_template_kwargs sets tools", "the request's tools field renders them, and turns "
                           "on parsing the calls", "send them as tools", param="chat_template_kwargs")
    if calls.render is None:
        return kwargs
    return {**(kwargs or {}), "tools": calls.render}


def _call(block: str, schemas: dict[str, dict]) -> dict | None:
    """The call a closed block (tags included) holds, None when it is malformed; schemas: the tools' parameters
    by name (the XML form's values are read by them)."""
    inner = block[len(OPEN):-len(CLOSE)]
    body = _xml_body(inner, schemas) if inner.lstrip().startswith(XML_FUNCTION) else _json_body(inner)
    if body is None:
        return None
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": body["name"], "arguments": json.dumps(body["arguments"], ensure_ascii=False)}}


def _json_body(inner: str) -> dict | None:
    try:
        body = json.loads(inner)
    except ValueError:
        return None
    if (not isinstance(body, dict) or set(body) != {"name", "arguments"} or not isinstance(body["name"], str)
            or not body["name"] or not isinstance(body["arguments"], dict)):
        return None
    return body


def _xml_body(inner: str, schemas: dict[str, dict]) -> dict | None:
    """{name, arguments} of the XML form, None when malformed."""
    m = XML_CALL.fullmatch(inner)
    if m is None:
        return None
    name, rest, args = m.group(1), m.group(2), {}
    properties = schemas.get(name, {}).get("properties", {})
    at = 0
    for p in XML_PARAMETER.finditer(rest):
        key, value = p.group(1), p.group(2)
        if rest[at:p.start()].strip() or key in args:
            return None
        args[key], at = _typed(value, properties.get(key, {})), p.end()
    return None if rest[at:].strip() else {"name": name, "arguments": args}


def _typed(value: str, schema: dict):
    """An XML-form value as its schema's type, else the text."""
    text = value.strip()
    kind = schema.get("type") if isinstance(schema, dict) else None
    if kind not in ("integer", "number", "boolean", "null", "object", "array"):
        return text
    try:
        got = json.loads(text)
    except ValueError:
        return text
    ok = {"integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
          "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
          "boolean": lambda v: isinstance(v, bool), "null": lambda v: v is None,
          "object": lambda v: isinstance(v, dict), "array": lambda v: isinstance(v, list)}[kind]
    return got if ok(got) else text


def _held(text: str) -> int:
    """Where the tail that may still turn out to lead into a block starts: trailing whitespace and a
    beginning of the open tag."""
    k = next(k for k in range(min(len(OPEN) - 1, len(text)), -1, -1) if text.endswith(OPEN[:k]))
    head = text[:len(text) - k]
    return len(head.rstrip())


class CallStream:
    """One answer's text, fed as it comes: what may go out as content now, and the calls whose blocks closed."""

    def __init__(self, most: int | None = None, tools: list[dict] | None = None):
        self.most, self.count = most, 0          # the most calls kept; calls parsed so far
        self.schemas = schemas_of(tools)
        self.buf = ""              # text not yet out: a held tail, or an open block
        self.lead = ""             # the whitespace before the open block (content if the block is malformed)
        self.in_block = False
        self.last_call = False     # the last thing released was a call (whitespace after it, at the end, is dropped)

    def feed(self, text: str, final: bool = False) -> tuple[str, list[dict]]:
        """(content, calls) that `text` releases; final: the answer ended (held text goes out as content)."""
        self.buf += text
        out, calls = [], []
        while self._step(out, calls):
            pass
        if final:
            tail = self.lead + self.buf if self.in_block else self.buf
            out.append("" if self.last_call and not tail.strip() else tail)
            self.buf, self.lead, self.in_block = "", "", False
        return "".join(out), calls

    def _release(self, out: list, text: str) -> None:
        if text:
            out.append(text)
            self.last_call = False

    def _step(self, out: list, calls: list) -> bool:
        """One move on the buffer; False when it waits for more text."""
        if self.in_block:
            end = self.buf.find(CLOSE)
            if end < 0:
                return False
            block, self.buf, self.in_block = self.buf[:end + len(CLOSE)], self.buf[end + len(CLOSE):], False
            call = _call(block, self.schemas)
            if call is None:
                self._release(out, self.lead + block)
            else:
                self.count += 1
                calls.extend([call] if self.most is None or self.count <= self.most else [])
                self.last_call = True
            self.lead = ""
            return True
        start = self.buf.find(OPEN)
        if start < 0:
            keep = _held(self.buf)
            self._release(out, self.buf[:keep])
            self.buf = self.buf[keep:]
            return False
        head = self.buf[:start]
        self._release(out, head.rstrip())
        self.lead, self.buf, self.in_block = head[len(head.rstrip()):], self.buf[start:], True
        return True


def schemas_of(tools: list[dict] | None) -> dict[str, dict]:
    """The rendered tools' parameters by function name."""
    return {t["function"]["name"]: t["function"].get("parameters", {}) for t in tools or []}


def parse(text: str, most: int | None = None, tools: list[dict] | None = None) -> tuple[str | None, list[dict]]:
    """A whole answer's (content, calls): content None when calls were parsed and no text is left."""
    content, calls = CallStream(most, tools).feed(text, final=True)
    return (content or None) if calls else content, calls


def whole_choice(choice: dict, calls: Calls) -> dict:
    """A finished chat choice {index, message, logprobs, finish_reason} with its message's text parsed:
    tool_calls set and finish_reason tool_calls (where it was stop) when calls were parsed."""
    content, found = parse(choice["message"]["content"] or "", calls.most, calls.render)
    if not found:
        return choice
    return {**choice, "message": {**choice["message"], "content": content, "tool_calls": found},
            "finish_reason": "tool_calls" if choice["finish_reason"] == "stop" else choice["finish_reason"]}


def stream_piece(stream: CallStream, piece: dict, text: str, finished: bool) -> dict:
    """A streamed chat piece {index, delta, finish_reason, ...} whose delta's content (`text`, the event's
    text) has gone through `stream`: content that is out, tool_calls of the blocks that closed."""
    first = stream.count
    content, found = stream.feed(text, final=finished)
    delta = {k: v for k, v in piece["delta"].items() if k != "content"}
    if content:
        delta["content"] = content
    if found:
        delta["tool_calls"] = [{"index": first + i, **c} for i, c in enumerate(found)]
    out = {**piece, "delta": delta}
    if finished and stream.count and piece["finish_reason"] == "stop":
        out["finish_reason"] = "tool_calls"
    return out
