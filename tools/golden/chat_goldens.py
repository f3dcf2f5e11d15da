#!/usr/bin/env python3
"""Chat-template goldens rendered by llama.cpp's own Jinja engine.

For each family template shipped in the sdist (`llama.cpp/models/templates/*.jinja`:
Llama 3.1, Llama 3.3, Qwen 2.5, Qwen 3) renders a fixed set of conversations with
`llamacpp_chat.cpp` (built by `llamacpp_run.sh`) and writes
`loader/tests/data/chat/TEMPLATE.jsonl`: per line `messages`, `add_generation_prompt`,
`bos`, `eos` and llama.cpp's `prompt`. `loader/tests/chat_llamacpp.rs` renders the same
template with Flint and compares.

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

# Template file (in llama.cpp/models/templates), BOS text, EOS text.
TEMPLATES = [
    ("meta-llama-Llama-3.1-8B-Instruct", "<|begin_of_text|>", "<|eot_id|>"),
    ("meta-llama-Llama-3.3-70B-Instruct", "<|begin_of_text|>", "<|eot_id|>"),
    ("Qwen-Qwen2.5-7B-Instruct", "", "<|im_end|>"),
    ("Qwen-Qwen3-0.6B", "", "<|im_end|>"),
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
        for name, bos, eos in TEMPLATES:
            inp = Path(tmp) / "in.jsonl"
            inp.write_text(
                "".join(
                    json.dumps(
                        {
                            "messages": [{"role": r, "content": c} for r, c in msgs],
                            "add_generation_prompt": gen,
                            "bos": bos,
                            "eos": eos,
                        },
                        ensure_ascii=False,
                    )
                    + "\n"
                    for msgs, gen in CONVERSATIONS
                )
            )
            dest = out / f"{name}.jsonl"
            subprocess.run(
                [str(HERE / "llamacpp_run.sh"), "llamacpp_chat", str(src / f"models/templates/{name}.jinja"),
                 str(inp), str(dest), "--bos", bos, "--eos", eos],
                check=True,
            )
            n = sum(1 for _ in dest.open())
            if n != len(CONVERSATIONS):
                sys.exit(f"chat_goldens.py: {dest} has {n} lines, expected {len(CONVERSATIONS)}")
    print(f"chat_goldens.py: {len(CONVERSATIONS)} conversations x {len(TEMPLATES)} templates into {out}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
