#!/usr/bin/env python3
"""Chat-template goldens rendered by llama.cpp's own Jinja engine.

For each family template shipped in the sdist (`llama.cpp/models/templates/*.jinja`:
Llama 3.1, Llama 3.3, Qwen 2.5, Qwen 3, gpt-oss, Gemma 4 (both of its templates),
Qwen 3.5) renders a fixed set of conversations
with `llamacpp_chat.cpp` (built by `llamacpp_run.sh`) and writes
`loader/tests/data/chat/TEMPLATE.jsonl`: per line `messages` (OpenAI's shape), `tools`
when offered, `add_generation_prompt`, `enable_thinking` when not llama.cpp's default
(true), `bos`, `eos` and llama.cpp's `prompt`.
`loader/tests/chat_llamacpp.rs` renders the same template with Flint and compares.

gpt-oss's (harmony) conversations add tools, tool calls with their reasoning, and
tool results; all of them open the assistant turn, as serving does (llama.cpp rewrites
the last `<|return|>` of a conversation rendered without a generation prompt, which
the template itself does not).

Gemma 4's and Qwen 3.5's conversations (`TOOLS`) are the plain ones, then tools, calls
(one and two at once), tool results (text and JSON), reasoning before a call and before
an answer, a closed conversation, and thinking switched off.

Usage: tools/golden/chat_goldens.py [--out DIR]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent

# Template file (in llama.cpp/models/templates), BOS text, EOS text, conversations
# (None: CONVERSATIONS).
TEMPLATES = [
    ("meta-llama-Llama-3.1-8B-Instruct", "<|begin_of_text|>", "<|eot_id|>", None),
    ("meta-llama-Llama-3.3-70B-Instruct", "<|begin_of_text|>", "<|eot_id|>", None),
    ("Qwen-Qwen2.5-7B-Instruct", "", "<|im_end|>", None),
    ("Qwen-Qwen3-0.6B", "", "<|im_end|>", None),
    ("openai-gpt-oss-120b", "<|startoftext|>", "<|return|>", "harmony"),
    ("google-gemma-4-31B-it", "<bos>", "<turn|>", "tools"),
    ("google-gemma-4-31B-it-interleaved", "<bos>", "<turn|>", "tools"),
    ("Qwen3.5-4B", "", "<|im_end|>", "tools"),
]

CONVERSATIONS = [
    # The conversation of llama.cpp's tests/test-chat-template.cpp.
    (
        [
            ("system", "You are a helpful assistant"),
            ("user", "Hello"),
            ("assistant", "Hi there"),
            ("user", "Who are you"),
            ("assistant", "   I am an assistant   "),
            ("user", "Another question"),
        ],
        True,
    ),
    ([("user", "Hello")], True),
    ([("user", "What is 2+2?"), ("assistant", "4")], False),
    ([("system", "Réponds en français.\nSois bref."), ("user", "  Quelle heure est-il ?\n\n")], True),
    ([("user", "Write code:\n```python\nprint('hi')\n```"), ("assistant", "Done."), ("user", "日本語で")], True),
]


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city's name."},
                "days": {"type": "integer", "default": 1},
                "unit": {"type": "string", "enum": ["C", "F"], "default": "C"},
                "hours": {"type": "array", "items": {"type": "number"}},
                "where": {"type": "object", "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
                          "required": ["lat"]},
            },
            "required": ["city"],
        },
    },
}
CLOCK = {"type": "function", "function": {"name": "get_time", "description": "The time now.",
                                          "parameters": {"type": "object", "properties": {}}}}
# No description, no parameters: llama.cpp hands the template "" and {}.
PING = {"type": "function", "function": {"name": "ping"}}


def call(name, args):
    return {"id": "call_1", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


# (messages as OpenAI's dicts, tools or None, add_generation_prompt).
HARMONY = [
    ([{"role": "user", "content": "Hello"}], None, True),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
      {"role": "assistant", "content": "Hello!", "reasoning_content": "Greet back."},
      {"role": "user", "content": "日本語で"}], None, True),
    ([{"role": "system", "content": "You are a weather bot."}, {"role": "user", "content": "Weather in Paris?"}],
     [WEATHER, CLOCK, PING], True),
    # A call with its reasoning, the tool's answer, the turn still open: the reasoning
    # is kept.
    ([{"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": "", "reasoning_content": "I should look it up.",
       "tool_calls": [call("get_weather", {"city": "Paris", "days": 2})]},
      {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}], [WEATHER], True),
    # Reasoning given as content beside the call, and a later final answer (which drops
    # the call's reasoning).
    ([{"role": "user", "content": "Weather in Köln?"},
      {"role": "assistant", "content": "Looking it up.", "tool_calls": [call("get_weather", {"city": "Köln"})]},
      {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 3}"},
      {"role": "assistant", "content": "It is 3 C in Köln.", "reasoning_content": "Cold."},
      {"role": "user", "content": "And the time?"}], [WEATHER, CLOCK], True),
]


def two_calls():
    return [dict(call("get_weather", {"city": "Oslo", "where": {"lat": 59.9, "lon": 10.7}}), id="call_1"),
            dict(call("get_time", {}), id="call_2")]


# (messages, tools or None, add_generation_prompt, enable_thinking).
TOOLS = [
    ([{"role": "system", "content": "You are a weather bot."}, {"role": "user", "content": "Weather in Paris?"}],
     [WEATHER, CLOCK, PING], True, True),
    ([{"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": "", "reasoning_content": "I should look it up.",
       "tool_calls": [call("get_weather", {"city": "Paris", "days": 2, "hours": [9, 12.5], "unit": "C"})]},
      {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}], [WEATHER], True, True),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Köln?"},
      {"role": "assistant", "content": "Looking it up.", "tool_calls": [call("get_weather", {"city": "Köln"})]},
      {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 3, \"sky\": \"grey\"}"},
      {"role": "assistant", "content": "It is 3 C in Köln.", "reasoning_content": "Cold."},
      {"role": "user", "content": "And the time?"}], [WEATHER, CLOCK], True, True),
    ([{"role": "user", "content": "Oslo weather and the time?"},
      {"role": "assistant", "content": "", "tool_calls": two_calls()},
      {"role": "tool", "tool_call_id": "call_1", "content": "rain"},
      {"role": "tool", "tool_call_id": "call_2", "content": "12:00"}], [WEATHER, CLOCK], True, True),
    ([{"role": "user", "content": "Weather in Rome?"},
      {"role": "assistant", "content": "", "tool_calls": [call("get_weather", {"city": "Rome"})]},
      {"role": "tool", "tool_call_id": "call_1", "content": "hot"},
      {"role": "assistant", "content": "It is hot in Rome."}], [WEATHER], False, True),
    # The same answer with the turn opened after it: llama.cpp opens Gemma 4's model turn
    # itself when the template leaves it closed.
    ([{"role": "user", "content": "Weather in Rome?"},
      {"role": "assistant", "content": "", "tool_calls": [call("get_weather", {"city": "Rome"})]},
      {"role": "tool", "tool_call_id": "call_1", "content": "hot"},
      {"role": "assistant", "content": "It is hot in Rome."}], [WEATHER], True, True),
    ([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!", "reasoning_content": "Greet."},
      {"role": "user", "content": "2+2?"}], None, True, True),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], None, True, False),
    ([{"role": "user", "content": "Weather in Paris?"}], [WEATHER], True, False),
]


def lines(conversations, bos, eos):
    if conversations == "harmony":
        rows = [dict({"messages": m}, **({"tools": t} if t else {}), add_generation_prompt=g)
                for m, t, g in HARMONY]
    elif conversations == "tools":
        plain = [{"messages": [{"role": r, "content": c} for r, c in msgs], "add_generation_prompt": gen}
                 for msgs, gen in CONVERSATIONS]
        rows = plain + [dict({"messages": m}, **({"tools": t} if t else {}), add_generation_prompt=g,
                             **({} if th else {"enable_thinking": False}))
                        for m, t, g, th in TOOLS]
    else:
        rows = [{"messages": [{"role": r, "content": c} for r, c in msgs], "add_generation_prompt": gen}
                for msgs, gen in CONVERSATIONS]
    return [dict(r, bos=bos, eos=eos) for r in rows]


def llama_src():
    env = os.environ.get("FLINT_LLAMACPP_SRC")
    if env:
        return Path(env)
    r = subprocess.run([str(REPO / "tools/llamacpp_sdist.sh")], check=True, stdout=subprocess.PIPE, text=True)
    return Path(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(REPO / "loader/tests/data/chat"))
    args = ap.parse_args()
    src = llama_src()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name, bos, eos, conversations in TEMPLATES:
            rows = lines(conversations, bos, eos)
            inp = Path(tmp) / "in.jsonl"
            inp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
            dest = out / f"{name}.jsonl"
            subprocess.run(
                [str(HERE / "llamacpp_run.sh"), "llamacpp_chat", str(src / f"models/templates/{name}.jinja"),
                 str(inp), str(dest), "--bos", bos, "--eos", eos],
                check=True,
            )
            n = sum(1 for _ in dest.open())
            if n != len(rows):
                sys.exit(f"chat_goldens.py: {dest} has {n} lines, expected {len(rows)}")
    print(f"chat_goldens.py: {len(TEMPLATES)} templates into {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
