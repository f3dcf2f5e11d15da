//! Device tensors: the activations, scratch and recurrent states that ops read and write.
//!
//! A [`Tensor`] is allocated by a device ([`Device::alloc`](crate::Device::alloc)) and
//! lives where that device computes:
//! - [`Tensor::Host`]: host memory (`Vec<f32>`). Devices that compute on the host (`cpu`,
//!   `ref`) allocate these; ops read and write them in place, nothing is copied.
//! - [`Tensor::Device`]: a buffer in the device's own memory behind an opaque handle
//!   ([`DeviceBuffer`]), for accelerators. Only the device that made it can read it.
//!
//! Ops take views: [`View`] (read) and [`ViewMut`] (write), a tensor or a contiguous
//! range of it. Host memory is always a valid view (`(&x[..]).into()`), so a caller with
//! host data can call any device; an accelerator then moves the data in and out itself
//! and counts it. Moving data between host and device is otherwise explicit:
//! [`Device::upload`](crate::Device::upload) and
//! [`Device::download`](crate::Device::download). Every device counts the bytes and
//! calls it moves ([`Transfers`]).

use std::any::Any;
use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

/// A buffer in a device's own memory: `len()` f32 values. The owning device recovers
/// its concrete type with `as_any`; writes happen on the device's side (through the
/// handle), so a shared reference is enough to name an output.
pub trait DeviceBuffer: Send + Sync + fmt::Debug {
    /// Number of f32 values.
    fn len(&self) -> usize;
    /// Whether it holds no values.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// For the owning device to recover its concrete type.
    fn as_any(&self) -> &dyn Any;
}

/// An f32 tensor owned by a device (see the module docs).
#[derive(Debug)]
pub enum Tensor {
    /// Host memory.
    Host(Vec<f32>),
    /// A buffer in the device's memory.
    Device(Box<dyn DeviceBuffer>),
}

impl Tensor {
    /// Number of f32 values.
    pub fn len(&self) -> usize {
        match self {
            Tensor::Host(v) => v.len(),
            Tensor::Device(b) => b.len(),
        }
    }

    /// Whether it holds no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The whole tensor, to read.
    pub fn view(&self) -> View<'_> {
        match self {
            Tensor::Host(v) => View::Host(v),
            Tensor::Device(b) => View::Device {
                buf: &**b,
                offset: 0,
                len: b.len(),
            },
        }
    }

    /// The whole tensor, to write.
    pub fn view_mut(&mut self) -> ViewMut<'_> {
        match self {
            Tensor::Host(v) => ViewMut::Host(v),
            Tensor::Device(b) => ViewMut::Device {
                buf: &**b,
                offset: 0,
                len: b.len(),
            },
        }
    }

    /// Values `r` of the tensor, to read. Panics when `r` is out of range.
    pub fn slice(&self, r: Range<usize>) -> View<'_> {
        self.view().slice(r)
    }

    /// Values `r` of the tensor, to write. Panics when `r` is out of range.
    pub fn slice_mut(&mut self, r: Range<usize>) -> ViewMut<'_> {
        self.view_mut().into_slice(r)
    }

    /// The host values, when the tensor lives in host memory.
    pub fn as_host(&self) -> Option<&[f32]> {
        match self {
            Tensor::Host(v) => Some(v),
            Tensor::Device(_) => None,
        }
    }
}

fn check_range(r: &Range<usize>, len: usize) {
    assert!(
        r.start <= r.end && r.end <= len,
        "view range {}..{} out of a view of {len} values",
        r.start,
        r.end
    );
}

/// A tensor or a contiguous range of one, to read.
#[derive(Clone, Copy, Debug)]
pub enum View<'a> {
    /// Host memory.
    Host(&'a [f32]),
    /// `len` values of a device buffer from `offset`.
    Device {
        /// The buffer.
        buf: &'a dyn DeviceBuffer,
        /// First value.
        offset: usize,
        /// Number of values.
        len: usize,
    },
}

impl<'a> View<'a> {
    /// Number of f32 values.
    pub fn len(&self) -> usize {
        match self {
            View::Host(s) => s.len(),
            View::Device { len, .. } => *len,
        }
    }

    /// Whether it holds no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Values `r` of this view. Panics when `r` is out of range.
    pub fn slice(self, r: Range<usize>) -> View<'a> {
        check_range(&r, self.len());
        match self {
            View::Host(s) => View::Host(&s[r]),
            View::Device { buf, offset, .. } => View::Device {
                buf,
                offset: offset + r.start,
                len: r.end - r.start,
            },
        }
    }

    /// The host values, or `None` for a device buffer.
    pub fn as_host(self) -> Option<&'a [f32]> {
        match self {
            View::Host(s) => Some(s),
            View::Device { .. } => None,
        }
    }

    /// The host values. A device buffer here is a view handed to a host-memory device
    /// by a caller that mixed devices: a caller bug, which panics.
    pub fn host(self) -> &'a [f32] {
        self.as_host()
            .expect("a device buffer passed to a device that computes in host memory")
    }
}

impl<'a> From<&'a [f32]> for View<'a> {
    fn from(s: &'a [f32]) -> Self {
        View::Host(s)
    }
}

impl<'a> From<&'a Vec<f32>> for View<'a> {
    fn from(s: &'a Vec<f32>) -> Self {
        View::Host(s)
    }
}

impl<'a> From<&'a Tensor> for View<'a> {
    fn from(t: &'a Tensor) -> Self {
        t.view()
    }
}

/// A tensor or a contiguous range of one, to write.
#[derive(Debug)]
pub enum ViewMut<'a> {
    /// Host memory.
    Host(&'a mut [f32]),
    /// `len` values of a device buffer from `offset` (written on the device's side).
    Device {
        /// The buffer.
        buf: &'a dyn DeviceBuffer,
        /// First value.
        offset: usize,
        /// Number of values.
        len: usize,
    },
}

impl<'a> ViewMut<'a> {
    /// Number of f32 values.
    pub fn len(&self) -> usize {
        match self {
            ViewMut::Host(s) => s.len(),
            ViewMut::Device { len, .. } => *len,
        }
    }

    /// Whether it holds no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A shorter-lived view of the same values, so that `self` can be used again after.
    pub fn reborrow(&mut self) -> ViewMut<'_> {
        match self {
            ViewMut::Host(s) => ViewMut::Host(s),
            ViewMut::Device { buf, offset, len } => ViewMut::Device {
                buf: *buf,
                offset: *offset,
                len: *len,
            },
        }
    }

    /// The same values, to read.
    pub fn as_view(&self) -> View<'_> {
        match self {
            ViewMut::Host(s) => View::Host(s),
            ViewMut::Device { buf, offset, len } => View::Device {
                buf: *buf,
                offset: *offset,
                len: *len,
            },
        }
    }

    /// Values `r` of this view (borrowing it). Panics when `r` is out of range.
    pub fn slice_mut(&mut self, r: Range<usize>) -> ViewMut<'_> {
        self.reborrow().into_slice(r)
    }

    /// Values `r` of this view. Panics when `r` is out of range.
    pub fn into_slice(self, r: Range<usize>) -> ViewMut<'a> {
        check_range(&r, self.len());
        match self {
            ViewMut::Host(s) => ViewMut::Host(&mut s[r]),
            ViewMut::Device { buf, offset, .. } => ViewMut::Device {
                buf,
                offset: offset + r.start,
                len: r.end - r.start,
            },
        }
    }

    /// Two disjoint views: values `..mid` and `mid..`. Panics when `mid > len`.
    pub fn split_at(self, mid: usize) -> (ViewMut<'a>, ViewMut<'a>) {
        assert!(mid <= self.len(), "split at {mid} of {} values", self.len());
        match self {
            ViewMut::Host(s) => {
                let (a, b) = s.split_at_mut(mid);
                (ViewMut::Host(a), ViewMut::Host(b))
            }
            ViewMut::Device { buf, offset, len } => (
                ViewMut::Device {
                    buf,
                    offset,
                    len: mid,
                },
                ViewMut::Device {
                    buf,
                    offset: offset + mid,
                    len: len - mid,
                },
            ),
        }
    }

    /// The host values, or `None` for a device buffer.
    pub fn as_host_mut(self) -> Option<&'a mut [f32]> {
        match self {
            ViewMut::Host(s) => Some(s),
            ViewMut::Device { .. } => None,
        }
    }

    /// The host values. A device buffer here is a view handed to a host-memory device
    /// by a caller that mixed devices: a caller bug, which panics.
    pub fn host(self) -> &'a mut [f32] {
        self.as_host_mut()
            .expect("a device buffer passed to a device that computes in host memory")
    }
}

impl<'a> From<&'a mut [f32]> for ViewMut<'a> {
    fn from(s: &'a mut [f32]) -> Self {
        ViewMut::Host(s)
    }
}

impl<'a> From<&'a mut Vec<f32>> for ViewMut<'a> {
    fn from(s: &'a mut Vec<f32>) -> Self {
        ViewMut::Host(s)
    }
}

impl<'a> From<&'a mut Tensor> for ViewMut<'a> {
    fn from(t: &'a mut Tensor) -> Self {
        t.view_mut()
    }
}

/// A step's index lists (token ids, positions, slot mappings, block tables), as the
/// device holds them: the engine packs them into one `u32` tensor per step
/// ([`Device::upload_indices`](crate::Device::upload_indices)) and hands ops
/// [`IndexView`]s of it, so that they cross to the device once per step, not once per
/// op and layer.
#[derive(Debug)]
pub enum IndexTensor {
    /// Host memory.
    Host(Vec<u32>),
    /// A buffer in the device's memory holding `len()` `u32` values (a
    /// [`DeviceBuffer`] counts 4-byte values, whatever they hold).
    Device(Box<dyn DeviceBuffer>),
}

impl IndexTensor {
    /// Number of indices.
    pub fn len(&self) -> usize {
        match self {
            IndexTensor::Host(v) => v.len(),
            IndexTensor::Device(b) => b.len(),
        }
    }

    /// Whether it holds no indices.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The whole tensor.
    pub fn view(&self) -> IndexView<'_> {
        match self {
            IndexTensor::Host(v) => IndexView::Host(v),
            IndexTensor::Device(b) => IndexView::Device {
                buf: &**b,
                offset: 0,
                len: b.len(),
            },
        }
    }

    /// Indices `r`. Panics when `r` is out of range.
    pub fn slice(&self, r: Range<usize>) -> IndexView<'_> {
        self.view().slice(r)
    }

    /// The whole tensor, to write (an op's output: the experts
    /// [`Device::route_topk`](crate::Device::route_topk) chooses).
    pub fn view_mut(&mut self) -> IndexViewMut<'_> {
        match self {
            IndexTensor::Host(v) => IndexViewMut::Host(v),
            IndexTensor::Device(b) => IndexViewMut::Device {
                buf: &**b,
                offset: 0,
                len: b.len(),
            },
        }
    }

    /// Indices `r`, to write. Panics when `r` is out of range.
    pub fn slice_mut(&mut self, r: Range<usize>) -> IndexViewMut<'_> {
        self.view_mut().into_slice(r)
    }
}

/// An [`IndexTensor`] or a contiguous range of one, or host indices (always valid: a
/// device handed host indices moves them itself and counts it).
#[derive(Clone, Copy, Debug)]
pub enum IndexView<'a> {
    /// Host memory.
    Host(&'a [u32]),
    /// `len` indices of a device buffer from `offset`.
    Device {
        /// The buffer.
        buf: &'a dyn DeviceBuffer,
        /// First index.
        offset: usize,
        /// Number of indices.
        len: usize,
    },
}

impl<'a> IndexView<'a> {
    /// Number of indices.
    pub fn len(&self) -> usize {
        match self {
            IndexView::Host(s) => s.len(),
            IndexView::Device { len, .. } => *len,
        }
    }

    /// Whether it holds no indices.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Indices `r` of this view. Panics when `r` is out of range.
    pub fn slice(self, r: Range<usize>) -> IndexView<'a> {
        check_range(&r, self.len());
        match self {
            IndexView::Host(s) => IndexView::Host(&s[r]),
            IndexView::Device { buf, offset, .. } => IndexView::Device {
                buf,
                offset: offset + r.start,
                len: r.end - r.start,
            },
        }
    }

    /// The host indices, or `None` for a device buffer.
    pub fn as_host(self) -> Option<&'a [u32]> {
        match self {
            IndexView::Host(s) => Some(s),
            IndexView::Device { .. } => None,
        }
    }

    /// The host indices. A device buffer here is a view handed to a host-memory device
    /// by a caller that mixed devices: a caller bug, which panics.
    pub fn host(self) -> &'a [u32] {
        self.as_host()
            .expect("a device index buffer passed to a device that computes in host memory")
    }
}

impl<'a> From<&'a [u32]> for IndexView<'a> {
    fn from(s: &'a [u32]) -> Self {
        IndexView::Host(s)
    }
}

impl<'a> From<&'a Vec<u32>> for IndexView<'a> {
    fn from(s: &'a Vec<u32>) -> Self {
        IndexView::Host(s)
    }
}

impl<'a, const N: usize> From<&'a [u32; N]> for IndexView<'a> {
    fn from(s: &'a [u32; N]) -> Self {
        IndexView::Host(s)
    }
}

impl<'a> From<&'a IndexTensor> for IndexView<'a> {
    fn from(t: &'a IndexTensor) -> Self {
        t.view()
    }
}

/// An [`IndexTensor`] or a contiguous range of one, or host indices, to write.
#[derive(Debug)]
pub enum IndexViewMut<'a> {
    /// Host memory.
    Host(&'a mut [u32]),
    /// `len` indices of a device buffer from `offset` (written on the device's side).
    Device {
        /// The buffer.
        buf: &'a dyn DeviceBuffer,
        /// First index.
        offset: usize,
        /// Number of indices.
        len: usize,
    },
}

impl<'a> IndexViewMut<'a> {
    /// Number of indices.
    pub fn len(&self) -> usize {
        match self {
            IndexViewMut::Host(s) => s.len(),
            IndexViewMut::Device { len, .. } => *len,
        }
    }

    /// Whether it holds no indices.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A shorter-lived view of the same indices, so that `self` can be used again after.
    pub fn reborrow(&mut self) -> IndexViewMut<'_> {
        match self {
            IndexViewMut::Host(s) => IndexViewMut::Host(s),
            IndexViewMut::Device { buf, offset, len } => IndexViewMut::Device {
                buf: *buf,
                offset: *offset,
                len: *len,
            },
        }
    }

    /// The same indices, to read.
    pub fn as_view(&self) -> IndexView<'_> {
        match self {
            IndexViewMut::Host(s) => IndexView::Host(s),
            IndexViewMut::Device { buf, offset, len } => IndexView::Device {
                buf: *buf,
                offset: *offset,
                len: *len,
            },
        }
    }

    /// Indices `r` of this view. Panics when `r` is out of range.
    pub fn into_slice(self, r: Range<usize>) -> IndexViewMut<'a> {
        check_range(&r, self.len());
        match self {
            IndexViewMut::Host(s) => IndexViewMut::Host(&mut s[r]),
            IndexViewMut::Device { buf, offset, .. } => IndexViewMut::Device {
                buf,
                offset: offset + r.start,
                len: r.end - r.start,
            },
        }
    }

    /// The host indices, or `None` for a device buffer.
    pub fn as_host_mut(self) -> Option<&'a mut [u32]> {
        match self {
            IndexViewMut::Host(s) => Some(s),
            IndexViewMut::Device { .. } => None,
        }
    }

    /// The host indices. A device buffer here is a view handed to a host-memory device
    /// by a caller that mixed devices: a caller bug, which panics.
    pub fn host(self) -> &'a mut [u32] {
        self.as_host_mut()
            .expect("a device index buffer passed to a device that computes in host memory")
    }
}

impl<'a> From<&'a mut [u32]> for IndexViewMut<'a> {
    fn from(s: &'a mut [u32]) -> Self {
        IndexViewMut::Host(s)
    }
}

impl<'a> From<&'a mut Vec<u32>> for IndexViewMut<'a> {
    fn from(s: &'a mut Vec<u32>) -> Self {
        IndexViewMut::Host(s)
    }
}

impl<'a> From<&'a mut IndexTensor> for IndexViewMut<'a> {
    fn from(t: &'a mut IndexTensor) -> Self {
        t.view_mut()
    }
}

/// Host-device traffic of a device since it was opened: what crossed between host memory
/// and the device's memory, through [`Device::upload`](crate::Device::upload) and
/// [`Device::download`](crate::Device::download) and through ops handed host views.
/// A step's index lists travel as one [`IndexTensor`] upload. Host arrays an op still
/// takes (attention sinks, RoPE frequency factors) and index lists handed to it in host
/// memory by a device that keeps them there are counted apart, as `arg_bytes`: a real
/// device passes them as kernel arguments.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Transfers {
    /// Host-to-device copies.
    pub uploads: u64,
    /// Bytes they moved.
    pub upload_bytes: u64,
    /// Device-to-host copies.
    pub downloads: u64,
    /// Bytes they moved.
    pub download_bytes: u64,
    /// Bytes of per-op host arguments (host index lists and small constant arrays).
    pub arg_bytes: u64,
}

impl Transfers {
    /// Host-device copies in both directions.
    pub fn calls(&self) -> u64 {
        self.uploads + self.downloads
    }

    /// Bytes moved in both directions (not counting `arg_bytes`).
    pub fn bytes(&self) -> u64 {
        self.upload_bytes + self.download_bytes
    }

    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &Transfers) -> Transfers {
        Transfers {
            uploads: self.uploads - earlier.uploads,
            upload_bytes: self.upload_bytes - earlier.upload_bytes,
            downloads: self.downloads - earlier.downloads,
            download_bytes: self.download_bytes - earlier.download_bytes,
            arg_bytes: self.arg_bytes - earlier.arg_bytes,
        }
    }
}

/// The counter a device keeps for [`Transfers`] (thread-safe; relaxed atomics).
#[derive(Debug, Default)]
pub struct TransferCounter {
    uploads: AtomicU64,
    upload_bytes: AtomicU64,
    downloads: AtomicU64,
    download_bytes: AtomicU64,
    arg_bytes: AtomicU64,
}

impl TransferCounter {
    /// One upload of `values` f32 values.
    pub fn upload(&self, values: usize) {
        self.uploads.fetch_add(1, Ordering::Relaxed);
        self.upload_bytes
            .fetch_add(4 * values as u64, Ordering::Relaxed);
    }

    /// One download of `values` f32 values.
    pub fn download(&self, values: usize) {
        self.downloads.fetch_add(1, Ordering::Relaxed);
        self.download_bytes
            .fetch_add(4 * values as u64, Ordering::Relaxed);
    }

    /// `bytes` of per-op host arguments.
    pub fn args(&self, bytes: usize) {
        self.arg_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// The totals so far.
    pub fn get(&self) -> Transfers {
        Transfers {
            uploads: self.uploads.load(Ordering::Relaxed),
            upload_bytes: self.upload_bytes.load(Ordering::Relaxed),
            downloads: self.downloads.load(Ordering::Relaxed),
            download_bytes: self.download_bytes.load(Ordering::Relaxed),
            arg_bytes: self.arg_bytes.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_views_slice_and_split() {
        let mut t = Tensor::Host((0..10).map(|i| i as f32).collect());
        assert_eq!(t.slice(2..5).host(), &[2.0, 3.0, 4.0]);
        let (a, b) = t.slice_mut(1..9).split_at(3);
        a.host()[0] = -1.0;
        b.host()[0] = -4.0;
        assert_eq!(t.as_host().unwrap()[..5], [0.0, -1.0, 2.0, 3.0, -4.0]);
    }

    #[derive(Debug)]
    struct Buf(usize);
    impl DeviceBuffer for Buf {
        fn len(&self) -> usize {
            self.0
        }
        fn as_any(&self) -> &dyn Any {
            self
        }
    }

    #[test]
    fn device_views_carry_offsets() {
        let mut t = Tensor::Device(Box::new(Buf(100)));
        let v = t.slice(10..40).slice(5..10);
        match v {
            View::Device { offset, len, .. } => assert_eq!((offset, len), (15, 5)),
            View::Host(_) => panic!("a device view"),
        }
        let (a, b) = t.view_mut().into_slice(20..60).split_at(15);
        match (a, b) {
            (
                ViewMut::Device {
                    offset: oa,
                    len: la,
                    ..
                },
                ViewMut::Device {
                    offset: ob,
                    len: lb,
                    ..
                },
            ) => assert_eq!((oa, la, ob, lb), (20, 15, 35, 25)),
            _ => panic!("device views"),
        }
    }

    #[test]
    fn index_views_slice_on_the_host_and_carry_offsets_on_the_device() {
        let t = IndexTensor::Host((0..10).collect());
        assert_eq!(t.slice(2..8).slice(1..3).host(), &[3, 4]);
        assert_eq!(IndexView::from(&[7u32, 8]).host(), &[7, 8]);
        let t = IndexTensor::Device(Box::new(Buf(50)));
        match t.slice(10..40).slice(5..10) {
            IndexView::Device { offset, len, .. } => assert_eq!((offset, len), (15, 5)),
            IndexView::Host(_) => panic!("a device index view"),
        }
        assert!(t.view().as_host().is_none());
    }

    #[test]
    #[should_panic(expected = "out of a view")]
    fn out_of_range_index_views_panic() {
        let t = IndexTensor::Host(vec![0; 4]);
        let _ = t.slice(2..5);
    }

    #[test]
    #[should_panic(expected = "out of a view")]
    fn out_of_range_views_panic() {
        let t = Tensor::Host(vec![0.0; 4]);
        let _ = t.slice(2..5);
    }

    #[test]
    fn counters_add_up() {
        let c = TransferCounter::default();
        let before = c.get();
        c.upload(3);
        c.download(5);
        c.args(8);
        let d = c.get().since(&before);
        assert_eq!((d.calls(), d.bytes(), d.arg_bytes), (2, 32, 8));
    }
}
