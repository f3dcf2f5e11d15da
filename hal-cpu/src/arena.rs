//! Huge-page memory: anonymous mappings advised for transparent huge pages
//! ([`huge_aligned_anon`], which the KV cache uses too), and the arena that the weights
//! the device keeps share.
//!
//! A decode streams every weight it reads, and on 4 KiB pages the hardware prefetchers
//! stop at each page and every page costs a TLB walk. A transparent huge page only backs
//! a 2 MiB-aligned range that lies wholly inside an advised mapping, so a mapping per
//! weight left every weight under 2 MiB (a layer's attention and shared-expert matrices:
//! a third of the bytes a bench preset token reads) and the tail of every larger one on
//! small pages. The arena hands out regions of a few large advised mappings instead, one
//! after the other; only the last huge page of each mapping can be partly unused. The
//! weights kept in the file's layout are copied here as well (`CpuDevice::stage`): the
//! file pages handed back for the repacked ones split the loader's huge-page copy, and
//! what lay between them would be left on small pages.

use std::sync::{Arc, Mutex};

/// Transparent huge pages are 2 MiB on x86-64.
pub(crate) const HUGE_PAGE: usize = 2 << 20;

/// `bytes` of zeroed anonymous memory starting on a huge-page boundary: the mapping and
/// the offset of that boundary in it. With `huge`, the range is advised for transparent
/// huge pages (advice only: on small pages the memory is merely slower to stream).
pub(crate) fn huge_aligned_anon(
    bytes: usize,
    huge: bool,
) -> std::io::Result<(memmap2::MmapMut, usize)> {
    let total = bytes
        .checked_add(HUGE_PAGE)
        .ok_or_else(|| std::io::Error::other("size overflows"))?;
    let map = memmap2::MmapMut::map_anon(total)?;
    let start = (HUGE_PAGE - map.as_ptr() as usize % HUGE_PAGE) % HUGE_PAGE;
    #[cfg(unix)]
    if huge {
        let _ = map.advise_range(memmap2::Advice::HugePage, start, bytes);
    }
    #[cfg(not(unix))]
    let _ = huge;
    Ok((map, start))
}

/// Bytes of address space per mapping (only the touched pages become resident); a
/// larger weight gets a mapping of its own size.
const CHUNK_BYTES: usize = 256 << 20;

/// Alignment of every region (a cache line; more than any packed block needs).
const REGION_ALIGN: usize = 64;

/// One anonymous mapping, advised for huge pages, from its first 2 MiB boundary.
struct Chunk {
    /// Owns the mapping; never borrowed whole after creation (regions are built from
    /// `base`), so that a region being written never overlaps a live borrow.
    _map: memmap2::MmapMut,
    /// The first huge-page boundary of the mapping.
    base: *mut u8,
    /// Usable bytes from `base`.
    cap: usize,
}

// SAFETY: `base` points into `_map`, which the chunk owns and which lives as long as it;
// the chunk itself never reads or writes through `base`: each `Region` does, on its own
// disjoint range, under Rust's borrow rules for that `Region`.
unsafe impl Send for Chunk {}
// SAFETY: as above: shared chunks only hand out their base address.
unsafe impl Sync for Chunk {}

/// Bytes of a [`PackArena`], exclusively owned: written through `&mut`, read through
/// `&`.
pub(crate) struct Region {
    chunk: Arc<Chunk>,
    offset: usize,
    len: usize,
}

impl Region {
    /// The region's bytes.
    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: `offset + len <= cap` (checked at allocation) keeps the range inside
        // the chunk's mapping, which `self.chunk` keeps alive; no two regions overlap
        // and the chunk never borrows its mapping, so the only other references to
        // these bytes come from this region, under the borrow of `self`.
        unsafe { std::slice::from_raw_parts(self.chunk.base.add(self.offset), self.len) }
    }

    /// The region's bytes, to write.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`; `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.chunk.base.add(self.offset), self.len) }
    }
}

/// A region as the bytes of a weight source (`flint_hal::SharedBytes`).
pub(crate) struct RegionBytes(pub(crate) Region);

impl AsRef<[u8]> for RegionBytes {
    fn as_ref(&self) -> &[u8] {
        self.0.as_slice()
    }
}

/// Regions carved one after the other out of large huge-page mappings.
#[derive(Default)]
pub(crate) struct PackArena {
    /// The mapping regions come from now, and the bytes of it already handed out.
    current: Mutex<Option<(Arc<Chunk>, usize)>>,
}

impl std::fmt::Debug for PackArena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PackArena")
    }
}

impl PackArena {
    /// `len` zeroed bytes (untouched memory of an anonymous mapping), or the error of
    /// the mapping.
    pub(crate) fn alloc(&self, len: usize) -> std::io::Result<Region> {
        let need = len
            .checked_next_multiple_of(REGION_ALIGN)
            .ok_or_else(|| std::io::Error::other("size overflows"))?;
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((chunk, used)) = current.as_mut() {
            if chunk.cap - *used >= need {
                let region = Region {
                    chunk: chunk.clone(),
                    offset: *used,
                    len,
                };
                *used += need;
                return Ok(region);
            }
        }
        let cap = need
            .max(CHUNK_BYTES)
            .checked_next_multiple_of(HUGE_PAGE)
            .ok_or_else(|| std::io::Error::other("size overflows"))?;
        let (mut map, start) = huge_aligned_anon(cap, true)?;
        // SAFETY: `huge_aligned_anon` maps `cap + HUGE_PAGE` bytes and `start` is below
        // `HUGE_PAGE`, so `start..start + cap` lies inside the mapping.
        let base = unsafe { map.as_mut_ptr().add(start) };
        let chunk = Arc::new(Chunk {
            _map: map,
            base,
            cap,
        });
        let region = Region {
            chunk: chunk.clone(),
            offset: 0,
            len,
        };
        // A weight that fills a mapping of its own leaves the current one in use.
        if cap > CHUNK_BYTES {
            return Ok(region);
        }
        *current = Some((chunk, need));
        Ok(region)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_are_disjoint_aligned_and_keep_their_bytes() {
        let arena = PackArena::default();
        let sizes = [1usize, 63, 64, 65, 4096, 3 << 20, 5, CHUNK_BYTES + 1, 7];
        let mut regions: Vec<Region> = sizes.iter().map(|&n| arena.alloc(n).unwrap()).collect();
        for (i, r) in regions.iter_mut().enumerate() {
            assert_eq!(r.as_slice().len(), sizes[i]);
            assert_eq!(r.as_slice().as_ptr() as usize % REGION_ALIGN, 0);
            assert!(
                r.as_slice().iter().all(|&b| b == 0),
                "fresh region {i} not zeroed"
            );
            r.as_mut_slice().fill(i as u8 + 1);
        }
        // Every region still holds its own fill: no two overlap.
        for (i, r) in regions.iter().enumerate() {
            assert!(
                r.as_slice().iter().all(|&b| b == i as u8 + 1),
                "region {i} overwritten"
            );
        }
        // The first mapping starts on a huge-page boundary, and small regions share it.
        assert_eq!(regions[0].as_slice().as_ptr() as usize % HUGE_PAGE, 0);
        assert!(Arc::ptr_eq(&regions[0].chunk, &regions[6].chunk));
        // The oversized one has its own mapping and did not end the shared one.
        assert!(!Arc::ptr_eq(&regions[7].chunk, &regions[0].chunk));
        assert!(Arc::ptr_eq(&regions[8].chunk, &regions[0].chunk));
    }
}
