/*
 * The C harness behind GGML_BITS in core/tests/dot_agreement.rs: ggml's generic
 * vec_dot kernels on the records that test dumps.
 *
 * Build from llama.cpp's source tree:
 *   gcc -O1 -ffp-contract=off -DGGML_CPU_GENERIC -I ggml/include -I ggml/src
 *       -I ggml/src/ggml-cpu ggml_vec_dot.c ggml/src/ggml-cpu/quants.c
 *       ggml/src/ggml-quants.c -lm -o ggml_vec_dot
 * then `ggml_vec_dot < dump > bits`, where `dump` is what the test writes.
 */

// Reads records from stdin: u32 type id, u32 n, u32 wlen, w bytes, u32 alen, act bytes,
// then n f32 x. Prints, per record, the bits of ggml's generic vec_dot on (w, act) and on
// (w, ggml-quantized x), in hex.
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include "ggml.h"
#include "ggml-quants.h"
#include "ggml-cpu/quants.h"

float ggml_table_f32_f16[1 << 16];
void ggml_abort(const char * f, int l, const char * fmt, ...) { fprintf(stderr, "abort %s:%d\n", f, l); exit(1); }
size_t ggml_row_size(enum ggml_type t, int64_t n) { return 0; }
const char * ggml_type_name(enum ggml_type t) { return "?"; }
size_t ggml_type_size(enum ggml_type t) { return 0; }

static float h2f(uint16_t h) {
    uint32_t s = (h >> 15) & 1, e = (h >> 10) & 31, m = h & 1023;
    float v;
    if (e == 0) v = ldexpf((float)m, -24);
    else if (e == 31) v = m ? NAN : INFINITY;
    else v = ldexpf((float)(m | 1024), (int)e - 25);
    return s ? -v : v;
}

typedef void (*dotf)(int, float *, size_t, const void *, size_t, const void *, size_t, int);

static int rd(void * p, size_t n) { return fread(p, 1, n, stdin) == n; }

int main(void) {
    for (int i = 0; i < 65536; i++) ggml_table_f32_f16[i] = h2f((uint16_t)i);
    uint32_t ty, n, wl, al;
    while (rd(&ty, 4)) {
        rd(&n, 4); rd(&wl, 4);
        uint8_t * w = malloc(wl); rd(w, wl);
        rd(&al, 4);
        uint8_t * a = malloc(al); rd(a, al);
        float * x = malloc(n * 4); rd(x, n * 4);
        dotf f = 0; int act = 0; // 0: q8_0, 1: q8_1, 2: q8_K
        switch (ty) {
            case 2: f = ggml_vec_dot_q4_0_q8_0; break;
            case 3: f = ggml_vec_dot_q4_1_q8_1; act = 1; break;
            case 6: f = ggml_vec_dot_q5_0_q8_0; break;
            case 7: f = ggml_vec_dot_q5_1_q8_1; act = 1; break;
            case 8: f = ggml_vec_dot_q8_0_q8_0; break;
            case 10: f = ggml_vec_dot_q2_K_q8_K; act = 2; break;
            case 11: f = ggml_vec_dot_q3_K_q8_K; act = 2; break;
            case 12: f = ggml_vec_dot_q4_K_q8_K; act = 2; break;
            case 13: f = ggml_vec_dot_q5_K_q8_K; act = 2; break;
            case 14: f = ggml_vec_dot_q6_K_q8_K; act = 2; break;
            case 16: f = ggml_vec_dot_iq2_xxs_q8_K; act = 2; break;
            case 17: f = ggml_vec_dot_iq2_xs_q8_K; act = 2; break;
            case 18: f = ggml_vec_dot_iq3_xxs_q8_K; act = 2; break;
            case 19: f = ggml_vec_dot_iq1_s_q8_K; act = 2; break;
            case 20: f = ggml_vec_dot_iq4_nl_q8_0; break;
            case 21: f = ggml_vec_dot_iq3_s_q8_K; act = 2; break;
            case 22: f = ggml_vec_dot_iq2_s_q8_K; act = 2; break;
            case 23: f = ggml_vec_dot_iq4_xs_q8_K; act = 2; break;
            case 29: f = ggml_vec_dot_iq1_m_q8_K; act = 2; break;
            case 34: f = ggml_vec_dot_tq1_0_q8_K; act = 2; break;
            case 35: f = ggml_vec_dot_tq2_0_q8_K; act = 2; break;
            case 39: f = ggml_vec_dot_mxfp4_q8_0; break;
            default: fprintf(stderr, "type %u\n", ty); return 1;
        }
        float r1, r2;
        f((int)n, &r1, 0, w, 0, a, 0, 1);
        uint8_t * q = malloc(n / 32 * 36 + n / 256 * 292 + 64);
        if (act == 0) quantize_row_q8_0_ref(x, q, n);
        else if (act == 1) quantize_row_q8_1_ref(x, q, n);
        else quantize_row_q8_K_ref(x, q, n);
        f((int)n, &r2, 0, w, 0, q, 0, 1);
        uint32_t b1, b2; memcpy(&b1, &r1, 4); memcpy(&b2, &r2, 4);
        printf("0x%08x 0x%08x\n", b1, b2);
        free(w); free(a); free(x); free(q);
    }
    return 0;
}
