//! The on-disk CUBIN cache: keys, the entry format, atomic writes, and corruption detection.
//!
//! **Key.** SHA-256 over, length-prefixed: [`FORMAT_VERSION`], the NVRTC version, every NVRTC
//! argument ([`super::compile::CompileOptions::to_args`], so the architecture is included),
//! every in-memory header, and the complete source. Nothing is a hand-kept list of fields: a
//! change anywhere in what NVRTC is given changes the key.
//!
//! **File.** `<readable name>-<first 16 hex digits of the key>.cubin` in the cache directory
//! (`ATTNFORGE_CACHE_DIR`, else the platform cache directory + `attnforge`). The file holds a
//! fixed header — magic, format version, the full key, log and CUBIN lengths, the original
//! compile time, a SHA-256 of the payload — then the payload: NVRTC's log (so ptxas' report can
//! be shown on a hit) and the CUBIN. A file whose header, length or checksum is off is
//! *corrupt*: [`DiskCache::load`] says why and the caller rebuilds it.
//!
//! **Writes** go to a temporary file in the same directory, then `rename` over the final name,
//! so a reader sees either no file or a whole one. Concurrent builders of one key are serialised
//! by an advisory lock file (`<file>.lock`); see [`super::cached::Jit`] for the lifecycle.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::compile::sanitize;
use super::error::JitError;
use super::nvrtc::NvrtcVersion;

/// Bumped whenever the entry layout or the key's composition changes.
pub const FORMAT_VERSION: u32 = 1;
/// First bytes of every entry.
pub const MAGIC: [u8; 8] = *b"AFCUBIN\0";
/// Environment variable that overrides the cache directory.
pub const CACHE_DIR_ENV: &str = "ATTNFORGE_CACHE_DIR";
/// Extension of entries.
pub const ENTRY_EXT: &str = "cubin";
/// Hex digits of the key in the file name.
const NAME_HASH_DIGITS: usize = 16;
const DIGEST_LEN: usize = 32;
/// magic, version, key, log length, cubin length, compile time (µs), payload digest.
const HEADER_LEN: usize = MAGIC.len() + 4 + DIGEST_LEN + 8 + 8 + 8 + DIGEST_LEN;

/// A cache key: the SHA-256 of everything NVRTC is given.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CacheKey([u8; DIGEST_LEN]);

impl CacheKey {
    /// Hashes the compilation inputs.
    pub fn new(
        source: &str,
        nvrtc: NvrtcVersion,
        args: &[String],
        headers: &[(String, String)],
    ) -> Self {
        let mut h = Sha256::new();
        let mut field = |bytes: &[u8]| {
            h.update((bytes.len() as u64).to_le_bytes());
            h.update(bytes);
        };
        field(&FORMAT_VERSION.to_le_bytes());
        field(nvrtc.to_string().as_bytes());
        field(&(args.len() as u64).to_le_bytes());
        for a in args {
            field(a.as_bytes());
        }
        field(&(headers.len() as u64).to_le_bytes());
        for (name, contents) in headers {
            field(name.as_bytes());
            field(contents.as_bytes());
        }
        field(source.as_bytes());
        CacheKey(h.finalize().into())
    }

    /// The key in hex.
    pub fn hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// A cache entry as read back.
#[derive(Debug, Clone)]
pub struct CacheEntry {
    /// NVRTC's log from the original compile.
    pub log: String,
    /// The CUBIN.
    pub cubin: Vec<u8>,
    /// How long the original compile took.
    pub compile_time: Duration,
    /// The file.
    pub path: PathBuf,
}

/// What [`DiskCache::load`] found.
#[derive(Debug)]
pub enum Lookup {
    /// A valid entry.
    Hit(CacheEntry),
    /// No file.
    Miss,
    /// A file that failed validation (the reason says how).
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
}

/// A cache directory.
#[derive(Debug, Clone)]
pub struct DiskCache {
    dir: PathBuf,
}

/// Makes temporary names unique within a process.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

impl DiskCache {
    /// The directory used when none is given: `ATTNFORGE_CACHE_DIR`, else the platform cache
    /// directory + `attnforge`.
    pub fn default_dir() -> Result<PathBuf, JitError> {
        match std::env::var_os(CACHE_DIR_ENV) {
            Some(d) if !d.is_empty() => Ok(PathBuf::from(d)),
            _ => dirs::cache_dir()
                .map(|d| d.join("attnforge"))
                .ok_or(JitError::NoCacheDir),
        }
    }

    /// Opens (creating it if needed) the cache at `dir`.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self, JitError> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(|source| JitError::Cache {
            op: "create",
            path: dir.clone(),
            source,
        })?;
        Ok(DiskCache { dir })
    }

    /// Opens the cache at [`DiskCache::default_dir`].
    pub fn open_default() -> Result<Self, JitError> {
        Self::open(Self::default_dir()?)
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file of `key` for a kernel named `name`.
    pub fn entry_path(&self, name: &str, key: &CacheKey) -> PathBuf {
        let hex = key.hex();
        self.dir.join(format!(
            "{}-{}.{ENTRY_EXT}",
            sanitize(name),
            &hex[..NAME_HASH_DIGITS]
        ))
    }

    /// The number of entries (`*.cubin` files) in the directory.
    pub fn entry_count(&self) -> Result<usize, JitError> {
        let rd = fs::read_dir(&self.dir).map_err(|source| JitError::Cache {
            op: "read",
            path: self.dir.clone(),
            source,
        })?;
        Ok(rd
            .filter_map(|e| e.ok())
            .filter(|e| e.path().extension().is_some_and(|x| x == ENTRY_EXT))
            .count())
    }

    /// Reads and validates the entry for `key`.
    pub fn load(&self, name: &str, key: &CacheKey) -> Lookup {
        let path = self.entry_path(name, key);
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Lookup::Miss,
            Err(e) => {
                return Lookup::Corrupt {
                    path,
                    reason: format!("unreadable: {e}"),
                }
            }
        };
        match decode(&bytes, key) {
            Ok((log, cubin, compile_time)) => Lookup::Hit(CacheEntry {
                log,
                cubin,
                compile_time,
                path,
            }),
            Err(reason) => Lookup::Corrupt { path, reason },
        }
    }

    /// Writes the entry for `key` atomically (temporary file + rename) and returns its path.
    pub fn store(
        &self,
        name: &str,
        key: &CacheKey,
        log: &str,
        cubin: &[u8],
        compile_time: Duration,
    ) -> Result<PathBuf, JitError> {
        let path = self.entry_path(name, key);
        let file_name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = self.dir.join(format!(
            ".{file_name}.tmp.{}.{}",
            std::process::id(),
            TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let bytes = encode(key, log, cubin, compile_time);
        let write = || -> Result<(), JitError> {
            let io = |op, source| JitError::Cache {
                op,
                path: tmp.clone(),
                source,
            };
            let mut f = File::create(&tmp).map_err(|e| io("create", e))?;
            f.write_all(&bytes).map_err(|e| io("write", e))?;
            f.sync_all().map_err(|e| io("write", e))?;
            fs::rename(&tmp, &path).map_err(|source| JitError::Cache {
                op: "rename",
                path: path.clone(),
                source,
            })
        };
        let result = write();
        if result.is_err() {
            // Best effort: the temporary file may not exist.
            let _ = fs::remove_file(&tmp);
        }
        result.map(|()| path)
    }

    /// Takes the exclusive build lock of `key` (blocking until it is free); released on drop.
    pub fn lock(&self, name: &str, key: &CacheKey) -> Result<BuildLock, JitError> {
        let mut path = self.entry_path(name, key).into_os_string();
        path.push(".lock");
        let path = PathBuf::from(path);
        let io = |op, source| JitError::Cache {
            op,
            path: path.clone(),
            source,
        };
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| io("create", e))?;
        lock_exclusive(&file).map_err(|e| io("lock", e))?;
        Ok(BuildLock { _file: file })
    }
}

/// Blocks until `file` holds an exclusive `flock`. The lock belongs to the open file, not the
/// process, and [`DiskCache::lock`] opens the lock file afresh for every request, so threads of
/// one process exclude each other as processes do (a background compile relies on it).
///
/// (`File::lock` does the same but needs Rust 1.89; the crate's MSRV is 1.85.)
#[cfg(unix)]
fn lock_exclusive(file: &File) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    loop {
        // SAFETY: `file` owns a valid open descriptor for the duration of the call.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
        if rc == 0 {
            return Ok(());
        }
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// Without `flock`, builders of one key are not serialised, neither processes nor threads of one
/// process; the atomic rename still guarantees that readers only ever see whole entries (two
/// builders just duplicate work).
#[cfg(not(unix))]
fn lock_exclusive(_file: &File) -> std::io::Result<()> {
    Ok(())
}

/// The build lock of one key; unlocked when dropped (closing the file releases it).
#[derive(Debug)]
pub struct BuildLock {
    _file: File,
}

fn encode(key: &CacheKey, log: &str, cubin: &[u8], compile_time: Duration) -> Vec<u8> {
    let mut payload = Vec::with_capacity(log.len() + cubin.len());
    payload.extend_from_slice(log.as_bytes());
    payload.extend_from_slice(cubin);
    let digest: [u8; DIGEST_LEN] = Sha256::digest(&payload).into();
    let micros = u64::try_from(compile_time.as_micros()).unwrap_or(u64::MAX);
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&key.0);
    out.extend_from_slice(&(log.len() as u64).to_le_bytes());
    out.extend_from_slice(&(cubin.len() as u64).to_le_bytes());
    out.extend_from_slice(&micros.to_le_bytes());
    out.extend_from_slice(&digest);
    out.extend_from_slice(&payload);
    out
}

/// A little-endian reader over the header that reports truncation as an error.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err(format!(
                "truncated header ({} bytes short)",
                n - self.0.len()
            ));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u64(&mut self) -> Result<u64, String> {
        let mut b = [0u8; 8];
        b.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(b))
    }
}

fn decode(bytes: &[u8], key: &CacheKey) -> Result<(String, Vec<u8>, Duration), String> {
    let mut r = Reader(bytes);
    if r.take(MAGIC.len())? != MAGIC {
        return Err("bad magic (not an attnforge cache entry)".into());
    }
    let mut v = [0u8; 4];
    v.copy_from_slice(r.take(4)?);
    let version = u32::from_le_bytes(v);
    if version != FORMAT_VERSION {
        return Err(format!(
            "format version {version}, expected {FORMAT_VERSION}"
        ));
    }
    if r.take(DIGEST_LEN)? != key.0 {
        return Err("key mismatch (hash-prefix collision or a foreign file)".into());
    }
    let log_len = r.u64()?;
    let cubin_len = r.u64()?;
    let micros = r.u64()?;
    let digest = r.take(DIGEST_LEN)?;
    let payload = r.0;
    let expected = log_len.checked_add(cubin_len);
    if expected != Some(payload.len() as u64) {
        return Err(format!(
            "length mismatch: header says {log_len} + {cubin_len} bytes, file has {}",
            payload.len()
        ));
    }
    if Sha256::digest(payload).as_slice() != digest {
        return Err("checksum mismatch".into());
    }
    // log_len <= payload.len() was established above, so it fits in usize.
    let (log, cubin) = payload.split_at(log_len as usize);
    let log = String::from_utf8(log.to_vec()).map_err(|_| "log is not UTF-8".to_string())?;
    Ok((log, cubin.to_vec(), Duration::from_micros(micros)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const V13: NvrtcVersion = NvrtcVersion {
        major: 13,
        minor: 0,
    };

    fn key(src: &str) -> CacheKey {
        CacheKey::new(src, V13, &["--gpu-architecture=sm_80".into()], &[])
    }

    #[test]
    fn key_covers_every_input() {
        let base = key("a");
        assert_ne!(base, key("b"));
        assert_ne!(
            base,
            CacheKey::new(
                "a",
                NvrtcVersion {
                    major: 13,
                    minor: 1
                },
                &["--gpu-architecture=sm_80".into()],
                &[]
            )
        );
        assert_ne!(
            base,
            CacheKey::new("a", V13, &["--gpu-architecture=sm_90a".into()], &[])
        );
        assert_ne!(
            base,
            CacheKey::new(
                "a",
                V13,
                &["--gpu-architecture=sm_80".into(), "-DX".into()],
                &[]
            )
        );
        assert_ne!(
            base,
            CacheKey::new(
                "a",
                V13,
                &["--gpu-architecture=sm_80".into()],
                &[("h.cuh".into(), "".into())]
            )
        );
        // Length prefixes: moving a byte between fields changes the key.
        assert_ne!(
            CacheKey::new("xy", V13, &["a".into()], &[]),
            CacheKey::new("y", V13, &["ax".into()], &[])
        );
        assert_eq!(base, key("a"));
    }

    #[test]
    fn round_trip_and_every_corruption_is_detected() {
        let t = tempfile::tempdir().unwrap();
        let c = DiskCache::open(t.path()).unwrap();
        let k = key("src");
        assert!(matches!(c.load("k", &k), Lookup::Miss));
        let path = c
            .store(
                "k",
                &k,
                "ptxas info",
                b"\x7fELFcubin",
                Duration::from_millis(1500),
            )
            .unwrap();
        assert!(path
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("k-"));
        let Lookup::Hit(e) = c.load("k", &k) else {
            panic!("expected a hit")
        };
        assert_eq!(
            (e.log.as_str(), e.cubin.as_slice()),
            ("ptxas info", &b"\x7fELFcubin"[..])
        );
        assert_eq!(e.compile_time, Duration::from_millis(1500));
        assert_eq!(c.entry_count().unwrap(), 1);

        let good = fs::read(&path).unwrap();
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("truncated header", good[..10].to_vec()),
            ("length mismatch", good[..good.len() - 1].to_vec()),
            ("checksum mismatch", {
                let mut b = good.clone();
                *b.last_mut().unwrap() ^= 1;
                b
            }),
            ("bad magic", {
                let mut b = good.clone();
                b[0] ^= 1;
                b
            }),
            ("key mismatch", {
                let mut b = good.clone();
                b[MAGIC.len() + 4] ^= 1;
                b
            }),
            ("truncated header", Vec::new()),
        ];
        for (want, bytes) in cases {
            fs::write(&path, bytes).unwrap();
            match c.load("k", &k) {
                Lookup::Corrupt { reason, .. } => {
                    assert!(reason.contains(want), "{want}: {reason}")
                }
                other => panic!("{want}: got {other:?}"),
            }
        }
    }
}
