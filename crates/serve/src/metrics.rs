//! `/metrics` in Prometheus text: requests, tokens and latencies counted as they happen, and
//! the engine's KV pool and device memory read at each scrape.

use crate::api::FinishReason;
use decode::engine::EngineStats;
use decode::MemoryTag;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};
use std::sync::atomic::AtomicU64;

type Labels = Vec<(&'static str, &'static str)>;

/// Every metric the server exports.
pub struct Metrics {
    registry: Registry,
    pub queued: Gauge,
    pub running: Gauge,
    pub prompt_tokens: Counter,
    pub cached_prompt_tokens: Counter,
    pub generated_tokens: Counter,
    pub ttft: Histogram,
    pub itl: Histogram,
    pub kv_peak_bytes: Histogram,
    finished: Family<Labels, Counter>,
    refused: Family<Labels, Counter>,
    pub failed: Counter,
    pub client_gone: Counter,
    pub deadline_in_queue: Counter,
    pub deadline_running: Counter,
    kv_blocks: Family<Labels, Gauge>,
    kv_block_bytes: Gauge,
    kv_sequence_bytes: Gauge,
    device_bytes: Family<Labels, Gauge>,
    allocator_reserved: Gauge,
    allocator_cached: Gauge,
    /// One series, made when the figure is first known: absent where the driver cannot list
    /// the process, rather than a 0 that reads as a measurement.
    device_process: Family<Labels, Gauge>,
    engine_steps: Family<Labels, Gauge>,
    engine_rows: Family<Labels, Gauge>,
    engine_seconds: Family<Labels, Gauge<f64, AtomicU64>>,
    decode_graphs: Gauge,
    kv_ring_runs_cached: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut m = Metrics {
            registry: Registry::with_prefix("hipdecode"),
            queued: Gauge::default(),
            running: Gauge::default(),
            prompt_tokens: Counter::default(),
            cached_prompt_tokens: Counter::default(),
            generated_tokens: Counter::default(),
            // 1 ms to about 16 s.
            ttft: Histogram::new(exponential_buckets(0.001, 2.0, 15)),
            itl: Histogram::new(exponential_buckets(0.001, 2.0, 15)),
            // 16 KiB to 32 GiB.
            kv_peak_bytes: Histogram::new(exponential_buckets(16384.0, 4.0, 12)),
            finished: Family::default(),
            refused: Family::default(),
            failed: Counter::default(),
            client_gone: Counter::default(),
            deadline_in_queue: Counter::default(),
            deadline_running: Counter::default(),
            kv_blocks: Family::default(),
            kv_block_bytes: Gauge::default(),
            kv_sequence_bytes: Gauge::default(),
            device_bytes: Family::default(),
            allocator_reserved: Gauge::default(),
            allocator_cached: Gauge::default(),
            device_process: Family::default(),
            engine_steps: Family::default(),
            engine_rows: Family::default(),
            engine_seconds: Family::default(),
            decode_graphs: Gauge::default(),
            kv_ring_runs_cached: Gauge::default(),
        };
        let r = &mut m.registry;
        r.register(
            "requests_queued",
            "Requests waiting for a sequence",
            m.queued.clone(),
        );
        r.register(
            "requests_running",
            "Requests holding a sequence",
            m.running.clone(),
        );
        r.register(
            "prompt_tokens",
            "Prompt tokens computed (cached ones not included)",
            m.prompt_tokens.clone(),
        );
        r.register(
            "prompt_tokens_cached",
            "Prompt tokens found in the prefix cache",
            m.cached_prompt_tokens.clone(),
        );
        r.register(
            "generation_tokens",
            "Tokens generated",
            m.generated_tokens.clone(),
        );
        r.register_with_unit(
            "time_to_first_token",
            "From a request's arrival to its first token",
            Unit::Seconds,
            m.ttft.clone(),
        );
        r.register_with_unit(
            "inter_token_latency",
            "Between two tokens of one request",
            Unit::Seconds,
            m.itl.clone(),
        );
        r.register_with_unit(
            "request_kv_peak",
            "KV-pool bytes a request held at its peak",
            Unit::Bytes,
            m.kv_peak_bytes.clone(),
        );
        r.register(
            "requests_finished",
            "Requests answered, by finish reason",
            m.finished.clone(),
        );
        r.register(
            "requests_refused",
            "Requests refused before they ran, by reason",
            m.refused.clone(),
        );
        r.register(
            "requests_failed",
            "Requests that failed while running",
            m.failed.clone(),
        );
        r.register(
            "requests_client_gone",
            "Requests cancelled because the client left or stopped reading",
            m.client_gone.clone(),
        );
        r.register(
            "requests_deadline_queued",
            "Requests dropped at their deadline while queued",
            m.deadline_in_queue.clone(),
        );
        r.register(
            "requests_deadline_running",
            "Requests ended at their deadline while running",
            m.deadline_running.clone(),
        );
        r.register(
            "kv_blocks",
            "KV-pool blocks by state: used (held by running sequences), shared (held by more \
             than one), cached (prefix cache, held by none), free, budget, and backed (with \
             device memory behind them; a pool's memory grows as blocks are handed out)",
            m.kv_blocks.clone(),
        );
        r.register_with_unit(
            "kv_block",
            "Bytes of one KV-pool block",
            Unit::Bytes,
            m.kv_block_bytes.clone(),
        );
        r.register_with_unit(
            "kv_running_sequences",
            "KV-pool bytes the running sequences hold (a shared block counted for each)",
            Unit::Bytes,
            m.kv_sequence_bytes.clone(),
        );
        r.register_with_unit(
            "memory",
            "Bytes in use by purpose (weights, kv_cache, activations, workspace, ...)",
            Unit::Bytes,
            m.device_bytes.clone(),
        );
        r.register_with_unit(
            "allocator_reserved",
            "Device bytes the allocator holds from the runtime",
            Unit::Bytes,
            m.allocator_reserved.clone(),
        );
        r.register_with_unit(
            "allocator_cached",
            "Of those, bytes free in its cache",
            Unit::Bytes,
            m.allocator_cached.clone(),
        );
        r.register_with_unit(
            "device_process",
            "The process's device memory as nvidia-smi or rocm-smi list it, the runtime's \
             context included (absent where the driver cannot list the process)",
            Unit::Bytes,
            m.device_process.clone(),
        );
        r.register(
            "engine_steps",
            "Steps the engine ran, by kind: decode (decode rows only) or prefill (with prompt rows)",
            m.engine_steps.clone(),
        );
        r.register(
            "engine_step_rows",
            "Rows those steps carried",
            m.engine_rows.clone(),
        );
        r.register_with_unit(
            "engine_step",
            "Time those steps took",
            Unit::Seconds,
            m.engine_seconds.clone(),
        );
        r.register(
            "decode_graphs",
            "Decode-step graphs captured: one per bucket of row counts that came up \
             (HIPDECODE_GPU_GRAPH_ROWS), none on the CPU",
            m.decode_graphs.clone(),
        );
        r.register(
            "kv_ring_runs_cached",
            "Sliding-window rings finished sequences left for the prefix cache (free sequence \
             slots' own storage, no memory of their own; 0 on models without window rings)",
            m.kv_ring_runs_cached.clone(),
        );
        m
    }

    pub fn finished(&self, finish: FinishReason) {
        self.finished
            .get_or_create(&vec![("reason", finish.as_str())])
            .inc();
    }

    /// A request refused before it ran; `reason` is a short code (`queue_full`, `invalid`).
    pub fn refused(&self, reason: &'static str) {
        self.refused.get_or_create(&vec![("reason", reason)]).inc();
    }

    /// Reads the engine's books into the gauges.
    pub fn update(&self, stats: &EngineStats) {
        let p = &stats.pool;
        let gauge = |state: &'static str, v: usize| {
            self.kv_blocks
                .get_or_create(&vec![("state", state)])
                .set(v as i64);
        };
        gauge("used", p.in_use);
        gauge("shared", p.shared);
        gauge("cached", p.cached);
        gauge("free", p.budget_blocks.saturating_sub(p.in_use + p.cached));
        gauge("budget", p.budget_blocks);
        gauge("backed", stats.backed_blocks);
        self.kv_block_bytes.set(p.bytes_per_block as i64);
        let held: u64 = stats.sequences.iter().map(|s| s.bytes).sum();
        self.kv_sequence_bytes.set(held as i64);
        for tag in MemoryTag::ALL {
            self.device_bytes
                .get_or_create(&vec![
                    ("tag", tag.name()),
                    ("location", location(&stats.memory.location)),
                ])
                .set(stats.memory.get(tag) as i64);
        }
        for (kind, c) in [
            ("decode", stats.decode_steps),
            ("prefill", stats.prefill_steps),
        ] {
            let label = vec![("kind", kind)];
            self.engine_steps.get_or_create(&label).set(c.steps as i64);
            self.engine_rows.get_or_create(&label).set(c.rows as i64);
            self.engine_seconds.get_or_create(&label).set(c.seconds);
        }
        self.decode_graphs.set(stats.decode_graphs as i64);
        self.kv_ring_runs_cached.set(stats.ring_runs_cached as i64);
        if let Some(d) = &stats.device {
            self.allocator_reserved.set(d.reserved_bytes as i64);
            self.allocator_cached.set(d.cached_bytes as i64);
        }
        if let Some(bytes) = stats.device_process {
            self.device_process
                .get_or_create(&vec![("location", "device")])
                .set(bytes as i64);
        }
    }

    /// The text a scrape gets.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

/// "host" or "device": the label, whatever the device is called.
fn location(location: &str) -> &'static str {
    if location == "host" {
        "host"
    } else {
        "device"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use decode::engine::StepCounters;
    use decode::kv::PoolStats;
    use decode::memory::MemoryReport;

    fn stats(device_process: Option<u64>) -> EngineStats {
        EngineStats {
            pool: PoolStats::default(),
            backed_blocks: 3,
            sequences: Vec::new(),
            waiting: 0,
            ring_runs_cached: 2,
            memory: MemoryReport::default(),
            device: None,
            device_process,
            decode_steps: StepCounters::default(),
            prefill_steps: StepCounters::default(),
            decode_graphs: 5,
        }
    }

    /// The per-process figure is a series only once the driver gave it: a scrape never reads
    /// a 0 that was not measured.
    #[test]
    fn the_per_process_device_memory_shows_only_when_known() {
        let m = Metrics::new();
        m.update(&stats(None));
        let text = m.render();
        assert!(!text.contains("hipdecode_device_process_bytes{"), "{text}");
        m.update(&stats(Some(744 << 20)));
        let text = m.render();
        let want = format!(
            "hipdecode_device_process_bytes{{location=\"device\"}} {}",
            744u64 << 20
        );
        assert!(text.contains(&want), "{want} in:\n{text}");
        let backed = "hipdecode_kv_blocks{state=\"backed\"} 3";
        assert!(text.contains(backed), "{backed} in:\n{text}");
        let graphs = "hipdecode_decode_graphs 5";
        assert!(text.contains("hipdecode_kv_ring_runs_cached 2"), "{text}");
        assert!(text.contains(graphs), "{graphs} in:\n{text}");
    }
}
