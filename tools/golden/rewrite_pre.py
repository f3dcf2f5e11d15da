#!/usr/bin/env python3
"""Copies a GGUF file with another `tokenizer.ggml.pre`, everything else unchanged.

Usage: tools/golden/rewrite_pre.py IN.gguf OUT.gguf PRE

The copy is made by the `gguf` package's own `gguf_new_metadata` (the script behind
`gguf-new-metadata --pre-tokenizer`). `tokenize_strings.py` uses it to check a
pre-tokenizer no vocabulary of the sdist carries: llama.cpp's `ggml-vocab-llama-bpe.gguf`
rewritten with `PRE = gpt-4o` tokenizes the strings through the GPT-4o (o200k) regex
with the Llama 3 vocabulary and merges; `loader/tests/tokenize_llamacpp.rs` builds the
same tokenizer from the same file with the same name.
"""

import sys
from pathlib import Path

import gguf
from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata


def rewrite(src: Path, dest: Path, pre: str) -> None:
    reader = gguf.GGUFReader(src, "r")
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    writer = gguf.GGUFWriter(dest, arch=arch, endianess=reader.endianess)
    new = {gguf.Keys.Tokenizer.PRE: MetadataDetails(gguf.GGUFValueType.STRING, pre)}
    copy_with_new_metadata(reader, writer, new, [])
    check = gguf.GGUFReader(dest, "r").get_field(gguf.Keys.Tokenizer.PRE).contents()
    if check != pre:
        sys.exit(f"rewrite_pre.py: {dest} has tokenizer.ggml.pre = {check!r}, expected {pre!r}")


def main() -> None:
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    rewrite(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3])


if __name__ == "__main__":
    main()
