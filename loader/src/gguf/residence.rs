//! Where a model file's bytes live while it runs: mapped from the page cache, or read
//! once into anonymous memory backed by transparent huge pages.
//!
//! Why the copy: a decode step streams every weight once, and on 4 KiB pages the core
//! walks the page table every 4 KiB and its prefetchers stop at each page boundary, so a
//! read loop streams faster over 2 MiB pages than over 4 KiB ones, and a decode step
//! with it. A file mapping gets 2 MiB pages only where the filesystem keeps large folios
//! in the page cache (ext4 and xfs on Linux 6.x; the mapping is advised for them, see
//! [`advise_huge_pages`]) and only for the parts of the file not already cached in
//! small folios; the copy gets them wherever transparent huge pages are on. The bytes are copied
//! unchanged, at the same offsets modulo 2 MiB, so every tensor keeps its GGUF encoding
//! and alignment and the kernels read the blocks exactly as they lie in the file.
//!
//! The mapping stays the right choice for tools that read a few bytes of a large file
//! (`flint inspect`, `flint tokenize`), where the machine has no transparent huge pages,
//! and where the file would take more than half of the available memory (anonymous
//! memory cannot be dropped and re-read under pressure; a mapping can). `FLINT_LOAD`
//! overrides the choice.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use super::error::GgufError;

/// The size of a transparent huge page on x86-64 and most arm64 kernels: the copy starts
/// at a multiple of it.
const HUGE_PAGE: usize = 2 << 20;
/// Bytes read per `read` call (and per progress report) while copying.
const READ_CHUNK: usize = 16 << 20;

/// How to hold a model file in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadMode {
    /// [`LoadMode::Copy`] where it pays (Linux with transparent huge pages on, the file
    /// at most half of the available memory, at least one huge page long), else
    /// [`LoadMode::Map`].
    Auto,
    /// A read-only shared mapping of the file (zero copies, 4 KiB pages).
    Map,
    /// The file read into anonymous memory advised for transparent huge pages.
    Copy,
}

impl LoadMode {
    /// The environment variable that overrides the choice.
    pub const ENV: &'static str = "FLINT_LOAD";

    /// Parses `auto`, `map` or `copy`.
    pub fn parse(s: &str) -> Option<LoadMode> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" | "" => Some(LoadMode::Auto),
            "map" | "mmap" => Some(LoadMode::Map),
            "copy" | "hugepages" => Some(LoadMode::Copy),
            _ => None,
        }
    }

    /// `FLINT_LOAD`, or [`LoadMode::Auto`] when it is unset.
    pub fn from_env() -> Result<LoadMode, GgufError> {
        match std::env::var(Self::ENV) {
            Err(std::env::VarError::NotPresent) => Ok(LoadMode::Auto),
            Err(std::env::VarError::NotUnicode(v)) => Err(GgufError::BadLoadMode {
                value: v.to_string_lossy().into_owned(),
            }),
            Ok(v) => LoadMode::parse(&v).ok_or(GgufError::BadLoadMode { value: v }),
        }
    }

    /// What [`LoadMode::Auto`] becomes for a file of `len` bytes on this machine; the
    /// other modes stay as they are.
    pub fn resolve(self, len: u64) -> Residence {
        match self {
            LoadMode::Map => Residence::Mapped,
            LoadMode::Copy => Residence::HugePages,
            LoadMode::Auto => {
                let big_enough = len >= HUGE_PAGE as u64;
                let fits = mem_available().is_some_and(|avail| len <= avail / 2);
                if big_enough && fits && transparent_huge_pages() {
                    Residence::HugePages
                } else {
                    Residence::Mapped
                }
            }
        }
    }
}

/// Where an opened file's bytes are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Residence {
    /// Mapped from the file (or held in a vector, for files parsed from bytes).
    Mapped,
    /// Copied into anonymous memory advised for transparent huge pages.
    HugePages,
}

impl Residence {
    /// A few words for logs and `flint bench`.
    pub fn describe(self) -> &'static str {
        match self {
            Residence::Mapped => "mapped from the file",
            Residence::HugePages => "copied into transparent huge pages",
        }
    }
}

/// The file's bytes in anonymous memory that starts on a huge-page boundary.
pub(super) struct HugePageCopy {
    map: memmap2::Mmap,
    start: usize,
    len: usize,
    /// The file, kept open so that released ranges can be mapped from it again.
    file: File,
}

/// The size of a small page (the unit of [`HugePageCopy::release`] and
/// [`release_mapped`]).
const PAGE: usize = 4096;

/// The whole pages inside `range` (clipped to `len`), as an offset range.
fn inner_pages(range: std::ops::Range<usize>, len: usize) -> Option<std::ops::Range<usize>> {
    let a = range.start.checked_next_multiple_of(PAGE)?;
    let b = range.end.min(len) / PAGE * PAGE;
    (a < b).then_some(a..b)
}

/// Advises a file mapping for transparent huge pages. Where the filesystem keeps large
/// folios in the page cache (ext4 and xfs on recent kernels), a fault on an advised
/// mapping reads the file ahead in 2 MiB folios and maps each with one page-table entry,
/// so a decode step streams the mapped weights at the anonymous huge pages' rate;
/// elsewhere the advice changes nothing. Without it, the experts a decode step touches
/// here and there fault in as small folios that stay small in the page cache.
pub(super) fn advise_huge_pages(map: &memmap2::Mmap) {
    #[cfg(target_os = "linux")]
    let _ = map.advise(memmap2::Advice::HugePage);
    #[cfg(not(target_os = "linux"))]
    let _ = map;
}

/// Drops the pages of a file mapping that lie wholly inside `range` from this process's
/// memory; they are read again from the page cache (or the file) on access.
pub(super) fn release_mapped(map: &memmap2::Mmap, range: std::ops::Range<usize>) {
    // A mapping of this crate's files starts on a page boundary.
    let Some(r) = inner_pages(range, map.len()) else {
        return;
    };
    #[cfg(unix)]
    {
        // SAFETY: the mapping is a read-only shared mapping of a file that is not
        // rewritten while mapped (the contract of `Mmap::map` in `open_with`): after
        // MADV_DONTNEED its pages read back the same bytes from the file.
        let _ = unsafe {
            map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, r.start, r.len())
        };
    }
    #[cfg(not(unix))]
    let _ = r;
}

impl AsRef<[u8]> for HugePageCopy {
    fn as_ref(&self) -> &[u8] {
        &self.map[self.start..self.start + self.len]
    }
}

impl HugePageCopy {
    /// Reads `len` bytes of `file` (its whole length) into fresh anonymous memory,
    /// reporting `(bytes read, len)` after every chunk.
    pub(super) fn read(
        path: &Path,
        mut file: &File,
        len: usize,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<HugePageCopy, GgufError> {
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        // Anonymous memory cannot be paged back to the file: a copy larger than what the
        // machine has free would end in the OOM killer, not in an error.
        if let Some(avail) = mem_available() {
            if len as u64 > avail {
                return Err(io(std::io::Error::new(
                    std::io::ErrorKind::OutOfMemory,
                    format!(
                        "{len} bytes do not fit in the {avail} bytes of available memory \
                         (FLINT_LOAD=map maps the file instead of copying it)"
                    ),
                )));
            }
        }
        let mut anon = memmap2::MmapMut::map_anon(len + HUGE_PAGE).map_err(io)?;
        let start = (HUGE_PAGE - anon.as_ptr() as usize % HUGE_PAGE) % HUGE_PAGE;
        // Advice only: without it (or where the kernel says no) the copy is on small
        // pages and merely as fast as the mapping.
        #[cfg(unix)]
        let _ = anon.advise_range(memmap2::Advice::HugePage, start, len);
        let mut done = 0;
        while done < len {
            let end = (done + READ_CHUNK).min(len);
            // Fault the chunk's pages in before reading into it (Linux 5.14+; ignored
            // before): left to the first touches by `read`, allocating the huge pages
            // one fault at a time costs several times the read itself.
            #[cfg(unix)]
            let _ = anon.advise_range(memmap2::Advice::PopulateWrite, start + done, end - done);
            let dst = &mut anon[start..start + len];
            match file.read(&mut dst[done..end]) {
                Ok(0) => {
                    return Err(io(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        format!(
                            "the file shrank to {done} bytes while it was read ({len} expected)"
                        ),
                    )))
                }
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io(e)),
            }
            progress(done as u64, len as u64);
        }
        let map = anon.make_read_only().map_err(io)?;
        let file = file.try_clone().map_err(io)?;
        Ok(HugePageCopy {
            map,
            start,
            len,
            file,
        })
    }

    /// Hands the copy's pages that lie wholly inside `range` (file offsets) back to the
    /// system: they become a private read-only mapping of the same bytes of the file,
    /// read again on access. A hint: where the kernel refuses, the copy stays.
    pub(super) fn release(&self, range: std::ops::Range<usize>) {
        let Some(r) = inner_pages(range, self.len) else {
            return;
        };
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::AsRawFd;
            let Ok(offset) = libc::off_t::try_from(r.start) else {
                return;
            };
            // File offset `o` lies at `start + o`, and `start` is a multiple of 2 MiB:
            // the address and the offset are both page-aligned.
            let addr = self.map.as_ptr().wrapping_add(self.start + r.start);
            // SAFETY: [addr, addr + len) lies inside this copy's own anonymous mapping
            // (inner_pages clips to the copy), which lives as long as `self`. MAP_FIXED
            // replaces those pages atomically with a private read-only mapping of the
            // same file range, which holds the same bytes (the copy was read from it and
            // model files are not rewritten while in use, as for any mapping): every
            // reader keeps seeing the same values at the same addresses.
            let p = unsafe {
                libc::mmap(
                    addr as *mut libc::c_void,
                    r.len(),
                    libc::PROT_READ,
                    libc::MAP_PRIVATE | libc::MAP_FIXED,
                    self.file.as_raw_fd(),
                    offset,
                )
            };
            debug_assert!(p == libc::MAP_FAILED || std::ptr::eq(p as *const u8, addr));
        }
        #[cfg(not(target_os = "linux"))]
        let _ = r;
    }
}

/// Whether the kernel hands out transparent huge pages to memory advised for them
/// (`always` or `madvise` in sysfs).
fn transparent_huge_pages() -> bool {
    std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .is_ok_and(|s| s.contains("[always]") || s.contains("[madvise]"))
}

/// `MemAvailable` of `/proc/meminfo`, in bytes.
fn mem_available() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_modes_and_refuses_others() {
        assert_eq!(LoadMode::parse("auto"), Some(LoadMode::Auto));
        assert_eq!(LoadMode::parse(" MAP "), Some(LoadMode::Map));
        assert_eq!(LoadMode::parse("mmap"), Some(LoadMode::Map));
        assert_eq!(LoadMode::parse("copy"), Some(LoadMode::Copy));
        assert_eq!(LoadMode::parse("hugepages"), Some(LoadMode::Copy));
        assert_eq!(LoadMode::parse("sometimes"), None);
    }

    #[test]
    fn explicit_modes_are_kept_and_small_files_are_mapped() {
        assert_eq!(LoadMode::Map.resolve(1 << 40), Residence::Mapped);
        assert_eq!(LoadMode::Copy.resolve(10), Residence::HugePages);
        assert_eq!(LoadMode::Auto.resolve(4096), Residence::Mapped);
        // Larger than any test machine's memory: mapped.
        assert_eq!(LoadMode::Auto.resolve(1 << 50), Residence::Mapped);
    }

    #[test]
    fn the_copy_starts_on_a_huge_page_and_holds_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bytes");
        let bytes: Vec<u8> = (0..3 * READ_CHUNK + 12345)
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        std::fs::write(&path, &bytes).unwrap();
        let file = File::open(&path).unwrap();
        let mut reports = Vec::new();
        let copy = HugePageCopy::read(&path, &file, bytes.len(), &mut |d, t| reports.push((d, t)))
            .unwrap();
        assert_eq!(copy.as_ref(), &bytes[..]);
        assert_eq!(copy.as_ref().as_ptr() as usize % HUGE_PAGE, 0);
        assert_eq!(
            reports.last(),
            Some(&(bytes.len() as u64, bytes.len() as u64))
        );
        assert!(reports.len() >= 4, "one report per chunk: {reports:?}");
    }

    /// The mappings of this process that come from `path`, as address ranges
    /// (`/proc/self/maps`).
    #[cfg(target_os = "linux")]
    fn mappings_of(path: &Path) -> Vec<std::ops::Range<usize>> {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let name = path.to_str().unwrap();
        maps.lines()
            .filter(|l| l.ends_with(name))
            .map(|l| {
                let (a, b) = l.split(' ').next().unwrap().split_once('-').unwrap();
                usize::from_str_radix(a, 16).unwrap()..usize::from_str_radix(b, 16).unwrap()
            })
            .collect()
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn a_released_range_of_the_copy_is_mapped_from_the_file_and_reads_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bytes");
        let bytes: Vec<u8> = (0..5 * PAGE + 100).map(|i| (i * 13 % 251) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        let file = File::open(&path).unwrap();
        let copy = HugePageCopy::read(&path, &file, bytes.len(), &mut |_, _| {}).unwrap();
        drop(file);
        assert!(
            mappings_of(&path).is_empty(),
            "the copy maps nothing of the file"
        );
        // Not page-aligned at either end: the pages wholly inside, 1..4, are released.
        copy.release(PAGE - 10..4 * PAGE + 7);
        let base = copy.as_ref().as_ptr() as usize;
        assert_eq!(mappings_of(&path), vec![base + PAGE..base + 4 * PAGE]);
        assert_eq!(copy.as_ref(), &bytes[..]);
        // A range holding no whole page changes nothing.
        copy.release(4 * PAGE + 1..5 * PAGE + 100);
        assert_eq!(mappings_of(&path).len(), 1);
        assert_eq!(copy.as_ref(), &bytes[..]);
    }

    /// The `VmFlags` of the mapping of this process that holds `addr` (`/proc/self/smaps`).
    #[cfg(target_os = "linux")]
    fn vm_flags_at(addr: usize) -> String {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        for l in smaps.lines() {
            if let Some((range, _)) = l.split_once(' ') {
                if let Some((a, b)) = range.split_once('-') {
                    if let (Ok(a), Ok(b)) =
                        (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                    {
                        inside = (a..b).contains(&addr);
                        continue;
                    }
                }
            }
            if inside {
                if let Some(flags) = l.strip_prefix("VmFlags:") {
                    return flags.to_string();
                }
            }
        }
        panic!("no mapping holds {addr:#x}")
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn a_mapped_model_file_is_advised_for_huge_pages() {
        if !std::path::Path::new("/sys/kernel/mm/transparent_hugepage").exists() {
            eprintln!("SKIPPED: this kernel has no transparent huge pages to advise for");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        let mut w = crate::gguf::GgufWriter::new();
        w.add_f32_tensor("t", &[4096], &[0.5; 4096]).unwrap();
        std::fs::write(&path, w.to_bytes()).unwrap();
        let f = crate::gguf::GgufFile::open_with(&path, LoadMode::Map, &mut |_, _| {}).unwrap();
        assert_eq!(f.residence(), Residence::Mapped);
        let flags = vm_flags_at(f.as_bytes().as_ptr() as usize);
        // `hg`: MADV_HUGEPAGE (see `advise_huge_pages`).
        assert!(
            flags.split_whitespace().any(|x| x == "hg"),
            "VmFlags:{flags}"
        );
    }

    #[test]
    fn a_released_range_of_a_mapping_reads_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bytes");
        let bytes: Vec<u8> = (0..6 * PAGE).map(|i| (i * 17 % 251) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        let file = File::open(&path).unwrap();
        // SAFETY: a private temporary file nobody rewrites.
        let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        assert_eq!(&map[..], &bytes[..]);
        release_mapped(&map, PAGE..5 * PAGE);
        assert_eq!(&map[..], &bytes[..]);
    }

    #[test]
    fn a_copy_larger_than_the_available_memory_is_refused_before_any_allocation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sparse");
        let file = File::create(&path).unwrap();
        // A sparse terabyte: no disk, no memory, larger than any test machine's RAM.
        file.set_len(1 << 40).unwrap();
        let file = File::open(&path).unwrap();
        let Some(avail) = mem_available() else {
            eprintln!("SKIPPED: no /proc/meminfo, the check has nothing to compare with");
            return;
        };
        assert!(avail < 1 << 40);
        let err = HugePageCopy::read(&path, &file, 1 << 40, &mut |_, _| {})
            .err()
            .expect("a terabyte copy must be refused");
        let msg = err.to_string();
        assert!(
            msg.contains("available memory") && msg.contains("FLINT_LOAD=map"),
            "{msg}"
        );
    }

    #[test]
    fn a_file_shorter_than_promised_is_an_error_not_a_short_copy() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("short");
        std::fs::write(&path, [1u8; 100]).unwrap();
        let file = File::open(&path).unwrap();
        let err = HugePageCopy::read(&path, &file, 200, &mut |_, _| {})
            .err()
            .expect("a short file must fail");
        let msg = err.to_string();
        assert!(msg.contains("short") && msg.contains("shrank"), "{msg}");
    }
}
