//! Comparisons: normalised MSE, non-finite values, and guard regions around outputs.

use flint_hal::{Device, Tensor, View, ViewMut};

/// Elements of sentinel on each side of a guarded output.
pub const GUARD: usize = 67;

/// The sentinel's bit pattern: a quiet NaN with a payload no arithmetic produces.
pub const SENTINEL_BITS: u32 = 0x7fc0_f1a7;

/// An output buffer with a guard region on each side. The device gets
/// [`body_mut`](Self::body_mut); [`check`](Self::check) fails when anything outside it
/// changed, which catches out-of-bounds writes by FFI backends.
#[derive(Clone, Debug)]
pub struct Guarded {
    buf: Vec<f32>,
    len: usize,
}

impl Guarded {
    /// A body of `len` elements, all set to the sentinel (so an element the device never
    /// writes shows up as NaN).
    pub fn new(len: usize) -> Self {
        Self {
            buf: vec![f32::from_bits(SENTINEL_BITS); len + 2 * GUARD],
            len,
        }
    }

    /// A body holding `data` (for in-place ops).
    pub fn from_slice(data: &[f32]) -> Self {
        let mut g = Self::new(data.len());
        g.body_mut().copy_from_slice(data);
        g
    }

    /// The part the device sees.
    pub fn body(&self) -> &[f32] {
        &self.buf[GUARD..GUARD + self.len]
    }

    /// The part the device sees, writable.
    pub fn body_mut(&mut self) -> &mut [f32] {
        &mut self.buf[GUARD..GUARD + self.len]
    }

    /// The whole buffer, guards included (tests of the guard itself).
    pub fn raw_mut(&mut self) -> &mut [f32] {
        &mut self.buf
    }

    /// `Err` naming the first guard element that changed.
    pub fn check(&self, what: &str) -> Result<(), String> {
        let (before, rest) = self.buf.split_at(GUARD);
        let after = &rest[self.len..];
        if let Some(i) = before.iter().rposition(|v| v.to_bits() != SENTINEL_BITS) {
            return Err(format!(
                "{what}: out-of-bounds write {} elements before the start",
                GUARD - i
            ));
        }
        if let Some(i) = after.iter().position(|v| v.to_bits() != SENTINEL_BITS) {
            return Err(format!(
                "{what}: out-of-bounds write {} elements past the end",
                i + 1
            ));
        }
        Ok(())
    }
}

/// A [`Guarded`] output in a tensor of the device under test, as the engine's outputs
/// are: [`alloc`](Device::alloc)ed with a guard region on each side and filled with the
/// sentinel. The op gets [`body_mut`](Self::body_mut), a view at an offset inside the
/// tensor (a device that ignores a view's offset or length writes into the guards);
/// [`fetch`](Self::fetch) downloads the whole tensor, guards included, for
/// [`Guarded::check`].
#[derive(Debug)]
pub struct DeviceGuarded {
    t: Tensor,
    len: usize,
}

impl DeviceGuarded {
    /// A body of `len` elements on `dev`, all set to the sentinel.
    pub fn new(dev: &dyn Device, len: usize) -> Result<Self, String> {
        let mut t = dev
            .alloc(len + 2 * GUARD)
            .map_err(|e| format!("alloc: {e}"))?;
        dev.upload(&Guarded::new(len).buf, t.view_mut())
            .map_err(|e| format!("upload: {e}"))?;
        Ok(Self { t, len })
    }

    /// A body holding `data` (for in-place ops), on `dev`.
    pub fn from_slice(dev: &dyn Device, data: &[f32]) -> Result<Self, String> {
        let t = dev
            .upload_new(&Guarded::from_slice(data).buf)
            .map_err(|e| format!("upload: {e}"))?;
        Ok(Self { t, len: data.len() })
    }

    /// The part the device sees, to read.
    pub fn body(&self) -> View<'_> {
        self.t.slice(GUARD..GUARD + self.len)
    }

    /// The part the device sees, to write.
    pub fn body_mut(&mut self) -> ViewMut<'_> {
        self.t.slice_mut(GUARD..GUARD + self.len)
    }

    /// The whole tensor, guards included, downloaded.
    pub fn fetch(&self, dev: &dyn Device) -> Result<Guarded, String> {
        let mut g = Guarded::new(self.len);
        dev.download(self.t.view(), &mut g.buf)
            .map_err(|e| format!("download: {e}"))?;
        Ok(g)
    }
}

/// `sum((a - b)^2) / sum(b^2)`, in f64, as ggml's test-backend-ops measures it.
/// When the reference is all zeros the plain sum of squared errors is returned.
pub fn nmse(got: &[f32], want: &[f32]) -> f64 {
    let mut err = 0.0f64;
    let mut norm = 0.0f64;
    for (&a, &b) in got.iter().zip(want) {
        let d = a as f64 - b as f64;
        err += d * d;
        norm += b as f64 * b as f64;
    }
    if norm == 0.0 {
        err
    } else {
        err / norm
    }
}

/// Compares `got` against the reference `want`: lengths, non-finite values where the
/// reference is finite, then NMSE against `tol`. Returns the NMSE.
pub fn compare(what: &str, got: &[f32], want: &[f32], tol: f64) -> Result<f64, String> {
    if got.len() != want.len() {
        return Err(format!(
            "{what}: {} values, reference has {}",
            got.len(),
            want.len()
        ));
    }
    if let Some(i) = got
        .iter()
        .zip(want)
        .position(|(a, b)| !a.is_finite() && b.is_finite())
    {
        let note = if got[i].to_bits() == SENTINEL_BITS {
            " (never written)"
        } else {
            ""
        };
        return Err(format!(
            "{what}: non-finite value {} at index {i}{note}, reference {}",
            got[i], want[i]
        ));
    }
    let e = nmse(got, want);
    if e.is_nan() || e > tol {
        let (mut worst, mut wd) = (0usize, -1.0f64);
        for (i, (&a, &b)) in got.iter().zip(want).enumerate() {
            let d = (a as f64 - b as f64).abs();
            if d > wd {
                worst = i;
                wd = d;
            }
        }
        return Err(format!(
            "{what}: NMSE {e:.3e} > {tol:.1e} (worst index {worst}: got {}, want {})",
            got[worst], want[worst]
        ));
    }
    Ok(e)
}

/// `Err` when `got` and `want` differ bit for bit (inputs a device must leave alone).
pub fn unchanged(what: &str, got: &[f32], want: &[f32]) -> Result<(), String> {
    match got
        .iter()
        .zip(want)
        .position(|(a, b)| a.to_bits() != b.to_bits())
    {
        Some(i) => Err(format!(
            "{what}: input changed at index {i} ({} -> {})",
            want[i], got[i]
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_catches_writes_on_both_sides() {
        let mut g = Guarded::new(10);
        g.body_mut().fill(1.0);
        assert!(g.check("out").is_ok());
        g.raw_mut()[GUARD + 10] = 0.0;
        let e = g.check("out").unwrap_err();
        assert!(e.contains("1 elements past the end"), "{e}");
        let mut g = Guarded::new(10);
        g.raw_mut()[GUARD - 2] = 0.0;
        let e = g.check("out").unwrap_err();
        assert!(e.contains("2 elements before"), "{e}");
    }

    #[test]
    fn compare_flags_nan_unwritten_and_error() {
        let want = [1.0f32, 2.0, 3.0];
        assert!(compare("x", &[1.0, 2.0, 3.0], &want, 1e-9).is_ok());
        let g = Guarded::new(3);
        let e = compare("x", g.body(), &want, 1.0).unwrap_err();
        assert!(e.contains("never written"), "{e}");
        let e = compare("x", &[1.0, f32::INFINITY, 3.0], &want, 1.0).unwrap_err();
        assert!(e.contains("non-finite"), "{e}");
        let e = compare("x", &[1.0, 2.1, 3.0], &want, 1e-6).unwrap_err();
        assert!(e.contains("worst index 1"), "{e}");
        let e = nmse(&[1.0, 2.5, 3.0], &want);
        assert!((e - 0.25 / 14.0).abs() < 1e-12, "{e}");
    }
}
