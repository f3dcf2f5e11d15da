// llama.cpp's CPU flash attention and the softmax inside it, in an AVX2 build of ggml,
// on deterministic inputs: `ggml_vec_soft_max_f32` (which holds ggml's AVX2
// `ggml_v_expf`), then `ggml_flash_attn_ext` through its tiled path (at least 64 query
// rows) and its one-key-at-a-time path (fewer rows), f16 keys and values. Writes the
// results as little-endian values, one case after another (the order and shapes of
// core/tests/fa_ggml_avx2.rs, which regenerates the inputs with the same generator), to
// the file named by its argument. Built and run by tools/golden/fa_ggml_avx2.sh.
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include "ggml.h"
#include "ggml-cpu.h"

// ggml-cpu/vec.h (C++): extern "C", exported by libggml-cpu.
typedef double ggml_float;
ggml_float ggml_vec_soft_max_f32(const int n, float * y, const float * x, float max);

// The generator of core/tests/fa_ggml_avx2.rs: xorshift32, the top 24 bits as a float in
// [-1, 1) (exact).
static uint32_t st;
static float rnd(void) {
    st ^= st << 13; st ^= st >> 17; st ^= st << 5;
    return (float) (st >> 8) * (1.0f / 8388608.0f) - 1.0f;
}

static FILE * out;
static void put(const void * x, size_t bytes) {
    if (fwrite(x, 1, bytes, out) != bytes) { perror("write"); exit(1); }
}

// exp: 1024 values in four bands of 256: rnd*4, rnd*40-40, rnd*30-110 (where `|n| > 126`
// takes ggml_v_expf's two-factor path, down to 0), rnd*100. y = exp(x - 0). Writes y.
static void exp_case(void) {
    st = 1;
    float x[1024], y[1024];
    for (int i = 0; i < 1024; i++) {
        float r = rnd();
        switch (i / 256) {
            case 0: x[i] = r * 4.0f; break;
            case 1: x[i] = r * 40.0f - 40.0f; break;
            case 2: x[i] = r * 30.0f - 110.0f; break;
            default: x[i] = r * 100.0f; break;
        }
    }
    ggml_vec_soft_max_f32(1024, y, x, 0.0f);
    put(y, sizeof y);
}

// softmax: a row of n values rnd*8 with its maximum as `max`. Writes y, then the sum
// (f64).
static void softmax_case(uint32_t seed, int n) {
    st = seed;
    float x[256], y[256];
    float max = -INFINITY;
    for (int i = 0; i < n; i++) { x[i] = rnd() * 8.0f; if (x[i] > max) max = x[i]; }
    ggml_float sum = ggml_vec_soft_max_f32(n, y, x, max);
    put(y, (size_t) n * sizeof(float));
    put(&sum, sizeof sum);
}

// Flash attention: `h` query heads over `hkv` KV heads, head sizes dk and dv, `nkv`
// positions, `nq` queries at positions nkv-nq .. nkv-1, causal, keys in (p - window, p]
// when window > 0, sinks when `sinks`. Inputs in this order: q [nq][h][dk], k [nkv][hkv][dk]
// and v [nkv][hkv][dv] (rounded to f16), sinks [h] (times 2). Writes the output
// [nq][h][dv].
static void fa_case(uint32_t seed, int h, int hkv, int dk, int dv, int nkv, int nq,
                    float scale, int window, int sinks) {
    st = seed;
    struct ggml_init_params ip = { 64u << 20, NULL, false };
    struct ggml_context * ctx = ggml_init(ip);
    struct ggml_tensor * q = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, dk, h, nq);
    struct ggml_tensor * k = ggml_new_tensor_3d(ctx, GGML_TYPE_F16, dk, hkv, nkv);
    struct ggml_tensor * v = ggml_new_tensor_3d(ctx, GGML_TYPE_F16, dv, hkv, nkv);
    for (int64_t i = 0; i < ggml_nelements(q); i++) ((float *) q->data)[i] = rnd();
    for (int64_t i = 0; i < ggml_nelements(k); i++) ((ggml_fp16_t *) k->data)[i] = ggml_fp32_to_fp16(rnd());
    for (int64_t i = 0; i < ggml_nelements(v); i++) ((ggml_fp16_t *) v->data)[i] = ggml_fp32_to_fp16(rnd());
    struct ggml_tensor * s = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, h);
    for (int i = 0; i < h; i++) ((float *) s->data)[i] = rnd() * 2.0f;
    struct ggml_tensor * mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, nkv, nq);
    for (int t = 0; t < nq; t++) for (int j = 0; j < nkv; j++) {
        int p = nkv - nq + t;
        int vis = j <= p && (window == 0 || j > p - window);
        ((ggml_fp16_t *) mask->data)[t * nkv + j] = ggml_fp32_to_fp16(vis ? 0.0f : -INFINITY);
    }
    // ggml's layout: q [dk, nq, h], k [dk, nkv, hkv] as views of the token-major rows.
    struct ggml_tensor * qp = ggml_permute(ctx, q, 0, 2, 1, 3);
    struct ggml_tensor * kp = ggml_permute(ctx, k, 0, 2, 1, 3);
    struct ggml_tensor * vp = ggml_permute(ctx, v, 0, 2, 1, 3);
    struct ggml_tensor * fa = ggml_flash_attn_ext(ctx, qp, kp, vp, mask, scale, 0.0f, 0.0f);
    if (sinks) ggml_flash_attn_ext_add_sinks(fa, s);
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, fa);
    if (ggml_graph_compute_with_ctx(ctx, gf, 1) != GGML_STATUS_SUCCESS) { fprintf(stderr, "compute failed\n"); exit(1); }
    // The result is [dv, h, nq]: already [nq][h][dv] in memory.
    put(fa->data, (size_t) nq * h * dv * sizeof(float));
    ggml_free(ctx);
}

int main(int argc, char ** argv) {
    if (argc != 2) { fprintf(stderr, "usage: %s OUT\n", argv[0]); return 2; }
    out = fopen(argv[1], "wb");
    if (!out) { perror(argv[1]); return 1; }
    exp_case();
    softmax_case(2, 64);
    softmax_case(3, 64);
    softmax_case(4, 70);
    softmax_case(5, 13);
    // Tiled path: 100 queries over 100 positions (two tiles of queries and of keys).
    fa_case(6, 2, 1, 64, 32, 100, 100, 0.125f, 0, 0);
    fa_case(7, 2, 1, 64, 32, 100, 100, 1.0f, 40, 1);
    // One key at a time: 4 queries over 100 positions; head sizes 48 (a 32-value block
    // and a tail) and 64.
    fa_case(8, 4, 2, 48, 48, 100, 4, 1.0f, 0, 0);
    fa_case(9, 4, 2, 64, 64, 100, 4, 1.0f, 40, 1);
    if (fclose(out) != 0) { perror("close"); return 1; }
    return 0;
}
