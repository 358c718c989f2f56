//! A model split over ranks (tensor parallelism) on the CPU, the ranks threads joined by the
//! in-process collective: at 2 and 4 ranks every rank's logits equal the single-rank run's
//! within float tolerance (the partial sums are added in another order), on tiny models of
//! every architecture, through a prompt and greedy decode steps. Weights are Q8_0, whose blocks
//! of 32 let the tiny shapes' columns split (their Q4_K rows of 256 would not).

mod common;

use collective::in_process;
use common::{preset_with_weights_as, EXACT_TOL};
use decode::backend::cpu::CpuBackend;
use decode::backend::gpu::{GpuBackend, KvType, MatvecPath};
use decode::backend::{Backend, Precision};
use decode::batch::{RowOutput, StepBatch};
use decode::context::{Context, ContextOptions};
use decode::gguf_loader::synth::Preset;
use decode::gguf_loader::GgmlType;
use decode::model::{Model, ModelSpec, Shard};
use decode::GgufFile;
use std::sync::Arc;
use std::thread;
use test_support::tolerance::max_abs_diff;

const DECODE_STEPS: usize = 3;

/// `preset` with every weight stored as Q8_0.
fn q8_model(preset: Preset) -> Arc<GgufFile> {
    Arc::new(GgufFile::from_bytes(preset_with_weights_as(preset, GgmlType::Q8_0)).expect("opens"))
}

/// The error of running `shard` of `file` on a CPU backend without a collective.
fn refusal(file: &Arc<GgufFile>, shard: Shard) -> String {
    run(file, CpuBackend::new(Precision::Exact), shard)
        .unwrap_err()
        .to_string()
}

fn options() -> ContextOptions {
    ContextOptions {
        context: 64,
        max_batch: 16,
        all_logits: false,
        sequences: 1,
        kv_blocks: None,
    }
}

/// The logits after a prompt and after each of [`DECODE_STEPS`] greedy tokens, and those
/// tokens, on `be` for `shard` of the model.
fn run<B: Backend>(file: &Arc<GgufFile>, mut be: B, shard: Shard) -> decode::Result<Run> {
    let vocab = ModelSpec::from_gguf(file)?.vocab as u32;
    let model = Model::load_shard(file, &mut be, shard, &mut |_, _| {})?;
    let mut ctx = Context::new(&model, &mut be, options())?;
    let prompt: Vec<u32> = (0..11).map(|i| (i * 7 + 3) % vocab).collect();
    let greedy = RowOutput::Sample(decode::sampler::SamplerConfig {
        temperature: 0.0,
        ..Default::default()
    });
    let mut batch = StepBatch::prefill(0, 0, &prompt, greedy);
    let mut out = Run::default();
    for step in 0..=DECODE_STEPS {
        let sampled = model.step(&mut be, &mut ctx, &batch)?;
        let mut logits = Vec::new();
        ctx.read_logits(&mut be, batch.len() - 1, &mut logits)?;
        out.logits.push(logits);
        let token = sampled[0].token;
        out.tokens.push(token);
        batch = StepBatch::decode(0, prompt.len() + step, token, greedy);
    }
    Ok(out)
}

#[derive(Default, Debug)]
struct Run {
    logits: Vec<Vec<f32>>,
    tokens: Vec<u32>,
}

/// Every rank of a split over `ranks`, each on its own thread.
fn run_split(file: &Arc<GgufFile>, ranks: usize) -> Vec<decode::Result<Run>> {
    let threads: Vec<_> = in_process::group(ranks)
        .into_iter()
        .enumerate()
        .map(|(rank, comm)| {
            let file = Arc::clone(file);
            thread::spawn(move || {
                let be = CpuBackend::new(Precision::Exact).with_collective(Box::new(comm));
                run(&file, be, Shard::new(rank, ranks)?)
            })
        })
        .collect();
    threads
        .into_iter()
        .map(|t| t.join().expect("a rank's thread"))
        .collect()
}

#[test]
fn split_over_two_and_four_ranks_every_rank_matches_the_whole_model() {
    let mut ran = Vec::new();
    for preset in Preset::ALL.into_iter().filter(|p| p.is_tiny()) {
        let name = preset.name();
        let file = q8_model(preset);
        let spec = ModelSpec::from_gguf(&file).expect("spec");
        let whole = run(&file, CpuBackend::new(Precision::Exact), Shard::whole()).expect("whole");
        for ranks in [2, 4] {
            if !spec.n_head.is_multiple_of(ranks) {
                // The refusal names the heads (checked below for one such model).
                continue;
            }
            let split = run_split(&file, ranks);
            for (rank, got) in split.into_iter().enumerate() {
                let got = got.unwrap_or_else(|e| panic!("{name} rank {rank} of {ranks}: {e}"));
                assert_eq!(
                    got.tokens, whole.tokens,
                    "{name} rank {rank} of {ranks}: tokens"
                );
                for (step, (g, w)) in got.logits.iter().zip(&whole.logits).enumerate() {
                    let rms = (w.iter().map(|v| v * v).sum::<f32>() / w.len() as f32).sqrt();
                    let diff = max_abs_diff(g, w);
                    assert!(
                        diff <= EXACT_TOL * rms.max(1.0),
                        "{name} rank {rank} of {ranks}, step {step}: logits differ by {diff}"
                    );
                }
            }
            ran.push(format!("{name} x{ranks}"));
        }
    }
    // Every architecture ran split at least once (two query heads allow only two ranks).
    for preset in Preset::ALL.into_iter().filter(|p| p.is_tiny()) {
        let x2 = format!("{} x2", preset.name());
        assert!(ran.contains(&x2), "{x2} did not run: {ran:?}");
    }
}

/// Every prompt row's logits on `be` for `shard` of the model (a context that keeps all of
/// them, as a perplexity run reads them).
fn prompt_logits<B: Backend>(file: &Arc<GgufFile>, mut be: B, shard: Shard) -> Vec<Vec<f32>> {
    let model = Model::load_shard(file, &mut be, shard, &mut |_, _| {}).expect("load");
    let options = ContextOptions {
        all_logits: true,
        ..options()
    };
    let mut ctx = Context::new(&model, &mut be, options).expect("context");
    let prompt: Vec<u32> = (0..11).map(|i| (i * 37 + 5) % 512).collect();
    let batch = StepBatch::prefill(0, 0, &prompt, RowOutput::Logits);
    model.step(&mut be, &mut ctx, &batch).expect("the prompt");
    (0..prompt.len())
        .map(|row| {
            let mut logits = Vec::new();
            ctx.read_logits(&mut be, row, &mut logits).expect("logits");
            logits
        })
        .collect()
}

/// Tiny Llama's output projection is its own tensor, so each rank holds half its vocabulary's
/// rows and the gather joins every row's halves: with all of a prompt's rows' logits kept (so
/// a row's columns could land in another row), each rank's equal the whole model's.
#[test]
fn a_vocabulary_split_joins_the_columns_of_every_rows_logits() {
    let file = q8_model(Preset::TinyLlama);
    let whole = prompt_logits(&file, CpuBackend::new(Precision::Exact), Shard::whole());
    let threads: Vec<_> = in_process::group(2)
        .into_iter()
        .enumerate()
        .map(|(rank, comm)| {
            let file = Arc::clone(&file);
            thread::spawn(move || {
                let be = CpuBackend::new(Precision::Exact).with_collective(Box::new(comm));
                prompt_logits(&file, be, Shard::new(rank, 2).unwrap())
            })
        })
        .collect();
    for (rank, t) in threads.into_iter().enumerate() {
        let got = t.join().expect("a rank");
        assert_eq!(got.len(), whole.len());
        for (row, (g, w)) in got.iter().zip(&whole).enumerate() {
            let rms = (w.iter().map(|v| v * v).sum::<f32>() / w.len() as f32).sqrt();
            let diff = max_abs_diff(g, w);
            assert!(
                diff <= EXACT_TOL * rms.max(1.0),
                "rank {rank}, row {row}: logits differ by {diff}"
            );
        }
    }
    // Split where the output is its own tensor; whole where it is the embedding (tied).
    let is_split = |preset| {
        let file = q8_model(preset);
        let mut be = CpuBackend::new(Precision::Exact);
        let shard = Shard::new(0, 2).unwrap();
        let model = Model::load_shard(&file, &mut be, shard, &mut |_, _| {}).expect("load");
        model.output_is_split()
    };
    assert!(is_split(Preset::TinyLlama));
    assert!(!is_split(Preset::TinyGemma3));
}

#[test]
fn a_split_that_does_not_divide_the_heads_is_refused_by_name() {
    // Tiny Gemma 3 has two query heads.
    let file = q8_model(Preset::TinyGemma3);
    let e = refusal(&file, Shard::new(0, 4).unwrap());
    assert!(e.contains("2 query heads") && e.contains("4 ranks"), "{e}");
    // A split model on a backend without a collective stops at its first all-reduce.
    let file = q8_model(Preset::TinyLlama);
    let e = refusal(&file, Shard::new(0, 2).unwrap());
    assert!(e.contains("collective"), "{e}");
    // A column split off the format's blocks: the tiny shapes' Q4_K rows of 256 values.
    let file = Arc::new(common::preset_file(Preset::TinyLlama));
    let e = refusal(&file, Shard::new(0, 2).unwrap());
    assert!(e.contains("blocks of 256"), "{e}");
}

#[test]
fn a_rank_that_fails_stops_the_others_instead_of_hanging() {
    let file = q8_model(Preset::TinyLlama);
    let mut group = in_process::group(2);
    let second = group.pop().unwrap();
    let first = group.pop().unwrap();
    // Rank 1 fails before its first step (here: it is given a bad rank and drops its end).
    let failing = thread::spawn(move || {
        drop(second);
    });
    let be = CpuBackend::new(Precision::Exact).with_collective(Box::new(first));
    let e = run(&file, be, Shard::new(0, 2).unwrap())
        .unwrap_err()
        .to_string();
    failing.join().unwrap();
    assert!(e.contains("rank 1 left the group"), "{e}");
}

#[test]
fn a_split_session_generates_what_the_whole_model_does() {
    use decode::generate::generate;
    use decode::sampler::SamplerConfig;
    use decode::session::Session;
    use decode::split_session::SplitSession;
    let file = q8_model(Preset::TinyQwen3);
    let prompt: Vec<u32> = (0..9).map(|i| i * 13 + 5).collect();
    let sampled = SamplerConfig {
        temperature: 0.8,
        top_k: 40,
        seed: 17,
        ..Default::default()
    };
    for sampler in [SamplerConfig::default(), sampled] {
        let mut whole =
            Session::load(&file, CpuBackend::new(Precision::Exact), options()).expect("load");
        let want = generate(&mut whole, &prompt, 12, sampler, &|_| false, &mut |_| {})
            .expect("whole")
            .tokens;
        let mut split =
            SplitSession::load(&file, 2, options(), || CpuBackend::new(Precision::Exact))
                .expect("a split session");
        assert_eq!(split.spec().n_head, whole.spec().n_head / 2);
        let got = generate(&mut split, &prompt, 12, sampler, &|_| false, &mut |_| {})
            .expect("split")
            .tokens;
        assert_eq!(got, want, "temperature {}", sampler.temperature);
        // Each rank holds half the feed-forward and attention weights and of the output's
        // rows (its vocabulary split), and all of the rest.
        let memory = split.memory().expect("books");
        assert_eq!(memory.len(), 2);
        let weights = |m: &decode::MemoryReport| m.get(decode::MemoryTag::Weights);
        assert!(weights(&memory[0]) < weights(&whole.memory()), "{memory:?}");
        assert_eq!(weights(&memory[0]), weights(&memory[1]));
    }
    // A split the shape refuses is an error before any rank starts.
    let e = SplitSession::load(&file, 3, options(), || CpuBackend::new(Precision::Exact))
        .err()
        .expect("3 ranks refused")
        .to_string();
    assert!(e.contains("3 ranks"), "{e}");
}

/// The GPU's exact path (f32 products and KV cache) of a whole model against itself: the
/// split adds the partial sums in another order (step_batch's GPU_TOL).
const GPU_TOL: f32 = 1e-3;

/// The split's GPU kernels on one device: two ranks, each a GPU backend whose all-reduces go
/// through host memory, against the whole model on the same device.
#[test]
fn on_the_gpu_two_ranks_of_one_device_match_the_whole_model() {
    let test = "on_the_gpu_two_ranks_of_one_device_match_the_whole_model";
    let _lock = test_support::gpu::gpu_lock();
    let Some(device) = hip_ffi::testing::device_or_skip(test) else {
        return;
    };
    let make = move || {
        let mut be = GpuBackend::new(device, 16, true).expect("the GPU backend starts");
        be.set_matvec_path(MatvecPath::Exact);
        be.set_kv_type(KvType::F32);
        be
    };
    for preset in Preset::ALL.into_iter().filter(|p| p.is_tiny()) {
        let name = preset.name();
        let file = q8_model(preset);
        let whole = run(&file, make(), Shard::whole()).expect("whole");
        let threads: Vec<_> = in_process::group(2)
            .into_iter()
            .enumerate()
            .map(|(rank, comm)| {
                let file = Arc::clone(&file);
                thread::spawn(move || {
                    let be = make().with_host_collective(Box::new(comm));
                    run(&file, be, Shard::new(rank, 2)?)
                })
            })
            .collect();
        for (rank, t) in threads.into_iter().enumerate() {
            let got = t
                .join()
                .expect("a rank's thread")
                .unwrap_or_else(|e| panic!("{name} rank {rank}: {e}"));
            assert_eq!(got.tokens, whole.tokens, "{name} rank {rank}: tokens");
            for (step, (g, w)) in got.logits.iter().zip(&whole.logits).enumerate() {
                let diff = max_abs_diff(g, w);
                assert!(
                    diff <= GPU_TOL,
                    "{name} rank {rank}, step {step}: logits differ by {diff} (allowed {GPU_TOL})"
                );
            }
        }
    }
}
