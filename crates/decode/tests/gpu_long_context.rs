//! Long contexts on the GPU against the CPU's exact path (issue 23, correctness): logits at every
//! position of a 4096-token prompt and of 64 decode steps after it, on the tiny synthetic
//! models of every architecture, on both GPU paths and with the q8_0 KV cache; and real Gemma 3
//! 270M at every 64th prompt position and the 64 steps.
//!
//! - The tiny models' context length (2048) is raised to 8192 in the file, so the context holds
//!   the prompt and the steps.
//! - Prefill runs in chunks of 100 rows, which divide neither the sliding window (8 on
//!   tiny-gemma3) nor the KV block (16 positions), so chunks start and end inside blocks and
//!   windows; the decode steps from position 4096 cross block boundaries every 16 positions.
//! - The sliding-window model also runs prompts of window - 1, window and window + 1 tokens.
//! - Decode steps are teacher-forced (fixed tokens), so both backends see the same inputs; on
//!   the GPU the first step runs eagerly, the second is captured and the rest replay it.
//!
//! Tolerances are gpu_backend's: max |GPU - CPU| <= tol x max(1, RMS of the CPU logits), and
//! every position's argmax is the CPU's unless the CPU's top two are a near-tie (within twice
//! the tolerance, the batching issue's definition).

mod common;

use common::*;
use decode::backend::cpu::CpuBackend;
use decode::backend::gpu::{GpuBackend, KvType, MatvecPath};
use decode::backend::{Backend, Precision};
use decode::context::ContextOptions;
use decode::gguf_loader::synth::Preset;
use decode::gguf_loader::GgufFile;
use decode::session::Session;
use std::sync::Arc;
use test_support::gpu::gpu_lock;
use test_support::tolerance::{compare, top2_margin};

/// The GPU runs compared, with gpu_backend's tolerances: the exact path (f32 KV), the int8
/// path (f16 KV) and the int8 path with the q8_0 KV cache. The CPU reference stores its KV as
/// q8_0 where the GPU does (the same quantization, bit for bit) and as f32 otherwise.
const PATHS: [(MatvecPath, KvType, f32); 3] = [
    (MatvecPath::Exact, KvType::F32, 1e-3),
    (MatvecPath::Int8, KvType::F16, 0.2),
    (MatvecPath::Int8, KvType::Q8_0, 0.2),
];
const PROMPT: usize = 4096;
const STEPS: usize = 64;
const CHUNK: usize = 100;

/// `preset`'s file with its context length raised to `context`.
fn long_preset(preset: Preset, context: u32) -> Arc<GgufFile> {
    let mut bytes = preset_bytes(preset);
    let arch = GgufFile::from_bytes(bytes.clone())
        .expect("opens")
        .get_str("general.architecture")
        .expect("an architecture")
        .to_string();
    test_support::models::set_u32_metadata(&mut bytes, &format!("{arch}.context_length"), context);
    Arc::new(GgufFile::from_bytes(bytes).expect("the patched model opens"))
}

/// Deterministic tokens below `vocab`, avoiding token 0.
fn tokens(n: usize, vocab: usize, salt: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| 1 + (i.wrapping_mul(2_654_435_761).wrapping_add(salt) >> 7) % (vocab as u32 - 1))
        .collect()
}

/// Logits of the prompt's `positions` (prefilled in chunks of `chunk`) and of each
/// teacher-forced decode step after it.
fn run<B: Backend>(
    file: &Arc<GgufFile>,
    backend: B,
    prompt: &[u32],
    steps: &[u32],
    chunk: usize,
    positions: Positions,
) -> Vec<f32> {
    let all_logits = matches!(positions, Positions::Every);
    let options = ContextOptions {
        context: prompt.len() + steps.len() + 1,
        max_batch: chunk,
        all_logits,
        sequences: 1,
        kv_blocks: None,
    };
    let mut model = Session::load(file, backend, options).expect("load");
    if all_logits {
        let mut all = model.forward_all_logits(prompt).expect("prefill");
        for &t in steps {
            all.extend(model.forward_all_logits(&[t]).expect("decode step"));
        }
        return all;
    }
    let (mut kept, mut last) = (Vec::new(), Vec::new());
    for part in prompt.chunks(chunk) {
        model.forward(part).expect("prefill chunk");
        model.last_logits(&mut last).expect("logits");
        kept.extend_from_slice(&last);
    }
    for &t in steps {
        model.decode(t).expect("decode step");
        model.last_logits(&mut last).expect("logits");
        kept.extend_from_slice(&last);
    }
    kept
}

fn gpu_on(test: &str, path: MatvecPath, kv: KvType, chunk: usize) -> Option<GpuBackend> {
    let device = hip_ffi::testing::device_or_skip(test)?;
    let mut be = GpuBackend::new(device, chunk, true).expect("the GPU backend starts");
    be.set_matvec_path(path);
    be.set_kv_type(kv);
    Some(be)
}

/// The CPU's exact path with the KV cache the reference for a GPU run of `kv` keeps.
fn cpu_for(kv: KvType) -> CpuBackend {
    let mut be = CpuBackend::new(Precision::Exact);
    be.set_kv_type(match kv {
        KvType::Q8_0 => KvType::Q8_0,
        KvType::F32 | KvType::F16 => KvType::F32,
    });
    be
}

/// Compares the GPU's logits with the CPU's on every path of [`PATHS`], at every position.
fn check(test: &str, file: &Arc<GgufFile>, prompt: &[u32], steps: &[u32], chunk: usize) -> bool {
    check_at(test, file, prompt, steps, chunk, Positions::Every)
}

/// Which positions' logits a run keeps.
#[derive(Clone, Copy)]
enum Positions {
    /// Every prompt position and every step.
    Every,
    /// The last of each prefill chunk, and every step: for a vocabulary too large to keep
    /// 4096 rows of logits.
    ChunkEnds,
}

/// [`check`] at `positions`: the whole run within each path's tolerance, and each kept
/// position's argmax equal but at near-ties.
fn check_at(
    test: &str,
    file: &Arc<GgufFile>,
    prompt: &[u32],
    steps: &[u32],
    chunk: usize,
    positions: Positions,
) -> bool {
    let mut references: Vec<(KvType, Vec<f32>)> = Vec::new();
    for (path, kv, tol) in PATHS {
        let Some(gpu) = gpu_on(test, path, kv, chunk) else {
            return false;
        };
        let cpu = cpu_for(kv);
        let cpu_kv = cpu.kv_type();
        if !references.iter().any(|(k, _)| *k == cpu_kv) {
            let want = run(file, cpu, prompt, steps, chunk, positions);
            references.push((cpu_kv, want));
        }
        let want = &references
            .iter()
            .find(|(k, _)| *k == cpu_kv)
            .expect("computed")
            .1;
        let got = run(file, gpu, prompt, steps, chunk, positions);
        let what = format!(
            "{test} {path:?} with {kv:?} KV, prompt {} in chunks of {chunk}, {} steps",
            prompt.len(),
            steps.len()
        );
        assert_eq!(got.len(), want.len(), "{what}: logit count");
        let (max, rms) = compare(&got, want);
        eprintln!("{what}: max |gpu - cpu| {max:.3e}, cpu rms {rms:.3}");
        assert!(
            max <= tol * rms.max(1.0),
            "{what}: max diff {max} > {tol} x max(rms {rms}, 1)"
        );
        let kept = match positions {
            Positions::Every => prompt.len() + steps.len(),
            Positions::ChunkEnds => prompt.len().div_ceil(chunk) + steps.len(),
        };
        let v = want.len() / kept;
        let mut near_ties = 0;
        for p in 0..kept {
            let (w, g) = (&want[p * v..(p + 1) * v], &got[p * v..(p + 1) * v]);
            if argmax(w) != argmax(g) {
                let (margin, rms) = top2_margin(w);
                assert!(
                    margin < 2.0 * tol * rms.max(1.0),
                    "{what}: kept position {p}: argmax {} on the GPU, {} on the CPU, which is \
                     no near-tie (margin {margin}, rms {rms})",
                    argmax(g),
                    argmax(w)
                );
                near_ties += 1;
            }
        }
        eprintln!("{what}: {near_ties} of {kept} argmaxes differ, all at near-ties");
    }
    true
}

fn argmax(v: &[f32]) -> usize {
    (0..v.len()).fold(0, |best, i| if v[i] > v[best] { i } else { best })
}

fn long_prompt(preset: Preset) {
    let test = format!("long_context_{}", preset.name());
    let _one_at_a_time = gpu_lock();
    if hip_ffi::testing::device_or_skip(&test).is_none() {
        return;
    }
    let file = long_preset(preset, 8192);
    let vocab = Session::load(
        &file,
        CpuBackend::new(Precision::Exact),
        ContextOptions::default(),
    )
    .expect("load")
    .spec()
    .vocab;
    let prompt = tokens(PROMPT, vocab, 1);
    let steps = tokens(STEPS, vocab, 2);
    assert!(check(&test, &file, &prompt, &steps, CHUNK));
}

#[test]
fn a_4096_token_prompt_and_64_steps_on_tiny_llama_match_the_cpu() {
    long_prompt(Preset::TinyLlama);
}

#[test]
fn a_4096_token_prompt_and_64_steps_on_tiny_qwen3_match_the_cpu() {
    long_prompt(Preset::TinyQwen3);
}

#[test]
fn a_4096_token_prompt_and_64_steps_on_tiny_qwen3moe_match_the_cpu() {
    long_prompt(Preset::TinyQwen3Moe);
}

#[test]
fn a_4096_token_prompt_and_64_steps_on_tiny_gemma3_match_the_cpu() {
    long_prompt(Preset::TinyGemma3);
}

#[test]
fn a_4096_token_prompt_and_64_steps_on_tiny_qwen2_match_the_cpu() {
    long_prompt(Preset::TinyQwen2);
}

#[test]
fn a_4096_token_prompt_and_64_steps_on_tiny_gemma2_match_the_cpu() {
    long_prompt(Preset::TinyGemma2);
}

#[test]
fn a_4096_token_prompt_and_64_steps_on_tiny_phi3_match_the_cpu() {
    long_prompt(Preset::TinyPhi3);
}

#[test]
fn a_4096_token_prompt_and_64_steps_on_tiny_phi3_longrope_match_the_cpu() {
    long_prompt(Preset::TinyPhi3LongRope);
}

#[test]
fn a_4096_token_prompt_and_64_steps_on_tiny_mistral_nemo_match_the_cpu() {
    long_prompt(Preset::TinyMistralNemo);
}

/// Real Gemma 3 270M: its 262k vocabulary would make 4096 rows of logits 4 GiB, so the prompt
/// runs in chunks of 64 and the logits of each chunk's last position (every 64th) are kept,
/// with the 64 steps' after it.
#[test]
fn real_gemma_at_every_64th_position_of_4096_and_64_steps_matches_the_cpu() {
    let test = "real_gemma_long_context";
    let _one_at_a_time = gpu_lock();
    if hip_ffi::testing::device_or_skip(test).is_none() {
        return;
    }
    let Some(path) = test_support::models::gemma_path() else {
        return;
    };
    let file = decode::open_model(&path).expect("the Gemma file opens");
    let vocab = decode::model::ModelSpec::from_gguf(&file)
        .expect("spec")
        .vocab;
    let prompt = tokens(PROMPT, vocab, 1);
    let steps = tokens(STEPS, vocab, 2);
    assert!(check_at(
        test,
        &file,
        &prompt,
        &steps,
        64,
        Positions::ChunkEnds
    ));
}

/// Prompts of window - 1, window and window + 1 tokens on the sliding-window model, in chunks
/// of 3 (dividing neither the window of 8 nor the block of 16), then steps past the window.
#[test]
fn prompts_around_the_sliding_window_match_the_cpu() {
    let test = "prompts_around_the_sliding_window";
    let _one_at_a_time = gpu_lock();
    if hip_ffi::testing::device_or_skip(test).is_none() {
        return;
    }
    let file = long_preset(Preset::TinyGemma3, 2048);
    let spec = Session::load(
        &file,
        CpuBackend::new(Precision::Exact),
        ContextOptions::default(),
    )
    .expect("load")
    .spec()
    .clone();
    let window = (spec.layers.iter())
        .find_map(|l| l.window)
        .expect("tiny-gemma3 has a sliding window");
    for len in [window - 1, window, window + 1] {
        let prompt = tokens(len, spec.vocab, len as u32);
        let steps = tokens(2 * window + 3, spec.vocab, 7);
        assert!(check(test, &file, &prompt, &steps, 3));
    }
}
