//! The disk cache of compiled code objects.
//!
//! **Key**: sha256 over the program source, the architecture, the compiler's version and every
//! compile flag (the wave size included), each length-prefixed so no two inputs collide by
//! concatenation; see [`CacheKey::new`].
//!
//! **Folder**: `$HIPDECODE_KERNEL_CACHE` when set ([`crate::knobs::KERNEL_CACHE`]: the value
//! `off` disables the cache; a folder that cannot be created or written is an error naming the
//! variable), else
//! `$XDG_CACHE_HOME/hipdecode/kernels` (when that variable holds an absolute path), else
//! `$HOME/.cache/hipdecode/kernels`. When the cache was not asked for by name and its default
//! folder is unusable (no `HOME`, a read-only home), kernels are compiled every time and a
//! warning says why.
//!
//! **Entry**: one file per (module, key), `<module>-<key hex>.bin`: a header (magic
//! `HDKCACHE`, format version, the key, payload length, sha256 of the payload) and the code
//! object. An entry that is truncated, corrupt, of another format version or of another key is
//! never loaded: it is recompiled and rewritten. Writes go to a temporary file in the same
//! folder that is then renamed over the entry, so a reader (another process) sees the old entry
//! or the new one, never half of one.

use crate::error::{KernelError, Result};
use crate::knobs::{CacheSetting, KERNEL_CACHE};
use sha2::{Digest, Sha256};
use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The variable that names the cache folder (or `off`).
pub const CACHE_VAR: &str = KERNEL_CACHE.name;

/// First bytes of every entry file.
pub const MAGIC: [u8; 8] = *b"HDKCACHE";
/// Version of the entry layout; an entry of another version is recompiled.
pub const FORMAT_VERSION: u32 = 1;
/// Bytes before the payload: magic, version (u32 LE), key, payload length (u64 LE), sha256.
pub const HEADER_LEN: usize = 8 + 4 + 32 + 8 + 32;

/// Identity of one compiled code object (sha256, see [`CacheKey::new`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CacheKey([u8; 32]);

impl CacheKey {
    /// The key of compiling `source` for `arch` with the compiler of version `compiler_version`
    /// and the options `flags` (every one the compiler gets, `-DWARP_SIZE=…` included).
    pub fn new(source: &str, arch: &str, compiler_version: &str, flags: &[String]) -> CacheKey {
        let mut h = Sha256::new();
        let mut field = |bytes: &[u8]| {
            h.update((bytes.len() as u64).to_le_bytes());
            h.update(bytes);
        };
        field(b"hipdecode kernel cache key v1");
        field(source.as_bytes());
        field(arch.as_bytes());
        field(compiler_version.as_bytes());
        field(&(flags.len() as u64).to_le_bytes());
        for flag in flags {
            field(flag.as_bytes());
        }
        CacheKey(h.finalize().into())
    }

    /// The 32 bytes of the key.
    pub fn bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Lower-case hex, as used in entry file names.
    pub fn hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// What [`KernelCache::lookup`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup {
    /// A valid entry: the code object.
    Hit(Vec<u8>),
    /// No entry (or no cache).
    Miss,
    /// An entry that must not be used, and why (truncated, corrupt, stale, unreadable).
    Invalid(String),
}

/// Where compiled kernels are kept (or nowhere: [`KernelCache::disabled`]).
#[derive(Clone, Debug)]
pub struct KernelCache {
    dir: Option<PathBuf>,
}

impl KernelCache {
    /// A cache that compiles every time (tests of the compile path).
    pub fn disabled() -> KernelCache {
        KernelCache { dir: None }
    }

    /// A cache in `dir`, created if missing; an error when it cannot be created or written.
    pub fn in_dir(dir: impl Into<PathBuf>) -> Result<KernelCache> {
        let dir = dir.into();
        prepare_dir(&dir).map_err(|message| KernelError::Cache {
            path: dir.display().to_string(),
            message,
        })?;
        Ok(KernelCache { dir: Some(dir) })
    }

    /// The cache the environment asks for (see the module docs).
    pub fn from_env() -> Result<KernelCache> {
        // The process's XDG_CACHE_HOME and HOME place the default folder.
        KernelCache::from_setting(KERNEL_CACHE.read()?, |name| std::env::var_os(name))
    }

    /// As [`KernelCache::from_env`], reading variables through `var` (so tests need not change
    /// the process environment).
    pub fn from_vars(var: impl Fn(&str) -> Option<OsString>) -> Result<KernelCache> {
        let value = var(CACHE_VAR).map(|v| v.to_string_lossy().into_owned());
        let env = knobs::Env::from_pairs(value.as_deref().map(|v| (CACHE_VAR, v)));
        KernelCache::from_setting(KERNEL_CACHE.value(&env)?, var)
    }

    /// The cache `setting` asks for; `var` reads XDG_CACHE_HOME and HOME for the default
    /// folder.
    pub fn from_setting(
        setting: CacheSetting,
        var: impl Fn(&str) -> Option<OsString>,
    ) -> Result<KernelCache> {
        match setting {
            CacheSetting::Off => return Ok(KernelCache::disabled()),
            CacheSetting::Folder(dir) => {
                return match prepare_dir(&dir) {
                    Ok(()) => Ok(KernelCache { dir: Some(dir) }),
                    Err(reason) => Err(KernelError::Env {
                        variable: CACHE_VAR,
                        value: dir.display().to_string(),
                        message: format!(
                            "cannot be used as the kernel cache ({reason}); point it at a \
                             writable folder, or set it to `off`"
                        ),
                    }),
                };
            }
            CacheSetting::Default => {}
        }
        let xdg = var("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .filter(|p| p.is_absolute());
        let home = var("HOME")
            .filter(|h| !h.is_empty())
            .map(|h| PathBuf::from(h).join(".cache"));
        let Some(base) = xdg.or(home) else {
            tracing::warn!(
                "no kernel cache: neither XDG_CACHE_HOME nor HOME is set (set {CACHE_VAR} to a \
                 folder to cache compiled kernels)"
            );
            return Ok(KernelCache::disabled());
        };
        let dir = base.join("hipdecode").join("kernels");
        match prepare_dir(&dir) {
            Ok(()) => Ok(KernelCache { dir: Some(dir) }),
            Err(reason) => {
                tracing::warn!(
                    "no kernel cache: {} is unusable ({reason}); set {CACHE_VAR} to a writable \
                     folder, or to `off` to silence this",
                    dir.display()
                );
                Ok(KernelCache::disabled())
            }
        }
    }

    /// The folder in use, if any.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// The entry file of module `name` under `key`, if the cache is enabled.
    pub fn entry_path(&self, name: &str, key: &CacheKey) -> Option<PathBuf> {
        let safe: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        self.dir
            .as_ref()
            .map(|d| d.join(format!("{safe}-{}.bin", key.hex())))
    }

    /// Reads and checks the entry of `name` under `key`.
    pub fn lookup(&self, name: &str, key: &CacheKey) -> Lookup {
        let Some(path) = self.entry_path(name, key) else {
            return Lookup::Miss;
        };
        match std::fs::read(&path) {
            Ok(bytes) => match decode_entry(&bytes, key) {
                Ok(payload) => Lookup::Hit(payload),
                Err(why) => Lookup::Invalid(why),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Lookup::Miss,
            Err(e) => Lookup::Invalid(format!("unreadable: {e}")),
        }
    }

    /// Writes the entry of `name` under `key` atomically (temporary file, then rename). Does
    /// nothing when the cache is disabled.
    pub fn store(&self, name: &str, key: &CacheKey, payload: &[u8]) -> Result<()> {
        let Some(path) = self.entry_path(name, key) else {
            return Ok(());
        };
        let tmp = temp_path(&path);
        let written = (|| {
            let mut file = std::fs::File::create(&tmp)?;
            file.write_all(&encode_entry(key, payload))?;
            file.sync_all()?;
            drop(file);
            std::fs::rename(&tmp, &path)
        })();
        written.map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            KernelError::Cache {
                path: path.display().to_string(),
                message: format!("cannot write the entry: {e}"),
            }
        })
    }

    /// Removes the entry of `name` under `key` (e.g. a code object the runtime refused to load).
    pub fn invalidate(&self, name: &str, key: &CacheKey) {
        if let Some(path) = self.entry_path(name, key) {
            let _ = std::fs::remove_file(path);
        }
    }

    /// The cached code object of `name` under `key`, or the result of `compile`, which is then
    /// stored. A missing, truncated, corrupt or stale entry is recompiled and rewritten; a
    /// failure to write the cache is logged, not returned (the code object is still good).
    pub fn get_or_compile(
        &self,
        name: &str,
        key: &CacheKey,
        compile: impl FnOnce() -> Result<Vec<u8>>,
    ) -> Result<Vec<u8>> {
        match self.lookup(name, key) {
            Lookup::Hit(payload) => {
                tracing::debug!("kernel cache hit: {name} ({})", key.hex());
                return Ok(payload);
            }
            Lookup::Miss => tracing::debug!("kernel cache miss: {name} ({})", key.hex()),
            Lookup::Invalid(why) => tracing::warn!(
                "kernel cache entry of {name} at {} is not used ({why}); recompiling",
                self.entry_path(name, key)
                    .map(|p| p.display().to_string())
                    .unwrap_or_default()
            ),
        }
        let payload = compile()?;
        if let Err(e) = self.store(name, key, &payload) {
            tracing::warn!("{e}");
        }
        Ok(payload)
    }
}

/// Creates `dir` if needed and checks that a file can be created in it.
fn prepare_dir(dir: &Path) -> std::result::Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create the folder: {e}"))?;
    if !dir.is_dir() {
        return Err("not a folder".to_string());
    }
    let probe = temp_path(&dir.join("probe"));
    std::fs::File::create(&probe).map_err(|e| format!("cannot create files in it: {e}"))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// A temporary name next to `path`, unique within this process and across processes.
fn temp_path(path: &Path) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let file = path
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{file}.tmp-{}-{n}", std::process::id()))
}

/// Header and payload of an entry.
pub fn encode_entry(key: &CacheKey, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(key.bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&Sha256::digest(payload));
    out.extend_from_slice(payload);
    out
}

/// The payload of an entry when every header field checks out, else why not.
fn decode_entry(bytes: &[u8], key: &CacheKey) -> std::result::Result<Vec<u8>, String> {
    if bytes.len() < HEADER_LEN {
        return Err(format!(
            "truncated: {} bytes, shorter than the {HEADER_LEN}-byte header",
            bytes.len()
        ));
    }
    let (header, payload) = bytes.split_at(HEADER_LEN);
    if header[..8] != MAGIC {
        return Err("not a hipdecode kernel cache entry (bad magic)".to_string());
    }
    let version = u32::from_le_bytes(header[8..12].try_into().expect("4 bytes"));
    if version != FORMAT_VERSION {
        return Err(format!(
            "format version {version}, this build reads {FORMAT_VERSION}"
        ));
    }
    if header[12..44] != key.0 {
        return Err("the entry holds another key (stale or misplaced)".to_string());
    }
    let len = u64::from_le_bytes(header[44..52].try_into().expect("8 bytes"));
    if len != payload.len() as u64 {
        return Err(format!(
            "truncated or padded: header says {len} payload bytes, the file holds {}",
            payload.len()
        ));
    }
    if len == 0 {
        return Err("empty code object".to_string());
    }
    if Sha256::digest(payload).as_slice() != &header[52..84] {
        return Err("payload checksum mismatch (corrupt)".to_string());
    }
    Ok(payload.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_changes_with_every_input_and_fields_do_not_run_together() {
        let flags = vec!["-DWARP_SIZE=64".to_string()];
        let base = CacheKey::new("src", "gfx90a", "hiprtc 5.2", &flags);
        assert_eq!(base, CacheKey::new("src", "gfx90a", "hiprtc 5.2", &flags));
        assert_ne!(base, CacheKey::new("src2", "gfx90a", "hiprtc 5.2", &flags));
        assert_ne!(base, CacheKey::new("src", "gfx1030", "hiprtc 5.2", &flags));
        assert_ne!(base, CacheKey::new("src", "gfx90a", "hiprtc 6.0", &flags));
        assert_ne!(
            base,
            CacheKey::new(
                "src",
                "gfx90a",
                "hiprtc 5.2",
                &["-DWARP_SIZE=32".to_string()]
            )
        );
        // "ab" + "c" must not equal "a" + "bc".
        assert_ne!(
            CacheKey::new("ab", "c", "v", &[]),
            CacheKey::new("a", "bc", "v", &[])
        );
        assert_eq!(base.hex().len(), 64);
    }

    #[test]
    fn entry_round_trips_and_every_header_field_is_checked() {
        let key = CacheKey::new("s", "a", "v", &[]);
        let entry = encode_entry(&key, b"code object");
        assert_eq!(entry.len(), HEADER_LEN + 11);
        assert_eq!(decode_entry(&entry, &key).unwrap(), b"code object");
        let mut bad = entry.clone();
        bad[0] ^= 1;
        assert!(decode_entry(&bad, &key).unwrap_err().contains("magic"));
        let mut bad = entry.clone();
        bad[8] = 9;
        assert!(decode_entry(&bad, &key).unwrap_err().contains("version 9"));
        let other = CacheKey::new("s2", "a", "v", &[]);
        assert!(decode_entry(&entry, &other)
            .unwrap_err()
            .contains("another key"));
        assert!(decode_entry(&entry[..entry.len() - 1], &key)
            .unwrap_err()
            .contains("header says 11"));
        assert!(decode_entry(&entry[..10], &key)
            .unwrap_err()
            .contains("truncated"));
        let mut bad = entry;
        *bad.last_mut().unwrap() ^= 0x40;
        assert!(decode_entry(&bad, &key).unwrap_err().contains("checksum"));
    }
}
