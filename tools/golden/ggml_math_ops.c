/*
 * The C program behind the constants of core/tests/math_ggml.rs: ggml CPU ops on
 * deterministic inputs.
 *
 * Link it against ggml's CPU backend objects built with -DGGML_CPU_GENERIC
 * -ffp-contract=off.
 */

// Runs ggml CPU ops on deterministic inputs and prints the f32 bits of the results, per
// section: "name count" then one hex word per line.
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include "ggml.h"
#include "ggml-cpu.h"

static float val(int i, int salt) { return (float)(((i * 37 + salt * 11) % 101) - 50) / 16.0f; }

static void dump(const char * name, const struct ggml_tensor * t) {
    int64_t n = ggml_nelements(t);
    printf("%s %lld\n", name, (long long)n);
    const float * d = (const float *) t->data;
    for (int64_t i = 0; i < n; i++) { uint32_t b; memcpy(&b, &d[i], 4); printf("%08x\n", b); }
}

static void fill(struct ggml_tensor * t, int salt, float mul) {
    float * d = (float *) t->data;
    for (int64_t i = 0; i < ggml_nelements(t); i++) d[i] = val((int)i, salt) * mul;
}

int main(void) {
    struct ggml_init_params ip = { 256 * 1024 * 1024, NULL, false };
    struct ggml_context * ctx = ggml_init(ip);
    struct ggml_cgraph * gf = ggml_new_graph_custom(ctx, 64, false);

    // RoPE NeoX: head 72, n_rot 64, 1 head, 4 positions, bases 1e4 and 1e6.
    struct ggml_tensor * rx = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 72, 1, 4);
    fill(rx, 1, 1.0f);
    struct ggml_tensor * rp = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 4);
    int32_t pos[4] = {0, 17, 5000, 70000};
    memcpy(rp->data, pos, sizeof pos);
    struct ggml_tensor * r1 = ggml_rope_ext(ctx, rx, rp, NULL, 64, GGML_ROPE_TYPE_NEOX, 0, 10000.0f, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);
    struct ggml_tensor * r2 = ggml_rope_ext(ctx, rx, rp, NULL, 64, GGML_ROPE_TYPE_NEOX, 0, 1000000.0f, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);

    // RMSNorm times weight: 2 rows of 256, eps 1e-6.
    struct ggml_tensor * nx = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 256, 2);
    fill(nx, 2, 1.0f);
    struct ggml_tensor * nw = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 256);
    fill(nw, 3, 0.25f);
    struct ggml_tensor * nrm = ggml_mul(ctx, ggml_rms_norm(ctx, nx, 1e-6f), nw);

    // Activations on 256 values in [-12.5, 12.5].
    struct ggml_tensor * ax = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 256);
    for (int i = 0; i < 256; i++) ((float *) ax->data)[i] = (float)(i - 128) * 0.09765625f + val(i, 4) / 64.0f;
    struct ggml_tensor * gl = ggml_gelu(ctx, ax);
    struct ggml_tensor * sl = ggml_silu(ctx, ax);
    struct ggml_tensor * sg = ggml_sigmoid(ctx, ax);

    // Flash attention with sinks, GQA (4 query heads, 2 kv heads), dk 16, dv 8,
    // 12 kv positions, queries at positions 3, 7, 11, causal or window 4.
    const int DK = 16, DV = 8, NKV = 12, NQ = 3, H = 4, HKV = 2;
    struct ggml_tensor * q = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, DK, NQ, H);
    struct ggml_tensor * k = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, DK, NKV, HKV);
    struct ggml_tensor * v = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, DV, NKV, HKV);
    fill(q, 5, 0.5f); fill(k, 6, 0.5f); fill(v, 7, 1.0f);
    struct ggml_tensor * sinks = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, H);
    float sv[4] = {-1.0f, 0.5f, 2.0f, -3.0f};
    memcpy(sinks->data, sv, sizeof sv);
    int qpos[3] = {3, 7, 11};
    struct ggml_tensor * fa[2];
    for (int w = 0; w < 2; w++) {
        struct ggml_tensor * mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, NKV, NQ);
        ggml_fp16_t * m = (ggml_fp16_t *) mask->data;
        for (int t = 0; t < NQ; t++) for (int j = 0; j < NKV; j++) {
            int vis = j <= qpos[t] && (w == 0 || j > qpos[t] - 4);
            m[t * NKV + j] = ggml_fp32_to_fp16(vis ? 0.0f : -INFINITY);
        }
        fa[w] = ggml_flash_attn_ext(ctx, q, k, v, mask, 0.25f, 0.0f, 0.0f);
        ggml_flash_attn_ext_add_sinks(fa[w], sinks);
        ggml_flash_attn_ext_set_prec(fa[w], GGML_PREC_F32);
    }

    struct ggml_tensor * outs[] = {r1, r2, nrm, gl, sl, sg, fa[0], fa[1]};
    const char * names[] = {"rope_1e4", "rope_1e6", "rms_norm", "gelu", "silu", "sigmoid", "attn_causal", "attn_window4"};
    for (int i = 0; i < 8; i++) ggml_build_forward_expand(gf, outs[i]);
    ggml_graph_compute_with_ctx(ctx, gf, 1);
    for (int i = 0; i < 8; i++) dump(names[i], outs[i]);
    ggml_free(ctx);
    return 0;
}
