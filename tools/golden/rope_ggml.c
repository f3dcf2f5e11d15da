// ggml's CPU `rope` (ggml_rope_ext) on deterministic inputs, for every parameter
// combination flint_core::math::rope covers: normal and NeoX pairs, frequency scaling,
// per-pair frequency factors and YaRN. Prints, per case, "name count" and then the f32
// bits of the result, one hex word per line; core/tests/math_ggml.rs holds the output.
// Built and run by tools/golden/rope_ggml.sh.
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include "ggml.h"
#include "ggml-cpu.h"

// Exact small multiples of 1/16, the same generator as the Rust side.
static float val(int i, int salt) { return (float)(((i * 37 + salt * 11) % 101) - 50) / 16.0f; }

#define HEAD 72
#define NROT 64
#define NPOS 5

struct rope_case {
    const char * name;
    int mode;           // GGML_ROPE_TYPE_NORMAL or GGML_ROPE_TYPE_NEOX
    float base;
    float freq_scale;
    int factors;        // 1: the frequency factors below
    int n_ctx_orig;
    float ext_factor;
    float attn_factor;
    float beta_fast;
    float beta_slow;
};

int main(void) {
    struct ggml_init_params ip = { 64 * 1024 * 1024, NULL, false };
    struct ggml_context * ctx = ggml_init(ip);
    struct ggml_cgraph * gf = ggml_new_graph_custom(ctx, 64, false);

    // One head of HEAD values per position, NROT of them rotated.
    struct ggml_tensor * x = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, HEAD, 1, NPOS);
    for (int i = 0; i < HEAD * NPOS; i++) ((float *) x->data)[i] = val(i, 1);
    struct ggml_tensor * pos = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, NPOS);
    int32_t p[NPOS] = {0, 17, 5000, 70000, 131071};
    memcpy(pos->data, p, sizeof p);
    // Llama 3 style factors: 1 for the high frequencies, up to 8 for the low ones, with
    // a smooth band between.
    struct ggml_tensor * ff = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, NROT / 2);
    for (int i = 0; i < NROT / 2; i++) {
        float f = i < 12 ? 1.0f : (i >= 24 ? 8.0f : 1.0f + (float)(i - 12) * 0.5833333f);
        ((float *) ff->data)[i] = f;
    }

    const struct rope_case cases[] = {
        {"neox_1e4",            GGML_ROPE_TYPE_NEOX,   10000.0f,   1.0f,    0, 0,    0.0f, 1.0f,  0.0f,  0.0f},
        {"normal_1e4",          GGML_ROPE_TYPE_NORMAL, 10000.0f,   1.0f,    0, 0,    0.0f, 1.0f,  0.0f,  0.0f},
        {"normal_5e5_factors",  GGML_ROPE_TYPE_NORMAL, 500000.0f,  1.0f,    1, 0,    0.0f, 1.0f,  0.0f,  0.0f},
        {"neox_1e6_scale8",     GGML_ROPE_TYPE_NEOX,   1000000.0f, 0.125f,  0, 0,    0.0f, 1.0f,  0.0f,  0.0f},
        {"neox_yarn",           GGML_ROPE_TYPE_NEOX,   150000.0f,  0.03125f,0, 4096, 1.0f, 1.0f,  32.0f, 1.0f},
        {"normal_yarn_factors", GGML_ROPE_TYPE_NORMAL, 10000.0f,   0.25f,   1, 2048, 0.5f, 0.75f, 32.0f, 1.0f},
        {"neox_attn_factor",    GGML_ROPE_TYPE_NEOX,   10000.0f,   0.5f,    0, 0,    0.0f, 1.25f, 0.0f,  0.0f},
    };
    const int n_cases = (int)(sizeof cases / sizeof cases[0]);
    struct ggml_tensor * out[16];
    for (int c = 0; c < n_cases; c++) {
        const struct rope_case * r = &cases[c];
        out[c] = ggml_rope_ext(ctx, x, pos, r->factors ? ff : NULL, NROT, r->mode, r->n_ctx_orig,
                               r->base, r->freq_scale, r->ext_factor, r->attn_factor,
                               r->beta_fast, r->beta_slow);
        ggml_build_forward_expand(gf, out[c]);
    }
    ggml_graph_compute_with_ctx(ctx, gf, 1);
    for (int c = 0; c < n_cases; c++) {
        printf("%s %d\n", cases[c].name, HEAD * NPOS);
        const float * d = (const float *) out[c]->data;
        for (int i = 0; i < HEAD * NPOS; i++) { uint32_t b; memcpy(&b, &d[i], 4); printf("%08x\n", b); }
    }
    ggml_free(ctx);
    return 0;
}
