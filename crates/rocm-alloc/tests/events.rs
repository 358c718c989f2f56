//! The allocator's growth and its out-of-memory reports are `tracing` events, so
//! `RUST_LOG=debug` (or `hipdecode -vv`) shows them.

use rocm_alloc::devices::sim::SimDevice;
use rocm_alloc::{AllocError, Allocator, AllocatorConfig, StreamId, Tag};
use std::sync::{Arc, Mutex};

/// A log writer into a shared buffer.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn growth_is_a_debug_event_and_an_oom_an_info_event_with_its_report() {
    let log = Captured::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let oom = tracing::subscriber::with_default(subscriber, || {
        let device = Arc::new(SimDevice::discrete(64 << 20));
        let config = AllocatorConfig {
            read_env: false,
            ..Default::default()
        };
        let alloc = Allocator::new(device, config).unwrap();
        let kv = alloc
            .alloc(4 << 20, StreamId::DEFAULT, Tag::KvCache)
            .unwrap();
        let too_big = alloc.alloc(1 << 30, StreamId::DEFAULT, Tag::Weights);
        drop(kv);
        too_big
    });
    let text = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    assert!(matches!(oom, Err(AllocError::OutOfMemory(_))), "{oom:?}");
    let grew = text
        .lines()
        .find(|l| l.contains("allocator grew by a segment"));
    assert!(grew.is_some_and(|l| l.contains("DEBUG")), "{text}");
    let reported = text.lines().find(|l| l.contains("INFO"));
    assert!(
        reported.is_some_and(|l| l.contains("1.00 GiB") || l.contains("1 GiB")),
        "{text}"
    );
}
