//! Dot-product kernels on GGUF blocks, one folder per block format, and their run-time
//! dispatch.
//!
//! | weight | activation | AVX-512 VNNI | AVX-512 (F+BW) | AVX2 | scalar |
//! |--------|------------|--------------|----------------|------|--------|
//! | Q4_K   | Q8_K       | yes          | yes            | yes  | core   |
//! | Q6_K   | Q8_K       | yes          | yes            | yes  | core   |
//! | Q5_K   | Q8_K       | yes          | yes            | yes  | core   |
//! | Q8_0   | Q8_0       | yes (1-15 rows, gemm; tiles: AVX-512) | yes | yes | core |
//! | Q5_0   | Q8_0       | yes          | yes            | yes  | core   |
//! | Q4_0   | Q8_0       | yes (1-15 rows, gemm; tiles: AVX-512) | yes | yes | core |
//! | MXFP4  | Q8_0       | yes          | yes            | yes  | core (llama.cpp's order) |
//! | IQ4_NL | Q8_0       | matvec (tiles: AVX2) | (AVX2)  | yes  | core   |
//! | IQ4_XS, Q3_K, Q2_K | Q8_K | matvec (tiles: AVX2) | (AVX2) | yes | core |
//! | F32/F16/BF16 | f32  | (AVX2)       | (AVX2)         | FMA  | loop   |
//! | others | vec_dot_type | core       | core           | core | core   |
//!
//! "core" is `flint_core::dot::vec_dot` (`core/src/dot/`), the scalar reference.
//!
//! Where things live (each format folder: one file per ISA level, `x16.rs` for its
//! layout repacked at staging, `panel.rs` for its prompt-batch panels):
//!
//! - `q4_k/`: Q4_K · Q8_K. `avx2.rs` (llama.cpp's order, also the AVX-512 F/BW level's:
//!   `dot_q4k`, one weight row against a tile of activation rows; the decode forms
//!   `dot_q4k_rows4` and `dot_q4k_rows4_m`, four weight rows against one to four
//!   activation rows arranged as `Q8KPairs`), `vnni.rs` (llama.cpp's order: `dot_q4k_gemm`; the decode forms `dot_q4k_rows4`,
//!   four rows in the lanes of a vector, and `dot_q4k_rows`; `dot_q4k_rows4_m`, four
//!   weight rows against up to four activation rows, a small batch's), `panel.rs` (the
//!   prompt-batch tile `q4k_tile`, sixteen rows in the lanes), `x16.rs` (the repacked
//!   layout and its decode kernel `dot_group`).
//! - `q5_k/`: Q5_K · Q8_K, `avx2.rs`, `vnni.rs`, and `panel_avx2.rs` (its part of
//!   `kq_panel_avx2.rs`'s prompt-batch panels, every level; a `vpdpbusd` tile on
//!   AVX-512 VNNI).
//! - `q6_k/`: Q6_K · Q8_K, as `q4_k/` (`avx2.rs` at the AVX2 and AVX-512 F/BW levels:
//!   `dot_q6k`, the decode form `dot_q6k_rows4`; `vnni.rs`: `dot_q6k_tiled`,
//!   `dot_q6k_rows4`, `dot_q6k_rows4_m`).
//! - `q0/`: the legacy 32-quant blocks Q8_0, Q5_0 and Q4_0 · Q8_0, which share their
//!   kernels: `tinyblas.rs` (llama.cpp's tinyBLAS order, every level), `avx2.rs`,
//!   `avx512.rs`, `vnni.rs` (a decode's matvec `q0_rows`), `panel.rs` (a prompt batch's
//!   `q0_gemm` with VNNI), `panel_avx2.rs` (the same without VNNI, `q0_gemm8`), `x16.rs`
//!   (Q8_0 and Q5_0 repacked).
//! - `mxfp4/`: MXFP4 · Q8_0 (gpt-oss's experts), every level and the scalar fallback.
//! - `iq4_nl/`: IQ4_NL · Q8_0; `iq4_xs/`, `q3_k/`, `q2_k/`: IQ4_XS, Q3_K and Q2_K · Q8_K
//!   (the low-bit mixes' expert types): `avx2.rs` each (one weight row against a tile
//!   of activation rows, every level; the AVX2 level's decode matvec, four weight rows
//!   against one activation row), `vnni.rs` (the same matvec on AVX-512 VNNI; IQ4_NL's
//!   also in a form with VBMI byte permutes, `dot_iq4nl_rows4_vbmi`, and Q3_K's with
//!   VBMI byte permutes and GFNI bit moves, `dot_q3k_rows4_vbmi`, where the CPU has
//!   them) and, for the three Q8_K types, `panel_avx2.rs` (their part of
//!   `kq_panel_avx2.rs`'s prompt-batch panels, every level; Q3_K's activation arranged
//!   once per gemm, `Q3KAct`), all in the scalar reference's order bit for bit
//!   (`order_check.rs`: their test helpers). The decode matvecs of Q3_K (both levels)
//!   and Q2_K (AVX2) take the activation row arranged once per chunk of rows
//!   (`q3_k::vnni::Q8KRunPairs`, `q3_k::avx2::Q8KLanes`, `q2_k::avx2::Q8KWords`).
//! - `float/`: F32, F16 and BF16 · f32 (`FloatKind`; `avx2.rs`).
//! - `act_quant/`: the activations quantized per call (`Acts`; AVX-512 quantizers).
//! - `amx/`: AMX tiles (`FLINT_CPU_AMX=1`): whether this process can run them
//!   (`available`) and Q8_0 / Q5_0 · Q8_0 in llama.cpp's AMX order on the file's layout
//!   (`WeightRows::Q8_0Amx` / `Q5_0Amx`): on the tiles from five activation rows
//!   (`q8_0.rs`), on AVX-512 VNNI below (`rows.rs`). Where the process cannot run the
//!   tiles the same order runs on AVX-512 VNNI for every number of rows: the panels of
//!   `q0/panel.rs` (`AmxOrder`) and, on 16-row groups (`WeightRows::Q8_0x16Amx` /
//!   `Q5_0x16Amx`), `q0::x16::dot_group_amx` for up to four rows. Q4_K / Q6_K in
//!   llama.cpp's AMX order for them (`WeightRows::Q4KAmx` / `Q6KAmx`) run the VNNI
//!   kernels of `q4_k/`, `q6_k/` and `kq_panel.rs` with that order's float steps.
//! - `attention/`: paged attention with AVX-512 and AVX2, bit for bit the scalar path
//!   (`crate::kv`); `mod.rs` holds the lane groups both use.
//! - `elementwise/`: SiLU, GELU, RoPE rotation and f16 conversions with AVX2/AVX-512.
//! - `dispatch.rs`: which kernel runs for a type, a level and a number of rows, and the
//!   drivers that split a matmul into panels and tiles.
//! - `kq_panel.rs`: the prompt-batch panels and gemm shared by Q4_K and Q6_K on
//!   AVX-512 VNNI, `kq_panel_avx2.rs` their eight-row counterpart without VNNI (the AVX2
//!   and AVX-512 F levels; each format's part in `q4_k/`, `q6_k/` `panel_avx2.rs`);
//!   `panel.rs`: what those and `q0/panel.rs` share.
//! - `x16.rs`: what every repacked layout shares (`x16_check.rs`: its test helpers).
//! - `x86/`: SIMD helpers shared by several formats (`avx2.rs`, `avx512.rs`).
//!
//! Q8_0, Q5_0 and Q4_0 sum in llama.cpp's tinyBLAS order at every level
//! (`q0/tinyblas.rs`); Q4_K and Q6_K in llama.cpp's orders at the VNNI level
//! (`q4_k/vnni.rs` says why), in Flint's own below it (docs/parity.md); IQ4_NL, IQ4_XS,
//! Q3_K and Q2_K in ggml's generic order (the scalar reference's) at every level.

pub(crate) mod act_quant;
pub mod amx;
#[cfg(target_arch = "x86_64")]
pub(crate) mod attention;
mod dispatch;
#[cfg(target_arch = "x86_64")]
pub(crate) mod elementwise;
pub(crate) mod float;
pub(crate) mod iq4_nl;
pub(crate) mod iq4_xs;
#[cfg(target_arch = "x86_64")]
pub(crate) mod kq_panel;
#[cfg(target_arch = "x86_64")]
pub(crate) mod kq_panel_avx2;
pub(crate) mod mxfp4;
#[cfg(test)]
mod order_check;
#[cfg(target_arch = "x86_64")]
pub(crate) mod panel;
pub(crate) mod q0;
pub(crate) mod q2_k;
pub(crate) mod q3_k;
pub(crate) mod q4_k;
pub(crate) mod q5_k;
pub(crate) mod q6_k;
pub(crate) mod x16;
#[cfg(test)]
mod x16_check;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

pub(crate) use act_quant::Acts;
#[cfg(target_arch = "x86_64")]
pub(crate) use dispatch::{amx_kq_matmul, amx_matmul, amx_x16_matmul, q0_glu_gemm, GLU_MIN_ROWS};
pub(crate) use dispatch::{
    core_vec_dot, dot_rows, expert_gemv, expert_panel_rows, expert_panels_apply, expert_rows_gemv,
    gemm, has_small_batch_kernel, matvec_rows, rows_small_batch, view, x16_rows, GemmScratch,
    GluAct, WeightRows,
};
#[cfg(target_arch = "x86_64")]
pub(crate) use dispatch::{expert_panels, ExpertPanelScratch};
pub use dispatch::{gemm_strip_rows, native_kernel, GEMM_MIN_ROWS, TILE};
pub(crate) use flint_core::dequant::f16_to_f32;
pub(crate) use float::FloatKind;
