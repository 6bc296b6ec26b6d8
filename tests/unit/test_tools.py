"""Tool calling on /v1/chat/completions (issue 38): the `<tool_call>` parser on hand-written answers, whole and
split at every character; the route's streamed pieces rebuilt by the openai client's own stream state; the
request checks; and, on the tiny Qwen3-Omni checkpoint served on loopback, the tools and a tool-result round
trip rendered as Qwen3's template writes them (against a hand-written render and HF's apply_chat_template).

The random-weight tiny model writes no calls of its own, so what the route does with a call is shown on
hand-made events (stream_piece, whole_choice); the served requests show the request side and the answer's
shape. tool_choice required and a named function are enforced by constrained decoding (graphc/runtime/grammar.py):
the random model's answers are then calls to the allowed tools, their arguments valid against the schemas."""
import json

import pytest

from graphc.serve.tools import CallStream, Calls, guide_of, parse, stream_piece, whole_choice
from tests.unit.loopback import post

openai = pytest.importorskip("openai")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"enum": ["c", "f"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
TOOLS = [WEATHER, TIME]

W = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich", "unit": "c"}}\n</tool_call>'
T = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
W_CALL = ("get_weather", {"city": "Zürich", "unit": "c"})
T_CALL = ("get_time", {})
# (answer, content, calls) worked by hand
CASES = [
    ("The sky is blue.", "The sky is blue.", []),
    (W, None, [W_CALL]),
    ("Let me check.\n" + W + "\n" + T + "\n", "Let me check.", [W_CALL, T_CALL]),
    ("Before\n" + W + "\nafter.", "Before\nafter.", [W_CALL]),
    ('a\n<tool_call>\n{"name": "get_time", "arguments": {bad}}\n</tool_call>',
     'a\n<tool_call>\n{"name": "get_time", "arguments": {bad}}\n</tool_call>', []),              # malformed JSON
    ('<tool_call>{"name": "f", "arguments": "x"}</tool_call>', '<tool_call>{"name": "f", "arguments": "x"}</tool_call>',
     []),                                                                                        # arguments not an object
    ('<tool_call>{"name": "", "arguments": {}}</tool_call>', '<tool_call>{"name": "", "arguments": {}}</tool_call>', []),
    ('<tool_call>{"name": "f", "arguments": {}, "id": 1}</tool_call>',
     '<tool_call>{"name": "f", "arguments": {}, "id": 1}</tool_call>', []),                    # a key too many
    (W + "\n<tool_call>[1]</tool_call>", "\n<tool_call>[1]</tool_call>", [W_CALL]),              # one good, one not
    ("Sure\n<tool_call>\n{\"name\": \"get_time\"", "Sure\n<tool_call>\n{\"name\": \"get_time\"", []),   # unclosed
    ("x <tool_ca", "x <tool_ca", []),                                                            # half a tag at the end
    ("a < b and <tool>\n", "a < b and <tool>\n", []),
    ("  \n" + T + "  \n", None, [T_CALL]),
]


def _calls(calls: list[dict]) -> list[tuple]:
    for c in calls:
        assert c["type"] == "function" and c["id"].startswith("call_") and len(c["id"]) > 10
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


@pytest.mark.parametrize("text,content,calls", CASES)
def test_whole_answers_parse_as_worked_by_hand(text, content, calls):
    got_content, got = parse(text)
    assert (got_content, _calls(got)) == (content, calls)
    ids = [c["id"] for c in got]
    assert len(set(ids)) == len(ids)


@pytest.mark.parametrize("text,content,calls", CASES)
def test_streamed_at_every_split_gives_the_whole_answer(text, content, calls):
    """Fed in two pieces split at every character, and one character at a time: the content released
    joins to the whole answer's (so no tag of a parsed call went out as content), the same calls."""
    splits = [[text[:k], text[k:]] for k in range(len(text) + 1)] + [list(text)]
    for pieces in splits:
        stream, out, got = CallStream(), [], []
        for j, piece in enumerate(pieces):
            c, found = stream.feed(piece, final=j == len(pieces) - 1)
            out.append(c)
            got += found
        assert ("".join(out) or (None if calls else ""), _calls(got)) == (content, calls), pieces


# Qwen3.5's XML form: values read by their parameter's schema type
BOOK = {"type": "function", "function": {"name": "book", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "nights": {"type": "integer"}, "price": {"type": "number"},
    "late": {"type": "boolean"}, "note": {"type": "null"}, "room": {"type": "object"}, "guests": {"type": "array"}}}}}
XML_TOOLS = [BOOK, TIME]


def xml(name: str, *params: tuple[str, str]) -> str:
    """A block as Qwen3.5's template writes one."""
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params)
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


B = xml("book", ("city", "New York"), ("nights", "3"), ("price", "99.5"), ("late", "true"), ("note", "null"),
        ("room", '{"beds": 2}'), ("guests", '["a", "b"]'))
B_CALL = ("book", {"city": "New York", "nights": 3, "price": 99.5, "late": True, "note": None, "room": {"beds": 2},
                   "guests": ["a", "b"]})
XML_CASES = [
    ("Booking.\n" + B, "Booking.", [B_CALL]),
    (xml("get_time") + "\n" + B, None, [("get_time", {}), B_CALL]),
    (xml("book", ("city", "3"), ("nights", "three"), ("extra", "7")), None,          # a string of digits stays one;
     [("book", {"city": "3", "nights": "three", "extra": "7"})]),                    # unreadable and unnamed: text
    (xml("book", ("city", "line one\nline two")), None, [("book", {"city": "line one\nline two"})]),
    ("<tool_call><function=book><parameter=nights>2</parameter></function></tool_call>", None,   # no newlines
     [("book", {"nights": 2})]),
    ("<tool_call>\n<function=book>\n\t<parameter=city>\t Rome \n</parameter>\n</function></tool_call>", None,
     [("book", {"city": "Rome"})]),                                        # whitespace around a value dropped
    (xml("book", ("city", "A"), ("city", "B")), xml("book", ("city", "A"), ("city", "B")), []),  # a parameter twice
    ("<tool_call><function=book>hi<parameter=city>A</parameter></function></tool_call>",
     "<tool_call><function=book>hi<parameter=city>A</parameter></function></tool_call>", []),    # text between tags
    ("<tool_call><function=book><parameter=city>A</function></tool_call>",
     "<tool_call><function=book><parameter=city>A</function></tool_call>", []),                 # unclosed parameter
]


@pytest.mark.parametrize("text,content,calls", XML_CASES)
def test_xml_form_parses_as_worked_by_hand_whole_and_streamed(text, content, calls):
    got_content, got = parse(text, None, XML_TOOLS)
    assert (got_content, _calls(got)) == (content, calls)
    for k in range(len(text) + 1):
        stream = CallStream(None, XML_TOOLS)
        a, first = stream.feed(text[:k])
        b, second = stream.feed(text[k:], final=True)
        assert ((a + b) or (None if calls else ""), _calls(first + second)) == (content, calls), k


def test_route_reads_xml_values_by_the_requests_schemas():
    answers = [["Booking.\n", B[:30], B[30:]]]
    whole = _chat(FakeRoute(answers), tools=XML_TOOLS)["choices"][0]
    assert (whole["message"]["content"], _calls(whole["message"]["tool_calls"])) == ("Booking.", [B_CALL])
    events = _chat(FakeRoute(answers), tools=XML_TOOLS, stream=True)
    calls = [c for e in events for ch in e["choices"] for c in ch["delta"].get("tool_calls", [])]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [B_CALL]


def test_parallel_tool_calls_false_keeps_the_first_call():
    content, got = parse("Let me check.\n" + W + "\n" + T, most=1)
    assert (content, _calls(got)) == ("Let me check.", [W_CALL])


def _route(pieces: list[tuple[str, bool]], finish_reason: str = "stop", most: int | None = None) -> list[dict]:
    """The chunks the route streams for events (text, finished) made by hand: completions.choice's piece
    through stream_piece, as completions.chunks builds them."""
    stream, out = CallStream(most), []
    for text, finished in pieces:
        piece = {"index": 0, "delta": {"content": text} if text else {}, "logprobs": None,
                 "finish_reason": finish_reason if finished else None}
        out.append(stream_piece(stream, piece, text, finished))
    return out


def _rebuilt(chunks: list[dict], final: bool = True):
    """The openai client's own stream accumulator (what client.chat.completions.stream runs) over the chunks:
    its final choice (its snapshot where the answer was cut, which the client refuses to finish)."""
    from openai.lib.streaming.chat import ChatCompletionStreamState
    from openai.types.chat import ChatCompletionChunk

    state = ChatCompletionStreamState(input_tools=TOOLS)
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    state.handle_chunk(ChatCompletionChunk.model_validate(
        {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}))
    for c in chunks:
        state.handle_chunk(ChatCompletionChunk.model_validate({**head, "choices": [c]}))
    return (state.get_final_completion() if final else state.current_completion_snapshot).choices[0]


def test_streamed_calls_rebuild_in_the_openai_client():
    text = "Let me check.\n" + W + "\n" + T
    events = [(text[k:k + 3], False) for k in range(0, len(text), 3)] + [("", True)]
    chunks = _route(events)
    assert not any("tool_call>" in c["delta"].get("content", "") for c in chunks)
    deltas = [d for c in chunks for d in c["delta"].get("tool_calls", [])]
    assert [d["index"] for d in deltas] == [0, 1]
    final = _rebuilt(chunks)
    assert final.finish_reason == "tool_calls" and final.message.content == "Let me check."
    assert [(t.function.name, json.loads(t.function.arguments)) for t in final.message.tool_calls] == [W_CALL, T_CALL]


def test_streamed_answer_without_calls_is_its_text():
    chunks = _route([("The sky", False), (" is blue.\n", False), ("", True)])
    final = _rebuilt(chunks)
    assert (final.message.content, final.message.tool_calls, final.finish_reason) == ("The sky is blue.\n", None, "stop")


def test_cut_answers_keep_their_finish_reason():
    """A call parsed in an answer cut at max_tokens: the call is out, finish_reason stays length."""
    chunks = _route([(W, False), ("\n<tool_call>\n{\"na", True)], finish_reason="length")
    final = _rebuilt(chunks, final=False)
    assert final.finish_reason == "length" and final.message.content == "\n<tool_call>\n{\"na"
    assert _calls([t.model_dump() for t in final.message.tool_calls]) == [W_CALL]


def test_whole_choice_sets_tool_calls_and_finish_reason():
    choice = {"index": 1, "message": {"role": "assistant", "content": "Let me check.\n" + T}, "logprobs": None,
              "finish_reason": "stop"}
    got = whole_choice(choice, Calls(parse=True))
    assert got["finish_reason"] == "tool_calls" and got["index"] == 1
    assert got["message"]["content"] == "Let me check." and _calls(got["message"]["tool_calls"]) == [T_CALL]
    plain = {**choice, "message": {"role": "assistant", "content": "no calls"}}
    assert whole_choice(plain, Calls(parse=True)) == plain


def test_two_choices_parse_apart():
    """n > 1: each choice has its own stream; a block open in one does not swallow the other's text."""
    a, b = CallStream(), CallStream()
    got_a, got_b = [], []
    for pa, pb in [("<tool_call>\n{\"name\": \"get_time\",", "Hello"), (" \"arguments\": {}}", " there"),
                   ("\n</tool_call>", "!")]:
        got_a.append(a.feed(pa))
        got_b.append(b.feed(pb))
    assert "".join(c for c, _ in got_b) == "Hello there!" and not any(calls for _, calls in got_b)
    assert "".join(c for c, _ in got_a) == "" and _calls([c for _, cs in got_a for c in cs]) == [T_CALL]


def test_guide_of_required_and_named():
    schema = WEATHER["function"]["parameters"]
    assert guide_of(TOOLS, "auto") is None and guide_of(TOOLS, "none") is None

    def fns(g):
        return [(f.name, f.parameters) for f in g.functions]
    req = guide_of(TOOLS, "required")
    assert req.kind == "tool_calls" and req.required and req.parallel
    assert fns(req) == [("get_weather", schema), ("get_time", {"type": "object", "properties": {}})]
    from graphc.serve.schemas import NamedToolChoice
    named = guide_of(TOOLS, NamedToolChoice(type="function", function={"name": "get_weather"}), parallel=False)
    assert fns(named) == [("get_weather", schema)] and named.required and not named.parallel
    no_params = [{"type": "function", "function": {"name": "ping"}}]
    assert fns(guide_of(no_params, "required")) == [
        ("ping", {"type": "object", "properties": {}, "additionalProperties": False})]


class FakeRoute:
    """What the chat route reads of its Context, with an engine that answers each choice with hand-written
    text in pieces: the route's own assembly (completions.chat_completion, answer, chunks) over made events."""

    def __init__(self, answers: list[list[str]], finish_reason: str = "stop"):
        from types import SimpleNamespace

        from graphc.runtime.inputs import SERVED, Limits

        self.answers, self.finish_reason, self.submitted = answers, finish_reason, []
        self.engine = SimpleNamespace(tokenizer=None, sample_rate=24000, template=None, compile_guide=lambda g: None,
                                      host=SimpleNamespace(tool_xml_style="qwen_xml"))
        self.driver = SimpleNamespace(admit=lambda: None, abort=lambda rid: None)
        self.model_name, self.names, self.sources, self.limits = "m", ("m",), SERVED, Limits()

    async def submit(self, kwargs: dict):
        import asyncio
        from types import SimpleNamespace

        from graphc.runtime.engine import Event

        pieces = self.answers[len(self.submitted)]
        self.submitted.append(kwargs)
        req = SimpleNamespace(id=kwargs["request_id"], prompt=SimpleNamespace(ids=[1, 2]), output=[7] * len(pieces),
                              known=[7] * len(pieces), logprobs=None, finish_reason=self.finish_reason, error=None,
                              closed=True, detok=None, speech=None, cached=0)
        events = asyncio.Queue()
        for j, text in enumerate(pieces):
            events.put_nowait(Event(req, [7], text, j == len(pieces) - 1))
        return (req, events), None


def _chat(route: FakeRoute, **body) -> dict | list[dict]:
    """The route's answer to a chat body: the response, or the streamed events' JSON."""
    import asyncio

    from graphc.serve.completions import chat_completion
    from graphc.serve.schemas import ChatBody

    async def run():
        out = await chat_completion(route, ChatBody(messages=[{"role": "user", "content": "hi"}], **body))
        if not body.get("stream"):
            return out
        return [json.loads(e[6:]) async for e in out.body_iterator if e.startswith("data: {")]
    return asyncio.run(run())


def test_route_parses_each_choice_whole_and_streamed():
    answers = [["Let me check.\n", W[:20], W[20:] + "\n" + T], ["Plain ", "text."]]
    whole = _chat(FakeRoute(answers), tools=TOOLS, n=2)
    one, two = whole["choices"]
    assert (one["message"]["content"], _calls(one["message"]["tool_calls"]), one["finish_reason"]) == (
        "Let me check.", [W_CALL, T_CALL], "tool_calls")
    assert two["message"] == {"role": "assistant", "content": "Plain text."} and two["finish_reason"] == "stop"
    route = FakeRoute(answers)
    events = _chat(route, tools=TOOLS, n=2, stream=True)
    assert all(kw["template_kwargs"] == {"tools": TOOLS} for kw in route.submitted)
    for i, (content, calls, reason) in enumerate([("Let me check.", [W_CALL, T_CALL], "tool_calls"),
                                                  ("Plain text.", None, "stop")]):
        mine = [{**c, "index": 0} for e in events for c in e["choices"] if c["index"] == i]
        assert mine[0]["delta"] == {"role": "assistant", "content": ""}
        final = _rebuilt(mine[1:])
        assert final.message.content == content and final.finish_reason == reason
        got = final.message.tool_calls
        assert (got and [(t.function.name, json.loads(t.function.arguments)) for t in got]) == calls


def test_required_calls_keep_to_the_form_the_template_teaches():
    """A template that writes `<function=` (Qwen3.5's) gets XML-form calls under tool_choice required, any
    other the JSON form; a request's own template decides for it."""
    from graphc.runtime.chat import ChatTemplate

    xml_text, json_text = "{{ messages }} <tool_call>\n<function=NAME>", '{{ messages }} <tool_call>{"name": N}'
    for server, own, form in ((xml_text, None, "xml"), (json_text, None, "json"), (json_text, xml_text, "xml"),
                              (None, None, "json")):
        route = FakeRoute([[W]])
        route.engine.template, route.own_templates = server and ChatTemplate(server), True
        _chat(route, tools=TOOLS, tool_choice="required", **({"chat_template": own} if own else {}))
        guide = route.submitted[0]["params"].guide
        assert (guide.form, guide.xml_style) == (form, "qwen_xml" if form == "xml" else None), (server, own)
    # a host that declares no style for the XML form: required is refused, auto still parses
    route = FakeRoute([[W]])
    route.engine.template, route.own_templates, route.engine.host.tool_xml_style = ChatTemplate(xml_text), True, None
    bad = _chat(route, tools=TOOLS, tool_choice="required")
    err = json.loads(bad.body)["error"]
    assert bad.status_code == 400 and "declares no grammar style" in err["message"] and err["param"] == "tool_choice"
    assert not route.submitted
    assert _chat(route, tools=TOOLS)["choices"][0]["finish_reason"] == "tool_calls"


def test_route_without_tools_leaves_tags_as_text():
    answers = [["Let me check.\n", W]]
    whole = _chat(FakeRoute(answers))
    assert whole["choices"][0]["message"]["content"] == "Let me check.\n" + W
    assert whole["choices"][0]["finish_reason"] == "stop"
    none = _chat(FakeRoute(answers), tools=TOOLS, tool_choice="none", stream=True)
    assert "".join(c["delta"].get("content", "") for e in none for c in e["choices"]) == "Let me check.\n" + W


# ---------------------------------------------------------------- served: the tiny checkpoint on loopback

@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from graphc.runtime.engine import Engine
    from tests.unit.loopback import serve, tiny_omni

    d = tiny_omni(tmp_path_factory.mktemp("tools"))
    engine = Engine(d / "p.plan", checkpoint=d / "ckpt")
    server, port = serve(engine)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
    yield dict(engine=engine, client=client, dir=d, port=port)
    server.should_exit = True
    engine.close()


def _rendered(port: int, messages: list, tools: list | None) -> str:
    """The prompt the server runs for messages and tools: /tokenize, then /detokenize of its ids."""
    status, got = post(port, "/tokenize", {"messages": messages, "tools": tools} if tools else {"messages": messages})
    assert status == 200, got
    status, text = post(port, "/detokenize", {"tokens": got["tokens"]})
    assert status == 200, text
    return text["prompt"]


TOOLS_SYSTEM = (  # Qwen3's tools system turn, written out by hand
    "<|im_start|>system\n{system}# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    '{{"type": "function", "function": {{"name": "get_weather", "description": "The weather in a city", "parameters": '
    '{{"type": "object", "properties": {{"city": {{"type": "string"}}, "unit": {{"enum": ["c", "f"]}}}}, '
    '"required": ["city", "unit"], "additionalProperties": false}}}}}}\n'
    '{{"type": "function", "function": {{"name": "get_time", "parameters": {{"type": "object", "properties": {{}}}}}}}}\n'
    "</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n'
    "</tool_call><|im_end|>\n")
ROUND_TRIP = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Zürich, and the time?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                          "arguments": '{"city": "Zürich", "unit": "c"}'}},
        {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "21 C"},
    {"role": "tool", "tool_call_id": "call_2", "content": "12:00"},
]


def test_tools_render_as_qwen3_writes_them(served):
    port = served["port"]
    messages = [{"role": "user", "content": "Weather in Zürich?"}]
    want = TOOLS_SYSTEM.format(system="") + "<|im_start|>user\nWeather in Zürich?<|im_end|>\n<|im_start|>assistant\n"
    assert _rendered(port, messages, TOOLS) == want
    assert _rendered(port, messages, None) == "<|im_start|>user\nWeather in Zürich?<|im_end|>\n<|im_start|>assistant\n"


def test_tool_results_round_trip(served):
    """An assistant turn of calls (content null) and their results render as Qwen3's template renders them,
    as HF's apply_chat_template renders the same checkpoint, and the chat request with them is served."""
    from transformers import AutoTokenizer

    want = (TOOLS_SYSTEM.format(system="Be brief.\n\n") + "<|im_start|>user\nWeather in Zürich, and the time?<|im_end|>\n"
            '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich", "unit": "c"}}'
            '\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call><|im_end|>\n'
            "<|im_start|>user\n<tool_response>\n21 C\n</tool_response>\n<tool_response>\n12:00\n</tool_response>"
            "<|im_end|>\n<|im_start|>assistant\n")
    assert _rendered(served["port"], ROUND_TRIP, TOOLS) == want
    hf = AutoTokenizer.from_pretrained(str(served["dir"] / "ckpt"))
    assert hf.apply_chat_template(ROUND_TRIP, tools=TOOLS, tokenize=False, add_generation_prompt=True) == want
    r = served["client"].chat.completions.create(model=served["engine"].model_name, messages=ROUND_TRIP, tools=TOOLS,
                                                 max_tokens=4, temperature=0)
    assert r.choices[0].message.role == "assistant" and r.usage.prompt_tokens == len(hf(want)["input_ids"])


def test_tools_auto_answer_shape(served):
    """tools with tool_choice auto, whole and streamed through the client's stream helper: a valid answer."""
    client, name = served["client"], served["engine"].model_name
    msgs = [{"role": "user", "content": "what is in the image"}]
    r = client.chat.completions.create(model=name, messages=msgs, tools=TOOLS, tool_choice="auto", max_tokens=6,
                                       temperature=0, n=2)
    for c in r.choices:
        assert c.finish_reason in ("stop", "length", "tool_calls") and c.message.role == "assistant"
        assert (c.message.tool_calls is None) == (c.finish_reason != "tool_calls")
    with client.chat.completions.stream(model=name, messages=msgs, tools=TOOLS, max_tokens=6, temperature=0) as s:
        for _ in s:
            pass
        final = s.current_completion_snapshot      # (get_final_completion refuses an answer cut at max_tokens)
    whole = client.chat.completions.create(model=name, messages=msgs, tools=TOOLS, max_tokens=6, temperature=0)
    assert final.choices[0].message.content == whole.choices[0].message.content
    assert final.choices[0].finish_reason == whole.choices[0].finish_reason


def test_tool_choice_none_renders_no_tools(served):
    """tool_choice none: the prompt is the one without tools (usage counts it)."""
    client, name = served["client"], served["engine"].model_name
    msgs = [{"role": "user", "content": "hello"}]
    with_none = client.chat.completions.create(model=name, messages=msgs, tools=TOOLS, tool_choice="none", max_tokens=1)
    without = client.chat.completions.create(model=name, messages=msgs, max_tokens=1)
    auto = client.chat.completions.create(model=name, messages=msgs, tools=TOOLS, max_tokens=1)
    assert with_none.usage.prompt_tokens == without.usage.prompt_tokens < auto.usage.prompt_tokens


BAD = [
    (dict(tools=[WEATHER, WEATHER]), "get_weather more than once"),
    (dict(tools=[{"type": "function", "function": {"name": "get weather"}}]), "is not a function name"),
    (dict(tools=[{"type": "function", "function": {"name": ""}}]), "is not a function name"),
    (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "strnig"}}}]),
     "is not a JSON schema"),
    (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]), "has type 'string'"),
    (dict(tools=[{"type": "function", "function": {"name": "f", "paramters": {}}}]), "paramters"),
    (dict(tools=[{"type": "retrieval", "function": {"name": "f"}}]), "tools.0.type"),
    (dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_wether"}}),
     "the tools are get_weather, get_time"),
    (dict(tool_choice="auto"), "tool_choice without tools"),
    (dict(tools=TOOLS, tool_choice="sometimes"), "tool_choice"),
    (dict(tools=TOOLS, chat_template_kwargs={"tools": TOOLS}), "chat_template_kwargs sets tools"),
    (dict(tools=TOOLS, modalities=["text", "audio"], audio={"voice": "ethan", "format": "wav"}),
     "tools with audio output"),
    (dict(messages=[{"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                                          "function": {"name": "f", "arguments": "{oops"}}]}]),
     "arguments is not a JSON object"),
    (dict(messages=[{"role": "assistant", "tool_calls": [{"type": "function",
                                                          "function": {"name": "f", "arguments": "{}"}}]}]),
     "is not a function call"),
    (dict(messages=[{"role": "tool", "content": "21 C"}]), "needs tool_call_id"),
]


@pytest.mark.parametrize("extra,words", BAD)
def test_bad_tool_requests_are_refused_saying_why(served, extra, words):
    body = {"model": served["engine"].model_name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
            **extra}
    status, got = post(served["port"], "/v1/chat/completions", body)
    assert status == 400 and words in got["error"]["message"], got


def test_a_tool_choice_that_constrains_is_not_sent_with_a_response_format(served):
    with pytest.raises(openai.BadRequestError, match="response_format with tool_choice required"):
        served["client"].chat.completions.create(model=served["engine"].model_name, tools=TOOLS, tool_choice="required",
                                                 response_format={"type": "json_object"}, max_tokens=4,
                                                 messages=[{"role": "user", "content": "hi"}])


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_required_and_named_are_enforced(served, choice, stream):
    """The random model, constrained: every choice's answer is calls to the allowed tools, whose arguments
    meet the tool's schema (checked by jsonschema), finish_reason tool_calls; a named one with
    parallel_tool_calls false, one call."""
    import jsonschema

    client, engine = served["client"], served["engine"]
    # the near-uniform tiny model writes a string until it draws '"': a bias on it (and on '}') ends strings and
    # objects in tens of tokens, not hundreds; the grammar's mask comes first, so it never makes one invalid
    bias = {str(engine.tokenizer.token_to_id(c)): 6 for c in ('"', "}")}
    kw = dict(model=engine.model_name, tools=TOOLS, tool_choice=choice, max_tokens=300, seed=1, logit_bias=bias,
              messages=[{"role": "user", "content": "Weather in Zürich?"}])
    if stream:
        with client.chat.completions.stream(**kw) as s:
            choices = s.get_final_completion().choices
    else:
        choices = client.chat.completions.create(n=2, **kw).choices
    allowed = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS
               if choice == "required" or t["function"]["name"] == choice["function"]["name"]}
    for c in choices:
        assert c.finish_reason == "tool_calls" and c.message.tool_calls
        for call in c.message.tool_calls:
            assert call.function.name in allowed
            jsonschema.validate(json.loads(call.function.arguments), allowed[call.function.name])
