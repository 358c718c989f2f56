//! Greedy tokens against a committed golden file: 64 tokens after a fixed prompt, for every tiny
//! synthetic preset and real Gemma 3 270M, on the CPU (fast and exact paths) and on the GPU
//! (int8 with the f16 KV cache, and exact with the f32 one), and 64 tokens drawn with a seeded
//! sampler after the same prompt.
//!
//! The file (`tests/golden/greedy_tokens.json`) was written by this test before the decode
//! restructure began, from the code as it was then (the CPU entries on a machine without a GPU,
//! the GPU entries on the H200), so a change that is meant to leave behaviour alone is held to
//! bit-identical tokens on each path, including the int8 and f16 rounding. The prompt's token
//! ids are recorded too, so the tokenizer is held to them as well.
//!
//! A change that is meant to alter tokens re-writes the entries it ran:
//! `HIPDECODE_BLESS_GOLDEN=<path>` writes the committed file with this run's entries replaced to
//! `<path>` (on the GPU machine, a path under `$OUT`), to be reviewed and committed.

mod common;

use common::*;
use decode::backend::cpu::CpuBackend;
use decode::backend::gpu::{GpuBackend, KvType, MatvecPath};
use decode::backend::{Backend, Precision};
use decode::context::ContextOptions;
use decode::gguf_loader::synth::Preset;
use decode::gguf_loader::GgufFile;
use decode::sampler::SamplerConfig;
use decode::session::Session;
use decode::tokenizer::Tokenizer;
use serde_json::{json, Map, Value};
use std::path::PathBuf;
use std::sync::Arc;
use test_support::models::{gemma_path, workspace_root};

const PROMPT: &str = "The history of computing began with the quick brown fox, 12 lazy dogs and";
const NEW_TOKENS: usize = 64;
const BLESS_VAR: &str = decode::environment::BLESS_GOLDEN.name;

fn golden_path() -> PathBuf {
    workspace_root().join("crates/decode/tests/golden/greedy_tokens.json")
}

fn read_golden() -> Map<String, Value> {
    read_golden_from(&golden_path())
}

fn read_golden_from(path: &std::path::Path) -> Map<String, Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let v: Value = serde_json::from_str(&text).expect("the golden file is JSON");
    v["entries"]
        .as_object()
        .expect("the golden file has an 'entries' object")
        .clone()
}

/// A model under test: a tiny preset (written with the tests' seed) or the real Gemma file.
struct Subject {
    name: String,
    file: Arc<GgufFile>,
}

fn subjects() -> Vec<Subject> {
    let mut out: Vec<Subject> = Preset::ALL
        .into_iter()
        .filter(|p| p.is_tiny())
        .map(|p| Subject {
            name: p.name().to_string(),
            file: Arc::new(preset_file(p)),
        })
        .collect();
    if let Some(path) = gemma_path() {
        out.push(Subject {
            name: "gemma3-270m-real".into(),
            file: decode::open_model(&path).expect("the real Gemma file opens"),
        });
    }
    out
}

/// Sampling settings of the second continuation: the tiny models' random weights make greedy
/// decoding settle on one token within a few steps, so a seeded draw over the top tokens is
/// what holds their logits (and the device's sampler) to the golden file.
const SAMPLED: SamplerConfig = SamplerConfig {
    temperature: 1.0,
    top_k: 40,
    top_p: 0.95,
    seed: 42,
    ..SamplerConfig::GREEDY
};

/// One golden entry: the prompt's ids (with BOS where the vocabulary has one), the greedy
/// continuation and the sampled one.
struct Entry {
    key: String,
    prompt: Vec<u32>,
    greedy: Vec<u32>,
    sampled: Vec<u32>,
}

fn run<B: Backend>(key: String, file: &Arc<GgufFile>, backend: &dyn Fn() -> B) -> Entry {
    let tok = Tokenizer::from_gguf(file).expect("tokenizer");
    let prompt = tok.encode(PROMPT, tok.vocab().bos.is_some());
    let options = ContextOptions {
        context: 256,
        ..ContextOptions::default()
    };
    let continuation = |sampler: SamplerConfig| {
        let mut model = Session::load(file, backend(), options).expect("load");
        decode::generate::generate(
            &mut model,
            &prompt,
            NEW_TOKENS,
            sampler,
            &|_| false,
            &mut |_| {},
        )
        .expect("generate")
        .tokens
    };
    Entry {
        key,
        greedy: continuation(SamplerConfig::default()),
        sampled: continuation(SAMPLED),
        prompt,
    }
}

/// Compares (or, when blessing, records) this run's entries; all mismatches are listed together.
fn check(results: Vec<Entry>) {
    let bless = decode::environment::BLESS_GOLDEN.read().unwrap();
    if let Some(out) = bless {
        // The tests of this file run on threads of one process and bless into one file: one
        // at a time, each adding to what the other wrote.
        static BLESSING: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one_at_a_time = BLESSING.lock().unwrap_or_else(|e| e.into_inner());
        let out = PathBuf::from(out);
        let mut golden = if out.exists() {
            read_golden_from(&out)
        } else {
            read_golden()
        };
        for e in results {
            let value = json!({ "prompt": e.prompt, "greedy": e.greedy, "sampled": e.sampled });
            golden.insert(e.key, value);
        }
        // One line per entry, so a re-blessed file's diff shows which entries moved.
        let lines: Vec<String> = golden
            .iter()
            .map(|(k, v)| format!("    {}: {}", Value::from(k.as_str()), v))
            .collect();
        let text = format!(
            "{{\n  \"prompt\": {},\n  \"new_tokens\": {NEW_TOKENS},\n  \"entries\": {{\n{}\n  }}\n}}\n",
            Value::from(PROMPT),
            lines.join(",\n")
        );
        std::fs::write(&out, text).expect("write the blessed golden file");
        eprintln!("blessed: wrote {}", out.display());
        return;
    }
    let golden = read_golden();
    let mut failures = Vec::new();
    for e in results {
        let key = &e.key;
        let Some(entry) = golden.get(key) else {
            failures.push(format!(
                "{key}: no golden entry; write it with {BLESS_VAR}=<path> on the code before \
                 the change and commit it"
            ));
            continue;
        };
        let ids = |k: &str| -> Vec<u32> {
            entry[k]
                .as_array()
                .unwrap_or_else(|| panic!("{key}: no '{k}' array"))
                .iter()
                .map(|x| x.as_u64().expect("a token id") as u32)
                .collect()
        };
        if e.prompt != ids("prompt") {
            failures.push(format!(
                "{key}: the prompt tokenizes to {:?}, golden {:?}",
                e.prompt,
                ids("prompt")
            ));
            continue;
        }
        for (what, got) in [("greedy", &e.greedy), ("sampled", &e.sampled)] {
            let want = ids(what);
            match (0..want.len().max(got.len())).find(|&i| want.get(i) != got.get(i)) {
                Some(at) => failures.push(format!(
                    "{key}: {what} tokens part at token {at}:\n  got    {got:?}\n  golden {want:?}"
                )),
                None => eprintln!("{key}: {} {what} tokens equal the golden file", got.len()),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn cpu_greedy_tokens_equal_the_golden_file() {
    let mut results = Vec::new();
    for s in subjects() {
        for (label, precision) in [("fast", Precision::Fast), ("exact", Precision::Exact)] {
            let key = format!("{}/cpu/{label}", s.name);
            results.push(run(key, &s.file, &|| CpuBackend::new(precision)));
        }
    }
    check(results);
}

#[test]
fn gpu_greedy_tokens_equal_the_golden_file() {
    let test = "gpu_greedy_tokens_equal_the_golden_file";
    if hip_ffi::testing::device_or_skip(test).is_none() {
        return;
    }
    let mut results = Vec::new();
    for s in subjects() {
        for (label, path, kv) in [
            ("int8", MatvecPath::Int8, KvType::F16),
            ("exact", MatvecPath::Exact, KvType::F32),
        ] {
            let backend = || {
                let device = hip_ffi::testing::device_or_skip(test).expect("the GPU found above");
                let mut be = GpuBackend::new(device, 64, true).expect("the GPU backend starts");
                be.set_matvec_path(path);
                be.set_kv_type(kv);
                be
            };
            results.push(run(format!("{}/gpu/{label}", s.name), &s.file, &backend));
        }
    }
    check(results);
}
