//! Hostile and broken inputs: each gives the typed error that names the problem, never a panic.

use gguf_loader::synth::{plan, Preset};
use gguf_loader::writer::Value;
use gguf_loader::{GgmlType, GgufError, GgufFile, GgufWriter};

/// Builds GGUF bytes field by field, without any of the writer's validation.
#[derive(Default)]
struct Raw(Vec<u8>);

impl Raw {
    fn header(version: u32, n_tensors: u64, n_kv: u64) -> Raw {
        let mut r = Raw::default();
        r.bytes(b"GGUF").u32(version).u64(n_tensors).u64(n_kv);
        r
    }
    fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }
    fn str(&mut self, s: &[u8]) -> &mut Self {
        self.u64(s.len() as u64).bytes(s)
    }
    fn kv_u32(&mut self, key: &str, v: u32) -> &mut Self {
        self.str(key.as_bytes()).u32(4).u32(v)
    }
    fn tensor(&mut self, name: &str, dims: &[u64], ty: u32, offset: u64) -> &mut Self {
        self.str(name.as_bytes()).u32(dims.len() as u32);
        for &d in dims {
            self.u64(d);
        }
        self.u32(ty).u64(offset)
    }
    /// Pads to `align` and appends `n` data bytes.
    fn data(&mut self, align: usize, n: usize) -> &mut Self {
        let len = self.0.len().next_multiple_of(align);
        self.0.resize(len + n, 0x11);
        self
    }
    fn open(&self) -> Result<GgufFile, GgufError> {
        GgufFile::from_bytes(self.0.clone())
    }
}

fn small_valid_file() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.add("general.architecture", "llama").unwrap();
    w.add("test.tokens", Value::strings(["a", "bc", "déf"]))
        .unwrap();
    w.add("test.scores", Value::f32s([0.5, -1.0])).unwrap();
    w.add("test.flag", Value::Bool(true)).unwrap();
    w.add_tensor("a", &[32, 2], GgmlType::Q8_0, vec![0; 68])
        .unwrap();
    w.add_tensor("b", &[256], GgmlType::Q4K, vec![0; 144])
        .unwrap();
    w.add_tensor("c", &[3], GgmlType::F32, vec![0; 12]).unwrap();
    w.to_bytes().unwrap()
}

#[test]
fn the_small_valid_file_opens() {
    let f = GgufFile::from_bytes(small_valid_file()).unwrap();
    assert_eq!(f.get_str_array("test.tokens").unwrap(), ["a", "bc", "déf"]);
    assert_eq!(f.get_f32_array("test.scores").unwrap(), [0.5, -1.0]);
    assert!(f.get_bool("test.flag").unwrap());
    assert_eq!(f.tensors().len(), 3);
    assert_eq!(f.tensor_data(f.tensor("b").unwrap()).len(), 144);
}

#[test]
fn truncation_at_every_byte_is_an_error() {
    let bytes = small_valid_file();
    let whole = GgufFile::from_bytes(bytes.clone()).unwrap();
    let data_start = whole.data_start() as usize;
    let data_end = data_start
        + whole
            .tensors()
            .iter()
            .map(|t| t.offset + t.n_bytes)
            .max()
            .unwrap() as usize;
    for cut in 0..bytes.len() {
        match GgufFile::from_bytes(bytes[..cut].to_vec()) {
            // Only the padding after the last tensor was cut: nothing is missing.
            Ok(f) => assert!(
                cut >= data_end && f.tensors().len() == 3,
                "cut at {cut} opened"
            ),
            Err(GgufError::Truncated {
                offset, file_len, ..
            }) => {
                assert!(
                    cut < data_start,
                    "cut {cut}: truncated inside the data section?"
                );
                assert_eq!(file_len, cut as u64);
                assert!(offset <= cut as u64);
            }
            // A count that cannot fit in what is left of a cut file.
            Err(GgufError::CountTooLarge { .. }) => assert!(cut < data_start),
            Err(GgufError::TensorOutOfBounds { file_len, .. }) => {
                assert_eq!(file_len, cut as u64);
                assert!(
                    cut >= data_start - 32,
                    "cut {cut} inside the header gave {file_len}"
                );
            }
            other => panic!("cut at {cut} of {}: {other:?}", bytes.len()),
        }
    }
}

#[test]
fn bad_magic_and_versions() {
    let mut r = Raw::header(3, 0, 0);
    r.0[..4].copy_from_slice(b"GGML");
    assert!(matches!(r.open(), Err(GgufError::BadMagic { found }) if &found == b"GGML"));
    for v in [0, 1, 4, 0xFFFF_FFFF] {
        let e = Raw::header(v, 0, 0).open().unwrap_err();
        assert!(
            matches!(e, GgufError::UnsupportedVersion { version } if version == v),
            "{e}"
        );
        assert!(e.to_string().contains(&v.to_string()));
    }
    let e = Raw::header(3u32.swap_bytes(), 0, 0).open().unwrap_err();
    assert!(matches!(e, GgufError::BigEndian { version: 3 }), "{e}");
    // Version 2 and 3 both read.
    assert_eq!(Raw::header(2, 0, 0).open().unwrap().version(), 2);
}

#[test]
fn absurd_counts_and_lengths_are_rejected_before_allocating() {
    let e = Raw::header(3, 0, u64::MAX).open().unwrap_err();
    assert!(
        matches!(
            e,
            GgufError::CountTooLarge {
                count: u64::MAX,
                ..
            }
        ),
        "{e}"
    );
    let e = Raw::header(3, u64::MAX / 2, 0).open().unwrap_err();
    assert!(matches!(e, GgufError::CountTooLarge { .. }), "{e}");

    // A string whose length does not fit.
    let mut r = Raw::header(3, 0, 1);
    r.u64(u64::MAX).bytes(&[b'x'; 16]);
    let e = r.open().unwrap_err();
    assert!(
        matches!(
            e,
            GgufError::Truncated {
                needed: u64::MAX,
                ..
            }
        ),
        "{e}"
    );

    // An array claiming 2^40 strings in a file of a few dozen bytes.
    let mut r = Raw::header(3, 0, 1);
    r.str(b"k").u32(9).u32(8).u64(1 << 40);
    let e = r.open().unwrap_err();
    assert!(
        matches!(e, GgufError::CountTooLarge { count, .. } if count == 1 << 40),
        "{e}"
    );
    assert!(e.to_string().contains("\"k\""), "{e}");
    // ... and u64::MAX u64s (count * size overflows).
    let mut r = Raw::header(3, 0, 1);
    r.str(b"k").u32(9).u32(10).u64(u64::MAX);
    assert!(matches!(r.open(), Err(GgufError::CountTooLarge { .. })));
}

#[test]
fn unknown_type_ids_are_errors() {
    let mut r = Raw::header(3, 0, 1);
    r.str(b"key").u32(13).u32(0);
    let e = r.open().unwrap_err();
    assert!(
        matches!(e, GgufError::UnknownValueType { id: 13, ref key, .. } if key == "key"),
        "{e}"
    );

    let mut r = Raw::header(3, 0, 1);
    r.str(b"arr").u32(9).u32(99).u64(1);
    assert!(matches!(
        r.open(),
        Err(GgufError::UnknownValueType { id: 99, .. })
    ));

    // A tensor of a type this crate cannot read leaves the file readable: it is indexed (its
    // size bounded by the end of the data), and reading it names it and its type.
    for (id, unsupported) in [(16u32, true), (1000, false), (u32::MAX, false)] {
        let mut r = Raw::header(3, 1, 0);
        r.tensor("w", &[256], id, 0).data(32, 1024);
        let f = r
            .open()
            .expect("a file with an unreadable tensor still opens");
        assert!(f.tensors().is_empty() && f.tensor("w").is_none());
        let u = &f.unreadable_tensors()[0];
        assert_eq!(
            (u.name.as_str(), u.type_id, u.dims.as_slice()),
            ("w", id, &[256u64][..])
        );
        assert_eq!(u.max_bytes, 1024, "bounded by the end of the data");
        let e = f.require_tensor("w").unwrap_err();
        if unsupported {
            assert!(
                matches!(
                    e,
                    GgufError::UnsupportedGgmlType {
                        name: "IQ2_XXS",
                        ..
                    }
                ),
                "{e}"
            );
        } else {
            assert!(matches!(e, GgufError::UnknownGgmlType { .. }), "{e}");
        }
        assert!(e.to_string().contains("\"w\""), "{e}");
    }
    // Beside a readable tensor, the unreadable one runs at most to the next tensor's data,
    // and the readable one reads as usual.
    let mut r = Raw::header(3, 2, 0);
    r.tensor("ids", &[16], 26, 0)
        .tensor("w", &[8], 0, 64)
        .data(32, 96);
    let f = r.open().expect("opens");
    let u = &f.unreadable_tensors()[0];
    assert_eq!((u.type_name, u.max_bytes), (Some("I32"), 64));
    let w = f.require_tensor("w").expect("the readable tensor");
    assert_eq!(f.dequantize_tensor(w).unwrap().len(), 8);
    let e = f.require_tensor("ids").unwrap_err().to_string();
    assert!(e.contains("I32") && e.contains("\"ids\""), "{e}");
    // One that starts past the end of the data is still corrupt.
    let mut r = Raw::header(3, 1, 0);
    r.tensor("far", &[16], 26, 4096).data(32, 64);
    let e = r.open().unwrap_err().to_string();
    assert!(e.contains("far") && e.contains("4096"), "{e}");
    // A bool that is neither 0 nor 1.
    let mut r = Raw::header(3, 0, 1);
    r.str(b"b").u32(7).bytes(&[2]);
    assert!(matches!(r.open(), Err(GgufError::InvalidValue { .. })));
}

#[test]
fn deep_array_nesting_is_bounded() {
    let mut r = Raw::header(3, 0, 1);
    r.str(b"deep").u32(9);
    for _ in 0..100 {
        r.u32(9).u64(1);
    }
    assert!(matches!(r.open(), Err(GgufError::NestingTooDeep { .. })));
}

#[test]
fn non_utf8_strings_are_errors() {
    let mut r = Raw::header(3, 0, 1);
    r.str(b"bad\xffkey").u32(4).u32(1);
    assert!(matches!(r.open(), Err(GgufError::InvalidUtf8 { .. })));

    let mut r = Raw::header(3, 0, 1);
    r.str(b"k").u32(8).str(b"\xc3\x28");
    let e = r.open().unwrap_err();
    assert!(
        matches!(e, GgufError::InvalidUtf8 { .. }) && e.to_string().contains("\"k\""),
        "{e}"
    );

    let mut r = Raw::header(3, 1, 0);
    r.tensor("t\u{0}", &[4], 0, 0);
    r.0[32] = 0xFF; // inside the tensor name
    assert!(matches!(r.open(), Err(GgufError::InvalidUtf8 { .. })));
}

#[test]
fn duplicates_are_errors() {
    let mut r = Raw::header(3, 0, 2);
    r.kv_u32("same", 1).kv_u32("same", 2);
    assert!(matches!(r.open(), Err(GgufError::DuplicateKey { ref key }) if key == "same"));

    let mut r = Raw::header(3, 2, 0);
    r.tensor("t", &[8], 0, 0)
        .tensor("t", &[8], 0, 32)
        .data(32, 64);
    assert!(matches!(r.open(), Err(GgufError::DuplicateTensor { ref name }) if name == "t"));
}

#[test]
fn tensor_ranges_are_checked() {
    // Misaligned offset.
    let mut r = Raw::header(3, 1, 0);
    r.tensor("t", &[8], 0, 4).data(32, 64);
    assert!(matches!(
        r.open(),
        Err(GgufError::MisalignedTensor {
            offset: 4,
            alignment: 32,
            ..
        })
    ));

    // Overlap: two 64-byte tensors 32 bytes apart.
    let mut r = Raw::header(3, 2, 0);
    r.tensor("x", &[16], 0, 0)
        .tensor("y", &[16], 0, 32)
        .data(32, 128);
    let e = r.open().unwrap_err();
    assert!(matches!(e, GgufError::TensorOverlap { .. }), "{e}");

    // Past the end, and offsets whose sum overflows.
    let mut r = Raw::header(3, 1, 0);
    r.tensor("t", &[16], 0, 0).data(32, 63);
    assert!(matches!(r.open(), Err(GgufError::TensorOutOfBounds { .. })));
    let mut r = Raw::header(3, 1, 0);
    r.tensor("t", &[16], 0, u64::MAX - 31).data(32, 64);
    assert!(matches!(r.open(), Err(GgufError::TensorOutOfBounds { .. })));

    // Shapes whose element or byte count overflows, too many dims, ragged blocks.
    for dims in [&[u64::MAX, 2][..], &[1 << 32, 1 << 32, 1 << 32]] {
        let mut r = Raw::header(3, 1, 0);
        r.tensor("t", dims, 0, 0).data(32, 64);
        assert!(
            matches!(r.open(), Err(GgufError::BadTensor { .. })),
            "{dims:?}"
        );
    }
    let mut r = Raw::header(3, 1, 0);
    r.tensor("t", &[1, 1, 1, 1, 1], 0, 0).data(32, 64);
    assert!(matches!(r.open(), Err(GgufError::BadTensor { .. })));
    let mut r = Raw::header(3, 1, 0);
    r.tensor("t", &[100], GgmlType::Q4K.id(), 0).data(32, 1024);
    let e = r.open().unwrap_err();
    assert!(
        e.to_string()
            .contains("not a multiple of the Q4_K block size 256"),
        "{e}"
    );
}

#[test]
fn alignment_must_be_a_power_of_two() {
    for bad in [0u32, 3, 48] {
        let mut r = Raw::header(3, 0, 1);
        r.kv_u32("general.alignment", bad);
        assert!(
            matches!(r.open(), Err(GgufError::BadAlignment { .. })),
            "{bad}"
        );
    }
    let mut r = Raw::header(3, 1, 1);
    r.kv_u32("general.alignment", 64)
        .tensor("t", &[4], 0, 0)
        .data(64, 16);
    let f = r.open().unwrap();
    assert_eq!(f.alignment(), 64);
    assert_eq!(f.data_start() % 64, 0);
}

#[test]
fn typed_accessors_name_the_key() {
    let f = GgufFile::from_bytes(small_valid_file()).unwrap();
    let e = f.get_u32("no.such.key").unwrap_err();
    assert!(matches!(e, GgufError::MissingKey { ref key } if key == "no.such.key"));
    let e = f.get_u32("general.architecture").unwrap_err();
    assert!(
        e.to_string().contains("general.architecture") && e.to_string().contains("string"),
        "{e}"
    );
    let e = f.get_i32_array("test.scores").unwrap_err();
    assert!(
        matches!(
            e,
            GgufError::WrongType {
                expected: "array of i32",
                found: "array of f32",
                ..
            }
        ),
        "{e}"
    );
    // A model description lists the first missing key.
    let e = gguf_loader::ModelConfig::from_gguf(&f).unwrap_err();
    assert!(e.to_string().contains("llama.embedding_length"), "{e}");
}

#[test]
fn dequantize_checks_sizes() {
    let mut out = vec![0f32; 32];
    let e = gguf_loader::dequantize(GgmlType::Q8_0, &[0; 33], &mut out).unwrap_err();
    assert!(
        matches!(
            e,
            GgufError::SizeMismatch {
                expected: 34,
                actual: 33,
                ..
            }
        ),
        "{e}"
    );
    let mut out = vec![0f32; 31];
    assert!(gguf_loader::dequantize(GgmlType::Q8_0, &[0; 34], &mut out).is_err());
    let mut out = vec![0f32; 256];
    assert!(matches!(
        gguf_loader::dequantize(GgmlType::Q8K, &[0; 292], &mut out),
        Err(GgufError::DequantUnsupported { ty: "Q8_K" })
    ));
}

/// The writer's output is byte-identical whether streamed to disk or built in memory, and a
/// tensor whose data has the wrong size is refused.
#[test]
fn writer_checks_and_agrees_with_itself() {
    let bytes = small_valid_file();
    let w = plan(Preset::TinyGemma3, 1).unwrap();
    assert!(
        w.to_bytes().is_err(),
        "planned tensors have no data in memory"
    );
    let mut w = GgufWriter::new();
    let e = w
        .add_tensor("t", &[32], GgmlType::Q8_0, vec![0; 33])
        .unwrap_err();
    assert!(matches!(e, GgufError::SizeMismatch { .. }));
    w.add_tensor("t", &[32], GgmlType::Q8_0, vec![0; 34])
        .unwrap();
    assert!(matches!(
        w.add("k", Value::U32(1))
            .and_then(|_| w.add("k", Value::U32(2))),
        Err(GgufError::DuplicateKey { .. })
    ));
    assert!(matches!(
        w.add_tensor("t", &[32], GgmlType::Q8_0, vec![0; 34]),
        Err(GgufError::DuplicateTensor { .. })
    ));
    let path = std::env::temp_dir().join(format!("gguf-loader-writer-{}.gguf", std::process::id()));
    let mut w2 = GgufWriter::new();
    w2.add("general.architecture", "llama").unwrap();
    w2.add("test.tokens", Value::strings(["a", "bc", "déf"]))
        .unwrap();
    w2.add("test.scores", Value::f32s([0.5, -1.0])).unwrap();
    w2.add("test.flag", Value::Bool(true)).unwrap();
    w2.add_tensor("a", &[32, 2], GgmlType::Q8_0, vec![0; 68])
        .unwrap();
    w2.add_tensor("b", &[256], GgmlType::Q4K, vec![0; 144])
        .unwrap();
    w2.add_tensor("c", &[3], GgmlType::F32, vec![0; 12])
        .unwrap();
    w2.write_file(&path).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
    assert_eq!(w2.file_size(), bytes.len() as u64);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn missing_empty_and_non_regular_files_each_get_their_own_error() {
    let e = GgufFile::open("/nonexistent/model.gguf").unwrap_err();
    assert!(matches!(e, GgufError::Io { .. }) && e.to_string().contains("/nonexistent/model.gguf"));
    let path = std::env::temp_dir().join(format!("gguf-loader-empty-{}.gguf", std::process::id()));
    std::fs::write(&path, b"").unwrap();
    let e = GgufFile::open(&path).unwrap_err();
    assert!(matches!(e, GgufError::EmptyFile { .. }), "{e}");
    assert!(e.to_string().contains("is empty (0 bytes)"), "{e}");
    std::fs::remove_file(&path).unwrap();
    let dir = std::env::temp_dir();
    let e = GgufFile::open(&dir).unwrap_err().to_string();
    assert!(e.contains("is a directory, not a GGUF file"), "{e}");
    #[cfg(unix)]
    {
        let e = GgufFile::open("/dev/zero").unwrap_err().to_string();
        assert!(e.contains("is a device file"), "{e}");
        // A FIFO with no writer: opening it would block; it is refused first.
        let fifo = dir.join(format!("gguf-loader-fifo-{}", std::process::id()));
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if made.is_ok_and(|s| s.success()) {
            let e = GgufFile::open(&fifo).unwrap_err().to_string();
            assert!(e.contains("a named pipe (FIFO)"), "{e}");
            std::fs::remove_file(&fifo).ok();
        }
    }
}

#[test]
fn string_arrays_validate_each_element() {
    // Valid: multibyte text and lengths of 128 and more (length bytes >= 0x80).
    let long = "é".repeat(100);
    let mut r = Raw::header(3, 0, 1);
    r.str(b"k")
        .u32(9)
        .u32(8)
        .u64(3)
        .str("añb".as_bytes())
        .str(long.as_bytes())
        .str(b"");
    let f = r.open().unwrap();
    assert_eq!(f.get_str_array("k").unwrap(), ["añb", long.as_str(), ""]);

    // An invalid byte inside the third element: the error names the element and its offset.
    let mut r = Raw::header(3, 0, 1);
    r.str(b"k")
        .u32(9)
        .u32(8)
        .u64(3)
        .str(b"ok")
        .str(b"fine")
        .str(b"b\xffd");
    let bad_offset = r.0.len() - 3; // where the element starts
    let e = r.open().unwrap_err();
    assert!(
        matches!(e, GgufError::InvalidUtf8 { ref what, offset } if what.contains("element 2") && offset == bad_offset as u64),
        "{e}"
    );

    // A lone lead byte at the end of one element followed by a length byte of 0xA9 makes the
    // region as a whole valid UTF-8 ("\xc3\xa9" is 'é'); the element itself is not.
    let mut r = Raw::header(3, 0, 1);
    r.str(b"k")
        .u32(9)
        .u32(8)
        .u64(2)
        .str(b"\xc3")
        .str(&[b'a'; 0xA9]);
    let e = r.open().unwrap_err();
    assert!(
        matches!(e, GgufError::InvalidUtf8 { ref what, .. } if what.contains("element 0")),
        "{e}"
    );
}
