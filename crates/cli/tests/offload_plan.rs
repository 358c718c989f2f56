//! The offload planner on real model files: the layout's needs, and `hipdecode plan` end to
//! end on tiny synthetic models (the layout against what a load allocates is `layout.rs`).

#[path = "../../decode/tests/common.rs"]
mod common;

use decode::gguf_loader::synth::{write_preset, Preset};
use decode::layout::{LayoutOptions, ModelLayout};
use offload::{LinkModel, Placement, PlanTag};
use std::process::Command;

const TINY: [Preset; 4] = [
    Preset::TinyLlama,
    Preset::TinyQwen3,
    Preset::TinyQwen3Moe,
    Preset::TinyGemma3,
];

fn hipdecode() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_hipdecode"));
    // The budget comes from the flag in these tests unless one sets the variable, and the
    // rates are the H200 defaults unless a test keeps its own: this machine's probes must not
    // change what the tests see.
    c.env_remove(offload::knobs::GPU_BUDGET.name);
    c.env(offload::knobs::RATES_FILE.name, "off");
    c
}

fn tiny_model(preset: Preset, tag: &str) -> std::path::PathBuf {
    let path = common::scratch_dir().join(format!(
        "plan-{tag}-{}-{}.gguf",
        preset.name(),
        std::process::id()
    ));
    write_preset(preset, &path, 3).unwrap();
    path
}

#[test]
fn the_gpu_defaults_halve_the_cache_and_ring_the_sliding_layers() {
    let file = common::preset_file(Preset::TinyGemma3);
    let r = ModelLayout::new(&file, &LayoutOptions::default()).unwrap();
    let s = &r.spec;
    // f16, one K and one V row per slot; sliding layers hold window + max_batch - 1 slots, in
    // whole KV blocks.
    let row = (s.widths.k + s.widths.v) as u64 * 2;
    let block = decode::kv::block_positions();
    let expect: u64 = s
        .layers
        .iter()
        .map(|l| match l.window {
            Some(w) => r.context.min(w + 63).next_multiple_of(block) as u64,
            None => r.context.next_multiple_of(block) as u64,
        })
        .map(|slots| slots * row)
        .sum();
    assert!(s.layers.iter().any(|l| l.window.is_some()));
    assert_eq!(r.needs.kv_cache, expect);
    // The vendor GEMM's library workspace is the largest part of a tiny model's workspace.
    assert!(r.needs.workspace > 32 << 20);
    let kernels_only = LayoutOptions {
        vendor_gemm: false,
        ..LayoutOptions::default()
    };
    let r2 = ModelLayout::new(&file, &kernels_only).unwrap();
    assert!(r2.needs.workspace + (32 << 20) <= r.needs.workspace);
    assert!(r.buffers.iter().any(|b| b.tag == PlanTag::Graph));
}

/// On every tiny model, budgets from the minimum up: every plan fits its budget and none is
/// slower than a smaller budget's.
#[test]
fn plans_of_real_models_fit_and_never_slow_down() {
    for preset in TINY {
        let file = common::preset_file(preset);
        let r = ModelLayout::new(&file, &LayoutOptions::default()).unwrap();
        let minimum = r.needs.total().unwrap();
        let weights: u64 = r.tensors.iter().map(|t| t.bytes).sum();
        let mut last = f64::NEG_INFINITY;
        for step in 0..=60 {
            let budget = minimum + weights * 2 * step / 50;
            let p = offload::plan(&r.plan_request(budget, LinkModel::h200_default())).unwrap();
            assert!(p.total() <= budget, "{}: {p}", preset.name());
            assert!(p.tokens_per_second() >= last, "{}: {p}", preset.name());
            last = p.tokens_per_second();
        }
        let p = offload::plan(&r.plan_request(minimum + 2 * weights, LinkModel::h200_default()))
            .unwrap();
        // Everything on the device but an untied embedding, which the GPU backend keeps in
        // host memory by default (HIPDECODE_GPU_EMBED_TABLE=host).
        for t in &p.tensors {
            let lookup = matches!(t.tensor.kind, offload::TensorKind::Lookup { .. });
            let want = if lookup {
                Placement::HostZeroCopy
            } else {
                Placement::Device
            };
            assert_eq!(t.placement, want, "{}: {}", preset.name(), t.tensor.name);
        }
    }
}

#[test]
fn hipdecode_plan_prints_the_plan_per_tag_and_placement() {
    let model = tiny_model(Preset::TinyQwen3Moe, "ok");
    let out = hipdecode()
        .args(["plan", "-m"])
        .arg(&model)
        // Above the layout's minimum at this context (about 65 MiB), so every tag gets a line.
        .args(["--gpu-budget", "99MiB", "--context", "256", "--tensors"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    for tag in PlanTag::ALL {
        assert!(stdout.contains(tag.name()), "{tag:?} missing:\n{stdout}");
    }
    for placement in Placement::ALL {
        assert!(stdout.contains(placement.name()), "{stdout}");
    }
    assert!(
        stdout.contains("budget   99.0 MiB from --gpu-budget 99MiB"),
        "{stdout}"
    );
    assert!(stdout.contains("tok/s"), "{stdout}");
    assert!(stdout.contains("context 256 (KV f16)"), "{stdout}");
    assert!(stdout.contains("blk.1.ffn_down_exps.weight"), "{stdout}");
    // The per-tag total is within the budget.
    let total: f64 = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("total"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("a total line");
    assert!(total <= 99.0, "{stdout}");
    assert!(stdout.contains("offload_staging"), "{stdout}");
    std::fs::remove_file(&model).ok();
}

#[test]
fn a_budget_below_the_minimum_is_refused_with_the_minimum() {
    let model = tiny_model(Preset::TinyQwen3, "low");
    let out = hipdecode()
        .args(["plan", "-m"])
        .arg(&model)
        .args(["--gpu-budget", "10MiB"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.starts_with("error: a GPU budget of 10.0 MiB is below the minimum of "),
        "{stderr}"
    );
    assert!(
        stderr.contains("raise the budget") && stderr.contains("MiB"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    std::fs::remove_file(&model).ok();
}

#[test]
fn budget_forms_and_their_errors() {
    let model = tiny_model(Preset::TinyLlama, "forms");
    let run = |args: &[&str], env: Option<&str>| {
        let mut c = hipdecode();
        c.args(["plan", "-m"]).arg(&model).args(args);
        if let Some(v) = env {
            c.env(offload::knobs::GPU_BUDGET.name, v);
        }
        c.output().unwrap()
    };
    // A percentage of the memory given on the command line.
    let out = run(&["--gpu-budget", "50%", "--device-memory", "256MiB"], None);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("= 128.0 MiB; device memory 256.0 MiB (--device-memory)"),
        "{stdout}"
    );
    // The variable when the flag is absent; the flag wins over it.
    let out = run(&[], Some("0.25GiB"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("= 256.0 MiB"));
    let out = run(&["--gpu-budget", "200MiB"], Some("0.25GiB"));
    assert!(String::from_utf8_lossy(&out.stdout).contains("= 200.0 MiB"));
    // Bad values name the value and the accepted forms.
    for (args, env, named) in [
        (&["--gpu-budget", "8 parsecs"][..], None, "--gpu-budget"),
        (&[][..], Some("lots"), offload::knobs::GPU_BUDGET.name),
        (&["--gpu-budget", "0"][..], None, "--gpu-budget"),
        (
            &["--gpu-budget", "50%", "--device-memory", "50%"][..],
            None,
            "--device-memory",
        ),
    ] {
        let out = run(args, env);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(
            stderr.contains(named) && stderr.contains("accepted forms"),
            "{stderr}"
        );
    }
    // No budget at all.
    let out = run(&[], None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no GPU budget") && stderr.contains(offload::knobs::GPU_BUDGET.name),
        "{stderr}"
    );
    // A budget above the device's memory.
    let out = run(&["--gpu-budget", "2GiB", "--device-memory", "1GiB"], None);
    assert!(String::from_utf8_lossy(&out.stderr).contains("more than the device's"));
    // A percentage without the device's total, where no GPU can be asked.
    if !decode::device::gpu_present() {
        let out = run(&["--gpu-budget", "75%"], None);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(stderr.contains("--device-memory"), "{stderr}");
    }
    std::fs::remove_file(&model).ok();
}

/// The rates `hipdecode probe-link` and `probe-host` keep are what `hipdecode plan` prices with,
/// and its link line says which rate came from where; a broken file is an error naming it.
#[test]
fn plan_uses_the_rates_the_probes_kept_and_says_so() {
    use offload::measured::{LinkRates, MeasuredRates};
    let dir = common::scratch_dir().join(format!("rates-{}", std::process::id()));
    let rates = dir.join("measured-rates.json");
    let model = tiny_model(Preset::TinyLlama, "rates");
    let plan = |file: &std::path::Path| {
        hipdecode()
            .env(offload::knobs::RATES_FILE.name, file)
            .args(["plan", "-m"])
            .arg(&model)
            .args(["--gpu-budget", "256MiB"])
            .output()
            .unwrap()
    };
    let link_line = |out: &std::process::Output| {
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stdout}\n{stderr}");
        stdout
            .lines()
            .find(|l| l.starts_with("link model:"))
            .unwrap_or_else(|| panic!("no link line:\n{stdout}"))
            .to_string()
    };

    // No file yet: the H200's figures.
    let line = link_line(&plan(&rates));
    assert!(
        line.contains("zero-copy 50.0 GB/s") && !line.contains("probe-link on"),
        "{line}"
    );

    // What probe-link keeps (it needs a GPU, so written here as it writes it), then a real
    // probe-host run, which adds its rate beside the link's.
    MeasuredRates {
        link: Some(LinkRates {
            device: "Test GPU".into(),
            zero_copy_gbps: 12.5,
            copy_gbps: 13.5,
            measured_at: "2026-12-06T00:00:00Z".into(),
        }),
        host: None,
    }
    .save(&rates)
    .unwrap();
    let probe = hipdecode()
        .env(offload::knobs::RATES_FILE.name, &rates)
        .args(["probe-host", "--bytes", "1MiB"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&probe.stdout);
    assert!(probe.status.success() && said.contains("kept in"), "{said}");
    let kept = MeasuredRates::load(&rates).unwrap();
    let host = kept.host.as_ref().expect("probe-host kept its rate");
    assert!(host.gbps.is_finite() && host.gbps > 0.0, "{host:?}");
    assert_eq!(kept.link.as_ref().unwrap().device, "Test GPU");

    let line = link_line(&plan(&rates));
    assert!(
        line.contains("zero-copy 12.5 GB/s, copy 13.5 GB/s"),
        "{line}"
    );
    assert!(line.contains("probe-link on Test GPU"), "{line}");
    assert!(line.contains("measured by hipdecode probe-host"), "{line}");
    assert!(line.contains("the rest from H200 defaults"), "{line}");

    // Off: the defaults again, whatever the file holds.
    let line = link_line(&plan(std::path::Path::new("off")));
    assert!(!line.contains("Test GPU"), "{line}");

    // A broken file stops the plan with its name and the fix.
    std::fs::write(&rates, "{ not json").unwrap();
    let out = plan(&rates);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("measured-rates.json") && stderr.contains("probe-link"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).ok();
    std::fs::remove_file(&model).ok();
}

/// `plan --tp N` lays out each GPU of a tensor-parallel split: its part of the weights under
/// its own budget (one for all, or one per GPU). Q8_0 weights, whose blocks of 32 let the tiny
/// shapes' columns split.
#[test]
fn plan_tp_lays_out_each_gpu_under_its_own_budget() {
    let bytes =
        common::preset_with_weights_as(Preset::TinyLlama, decode::gguf_loader::GgmlType::Q8_0);
    let model = common::scratch_dir().join(format!("plan-tp-{}.gguf", std::process::id()));
    std::fs::write(&model, bytes).unwrap();
    let plan = |extra: &[&str]| {
        let out = hipdecode()
            .args(["plan", "-m"])
            .arg(&model)
            .args(["--context", "256"])
            .args(extra)
            .output()
            .unwrap();
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (out.status.success(), text(&out.stdout), text(&out.stderr))
    };
    // MiB of weights on the GPU, from the model line.
    let weights = |stdout: &str| -> Vec<f64> {
        stdout
            .lines()
            .filter_map(|l| l.split(" weight tensors, ").nth(1))
            .filter_map(|rest| rest.split_whitespace().next()?.parse().ok())
            .collect()
    };
    let (ok, whole, stderr) = plan(&["--gpu-budget", "120MiB"]);
    assert!(ok, "{stderr}");
    let (ok, split, stderr) = plan(&["--tp", "2", "--gpu-budget", "110MiB,120MiB"]);
    assert!(ok, "{stderr}");
    assert!(
        split.contains("== GPU 0 of 2") && split.contains("== GPU 1 of 2"),
        "{split}"
    );
    assert!(
        split.contains("budget   110.0 MiB from --gpu-budget 110MiB,120MiB"),
        "{split}"
    );
    assert!(split.contains("budget   120.0 MiB"), "{split}");
    let (whole, split) = (weights(&whole), weights(&split));
    assert_eq!((whole.len(), split.len()), (1, 2));
    for rank in split {
        assert!(
            rank < whole[0] * 0.75,
            "a rank's {rank} MiB against {whole:?}"
        );
    }
    // A budget count that is neither one nor one per GPU, and a split the heads refuse.
    let (ok, _, stderr) = plan(&["--tp", "2", "--gpu-budget", "1GiB,2GiB,3GiB"]);
    assert!(!ok && stderr.contains("3 budgets for --tp 2"), "{stderr}");
    let (ok, _, stderr) = plan(&["--tp", "3", "--gpu-budget", "1GiB"]);
    assert!(
        !ok && stderr.contains("cannot be split over 3 ranks"),
        "{stderr}"
    );
    std::fs::remove_file(&model).ok();
    // Q4_K rows of 256 values cut at 128 columns: refused by the blocks, as the load is.
    let q4k = tiny_model(Preset::TinyLlama, "tp-q4k");
    let out = hipdecode()
        .args(["plan", "-m"])
        .arg(&q4k)
        .args(["--tp", "2", "--gpu-budget", "1GiB"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("blocks of 256"),
        "{stderr}"
    );
    std::fs::remove_file(&q4k).ok();
}
