// ggml's x86 Q5_K x Q8_K and Q6_K x Q8_K dot products (`ggml_vec_dot_q5_K_q8_K`,
// `ggml_vec_dot_q6_K_q8_K`: their AVX2 branches, which an AVX-512 build runs) on
// deterministic blocks: llama.cpp's kernels for a single activation row (a decode step)
// and for an expert that fewer than 8 rows are routed to. Prints a "name" line followed
// by the f32 bits of each result (weight row major, then activation row), one hex word
// per line; core/tests/kquant_x86_ggml.rs holds the output. Built and run by
// `tools/golden/x86_ggml.sh kquant_x86_ggml OUTDIR`.
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include "ggml.h"
#include "ggml-cpu.h"

#define NB 8    // blocks per row
#define NW 6    // weight rows
#define NA 4    // activation rows

typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; } blk_q5_K;
typedef struct { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; } blk_q6_K;
typedef struct { float d; int8_t qs[256]; int16_t bsums[16]; } blk_q8_K;

void ggml_vec_dot_q5_K_q8_K(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc);
void ggml_vec_dot_q6_K_q8_K(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc);

// The generator of core/tests/kquant_x86_ggml.rs: a 32-bit LCG, the top 16 bits.
static uint32_t st = 2718;
static uint32_t next16(void) { st = st * 1103515245u + 12345u; return st >> 16; }

static blk_q5_K w5[NW][NB];
static blk_q5_K w5m[NW][NB];
static blk_q6_K w6[NW][NB];
static blk_q8_K a[NA][NB];

// f16 scales: positive normals between 2^-14 and 2^3, random mantissa.
static uint16_t scale16(void) {
    uint32_t k = next16();
    return (uint16_t)(((1 + k % 18) << 10) | (next16() & 0x3ff));
}

// Random codes, scales and mins everywhere; activation quants in -127..127 with their
// group sums, activation scales from 2^-20 to 2^4.
static void fill(void) {
    for (int r = 0; r < NW; r++) for (int b = 0; b < NB; b++) {
        blk_q5_K *x = &w5[r][b];
        x->d = scale16();
        x->dmin = scale16();
        for (int j = 0; j < 12; j++) x->scales[j] = (uint8_t) next16();
        for (int j = 0; j < 32; j++) x->qh[j] = (uint8_t) next16();
        for (int j = 0; j < 128; j++) x->qs[j] = (uint8_t) next16();
    }
    for (int r = 0; r < NW; r++) for (int b = 0; b < NB; b++) {
        blk_q6_K *x = &w6[r][b];
        for (int j = 0; j < 128; j++) x->ql[j] = (uint8_t) next16();
        for (int j = 0; j < 64; j++) x->qh[j] = (uint8_t) next16();
        for (int j = 0; j < 16; j++) x->scales[j] = (int8_t) (next16() & 0xff);
        x->d = scale16();
    }
    // Q5_K blocks whose mins dominate: the smallest normal `d` and `dmin` from 2^1 to
    // 2^4, so that the result is mostly the mins' f32 sum (its fused multiply-add shows).
    for (int r = 0; r < NW; r++) for (int b = 0; b < NB; b++) {
        blk_q5_K *x = &w5m[r][b];
        x->d = 0x0400;
        uint32_t e = 16 + next16() % 4;
        x->dmin = (uint16_t)((e << 10) | (next16() & 0x3ff));
        for (int j = 0; j < 12; j++) x->scales[j] = (uint8_t) next16();
        for (int j = 0; j < 32; j++) x->qh[j] = (uint8_t) next16();
        for (int j = 0; j < 128; j++) x->qs[j] = (uint8_t) next16();
    }
    for (int r = 0; r < NA; r++) for (int b = 0; b < NB; b++) {
        blk_q8_K *y = &a[r][b];
        uint32_t k = next16();
        y->d = ldexpf(1.0f + (float)(next16() & 0xffff) / 65536.0f, (int)(k % 25) - 20);
        for (int g = 0; g < 16; g++) {
            int sum = 0;
            for (int j = 0; j < 16; j++) {
                int q = (int)(next16() % 255) - 127;
                y->qs[16 * g + j] = (int8_t) q;
                sum += q;
            }
            y->bsums[g] = (int16_t) sum;
        }
    }
}

int main(void) {
    ggml_cpu_init();
    fill();
    const int n = NB * 256;
    printf("q5_k\n");
    for (int r = 0; r < NW; r++) for (int c = 0; c < NA; c++) {
        float s;
        ggml_vec_dot_q5_K_q8_K(n, &s, 0, w5[r], 0, a[c], 0, 1);
        uint32_t u; memcpy(&u, &s, 4); printf("%08x\n", u);
    }
    printf("q5_k_mins\n");
    for (int r = 0; r < NW; r++) for (int c = 0; c < NA; c++) {
        float s;
        ggml_vec_dot_q5_K_q8_K(n, &s, 0, w5m[r], 0, a[c], 0, 1);
        uint32_t u; memcpy(&u, &s, 4); printf("%08x\n", u);
    }
    printf("q6_k\n");
    for (int r = 0; r < NW; r++) for (int c = 0; c < NA; c++) {
        float s;
        ggml_vec_dot_q6_K_q8_K(n, &s, 0, w6[r], 0, a[c], 0, 1);
        uint32_t u; memcpy(&u, &s, 4); printf("%08x\n", u);
    }
    return 0;
}
