#!/usr/bin/env python3
"""Checks tool calls, reasoning and JSON-schema output through the official `openai` client.

Usage: python3 tools/serve/openai_tools.py BASE_URL tools|reasoning|json_schema

`tools`: the server's model must answer the weather question with a call of
`get_weather` for Paris (engine/tests/serve_tools.rs serves a scripted one); checked
whole, streamed and forced (`tool_choice` naming it, and "required"). `reasoning`: the
answer must carry `reasoning_content` apart from `content`, whole and streamed.
`json_schema`: answers under several JSON schemas must parse and hold the fields and
types each schema asks for (every value bounded, so that a small model ends its answer). Exits non-zero on any malformed answer; prints what the
server said. The key comes from FLINT_API_KEY.
"""
import json
import os
import sys

from openai import OpenAI

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
ASK = [{"role": "user", "content": "Weather in Paris?"}]


def tools(client, model):
    r = client.chat.completions.create(
        model=model, messages=ASK, tools=[WEATHER], temperature=0, max_tokens=200
    )
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", r
    calls = c.message.tool_calls
    assert calls and len(calls) == 1, r
    assert calls[0].type == "function" and calls[0].id, calls
    assert calls[0].function.name == "get_weather", calls
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}, calls
    print("tool call:", calls[0].function.name, calls[0].function.arguments)

    # Streamed: the client's own accumulation of the deltas.
    got = {}
    finish = None
    for chunk in client.chat.completions.create(
        model=model, messages=ASK, tools=[WEATHER], temperature=0, max_tokens=200, stream=True
    ):
        for ch in chunk.choices:
            for d in ch.delta.tool_calls or []:
                slot = got.setdefault(d.index, {"name": "", "arguments": "", "id": None})
                slot["id"] = d.id or slot["id"]
                if d.function:
                    slot["name"] += d.function.name or ""
                    slot["arguments"] += d.function.arguments or ""
            finish = ch.finish_reason or finish
    assert finish == "tool_calls", finish
    assert list(got) == [0] and got[0]["name"] == "get_weather" and got[0]["id"], got
    assert json.loads(got[0]["arguments"]) == {"city": "Paris"}, got
    print("streamed tool call:", got[0])

    # A forced call: the named function, then any ("required").
    for choice in ({"type": "function", "function": {"name": "get_weather"}}, "required"):
        r = client.chat.completions.create(
            model=model, messages=ASK, tools=[WEATHER], tool_choice=choice, temperature=0,
            max_tokens=200,
        )
        c = r.choices[0]
        assert c.finish_reason == "tool_calls", r
        forced = c.message.tool_calls
        assert forced and forced[0].function.name == "get_weather", r
        assert json.loads(forced[0].function.arguments) == {"city": "Paris"}, r
        print("forced", json.dumps(choice), "->", forced[0].function.arguments)

    # The answer goes back as a tool message; the conversation goes on.
    follow = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [calls[0].model_dump()]},
        {"role": "tool", "tool_call_id": calls[0].id, "content": "sunny"},
    ]
    r = client.chat.completions.create(
        model=model, messages=follow, tools=[WEATHER], temperature=0, max_tokens=200
    )
    assert r.choices[0].message is not None, r
    print("after the tool: finish", r.choices[0].finish_reason)


def reasoning(client, model):
    r = client.chat.completions.create(model=model, messages=ASK, temperature=0, max_tokens=200)
    m = r.choices[0].message
    # The client keeps fields it does not know as extras.
    thought = getattr(m, "reasoning_content", None) or (m.model_extra or {}).get(
        "reasoning_content"
    )
    assert thought, r
    assert "<think>" not in (m.content or "") and "</think>" not in (m.content or ""), r
    print("reasoning:", repr(thought), "content:", repr(m.content))
    parts, text = [], []
    for chunk in client.chat.completions.create(
        model=model, messages=ASK, temperature=0, max_tokens=200, stream=True
    ):
        for ch in chunk.choices:
            extra = ch.delta.model_extra or {}
            parts.append(extra.get("reasoning_content") or "")
            text.append(ch.delta.content or "")
    assert "".join(parts) == thought, (parts, thought)
    assert "".join(text) == (m.content or ""), (text, m.content)
    print("streamed reasoning matches")


# Every value bounded (string lengths, integer ranges, item counts), so that a small
# model sampling at temperature 1 ends its answer within max_tokens.
SCHEMAS = [
    {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 24},
                       "age": {"type": "integer", "minimum": 0, "maximum": 120}},
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "colors": {"type": "array", "items": {"enum": ["red", "green", "blue"]},
                       "minItems": 1, "maxItems": 3},
            "ok": {"type": "boolean"},
        },
        "required": ["colors", "ok"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"point": {"type": "object",
                                 "properties": {"x": {"type": "integer", "minimum": -100,
                                                      "maximum": 100},
                                                "y": {"type": "integer", "minimum": -100,
                                                      "maximum": 100}},
                                 "required": ["x", "y"], "additionalProperties": False}},
        "required": ["point"],
        "additionalProperties": False,
    },
]


def check(schema, v):
    """A small validator for the keywords the schemas above use."""
    t = schema.get("type")
    if "enum" in schema:
        assert v in schema["enum"], (v, schema)
    if t == "object":
        assert isinstance(v, dict), v
        for k in schema.get("required", []):
            assert k in v, (k, v)
        props = schema.get("properties", {})
        if schema.get("additionalProperties") is False:
            assert set(v) <= set(props), (v, props)
        for k, s in props.items():
            if k in v:
                check(s, v[k])
    elif t == "array":
        assert isinstance(v, list), v
        assert schema.get("minItems", 0) <= len(v) <= schema.get("maxItems", 1 << 30), v
        for x in v:
            check(schema.get("items", {}), x)
    elif t == "string":
        assert isinstance(v, str) and len(v) <= schema.get("maxLength", 1 << 30), v
    elif t == "integer":
        assert isinstance(v, int) and not isinstance(v, bool), v
        assert schema.get("minimum", v) <= v <= schema.get("maximum", v), (v, schema)
    elif t == "number":
        assert isinstance(v, (int, float)) and not isinstance(v, bool), v
    elif t == "boolean":
        assert isinstance(v, bool), v


def json_schema(client, model):
    for i, schema in enumerate(SCHEMAS):
        r = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Describe a person as JSON."}],
            temperature=1,
            seed=i,
            max_tokens=200,
            response_format={"type": "json_schema",
                             "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}},
        )
        text = r.choices[0].message.content
        assert r.choices[0].finish_reason == "stop", r
        v = json.loads(text)
        check(schema, v)
        print(f"schema {i}:", text)
    # json_object is checked over the scripted stand-in (engine/tests/serve_tools.rs):
    # nothing bounds "any object", and a small model may fill max_tokens with one.


def main() -> int:
    base, mode = sys.argv[1], sys.argv[2]
    client = OpenAI(base_url=base, api_key=os.environ.get("FLINT_API_KEY") or "unused")
    model = client.models.list().data[0].id
    {"tools": tools, "reasoning": reasoning, "json_schema": json_schema}[mode](client, model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
