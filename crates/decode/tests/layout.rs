//! The layout against what a load allocates, per tag.
//!
//! - On the CPU, for every tiny preset at several contexts, with one and two sequences, with
//!   and without every row's logits: the layout's bytes per tag equal the CPU backend's books
//!   (`memory()`) exactly.
//! - On a GPU, for every tiny preset and each model in `HIPDECODE_SYNTH_MODELS` at contexts
//!   4096 and 32768: the layout replayed on the allocator equals the backend's allocator per
//!   tag (its `per_tag` current bytes, block sizes after its rounding), and its peak reserved
//!   bytes. What the runtime takes outside the allocator is a measured figure: printed beside
//!   the device's reading, not asserted.

mod common;

use decode::backend::cpu::CpuBackend;
use decode::backend::gpu::{GpuBackend, GpuConfig, DEFAULT_MAX_BATCH};
use decode::backend::{Backend, Precision};
use decode::context::{Context, ContextOptions};
use decode::gguf_loader::synth::Preset;
use decode::kv::KvType;
use decode::layout::{LayoutBuffer, LayoutOptions, ModelLayout, Presence, Target};
use decode::model::Model;
use decode::session::Session;
use decode::MemoryTag;
use offload::PlanTag;
use std::sync::Arc;
use test_support::gpu::gpu_lock;

const TINY: [Preset; 4] = [
    Preset::TinyLlama,
    Preset::TinyQwen3,
    Preset::TinyQwen3Moe,
    Preset::TinyGemma3,
];

#[test]
fn the_layout_is_what_a_cpu_load_books_per_tag() {
    for preset in TINY {
        let file = Arc::new(common::preset_file(preset));
        let cases = [5, 64, 2048]
            .into_iter()
            .flat_map(|c| [(c, 1, false), (c, 1, true), (c, 2, false)]);
        for (context, sequences, all_logits) in cases {
            let options = ContextOptions {
                context,
                all_logits,
                sequences,
                ..ContextOptions::default()
            };
            let layout = ModelLayout::new(&file, &LayoutOptions::cpu(&options)).unwrap();
            let mut backend = CpuBackend::new(Precision::Fast);
            let model = Model::load(&file, &mut backend).unwrap();
            let ctx = Context::new(&model, &mut backend, options).unwrap();
            let mem = backend.memory();
            let what = format!(
                "{} at context {context}, {sequences} sequences, all_logits {all_logits}",
                preset.name()
            );
            assert_eq!(layout.context, ctx.options().context, "{what}");
            for tag in MemoryTag::ALL {
                assert_eq!(
                    layout.requested(tag),
                    mem.get(tag),
                    "{what}: {} (layout against the CPU's books)",
                    tag.name()
                );
            }
            // The planner's view is the same list: the weights' tensors, and needs with no
            // workspace, graph or slack on the CPU.
            assert_eq!(layout.tensors.len(), file.tensors().len(), "{what}");
            assert_eq!(layout.needs.kv_cache, mem.get(MemoryTag::KvCache), "{what}");
            assert_eq!(layout.needs.workspace, 0, "{what}");
        }
    }
}

/// A rank of a tensor-parallel split (`LayoutOptions::shard`) is laid out as its CPU load
/// books it, per tag: its parts of the weights (its heads' rows and columns, its share of the
/// feed-forward width, its vocabulary rows of an untied output), and the KV cache and
/// activations of its heads and width. Q8_0 weights, whose blocks of 32 let the tiny shapes'
/// columns split.
#[test]
fn a_ranks_layout_is_what_its_cpu_load_books_per_tag() {
    let mut ran = 0;
    for preset in TINY {
        let bytes = common::preset_with_weights_as(preset, decode::gguf_loader::GgmlType::Q8_0);
        let file = Arc::new(decode::GgufFile::from_bytes(bytes).unwrap());
        let spec = decode::model::ModelSpec::from_gguf(&file).unwrap();
        let options = ContextOptions {
            context: 64,
            ..ContextOptions::default()
        };
        let whole = ModelLayout::new(&file, &LayoutOptions::cpu(&options)).unwrap();
        for ranks in [2, 4] {
            if !spec.n_head.is_multiple_of(ranks) {
                continue;
            }
            for rank in 0..ranks {
                let shard = decode::model::Shard::new(rank, ranks).unwrap();
                let laid = LayoutOptions {
                    shard,
                    ..LayoutOptions::cpu(&options)
                };
                let layout = ModelLayout::new(&file, &laid).unwrap();
                let mut backend = CpuBackend::new(Precision::Fast);
                let model = Model::load_shard(&file, &mut backend, shard, &mut |_, _| {}).unwrap();
                let _ctx = Context::new(&model, &mut backend, options).unwrap();
                let mem = backend.memory();
                let what = format!("{} rank {rank} of {ranks}", preset.name());
                for tag in MemoryTag::ALL {
                    assert_eq!(
                        layout.requested(tag),
                        mem.get(tag),
                        "{what}: {} (layout against the CPU's books)",
                        tag.name()
                    );
                }
                let weights = layout.requested(MemoryTag::Weights);
                assert!(
                    weights < whole.requested(MemoryTag::Weights),
                    "{what}: weights"
                );
                // The rank's K/V heads' share of the cache (with fewer K/V heads than ranks,
                // each rank holds the one of its query group).
                let (kv, whole_kv) = (
                    layout.requested(MemoryTag::KvCache),
                    whole.requested(MemoryTag::KvCache),
                );
                let heads = decode::model::tensor_parallel::shard_spec(&spec, shard)
                    .unwrap()
                    .n_head_kv;
                assert!(heads < spec.n_head_kv || spec.n_head_kv < ranks, "{what}");
                assert_eq!(
                    kv * spec.n_head_kv as u64,
                    whole_kv * heads as u64,
                    "{what}: the KV cache of {heads} of {} K/V heads",
                    spec.n_head_kv
                );
                ran += 1;
            }
        }
    }
    assert!(ran >= 2 * TINY.len(), "{ran} ranks laid out");
}

/// An embedding table that is only looked up stays in pinned host memory on the GPU by
/// default: the layout lists it apart from the device's weights, the plan keeps it on the host
/// under a budget that holds everything, and a tied table (the output's matrix) stays a device
/// weight.
#[test]
fn an_untied_embedding_is_a_host_weight_on_the_gpu() {
    let mut seen = [false; 2];
    for preset in TINY {
        let file = common::preset_file(preset);
        let tied = file.tensor("output.weight").is_none();
        seen[tied as usize] = true;
        let host = LayoutOptions::default();
        let device = LayoutOptions {
            lookup_on_host: false,
            ..host
        };
        let (on_host, on_device) = (
            ModelLayout::new(&file, &host).unwrap(),
            ModelLayout::new(&file, &device).unwrap(),
        );
        let embed = |l: &ModelLayout| {
            l.buffers
                .iter()
                .find(|b| b.what == "token_embd.weight")
                .cloned()
                .expect("the embedding's line")
        };
        let (h, d) = (embed(&on_host), embed(&on_device));
        let what = preset.name();
        assert_eq!(d.presence, Presence::Weight, "{what}");
        let expected = if tied {
            Presence::Weight
        } else {
            Presence::HostWeight
        };
        assert_eq!(h.presence, expected, "{what}");
        let kept = if tied { 0 } else { h.bytes };
        assert_eq!(
            on_device.tag_bytes(PlanTag::Weights) - on_host.tag_bytes(PlanTag::Weights),
            kept,
            "{what}: the device's weights"
        );
        assert_eq!(
            on_device.requested(MemoryTag::Weights) - on_host.requested(MemoryTag::Weights),
            kept,
            "{what}"
        );
        // A budget that holds every weight: the plan keeps the table on the host all the same.
        let budget = on_device.needs.total().unwrap() + on_device.tag_bytes(PlanTag::Weights) * 2;
        let plan = offload::plan(&on_host.plan_request(budget, offload::LinkModel::h200_default()))
            .unwrap();
        let planned = plan
            .tensors
            .iter()
            .find(|t| t.tensor.name == "token_embd.weight")
            .unwrap();
        let expected = if tied {
            offload::Placement::Device
        } else {
            offload::Placement::HostZeroCopy
        };
        assert_eq!(planned.placement, expected, "{what}: {plan}");
        assert_eq!(
            plan.tag(PlanTag::OffloadStaging),
            0,
            "{what}: no staging for it"
        );
        // The CPU reads its own copy wherever the option says.
        let cpu = ModelLayout::new(&file, &LayoutOptions::cpu(&ContextOptions::default())).unwrap();
        assert_eq!(embed(&cpu).presence, Presence::Weight, "{what}");
    }
    assert_eq!(
        seen,
        [true, true],
        "the presets hold tied and untied embeddings"
    );
}

/// The GPU takes a model's device weights as one block and a KV cache's fixed buffers as
/// another, each rounded once by the allocator; the CPU replay takes each buffer alone. On
/// buffers of the 8B shape's sizes at 32k context (64 KV layers of 62.625 MiB, three 33 MB
/// matrices) that is 88 MiB of segment tails apart.
#[test]
fn the_gpu_replays_weights_and_a_kv_cache_as_one_block_each() {
    const MIB: u64 = 1 << 20;
    let file = Arc::new(common::preset_file(Preset::TinyLlama));
    let mut layout = ModelLayout::new(&file, &LayoutOptions::default()).unwrap();
    let line = |tag, bytes, presence| LayoutBuffer {
        tag,
        what: String::new(),
        bytes,
        presence,
    };
    let (layer, matrix) = (62 * MIB + 5 * MIB / 8, 33_030_144);
    layout.buffers = (0..3)
        .map(|_| line(PlanTag::Weights, matrix, Presence::Weight))
        .chain((0..64).map(|_| line(PlanTag::KvCache, layer, Presence::Always)))
        .collect();
    let round = |b: u64| b.next_multiple_of(2 * MIB);
    let piece = |b: u64| b.next_multiple_of(512);
    assert_eq!(layout.options.target, Target::Gpu);
    let gpu = layout.replay(true).unwrap();
    assert_eq!(
        gpu.peak_reserved,
        round(3 * piece(matrix)) + round(64 * layer),
        "one segment per block"
    );
    assert_eq!(gpu.get(MemoryTag::KvCache), 64 * layer);
    layout.options.target = Target::Cpu;
    let cpu = layout.replay(true).unwrap();
    assert_eq!(cpu.peak_reserved, 3 * round(matrix) + 64 * round(layer));
    assert_eq!(
        cpu.peak_reserved - gpu.peak_reserved,
        64 * (round(layer) - layer) + 3 * round(matrix) - round(3 * piece(matrix)),
    );
    // Weights left to the host: no block for them, the KV cache's still.
    let host = {
        layout.options.target = Target::Gpu;
        layout.replay(false).unwrap()
    };
    assert_eq!(host.peak_reserved, round(64 * layer));
}

/// The q8_0 KV cache's bytes against f16's, as the layout books them for the GPU under the
/// `kv_cache` tag: at most 53.2 % (34 bytes per 32 values against 64).
#[test]
fn a_q8_0_kv_cache_takes_at_most_53_2_percent_of_f16() {
    for preset in TINY {
        let file = Arc::new(common::preset_file(preset));
        let bytes = |kv: KvType| {
            let options = LayoutOptions {
                bounds: ContextOptions {
                    context: 32768,
                    ..ContextOptions::default()
                },
                kv_type: kv,
                ..LayoutOptions::default()
            };
            let layout = ModelLayout::new(&file, &options).unwrap();
            layout.requested(MemoryTag::KvCache)
        };
        let (q8, f16, f32) = (bytes(KvType::Q8_0), bytes(KvType::F16), bytes(KvType::F32));
        let ratio = q8 as f64 / f16 as f64;
        eprintln!(
            "{}: KV q8_0 {q8} B, f16 {f16} B, f32 {f32} B: {ratio:.4}",
            preset.name()
        );
        assert_eq!(f32, 2 * f16, "{}", preset.name());
        assert!(ratio <= 0.532 && ratio > 0.5, "{}: {ratio}", preset.name());
    }
}

/// Per tag, the layout's bytes asked, the layout replayed on the allocator, and the allocator's
/// report of the real load; fails on any tag where the last two differ.
fn compare_on_the_gpu(
    label: &str,
    file: &Arc<decode::GgufFile>,
    device: hip_ffi::Device,
    context: usize,
    kv: KvType,
) {
    let mut config = GpuConfig::from_process().expect("the GPU settings are valid");
    config.kv_type = kv;
    let backend = GpuBackend::with_config(device, DEFAULT_MAX_BATCH, true, None, &config)
        .expect("the GPU backend starts");
    let model_options = ContextOptions {
        context,
        ..ContextOptions::default()
    };
    let options = LayoutOptions {
        vendor_gemm: backend.has_vendor_gemm(),
        ..LayoutOptions::gpu(&model_options, &config, DEFAULT_MAX_BATCH)
    };
    let layout = ModelLayout::new(file, &options).expect("layout");
    let view = layout.replay(true).expect("replay");
    let model = Session::load(file, backend, model_options).expect("load");
    let stats = model.backend().allocator().stats();
    // An untied embedding stays in pinned host memory under the default
    // HIPDECODE_GPU_EMBED_TABLE=host: the layout lists it apart, and the backend pinned it.
    let on_host: u64 = layout
        .buffers
        .iter()
        .filter(|b| b.presence == Presence::HostWeight)
        .map(|b| b.bytes)
        .sum();
    let pinned = model.backend().pinned_lookup_bytes();
    eprintln!("  lookup tables in pinned host memory: layout {on_host}, backend {pinned}");
    let what = format!("{label} at context {context}, {kv} KV");
    eprintln!("{what}:");
    eprintln!(
        "  {:<16} {:>14} {:>14} {:>14}",
        "tag", "layout asked", "layout blocks", "allocator"
    );
    let mut differ = Vec::new();
    for tag in MemoryTag::ALL {
        let (asked, blocks, real) = (layout.requested(tag), view.get(tag), stats.tag(tag).current);
        eprintln!("  {:<16} {asked:>14} {blocks:>14} {real:>14}", tag.name());
        if blocks != real {
            differ.push(format!("{}: layout {blocks}, allocator {real}", tag.name()));
        }
    }
    eprintln!(
        "  {:<16} {:>14} {:>14} {:>14}",
        "peak reserved", "", view.peak_reserved, stats.peak_reserved_bytes
    );
    if view.peak_reserved != stats.peak_reserved_bytes {
        differ.push(format!(
            "peak reserved: layout {}, allocator {}",
            view.peak_reserved, stats.peak_reserved_bytes
        ));
    }
    // Outside the allocator: measured constants, reported beside the device's reading.
    let outside: u64 = layout
        .buffers
        .iter()
        .filter(|b| b.presence == Presence::OutsideAllocator && !b.what.starts_with("page tables"))
        .map(|b| b.bytes)
        .sum();
    let measured = model
        .backend()
        .device_memory()
        .expect("a device")
        .map(|m| m.outside_allocator)
        .unwrap_or_default();
    eprintln!(
        "  {:<16} {:>14} {:>14} {:>14}  (measured constants; not asserted)",
        PlanTag::Graph.name(),
        outside,
        "",
        measured
    );
    assert_eq!(
        on_host, pinned,
        "{what}: lookup tables in pinned host memory"
    );
    assert!(differ.is_empty(), "{what}: {}", differ.join("; "));
}

#[test]
fn the_layout_is_what_a_gpu_load_allocates_per_tag() {
    let test = "the_layout_is_what_a_gpu_load_allocates_per_tag";
    let _one_at_a_time = gpu_lock();
    let Some(device) = hip_ffi::testing::device_or_skip(test) else {
        return;
    };
    for preset in TINY {
        let file = Arc::new(common::preset_file(preset));
        for context in [64, 2048] {
            for kv in KvType::ALL {
                compare_on_the_gpu(preset.name(), &file, device, context, kv);
            }
        }
    }
    let Some(list) = decode::environment::SYNTH_MODELS.read().unwrap() else {
        eprintln!(
            "{test}: HIPDECODE_SYNTH_MODELS names no real-shape synthetic models; the 8B and \
             30B-A3B shapes were not compared (make them with `cargo xtask synth-model \
             llama3-8b-q4_k_m`)"
        );
        return;
    };
    for path in std::env::split_paths(&list) {
        let file = decode::open_model(&path).unwrap();
        for context in [4096, 32768] {
            for kv in [KvType::F16, KvType::Q8_0] {
                compare_on_the_gpu(&path.display().to_string(), &file, device, context, kv);
            }
        }
    }
}

/// A server's default KV pool on a GPU (`layout::kv_fit` over `Backend::device_room`): under a memory limit that
/// leaves room for a part of the whole contexts, the pool fitted to what is left after the
/// weights allocates, with its activations and workspace, within the limit; with no limit
/// every whole context fits a tiny model on a large device.
#[test]
fn a_kv_pool_fitted_to_the_device_allocates_within_its_limit() {
    let test = "a_kv_pool_fitted_to_the_device_allocates_within_its_limit";
    let _one_at_a_time = gpu_lock();
    let Some(device) = hip_ffi::testing::device_or_skip(test) else {
        return;
    };
    let file = Arc::new(common::preset_file(Preset::TinyLlama));
    let bounds = ContextOptions {
        context: 2048,
        sequences: 16,
        max_batch: DEFAULT_MAX_BATCH,
        ..ContextOptions::default()
    };
    let open = |limit| {
        let config = GpuConfig::from_process().expect("the GPU settings are valid");
        GpuBackend::with_config(device, DEFAULT_MAX_BATCH, true, limit, &config)
            .expect("the GPU backend starts")
    };
    // What a server does without a KV budget: the pool its device room holds.
    let fitted = |backend: &GpuBackend| {
        let room = backend
            .device_room()
            .expect("a device")
            .expect("free memory");
        let options = backend.layout_options(&bounds);
        decode::layout::kv_fit::kv_blocks_that_fit(&file, &options, &room).expect("fits")
    };
    // Unlimited: the whole contexts.
    let mut backend = open(None);
    let model = Model::load(&file, &mut backend).expect("load");
    let weights_reserved = backend.allocator().stats().reserved_bytes;
    let fit = fitted(&backend);
    eprintln!("{test}: unlimited: {}", fit.describe());
    assert_eq!(fit.blocks, None, "{fit:?}");
    // The allocator's part of the layout at `blocks` (None: whole contexts).
    let allocator_needs = |blocks| {
        let options = LayoutOptions {
            bounds: ContextOptions {
                kv_blocks: blocks,
                ..bounds
            },
            ..backend.layout_options(&bounds)
        };
        let n = ModelLayout::new(&file, &options).unwrap().needs;
        n.kv_cache + n.activations + n.workspace + n.allocator_slack
    };
    let (one, whole) = (allocator_needs(Some(1)), allocator_needs(None));
    drop(model);
    drop(backend);
    // A limit of the weights and half way from one block to the whole contexts.
    let limit = weights_reserved + one + (whole - one) / 2;
    let mut backend = open(Some(limit));
    let model = Model::load(&file, &mut backend).expect("load");
    let fit = fitted(&backend);
    eprintln!("{test}: limit {limit}: {}", fit.describe());
    let blocks = fit.blocks.expect("a part of the whole contexts");
    assert!(blocks < fit.whole_blocks);
    let mut ctx = Context::new(
        &model,
        &mut backend,
        ContextOptions {
            kv_blocks: Some(blocks),
            ..bounds
        },
    )
    .expect("the fitted pool allocates");
    assert_eq!(ctx.kv_plan().pool_blocks, blocks);
    // The pool grows as blocks are handed out: grown whole (its last block handed out), it
    // still fits under the limit, as the layout priced it.
    ctx.set_blocks(&mut backend, 0, [Some(blocks as u32 - 1)])
        .expect("the whole pool is backed");
    assert_eq!(ctx.kv_backed_blocks(), blocks);
    let stats = backend.allocator().stats();
    eprintln!(
        "{test}: grown whole: {} reserved, {} mapped",
        stats.reserved_bytes, stats.mapped_bytes
    );
    assert!(
        stats.reserved_bytes <= limit,
        "{} > {limit}",
        stats.reserved_bytes
    );
    // The whole contexts do not fit under the limit: refused by name, before the allocator's
    // OOM report.
    match Context::new(&model, &mut backend, bounds) {
        Ok(_) => panic!("{test}: the whole contexts were allocated under {limit}"),
        Err(e) => {
            let text = e.to_string();
            assert!(
                text.contains("memory limit") && text.contains("--ctx"),
                "{text}"
            );
        }
    }
}
