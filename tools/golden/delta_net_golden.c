// ggml's Gated DeltaNet ops on deterministic inputs: `ggml_ssm_conv` (then `ggml_silu`),
// the q/k L2 norm and the log decay, and the fused `ggml_gated_delta_net` (K = 1:
// outputs, then the final state), which
// llama.cpp's CPU backend runs for Qwen 3.5's linear-attention layers on prompts and
// decode steps alike. Writes the results as little-endian f32, one case after another
// (the order and shapes of core/tests/delta_net_ggml.rs, which regenerates the inputs with
// the same generator), to the file named by its argument. Built and run by
// tools/golden/delta_net_golden.sh.
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include "ggml.h"
#include "ggml-cpu.h"

// The generator of core/tests/delta_net_ggml.rs: xorshift32, the top 24 bits as a float
// in [-1, 1) (exact).
static uint32_t st;
static float rnd(void) {
    st ^= st << 13; st ^= st >> 17; st ^= st << 5;
    return (float) (st >> 8) * (1.0f / 8388608.0f) - 1.0f;
}

static FILE * out;
static void put(const float * x, int64_t n) {
    if (fwrite(x, sizeof(float), (size_t) n, out) != (size_t) n) { perror("write"); exit(1); }
}

static struct ggml_context * new_ctx(void) {
    struct ggml_init_params p = { 64u << 20, NULL, false };
    return ggml_init(p);
}

static void run(struct ggml_context * ctx, struct ggml_tensor * t) {
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, t);
    if (ggml_graph_compute_with_ctx(ctx, gf, 1) != GGML_STATUS_SUCCESS) { fprintf(stderr, "compute failed\n"); exit(1); }
}

// Conv: `channels` channels, width `d_conv`, `n` tokens. Inputs in this order: the
// window state [channels][d_conv-1], x [n][channels], weight [channels][d_conv]. Writes
// the conv output [n][channels], then its SiLU.
static void conv_case(uint32_t seed, int channels, int d_conv, int n) {
    st = seed;
    struct ggml_context * ctx = new_ctx();
    const int w = d_conv - 1;
    struct ggml_tensor * sx = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, w + n, channels, 1);
    struct ggml_tensor * c = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, d_conv, channels);
    float * sxd = (float *) sx->data;
    for (int ch = 0; ch < channels; ch++) for (int m = 0; m < w; m++) sxd[ch * (w + n) + m] = rnd();
    for (int t = 0; t < n; t++) for (int ch = 0; ch < channels; ch++) sxd[ch * (w + n) + w + t] = rnd();
    for (int i = 0; i < channels * d_conv; i++) ((float *) c->data)[i] = rnd();
    struct ggml_tensor * y = ggml_ssm_conv(ctx, sx, c);
    struct ggml_tensor * ys = ggml_silu(ctx, y);
    run(ctx, ys);
    put((float *) y->data, (int64_t) n * channels);
    put((float *) ys->data, (int64_t) n * channels);
    ggml_free(ctx);
}

// Delta rule: `hk` key heads, `hv` value heads, head size `d`, `n` tokens, one sequence.
// Inputs in this order: q [n][hk][d] and k (each times 1/4), v [n][hv][d], g [n][hv]
// (-(r+1)/2, in (-1, 0]), beta [n][hv] ((r+1)/2), state [hv][d][d] (times 1/2).
// Writes the outputs [n][hv][d], then the final state.
static void delta_case(uint32_t seed, int hk, int hv, int d, int n) {
    st = seed;
    struct ggml_context * ctx = new_ctx();
    struct ggml_tensor * q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, d, hk, n, 1);
    struct ggml_tensor * k = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, d, hk, n, 1);
    struct ggml_tensor * v = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, d, hv, n, 1);
    struct ggml_tensor * g = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 1, hv, n, 1);
    struct ggml_tensor * b = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 1, hv, n, 1);
    struct ggml_tensor * s = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, d, d, hv, 1);
    for (int64_t i = 0; i < ggml_nelements(q); i++) ((float *) q->data)[i] = rnd() * 0.25f;
    for (int64_t i = 0; i < ggml_nelements(k); i++) ((float *) k->data)[i] = rnd() * 0.25f;
    for (int64_t i = 0; i < ggml_nelements(v); i++) ((float *) v->data)[i] = rnd();
    for (int64_t i = 0; i < ggml_nelements(g); i++) ((float *) g->data)[i] = -(rnd() + 1.0f) * 0.5f;
    for (int64_t i = 0; i < ggml_nelements(b); i++) ((float *) b->data)[i] = (rnd() + 1.0f) * 0.5f;
    for (int64_t i = 0; i < ggml_nelements(s); i++) ((float *) s->data)[i] = rnd() * 0.5f;
    struct ggml_tensor * r = ggml_gated_delta_net(ctx, q, k, v, g, b, s, 1);
    run(ctx, r);
    put((float *) r->data, (int64_t) n * hv * d + (int64_t) hv * d * d);
    ggml_free(ctx);
}

// The steps that feed the delta rule: q/k L2 norm as llama.cpp's `build_gdn_l2_norm`
// (`rms_norm(x, eps / d)` scaled by `1 / sqrtf(d)`, eps 1e-6) of `rows` rows of `d`, and
// the log decay `softplus(alpha + dt_bias) * ssm_a` of `nh` heads. Inputs in this order:
// x [rows][d], alpha (times 24), dt_bias, ssm_a (-(r+1)). Writes the normalised rows,
// then the decays.
static void prep_case(uint32_t seed, int d, int rows, int nh) {
    st = seed;
    struct ggml_context * ctx = new_ctx();
    struct ggml_tensor * x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, d, rows);
    struct ggml_tensor * al = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, nh);
    struct ggml_tensor * dt = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, nh);
    struct ggml_tensor * a = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, nh);
    for (int i = 0; i < d * rows; i++) ((float *) x->data)[i] = rnd();
    for (int i = 0; i < nh; i++) ((float *) al->data)[i] = rnd() * 24.0f;
    for (int i = 0; i < nh; i++) ((float *) dt->data)[i] = rnd();
    for (int i = 0; i < nh; i++) ((float *) a->data)[i] = -(rnd() + 1.0f);
    const float n = (float) d;
    struct ggml_tensor * l2 = ggml_scale(ctx, ggml_rms_norm(ctx, x, 1e-6f / n), 1.0f / sqrtf(n));
    struct ggml_tensor * g = ggml_mul(ctx, ggml_softplus(ctx, ggml_add(ctx, al, dt)), a);
    run(ctx, l2);
    run(ctx, g);
    put((float *) l2->data, (int64_t) d * rows);
    put((float *) g->data, nh);
    ggml_free(ctx);
}

int main(int argc, char ** argv) {
    if (argc != 2) { fprintf(stderr, "usage: %s OUT.bin\n", argv[0]); return 2; }
    out = fopen(argv[1], "wb");
    if (!out) { perror(argv[1]); return 1; }
    conv_case(1, 24, 4, 5);
    delta_case(2, 1, 2, 32, 5);  // two value heads on one key head; whole SIMD steps
    delta_case(3, 1, 1, 36, 2);  // a head size with a scalar tail of 4
    prep_case(4, 32, 3, 16);
    fclose(out);
    return 0;
}
