//! The measurement, as llama-bench does it: a pp test is one prompt from an empty context, a
//! tg test is single-token steps from an empty context, each repeated after unmeasured
//! warm-up runs, one tokens-per-second figure per repetition. With a depth (`-d N`, as
//! llama-bench's) each repetition first fills the context with N tokens, untimed, and the
//! test runs after them: the speed at that much context. Memory is read at the end of
//! each phase (load, prefill, decode).

use crate::model_info::ModelInfo;
use crate::phase_memory::{Phase, PhaseMemory, Window};
use crate::run_setup::{DeviceLabel, RunSetup};
use crate::stats::{summarize, Summary};
use crate::timeline::Timeline;
use crate::{process_memory, reset_peak_rss};
use anyhow::{bail, Context, Result};
use decode::backend::Backend;
use decode::context::ContextOptions;
use decode::memory::{MemoryReport, MemoryTag};
use decode::session::Session;
use decode::GgufFile;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// What to run.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Prompt tokens of the pp tests, one test each (0: none).
    pub n_prompt: Vec<usize>,
    /// Generated tokens of the tg tests, one test each (0: none).
    pub n_gen: Vec<usize>,
    /// Tokens of context each repetition prefills, untimed, before its test: every test runs
    /// at each (0: an empty context).
    pub n_depth: Vec<usize>,
    /// KV cache positions; `None` (or fewer) means the largest depth, prompt and generation
    /// together, plus one.
    pub context: Option<usize>,
    pub repetitions: usize,
    pub warmup: usize,
    /// The most tokens one GPU step carries (the model's prefill chunk).
    pub max_batch: usize,
}

impl Plan {
    /// KV positions the tests need: the depth, the prompt and the generated tokens, and one
    /// spare, as llama-bench sizes its context.
    pub fn positions_needed(&self) -> usize {
        most(&self.n_depth) + most(&self.n_prompt) + most(&self.n_gen) + 1
    }

    /// The context the model is loaded with: what the tests need, or `--ctx` if larger.
    pub fn context(&self) -> usize {
        self.positions_needed().max(self.context.unwrap_or(0))
    }

    /// The most rows of a step: the longest prompt prefilled (the test's or the depth's), up
    /// to the model's prefill chunk.
    pub fn step_rows(&self) -> usize {
        most(&self.n_prompt)
            .max(most(&self.n_depth))
            .clamp(1, self.max_batch.max(1))
    }

    /// The depths the tests run at; an empty context when none is given.
    fn depths(&self) -> Vec<usize> {
        if self.n_depth.is_empty() {
            vec![0]
        } else {
            self.n_depth.clone()
        }
    }
}

fn most(values: &[usize]) -> usize {
    values.iter().copied().max().unwrap_or(0)
}

/// Which test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TestKind {
    Pp,
    Tg,
}

/// One test's results.
#[derive(Clone, Debug, PartialEq)]
pub struct TestResult {
    pub kind: TestKind,
    /// Tokens per repetition (prompt or generated).
    pub tokens: usize,
    /// Tokens of context before the test (`-d`).
    pub depth: usize,
    /// Tokens per second of each measured repetition, in run order.
    pub samples: Vec<f64>,
    pub summary: Summary,
    /// When the test's first run started, UTC, as llama-bench writes it (`2026-12-06T02:05:01Z`).
    pub started: String,
}

impl TestResult {
    /// `pp512`, `tg128`, and after a depth `tg64 @ d4096` (llama-bench's names).
    pub fn name(&self) -> String {
        let prefix = match self.kind {
            TestKind::Pp => "pp",
            TestKind::Tg => "tg",
        };
        match self.depth {
            0 => format!("{prefix}{}", self.tokens),
            d => format!("{prefix}{} @ d{d}", self.tokens),
        }
    }

    /// The phase whose memory goes with this test.
    pub fn phase(&self) -> Phase {
        match self.kind {
            TestKind::Pp => Phase::Prefill,
            TestKind::Tg => Phase::Decode,
        }
    }
}

/// Everything measured on one model.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelReport {
    pub info: ModelInfo,
    pub backend: String,
    /// The run's settings in llama-bench's terms (its JSON fields).
    pub setup: RunSetup,
    pub warmup: usize,
    pub tests: Vec<TestResult>,
    /// Load first, then prefill and decode for the tests that ran.
    pub memory: Vec<PhaseMemory>,
}

impl ModelReport {
    pub fn phase(&self, phase: Phase) -> Option<&PhaseMemory> {
        self.memory.iter().find(|m| m.phase == phase)
    }
}

/// A fixed, varied token sequence; the speed does not depend on which ids they are.
pub fn prompt_tokens(n: usize, vocab: usize) -> Vec<u32> {
    let vocab = vocab.max(1) as u64;
    (0..n as u64)
        .map(|i| ((i.wrapping_mul(2_654_435_761) >> 7) % vocab) as u32)
        .collect()
}

/// Tokens per second; an error rather than infinity for a zero duration.
fn rate(tokens: usize, seconds: f64) -> Result<f64> {
    if seconds > 0.0 {
        Ok(tokens as f64 / seconds)
    } else {
        bail!("a run of {tokens} tokens took no measurable time")
    }
}

/// The per-phase bookkeeping: the timeline, and on the host the most each tag held at the
/// moments looked at.
struct Recorder<'a> {
    timeline: Option<&'a mut Timeline>,
    model_name: String,
    seen_max: [u64; MemoryTag::COUNT],
}

impl Recorder<'_> {
    /// Starts a phase: a new window for the RSS peak and the host tag maxima, a marker.
    fn begin(&mut self, phase: Phase, now: &MemoryReport) -> Window {
        self.seen_max = [0; MemoryTag::COUNT];
        let rss_window = if reset_peak_rss() {
            Window::Phase
        } else {
            Window::Process
        };
        if let Some(tl) = self.timeline.as_deref_mut() {
            tl.mark(format!("{} {}", self.model_name, phase.name()));
        }
        self.observe(now);
        rss_window
    }

    /// A look at the per-tag bytes: a timeline sample and the host maxima.
    fn observe(&mut self, now: &MemoryReport) {
        for (m, &b) in self.seen_max.iter_mut().zip(&now.bytes) {
            *m = (*m).max(b);
        }
        if let Some(tl) = self.timeline.as_deref_mut() {
            tl.sample(now);
        }
    }

    /// Whether to look after every forward call (only for a timeline: it is the one reader).
    fn per_call(&self) -> bool {
        self.timeline.is_some()
    }

    /// Ends a phase: the memory report, from the device counters where the backend has them.
    fn end<B: Backend>(
        &mut self,
        model: &Session<B>,
        phase: Phase,
        device_window: Window,
        rss_window: Window,
    ) -> Result<PhaseMemory> {
        let now = model.memory();
        self.observe(&now);
        let mut m = match model.backend().device_memory() {
            Some(d) => {
                let d =
                    d.with_context(|| format!("reading device memory after {}", phase.name()))?;
                PhaseMemory::from_device(phase, &now.location, device_window, &d)
            }
            None => PhaseMemory::from_host(phase, &now, &self.seen_max),
        };
        if let Some((rss, peak)) = process_memory() {
            m.rss = Some(rss);
            m.peak_rss = Some(peak);
            m.rss_window = rss_window;
        }
        Ok(m)
    }
}

/// Loads the model onto `backend` and runs the plan's tests on it.
pub fn run_model<B: Backend>(
    path: &Path,
    file: &Arc<GgufFile>,
    mut backend: B,
    plan: &Plan,
    device: &DeviceLabel,
    timeline: Option<&mut Timeline>,
) -> Result<ModelReport> {
    let info = ModelInfo::from_file(path, file);
    let mut rec = Recorder {
        timeline,
        model_name: info.name.clone(),
        seen_max: [0; MemoryTag::COUNT],
    };

    // Load. The bench still owns the backend here, so its peaks can start a window.
    backend.reset_device_peaks();
    let rss_window = rec.begin(Phase::Load, &backend.memory());
    let options = ContextOptions {
        context: plan.context(),
        max_batch: plan.step_rows(),
        all_logits: false,
        sequences: 1,
        kv_blocks: None,
    };
    let mut model = Session::load(file, backend, options)
        .with_context(|| format!("loading {}", path.display()))?;
    let mut memory = vec![rec.end(&model, Phase::Load, Window::Phase, rss_window)?];
    let backend_name = model.backend().describe();
    let vocab = model.spec().vocab;
    if vocab == 0 {
        bail!("{} has an empty vocabulary", path.display());
    }
    let needed = plan.positions_needed();
    if model.options().context < needed {
        bail!(
            "{} holds {} positions, but the tests need {needed}",
            path.display(),
            model.options().context,
        );
    }
    // The context before each repetition's test: other ids than the prompt's, so the two
    // are not one repeated sequence.
    let context_tokens: Vec<u32> = prompt_tokens(most(&plan.n_depth) + 1, vocab)[1..].to_vec();
    // A fresh context holding `depth` tokens, their work finished (the argmax reads a result
    // back), before the clock starts.
    let fill = |model: &mut Session<B>, depth: usize| -> Result<()> {
        model.reset();
        if depth > 0 {
            model.forward(&context_tokens[..depth])?;
            model.last_argmax()?;
        }
        Ok(())
    };
    let first = prompt_tokens(1, vocab)[0];
    let runs = plan.warmup + plan.repetitions;
    let mut tests = Vec::new();

    // Each later phase starts its own peak window too, over all of its tests: every pp test
    // at every depth, then every tg test.
    let at_depths = |lengths: &[usize]| -> Vec<(usize, usize)> {
        plan.depths()
            .into_iter()
            .flat_map(|d| lengths.iter().filter(|&&n| n > 0).map(move |&n| (n, d)))
            .collect()
    };
    let pp = at_depths(&plan.n_prompt);
    if !pp.is_empty() {
        model.backend_mut().reset_device_peaks();
        let rss_window = rec.begin(Phase::Prefill, &model.memory());
        for (n_prompt, depth) in pp {
            let prompt = prompt_tokens(n_prompt, vocab);
            let started = utc_now();
            let mut samples = Vec::with_capacity(plan.repetitions);
            for run in 0..runs {
                fill(&mut model, depth)?;
                let t = Instant::now();
                model.forward(&prompt)?;
                // The argmax reads a result back, so the prompt's work has finished.
                model.last_argmax()?;
                let secs = t.elapsed().as_secs_f64();
                if rec.per_call() {
                    rec.observe(&model.memory());
                }
                if run >= plan.warmup {
                    samples.push(rate(n_prompt, secs)?);
                }
            }
            tests.push(result(TestKind::Pp, n_prompt, depth, samples, started)?);
        }
        memory.push(rec.end(&model, Phase::Prefill, Window::Phase, rss_window)?);
    }
    let tg = at_depths(&plan.n_gen);
    if !tg.is_empty() {
        model.backend_mut().reset_device_peaks();
        let rss_window = rec.begin(Phase::Decode, &model.memory());
        for (n_gen, depth) in tg {
            let started = utc_now();
            let mut samples = Vec::with_capacity(plan.repetitions);
            for run in 0..runs {
                fill(&mut model, depth)?;
                let mut next = first;
                let t = Instant::now();
                for _ in 0..n_gen {
                    model.decode(next)?;
                    next = model.last_argmax()?;
                    if rec.per_call() {
                        // Only with --svg: a counter read per token, inside the timed loop.
                        rec.observe(&model.memory());
                    }
                }
                let secs = t.elapsed().as_secs_f64();
                if run >= plan.warmup {
                    samples.push(rate(n_gen, secs)?);
                }
            }
            tests.push(result(TestKind::Tg, n_gen, depth, samples, started)?);
        }
        memory.push(rec.end(&model, Phase::Decode, Window::Phase, rss_window)?);
    }
    // Where a budget run split its offloaded products with the host, the shares it settled
    // on (a log line: the tables stay as they are).
    if let Some(Ok(report)) = model.backend().device_report() {
        for line in report.lines().filter(|l| l.contains("hybrid offload")) {
            eprintln!("{}: {}", info.name, line.trim());
        }
    }
    let setup = RunSetup::of_session(&model, file, &info, device, plan.step_rows());
    Ok(ModelReport {
        info,
        backend: backend_name,
        setup,
        warmup: plan.warmup,
        tests,
        memory,
    })
}

fn result(
    kind: TestKind,
    tokens: usize,
    depth: usize,
    samples: Vec<f64>,
    started: String,
) -> Result<TestResult> {
    let summary = summarize(&samples).context("summarizing the repetitions")?;
    Ok(TestResult {
        kind,
        tokens,
        depth,
        samples,
        summary,
        started,
    })
}

/// The time now, UTC, to the second, as llama-bench writes `test_time`.
fn utc_now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_tokens_stay_in_the_vocabulary_and_vary() {
        let p = prompt_tokens(64, 100);
        assert_eq!(p.len(), 64);
        assert!(p.iter().all(|&t| t < 100));
        assert!(p.windows(2).any(|w| w[0] != w[1]));
        assert!(prompt_tokens(3, 0).iter().all(|&t| t == 0));
    }

    #[test]
    fn rate_refuses_zero_time() {
        assert_eq!(rate(10, 0.5).unwrap(), 20.0);
        assert!(rate(10, 0.0).is_err());
    }

    #[test]
    fn test_names_and_phases() {
        let s = summarize(&[1.0]).unwrap();
        let t = TestResult {
            kind: TestKind::Pp,
            tokens: 512,
            depth: 0,
            samples: vec![1.0],
            summary: s,
            started: String::new(),
        };
        assert_eq!((t.name(), t.phase()), ("pp512".to_string(), Phase::Prefill));
        let t = TestResult {
            kind: TestKind::Tg,
            tokens: 128,
            ..t
        };
        assert_eq!((t.name(), t.phase()), ("tg128".to_string(), Phase::Decode));
        let t = TestResult {
            tokens: 64,
            depth: 4096,
            ..t
        };
        assert_eq!(t.name(), "tg64 @ d4096");
    }

    #[test]
    fn a_depth_sizes_the_context_and_the_steps() {
        let plan = Plan {
            n_prompt: vec![0],
            n_gen: vec![64],
            n_depth: vec![4096, 16384],
            context: None,
            repetitions: 1,
            warmup: 0,
            max_batch: 512,
        };
        assert_eq!((plan.context(), plan.step_rows()), (16384 + 64 + 1, 512));
        let plan = Plan {
            n_prompt: vec![16, 8],
            n_depth: vec![],
            context: Some(100),
            ..plan
        };
        assert_eq!((plan.context(), plan.step_rows()), (100, 16));
    }
}
