//! The sampler's chain against its numpy version (`tests/reference/sampling_ref.py`, written
//! from each transform's documented formula): on random logits and token histories, the
//! penalised logits agree, the chain keeps the same tokens, and their probabilities agree.

use decode::sampler::{apply_penalties, Sampler, SamplerConfig};
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use std::io::Write;
use std::process::{Command, Stdio};
use test_support::models::{skip_unless_required, workspace_root};

fn configs() -> Vec<SamplerConfig> {
    let base = SamplerConfig {
        temperature: 0.8,
        top_k: 0,
        top_p: 1.0,
        ..SamplerConfig::default()
    };
    vec![
        SamplerConfig {
            repeat_penalty: 1.3,
            ..base
        },
        SamplerConfig {
            presence_penalty: 0.7,
            frequency_penalty: -0.4,
            repeat_last_n: 16,
            ..base
        },
        SamplerConfig {
            min_p: 0.05,
            ..base
        },
        SamplerConfig {
            temperature: 1.4,
            top_k: 20,
            top_p: 0.9,
            min_p: 0.02,
            repeat_penalty: 1.1,
            presence_penalty: 0.3,
            frequency_penalty: 0.2,
            repeat_last_n: 64,
            seed: 0,
        },
    ]
}

#[test]
fn the_chain_matches_its_numpy_version_on_random_logits() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let mut cases = Vec::new();
    for config in configs() {
        for _ in 0..25 {
            let vocab = rng.random_range(8..300);
            let logits: Vec<f32> = (0..vocab).map(|_| rng.random_range(-6.0..6.0)).collect();
            let recent: Vec<u32> = (0..rng.random_range(0..120))
                .map(|_| rng.random_range(0..vocab as u32 + 4))
                .collect();
            cases.push((config, logits, recent));
        }
    }
    let request = json!({
        "cases": cases.iter().map(|(c, logits, recent)| json!({
            "logits": logits,
            "recent": recent,
            "config": {
                "temperature": c.temperature, "top_k": c.top_k, "top_p": c.top_p,
                "min_p": c.min_p, "repeat_penalty": c.repeat_penalty,
                "presence_penalty": c.presence_penalty,
                "frequency_penalty": c.frequency_penalty, "repeat_last_n": c.repeat_last_n,
            },
        })).collect::<Vec<_>>(),
    });
    let Some(want) = numpy(&request) else {
        return;
    };
    let results = want["results"].as_array().expect("results");
    assert_eq!(results.len(), cases.len());
    for (i, ((config, logits, recent), want)) in cases.iter().zip(results).enumerate() {
        let what = format!("case {i} ({config:?})");
        let mut penalized = logits.clone();
        apply_penalties(&mut penalized, recent, config);
        let py: Vec<f64> = serde_json::from_value(want["penalized"].clone()).unwrap();
        for (t, (&got, &w)) in penalized.iter().zip(&py).enumerate() {
            assert!(
                (f64::from(got) - w).abs() <= 1e-5 * w.abs().max(1.0),
                "{what}: token {t}'s penalised logit {got} where numpy has {w}"
            );
        }
        let mut sampler = Sampler::new(*config).expect("valid settings");
        let mut raw = logits.clone();
        let dist = sampler.distribution(&mut raw, recent);
        let kept: Vec<u32> = dist.iter().map(|&(t, _)| t).collect();
        let py_kept: Vec<u32> = serde_json::from_value(want["kept"].clone()).unwrap();
        assert_eq!(kept, py_kept, "{what}: the kept tokens");
        let py_probs: Vec<f64> = serde_json::from_value(want["probs"].clone()).unwrap();
        for ((t, p), w) in dist.iter().zip(&py_probs) {
            assert!(
                (p - w).abs() <= 1e-5,
                "{what}: token {t} p {p} where numpy has {w}"
            );
        }
    }
}

/// numpy's results, or `None` (skipped) without python3 and numpy.
fn numpy(request: &Value) -> Option<Value> {
    let script = workspace_root().join("tests/reference/sampling_ref.py");
    let Ok(mut child) = Command::new("python3")
        .arg(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    else {
        return skip_unless_required("python3 is not installed");
    };
    let mut stdin = child.stdin.take().expect("stdin");
    // A python that stops before reading (numpy missing) closes the pipe: its stderr says why.
    if let Err(e) = stdin.write_all(request.to_string().as_bytes()) {
        assert_eq!(
            e.kind(),
            std::io::ErrorKind::BrokenPipe,
            "the cases reach python: {e}"
        );
    }
    drop(stdin);
    let out = child.wait_with_output().expect("python3 ends");
    let stderr = String::from_utf8_lossy(&out.stderr);
    if stderr.contains("No module named 'numpy'") {
        return skip_unless_required(
            "numpy is missing: python3 -m pip install -r tests/reference/requirements.txt",
        );
    }
    assert!(out.status.success(), "sampling_ref.py failed: {stderr}");
    Some(serde_json::from_slice(&out.stdout).expect("JSON results"))
}
