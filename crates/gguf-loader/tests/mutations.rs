//! Property test: truncated and mutated real and synthetic files never panic (bounded cases,
//! quick in CI; the cargo-fuzz target in `fuzz/` runs the same harness without bounds).

use gguf_loader::fuzzing::exercise;
use gguf_loader::paths::{gemma3_270m_path, require_models};
use gguf_loader::synth::{write_preset, Preset};
use gguf_loader::GgufFile;
use proptest::prelude::*;
use std::sync::OnceLock;

/// Base images and where their headers end (mutations favour the header).
fn bases() -> &'static Vec<(Vec<u8>, usize)> {
    static BASES: OnceLock<Vec<(Vec<u8>, usize)>> = OnceLock::new();
    BASES.get_or_init(|| {
        let mut out = Vec::new();
        for preset in [Preset::TinyQwen3Moe, Preset::TinyGemma3] {
            let path = std::env::temp_dir().join(format!(
                "gguf-loader-mut-{}-{}.gguf",
                preset.name(),
                std::process::id()
            ));
            write_preset(preset, &path, 9).unwrap();
            let bytes = std::fs::read(&path).unwrap();
            std::fs::remove_file(&path).unwrap();
            let header = GgufFile::from_bytes(bytes.clone()).unwrap().data_start() as usize;
            out.push((bytes, header));
        }
        // The real file's header and its first tensors (the whole file would make each case
        // copy 253 MB); tensors past the cut are then out of bounds, which is one more error path.
        let real = gemma3_270m_path();
        if real.exists() {
            let f = GgufFile::open(&real).unwrap();
            let header = f.data_start() as usize;
            let bytes = std::fs::read(&real).unwrap();
            out.push((bytes[..header + (1 << 16)].to_vec(), header));
        } else {
            assert!(
                !require_models(),
                "HIPDECODE_REQUIRE_MODELS=1 but {} is missing",
                real.display()
            );
            eprintln!("mutations: the real Gemma file is absent; mutating synthetic files only");
        }
        out
    })
}

#[derive(Debug, Clone)]
enum Mutation {
    /// Set the byte at a position (as a fraction of the header or of the file) to a value.
    Byte { at: f64, in_header: bool, value: u8 },
    /// Overwrite 8 bytes with a little-endian u64 (sizes, counts, offsets live in u64s).
    Word {
        at: f64,
        in_header: bool,
        value: u64,
    },
    /// Cut the file.
    Truncate { at: f64 },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let word = prop_oneof![
        Just(0u64),
        Just(1),
        Just(u64::MAX),
        Just(1 << 32),
        Just(i64::MAX as u64 + 1),
        any::<u64>(),
        0u64..64
    ];
    prop_oneof![
        (0.0..1.0f64, prop::bool::weighted(0.8), any::<u8>()).prop_map(|(at, in_header, value)| {
            Mutation::Byte {
                at,
                in_header,
                value,
            }
        }),
        (0.0..1.0f64, prop::bool::weighted(0.8), word).prop_map(|(at, in_header, value)| {
            Mutation::Word {
                at,
                in_header,
                value,
            }
        }),
        (0.0..1.0f64).prop_map(|at| Mutation::Truncate { at }),
    ]
}

fn apply(bytes: &mut Vec<u8>, header: usize, m: &Mutation) {
    let pos = |at: f64, in_header: bool, len: usize| {
        let span = if in_header { header.min(len) } else { len };
        ((at * span as f64) as usize).min(len.saturating_sub(1))
    };
    match *m {
        Mutation::Byte {
            at,
            in_header,
            value,
        } => {
            let p = pos(at, in_header, bytes.len());
            if let Some(b) = bytes.get_mut(p) {
                *b = value;
            }
        }
        Mutation::Word {
            at,
            in_header,
            value,
        } => {
            let p = pos(at, in_header, bytes.len());
            for (i, b) in value.to_le_bytes().into_iter().enumerate() {
                if let Some(slot) = bytes.get_mut(p + i) {
                    *slot = b;
                }
            }
        }
        Mutation::Truncate { at } => {
            let keep = (at * bytes.len() as f64) as usize;
            bytes.truncate(keep);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn mutated_files_never_panic(base in 0usize..3, mutations in prop::collection::vec(mutation(), 1..4)) {
        let bases = bases();
        let (original, header) = &bases[base % bases.len()];
        let mut bytes = original.clone();
        for m in &mutations {
            apply(&mut bytes, *header, m);
        }
        // Any outcome but a panic is acceptable; opened files are used in full by `exercise`.
        exercise(&bytes);
    }
}

#[test]
fn unmutated_bases_open() {
    let bases = bases();
    for (bytes, _) in &bases[..2] {
        assert!(exercise(bytes));
    }
    if let Some((prefix, _)) = bases.get(2) {
        let e = GgufFile::from_bytes(prefix.clone()).unwrap_err();
        assert!(
            matches!(e, gguf_loader::GgufError::TensorOutOfBounds { .. }),
            "{e}"
        );
    }
}
