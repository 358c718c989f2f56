//! The GPU backend against the CPU backend's exact path, on the tiny synthetic models of every
//! architecture and on real Gemma 3 270M: logits at every position of a chunked prefill and of
//! decode steps, greedy continuations, and no device allocation by any step after load.
//!
//! Both of the GPU's matrix-vector paths are checked. Tolerance: max |GPU - CPU| <= tol x
//! max(1, RMS of the CPU logits).
//! - `exact` (f32 activations over the same quantized weights): the difference is summation
//!   order (and the GPU's f32 KV cache equals the CPU's), so the bound is tight, GPU_TOL, and
//!   greedy continuations are equal.
//! - `int8` with an f16 KV cache (the defaults: activations rounded to 8 bits per group of 32
//!   before each decode product, about 0.4 % per activation, and keys and values to 11
//!   significant bits), compounded over the layers: INT8_TOL. Greedy continuations may part,
//!   but only at a near-tie of the CPU's top two logits.

mod common;

use common::*;
use decode::backend::cpu::CpuBackend;
use decode::backend::gpu::{GpuBackend, GpuConfig, KvType, MatvecPath};
use decode::backend::{Backend, Precision};
use decode::context::ContextOptions;
use decode::gguf_loader::synth::Preset;
use decode::gguf_loader::{GgmlType, GgufFile};
use decode::sampler::SamplerConfig;
use decode::selftest::{self, all_logits_options as options};
use decode::session::Session;
use decode::tokenizer::Tokenizer;
use std::sync::Arc;
use test_support::gpu::gpu_lock;
use test_support::models::{gemma_path, smollm2_path};
use test_support::tolerance::compare;

use decode::selftest::PATHS;

/// Prefill on the vendor GEMM: weights and activations rounded to f16 (2^-11 relative) before
/// f32 products, and an f16 KV cache, compounded over the layers.
const VENDOR_GEMM_TOL: f32 = 2e-2;

fn gpu_backend(test: &str) -> Option<GpuBackend> {
    gpu_backend_with(test, true)
}

fn gpu_backend_with(test: &str, graphs: bool) -> Option<GpuBackend> {
    let device = hip_ffi::testing::device_or_skip(test)?;
    Some(GpuBackend::new(device, 64, graphs).expect("the GPU backend starts"))
}

/// The backend on `path` ([`decode::selftest::gpu_backend_on`]), or `None` after a skip.
fn gpu_backend_on(test: &str, path: MatvecPath) -> Option<GpuBackend> {
    let device = hip_ffi::testing::device_or_skip(test)?;
    Some(selftest::gpu_backend_on(device, path).expect("the GPU backend starts"))
}

/// Asserts [`decode::selftest::greedy_check`], the CPU's exact path giving the margin.
fn check_greedy(
    what: &str,
    file: &Arc<GgufFile>,
    prompt: &[u32],
    cpu: &[u32],
    gpu: &[u32],
    tol: f32,
    near_ties_allowed: bool,
) {
    let exact = CpuBackend::new(Precision::Exact);
    let check = selftest::greedy_check(what, file, exact, prompt, cpu, gpu, tol, near_ties_allowed)
        .expect("the CPU reruns the prompt");
    eprintln!("{what}: {}", check.detail);
    assert!(check.passed, "{what}: {}", check.detail);
}

fn logits_of<B: Backend>(file: &Arc<GgufFile>, backend: B, tokens: &[u32]) -> Vec<f32> {
    selftest::logits_of(file, backend, tokens).expect("prefill and decode steps")
}

fn greedy<B: Backend>(file: &Arc<GgufFile>, backend: B, prompt: &[u32], n: usize) -> Vec<u32> {
    selftest::greedy(file, backend, prompt, n).expect("generate")
}

fn check_preset(preset: Preset) {
    check_model(&format!("gpu_{}", preset.name()), || preset_file(preset));
}

/// The model `make` builds, on the GPU's two product paths against the CPU's exact one
/// ([`decode::selftest::check_model`], what `hipdecode selftest` runs on the tiny models).
fn check_model(test: &str, make: impl FnOnce() -> GgufFile) {
    let _one_at_a_time = gpu_lock();
    let Some(device) = hip_ffi::testing::device_or_skip(test) else {
        return;
    };
    let file = Arc::new(make());
    let checks = selftest::check_model(&file, device).expect("the model runs on both backends");
    for c in &checks {
        eprintln!("{test} {}: {}", c.what, c.detail);
    }
    let failed: Vec<String> = checks
        .iter()
        .filter(|c| !c.passed)
        .map(|c| format!("{}: {}", c.what, c.detail))
        .collect();
    assert!(failed.is_empty(), "{test}: {}", failed.join("; "));
}

/// The formats no preset stores, in every weight of the tiny MoE model (attention, routed
/// experts, embeddings, output); weight_formats.rs checks the same models on the CPU against
/// the numpy reference.
#[test]
fn weights_in_q2_k_q3_k_iq4_nl_and_iq4_xs_on_the_gpu_match_the_cpu() {
    for ty in [
        GgmlType::Q2K,
        GgmlType::Q3K,
        GgmlType::Iq4Nl,
        GgmlType::Iq4Xs,
    ] {
        check_model(&format!("gpu_tiny_qwen3moe_{}", ty.name()), || {
            GgufFile::from_bytes(preset_with_weights_as(Preset::TinyQwen3Moe, ty))
                .expect("the model opens")
        });
    }
}

#[test]
fn tiny_llama_on_the_gpu_matches_the_cpu() {
    check_preset(Preset::TinyLlama);
}

#[test]
fn tiny_qwen3_on_the_gpu_matches_the_cpu() {
    check_preset(Preset::TinyQwen3);
}

#[test]
fn tiny_qwen3moe_on_the_gpu_matches_the_cpu() {
    check_preset(Preset::TinyQwen3Moe);
}

#[test]
fn tiny_gemma3_on_the_gpu_matches_the_cpu() {
    check_preset(Preset::TinyGemma3);
}

#[test]
fn tiny_gemma2_on_the_gpu_matches_the_cpu() {
    check_preset(Preset::TinyGemma2);
}

#[test]
fn tiny_qwen2_on_the_gpu_matches_the_cpu() {
    check_preset(Preset::TinyQwen2);
}

#[test]
fn tiny_phi3_on_the_gpu_matches_the_cpu() {
    check_preset(Preset::TinyPhi3);
}

#[test]
fn tiny_phi3_with_longrope_on_the_gpu_matches_the_cpu() {
    check_preset(Preset::TinyPhi3LongRope);
}

#[test]
fn tiny_mistral_nemo_on_the_gpu_matches_the_cpu() {
    check_preset(Preset::TinyMistralNemo);
}

/// A q8_0 KV cache on the GPU against the CPU storing the same q8_0 rows (its bit-identical
/// quantizer), both on the exact f32 products: the cached values are the same bytes but for a
/// rounding that summation order flips at a block's boundary (one step of amax/127 on one
/// value), so the bound is looser than GPU_TOL and far tighter than the f16 cache's INT8_TOL.
/// Covers the q8_0 store, the chunked prefill's attention and the split decode attention.
const Q8_0_KV_TOL: f32 = 2e-2;

#[test]
fn a_q8_0_kv_cache_on_the_gpu_matches_the_cpu_storing_the_same_q8_0_rows() {
    let test = "a_q8_0_kv_cache_on_the_gpu_matches_the_cpu_storing_the_same_q8_0_rows";
    let _one_at_a_time = gpu_lock();
    if hip_ffi::testing::device_or_skip(test).is_none() {
        return;
    }
    let cpu_q8 = || {
        let mut be = CpuBackend::new(Precision::Exact);
        be.set_kv_type(KvType::Q8_0);
        be
    };
    let gpu_q8 = || {
        let mut be = gpu_backend(test).expect("the GPU backend starts");
        be.set_matvec_path(MatvecPath::Exact);
        be.set_kv_type(KvType::Q8_0);
        be
    };
    for preset in decode::selftest::tiny_presets() {
        let what = format!("{test} {}", preset.name());
        let file = Arc::new(preset_file(preset));
        let tok = Tokenizer::from_gguf(&file).unwrap();
        let mut tokens = tok.encode(
            "hello world, the quick brown fox jumps over 12 lazy dogs",
            tok.vocab().bos.is_some(),
        );
        tokens.truncate(24);
        let want = logits_of(&file, cpu_q8(), &tokens);
        let got = logits_of(&file, gpu_q8(), &tokens);
        let (max, rms) = compare(&got, &want);
        eprintln!("{what}: max |gpu - cpu| {max:.3e}, cpu rms {rms:.3}");
        assert!(
            max <= Q8_0_KV_TOL * rms.max(1.0),
            "{what}: max diff {max} > {Q8_0_KV_TOL} x max(rms {rms}, 1)"
        );
        // The rounding to q8_0 moves the logits off the f32 cache's: the CPU's own q8_0 run
        // differs from its f32 run, which shows the type reached the stored rows.
        let f32_kv = logits_of(&file, CpuBackend::new(Precision::Exact), &tokens);
        let (moved, _) = compare(&want, &f32_kv);
        eprintln!("{what}: q8_0 against f32 KV on the CPU: max |diff| {moved:.3e}");
        assert!(
            moved > 0.0,
            "{what}: the CPU's q8_0 rows equal its f32 rows"
        );
        let n = 32;
        let cpu_tokens = greedy(&file, cpu_q8(), &tokens[..4], n);
        let gpu_tokens = greedy(&file, gpu_q8(), &tokens[..4], n);
        check_greedy(
            &what,
            &file,
            &tokens[..4],
            &cpu_tokens,
            &gpu_tokens,
            Q8_0_KV_TOL,
            true,
        );
    }
}

/// Sampled (non-greedy) continuations: the GPU samples on the device from the seeded
/// sampler's draws and gives the CPU's tokens (both on exact f32 paths, so the logits agree to
/// about 1e-6 and a different token would need a draw within that of a boundary).
#[test]
fn sampled_continuations_on_the_device_match_the_cpu() {
    let test = "sampled_continuations_on_the_device_match_the_cpu";
    let _one_at_a_time = gpu_lock();
    if hip_ffi::testing::device_or_skip(test).is_none() {
        return;
    }
    let config = SamplerConfig {
        temperature: 0.8,
        top_k: 40,
        top_p: 0.95,
        seed: 7,
        ..SamplerConfig::default()
    };
    for preset in [Preset::TinyLlama, Preset::TinyGemma3] {
        let file = Arc::new(preset_file(preset));
        let prompt = [1u32, 5, 9, 2];
        let cpu = sampled(&file, CpuBackend::new(Precision::Exact), &prompt, config);
        let gpu = sampled(
            &file,
            gpu_backend_on(test, MatvecPath::Exact).unwrap(),
            &prompt,
            config,
        );
        assert_eq!(gpu, cpu, "{}: sampled continuations differ", preset.name());
        // Not all one token: the settings really sample.
        assert!(cpu.iter().any(|&t| t != cpu[0]), "{cpu:?}");
    }
}

fn sampled<B: Backend>(
    file: &Arc<GgufFile>,
    backend: B,
    prompt: &[u32],
    config: SamplerConfig,
) -> Vec<u32> {
    let mut model = Session::load(file, backend, options(8)).expect("load");
    decode::generate::generate(&mut model, prompt, 24, config, &|_| false, &mut |_| {})
        .expect("generate")
        .tokens
}

/// The per-op profile of decode steps names the step's ops with positive times, and the
/// profiled steps give the same tokens as unprofiled ones.
#[test]
fn profiling_times_every_op_of_a_decode_step() {
    let test = "profiling_times_every_op_of_a_decode_step";
    let _one_at_a_time = gpu_lock();
    let Some(mut gpu) = gpu_backend(test) else {
        return;
    };
    assert!(gpu.enable_profiling());
    let file = Arc::new(preset_file(Preset::TinyQwen3Moe));
    let prompt = [1u32, 2, 3, 4];
    let profiled = greedy(&file, gpu, &prompt, 6);
    let plain = greedy(&file, gpu_backend(test).unwrap(), &prompt, 6);
    assert_eq!(profiled, plain, "profiling changed the tokens");

    let mut gpu = gpu_backend(test).unwrap();
    gpu.enable_profiling();
    let mut model = Session::load(&file, gpu, options(8)).unwrap();
    model.forward(&prompt).unwrap();
    let mut next = model.last_argmax().unwrap();
    for _ in 0..3 {
        model.decode(next).unwrap();
        next = model.last_argmax().unwrap();
    }
    let report = model.backend_mut().profile_report().unwrap().unwrap();
    eprintln!("{report}");
    for op in [
        "rms_norm",
        "matvec int8",
        "attention decode",
        "moe",
        "argmax",
    ] {
        assert!(
            report.contains(op),
            "{op} missing from the profile:\n{report}"
        );
    }
    let rows: Vec<&str> = report
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| op") && !l.starts_with("| ---"))
        .collect();
    assert!(rows.len() >= 8, "{report}");
    for row in rows {
        let us: f64 = row.split('|').nth(3).unwrap().trim().parse().unwrap();
        assert!(us > 0.0, "an op without time: {row}");
    }
}

/// A prefill on the vendor GEMM (int8 path, one chunk of 48 tokens, with the int8 matrix-core
/// kernel's cap set below 48 rows so the chunk goes past it): logits at every position against
/// the CPU's exact path, on a dense, an MoE and a sliding-window model. With
/// `HIPDECODE_REQUIRE_BLAS=1` (the verification machine) the vendor library must be the one in
/// use, so a missing library cannot pass as our kernels.
#[test]
fn a_long_prefill_on_the_vendor_gemm_matches_the_cpu() {
    let _one_at_a_time = gpu_lock();
    let require = hip_ffi::knobs::REQUIRE_BLAS.read().unwrap();
    for preset in [Preset::TinyLlama, Preset::TinyQwen3Moe, Preset::TinyGemma3] {
        let test = "a_long_prefill_on_the_vendor_gemm_matches_the_cpu";
        let Some(device) = hip_ffi::testing::device_or_skip(test) else {
            return;
        };
        // The default cap (64 rows) would give a 48-row chunk to the int8 matrix-core kernel.
        let config = GpuConfig {
            int8_mma_max_rows: 16,
            ..GpuConfig::from_process().unwrap()
        };
        let mut gpu = GpuBackend::with_config(device, 64, true, None, &config).unwrap();
        gpu.set_matvec_path(MatvecPath::Int8);
        gpu.set_kv_type(KvType::F16);
        let described = gpu.describe();
        eprintln!("{described}");
        assert!(
            !require || described.contains("BLASLt"),
            "HIPDECODE_REQUIRE_BLAS=1 but prefill does not run on the vendor GEMM: {described}"
        );
        let file = Arc::new(preset_file(preset));
        let vocab = Session::load(&file, CpuBackend::new(Precision::Exact), options(64))
            .unwrap()
            .spec()
            .vocab as u32;
        let tokens: Vec<u32> = (0..48u32).map(|i| 1 + (i * 37) % (vocab - 1)).collect();
        let run = |backend| -> Vec<f32> {
            let mut model = Session::load(&file, backend, options(64)).expect("load");
            model.forward_all_logits(&tokens).expect("prefill")
        };
        let want = run_cpu(&file, &tokens);
        let got = run(gpu);
        let (max, rms) = compare(&got, &want);
        eprintln!("{preset:?} prefill of 48: max |gpu - cpu| {max:.3e}, cpu rms {rms:.3}");
        assert!(
            max <= VENDOR_GEMM_TOL * rms.max(1.0),
            "{preset:?}: max diff {max} > {VENDOR_GEMM_TOL} x max(rms {rms}, 1)"
        );
    }
}

fn run_cpu(file: &Arc<GgufFile>, tokens: &[u32]) -> Vec<f32> {
    let mut model = Session::load(file, CpuBackend::new(Precision::Exact), options(64)).unwrap();
    model.forward_all_logits(tokens).unwrap()
}

/// The per-step workspace is reserved when the model loads: from then on no step (a prefill
/// chunk, the first decode step and its capture, replayed steps, device sampling) calls the
/// device allocator or changes its active bytes, on every architecture and both paths.
#[test]
fn no_step_allocates_on_the_device_after_load() {
    let _one_at_a_time = gpu_lock();
    for (path, _) in PATHS {
        for preset in decode::selftest::tiny_presets() {
            let test = "no_step_allocates_on_the_device_after_load";
            let Some(gpu) = gpu_backend_on(test, path) else {
                return;
            };
            let alloc = Arc::clone(gpu.allocator());
            let file = Arc::new(preset_file(preset));
            let options = ContextOptions {
                context: 96,
                ..ContextOptions::default()
            };
            let mut model = Session::load(&file, gpu, options).unwrap();
            let loaded = alloc.stats();
            // Loading told the allocator the weights' size, which leaves the default cache
            // limit as it is.
            let weights = loaded.tag(rocm_alloc::Tag::Weights).current;
            assert!(weights > 0);
            if !rocm_alloc::knobs::CACHE_LIMIT.is_set() {
                assert_eq!(
                    loaded.cache_limit,
                    Some(rocm_alloc::limits::DEFAULT_CACHE_LIMIT),
                    "the default cache limit is not the measured 4 MiB after loading"
                );
            }
            // A prefill longer than a matrix-vector batch, then decode steps: greedy, then
            // sampled on the device.
            let prompt: Vec<u32> = (1..=40).collect();
            model.forward(&prompt).unwrap();
            let mut next = model.last_argmax().unwrap();
            let config = SamplerConfig {
                temperature: 0.8,
                top_k: 20,
                top_p: 0.9,
                ..SamplerConfig::default()
            };
            for step in 0..12 {
                model.decode(next).unwrap();
                next = if step < 6 {
                    model.last_argmax().unwrap()
                } else {
                    let draw = (step as f64 * 0.37) % 1.0;
                    model
                        .last_sample(&config, draw)
                        .unwrap()
                        .expect("the GPU samples")
                };
            }
            let after = alloc.stats();
            let what = format!("{preset:?} on the {path:?} path");
            assert_eq!(
                (after.device_allocs, after.device_frees),
                (loaded.device_allocs, loaded.device_frees),
                "{what}: steps called the device allocator after load"
            );
            assert_eq!(
                after.active_bytes, loaded.active_bytes,
                "{what}: steps changed the allocator's active bytes after load"
            );
        }
    }
}

/// A real model: logits on three prompts within tolerance, and a 64-token greedy continuation
/// equal to the CPU's (or, where they part, a near-tie on the CPU's side).
fn check_real_model(name: &str, path: Option<std::path::PathBuf>) {
    let _one_at_a_time = gpu_lock();
    let Some(path) = path else { return };
    let Some(_) = hip_ffi::testing::device_or_skip(&format!("real_{name}_on_the_gpu")) else {
        return;
    };
    let file = decode::open_model(&path).unwrap();
    let tok = Tokenizer::from_gguf(&file).unwrap();
    let prompt = tok.encode("The history of computing began", true);
    let n = 64;
    let cpu = greedy(&file, CpuBackend::new(Precision::Exact), &prompt, n);
    for (path, tol) in PATHS {
        for text in [
            "The capital of France is",
            "def fibonacci(n):",
            "Memory on a GPU is explained when",
        ] {
            let tokens = tok.encode(text, true);
            let want = logits_of(&file, CpuBackend::new(Precision::Exact), &tokens);
            let got = logits_of(&file, gpu_backend_on(name, path).unwrap(), &tokens);
            let (max, rms) = compare(&got, &want);
            eprintln!("{name} {path:?} {text:?}: max |gpu - cpu| {max:.3e}, cpu rms {rms:.3}");
            assert!(
                max <= tol * rms.max(1.0),
                "{name} {path:?} {text:?}: max diff {max} > {tol} x max(rms {rms}, 1)"
            );
        }
        let gpu = greedy(&file, gpu_backend_on(name, path).unwrap(), &prompt, n);
        check_greedy(
            &format!("{name} {path:?}"),
            &file,
            &prompt,
            &cpu,
            &gpu,
            tol,
            true,
        );
    }
}

/// Real Gemma 3 270M (Q4_K_M).
#[test]
fn real_gemma_on_the_gpu_matches_the_cpu() {
    check_real_model("gemma", gemma_path());
}

/// Real SmolLM2-135M-Instruct (Llama, Q4_1).
#[test]
fn real_smollm2_on_the_gpu_matches_the_cpu() {
    check_real_model("smollm2", smollm2_path());
}

/// Real-shape synthetic models (`cargo xtask synth-model llama3-8b-q4_k_m`, `qwen3-30b-a3b-q4_k_m`;
/// several GB, so made where the GPU is and named in `HIPDECODE_SYNTH_MODELS`, colon-separated):
/// logits at the first 2 positions within tolerance of the CPU's exact path, then 64 decode
/// steps with every logit finite.
#[test]
fn real_shape_synthetic_models_on_the_gpu() {
    let Some(list) = decode::environment::SYNTH_MODELS.read().unwrap() else {
        eprintln!(
            "skipping: HIPDECODE_SYNTH_MODELS names no real-shape synthetic models (they are \
             several GB; make them with `cargo xtask synth-model llama3-8b-q4_k_m`)"
        );
        return;
    };
    let _one_at_a_time = gpu_lock();
    if hip_ffi::testing::device_or_skip("real_shape_synthetic_models_on_the_gpu").is_none() {
        return;
    }
    for path in std::env::split_paths(&list) {
        let file = decode::open_model(&path).unwrap();
        let label = path.display().to_string();
        let prompt = [1u32, 1000];
        let options = ContextOptions {
            context: 128,
            max_batch: 2,
            all_logits: true,
            sequences: 1,
            kv_blocks: None,
        };
        let mut cpu = Session::load(&file, CpuBackend::new(Precision::Exact), options).unwrap();
        let want = cpu.forward_all_logits(&prompt).unwrap();
        drop(cpu);
        for (path, tol) in PATHS {
            let what = format!("{label} {path:?}");
            let backend = gpu_backend_on(&label, path).unwrap();
            let mut gpu = Session::load(&file, backend, options).unwrap();
            let got = gpu.forward_all_logits(&prompt).unwrap();
            let (max, rms) = compare(&got, &want);
            eprintln!("{what}: first 2 positions, max |gpu - cpu| {max:.3e}, cpu rms {rms:.3}");
            assert!(
                max <= tol * rms.max(1.0),
                "{what}: max diff {max} > {tol} x max(rms {rms}, 1)"
            );
        }
        let mut gpu = Session::load(&file, gpu_backend(&label).unwrap(), options).unwrap();
        let got = gpu.forward_all_logits(&prompt).unwrap();
        let mut next = argmax_last(&got, gpu.spec().vocab);
        for step in 0..64 {
            let logits = gpu.forward_all_logits(&[next]).unwrap();
            if let Some(i) = logits.iter().position(|v| !v.is_finite()) {
                panic!("{label}: decode step {step}: logit {i} is {}", logits[i]);
            }
            next = argmax_last(&logits, gpu.spec().vocab);
        }
        eprintln!("{label}: 64 decode steps, every logit finite");
    }
}

fn argmax_last(logits: &[f32], vocab: usize) -> u32 {
    rocm_kernels::reference::sampling::argmax(&logits[logits.len() - vocab..]) as u32
}
