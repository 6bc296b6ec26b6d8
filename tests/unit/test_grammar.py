"""Constrained decoding on a tiny Qwen3-Omni checkpoint: its random weights answer garbage, so output that
parses is the grammar's doing. A guide's mask against a brute-force reading of the regex (the `regex`
module's partial matches over every token's text), JSON checked by `json` and `jsonschema`, tool calls
parsed block by block; greedy rows beside guided ones as they are beside unguided ones; preemption, aborts
and n > 1 each keep a request's matcher right; response_format through the official client."""
import json
import re

import pytest
import torch

from examples.make_tiny_checkpoint import build_tokenizer, omni_model, save
from graphc.cli import main
from graphc.errors import InvalidInput
from graphc.runtime.engine import Engine
from graphc.runtime.grammar import Grammars, Guide, apply_mask, step_mask
from graphc.runtime.sampler import SamplingParams
from tests.unit.loopback import serve

jsonschema = pytest.importorskip("jsonschema")
regex = pytest.importorskip("regex")
openai = pytest.importorskip("openai")

SETS = ["resources.thinker_kv.pages=24", "resources.thinker_kv.max_seq_len=384"]     # 384 rows: four requests preempt
MESSAGES = [{"role": "user", "content": "hello world, how are you today?"}]
# (no minLength/maxLength: xgrammar 0.2.8 lets such a string hold raw control characters, its issue #800)
PERSON = {"type": "object", "properties": {"name": {"type": "string", "pattern": "^[A-Za-z ]{1,8}$"},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "pet": {"enum": ["cat", "dog"]}},
          "required": ["name", "age", "pet"], "additionalProperties": False}
WEATHER = {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"enum": ["Paris", "Rome"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"], "additionalProperties": False}}
NOOP = {"name": "noop"}          # no parameters: its arguments are {}
BLOCK = re.compile(r'<tool_call>\n(\{.*?\})\n</tool_call>', re.S)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny checkpoint, its plan (default pool) and a plan with a 24-page pool (preemption)."""
    d = tmp_path_factory.mktemp("grammar")
    save(omni_model(build_tokenizer()), build_tokenizer(), d / "ckpt")
    base = ["plan", "models/qwen3_omni.py", "--preset", "tiny", "--checkpoint", str(d / "ckpt"), "--gpu", "cpu", "-q"]
    assert main(base + ["-o", str(d / "p.plan")]) == 0
    assert main(base + ["-o", str(d / "small.plan")] + [a for s in SETS for a in ("--set", s)]) == 0
    return d


@pytest.fixture(scope="module")
def engine(tiny):
    return Engine(tiny / "small.plan", checkpoint=tiny / "ckpt", prefix_cache=False)


def run(engine, items: list[dict]) -> list:
    reqs = [engine.add(**item) for item in items]
    while engine.has_work():
        engine.step()
    assert engine.scheduler.idle() and engine.scheduler.pool_full()
    return [engine.output(r) for r in reqs]


def guided(guide: dict | None, n: int = 300, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=n, guide=guide, **({"temperature": 0} | kw))


def tool_blocks(text: str) -> list[dict]:
    """The calls of an answer made only of tool-call blocks joined by newlines (refused otherwise)."""
    calls = BLOCK.findall(text)
    assert "\n".join(f"<tool_call>\n{c}\n</tool_call>" for c in calls) == text, text
    return [json.loads(c) for c in calls]


# ---- the mask against a brute-force oracle
@pytest.mark.parametrize("batch", [False, True])
def test_the_first_mask_of_a_regex_allows_exactly_the_tokens_that_start_a_match(batch):
    """One guided row (its matcher fills its row), or three with two grammars (xgrammar's batch filler, on its
    threads), beside an unguided row."""
    tok = build_tokenizer()
    eos = [tok.token_to_id("<|im_end|>")]
    grammars = Grammars(tok, 512, eos)
    patterns = [r"[0-9]{2,3}-[a-z]+"] + ([r"[a-f]+ ?x", r"[g-z]+[0-9]"] if batch else [])
    rows = [None] + [grammars.matcher(Guide(kind="regex", regex=p)) for p in patterns]
    mask = step_mask(rows, [0] * len(rows), 512)
    logits = torch.zeros(len(rows), 512)
    out = apply_mask(logits, mask)
    assert torch.equal(out[0], logits[0])                   # an unguided row as it was
    special = {i for i, t in tok.get_added_tokens_decoder().items() if t.special}
    for row, pattern in enumerate(patterns, start=1):
        want = {i for i in range(tok.get_vocab_size()) if i not in special and tok.decode([i])
                and "\ufffd" not in tok.decode([i]) and regex.fullmatch(pattern, tok.decode([i]), partial=True)}
        assert want and set(torch.nonzero(out[row] == 0).flatten().tolist()) == want, pattern
        assert torch.isinf(out[row][sorted(set(range(512)) - want)]).all()


# ---- the engine
def test_json_schema_output_validates_greedy_and_sampled_in_one_batch(engine):
    guide = {"kind": "json_schema", "json_schema": PERSON}
    outs = run(engine, [dict(messages=MESSAGES, params=guided(guide))] +
               [dict(messages=MESSAGES, params=guided(guide, temperature=1.0, seed=s)) for s in range(2)])
    for o in outs:
        assert o.finish_reason == "stop", o
        jsonschema.validate(json.loads(o.text), PERSON)
    free = run(engine, [dict(messages=MESSAGES, params=guided(None, n=40))])[0]
    with pytest.raises(ValueError):         # the same request unguided: not JSON
        json.loads(free.text)


def test_a_regex_and_an_ebnf_guide_are_matched_whole(engine):
    ebnf = 'root ::= ("yes" | "no" | "maybe") "." [ ] ("yes" | "no")'
    outs = run(engine, [dict(messages=MESSAGES, params=guided({"kind": "regex", "regex": "[0-9]{3}-[a-z]{2,5}"})),
                        dict(prompt="the quick brown fox", params=guided({"kind": "ebnf", "ebnf": ebnf}, ignore_eos=True))])
    assert all(o.finish_reason == "stop" for o in outs), outs
    assert re.fullmatch("[0-9]{3}-[a-z]{2,5}", outs[0].text), outs[0].text
    assert re.fullmatch(r"(yes|no|maybe)\. (yes|no)", outs[1].text), outs[1].text    # ended by its grammar


def test_required_tool_calls_are_blocks_of_known_functions_with_valid_arguments(engine):
    outs = run(engine, [dict(messages=MESSAGES, params=guided({"kind": "tool_calls", "functions": [WEATHER, NOOP],
                                                               "required": True}, **kw))
                        for kw in ({}, {"temperature": 1.0, "seed": 5}, {"temperature": 1.0, "seed": 6})])
    for o in outs:
        assert o.finish_reason == "stop", o
        calls = tool_blocks(o.text)
        assert calls
        for c in calls:
            assert set(c) == {"name", "arguments"} and c["name"] in ("get_weather", "noop")
            jsonschema.validate(c["arguments"], WEATHER["parameters"] if c["name"] == "get_weather" else
                                {"type": "object", "maxProperties": 0})


def test_xml_form_tool_calls_parse_into_known_functions_with_valid_arguments(engine):
    """form xml (the XML form Qwen3.5's template teaches): the answers are XML blocks only, which the
    server's parser (graphc/serve/tools.py, reading values by their schema) turns into calls whose arguments
    validate."""
    from graphc.serve.tools import parse

    rendered = [{"type": "function", "function": f} for f in (WEATHER, NOOP)]
    guide = {"kind": "tool_calls", "functions": [WEATHER, NOOP], "required": True, "parallel": False,
             "form": "xml", "xml_style": "qwen_xml"}
    outs = run(engine, [dict(messages=MESSAGES, params=guided(guide, 360, **kw))
                        for kw in ({}, {"temperature": 1.0, "seed": 5}, {"temperature": 1.0, "seed": 6})])
    for o in outs:
        assert o.finish_reason == "stop" and o.text.startswith("<tool_call>\n<function="), o
        content, calls = parse(o.text, None, rendered)
        assert content is None and calls, o.text
        for c in calls:
            name, args = c["function"]["name"], json.loads(c["function"]["arguments"])
            assert name in ("get_weather", "noop"), o.text
            jsonschema.validate(args, WEATHER["parameters"] if name == "get_weather" else
                                {"type": "object", "maxProperties": 0})


def test_a_named_function_without_parallel_calls_is_called_once(engine):
    guide = {"kind": "tool_calls", "functions": [WEATHER], "required": True, "parallel": False}
    o = run(engine, [dict(messages=MESSAGES, params=guided(guide, temperature=1.0, seed=2))])[0]
    (call,) = tool_blocks(o.text)
    assert call["name"] == "get_weather" and o.finish_reason == "stop"
    jsonschema.validate(call["arguments"], WEATHER["parameters"])


def test_greedy_rows_beside_guided_rows_are_as_beside_unguided_ones(engine):
    prompts = [list(range(5, 25)), list(range(30, 41))]
    twin = dict(prompt_token_ids=prompts[1], params=guided(None, n=40))
    guide = dict(prompt_token_ids=prompts[1], params=guided({"kind": "json_schema", "json_schema": PERSON}, n=40))
    free = dict(prompt_token_ids=prompts[0], params=guided(None, n=40, ignore_eos=True))
    beside_free = run(engine, [free, twin])[0].token_ids
    assert run(engine, [free, guide])[0].token_ids == beside_free


def test_preemption_and_aborts_keep_each_matcher_right(engine):
    pattern = "[a-z]{120}[.]"
    items = [dict(prompt_token_ids=list(range(3, 3 + n)), params=guided({"kind": "regex", "regex": pattern}, n=130))
             for n in (80, 100, 60, 120)]
    alone = [run(engine, [it])[0].token_ids for it in items]
    before = engine.scheduler.stats.preemptions
    victim = engine.add(**items[0] | {"request_id": "victim"})
    for _ in range(3):
        engine.step()
    engine.abort(victim.id)
    outs = run(engine, items)
    assert engine.scheduler.stats.preemptions > before            # the pool was too small for all four
    assert [o.token_ids for o in outs] == alone
    assert all(o.finish_reason == "stop" and re.fullmatch(pattern, o.text) for o in outs), outs


def test_a_guide_that_does_not_compile_or_a_guide_of_the_wrong_shape_is_refused(engine):
    with pytest.raises(InvalidInput, match="does not compile"):
        engine.add(messages=MESSAGES, params=guided({"kind": "regex", "regex": "a(b"}))
    with pytest.raises(ValueError, match="json_schema missing"):
        guided({"kind": "json_schema"})
    with pytest.raises(ValueError, match="belong to other kinds"):
        guided({"kind": "regex", "regex": "a", "functions": [NOOP]})
    assert engine.scheduler.idle()


# ---- the server
@pytest.fixture(scope="module")
def client(tiny):
    engine = Engine(tiny / "p.plan", checkpoint=tiny / "ckpt", prefix_cache=False)
    server, port = serve(engine)
    yield openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0), engine
    server.should_exit = True


def test_response_format_json_schema_and_json_object(client):
    c, engine = client
    name = engine.plan.model.name
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    r = c.chat.completions.create(model=name, messages=MESSAGES, max_tokens=300, temperature=0, response_format=fmt)
    jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)
    close = {str(engine.tokenizer.token_to_id("}")): 100}         # "}" wherever the grammar allows it
    r = c.chat.completions.create(model=name, messages=MESSAGES, max_tokens=40, temperature=0, logit_bias=close,
                                  response_format={"type": "json_object"})
    assert json.loads(r.choices[0].message.content) == {} and r.choices[0].finish_reason == "stop"
    free = c.chat.completions.create(model=name, messages=MESSAGES, max_tokens=5, temperature=0, logit_bias=close)
    assert free.choices[0].message.content.startswith("}")


def test_response_format_streamed_and_on_completions(client):
    c, engine = client
    name = engine.plan.model.name
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    chunks = c.chat.completions.create(model=name, messages=MESSAGES, max_tokens=300, temperature=0.7, seed=3,
                                       stream=True, response_format=fmt)
    jsonschema.validate(json.loads("".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)), PERSON)
    r = c.completions.create(model=name, prompt="the quick brown fox", max_tokens=300, temperature=0, n=2,
                             extra_body={"response_format": fmt})
    for ch in r.choices:
        jsonschema.validate(json.loads(ch.text), PERSON)


def test_a_bad_response_format_gets_a_400(client):
    c, engine = client
    name = engine.plan.model.name
    for fmt, says in (({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "wat"}}},
                       'Unsupported type "wat"'),
                      ({"type": "xml"}, "response_format.type"),
                      ({"type": "json_schema"}, "takes json_schema"),
                      ({"type": "json_object", "json_schema": {"name": "x", "schema": {}}}, "takes no json_schema")):
        with pytest.raises(openai.BadRequestError, match=re.escape(says)):
            c.chat.completions.create(model=name, messages=MESSAGES, max_tokens=5, response_format=fmt)
    assert engine.scheduler.idle()
