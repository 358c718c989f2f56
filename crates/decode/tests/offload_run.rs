//! Runs under a GPU budget (`decode::budget_run`): the plan is carried out and changes nothing
//! but where the weights are read from.
//!
//! - Without a GPU: an impossible budget is the planner's refusal naming the minimum, a host
//!   budget below the plan's pinned bytes is refused, and a budget on the CPU backend is an
//!   error, not ignored.
//! - On a GPU: with a budget that leaves most weights in pinned host memory, greedy tokens are
//!   identical to the fully resident run's, on the tiny dense and MoE models and on real
//!   Gemma 3 270M: with zero-copy alone (the same kernels read the same bytes, over the host
//!   link) and with a fixed hybrid split (the host's cores compute half the rows from the same
//!   8-bit activations); under the self-balancing split they may part only at a near-tie of
//!   the resident run's logits. The pinned bytes are the plan's, and the device holds only the
//!   plan's weights.

mod common;

use common::*;
use decode::backend::gpu::offload::prefetch::HostPrefill;
use decode::backend::gpu::vendor_gemm::{MOE_GROUPED_MIN_ROWS, VENDOR_GEMM_MIN_ROWS};
use decode::backend::gpu::{CpuShare, GpuConfig, MoeGrouped};
use decode::backend::Backend;
use decode::budget_run::{self, BudgetRequest, BudgetRun};
use decode::context::ContextOptions;
use decode::device::GpuOffload;
use decode::device::{gpu_backend, BackendChoice, BackendSettings};
use decode::gguf_loader::synth::Preset;
use decode::gguf_loader::GgufFile;
use decode::layout::{LayoutOptions, ModelLayout};
use decode::sampler::SamplerConfig;
use decode::session::Session;
use offload::{Budget, Placement};
use std::sync::Arc;
use test_support::gpu::gpu_lock;
use test_support::models::gemma_path;
use test_support::tolerance::top2_margin;

const CONTEXT: usize = 256;

fn config() -> GpuConfig {
    GpuConfig::from_process().expect("the environment's GPU settings are valid")
}

fn options() -> LayoutOptions {
    LayoutOptions::for_config(CONTEXT, &config())
}

fn request(budget: u64, host_budget: Option<&str>) -> BudgetRequest {
    BudgetRequest {
        budget: Budget::Bytes(budget),
        budget_source: "test".into(),
        host_budget: host_budget.map(str::to_string),
        device_total: 1 << 40,
        options: options(),
        cpu_share: config().cpu_share,
    }
}

/// The minimum budget of a budget run (the layout's needs, with no headroom beside them) and
/// the weights' bytes of `file`.
fn minimum_and_weights(file: &GgufFile) -> (u64, u64) {
    let r = ModelLayout::new(file, &options()).expect("layout");
    let needs = offload::minimum_budget(&r.needs).expect("minimum");
    let run = budget_run::prepare(file, &request(1 << 40, Some("1GiB"))).expect("plan");
    assert_eq!(run.plan.minimum, needs);
    (run.plan.minimum, r.tensors.iter().map(|t| t.bytes).sum())
}

#[test]
fn an_impossible_budget_is_refused_with_the_minimum() {
    let file = preset_file(Preset::TinyQwen3Moe);
    let (minimum, _) = minimum_and_weights(&file);
    let err = budget_run::prepare(&file, &request(minimum - 1, Some("1GiB")))
        .expect_err("below the minimum")
        .to_string();
    assert!(err.contains("below the minimum"), "{err}");
    assert!(err.contains("raise the budget"), "{err}");
    // At the minimum itself, every weight is read from the host.
    let run = budget_run::prepare(&file, &request(minimum, Some("1GiB"))).expect("plan");
    assert!(run
        .plan
        .tensors
        .iter()
        .all(|t| t.placement == Placement::HostZeroCopy));
    assert_eq!(run.offload.host.placements.len(), run.plan.tensors.len());
}

#[test]
fn a_host_budget_below_the_pinned_weights_is_refused() {
    let file = preset_file(Preset::TinyLlama);
    let (minimum, _) = minimum_and_weights(&file);
    let err = budget_run::prepare(&file, &request(minimum, Some("4096")))
        .expect_err("a 4 KiB host budget holds no model")
        .to_string();
    assert!(err.contains("above the host budget"), "{err}");
    assert!(err.contains("--host-budget"), "{err}");
    let err = budget_run::prepare(&file, &request(minimum, Some("lots")))
        .expect_err("not a size")
        .to_string();
    assert!(err.contains("--host-budget"), "{err}");
}

#[test]
fn the_allocator_limit_is_the_budget_less_graph_memory_and_nothing_streams() {
    let file = preset_file(Preset::TinyQwen3Moe);
    let (minimum, weights) = minimum_and_weights(&file);
    let budget = minimum + weights / 2;
    let run = budget_run::prepare(&file, &request(budget, Some("1GiB"))).expect("plan");
    assert_eq!(
        run.offload.memory_limit,
        budget - run.plan.tag(offload::PlanTag::Graph)
    );
    assert!(run
        .plan
        .tensors
        .iter()
        .all(|t| t.placement != Placement::Streamed));
    let host: Vec<&str> = run
        .plan
        .tensors
        .iter()
        .filter(|t| t.placement == Placement::HostZeroCopy)
        .map(|t| t.tensor.name.as_str())
        .collect();
    assert!(!host.is_empty());
    assert_eq!(run.offload.host.placements.len(), host.len());
    assert!(host
        .iter()
        .all(|n| run.offload.host.placements[*n] == Placement::HostZeroCopy));
    let summary = run.summary();
    // The tiny model's tensors are far below what a copy's fixed cost pays for.
    assert!(
        summary.contains("and 0 (0.0 MiB) that decode streams"),
        "{summary}"
    );
    assert!(
        summary.contains("prefill streams them through"),
        "the prefill's slots are planned: {summary}"
    );
    assert!(summary.contains("memory limit"), "{summary}");
}

#[test]
fn a_budget_on_the_cpu_backend_is_an_error_not_ignored() {
    let file = preset_file(Preset::TinyLlama);
    let err = budget_run::for_choice(
        &BackendChoice::Cpu,
        &file,
        Some("1GiB"),
        None,
        options(),
        config().cpu_share,
    )
    .expect_err("the CPU backend has no device budget")
    .to_string();
    assert!(err.contains("--device gpu"), "{err}");
    let err = budget_run::for_choice(
        &BackendChoice::Cpu,
        &file,
        None,
        Some("1GiB"),
        options(),
        config().cpu_share,
    )
    .expect_err("a host budget alone means nothing")
    .to_string();
    assert!(err.contains("--gpu-budget"), "{err}");
}

/// What one greedy run on the GPU gave.
struct GreedyRun {
    tokens: Vec<u32>,
    /// Bytes pinned for the placement's weights.
    pinned: u64,
    /// Bytes pinned for an untied embedding, kept on the host whatever the placement.
    pinned_lookup: u64,
    /// The device's weight bytes after the run.
    on_device: u64,
    process_used: u64,
    /// The backend's device report (it names the hybrid split's shares).
    report: String,
}

/// Greedy tokens of `prompt` on the GPU under `settings`, offloaded products split with the
/// host at `share`.
fn greedy_on_gpu(
    device: hip_ffi::Device,
    settings: &BackendSettings,
    share: CpuShare,
    file: &Arc<GgufFile>,
    prompt: &[u32],
    n: usize,
) -> GreedyRun {
    let mut backend = gpu_backend(device, settings).expect("the GPU backend starts");
    backend.set_cpu_share(share).expect("before the load");
    let options = ContextOptions {
        context: CONTEXT,
        ..ContextOptions::default()
    };
    let mut model = Session::load(file, backend, options).expect("load");
    let report = decode::generate::generate(
        &mut model,
        prompt,
        n,
        SamplerConfig {
            temperature: 0.0,
            ..SamplerConfig::default()
        },
        &|_| false,
        &mut |_| {},
    )
    .expect("generate");
    let backend = model.backend();
    GreedyRun {
        tokens: report.tokens,
        pinned: backend.pinned_weight_bytes(),
        pinned_lookup: backend.pinned_lookup_bytes(),
        on_device: model.memory().get(decode::MemoryTag::Weights),
        process_used: backend
            .device_memory()
            .expect("a device backend")
            .expect("device memory")
            .process_used,
        report: backend
            .device_report()
            .expect("a device backend")
            .expect("device report"),
    }
}

/// The fully resident run and runs under a budget that leaves most weights on the host give
/// the same greedy tokens, whether the GPU reads every offloaded byte (zero-copy only) or
/// splits the products with the host's cores (a fixed half, and the self-balancing split);
/// the pinned bytes are the plan's host bytes.
fn offload_matches_resident(test: &str, file: Arc<GgufFile>, prompt: &[u32], n: usize) {
    let _lock = gpu_lock();
    let Some(device) = hip_ffi::testing::device_or_skip(test) else {
        return;
    };
    let (minimum, weights) = minimum_and_weights(&file);
    // Room for a fifth of the weights: most are read from the host.
    let budget = minimum + weights / 5;
    let run: BudgetRun = budget_run::prepare(
        &file,
        &BudgetRequest {
            device_total: device.mem_get_info().expect("device memory").total,
            ..request(budget, None)
        },
    )
    .expect("plan");
    let host_bytes = run.plan.host_bytes();
    assert!(
        host_bytes * 2 > weights,
        "{test}: the budget must leave most weights on the host: {}",
        run.plan
    );
    eprint!("{test}: {}", run.summary());

    let resident = BackendSettings::default();
    let want = greedy_on_gpu(device, &resident, CpuShare::Off, &file, prompt, n);
    assert_eq!(want.pinned, 0, "{test}: the resident run pins no weight");
    let offloaded = BackendSettings {
        gpu_offload: Some(run.offload.clone()),
        ..BackendSettings::default()
    };
    for share in [CpuShare::Off, CpuShare::Fixed(0.5), CpuShare::Auto] {
        let got = greedy_on_gpu(device, &offloaded, share, &file, prompt, n);
        let GreedyRun {
            pinned,
            pinned_lookup,
            on_device,
            process_used,
            ..
        } = got;
        eprintln!(
            "{test} ({share:?}): {} tokens; pinned {pinned} bytes, device weights {on_device} \
             of {}, process device usage {process_used} of a {budget}-byte budget",
            got.tokens.len(),
            want.on_device
        );
        let hybrid_line = got.report.lines().find(|l| l.contains("hybrid offload"));
        eprintln!(
            "{test} ({share:?}): {}",
            hybrid_line.unwrap_or("no hybrid split")
        );
        // Zero-copy reads the same bytes with the same kernels: identical. A split computes
        // some rows on the host, from the same 8-bit activations with exact integer sums, but
        // meets the group sums in another f32 order; a fixed split must still be identical,
        // and the self-balancing one (whose rows move between the two from step to step) may
        // part only where the resident run's top two logits are a near-tie.
        match share {
            CpuShare::Auto => {
                check_parting(test, device, &file, prompt, &want.tokens, &got.tokens);
            }
            _ => assert_eq!(
                got.tokens, want.tokens,
                "{test} ({share:?}): greedy tokens with offload differ from the resident run"
            ),
        }
        assert_eq!(got.tokens.len(), n);
        // The split ran where asked, and only there.
        assert_eq!(
            hybrid_line.is_some(),
            share != CpuShare::Off,
            "{test} ({share:?}): {}",
            got.report
        );
        assert_eq!(
            pinned + pinned_lookup,
            host_bytes,
            "{test}: pinned bytes are the plan's"
        );
        assert_eq!(
            pinned_lookup, want.pinned_lookup,
            "{test}: the same table pinned"
        );
        assert!(on_device + host_bytes >= weights && on_device < want.on_device);
        assert!(
            process_used <= budget,
            "{test} ({share:?}): the process took {process_used} bytes of device memory, above \
             the budget of {budget}"
        );
    }
}

/// Greedy continuations `want` (resident) and `got` (offloaded): equal, or parting only where
/// the resident run's top two logits are within 1e-3 x max(1, RMS) of each other, as
/// gpu_backend.rs allows between the CPU and GPU backends.
fn check_parting(
    test: &str,
    device: hip_ffi::Device,
    file: &Arc<GgufFile>,
    prompt: &[u32],
    want: &[u32],
    got: &[u32],
) {
    assert_eq!(got.len(), want.len(), "{test}: token counts");
    let Some(first) = want.iter().zip(got).position(|(a, b)| a != b) else {
        return;
    };
    let backend = gpu_backend(device, &BackendSettings::default()).expect("the GPU backend");
    let options = ContextOptions {
        context: CONTEXT,
        ..ContextOptions::default()
    };
    let mut model = Session::load(file, backend, options).expect("load");
    let mut context = prompt.to_vec();
    context.extend(&want[..first]);
    model.forward(&context).expect("forward");
    let mut logits = Vec::new();
    model.last_logits(&mut logits).expect("logits");
    let (margin, rms) = top2_margin(&logits);
    eprintln!(
        "{test} (Auto): greedy parts at token {first} ({} against {}): resident top-2 margin \
         {margin:.3e}, rms {rms:.3}",
        want[first], got[first]
    );
    assert!(
        margin.is_finite() && margin <= 1e-3 * rms.max(1.0),
        "{test} (Auto): greedy tokens part at token {first} without a near-tie (margin \
         {margin}): {want:?} against {got:?}"
    );
}

/// The last position's logits after a prefill of `prompt` on the GPU under `settings`, with
/// prefill reading host weights as `mode` says, and the device report.
fn prefill_logits(
    device: hip_ffi::Device,
    settings: &BackendSettings,
    mode: HostPrefill,
    file: &Arc<GgufFile>,
    prompt: &[u32],
) -> (Vec<f32>, String) {
    let mut backend = gpu_backend(device, settings).expect("the GPU backend starts");
    backend.set_host_prefill(mode);
    // A grouped MoE step over experts in device memory takes the int8 kernel's grouped entry,
    // and over experts left on the host the vendor GEMM, whose f16 products round otherwise:
    // both runs take the vendor GEMM, the path whose reads the streaming serves.
    backend.set_moe_grouped(MoeGrouped::Vendor);
    // The last position's logits are one decode-sized product; split with the host's cores,
    // it would meet its sums in another order than the resident run's kernel.
    backend
        .set_cpu_share(CpuShare::Off)
        .expect("before the load");
    let options = ContextOptions {
        context: CONTEXT,
        ..ContextOptions::default()
    };
    let mut model = Session::load(file, backend, options).expect("load");
    model.forward(prompt).expect("prefill");
    let mut logits = Vec::new();
    model.last_logits(&mut logits).expect("logits");
    let report = model
        .backend()
        .device_report()
        .expect("a device backend")
        .expect("device report");
    (logits, report)
}

/// A prompt long enough for the vendor GEMM's prefill reads the host's weights through the
/// streamed prefetch: the same dequantizing kernel reads the same bytes from a device slot, so
/// the logits are bit-identical to reading them in place and to the fully resident run (the
/// MoE's grouped steps held to the vendor GEMM in both: on the H100 on 2026-12-06 the
/// resident run took the int8 kernel's grouped entry, and all 640 logits differed); the
/// device report counts the staged blocks, and the process stays within the budget.
fn streamed_prefill_matches_resident(test: &str, file: Arc<GgufFile>) {
    let _lock = gpu_lock();
    let Some(device) = hip_ffi::testing::device_or_skip(test) else {
        return;
    };
    let (minimum, weights) = minimum_and_weights(&file);
    let budget = minimum + weights / 5;
    let run = budget_run::prepare(
        &file,
        &BudgetRequest {
            device_total: device.mem_get_info().expect("device memory").total,
            ..request(budget, None)
        },
    )
    .expect("plan");
    assert!(
        run.plan.tag(offload::PlanTag::OffloadStaging) > 0,
        "{}",
        run.plan
    );
    // Long enough for the dense products' vendor GEMM and the MoE's grouped one, both of
    // which stream offloaded weights.
    let rows = 2 * VENDOR_GEMM_MIN_ROWS.max(MOE_GROUPED_MIN_ROWS);
    let prompt: Vec<u32> = (0..rows as u32).map(|i| (i * 37 + 1) % 500).collect();
    let (want, _) = prefill_logits(
        device,
        &BackendSettings::default(),
        HostPrefill::Stream,
        &file,
        &prompt,
    );
    assert!(
        !want.is_empty() && want.iter().all(|v| v.is_finite()),
        "{test}"
    );
    let offloaded = BackendSettings {
        gpu_offload: Some(run.offload.clone()),
        ..BackendSettings::default()
    };
    for mode in [HostPrefill::Stream, HostPrefill::InPlace] {
        let (got, report) = prefill_logits(device, &offloaded, mode, &file, &prompt);
        let line = report.lines().find(|l| l.contains("streamed prefetch"));
        eprintln!(
            "{test} ({mode:?}): {}",
            line.unwrap_or("no streamed prefetch")
        );
        let differ = want
            .iter()
            .zip(&got)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert!(
            got.len() == want.len() && differ == 0,
            "{test} ({mode:?}): {differ} of {} logits differ from the resident run's",
            want.len()
        );
        match mode {
            HostPrefill::Stream => {
                let line = line.unwrap_or_else(|| panic!("{test}: no prefetch line: {report}"));
                assert!(
                    !line.contains(" 0 blocks"),
                    "{test}: nothing was streamed: {line}"
                );
            }
            HostPrefill::InPlace => assert!(line.is_none(), "{test}: {report}"),
        }
        let used = report
            .lines()
            .find(|l| l.contains("offload_staging"))
            .unwrap_or("");
        eprintln!("{test} ({mode:?}): {}", used.trim());
    }
}

#[test]
fn tiny_dense_streamed_prefill_equals_the_resident_run() {
    streamed_prefill_matches_resident(
        "tiny_dense_streamed_prefill_equals_the_resident_run",
        Arc::new(preset_file(Preset::TinyLlama)),
    );
}

#[test]
fn tiny_moe_streamed_prefill_equals_the_resident_run() {
    streamed_prefill_matches_resident(
        "tiny_moe_streamed_prefill_equals_the_resident_run",
        Arc::new(preset_file(Preset::TinyQwen3Moe)),
    );
}

/// Decode over weights the plan streams: every host matrix of the plan is marked streamed, so
/// each decode product copies it whole into a prefetch slot and runs the same kernel there.
/// Greedy tokens equal the resident run's, and the report counts a staged copy per streamed
/// product.
fn streamed_decode_matches_resident(test: &str, file: Arc<GgufFile>, prompt: &[u32], n: usize) {
    let _lock = gpu_lock();
    let Some(device) = hip_ffi::testing::device_or_skip(test) else {
        return;
    };
    let (minimum, weights) = minimum_and_weights(&file);
    let run = budget_run::prepare(&file, &request(minimum + weights / 5, None)).expect("plan");
    let mut host = (*run.offload.host).clone();
    let matrix = |name: &str| {
        let dims = &file.tensor(name).expect("a planned tensor").dims;
        dims.len() == 2 && dims[1] > 1
    };
    // The embedding table is looked up (a kernel reads its rows in place), and is a product's
    // operand only when it is also the output: left out, each marked matrix is one product per
    // step.
    for (name, placement) in host.placements.iter_mut() {
        if matrix(name) && name != "token_embd.weight" {
            *placement = Placement::Streamed;
        }
    }
    let streamed: Vec<&String> = host
        .placements
        .iter()
        .filter(|(_, p)| **p == Placement::Streamed)
        .map(|(n, _)| n)
        .collect();
    host.stream_slot_bytes = streamed
        .iter()
        .map(|n| file.tensor(n).expect("a planned tensor").n_bytes)
        .max()
        .unwrap_or(0);
    let n_streamed = streamed.len();
    assert!(n_streamed > 0, "{test}: {}", run.plan);
    let resident = BackendSettings::default();
    let want = greedy_on_gpu(device, &resident, CpuShare::Off, &file, prompt, n);
    let streamed = BackendSettings {
        gpu_offload: Some(GpuOffload {
            // The slots were not in this plan: room for them above its limit.
            memory_limit: run.offload.memory_limit + 2 * host.stream_slot_bytes + (4 << 20),
            host: Arc::new(host.clone()),
        }),
        ..BackendSettings::default()
    };
    let got = greedy_on_gpu(device, &streamed, CpuShare::Off, &file, prompt, n);
    let line = got
        .report
        .lines()
        .find(|l| l.contains("streamed prefetch"))
        .unwrap_or_else(|| panic!("{test}: no prefetch line: {}", got.report));
    eprintln!("{test}: {n_streamed} streamed matrices; {}", line.trim());
    assert_eq!(
        got.tokens, want.tokens,
        "{test}: greedy tokens with streamed weights differ from the resident run"
    );
    let blocks: u64 = line
        .rsplit(" in ")
        .next()
        .and_then(|t| t.split_whitespace().next())
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("{test}: no block count in {line}"));
    // Every step (the prefill, then one per token after the first) copies every streamed
    // matrix at least once.
    assert!(
        blocks >= n as u64 * n_streamed as u64,
        "{test}: {blocks} staged copies for {n_streamed} streamed matrices over {n} tokens"
    );
}

#[test]
fn tiny_dense_greedy_tokens_with_streamed_decode_equal_the_resident_run() {
    streamed_decode_matches_resident(
        "tiny_dense_greedy_tokens_with_streamed_decode_equal_the_resident_run",
        Arc::new(preset_file(Preset::TinyLlama)),
        &[1, 17, 42, 99, 7, 3],
        16,
    );
}

#[test]
fn tiny_dense_greedy_tokens_with_offload_equal_the_resident_run() {
    let prompt = [1, 17, 42, 99, 7, 3];
    offload_matches_resident(
        "tiny_dense_greedy_tokens_with_offload_equal_the_resident_run",
        Arc::new(preset_file(Preset::TinyLlama)),
        &prompt,
        24,
    );
}

#[test]
fn tiny_moe_greedy_tokens_with_offload_equal_the_resident_run() {
    let prompt = [1, 17, 42, 99, 7, 3];
    offload_matches_resident(
        "tiny_moe_greedy_tokens_with_offload_equal_the_resident_run",
        Arc::new(preset_file(Preset::TinyQwen3Moe)),
        &prompt,
        24,
    );
}

#[test]
fn real_gemma_greedy_tokens_with_offload_equal_the_resident_run() {
    let Some(path) = gemma_path() else { return };
    let file = decode::open_model(&path).expect("open Gemma 3 270M");
    let tokenizer = decode::tokenizer::Tokenizer::from_gguf(&file).expect("tokenizer");
    let prompt = tokenizer.encode("The capital of France is", true);
    offload_matches_resident(
        "real_gemma_greedy_tokens_with_offload_equal_the_resident_run",
        file,
        &prompt,
        32,
    );
}

#[test]
fn the_managed_memory_probe_measures_three_rates_and_gives_a_verdict() {
    let _lock = gpu_lock();
    let test = "the_managed_memory_probe_measures_three_rates_and_gives_a_verdict";
    let Some(device) = hip_ffi::testing::device_or_skip(test) else {
        return;
    };
    let err = decode::managed_probe::probe(&device, 1000).expect_err("too small");
    assert!(err.to_string().contains("at least 4 KiB"), "{err}");
    if !device.supports_managed_memory().expect("attribute") {
        let err = decode::managed_probe::probe(&device, 64 << 20).expect_err("unsupported");
        assert!(err.to_string().contains("does not support"), "{err}");
        return;
    }
    let p = decode::managed_probe::probe(&device, 64 << 20).expect("probe");
    eprint!("{p}");
    for rate in [p.device_gbps, p.first_gbps, p.second_gbps] {
        assert!(rate.is_finite() && rate > 0.0, "{p}");
    }
    // Any GPU reads its own memory faster than 10 GB/s.
    assert!(p.device_gbps > 10.0, "{p}");
    assert_eq!(p.verdict().is_ok(), p.migrates());
}

#[test]
fn the_link_probe_measures_zero_copy_and_copy_rates_below_device_memory() {
    let _lock = gpu_lock();
    let test = "the_link_probe_measures_zero_copy_and_copy_rates_below_device_memory";
    let Some(device) = hip_ffi::testing::device_or_skip(test) else {
        return;
    };
    let err = decode::link_probe::probe(&device, 4096).expect_err("too small");
    assert!(err.to_string().contains("at least 1 MiB"), "{err}");
    let p = decode::link_probe::probe(&device, 64 << 20).expect("probe");
    eprint!("{p}");
    for rate in [p.device_gbps, p.zero_copy_gbps, p.copy_gbps] {
        assert!(rate.is_finite() && rate > 0.0, "{p}");
    }
    // A discrete card's host link is far slower than its memory; on an APU both are the same
    // memory, and nothing is asserted between them.
    if !device.is_integrated().expect("attribute") {
        assert!(p.zero_copy_gbps < p.device_gbps, "{p}");
        assert!(p.copy_gbps < p.device_gbps, "{p}");
    }
    assert!(p.to_string().contains("copy engine"), "{p}");
}
