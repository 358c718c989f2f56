//! The trace file format: written traces read back to the same events, and every malformed
//! file is an error that names its line and the problem, never a panic.
//!
//! The traces here are made in the tests: a run recorded by the allocator on a simulated
//! device, the generators of `replay_support`, and small hand-written files.

mod replay_support;

use std::sync::Arc;

use proptest::prelude::*;
use replay_support::*;
use rocm_alloc::devices::sim::SimDevice;
use rocm_alloc::trace::{TraceError, TraceFile, TraceRecord, TRACE_VERSION};
use rocm_alloc::{Allocator, AllocatorConfig, StreamId, Tag};

/// A small recorded trace: two streams, a cross-stream use, reused addresses.
fn recorded() -> TraceFile {
    let device = Arc::new(SimDevice::discrete(1 << 30));
    let (s1, s2) = (device.create_stream(), device.create_stream());
    let alloc = Allocator::new(
        device.clone(),
        AllocatorConfig {
            read_env: false,
            trace_capacity: Some(1024),
            ..AllocatorConfig::default()
        },
    )
    .unwrap();
    let w = alloc.alloc(30 << 20, s1, Tag::Weights).unwrap();
    for i in 0..10u64 {
        let a = alloc.alloc(1000 + i * 700, s1, Tag::Activations).unwrap();
        let b = alloc.alloc(4 << 20, s2, Tag::OffloadStaging).unwrap();
        b.record_stream(s1).unwrap();
        drop(a);
        drop(b);
        device.complete_all();
    }
    let raw = alloc.raw_alloc(512, StreamId::DEFAULT, Tag::Other).unwrap();
    alloc.raw_free(raw).unwrap();
    drop(w);
    alloc.trace_file().unwrap()
}

#[test]
fn a_written_trace_reads_back_to_the_same_events() {
    let file = recorded();
    assert!(file.header.complete);
    let kinds = |k: fn(&TraceRecord) -> bool| file.events.iter().filter(|r| k(r)).count();
    assert_eq!(kinds(|r| matches!(r, TraceRecord::Alloc { .. })), 22);
    assert_eq!(kinds(|r| matches!(r, TraceRecord::Free { .. })), 22);
    assert_eq!(kinds(|r| matches!(r, TraceRecord::Use { .. })), 10);
    assert!(kinds(|r| matches!(r, TraceRecord::DeviceAlloc { .. })) >= 3);
    let text = file.to_text();
    assert_eq!(text.lines().count(), file.events.len() + 1);
    let back = TraceFile::parse(&text).unwrap();
    assert_eq!(back, file);
    assert_eq!(
        back.to_text(),
        text,
        "writing what was read gives the same text"
    );
    // A generated trace with repeat lines, too.
    let gen = too_big_16g_trace();
    assert_eq!(TraceFile::parse(&gen.to_text()).unwrap(), gen);
    let chat = chat_8b_trace(&DecodeShape::chat_8b(), false);
    assert_eq!(TraceFile::parse(&chat.to_text()).unwrap(), chat);
    // Through a file on disk.
    let path = std::env::temp_dir().join(format!("hipdecode-trace-{}.jsonl", std::process::id()));
    file.write_path(&path).unwrap();
    let from_disk = TraceFile::read_path(&path);
    std::fs::remove_file(&path).ok();
    assert_eq!(from_disk.unwrap(), file);
}

/// A valid three-event trace to break in various ways: line 2 allocates id 1, line 3 frees
/// it, line 4 allocates id 2.
fn lines() -> Vec<String> {
    let mut g = Gen::new(false);
    let a = g.alloc(4096, Tag::Weights, 0);
    g.free(a);
    g.alloc(8192, Tag::KvCache, 3);
    let file = TraceFile::from_records(synthetic_device(), synthetic_config(), g.lines, None);
    file.to_text().lines().map(String::from).collect()
}

fn read(lines: &[String]) -> Result<TraceFile, TraceError> {
    TraceFile::parse(&lines.join("\n"))
}

/// Reads a trace whose line `n` (1-based) is replaced by `text`.
fn with_line(n: usize, text: &str) -> Result<TraceFile, TraceError> {
    let mut l = lines();
    l[n - 1] = text.to_string();
    read(&l)
}

fn message(r: Result<TraceFile, TraceError>) -> String {
    r.expect_err("a malformed trace is an error").to_string()
}

#[test]
fn the_unbroken_trace_reads() {
    let f = read(&lines()).unwrap();
    assert_eq!(f.events.len(), 3);
}

#[test]
fn empty_and_foreign_files_are_not_traces() {
    assert!(matches!(TraceFile::parse(""), Err(TraceError::Empty)));
    assert!(matches!(TraceFile::parse("\n\n"), Err(TraceError::Empty)));
    let m = message(TraceFile::parse("hello"));
    assert!(m.contains("line 1") && m.contains("not JSON"), "{m}");
    let m = message(TraceFile::parse(
        r#"{"format":"pytorch-snapshot","version":1}"#,
    ));
    assert!(
        m.contains("line 1") && m.contains("pytorch-snapshot"),
        "{m}"
    );
    let m = message(TraceFile::parse("[1,2]"));
    assert!(m.contains("no \"format\" field"), "{m}");
}

#[test]
fn a_version_this_build_does_not_read_is_named() {
    let header = lines()[0].replace("\"version\":1", "\"version\":7");
    let e = with_line(1, &header).unwrap_err();
    assert!(
        matches!(e, TraceError::UnsupportedVersion { found: 7 }),
        "{e}"
    );
    let m = e.to_string();
    assert!(
        m.contains("line 1")
            && m.contains("version 7")
            && m.contains(&format!("version {TRACE_VERSION}")),
        "{m}"
    );
    let header = lines()[0].replace("\"version\":1", "\"version\":\"one\"");
    assert!(message(with_line(1, &header)).contains("\"version\" is missing or not a whole number"));
}

#[test]
fn a_bad_header_is_named() {
    let header = lines()[0].replace("\"events\":3", "\"events\":-3");
    let m = message(with_line(1, &header));
    assert!(m.contains("line 1: bad header"), "{m}");
    let header = lines()[0].replace("\"dropped_events\":0", "\"dropped_events\":5");
    let m = message(with_line(1, &header));
    assert!(
        m.contains("\"complete\" is true but 5 events were dropped"),
        "{m}"
    );
    let header = lines()[0].replace("\"complete\":true", "\"complete\":true,\"colour\":1");
    assert!(message(with_line(1, &header)).contains("colour"));
}

#[test]
fn a_garbled_line_is_named() {
    let m = message(with_line(3, r#"{"ev":"free","t":1000,"id":1"#));
    assert!(m.starts_with("line 3: not a trace event"), "{m}");
    let m = message(with_line(3, "free 1"));
    assert!(m.starts_with("line 3: not a trace event"), "{m}");
    let m = message(with_line(3, r#"{"ev":"dealloc","t":1000,"id":1}"#));
    assert!(m.contains("line 3") && m.contains("dealloc"), "{m}");
    let m = message(with_line(2, &lines()[1].replace("weights", "weighty")));
    assert!(
        m.contains("line 2") && m.contains("unknown tag \"weighty\""),
        "{m}"
    );
    let m = message(with_line(
        2,
        &lines()[1].replace("\"size\":4096", "\"size\":-1"),
    ));
    assert!(m.contains("line 2"), "{m}");
    let m = message(with_line(2, &lines()[1].replace("}", ",\"extra\":1}")));
    assert!(m.contains("line 2") && m.contains("extra"), "{m}");
}

#[test]
fn a_free_without_its_alloc_is_named() {
    let l = lines();
    let e = read(&[l[0].clone(), l[2].clone(), l[3].clone()]).unwrap_err();
    // The header's count no longer matches, but the free is found first.
    assert!(
        matches!(
            e,
            TraceError::WithoutAlloc {
                line: 2,
                what: "free",
                id: 1
            }
        ),
        "{e}"
    );
    assert!(
        e.to_string().contains("line 2: free of allocation 1"),
        "{e}"
    );
    // A double free.
    let e = read(&[
        l[0].replace("\"events\":3", "\"events\":4"),
        l[1].clone(),
        l[2].clone(),
        l[2].replace("1500", "1600"),
        l[3].replace("1500", "1700"),
    ])
    .unwrap_err();
    assert!(matches!(e, TraceError::WithoutAlloc { line: 4, .. }), "{e}");
    // A use of an id that is not live.
    let m = message(with_line(4, r#"{"ev":"use","t":1500,"id":9,"stream":2}"#));
    assert!(m.contains("line 4: use of allocation 9"), "{m}");
}

#[test]
fn event_checks_name_their_line() {
    // Time going back.
    let m = message(with_line(4, &lines()[3].replace("\"t\":1500", "\"t\":10")));
    assert!(
        m.contains("line 4: time 10 ns is before the previous event's 1000 ns"),
        "{m}"
    );
    // An id allocated twice while live.
    let m = message(with_line(
        3,
        &lines()[3]
            .replace("\"id\":2", "\"id\":1")
            .replace("1500", "1000"),
    ));
    assert!(m.contains("line 3") && m.contains("already live"), "{m}");
    // A free that disagrees with its allocation.
    let m = message(with_line(3, &lines()[2].replace("weights", "kv_cache")));
    assert!(
        m.contains("line 3: the free of allocation 1 gives tag kv_cache")
            && m.contains("line 2 has weights"),
        "{m}"
    );
    let m = message(with_line(
        3,
        &lines()[2].replace("\"stream\":0", "\"stream\":4"),
    ));
    assert!(m.contains("gives stream 4"), "{m}");
    // Zero bytes.
    let m = message(with_line(
        2,
        &lines()[1].replace("\"size\":4096", "\"size\":0"),
    ));
    assert!(m.contains("line 2: allocation 1 requests 0 bytes"), "{m}");
}

#[test]
fn a_cut_short_file_is_named() {
    let l = lines();
    let e = read(&l[..3]).unwrap_err();
    assert!(
        matches!(
            e,
            TraceError::CountMismatch {
                expected: 3,
                found: 2,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("cut short"), "{e}");
    // A line cut in the middle.
    let cut = &l[3][..l[3].len() / 2];
    let m = message(with_line(4, cut));
    assert!(m.starts_with("line 4: not a trace event"), "{m}");
    // An empty line between events (at the end they are fine).
    let mut v = l.clone();
    v.insert(2, String::new());
    let m = message(read(&v));
    assert!(
        m.starts_with("line 3: not a trace event (an empty line between events)"),
        "{m}"
    );
    assert!(TraceFile::parse(&format!("{}\n\n\n", l.join("\n"))).is_ok());
    // Invalid UTF-8.
    let mut bytes = l.join("\n").into_bytes();
    bytes.extend_from_slice(b"\n\xff\xfe");
    let e = TraceFile::read(bytes.as_slice()).unwrap_err();
    assert!(matches!(e, TraceError::Io { line: 5, .. }), "{e}");
}

#[test]
fn bad_repeats_are_named() {
    let header =
        |events: usize| lines()[0].replace("\"events\":3", &format!("\"events\":{events}"));
    let l = lines();
    let body = [l[1].clone(), l[2].clone()];
    let case = |repeat: &str| {
        let mut v = vec![header(3)];
        v.extend(body.iter().cloned());
        v.push(repeat.to_string());
        read(&v)
    };
    assert!(case(r#"{"ev":"repeat","t":1500,"lines":2,"times":4}"#).is_ok());
    let m = message(case(r#"{"ev":"repeat","t":1500,"lines":0,"times":4}"#));
    assert!(m.contains("line 4: bad repeat: it repeats 0 lines"), "{m}");
    let m = message(case(r#"{"ev":"repeat","t":1500,"lines":3,"times":4}"#));
    assert!(
        m.contains("line 4: bad repeat: it repeats 3 lines, but 2"),
        "{m}"
    );
    let m = message(case(r#"{"ev":"repeat","t":1500,"lines":2,"times":0}"#));
    assert!(m.contains("\"times\" is 0"), "{m}");
    let m = message(case(r#"{"ev":"repeat","t":100,"lines":2,"times":1}"#));
    assert!(m.contains("before its block's first event"), "{m}");
    let m = message(case(
        r#"{"ev":"repeat","t":1500,"lines":2,"times":18446744073709551615}"#,
    ));
    assert!(m.contains("expands past"), "{m}");
    // Repeating an allocation that the block does not free: the id is allocated again.
    let m = message(read(&[
        header(2),
        l[1].clone(),
        r#"{"ev":"repeat","t":1000,"lines":1,"times":1}"#.to_string(),
    ]));
    assert!(
        m.contains("repetition 1 of the block repeated by line 3")
            && m.contains("line 2: allocation id 1 is already live"),
        "{m}"
    );
    // Blocks that partly overlap: line 5 repeats lines 3-4, line 6 repeats lines 4-5.
    let w = |t: u64| format!(r#"{{"ev":"weights","t":{t},"bytes":1}}"#);
    let r = |t: u64| format!(r#"{{"ev":"repeat","t":{t},"lines":2,"times":1}}"#);
    let m = message(read(&[
        header(5),
        w(500),
        w(1000),
        w(1500),
        r(2000),
        r(4000),
    ]));
    assert!(
        m.contains("line 5: bad repeat: its block (lines 3-4) starts before line 4")
            && m.contains("repeated by line 6"),
        "{m}"
    );
}

#[test]
fn a_free_of_a_lost_allocation_is_allowed_only_in_an_incomplete_trace() {
    let l = lines();
    let header = l[0]
        .replace("\"complete\":true", "\"complete\":false")
        .replace("\"dropped_events\":0", "\"dropped_events\":1")
        .replace("\"events\":3", "\"events\":2");
    let f = read(&[header, l[2].clone(), l[3].clone()]).unwrap();
    assert!(f
        .header
        .incompleteness()
        .unwrap()
        .contains("1 events were dropped"));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Whatever is done to a valid file, reading it returns (a trace or an error); it never
    /// panics.
    #[test]
    fn reading_never_panics(
        cut in 0usize..2000,
        flips in proptest::collection::vec((0usize..2000, any::<u8>()), 0..6),
    ) {
        let mut bytes = too_big_16g_trace().to_text().into_bytes();
        bytes.truncate(bytes.len().min(cut.max(1) * 2));
        for (at, b) in flips {
            if !bytes.is_empty() {
                let i = at % bytes.len();
                bytes[i] = b;
            }
        }
        if let Ok(f) = TraceFile::read(bytes.as_slice()) {
            f.validate().unwrap();
        }
    }

    /// Random lines after a valid header never panic either.
    #[test]
    fn random_event_lines_never_panic(
        events in proptest::collection::vec(
            (0u8..7, 0u64..4, 0u64..2000, 0u64..4, 0u64..3),
            0..20
        ),
    ) {
        let mut text = String::new();
        for (kind, id, t, stream, times) in &events {
            let line = match kind {
                0 => format!(r#"{{"ev":"alloc","t":{t},"id":{id},"size":512,"tag":"other","stream":{stream}}}"#),
                1 => format!(r#"{{"ev":"free","t":{t},"id":{id},"size":512,"tag":"other","stream":{stream}}}"#),
                2 => format!(r#"{{"ev":"use","t":{t},"id":{id},"stream":{stream}}}"#),
                3 => format!(r#"{{"ev":"repeat","t":{t},"lines":{id},"times":{times}}}"#),
                4 => format!(r#"{{"ev":"weights","t":{t},"bytes":{id}}}"#),
                5 => format!(r#"{{"ev":"cache_limit","t":{t},"bytes":{id}}}"#),
                _ => format!(r#"{{"ev":"device_alloc","t":{t},"size":{id}}}"#),
            };
            text.push_str(&line);
            text.push('\n');
        }
        let header = lines()[0].replace("\"events\":3", &format!("\"events\":{}", events.len()));
        if let Ok(f) = TraceFile::parse(&format!("{header}\n{text}")) {
            // A trace that reads also replays, without a panic.
            let r = rocm_alloc::replay::replay(
                &f,
                rocm_alloc::devices::sim::DeviceProfile::Discrete16g,
                rocm_alloc::replay::LimitsMode::None,
            );
            prop_assert!(r.is_ok(), "{:?}", r.err());
        }
    }
}
