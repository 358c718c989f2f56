//! The kernel disk cache, without a GPU: a fake compile closure counts how often the cache
//! falls back to compiling.

use rocm_kernels::cache::{encode_entry, CacheKey, KernelCache, Lookup, CACHE_VAR, HEADER_LEN};
use rocm_kernels::KernelError;
use std::cell::Cell;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// A fresh, empty folder for one test (removed when dropped).
struct TempDir(PathBuf);

impl TempDir {
    fn new(test: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!(
            "hipdecode-cache-test-{test}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        TempDir(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn key(n: u32) -> CacheKey {
    CacheKey::new(
        &format!("kernel source {n}"),
        "gfx90a",
        "hiprtc 5.2",
        &["-DWARP_SIZE=64".to_string()],
    )
}

/// A compile closure that counts its calls and returns `payload`.
fn counting<'a>(
    calls: &'a Cell<u32>,
    payload: &'a [u8],
) -> impl Fn() -> rocm_kernels::Result<Vec<u8>> + 'a {
    move || {
        calls.set(calls.get() + 1);
        Ok(payload.to_vec())
    }
}

#[test]
fn a_miss_compiles_and_stores_then_a_hit_does_not_compile() {
    let dir = TempDir::new("hit");
    let cache = KernelCache::in_dir(dir.path()).unwrap();
    let calls = Cell::new(0);
    let k = key(1);
    assert_eq!(cache.lookup("norm", &k), Lookup::Miss);
    let got = cache
        .get_or_compile("norm", &k, counting(&calls, b"code v1"))
        .unwrap();
    assert_eq!((got.as_slice(), calls.get()), (&b"code v1"[..], 1));
    let got = cache
        .get_or_compile("norm", &k, counting(&calls, b"other"))
        .unwrap();
    assert_eq!(
        (got.as_slice(), calls.get()),
        (&b"code v1"[..], 1),
        "second call must hit"
    );
    // Another key (another source, arch, compiler or flag) is another entry.
    let got = cache
        .get_or_compile("norm", &key(2), counting(&calls, b"code v2"))
        .unwrap();
    assert_eq!((got.as_slice(), calls.get()), (&b"code v2"[..], 2));
    // A fresh cache object over the same folder (another process) hits too.
    let again = KernelCache::in_dir(dir.path()).unwrap();
    assert_eq!(again.lookup("norm", &k), Lookup::Hit(b"code v1".to_vec()));
    // Writes leave no temporary files behind.
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(
        names
            .iter()
            .all(|n| n.starts_with("norm-") && n.ends_with(".bin")),
        "{names:?}"
    );
}

/// Damages the stored entry of `k` with `damage`, then checks that the entry is refused with a
/// reason containing `why`, recompiled once, and rewritten so that the next lookup hits.
fn damaged_entry_is_recompiled(test: &str, damage: impl Fn(&Path), why: &str) {
    let dir = TempDir::new(test);
    let cache = KernelCache::in_dir(dir.path()).unwrap();
    let calls = Cell::new(0);
    let k = key(7);
    cache
        .get_or_compile("sampling", &k, counting(&calls, b"good code object"))
        .unwrap();
    let path = cache.entry_path("sampling", &k).unwrap();
    damage(&path);
    match cache.lookup("sampling", &k) {
        Lookup::Invalid(reason) => assert!(reason.contains(why), "{test}: {reason}"),
        other => panic!("{test}: damaged entry gave {other:?}"),
    }
    let got = cache
        .get_or_compile("sampling", &k, counting(&calls, b"good code object"))
        .unwrap();
    assert_eq!(got, b"good code object");
    assert_eq!(
        calls.get(),
        2,
        "{test}: the damaged entry must be recompiled"
    );
    assert_eq!(
        cache.lookup("sampling", &k),
        Lookup::Hit(b"good code object".to_vec()),
        "{test}: the entry must be rewritten"
    );
}

#[test]
fn a_corrupt_payload_byte_is_recompiled() {
    damaged_entry_is_recompiled(
        "corrupt",
        |p| {
            let mut bytes = std::fs::read(p).unwrap();
            bytes[HEADER_LEN + 3] ^= 0x10;
            std::fs::write(p, bytes).unwrap();
        },
        "checksum",
    );
}

#[test]
fn a_truncated_entry_is_recompiled() {
    damaged_entry_is_recompiled(
        "truncated",
        |p| {
            let bytes = std::fs::read(p).unwrap();
            std::fs::write(p, &bytes[..bytes.len() - 5]).unwrap();
        },
        "truncated",
    );
    damaged_entry_is_recompiled(
        "truncated_header",
        |p| {
            let bytes = std::fs::read(p).unwrap();
            std::fs::write(p, &bytes[..20]).unwrap();
        },
        "header",
    );
}

#[test]
fn an_entry_of_another_key_or_format_is_recompiled() {
    damaged_entry_is_recompiled(
        "wrong_key",
        |p| std::fs::write(p, encode_entry(&key(8), b"code of another key")).unwrap(),
        "another key",
    );
    damaged_entry_is_recompiled(
        "stale_version",
        |p| {
            let mut bytes = std::fs::read(p).unwrap();
            bytes[8] = bytes[8].wrapping_add(1);
            std::fs::write(p, bytes).unwrap();
        },
        "format version",
    );
    damaged_entry_is_recompiled(
        "bad_magic",
        |p| {
            let mut bytes = std::fs::read(p).unwrap();
            bytes[..8].copy_from_slice(b"ELF\0\0\0\0\0");
            std::fs::write(p, bytes).unwrap();
        },
        "magic",
    );
}

#[test]
fn a_compile_error_is_returned_and_nothing_is_stored() {
    let dir = TempDir::new("compile_error");
    let cache = KernelCache::in_dir(dir.path()).unwrap();
    let k = key(3);
    let err = cache
        .get_or_compile("norm", &k, || {
            Err(KernelError::Shape {
                op: "fake compile",
                message: "syntax error".to_string(),
            })
        })
        .unwrap_err();
    assert!(err.to_string().contains("syntax error"), "{err}");
    assert_eq!(cache.lookup("norm", &k), Lookup::Miss);
}

#[test]
fn a_disabled_cache_compiles_every_time() {
    let cache = KernelCache::disabled();
    assert!(cache.dir().is_none());
    let calls = Cell::new(0);
    for _ in 0..3 {
        cache
            .get_or_compile("norm", &key(1), counting(&calls, b"x"))
            .unwrap();
    }
    assert_eq!(calls.get(), 3);
}

fn vars<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<OsString> + 'a {
    move |name| {
        pairs
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| OsString::from(v))
    }
}

#[test]
fn the_folder_comes_from_the_variable_then_xdg_then_home() {
    let dir = TempDir::new("env");
    let base = dir.path().to_str().unwrap();
    let explicit = format!("{base}/explicit");
    let cache = KernelCache::from_vars(vars(&[(CACHE_VAR, &explicit), ("HOME", base)])).unwrap();
    assert_eq!(cache.dir(), Some(Path::new(&explicit)));
    assert!(Path::new(&explicit).is_dir(), "the folder is created");

    let off = KernelCache::from_vars(vars(&[(CACHE_VAR, "off"), ("HOME", base)])).unwrap();
    assert!(off.dir().is_none());

    let xdg = format!("{base}/xdg");
    let cache = KernelCache::from_vars(vars(&[("XDG_CACHE_HOME", &xdg), ("HOME", base)])).unwrap();
    assert_eq!(
        cache.dir(),
        Some(Path::new(&xdg).join("hipdecode/kernels").as_path())
    );

    // A relative XDG_CACHE_HOME is ignored, as the XDG spec says.
    let cache =
        KernelCache::from_vars(vars(&[("XDG_CACHE_HOME", "rel/dir"), ("HOME", base)])).unwrap();
    assert_eq!(
        cache.dir(),
        Some(Path::new(base).join(".cache/hipdecode/kernels").as_path())
    );

    let none = KernelCache::from_vars(vars(&[])).unwrap();
    assert!(none.dir().is_none(), "no HOME: no cache, a warning");
}

#[test]
fn bad_variable_values_are_errors_naming_the_variable() {
    // Empty is unset, as for every knob: the default folder.
    let home = TempDir::new("empty_env");
    let base = home.path().to_str().unwrap();
    let cache = KernelCache::from_vars(vars(&[(CACHE_VAR, ""), ("HOME", base)])).unwrap();
    assert_eq!(
        cache.dir(),
        Some(Path::new(base).join(".cache/hipdecode/kernels").as_path())
    );
    // A regular file where the folder should be.
    let dir = TempDir::new("bad_env");
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"not a folder").unwrap();
    let value = file.to_str().unwrap().to_string();
    let err = KernelCache::from_vars(vars(&[(CACHE_VAR, &value)])).expect_err("file");
    let msg = err.to_string();
    assert!(msg.contains(CACHE_VAR) && msg.contains(&value), "{msg}");
    // A folder below that file cannot be created either.
    let below = format!("{value}/kernels");
    let err = KernelCache::from_vars(vars(&[(CACHE_VAR, &below)])).expect_err("below a file");
    assert!(err.to_string().contains(CACHE_VAR), "{err}");
    // in_dir reports the path.
    let err = KernelCache::in_dir(&file).expect_err("in_dir on a file");
    assert!(err.to_string().contains(&value), "{err}");
}
