#!/usr/bin/env python3
"""Pre-tokenizer goldens: the words llama.cpp cuts each string into, per preset.

For every BPE pre-tokenizer Flint implements (`PreTokenizer` in
`loader/src/tokenizer/pretokenize.rs`), takes llama.cpp's own regex list for it out of the
sdist's `src/llama-vocab.cpp` (the `regex_exprs` of `llm_tokenizer_bpe` under the
preset's `case LLAMA_VOCAB_PRE_TYPE_...:` label), splits the strings of
`tokenize_strings.py` (its fixed strings and pseudo-random character mixes) with
llama.cpp's `unicode_regex_split` (`llamacpp_pretokenize.cpp`, built by
`llamacpp_run.sh`) and writes `loader/tests/data/tokenize/words-NAME.jsonl`: per line
`text` and `words`. `loader/tests/tokenize_llamacpp.rs` checks
`PreTokenizer::split` against them word for word. Token ids hide most splitting
mistakes (a word cut in two often merges to the same tokens); the words do not.

Usage: tools/golden/pretokenize_splits.py [--out DIR] [--preset NAME]...
  --preset  only these presets (default: all)
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from tokenize_strings import HERE, REPO, llama_src, strings

# Flint's preset name (`PreTokenizer::name`) -> llama.cpp's case label.
PRESETS = {
    "default": "default:",
    "gpt-2": "case LLAMA_VOCAB_PRE_TYPE_GPT2:",
    "llama-bpe": "case LLAMA_VOCAB_PRE_TYPE_LLAMA3:",
    "qwen2": "case LLAMA_VOCAB_PRE_TYPE_QWEN2:",
    "qwen35": "case LLAMA_VOCAB_PRE_TYPE_QWEN35:",
    "gpt-4o": "case LLAMA_VOCAB_PRE_TYPE_GPT4O:",
    "gemma4": "case LLAMA_VOCAB_PRE_TYPE_GEMMA4:",
    "glm4": "case LLAMA_VOCAB_PRE_TYPE_CHATGLM4:",
    "deepseek-llm": "case LLAMA_VOCAB_PRE_TYPE_DEEPSEEK_LLM:",
    "deepseek-v3": "case LLAMA_VOCAB_PRE_TYPE_DEEPSEEK3_LLM:",
}


def c_string(lit):
    """The value of a C string literal's body (the escapes llama-vocab.cpp uses)."""
    out = []
    i = 0
    while i < len(lit):
        c = lit[i]
        if c == "\\":
            n = lit[i + 1]
            esc = {"\\": "\\", '"': '"', "n": "\n", "r": "\r", "t": "\t"}
            if n not in esc:
                sys.exit(f"pretokenize_splits.py: unknown escape \\{n} in {lit!r}")
            out.append(esc[n])
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def regexes(vocab_cpp, label):
    """The regex strings llm_tokenizer_bpe sets under `label`."""
    src = vocab_cpp.read_text()
    start = src.index("struct llm_tokenizer_bpe : llm_tokenizer {")
    at = src.index(label, start)
    block = src.index("regex_exprs = {", at)
    end = src.index("};", block)
    out = []
    for line in src[block:end].splitlines()[1:]:
        line = line.strip()
        if not line or line.startswith("//"):
            continue
        if not (line.startswith('"') and line.endswith('",')):
            sys.exit(f"pretokenize_splits.py: unexpected line under {label}: {line!r}")
        out.append(c_string(line[1:-2]))
    if not out:
        sys.exit(f"pretokenize_splits.py: no regex under {label}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(REPO / "loader/tests/data/tokenize"))
    ap.add_argument("--preset", action="append", default=[])
    args = ap.parse_args()
    unknown = [p for p in args.preset if p not in PRESETS]
    if unknown:
        sys.exit(f"pretokenize_splits.py: unknown preset {unknown} (known: {list(PRESETS)})")
    presets = {k: v for k, v in PRESETS.items() if not args.preset or k in args.preset}
    vocab_cpp = llama_src() / "src/llama-vocab.cpp"
    texts = strings()
    out = Path(args.out)
    with tempfile.TemporaryDirectory() as tmp:
        inp = Path(tmp) / "in.jsonl"
        inp.write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts))
        for name, label in presets.items():
            rx = Path(tmp) / f"{name}.json"
            rx.write_text(json.dumps(regexes(vocab_cpp, label)))
            dest = out / f"words-{name}.jsonl"
            subprocess.run(
                [str(HERE / "llamacpp_run.sh"), "llamacpp_pretokenize", str(rx), str(inp), str(dest)], check=True
            )
            for line in dest.open():
                obj = json.loads(line)
                if "".join(obj["words"]) != obj["text"]:
                    sys.exit(f"pretokenize_splits.py: {name}: the words of {obj['text']!r} do not make it up")
    print(f"pretokenize_splits.py: {len(texts)} strings x {len(presets)} presets into {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
