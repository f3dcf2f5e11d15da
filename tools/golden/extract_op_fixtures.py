#!/usr/bin/env python3
"""Cuts small fixtures for engine/tests/gemma_op_parity.rs out of a llama.cpp tensor dump
(tools/golden/dump_ops.sh): for a few ops of the real Gemma 3 270M model, the input and
output rows of llama.cpp's own computation, as little-endian f32.

Usage: extract_op_fixtures.py DUMP_DIR OUT_DIR
"""
import sys
from pathlib import Path

import numpy as np

ROWS = [0, 101, 175, 176]  # 175: last row of a group of four; 176: the n % 4 tail
ROPE_ROWS = [1, 101, 150, 176]  # >= 120: glibc's large-argument reduction
FIXTURES = {
    # name: (input tensor, output tensor, row width in, row width out, rows)
    "q5_0_attn_q_0": ("attn_norm-0", "Qcur-0", 640, 1024, ROWS),
    "q8_0_attn_v_0": ("attn_norm-0", "Vcur-0", 640, 256, ROWS),
    "q6_k_ffn_down_0": ("ffn_geglu-0", "ffn_out-0", 2048, 640, ROWS),
    "q4_k_attn_output_0": ("kqv_out-0", "node_32", 1024, 640, ROWS),
    "q4_k_ffn_down_2": ("ffn_geglu-2", "ffn_out-2", 2048, 640, ROWS),
    "rope_q_0": ("Qcur_normed-0", "Qcur-0#2", 1024, 1024, ROPE_ROWS),
    "rope_q_5": ("Qcur_normed-5", "Qcur-5#2", 1024, 1024, ROPE_ROWS),
}


def main():
    dump, out = Path(sys.argv[1]), Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    for name, (src, dst, w_in, w_out, rows) in FIXTURES.items():
        a = np.fromfile(dump / f"{src}.bin", dtype="<f4").reshape(-1, w_in)
        b = np.fromfile(dump / f"{dst}.bin", dtype="<f4").reshape(-1, w_out)
        a[rows].astype("<f4").tofile(out / f"{name}.in.bin")
        b[rows].astype("<f4").tofile(out / f"{name}.out.bin")
        print(name, src, dst, rows)


if __name__ == "__main__":
    main()
