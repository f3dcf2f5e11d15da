//! Mutation test: tens of thousands of damaged variants of a real small GGUF (written by
//! our writer: metadata of every type, tensors of several types). Each must parse to
//! `Ok` or `Err` without panicking, and parsing must allocate only in proportion to the
//! file size (a counting global allocator measures the peak).

mod gguf_common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};

use flint_loader::gguf::GgufFile;
use gguf_common::{sample_bytes, Rng};

/// Counts live bytes and the peak since the last reset.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(l.size(), Ordering::Relaxed) + l.size();
        PEAK.fetch_max(live, Ordering::Relaxed);
        // SAFETY: same layout contract as the caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
        // SAFETY: `p` came from `alloc` with this layout.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Parses one mutant; on success exercises everything a caller would touch. Returns the
/// peak extra bytes allocated while doing so.
fn check(bytes: Vec<u8>, what: &dyn Fn() -> String) -> (bool, usize) {
    let len = bytes.len();
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let r = catch_unwind(AssertUnwindSafe(|| match GgufFile::from_bytes(bytes) {
        Ok(f) => {
            for t in f.tensors() {
                assert_eq!(f.tensor_data(t).len(), t.n_bytes, "{}", t.name);
                assert!(t.start + t.n_bytes <= len);
                assert!(t.dims.len() <= 4);
            }
            for (k, v) in f.metadata() {
                let _ = v.summary(4).to_string();
                let _ = f.get_u32(k);
                let _ = f.get_str_array(k);
            }
            true
        }
        Err(e) => {
            assert!(!e.to_string().is_empty());
            false
        }
    }));
    let peak = PEAK.load(Ordering::Relaxed).saturating_sub(base);
    match r {
        Ok(ok) => (ok, peak),
        Err(_) => panic!("reader panicked on mutant: {}", what()),
    }
}

#[test]
fn mutants_never_panic_or_over_allocate() {
    let good = sample_bytes();
    let n = good.len();
    let info = GgufFile::from_bytes(good.clone()).expect("sample parses");
    // Everything before the data section holds counts, lengths, types and offsets.
    let header_end = info.data_start();
    drop(info);

    let mut cases = 0usize;
    let mut accepted = 0usize;
    let mut worst_peak = 0usize;
    let mut run = |bytes: Vec<u8>, what: &dyn Fn() -> String| {
        let len = bytes.len().max(1);
        let (ok, peak) = check(bytes, what);
        cases += 1;
        accepted += ok as usize;
        // The input vector is moved in before the count starts; the parse may add
        // structures of a few times the file size (plus small fixed costs), never more:
        // a count or length that the file cannot back must be refused before allocating.
        worst_peak = worst_peak.max(peak);
        assert!(
            peak <= 8 * len + 16 * 1024,
            "mutant {} allocated {peak} bytes for a {len}-byte file",
            what()
        );
    };

    // 1. Truncation at every length.
    for cut in 0..n {
        run(good[..cut].to_vec(), &|| format!("truncate to {cut}"));
    }
    // 2. Absurd 8-byte and 4-byte values at every offset of the header and infos: this
    //    hits every count, length, type id, dimension and offset field (and everything
    //    between them, unaligned).
    let absurd64 = [
        u64::MAX,
        u64::MAX - 7,
        1 << 63,
        1 << 40,
        1 << 32,
        n as u64,
        n as u64 + 1,
        0,
    ];
    for pos in 0..header_end.saturating_sub(7) {
        for &x in &absurd64 {
            let mut m = good.clone();
            m[pos..pos + 8].copy_from_slice(&x.to_le_bytes());
            run(m, &|| format!("u64 {x:#x} at {pos}"));
        }
    }
    let absurd32 = [u32::MAX, 0xdead_beef, 13, 40, 5, 0];
    for pos in 0..header_end.saturating_sub(3) {
        for &x in &absurd32 {
            let mut m = good.clone();
            m[pos..pos + 4].copy_from_slice(&x.to_le_bytes());
            run(m, &|| format!("u32 {x:#x} at {pos}"));
        }
    }
    // 3. Random single-byte and multi-byte flips anywhere, some followed by truncation.
    let mut rng = Rng(0x0123_4567_89ab_cdef);
    for i in 0..6000 {
        let mut m = good.clone();
        let flips = 1 + rng.below(4);
        for _ in 0..flips {
            let p = rng.below(header_end.max(1));
            m[p] ^= 1 << rng.below(8);
        }
        if i % 3 == 0 {
            let p = rng.below(n);
            m[p] = rng.next_u64() as u8;
        }
        if i % 5 == 0 {
            m.truncate(rng.below(n + 1));
        }
        run(m, &|| format!("random mutant #{i}"));
    }
    eprintln!(
        "{cases} mutants of a {n}-byte file: {accepted} accepted, {} refused; largest parse peak {worst_peak} bytes",
        cases - accepted
    );
    assert!(cases >= 10_000, "only {cases} cases");
    // The unmutated header and truncations past the data keep some accepted.
    assert!(accepted > 0);
}
