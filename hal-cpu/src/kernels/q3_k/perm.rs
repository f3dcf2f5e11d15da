//! Q3_K blocks with their quant bytes pre-arranged at staging for the VBMI decode kernel
//! (`vnni::dot_q3k_rows4_perm`): [`BlockQ3KPerm`], the same 110 bytes per block as the
//! file's `BlockQ3K`, each row's blocks in place (no row groups).
//!
//! Why: the kernel on the file's layout spends four of its vector operations a weight
//! block on arranging that block's bytes, the same way every time: a byte permute of
//! `qs` and one of `hmask`, a shift and a bit transform of the high bits. On the
//! Emerald Rapids host the kernel is bound by those ports (the permutes share one, the
//! shift and the transform another; docs/benchmarks.md, the low-bit section), so they
//! are done once here. One thread, weight in cache (`kernel_speed`, Q3_K M=1): 14.2-14.9
//! GB/s on the file's layout, 17.8-18.0 arranged; a 1 GiB weight on two threads from
//! 0.86-0.87 of the read loop to 0.94-0.96 (`lowbit`).
//!
//! The arrangement, per block, in the kernel's register layout (`vnni::BytePerms`: i32
//! lane `2l + o` of a run pair's register holds elements `l, l + 8, l + 16, l + 24` of run
//! `s + 4o`, one a byte):
//! - `qs[b]` is the file's `qs[src(b)]`, the byte `vpermb` would put at byte `b`, so the
//!   kernel loads it as it is.
//! - `hmask` packs the four high bits each byte lane `b` of the 64 needs (its element in
//!   run pairs 0..4: bits 4, 5, 0, 1 of the lane's byte in the kernel's decode) into half a
//!   byte: lane `b < 32` in bits 0, 1, 4, 5 of `hmask[b]`, lane `b + 32` in bits 2, 3, 6, 7.
//!   The kernel loads the 32 bytes into both halves of a register and picks each half's
//!   bits by that half's bit transforms.
//! - `scales` and `d` as in the file.

use bytemuck::Zeroable;
use flint_core::blocks::BlockQ3K;

/// One Q3_K block arranged for the kernel (the module says how).
#[derive(Clone, Copy, Debug, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub(crate) struct BlockQ3KPerm {
    pub(crate) hmask: [u8; 32],
    pub(crate) qs: [u8; 64],
    pub(crate) scales: [u8; 12],
    pub(crate) d: u16,
}

const _: () = assert!(std::mem::size_of::<BlockQ3KPerm>() == 110);
const _: () = assert!(std::mem::size_of::<BlockQ3K>() == 110);

/// Per run pair: the bit of the kernel's decoded high-bit byte that carries its element's
/// high bit (run pairs 0, 1 in bits 4, 5; 2, 3 in bits 0, 1, below the low bits the
/// kernel's selects put beside them).
pub(crate) const HIGH_BIT: [u32; 4] = [4, 5, 0, 1];

/// The element (0..256) that byte `b` (0..64) of run pair `s`'s register holds, and the
/// bit of the kernel's decoded high-bit byte that carries its high bit.
const fn lane_element(b: usize, s: usize) -> (usize, u32) {
    let (lane, k) = (b / 4, b % 4);
    let run = s + 4 * (lane % 2);
    let j = lane / 2 + 8 * k;
    (32 * run + j, HIGH_BIT[s])
}

/// The file's `qs` byte that byte `b` of the arranged `qs` is: byte `l + 8k` of the first
/// 32 (runs 0..4) for the even i32 lanes, of the last 32 for the odd ones.
pub(crate) const fn qs_source(b: usize) -> usize {
    let (lane, k) = (b / 4, b % 4);
    lane / 2 + 8 * k + if lane % 2 == 1 { 32 } else { 0 }
}

/// The inverse of [`qs_source`]: the arranged `qs` byte that the file's byte `i` became.
pub(crate) const QS_BACK: [u8; 64] = {
    let mut back = [0u8; 64];
    let mut b = 0;
    while b < 64 {
        back[qs_source(b)] = b as u8;
        b += 1;
    }
    back
};

/// The kernel's decoded high-bit byte of byte lane `b` (0..64): bit `HIGH_BIT[s]`
/// set where the element of run pair `s` at that lane has its high bit.
fn high_bits(hmask: &[u8; 32], b: usize) -> u8 {
    let mut out = 0;
    for s in 0..4 {
        let (e, bit) = lane_element(b, s);
        let h = (hmask[e % 32] >> (e / 32)) & 1;
        out |= h << bit;
    }
    out
}

/// Row blocks arranged for the kernel (`src` and `out` the same length).
pub(crate) fn pack(src: &[BlockQ3K], out: &mut [BlockQ3KPerm]) {
    assert_eq!(src.len(), out.len(), "q3_k::perm::pack: lengths");
    for (o, b) in out.iter_mut().zip(src) {
        let mut qs = [0u8; 64];
        for (i, q) in qs.iter_mut().enumerate() {
            *q = b.qs[qs_source(i)];
        }
        let mut hmask = [0u8; 32];
        for (i, h) in hmask.iter_mut().enumerate() {
            let (lo, hi) = (high_bits(&b.hmask, i), high_bits(&b.hmask, i + 32));
            *h = (lo & 0x33) | (hi & 0x03) << 2 | (hi & 0x30) << 2;
        }
        *o = BlockQ3KPerm {
            hmask,
            qs,
            scales: b.scales,
            d: b.d,
        };
    }
}

/// A block back in the file's layout.
pub(crate) fn unpack(p: &BlockQ3KPerm) -> BlockQ3K {
    let mut out = BlockQ3K {
        hmask: [0; 32],
        qs: [0; 64],
        scales: p.scales,
        d: p.d,
    };
    for (i, &q) in p.qs.iter().enumerate() {
        out.qs[qs_source(i)] = q;
    }
    for b in 0..64 {
        let byte = p.hmask[b % 32];
        // This lane's bits 0, 1, 4, 5 (lanes 32.. keep theirs in bits 2, 3, 6, 7).
        let bits = if b < 32 {
            byte & 0x33
        } else {
            (byte >> 2) & 0x33
        };
        for s in 0..4 {
            let (e, bit) = lane_element(b, s);
            out.hmask[e % 32] |= ((bits >> bit) & 1) << (e / 32);
        }
    }
    out
}

/// Whole rows of arranged blocks back in the file's layout, as bytes: with
/// `vnni::unpack_perm` where the CPU arranges them (every one with VBMI and GFNI), else
/// block by block here.
pub(crate) fn unpack_bytes(p: &[BlockQ3KPerm]) -> Vec<u8> {
    let mut blocks = vec![BlockQ3K::zeroed(); p.len()];
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_vbmi_gfni() {
        // SAFETY: the CPU has AVX-512 F/BW, VBMI and GFNI (every CPU with VBMI has F/BW).
        unsafe { super::vnni::unpack_perm(p, &mut blocks) };
        return bytemuck::cast_slice(&blocks).to_vec();
    }
    for (o, b) in blocks.iter_mut().zip(p) {
        *o = unpack(b);
    }
    bytemuck::cast_slice(&blocks).to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::order_check::{q3_k_weights, seed};

    #[test]
    fn every_element_is_placed_once() {
        let mut seen = [false; 256];
        for b in 0..64 {
            for s in 0..4 {
                let (e, _) = lane_element(b, s);
                assert!(!seen[e], "element {e} twice");
                seen[e] = true;
            }
        }
        let mut q = [false; 64];
        for b in 0..64 {
            assert!(!q[qs_source(b)]);
            q[qs_source(b)] = true;
        }
    }

    #[test]
    fn pack_then_unpack_is_the_identity() {
        let mut s = seed("q3_k perm");
        let w = q3_k_weights(40, &mut s);
        let mut p = vec![BlockQ3KPerm::zeroed(); w.len()];
        pack(&w, &mut p);
        for (a, b) in w.iter().zip(&p) {
            let u = unpack(b);
            assert_eq!(bytemuck::bytes_of(a), bytemuck::bytes_of(&u));
        }
        assert_eq!(unpack_bytes(&p), bytemuck::cast_slice::<_, u8>(&w));
    }

    /// The vector unpack equals the scalar one (and so the file's blocks), extremes too.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vector_unpack_equals_the_scalar_one() {
        if !crate::simd::has_vbmi_gfni() {
            eprintln!("no AVX-512 VBMI + GFNI: the vector unpack is not exercised");
            return;
        }
        let mut s = seed("q3_k perm unpack");
        let mut w = q3_k_weights(64, &mut s);
        w[0].hmask = [0xFF; 32];
        w[1].hmask = [0; 32];
        w[2].qs = [0xFF; 64];
        let mut p = vec![BlockQ3KPerm::zeroed(); w.len()];
        pack(&w, &mut p);
        let mut got = vec![BlockQ3K::zeroed(); w.len()];
        // SAFETY: checked above.
        unsafe { crate::kernels::q3_k::vnni::unpack_perm(&p, &mut got) };
        for (i, (g, want)) in got.iter().zip(&w).enumerate() {
            assert_eq!(bytemuck::bytes_of(g), bytemuck::bytes_of(want), "block {i}");
        }
    }
}
