/*
 * opmix: the register-only throughput of the tinyBLAS inner step on this CPU, to know how
 * far the prompt-batch kernels (hal-cpu `vnni::q0_tile`) are from what the op mix allows.
 *
 * One step per (weight-row pair, activation row, 32-quant block) in llama.cpp's tinyBLAS
 * order: sum = vpdpbusd(init, u, y); dd = d_w * d_a (vmulps); acc = fma(dd, cvt(sum), acc).
 * A tile of 3 pairs x 4 activation rows (12 accumulators, as `q0_tile`) is timed
 *   - as the kernel does it (a vmulps per step), and
 *   - with the scale product replaced by a vpermps (what a kernel that computed the 24
 *     products of a block in two multiplies and spread them with permutes would pay),
 * against 12 independent FMAs (one 512-bit FMA per cycle on Zen 4), all from registers.
 * No loads, so these are ceilings; the kernel adds its loads and the loop.
 *
 * On this VM (2026-11-30): 36 cycles per tile with vmulps (21 MACs per cycle), 25 with
 * vpermps; the real kernel runs at ~16 MACs per cycle, and a kernel with the permutes was
 * slower (docs/benchmarks.md, session 5): the ceiling here ignores loads and the loop.
 *
 * Build and run:  cc -O2 -march=native tools/bench/opmix.c -o /tmp/opmix && /tmp/opmix
 * Needs AVX-512 F/VNNI. Prints cycles per tile (12 steps = 768 MACs) relative to the FMA
 * loop, taken as 12 cycles, and MACs per cycle.
 */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

#define ITERS 20000000L

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#define STEP(acc, uu, dd, yy, ss, SCALE) \
    acc = _mm512_fmadd_ps(SCALE(dd, ss), _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(init, uu, yy)), acc);
#define MUL(d, s) _mm512_mul_ps(d, s)
#define PERM(d, s) _mm512_permutexvar_ps(_mm512_castps_si512(s), d)

#define TILE_FN(name, SCALE)                                                                     \
    __attribute__((noinline)) static void name(__m512 *acc, const __m512i *u, const __m512 *d,   \
                                               const __m512i *y, const __m512 *s, __m512i init,   \
                                               long n) {                                          \
        __m512 a0 = acc[0], a1 = acc[1], a2 = acc[2], a3 = acc[3], a4 = acc[4], a5 = acc[5];      \
        __m512 a6 = acc[6], a7 = acc[7], a8 = acc[8], a9 = acc[9], a10 = acc[10], a11 = acc[11];  \
        __m512i u0 = u[0], u1 = u[1], u2 = u[2], y0 = y[0], y1 = y[1], y2 = y[2], y3 = y[3];      \
        __m512 d0 = d[0], d1 = d[1], d2 = d[2], s0 = s[0], s1 = s[1], s2 = s[2], s3 = s[3];       \
        for (long i = 0; i < n; i++) {                                                            \
            /* Opaque to the compiler: nothing is hoisted or shared between iterations. */       \
            __asm__ volatile("" : "+v"(y0), "+v"(y1), "+v"(y2), "+v"(y3), "+v"(init), "+v"(s0),   \
                                  "+v"(s1), "+v"(s2), "+v"(s3), "+v"(d0), "+v"(d1), "+v"(d2));    \
            STEP(a0, u0, d0, y0, s0, SCALE) STEP(a1, u1, d1, y0, s0, SCALE)                       \
            STEP(a2, u2, d2, y0, s0, SCALE) STEP(a3, u0, d0, y1, s1, SCALE)                       \
            STEP(a4, u1, d1, y1, s1, SCALE) STEP(a5, u2, d2, y1, s1, SCALE)                       \
            STEP(a6, u0, d0, y2, s2, SCALE) STEP(a7, u1, d1, y2, s2, SCALE)                       \
            STEP(a8, u2, d2, y2, s2, SCALE) STEP(a9, u0, d0, y3, s3, SCALE)                       \
            STEP(a10, u1, d1, y3, s3, SCALE) STEP(a11, u2, d2, y3, s3, SCALE)                     \
        }                                                                                         \
        acc[0] = a0; acc[1] = a1; acc[2] = a2; acc[3] = a3; acc[4] = a4; acc[5] = a5;             \
        acc[6] = a6; acc[7] = a7; acc[8] = a8; acc[9] = a9; acc[10] = a10; acc[11] = a11;         \
    }

TILE_FN(tile_mul, MUL)
TILE_FN(tile_perm, PERM)

__attribute__((noinline)) static void fma12(__m512 *acc, __m512 s, __m512 d, long n) {
    /* Twelve named accumulators: an array here would live in memory, and the loop would
     * time store-to-load forwarding instead of the FMA pipes. */
    __m512 a0 = acc[0], a1 = acc[1], a2 = acc[2], a3 = acc[3], a4 = acc[4], a5 = acc[5];
    __m512 a6 = acc[6], a7 = acc[7], a8 = acc[8], a9 = acc[9], a10 = acc[10], a11 = acc[11];
    for (long i = 0; i < n; i++) {
        __asm__ volatile("" : "+v"(s), "+v"(d));
        a0 = _mm512_fmadd_ps(a0, s, d); a1 = _mm512_fmadd_ps(a1, s, d);
        a2 = _mm512_fmadd_ps(a2, s, d); a3 = _mm512_fmadd_ps(a3, s, d);
        a4 = _mm512_fmadd_ps(a4, s, d); a5 = _mm512_fmadd_ps(a5, s, d);
        a6 = _mm512_fmadd_ps(a6, s, d); a7 = _mm512_fmadd_ps(a7, s, d);
        a8 = _mm512_fmadd_ps(a8, s, d); a9 = _mm512_fmadd_ps(a9, s, d);
        a10 = _mm512_fmadd_ps(a10, s, d); a11 = _mm512_fmadd_ps(a11, s, d);
    }
    acc[0] = a0; acc[1] = a1; acc[2] = a2; acc[3] = a3; acc[4] = a4; acc[5] = a5;
    acc[6] = a6; acc[7] = a7; acc[8] = a8; acc[9] = a9; acc[10] = a10; acc[11] = a11;
}

int main(void) {
    __m512 acc[12];
    for (int k = 0; k < 12; k++) acc[k] = _mm512_setzero_ps();
    const __m512i u[3] = {_mm512_set1_epi8(3), _mm512_set1_epi8(4), _mm512_set1_epi8(5)};
    const __m512 d[3] = {_mm512_set1_ps(1.0f), _mm512_set1_ps(2.0f), _mm512_set1_ps(3.0f)};
    const __m512i y[4] = {_mm512_set1_epi8(1), _mm512_set1_epi8(2), _mm512_set1_epi8(-3),
                          _mm512_set1_epi8(7)};
    /* Normal floats (denormal or zero products would time something else); as permute
     * indices only their low 4 bits count. */
    const __m512 s[4] = {_mm512_set1_ps(0.5f), _mm512_set1_ps(0.25f), _mm512_set1_ps(-0.75f),
                         _mm512_set1_ps(1.5f)};
    for (int round = 0; round < 3; round++) {
        double t0 = now_s();
        fma12(acc, _mm512_set1_ps(0.9999f), _mm512_set1_ps(1e-6f), ITERS);
        double t_fma = now_s() - t0;
        t0 = now_s();
        tile_mul(acc, u, d, y, s, _mm512_set1_epi32(2), ITERS);
        double t_mul = now_s() - t0;
        t0 = now_s();
        tile_perm(acc, u, d, y, s, _mm512_set1_epi32(2), ITERS);
        double t_perm = now_s() - t0;
        double c_mul = 12.0 * t_mul / t_fma, c_perm = 12.0 * t_perm / t_fma;
        printf("round %d: tile with vmulps %.1f cycles (%.1f MAC/cycle), with vpermps %.1f cycles "
               "(%.1f MAC/cycle)\n",
               round + 1, c_mul, 768.0 / c_mul, c_perm, 768.0 / c_perm);
    }
    float sum = 0;
    for (int k = 0; k < 12; k++) sum += _mm512_reduce_add_ps(acc[k]);
    printf("(checksum %g)\n", sum);
    return 0;
}
