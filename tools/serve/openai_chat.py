#!/usr/bin/env python3
"""Talks to a running `flint serve` with the official `openai` client.

Usage: python3 tools/serve/openai_chat.py http://127.0.0.1:8080/v1

Runs a non-streaming chat completion, a streaming one (with usage), a completion, chat
and completion log-probabilities, n = 2 samples at temperature 1, and a request with a
wrong API key when the server has one; exits non-zero if any answer is malformed.
Prints what the server said. The key comes from FLINT_API_KEY (none: "unused").
"""
import math
import os
import sys

from openai import OpenAI


def main() -> int:
    base = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8080/v1"
    key = os.environ.get("FLINT_API_KEY")
    client = OpenAI(base_url=base, api_key=key or "unused")
    model = client.models.list().data[0].id

    if key:
        import openai

        wrong = OpenAI(base_url=base, api_key=key + "-wrong", max_retries=0)
        try:
            wrong.models.list()
            raise AssertionError("a wrong API key was accepted")
        except openai.AuthenticationError as e:
            assert e.status_code == 401, e
        print("wrong key: 401")

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

    # Log-probabilities, chat shape: one entry per token, its top alternatives.
    chat = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Name the capital of France."}],
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens, chat
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3, t
        # Greedy: the drawn token is the most likely one.
        assert math.isclose(t.logprob, t.top_logprobs[0].logprob, abs_tol=1e-6), t
        assert isinstance(t.bytes, list), t
    print("chat logprobs:", [(t.token, round(t.logprob, 3)) for t in content])

    # Log-probabilities, completions shape.
    comp = client.completions.create(
        model=model, prompt="The capital of France is", max_tokens=4, temperature=0,
        logprobs=2,
    )
    lp = comp.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.text_offset) == 4, lp
    assert "".join(lp.tokens) == comp.choices[0].text, lp
    assert all(len(d) >= 2 for d in lp.top_logprobs), lp
    print("completion logprobs:", list(zip(lp.tokens, lp.token_logprobs)))

    # n = 2 independent samples at temperature 1.
    chat = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Write a word."}],
        max_tokens=16,
        temperature=1,
        n=2,
        seed=1,
    )
    texts = [c.message.content for c in sorted(chat.choices, key=lambda c: c.index)]
    assert [c.index for c in chat.choices] == [0, 1], chat
    assert texts[0] != texts[1], texts
    print("n=2:", texts)
    print("openai client: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
