//! What the prompt-batch panels of the legacy quants (`q0/panel.rs`) and the K-quants
//! (`kq_panel.rs`) share: sixteen weight rows per panel, one per lane of a 512-bit
//! register, decoded panel by panel, and the outputs written back row by row.

/// Weight rows per panel of the prompt-batch gemm ([`q0_gemm`](crate::kernels::q0::panel::q0_gemm)): one per lane of a
/// 512-bit register.
pub(crate) const PANEL_ROWS: usize = 16;

/// Where the outputs of a strip of weight rows go: activation row `t`'s output for the
/// strip's row `r` at `out[t * stride + c0 + r]` (`stride`: the whole weight's rows).
#[derive(Clone, Copy, Debug)]
pub(crate) struct OutCols {
    pub(crate) stride: usize,
    pub(crate) c0: usize,
}

/// Weight rows per strip of a gemm that keeps at most `max_bytes` of decoded panels at
/// once (each panel `panel_bytes`, of `R` rows): a whole multiple of `align` panels, at
/// least one.
pub(crate) fn strip_rows_of<const R: usize>(
    panel_bytes: usize,
    max_bytes: usize,
    align: usize,
) -> usize {
    let per = (max_bytes / panel_bytes.max(1)) / align * align;
    per.max(align) * R
}

/// [`strip_rows_of`] for panels of [`PANEL_ROWS`] rows.
pub(crate) fn strip_rows(panel_bytes: usize, max_bytes: usize, align: usize) -> usize {
    strip_rows_of::<PANEL_ROWS>(panel_bytes, max_bytes, align)
}

/// For the panels `p0..p0 + dec.len() / nb` of the `n` weight rows of `w` (each `nb`
/// blocks; panel `p` is rows `16p..16p + 16`, fewer at the end): `decode(rows, chunk)`
/// with the panel's rows and its `nb` blocks of `dec`.
pub(crate) fn for_each_panel<B, D>(
    w: &[B],
    nb: usize,
    n: usize,
    p0: usize,
    dec: &mut [D],
    decode: impl FnMut(&[&[B]], &mut [D]),
) {
    for_each_panel_of::<PANEL_ROWS, B, D>(w, nb, n, p0, dec, decode)
}

/// [`for_each_panel`] with panels of `R` rows (the AVX2 panels: 8).
pub(crate) fn for_each_panel_of<const R: usize, B, D>(
    w: &[B],
    nb: usize,
    n: usize,
    p0: usize,
    dec: &mut [D],
    mut decode: impl FnMut(&[&[B]], &mut [D]),
) {
    if nb == 0 {
        return;
    }
    assert!(w.len() >= n * nb, "for_each_panel: weight rows");
    for (t, d) in dec.chunks_mut(nb).enumerate() {
        let r0 = R * (p0 + t);
        let live = R.min(n.saturating_sub(r0));
        // The panel's rows on the stack: this runs once per panel of every matmul.
        let rows: [&[B]; R] = std::array::from_fn(|i| {
            let r = r0 + i;
            if r < n {
                &w[r * nb..(r + 1) * nb]
            } else {
                &[]
            }
        });
        decode(&rows[..live], d);
    }
}

/// Writes a panel's outputs for one activation row (`dst`: its live rows): a whole
/// panel as one fixed-size copy (a copy of run-time length is a `memcpy` call, 5% of a
/// prompt-batch matmul), a partial one element by element.
#[inline]
pub(crate) fn put_row(dst: &mut [f32], v: &[f32; PANEL_ROWS]) {
    match <&mut [f32; PANEL_ROWS]>::try_from(&mut *dst) {
        Ok(d) => *d = *v,
        Err(_) => {
            for (d, &x) in dst.iter_mut().zip(v) {
                *d = x;
            }
        }
    }
}
