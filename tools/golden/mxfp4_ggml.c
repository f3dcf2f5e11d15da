// ggml's x86 MXFP4 x Q8_0 dot products on deterministic blocks: the plain
// `ggml_vec_dot_mxfp4_q8_0` (AVX2 branch) and the repacked `mxfp4_8x8` gemv and gemm
// that llama.cpp uses for every MXFP4 matrix with a multiple of 8 rows on an AVX2 /
// AVX-512 build, on two sets of blocks (random, and large block sums). Prints "name"
// lines followed by the f32 bits of each result (weight row major, then activation row),
// one hex word per line; core/tests/mxfp4_ggml.rs holds the output. Built and run by
// `tools/golden/x86_ggml.sh mxfp4_ggml OUTDIR`.
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include "ggml.h"
#include "ggml-cpu.h"

#define NB 5    // blocks per row (odd: the vec_dot's scalar tail block)
#define NW 8    // weight rows (one mxfp4x8 group)
#define NA 4    // activation rows (one q8_0x4 group)

typedef struct { uint8_t e; uint8_t qs[16]; } blk_mxfp4;
typedef struct { uint16_t d; int8_t qs[32]; } blk_q8_0;
typedef struct { uint8_t e[8]; uint8_t qs[128]; } blk_mxfp4x8;
typedef struct { uint16_t d[4]; int8_t qs[128]; } blk_q8_0x4;

void ggml_vec_dot_mxfp4_q8_0(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc);
void ggml_gemv_mxfp4_8x8_q8_0(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc);
void ggml_gemm_mxfp4_8x8_q8_0(int n, float * s, size_t bs, const void * vx, const void * vy, int nr, int nc);

// The generator of core/tests/mxfp4_ggml.rs: a 32-bit LCG, the top 16 bits.
static uint32_t st = 12345;
static uint32_t next16(void) { st = st * 1103515245u + 12345u; return st >> 16; }

static blk_mxfp4 w[NW][NB];
static blk_q8_0 a[NA][NB];

// large = 0: random nibbles and quants, exponents in 112..143 mostly, with the
// subnormal codes 0, 1 and the top 254, activation scales from 2^-14 to 2^3. large = 1:
// positive codes 5..7 (6, 8, 12) and quants of magnitude 64..127, positive in even
// blocks and negative in odd ones, exponents 126..127 and activation scales in [1, 2),
// so that block sums need more than 13 bits (`sum * D(e) * d_a` is inexact) and cancel
// in the accumulator: a fused and an unfused multiply-add then differ.
static void fill(int large) {
    for (int r = 0; r < NW; r++) for (int b = 0; b < NB; b++) {
        uint32_t k = next16();
        if (large) w[r][b].e = (uint8_t)(126 + k % 2);
        else w[r][b].e = (k % 16 == 0) ? (uint8_t)(k / 16 % 2) : (k % 16 == 1) ? 254 : (uint8_t)(112 + k / 16 % 32);
        for (int j = 0; j < 16; j++) {
            uint32_t q = next16();
            w[r][b].qs[j] = large ? (uint8_t)((5 + q % 3) | ((5 + q / 3 % 3) << 4)) : (uint8_t) q;
        }
    }
    for (int r = 0; r < NA; r++) for (int b = 0; b < NB; b++) {
        // f16 scales: positive normals between 2^-14 and 2^3, random mantissa.
        uint32_t k = next16();
        a[r][b].d = (uint16_t)(((large ? 15 : 1 + k % 18) << 10) | (next16() & 0x3ff));
        for (int j = 0; j < 32; j++) {
            uint32_t q = next16();
            a[r][b].qs[j] = large ? (int8_t)((b % 2 ? -1 : 1) * (int)(64 + q % 64)) : (int8_t)((int)(q % 255) - 127);
        }
    }
}

static void run(const char * suffix);

int main(void) {
    ggml_cpu_init();
    fill(0);
    run("");
    fill(1);
    run("_large");
    return 0;
}

static void run(const char * suffix) {
    const int n = NB * 32;
    printf("vec_dot%s\n", suffix);
    for (int r = 0; r < NW; r++) for (int c = 0; c < NA; c++) {
        float s;
        ggml_vec_dot_mxfp4_q8_0(n, &s, 0, w[r], 0, a[c], 0, 1);
        uint32_t u; memcpy(&u, &s, 4); printf("%08x\n", u);
    }
    // Repack as repack.cpp's make_block_mxfp4x8 (8-byte interleave) and
    // ggml_quantize_mat_q8_0_4x8 (8-byte interleave of four rows).
    static blk_mxfp4x8 wx[NB];
    static blk_q8_0x4 ax[NB];
    for (int b = 0; b < NB; b++) {
        for (int i = 0; i < 8; i++) wx[b].e[i] = w[i][b].e;
        for (int i = 0; i < 16; i++) memcpy(&wx[b].qs[i * 8], &w[i % 8][b].qs[(i / 8) * 8], 8);
        for (int i = 0; i < 4; i++) ax[b].d[i] = a[i][b].d;
        for (int i = 0; i < 16; i++) memcpy(&ax[b].qs[i * 8], &a[i % 4][b].qs[(i / 4) * 8], 8);
    }
    // gemv: one activation row against the 8 weight rows (output s[row]).
    printf("gemv%s\n", suffix);
    float gv[NA][NW];
    for (int c = 0; c < NA; c++) ggml_gemv_mxfp4_8x8_q8_0(n, gv[c], NW, wx, a[c], 1, NW);
    for (int r = 0; r < NW; r++) for (int c = 0; c < NA; c++) {
        uint32_t u; memcpy(&u, &gv[c][r], 4); printf("%08x\n", u);
    }
    // gemm: four activation rows at once (output s[act * bs + row]).
    printf("gemm%s\n", suffix);
    float gm[NA * NW];
    ggml_gemm_mxfp4_8x8_q8_0(n, gm, NW, wx, ax, NA, NW);
    for (int r = 0; r < NW; r++) for (int c = 0; c < NA; c++) {
        uint32_t u; memcpy(&u, &gm[c * NW + r], 4); printf("%08x\n", u);
    }
}
