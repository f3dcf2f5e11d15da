/*
 * flint_tt.h: the C ABI between Flint's Tenstorrent backend (`flint-hal-tt`) and a
 * runtime adapter library (`libflint_tt.so`).
 *
 * ABI version 6. 2: `source_type` in `flint_tt_weight_desc`. 3: `flint_tt_rope` takes a
 * `flint_tt_rope_params` (normal or NeoX pairs, frequency scale and factors, YaRN) instead
 * of NeoX scalars, and `flint_tt_add_bias`. 4: buffer_copy (`flint_tt_buffer_copy`,
 * device-side copies between buffer ranges), `flint_tt_route_topk` takes its bias as a
 * buffer, and `flint_tt_counters` counts host-device traffic (buffer writes, reads and
 * copies). 5: index lists (ids, positions, slots, block tables) are read from device
 * buffers of `uint32_t` (a buffer handle and an offset in indices) instead of host
 * arrays, so that the host uploads a step's index lists once and every layer's ops read
 * them on the device. 6: MoE routing stays on the device: `flint_tt_route_topk` writes
 * its expert ids into an index buffer and its weights into a float buffer (each at an
 * offset) instead of host arrays, and takes an optional per-expert output scale
 * (`expert_scale`, Gemma 4); `flint_tt_expert_matmul` reads one expert id per routed row
 * from an index buffer (input row `i / fan-out`) instead of host (input row, expert)
 * pairs; `flint_tt_scatter_add_weighted` reads its weights from a float buffer and adds
 * routed row `i` into accumulator row `i / fan-out` instead of taking host rows and
 * weights; and the per-op parameters that are tensors of the model are read from float
 * buffers: `flint_tt_rope_params.freq_factors` is a buffer handle and an offset
 * (`freq_factors_offset`, in floats) instead of a host pointer, and
 * `flint_tt_paged_attention` takes its sinks as a buffer handle and offset
 * (`sinks_offset`) instead of a host array; and Qwen 3.5's Gated DeltaNet layers run on
 * the device: `flint_tt_ssm_conv_silu` (the short causal convolution, then SiLU) and
 * `flint_tt_gated_delta_net` (the gated delta rule) read and update their recurrent
 * states in place in float buffers named by a handle and an offset (`state_offset`),
 * and `flint_tt_sigmoid`, `flint_tt_mul` (element-wise or one value per row),
 * `flint_tt_deinterleave` (an array of output handles), `flint_tt_delta_net_gate` and
 * `flint_tt_l2_norm` compute the gates, products, splits and norms around them. See
 * README.md next to this file for how the
 * library is found, what a real adapter over TT-Metalium must do, and the simulated
 * adapter (`flint-tt-sim`).
 *
 * Conventions
 * - Every function that can fail returns an `int32_t` status (`FLINT_TT_OK` = 0, else one
 *   of `flint_tt_status`). On failure the adapter stores a message for the calling thread
 *   that `flint_tt_last_error()` returns; the message names what was at fault.
 * - Tensors that ops read and write are device buffers (`flint_tt_buffer`) of row-major
 *   `float` (f32) values; element counts are given explicitly, so an op may be handed a
 *   buffer longer than it needs (it uses the first values). The host keeps activations
 *   in such buffers across ops (ABI 4): data crosses the bus only through
 *   `flint_tt_buffer_write` / `flint_tt_buffer_read`.
 * - Index lists (token ids, positions, slot mappings, block tables; ABI 5) are device
 *   buffers of `uint32_t` values, named by a buffer handle and the list's first index in
 *   it (`*_offset`, counted in indices, not bytes): the host packs a step's lists into
 *   one buffer, writes it once, and every op of every layer reads its list from there.
 *   A buffer holds 4-byte values; whether they are floats or indices is up to the op
 *   that reads them.
 * - Nothing of an MoE layer crosses to the host (ABI 6): `flint_tt_route_topk` writes
 *   the chosen expert ids into an index buffer and their weights into a float buffer,
 *   and `flint_tt_expert_matmul` and `flint_tt_scatter_add_weighted` read them from
 *   there. Routed rows are grouped by token: with `r` input rows and `n` routed rows
 *   (`n` a multiple of `r`, the fan-out `f = n / r`: the `k` experts of each token for
 *   the gate and up projections, 1 for the down projection), routed row `i` belongs to
 *   input row `i / f`. Float buffers that hold routing weights (and, below, RoPE
 *   factors, attention sinks and Gated DeltaNet states) are named, like index lists, by
 *   a handle and an offset (`*_offset`, counted in floats); every other float buffer is
 *   read from its first value. A range an op writes must not overlap a range it only
 *   reads (FLINT_TT_ERR_INVALID); an operand updated in place (`acc`, `residual`, the `x`
 *   of `flint_tt_scale`, a state) is both.
 * - Per-op parameters that are tensors of the model (RoPE frequency factors, attention
 *   sinks; ABI 6) live in float buffers, uploaded once with the weights, and are named by
 *   a handle and an offset in floats (0 handle = none); the op reads them on the device,
 *   range-checks them (FLINT_TT_ERR_INVALID outside the buffer) and they must not overlap
 *   the range the op writes. The RoPE parameters struct itself (scalars and that handle)
 *   is a host struct argument that the call reads before it returns (a real adapter
 *   passes its scalars as kernel runtime arguments).
 * - All calls are synchronous from the caller's point of view: when a call that writes a
 *   buffer returns, a later `flint_tt_buffer_read` of that buffer sees the result (an
 *   adapter may queue work and complete it in `flint_tt_buffer_read` / `flint_tt_sync`).
 * - Calls on one device may come from several threads; the adapter serialises them.
 * - Handles (`flint_tt_buffer`, `flint_tt_weight`) are nonzero; 0 means "none".
 * - Shapes are in GGUF order: a matrix weight `[in, out]` is `out` rows of `in` values.
 */
#ifndef FLINT_TT_H
#define FLINT_TT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The version this header describes. `flint_tt_abi_version()` must return it exactly;
 * the host refuses any other value. */
#define FLINT_TT_ABI_VERSION 6u

/* Status codes. */
typedef enum flint_tt_status {
    FLINT_TT_OK = 0,
    /* An argument the adapter refuses: unknown handle, length that does not match the
     * shapes, aliasing outputs, an index out of range. */
    FLINT_TT_ERR_INVALID = 1,
    /* An encoding or op this adapter does not implement. */
    FLINT_TT_ERR_UNSUPPORTED = 2,
    /* Device DRAM (or host memory) exhausted. */
    FLINT_TT_ERR_OUT_OF_MEMORY = 3,
    /* No device, or the device failed to open. */
    FLINT_TT_ERR_NO_DEVICE = 4,
    /* The runtime failed while executing. */
    FLINT_TT_ERR_RUNTIME = 5
} flint_tt_status;

/* GGML type ids as GGUF stores them (only those with a meaning in this ABI). */
#define FLINT_TT_TYPE_Q8_0 8u
#define FLINT_TT_TYPE_Q5_0 6u
#define FLINT_TT_TYPE_Q4_K 12u
#define FLINT_TT_TYPE_Q5_K 13u
#define FLINT_TT_TYPE_Q6_K 14u
/* 17-byte blocks of 32 values: an E8M0 exponent byte, then 16 bytes of E2M1 nibbles
 * (gpt-oss's experts). An adapter that admits it computes, per output, one f32
 * accumulator and per block `acc = fma(S, D(e) * d_a, acc)` against Q8_0 activations
 * (S the block's exact integer sum, D(e) = 2^(e - 128) against the doubled code book):
 * ggml's repacked x86 order, which the cpu backend follows bit for bit. */
#define FLINT_TT_TYPE_MXFP4 39u
#define FLINT_TT_TYPE_BF16 30u
#define FLINT_TT_TYPE_F32 0u
#define FLINT_TT_TYPE_F16 1u

typedef struct flint_tt_device flint_tt_device; /* opaque */
typedef uint64_t flint_tt_buffer;
typedef uint64_t flint_tt_weight;

/* ---- Version and errors ---------------------------------------------------------- */

/* The ABI version the library implements. Must be callable before anything else. */
uint32_t flint_tt_abi_version(void);

/* The message of the last failed call on this thread (UTF-8, NUL-terminated), or "" when
 * none. The pointer stays valid until the next call into the library on this thread. */
const char *flint_tt_last_error(void);

/* ---- Devices --------------------------------------------------------------------- */

typedef struct flint_tt_device_info {
    /* NUL-terminated human-readable name, for example "Blackhole P150 (simulated)". */
    char name[64];
    /* Device DRAM the host may plan against, in bytes (weights, buffers, KV). */
    uint64_t dram_bytes;
    /* Tensix cores available to this process (informational). */
    uint32_t compute_cores;
    uint32_t reserved;
} flint_tt_device_info;

/* Opens device `index` (0 = the first). Fails with FLINT_TT_ERR_NO_DEVICE when there is no
 * such device or it cannot be opened. */
int32_t flint_tt_device_open(uint32_t index, flint_tt_device **out);

/* Closes the device and frees everything still allocated on it. `dev` may be NULL. */
int32_t flint_tt_device_close(flint_tt_device *dev);

/* Fills `out` with the device's properties. */
int32_t flint_tt_device_info_get(const flint_tt_device *dev, flint_tt_device_info *out);

/* 1 when the device computes directly from weights kept in the block encoding
 * `ggml_type` (raw GGUF blocks), 0 otherwise. The expanded float encodings (BF16, and
 * F16 / F32) are always accepted by `flint_tt_weight_stage`; the answer for them is not
 * used. */
int32_t flint_tt_admits_kept(const flint_tt_device *dev, uint32_t ggml_type);

/* ---- Buffers --------------------------------------------------------------------- */

/* Allocates `bytes` of device DRAM (contents zero). Counts against `dram_bytes`;
 * FLINT_TT_ERR_OUT_OF_MEMORY when it does not fit. */
int32_t flint_tt_buffer_alloc(flint_tt_device *dev, uint64_t bytes, flint_tt_buffer *out);
int32_t flint_tt_buffer_free(flint_tt_device *dev, flint_tt_buffer buf);
/* Copies `len` bytes from host `src` to the buffer at byte `offset`. */
int32_t flint_tt_buffer_write(flint_tt_device *dev, flint_tt_buffer buf, uint64_t offset,
                              const void *src, uint64_t len);
/* Copies `len` bytes at byte `offset` of the buffer to host `dst`. */
int32_t flint_tt_buffer_read(flint_tt_device *dev, flint_tt_buffer buf, uint64_t offset,
                             void *dst, uint64_t len);
/* Copies `bytes` bytes on the device, from buffer `src` at byte `src_offset` to buffer
 * `dst` at byte `dst_offset` (ABI 4): nothing crosses the bus. The host uses it for views
 * that start inside a tensor (into a scratch buffer, and back for outputs). Both ranges
 * must lie inside their buffers, and two ranges of one buffer must not overlap: else
 * FLINT_TT_ERR_INVALID. `bytes` = 0 does nothing. */
int32_t flint_tt_buffer_copy(flint_tt_device *dev, flint_tt_buffer src, uint64_t src_offset,
                             flint_tt_buffer dst, uint64_t dst_offset, uint64_t bytes);

/* ---- Weights --------------------------------------------------------------------- */

/* Where a staged weight lives. */
#define FLINT_TT_RESIDENT 0u /* copied into device DRAM once */
#define FLINT_TT_STREAMED 1u /* read from host memory on every use */

typedef struct flint_tt_weight_desc {
    /* Encoding of `data`: a type for which `flint_tt_admits_kept` is 1 (raw GGUF blocks,
     * kept as they are), or a float encoding the host expanded to: FLINT_TT_TYPE_BF16,
     * FLINT_TT_TYPE_F16 or FLINT_TT_TYPE_F32 (little-endian values). With keep-quant on,
     * the host expands without loss (F32 for block encodings, small F32/F16 tensors as
     * they are); the BF16 arm sends BF16. */
    uint32_t ggml_type;
    /* FLINT_TT_RESIDENT or FLINT_TT_STREAMED. */
    uint32_t residency;
    /* Row length (`in`, contiguous) and number of rows (`out`). One matrix; the host
     * stages an expert tower `[in, out, E]` as E such matrices. */
    uint64_t in_features;
    uint64_t out_features;
    /* The bytes: `out_features` rows of `row_bytes(ggml_type, in_features)` each. */
    const uint8_t *data;
    uint64_t len;
    /* The encoding of the tensor in the GGUF file, before the host expanded it (ABI 2).
     * Equal to `ggml_type` for kept blocks and for floats staged as they are. For a
     * weight expanded without loss (block encoding -> F32, the keep-quant arm) the
     * adapter computes what the source blocks compute: activations rounded as ggml pairs
     * them with `source_type` (Q8_0 for the legacy block types and MXFP4, Q8_K for the
     * K-quants) before the product, so that an expansion changes where the weight lives
     * and how many bytes it takes, not the matmul's result. For BF16/F16 expansions the
     * weight is already rounded and activations stay f32. */
    uint32_t source_type;
    uint32_t reserved; /* 0 */
} flint_tt_weight_desc;

/* Stages one weight matrix. RESIDENT: the adapter copies `data` into DRAM before it
 * returns (FLINT_TT_ERR_OUT_OF_MEMORY when it does not fit). STREAMED: the adapter keeps
 * the pointer and reads `data` from host memory on each use; the host keeps it valid and
 * unchanged until `flint_tt_weight_free`. FLINT_TT_ERR_INVALID when `len` does not match
 * type and shape, FLINT_TT_ERR_UNSUPPORTED when the encoding is neither admitted nor one
 * of the float encodings. */
int32_t flint_tt_weight_stage(flint_tt_device *dev, const flint_tt_weight_desc *desc,
                              flint_tt_weight *out);
int32_t flint_tt_weight_free(flint_tt_device *dev, flint_tt_weight w);

/* ---- Matmuls --------------------------------------------------------------------- */

/* out[i][o] = sum_k W[o][k] * x[i][k]; x = [m, in] floats, out = [m, out] floats. */
int32_t flint_tt_matmul(flint_tt_device *dev, flint_tt_weight w, flint_tt_buffer x, uint64_t m,
                        flint_tt_buffer out);

/* Grouped expert matmul (ABI 6). `experts` = the n_experts per-expert weights of one
 * tower (all of one shape; the handle array is read before the call returns).
 * x = [x_rows, in], out = [n_rows, out]; the n_rows expert ids are read from index
 * buffer `ids` from index `ids_offset` (as `flint_tt_route_topk` writes them):
 *   out[i] = W[ids[i]] x[i / (n_rows / x_rows)].
 * n_rows must be a multiple of x_rows (x_rows = 0 only with n_rows = 0), else
 * FLINT_TT_ERR_INVALID; an id >= n_experts is FLINT_TT_ERR_INVALID (nothing written).
 * Each expert's weight should be read once for all its rows. */
int32_t flint_tt_expert_matmul(flint_tt_device *dev, const flint_tt_weight *experts,
                               uint32_t n_experts, flint_tt_buffer x, uint64_t x_rows,
                               flint_tt_buffer ids, uint64_t ids_offset, uint64_t n_rows,
                               flint_tt_buffer out);

/* Embedding gather: out[i] = dequant(row ids[i] of W), out = [n, in], with the n ids
 * read from index buffer `ids` from index `ids_offset` (ABI 5). An id >= out_features
 * is FLINT_TT_ERR_INVALID. */
int32_t flint_tt_get_rows(flint_tt_device *dev, flint_tt_weight w, flint_tt_buffer ids,
                          uint64_t ids_offset, uint64_t n, flint_tt_buffer out);

/* ---- Element-wise and normalisation ops (n = element count) ---------------------- */

/* out = x / sqrt(mean(x^2) + eps) * weight per row of `dim`; weight = 0: no weight. */
int32_t flint_tt_rms_norm(flint_tt_device *dev, flint_tt_buffer x, uint64_t n,
                          flint_tt_buffer weight, float eps, uint64_t dim, flint_tt_buffer out);
/* residual += delta; out = rmsnorm(residual) * weight (per row of `dim`). */
int32_t flint_tt_add_rms_norm(flint_tt_device *dev, flint_tt_buffer residual,
                              flint_tt_buffer delta, uint64_t n, flint_tt_buffer weight,
                              float eps, uint64_t dim, flint_tt_buffer out);
/* Pairing of flint_tt_rope_params.kind. */
#define FLINT_TT_ROPE_NORMAL 0u /* pairs (2i, 2i+1): Llama, gpt-oss (ggml's NORMAL) */
#define FLINT_TT_ROPE_NEOX 1u   /* pairs (i, i + n_rot/2): Gemma, Qwen, Flint (ggml's NEOX) */

/* RoPE parameters (ABI 3), as ggml's `rope_ext` takes them. For pair i < n_rot/2 of a
 * head at position p:
 *   theta_extrap = p * base^(-2i/n_rot) / freq_factors[i]   (factor 1 when none)
 *   theta_interp = freq_scale * theta_extrap
 *   theta = theta_interp, or with ext_factor != 0 (YaRN):
 *     r = ramp(i) * ext_factor, theta = theta_interp * (1 - r) + theta_extrap * r,
 *     ramp(i) = 1 - clamp((i - low) / max(0.001, high - low), 0, 1), where
 *     low/high = floor/ceil of n_rot * ln(n_ctx_orig / (beta * 2 pi)) / (2 ln base) for
 *     beta = beta_fast / beta_slow, clamped to [0, n_rot - 1];
 *   mscale = attn_factor, times 1 + 0.1 ln(1 / freq_scale) when ext_factor != 0;
 *   x0' = x0 cos(theta) mscale - x1 sin(theta) mscale,
 *   x1' = x0 sin(theta) mscale + x1 cos(theta) mscale,
 * with (x0, x1) paired as `kind` says; dims >= n_rot pass through. No YaRN is
 * ext_factor = 0 and attn_factor = 1. The reference, with every float operation in
 * ggml's order, is `flint_core::math::rope`. n_rot is even and at most head_dim; base,
 * freq_scale and the factors are finite and positive (else FLINT_TT_ERR_INVALID; the
 * adapter checks the factors it reads from their buffer). */
typedef struct flint_tt_rope_params {
    uint32_t n_heads;
    uint32_t head_dim;
    uint32_t n_rot;
    uint32_t kind;              /* FLINT_TT_ROPE_NORMAL or FLINT_TT_ROPE_NEOX */
    float base;
    float freq_scale;           /* 1, or 1 / factor for linear and YaRN scaling */
    flint_tt_buffer freq_factors;  /* 0, or a float buffer holding n_rot / 2 per-pair
                                      divisors of the angle (ABI 6; a host pointer
                                      before) */
    uint64_t freq_factors_offset;  /* the first factor in it, counted in floats */
    float ext_factor;           /* YaRN extrapolation mix; 0: none */
    float attn_factor;          /* magnitude of cos and sin; 1: none */
    float beta_fast;
    float beta_slow;
    uint32_t n_ctx_orig;        /* the context length the model was trained with */
    uint32_t reserved;          /* 0 */
} flint_tt_rope_params;

/* RoPE in place on x = [rows, n_heads * head_dim]; row i at positions[i], the `rows`
 * positions read from index buffer `positions` from index `positions_offset` (ABI 5).
 * `params` is read before the call returns; its factors (ABI 6) are read from their
 * buffer on the device: the n_rot / 2 floats from `freq_factors_offset` lie inside it and
 * outside x's range, else FLINT_TT_ERR_INVALID, as is a factor that is not finite and
 * positive (nothing written). */
int32_t flint_tt_rope(flint_tt_device *dev, flint_tt_buffer x, uint64_t rows,
                      flint_tt_buffer positions, uint64_t positions_offset,
                      const flint_tt_rope_params *params);
/* out = silu(gate) * up. */
int32_t flint_tt_silu_mul(flint_tt_device *dev, flint_tt_buffer gate, flint_tt_buffer up,
                          uint64_t n, flint_tt_buffer out);
/* out = gelu_tanh(gate) * up. */
int32_t flint_tt_gelu_mul(flint_tt_device *dev, flint_tt_buffer gate, flint_tt_buffer up,
                          uint64_t n, flint_tt_buffer out);
/* acc += x. */
int32_t flint_tt_add(flint_tt_device *dev, flint_tt_buffer acc, flint_tt_buffer x, uint64_t n);
/* x[r * bias_len + j] += bias[j] for every row r of x (n values): a projection's bias
 * (ABI 3). FLINT_TT_ERR_INVALID when bias_len is 0 or does not divide n. */
int32_t flint_tt_add_bias(flint_tt_device *dev, flint_tt_buffer x, uint64_t n,
                          flint_tt_buffer bias, uint64_t bias_len);
/* x *= s. */
int32_t flint_tt_scale(flint_tt_device *dev, flint_tt_buffer x, uint64_t n, float s);
/* MoE combine (ABI 6): acc = [acc_rows, dim], x = [n, dim], the n weights read from float
 * buffer `weights` from float `weights_offset`;
 *   acc[i / (n / acc_rows)] += weights[i] * x[i]   (one f32 product, one f32 add)
 * for i = 0, 1, ..., n - 1 in this order. n must be a multiple of acc_rows (acc_rows = 0
 * only with n = 0), else FLINT_TT_ERR_INVALID. */
int32_t flint_tt_scatter_add_weighted(flint_tt_device *dev, flint_tt_buffer acc,
                                      uint64_t acc_rows, flint_tt_buffer x,
                                      flint_tt_buffer weights, uint64_t weights_offset,
                                      uint64_t n, uint64_t dim);

/* Gating of flint_tt_route_topk. */
#define FLINT_TT_GATING_SOFTMAX 0u
#define FLINT_TT_GATING_SIGMOID 1u
/* gpt-oss: the experts chosen on the raw logits, their weights the softmax over the
 * chosen logits alone. A runtime that does not know it answers FLINT_TT_ERR_INVALID. */
#define FLINT_TT_GATING_SOFTMAX_WEIGHT 2u

/* Top-k routing of n_rows rows of n_experts logits: score = gate(logits); the k experts
 * with the largest score + bias (bias: a buffer of n_experts floats, 0 = none; ABI 4, a
 * host pointer before) win, ties to the lower index, in descending order; their weights
 * are the scores (without bias), renormalised to sum 1 when `normalize`, times `scale`;
 * then, with `expert_scale` (a buffer of n_experts floats, 0 = none; ABI 6: Gemma 4's
 * per-expert output scale), each weight times its expert's value (`w *= s[id]`, one f32
 * product). 0 < k <= n_experts, else FLINT_TT_ERR_INVALID.
 * Results (ABI 6) stay on the device: the n_rows * k ids (row r's at r * k, in the order
 * above) go to index buffer `ids` from index `ids_offset`, the weights to float buffer
 * `weights` from float `weights_offset`; nothing is read back. Both ranges lie inside
 * their buffers and overlap neither each other nor the inputs, else
 * FLINT_TT_ERR_INVALID. */
int32_t flint_tt_route_topk(flint_tt_device *dev, flint_tt_buffer logits, uint64_t n_rows,
                            uint32_t n_experts, flint_tt_buffer bias,
                            flint_tt_buffer expert_scale, uint32_t k, uint32_t gating,
                            uint32_t normalize, float scale, flint_tt_buffer ids,
                            uint64_t ids_offset, flint_tt_buffer weights,
                            uint64_t weights_offset);

/* ---- Gated DeltaNet (Qwen 3.5's linear-attention layers; ABI 6) ------------------- */

/* The ops of a Gated DeltaNet layer and of Qwen 3.5's gated attention and shared expert
 * gate. Float buffers are named by handle and read from their first value, as elsewhere;
 * the recurrent states (the convolution window, the delta rule's per-head matrices) are
 * device buffers named by a handle and an offset in floats (`state_offset`), read and
 * updated in place on the device (one state per sequence, the host keeping many in one
 * buffer). A state range lies inside its buffer and overlaps no other range of the call,
 * else FLINT_TT_ERR_INVALID. Shapes that do not fit (counts that are not whole rows, a
 * zero size where the op divides by it) are FLINT_TT_ERR_INVALID with nothing written.
 * The references, every float operation in their order, are the `flint_core::math`
 * functions named. */

/* x = sigmoid(x) for the n values of x (`sigmoid_ggml_in_place`: 1 / (1 + expf(-x)) with
 * glibc's expf). */
int32_t flint_tt_sigmoid(flint_tt_device *dev, flint_tt_buffer x, uint64_t n);

/* acc[i] *= x[i / (n / x_len)] for i < n (`mul_rows`): x as long as acc (x_len = n), or
 * one value per row of acc (x_len rows). n = 0 does nothing; otherwise x_len is non-zero
 * and divides n, else FLINT_TT_ERR_INVALID. */
int32_t flint_tt_mul(flint_tt_device *dev, flint_tt_buffer acc, uint64_t n, flint_tt_buffer x,
                     uint64_t x_len);

/* Splits src (n values: groups of n_outs chunks of `chunk` values) by chunk
 * (`deinterleave`): chunk j of group g goes to outs[j] from value g * chunk; each output
 * receives n / n_outs values. `outs` is an array of n_outs buffer handles, read before
 * the call returns (one call for all parts, so that src is read once). chunk and n_outs
 * are non-zero, n a multiple of chunk * n_outs, the outputs distinct from each other and
 * from src, else FLINT_TT_ERR_INVALID. */
int32_t flint_tt_deinterleave(flint_tt_device *dev, flint_tt_buffer src, uint64_t n,
                              uint64_t chunk, const flint_tt_buffer *outs, uint32_t n_outs);

/* The log decay of each row of `heads` values of alpha (n values), in place
 * (`delta_net_gates`): alpha[r][h] = softplus(alpha[r][h] + dt_bias[h]) * a[h], with
 * softplus(x) = x > 20 ? x : logf(1 + expf(x)). dt_bias and a hold `heads` values each;
 * heads is non-zero and divides n, else FLINT_TT_ERR_INVALID. */
int32_t flint_tt_delta_net_gate(flint_tt_device *dev, flint_tt_buffer alpha, uint64_t n,
                                flint_tt_buffer dt_bias, flint_tt_buffer a, uint64_t heads);

/* L2 norm in place of every row of `dim` values of x (n values), as llama.cpp normalises
 * Gated DeltaNet's q and k heads (`l2_norm_heads`): rmsnorm with eps / dim, then times
 * 1 / sqrtf(dim). dim is non-zero and divides n, else FLINT_TT_ERR_INVALID. */
int32_t flint_tt_l2_norm(flint_tt_device *dev, flint_tt_buffer x, uint64_t n, uint64_t dim,
                         float eps);

/* The short causal depthwise convolution of one sequence, then SiLU on every output
 * (`ssm_conv`, then `silu`): x = [n_rows, channels], weight = [channels, d_conv] (GGUF
 * `ssm_conv1d`), out = [n_rows, channels]; the state is channels rows of d_conv - 1
 * floats (the previous inputs of each channel, oldest first; zeros for a new sequence)
 * in buffer `state` from float `state_offset`, updated in place to the last d_conv - 1
 * inputs. Output t of channel c is silu(sum_{i < d_conv} u[t + i] * w[c][i]) over the
 * window u = state ++ x[.., c], summed from i = 0 in f32 (no fused multiply-add), and
 * silu(s) = s / (1 + exp(-s)) with ggml's AVX-512 exp (`silu`, as `flint_tt_silu_mul`).
 * d_conv = 0 is FLINT_TT_ERR_INVALID; out must not be x, the weight or the state. */
int32_t flint_tt_ssm_conv_silu(flint_tt_device *dev, flint_tt_buffer x, uint64_t n_rows,
                               uint64_t channels, flint_tt_buffer weight, uint64_t d_conv,
                               flint_tt_buffer state, uint64_t state_offset,
                               flint_tt_buffer out);

/* The gated delta rule of one sequence over its n_tokens tokens (`gated_delta_net`, the
 * recurrent form, token by token): q, k = [n_tokens, heads_k * head_dim] (L2-normalised
 * per head), v and out = [n_tokens, heads_v * head_dim], g (log decay) and beta =
 * [n_tokens, heads_v]; value head h reads key head h % heads_k. The state is heads_v
 * blocks of head_dim * head_dim floats (block h: state[h][j][i] = S_h[i][j]; zeros for a
 * new sequence) in buffer `state` from float `state_offset`, updated in place. Per token
 * and value head: S <- expf(g) S; delta = beta (v - S^T k); S <- S + k delta^T (a fused
 * multiply-add per element); o = (S^T q) * (1 / sqrtf(head_dim)), each dot product in
 * ggml's AVX2 `ggml_vec_dot_f32` order. heads_k, heads_v and head_dim non-zero and
 * heads_v a multiple of heads_k, else FLINT_TT_ERR_INVALID; out must not be an input or
 * the state. */
int32_t flint_tt_gated_delta_net(flint_tt_device *dev, uint64_t heads_k, uint64_t heads_v,
                                 uint64_t head_dim, uint64_t n_tokens, flint_tt_buffer q,
                                 flint_tt_buffer k, flint_tt_buffer v, flint_tt_buffer g,
                                 flint_tt_buffer beta, flint_tt_buffer state,
                                 uint64_t state_offset, flint_tt_buffer out);

/* ---- KV cache and attention ------------------------------------------------------ */

/* One layer's paged KV cache: `num_blocks * block_size` slots. The host allocates two
 * buffers: K = [slots, n_kv_heads, head_dim_k] and V = [slots, n_kv_heads, head_dim_v]
 * floats. */
typedef struct flint_tt_kv_layout {
    uint64_t num_blocks;
    uint64_t block_size;
    uint64_t n_kv_heads;
    uint64_t head_dim_k;
    uint64_t head_dim_v;
} flint_tt_kv_layout;

/* Writes n tokens: k = [n, n_kv_heads * head_dim_k], v = [n, n_kv_heads * head_dim_v];
 * token i goes to slot slots[i], the n slots read from index buffer `slots` from index
 * `slots_offset` (ABI 5); a slot outside the cache is FLINT_TT_ERR_INVALID. Keys and values may be kept at fp16 precision (rounded
 * to nearest even), as the CPU backend and llama.cpp's default K and V caches keep them;
 * the simulated adapter does so. */
int32_t flint_tt_write_kv(flint_tt_device *dev, const flint_tt_kv_layout *layout,
                          flint_tt_buffer k_cache, flint_tt_buffer v_cache, flint_tt_buffer k,
                          flint_tt_buffer v, flint_tt_buffer slots, uint64_t slots_offset,
                          uint64_t n);

/* One sequence of a paged attention call. Its lists live in index buffers (ABI 5). */
typedef struct flint_tt_attn_seq {
    uint64_t q_start;              /* first query row of this sequence */
    flint_tt_buffer positions;     /* n_positions positions of its query rows, */
    uint64_t positions_offset;     /*   from this index of that buffer */
    uint64_t n_positions;
    flint_tt_buffer block_table;   /* position j lives in slot
                                      block_table[j / block_size] * block_size + j % block_size;
                                      0xFFFFFFFF = no block (never read); */
    uint64_t block_table_offset;   /*   from this index of that buffer */
    uint64_t n_blocks;
} flint_tt_attn_seq;

/* Paged attention over many sequences (one layer). q = [q_rows, n_heads * head_dim_k];
 * out = [q_rows, n_heads * head_dim_v]. Query head h reads KV head h / (n_heads /
 * n_kv_heads). A query at position p attends to keys j <= p (and j > p - window when
 * window > 0), scores (q . k) * scale, softmax with the per-head sink logit sinks[h]
 * taking part in the denominator only. The n_heads sink logits (ABI 6) are read from
 * float buffer `sinks` from float `sinks_offset` (0 handle = no sinks); that range lies
 * inside the buffer and outside out's range, else FLINT_TT_ERR_INVALID. The `seqs` array
 * is read before the call returns. */
int32_t flint_tt_paged_attention(flint_tt_device *dev, const flint_tt_kv_layout *layout,
                                 flint_tt_buffer k_cache, flint_tt_buffer v_cache,
                                 flint_tt_buffer q, uint64_t q_rows,
                                 const flint_tt_attn_seq *seqs, uint64_t n_seqs,
                                 uint32_t n_heads, float scale, flint_tt_buffer sinks,
                                 uint64_t sinks_offset, uint64_t window,
                                 flint_tt_buffer out);

/* ---- Sync and counters ----------------------------------------------------------- */

/* Waits until every queued operation on the device has completed. */
int32_t flint_tt_sync(flint_tt_device *dev);

typedef struct flint_tt_counters {
    /* Matmuls (dense or expert) computed directly from kept block encodings. */
    uint64_t block_dispatches;
    /* Matmuls computed from float (BF16 / F16 / F32) weights. */
    uint64_t float_dispatches;
    /* Weight bytes read from host memory for STREAMED weights, summed over uses. */
    uint64_t streamed_bytes;
    /* Device DRAM in use now (resident weights and buffers). */
    uint64_t dram_used_bytes;
    /* ABI 4: host-device traffic. `flint_tt_buffer_write` calls and the bytes they moved
     * from host to device; */
    uint64_t host_writes;
    uint64_t host_write_bytes;
    /* `flint_tt_buffer_read` calls and the bytes they moved from device to host; */
    uint64_t host_reads;
    uint64_t host_read_bytes;
    /* `flint_tt_buffer_copy` calls and the bytes they copied on the device. */
    uint64_t device_copies;
    uint64_t device_copy_bytes;
} flint_tt_counters;

/* Counters since the device was opened. */
int32_t flint_tt_counters_get(const flint_tt_device *dev, flint_tt_counters *out);

#ifdef __cplusplus
}
#endif

#endif /* FLINT_TT_H */
