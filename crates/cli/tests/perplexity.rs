//! `hipdecode perplexity` end to end: on tiny synthetic models against a recomputation from
//! the library's logits, its refusals, and on SmolLM2 over the fixed text when it is present.

use decode::backend::cpu::CpuBackend;
use decode::backend::Precision;
use decode::context::ContextOptions;
use decode::gguf_loader::synth::{write_preset, Preset};
use decode::session::Session;
use decode::tokenizer::Tokenizer;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The fixed text `docs/decode.md` reports figures on.
const FIXED_TEXT: &str = "data/eval/gnu-gpl3-fdl13.txt";

fn scratch(name: &str) -> PathBuf {
    test_support::models::scratch_dir("cli-perplexity").join(format!(
        "{name}-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ))
}

fn tiny_model(preset: Preset) -> PathBuf {
    let path = scratch(preset.name()).with_extension("gguf");
    write_preset(preset, &path, 11).unwrap();
    path
}

/// English prose long enough for a few chunks of a tiny model's tokens.
fn short_text() -> String {
    "The quick brown fox jumps over the lazy dog while the cat sleeps by the warm fire. \
     A river runs through the valley, and the mill turns slowly in the morning light. "
        .repeat(3)
}

/// `hipdecode perplexity` on the CPU: status, stdout, stderr.
fn perplexity(model: &Path, text: &Path, extra: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_hipdecode"))
        .args(["perplexity", "--device", "cpu", "-m"])
        .arg(model)
        .arg("-f")
        .arg(text)
        .args(extra)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The mean NLL recomputed without the command or `decode::nll`: each chunk through a session
/// that keeps every position's logits, the log-softmax written out here. Also the count.
fn recomputed(model: &Path, text: &str, chunk: usize) -> (usize, f64) {
    let file = decode::open_model(model).unwrap();
    let tokenizer = Tokenizer::from_gguf(&file).unwrap();
    let bos = tokenizer.vocab().bos.filter(|_| tokenizer.vocab().add_bos);
    let tokens = tokenizer.encode(text, bos.is_some());
    let options = ContextOptions {
        context: chunk,
        max_batch: ContextOptions::default().max_batch.min(chunk),
        all_logits: true,
        ..Default::default()
    };
    let mut session = Session::load(&file, CpuBackend::new(Precision::Fast), options).unwrap();
    let vocab = session.spec().vocab;
    let (mut sum, mut count) = (0.0f64, 0usize);
    for piece in tokens.chunks_exact(chunk) {
        let mut piece = piece.to_vec();
        if let Some(bos) = bos {
            piece[0] = bos;
        }
        session.reset();
        let logits = session.forward_all_logits(&piece).unwrap();
        for pos in chunk / 2..chunk - 1 {
            let row = &logits[pos * vocab..(pos + 1) * vocab];
            let max = row.iter().fold(f64::MIN, |m, &v| m.max(v as f64));
            let lse = max
                + row
                    .iter()
                    .map(|&v| (v as f64 - max).exp())
                    .sum::<f64>()
                    .ln();
            sum += lse - row[piece[pos + 1] as usize] as f64;
            count += 1;
        }
    }
    (count, sum / count as f64)
}

/// On models with and without BOS, and with a sliding window shorter than the chunk, the
/// command scores `chunks * (chunk - 1 - chunk / 2)` tokens and its mean NLL is the one the
/// library's logits give.
#[test]
fn the_mean_nll_is_the_recomputed_one_over_the_formulas_count() {
    let text = scratch("text").with_extension("txt");
    std::fs::write(&text, short_text()).unwrap();
    for preset in [Preset::TinyQwen3, Preset::TinyLlama, Preset::TinyGemma3] {
        let model = tiny_model(preset);
        let chunk = 16;
        let tokens = {
            let file = decode::open_model(&model).unwrap();
            let t = Tokenizer::from_gguf(&file).unwrap();
            t.encode(&short_text(), t.vocab().add_bos).len()
        };
        assert!(tokens >= 3 * chunk, "{}: {tokens} tokens", preset.name());
        let (code, stdout, stderr) = perplexity(&model, &text, &["--chunk", "16", "--json"]);
        assert_eq!(code, Some(0), "{}: {stderr}", preset.name());
        let report: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
        let chunks = tokens / chunk;
        assert_eq!(report["chunks"], chunks);
        assert_eq!(report["text_tokens"], tokens);
        assert_eq!(report["tokens_scored"], chunks * (chunk - 1 - chunk / 2));
        let mean = report["mean_nll"].as_f64().unwrap();
        assert!(mean.is_finite() && mean > 0.0, "{report}");
        let (count, want) = recomputed(&model, &short_text(), chunk);
        assert_eq!(report["tokens_scored"], count);
        assert!(
            (mean - want).abs() < 1e-9,
            "{}: {mean} vs {want}",
            preset.name()
        );
        let ppl = report["perplexity"].as_f64().unwrap();
        assert!((ppl - mean.exp()).abs() < 1e-9 * ppl, "{report}");
        assert!(report["nll_ci95"].as_f64().unwrap() > 0.0, "{report}");
        assert_eq!(report["kv_cache_type"], "f32");
        assert!(report["device"].as_str().unwrap().starts_with("cpu"));

        // The text report, and a limit on the chunks.
        let (code, stdout, stderr) = perplexity(&model, &text, &["--chunk", "16", "--chunks", "1"]);
        assert_eq!(code, Some(0), "{stderr}");
        for word in [
            "tokens scored  7 (1 chunks of 16",
            "mean NLL",
            "perplexity",
            "KV cache",
        ] {
            assert!(stdout.contains(word), "{word}: {stdout}");
        }
        std::fs::remove_file(&model).ok();
    }
    std::fs::remove_file(&text).ok();
}

#[test]
fn a_short_text_a_bad_chunk_or_a_missing_file_is_refused_with_what_is_needed() {
    let model = tiny_model(Preset::TinyQwen3);
    let text = scratch("short").with_extension("txt");
    std::fs::write(&text, "Too short to score.").unwrap();
    let (code, _, stderr) = perplexity(&model, &text, &["--chunk", "64"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("fewer than the 128 that 2 chunks of 64 need") && stderr.contains("tokens"),
        "{stderr}"
    );
    assert!(stderr.contains(&*text.to_string_lossy()), "{stderr}");

    let (code, _, stderr) = perplexity(&model, &text, &["--chunk", "4096"]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("trained context of 2048"), "{stderr}");

    let (code, _, stderr) = perplexity(&model, &text, &["--chunk", "2"]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("at least 3 tokens"), "{stderr}");

    let missing = Path::new("/nonexistent/eval.txt");
    let (code, _, stderr) = perplexity(&model, missing, &[]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("/nonexistent/eval.txt"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    std::fs::remove_file(&model).ok();
    std::fs::remove_file(&text).ok();
}

/// A real model on 2 chunks of 256 tokens of the fixed text: a perplexity a trained model
/// has on English, neither a uniform guess (49152) nor a broken one.
#[test]
fn smollm2_on_the_fixed_text_has_a_sane_perplexity() {
    let Some(model) = test_support::models::smollm2_path() else {
        return;
    };
    let text = test_support::models::workspace_root().join(FIXED_TEXT);
    let (code, stdout, stderr) = perplexity(
        &model,
        &text,
        &["--chunk", "256", "--chunks", "2", "--json"],
    );
    assert_eq!(code, Some(0), "{stderr}");
    let report: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    let ppl = report["perplexity"].as_f64().unwrap();
    eprintln!(
        "SmolLM2-135M on 2 chunks of 256 of {FIXED_TEXT}: mean NLL {} ± {}, perplexity {ppl:.3}",
        report["mean_nll"], report["nll_ci95"]
    );
    assert_eq!(report["tokens_scored"], 2 * 127);
    assert!((2.0..100.0).contains(&ppl), "{report}");
}
