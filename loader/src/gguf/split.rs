//! Split models: a model written by llama.cpp's `gguf-split` as `PREFIX-00001-of-0000N.gguf`
//! ... `PREFIX-0000N-of-0000N.gguf` (llama.cpp's `llama_split_path`). Every shard is a
//! complete GGUF file holding some of the tensors and the keys `split.no` (from 0),
//! `split.count` and `split.tensors.count` (the total over all shards); the first shard
//! also holds all the model's metadata.
//!
//! Opening the first shard opens every shard, each held and validated exactly as a
//! single file, then checks them against each other: the same `split.count`
//! everywhere, each `split.no` matching the shard's name, `split.tensors.count` equal to
//! the number of tensors found, and no tensor name in two shards. The result is one
//! [`GgufFile`] with one tensor list, each tensor knowing its shard.

use std::collections::hash_map::Entry;
use std::path::{Path, PathBuf};

use super::error::GgufError;
use super::reader::{GgufFile, Held};
use super::residence::LoadMode;

/// The shard number, from 0.
pub const SPLIT_NO: &str = "split.no";
/// The number of shards.
pub const SPLIT_COUNT: &str = "split.count";
/// The number of tensors over all shards.
pub const SPLIT_TENSORS_COUNT: &str = "split.tensors.count";

/// The `split.*` keys of one file that is part of a split (`split.count > 1`).
pub(super) struct SplitKeys {
    /// `split.no` (default 0).
    pub no: usize,
    /// `split.count`.
    pub count: usize,
    /// `split.tensors.count`, when present.
    pub tensors: Option<usize>,
}

impl SplitKeys {
    /// The split keys, or `None` for a file that is not part of a split (no
    /// `split.count`, or one of at most 1, as llama.cpp's loader reads it).
    pub fn read(f: &GgufFile) -> Result<Option<SplitKeys>, GgufError> {
        let count = match f.opt_usize(SPLIT_COUNT)? {
            Some(c) if c > 1 => c,
            _ => return Ok(None),
        };
        Ok(Some(SplitKeys {
            no: f.opt_usize(SPLIT_NO)?.unwrap_or(0),
            count,
            tensors: f.opt_usize(SPLIT_TENSORS_COUNT)?,
        }))
    }
}

/// `PREFIX-{no+1:05}-of-{count:05}.gguf` (llama.cpp's `llama_split_path`).
pub fn split_path(prefix: &str, no: usize, count: usize) -> PathBuf {
    PathBuf::from(format!("{prefix}{}", split_suffix(no, count)))
}

fn split_suffix(no: usize, count: usize) -> String {
    format!("-{:05}-of-{:05}.gguf", no + 1, count)
}

/// The prefix of a shard's path, when its name ends as shard `no` of `count` must
/// (llama.cpp's `llama_split_prefix`).
fn split_prefix(path: &Path, no: usize, count: usize) -> Option<String> {
    let s = path.to_str()?;
    s.strip_suffix(&split_suffix(no, count))
        .filter(|p| !p.is_empty())
        .map(str::to_string)
}

fn mismatch(
    path: &Path,
    key: &'static str,
    found: impl ToString,
    expected: impl ToString,
) -> GgufError {
    GgufError::SplitMismatch {
        path: path.to_path_buf(),
        key,
        found: found.to_string(),
        expected: expected.to_string(),
    }
}

/// Completes `first`, opened from `path`: a file that is not part of a split is
/// returned as it is; the first shard of a split gets the other shards' tensors.
pub(super) fn assemble(
    mut first: GgufFile,
    path: &Path,
    mode: LoadMode,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<GgufFile, GgufError> {
    let Some(keys) = SplitKeys::read(&first)? else {
        return Ok(first);
    };
    let count = keys.count;
    if keys.no >= count {
        return Err(mismatch(
            path,
            SPLIT_NO,
            keys.no,
            format!("less than split.count {count}"),
        ));
    }
    if keys.no != 0 {
        let first_path = match split_prefix(path, keys.no, count) {
            Some(prefix) => split_path(&prefix, 0, count),
            None => PathBuf::from(format!("PREFIX{}", split_suffix(0, count))),
        };
        return Err(GgufError::SplitNotFirst {
            path: path.to_path_buf(),
            no: keys.no + 1,
            count,
            first: first_path,
        });
    }
    let prefix = split_prefix(path, 0, count).ok_or_else(|| GgufError::SplitName {
        path: path.to_path_buf(),
        count,
        suffix: split_suffix(0, count),
    })?;
    let mut paths = vec![path.to_path_buf()];
    let mut declared = vec![keys.tensors];
    for no in 1..count {
        let p = split_path(&prefix, no, count);
        let in_shard = |e: GgufError| GgufError::SplitShard {
            path: p.clone(),
            source: Box::new(e),
        };
        let shard = GgufFile::open_one(&p, mode, progress).map_err(|e| match e {
            GgufError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                GgufError::SplitMissingShard {
                    path: p.clone(),
                    no: no + 1,
                    count,
                }
            }
            e @ GgufError::Io { .. } => e,
            e => in_shard(e),
        })?;
        let k = match SplitKeys::read(&shard).map_err(in_shard)? {
            Some(k) => k,
            None => {
                let found = shard
                    .opt_usize(SPLIT_COUNT)
                    .map_err(in_shard)?
                    .map_or_else(|| "absent".to_string(), |c| c.to_string());
                return Err(mismatch(&p, SPLIT_COUNT, found, count));
            }
        };
        if k.count != count {
            return Err(mismatch(&p, SPLIT_COUNT, k.count, count));
        }
        if k.no != no {
            return Err(mismatch(&p, SPLIT_NO, k.no, no));
        }
        for mut t in shard.tensors {
            match first.tensor_index.entry(t.name.clone()) {
                Entry::Occupied(e) => {
                    let earlier = first.tensors[*e.get()].shard;
                    return Err(GgufError::SplitDuplicateTensor {
                        name: t.name,
                        first: paths[earlier].clone(),
                        second: p,
                    });
                }
                Entry::Vacant(e) => {
                    e.insert(first.tensors.len());
                }
            }
            t.shard = no;
            first.tensors.push(t);
        }
        first.extra.push(Held {
            bytes: shard.bytes,
            release: shard.release,
        });
        paths.push(p);
        declared.push(k.tensors);
    }
    let total = first.tensors.len();
    for (p, d) in paths.iter().zip(declared) {
        if d != Some(total) {
            let found = d.map_or_else(|| "absent".to_string(), |n| n.to_string());
            return Err(mismatch(p, SPLIT_TENSORS_COUNT, found, total));
        }
    }
    Ok(first)
}
