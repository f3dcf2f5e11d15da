//! Bit-exact checks against golden vectors written by `tools/golden/make_vectors.py`
//! with llama.cpp's `gguf` Python package (see docs/formats.md to regenerate them).

use flint_core::dequant::{dequantize, dequantize_to_vec};
use flint_core::quant::quantize;
use flint_core::{FormatError, GgmlType};

/// (type name, raw block bytes, expected f32 little-endian bytes)
macro_rules! dequant_cases {
    ($($name:literal),* $(,)?) => {
        [$((
            $name,
            include_bytes!(concat!("data/dequant/", $name, ".bin")) as &[u8],
            include_bytes!(concat!("data/dequant/", $name, ".f32")) as &[u8],
        )),*]
    };
}

const DEQUANT: [(&str, &[u8], &[u8]); 25] = dequant_cases!(
    "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
    "Q6_K", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "IQ4_NL", "IQ4_XS",
    "TQ1_0", "TQ2_0", "MXFP4",
);

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Compares bit patterns, reporting the first few differences.
fn assert_bits_eq(ty: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{ty}: length");
    let diffs: Vec<usize> = (0..got.len())
        .filter(|&i| got[i].to_bits() != want[i].to_bits())
        .collect();
    let first: Vec<String> = diffs
        .iter()
        .take(5)
        .map(|&i| {
            let (g, w) = (got[i], want[i]);
            format!(
                "[{i}] got {g:e} ({:#010x}) want {w:e} ({:#010x})",
                g.to_bits(),
                w.to_bits()
            )
        })
        .collect();
    assert!(
        diffs.is_empty(),
        "{ty}: {} of {} values differ, first: {first:#?}",
        diffs.len(),
        got.len()
    );
}

#[test]
fn golden_covers_every_dequantizable_type() {
    let names: Vec<&str> = DEQUANT.iter().map(|c| c.0).collect();
    for ty in GgmlType::DEQUANTIZABLE {
        assert!(names.contains(&ty.name()), "no golden vector for {ty}");
    }
}

/// `raw` copied to an 8-byte aligned buffer, starting `offset` bytes in.
fn placed(raw: &[u8], offset: usize) -> (Vec<u64>, std::ops::Range<usize>) {
    let mut buf = vec![0u64; (raw.len() + offset).div_ceil(8)];
    let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut buf);
    bytes[offset..offset + raw.len()].copy_from_slice(raw);
    (buf, offset..offset + raw.len())
}

#[test]
fn dequantize_matches_gguf_bit_for_bit() {
    for (name, raw, expected) in DEQUANT {
        let ty = GgmlType::from_name(name).expect("known type");
        let want = f32s(expected);
        assert!(!want.is_empty(), "{name}: empty golden vector");
        // Aligned: the blocks are viewed in place.
        let (buf, range) = placed(raw, 0);
        let src = &bytemuck::cast_slice::<u64, u8>(&buf)[range];
        let mut got = vec![0.0f32; want.len()];
        dequantize(ty, src, &mut got).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_bits_eq(name, &got, &want);
    }
}

#[test]
fn dequantize_reads_unaligned_input() {
    for (name, raw, expected) in DEQUANT {
        let ty = GgmlType::from_name(name).expect("known type");
        // One byte in: no block with a u16 or f32 field starts at an aligned address,
        // so the copying path runs.
        let (buf, range) = placed(raw, 1);
        let src = &bytemuck::cast_slice::<u64, u8>(&buf)[range];
        let got = dequantize_to_vec(ty, src).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_bits_eq(name, &got, &f32s(expected));
    }
}

#[test]
fn dequantize_rejects_bad_lengths() {
    let raw = [0u8; 145];
    let mut out = vec![0.0f32; 256];
    assert_eq!(
        dequantize(GgmlType::Q4_K, &raw, &mut out),
        Err(FormatError::PartialBlock {
            ty: GgmlType::Q4_K,
            bytes: 145
        })
    );
    assert_eq!(
        dequantize(GgmlType::Q4_K, &raw[..144], &mut out[..255]),
        Err(FormatError::LengthMismatch {
            expected: 256,
            found: 255
        })
    );
    assert_eq!(
        dequantize(GgmlType::Q8_K, &[0u8; 292], &mut out),
        Err(FormatError::Unsupported(GgmlType::Q8_K))
    );
}

macro_rules! quant_cases {
    ($($name:literal),* $(,)?) => {
        [$((
            $name,
            include_bytes!(concat!("data/quantize/", $name, ".in.f32")) as &[u8],
            include_bytes!(concat!("data/quantize/", $name, ".bin")) as &[u8],
        )),*]
    };
}

const QUANT: [(&str, &[u8], &[u8]); 5] = quant_cases!("Q4_0", "Q5_0", "Q8_0", "F16", "BF16");

#[test]
fn quantize_matches_gguf_byte_for_byte() {
    for (name, input, expected) in QUANT {
        let ty = GgmlType::from_name(name).expect("known type");
        let x = f32s(input);
        let mut got = vec![0u8; expected.len()];
        quantize(ty, &x, &mut got).unwrap_or_else(|e| panic!("{name}: {e}"));
        let first = got.iter().zip(expected).position(|(a, b)| a != b);
        assert_eq!(first, None, "{name}: first differing byte");
    }
}

/// Q4_K / Q5_K / Q6_K / Q8_K / Q8_1 blocks written by ggml's own reference quantizers
/// (`quantize_row_q*_K_ref`, `quantize_row_q8_1_ref`, compiled with `-ffp-contract=off`)
/// from `KQUANT.in.f32`.
const KQUANT_INPUT: &[u8] = include_bytes!("data/quantize/KQUANT.in.f32");
const KQUANT: [(&str, &[u8]); 5] = [
    ("Q8_K", include_bytes!("data/quantize/Q8_K.bin")),
    ("Q8_1", include_bytes!("data/quantize/Q8_1.bin")),
    ("Q4_K", include_bytes!("data/quantize/Q4_K.bin")),
    ("Q5_K", include_bytes!("data/quantize/Q5_K.bin")),
    ("Q6_K", include_bytes!("data/quantize/Q6_K.bin")),
];

#[test]
fn reference_quantizers_match_ggml_byte_for_byte() {
    let x = f32s(KQUANT_INPUT);
    for (name, expected) in KQUANT {
        let ty = GgmlType::from_name(name).expect("known type");
        assert_eq!(
            ty.row_bytes(x.len()),
            Some(expected.len()),
            "{name}: vector size"
        );
        let mut got = vec![0u8; expected.len()];
        quantize(ty, &x, &mut got).unwrap_or_else(|e| panic!("{name}: {e}"));
        let ts = ty.type_size();
        let bad: Vec<usize> = (0..expected.len() / ts)
            .filter(|&b| got[b * ts..(b + 1) * ts] != expected[b * ts..(b + 1) * ts])
            .collect();
        assert!(bad.is_empty(), "{name}: blocks {bad:?} differ from ggml's");
    }
}
