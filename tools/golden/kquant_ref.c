/* Runs ggml's reference quantizers for the K-quants and the activation formats
 * (quantize_row_q{4,5,6}_K_ref, quantize_row_q8_K_ref, quantize_row_q8_1_ref from
 * ggml/src/ggml-quants.c) on f32 values read from stdin and writes the blocks to
 * stdout. Built and run by make_vectors.py when a llama.cpp checkout is available.
 *
 * usage: kquant_ref <n_values> <4|5|6|8|1>  < values.f32  > blocks.bin
 *        (8 is Q8_K, 1 is Q8_1)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

void quantize_row_q4_K_ref(const float *x, void *y, int64_t k);
void quantize_row_q5_K_ref(const float *x, void *y, int64_t k);
void quantize_row_q6_K_ref(const float *x, void *y, int64_t k);
void quantize_row_q8_K_ref(const float *x, void *y, int64_t k);
void quantize_row_q8_1_ref(const float *x, void *y, int64_t k);

/* ggml-quants.c refers to these for error paths and row sizes the reference
 * quantizers never reach. */
void ggml_abort(const char *file, int line, const char *fmt, ...) { (void)file; (void)line; (void)fmt; abort(); }
size_t ggml_row_size(int type, int64_t ne) { (void)type; (void)ne; abort(); }
const char *ggml_type_name(int type) { (void)type; return "?"; }
size_t ggml_type_size(int type) { (void)type; abort(); }

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    long n = atol(argv[1]);
    if (n <= 0 || n % 256 != 0) return 2;
    float *x = malloc((size_t)n * sizeof(float));
    unsigned char *y = calloc((size_t)n, 2); /* at most 292 bytes per 256 values */
    if (!x || !y || fread(x, sizeof(float), (size_t)n, stdin) != (size_t)n) return 1;
    size_t block_bytes, block_values = 256;
    switch (argv[2][0]) {
    case '4': quantize_row_q4_K_ref(x, y, n); block_bytes = 144; break;
    case '5': quantize_row_q5_K_ref(x, y, n); block_bytes = 176; break;
    case '6': quantize_row_q6_K_ref(x, y, n); block_bytes = 210; break;
    case '8': quantize_row_q8_K_ref(x, y, n); block_bytes = 292; break;
    case '1': quantize_row_q8_1_ref(x, y, n); block_bytes = 36; block_values = 32; break;
    default: return 2;
    }
    fwrite(y, 1, (size_t)(n / block_values) * block_bytes, stdout);
    return 0;
}
