//! Bytes per tag over the run, for `--svg`: a sample at every phase boundary and after every
//! forward call, and a labelled marker where each phase begins.

use decode::memory::{MemoryReport, MemoryTag};
use std::time::Instant;

/// Bytes per tag at one moment.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// Seconds since the timeline started.
    pub t: f64,
    /// In [`MemoryTag::ALL`] order.
    pub bytes: [u64; MemoryTag::COUNT],
}

/// Where a phase begins.
#[derive(Clone, Debug, PartialEq)]
pub struct Marker {
    pub t: f64,
    pub label: String,
}

/// Samples and markers in time order.
#[derive(Clone, Debug)]
pub struct Timeline {
    start: Instant,
    pub samples: Vec<Sample>,
    pub markers: Vec<Marker>,
}

impl Default for Timeline {
    fn default() -> Self {
        Timeline::new()
    }
}

impl Timeline {
    pub fn new() -> Timeline {
        Timeline {
            start: Instant::now(),
            samples: Vec::new(),
            markers: Vec::new(),
        }
    }

    fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// Records a backend's per-tag bytes now. `Model::memory` reads counters only (no device
    /// call), so this is cheap enough to do after every token.
    pub fn sample(&mut self, report: &MemoryReport) {
        let t = self.now();
        self.push(t, report.bytes);
    }

    /// Records a phase boundary now.
    pub fn mark(&mut self, label: impl Into<String>) {
        let t = self.now();
        self.markers.push(Marker {
            t,
            label: label.into(),
        });
    }

    /// Adds a sample at a given time (tests, and replaying recorded data).
    pub fn push(&mut self, t: f64, bytes: [u64; MemoryTag::COUNT]) {
        self.samples.push(Sample { t, bytes });
    }

    /// The tags that hold bytes in some sample, in [`MemoryTag::ALL`] order.
    pub fn tags_used(&self) -> Vec<MemoryTag> {
        MemoryTag::ALL
            .into_iter()
            .filter(|t| self.samples.iter().any(|s| s.bytes[t.index()] > 0))
            .collect()
    }

    /// The end of the timeline in seconds (last sample or marker).
    pub fn end(&self) -> f64 {
        let last_sample = self.samples.iter().map(|s| s.t).fold(0.0, f64::max);
        self.markers.iter().map(|m| m.t).fold(last_sample, f64::max)
    }

    /// The largest total over all tags of one sample.
    pub fn max_total(&self) -> u64 {
        self.samples
            .iter()
            .map(|s| s.bytes.iter().sum::<u64>())
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_and_markers_are_in_time_order_and_tags_used_skips_empty_ones() {
        let mut tl = Timeline::new();
        tl.mark("load");
        let mut r = MemoryReport::default();
        tl.sample(&r);
        r.add(MemoryTag::Weights, 100);
        r.add(MemoryTag::KvCache, 20);
        tl.sample(&r);
        assert_eq!(tl.samples.len(), 2);
        assert!(tl.samples[1].t >= tl.samples[0].t && tl.samples[0].t >= tl.markers[0].t);
        assert_eq!(tl.tags_used(), vec![MemoryTag::Weights, MemoryTag::KvCache]);
        assert_eq!(tl.max_total(), 120);
        assert!(tl.end() >= tl.samples[1].t);
    }
}
