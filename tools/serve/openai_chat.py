#!/usr/bin/env python3
"""Talks to a running `flint serve` with the official `openai` client.

Usage: python3 tools/serve/openai_chat.py http://127.0.0.1:8080/v1

Runs a non-streaming chat completion, a streaming one (with usage) and a completion,
and exits non-zero if any answer is malformed. Prints what the server said.
"""
import sys

from openai import OpenAI


def main() -> int:
    base = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8080/v1"
    client = OpenAI(base_url=base, api_key="unused")
    model = client.models.list().data[0].id

    chat = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Name the capital of France."}],
        max_tokens=12,
        temperature=0,
    )
    text = chat.choices[0].message.content
    assert isinstance(text, str) and text, chat
    assert chat.usage.completion_tokens > 0, chat
    print("chat:", repr(text))

    pieces = []
    usage = None
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Count to five."}],
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta and c.delta.content:
                pieces.append(c.delta.content)
    assert pieces, "the stream carried no text"
    assert usage is not None and usage.completion_tokens == 12, usage
    print("stream:", repr("".join(pieces)), "usage:", usage.completion_tokens)

    comp = client.completions.create(
        model=model, prompt="The capital of France is", max_tokens=8, temperature=0
    )
    assert comp.choices[0].text, comp
    print("completion:", repr(comp.choices[0].text))
    print("openai client: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
