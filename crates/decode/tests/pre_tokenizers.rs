//! The pre-tokenizer table against its two sources of truth:
//! - llama.cpp's `src/llama-vocab.cpp` (d32676d, from `../shared/tools/llama.cpp` when that is
//!   present): every name we accept must map to the same patterns and `ignore_merges`, and
//!   every other name llama.cpp knows must be listed as refused;
//! - Python's `regex` package applying the same patterns in sequence, as llama.cpp's
//!   `unicode_regex_split` does (`tests/reference/pretokenize_ref.py`): our splits of texts in
//!   many scripts, and of random strings drawn from every part of Unicode, must be identical.

use decode::tokenizer::{PreTokenizer, PRE_TOKENIZER_RECIPES, REFUSED_PRE_TOKENIZERS};
use rand::Rng;
use regex::Regex;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use test_support::models::{skip_unless_required, workspace_root};

/// `src/llama-vocab.cpp` of the llama.cpp snapshot next to the workspace: from a source tree,
/// else from the `.tgz` the shared folder holds. `Err`: why it cannot be read.
fn llama_vocab_cpp() -> Result<String, String> {
    let dir = workspace_root().join("../shared/tools/llama.cpp");
    if !dir.is_dir() {
        return Err(format!("{} is absent", dir.display()));
    }
    for tree in [dir.clone(), dir.join("llama.cpp")] {
        let file = tree.join("src/llama-vocab.cpp");
        if file.is_file() {
            return std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()));
        }
    }
    let tarball = std::fs::read_dir(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.to_string_lossy().ends_with(".tgz"))
        .ok_or_else(|| format!("{} holds no source tree or .tgz", dir.display()))?;
    let list = Command::new("tar")
        .arg("-tzf")
        .arg(&tarball)
        .output()
        .map_err(|e| format!("tar cannot run: {e}"))?;
    let entry = String::from_utf8_lossy(&list.stdout)
        .lines()
        .find(|l| l.ends_with("src/llama-vocab.cpp"))
        .map(str::to_string)
        .ok_or_else(|| format!("{} has no src/llama-vocab.cpp", tarball.display()))?;
    let out = Command::new("tar")
        .arg("-xzOf")
        .arg(&tarball)
        .arg(&entry)
        .output()
        .map_err(|e| format!("tar cannot run: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "tar -xzOf {} {entry}: {}",
            tarball.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    String::from_utf8(out.stdout).map_err(|e| format!("{entry} is not UTF-8: {e}"))
}

/// The value of a C++ string literal's body (between the quotes).
fn unescape_cpp(body: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut chars = body.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('t') => out.push('\t'),
            Some('\\') => out.push('\\'),
            Some('"') => out.push('"'),
            Some('\'') => out.push('\''),
            Some('?') => out.push('?'),
            Some('0') => out.push('\0'),
            other => return Err(format!("escape \\{other:?} in \"{body}\"")),
        }
    }
    Ok(out)
}

/// The string list of a braced initializer starting at `src` (just after `{`): adjacent
/// literals concatenate, `//` comments (which hold commented-out patterns) are skipped.
fn string_list(src: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    let b = src.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                i += src[i..].find('\n').unwrap_or(src.len() - i);
            }
            b'"' => {
                let mut j = i + 1;
                while j < b.len() && b[j] != b'"' {
                    j += if b[j] == b'\\' { 2 } else { 1 };
                }
                let body = src.get(i + 1..j).ok_or("an unterminated literal")?;
                current
                    .get_or_insert_with(String::new)
                    .push_str(&unescape_cpp(body)?);
                i = j + 1;
            }
            b',' | b'}' => {
                out.extend(current.take());
                if b[i] == b'}' {
                    return Ok(out);
                }
                i += 1;
            }
            _ => i += 1,
        }
    }
    Err("an initializer without its closing brace".into())
}

/// What llama.cpp makes of each name: its patterns, and whether it sets `ignore_merges`.
type Table = BTreeMap<String, (Vec<String>, bool)>;

fn parse_llama_vocab(src: &str) -> Result<Table, String> {
    // The switch over pre-tokenizer types in `llm_tokenizer_bpe`'s constructor.
    let switch = src
        .split("struct llm_tokenizer_bpe : llm_tokenizer")
        .nth(1)
        .and_then(|s| s.split("std::vector<std::string> regex_exprs;").next())
        .ok_or("no llm_tokenizer_bpe constructor")?;
    let mut by_type: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut labels = Vec::new();
    let item = Regex::new(r"case (LLAMA_VOCAB_PRE_TYPE_\w+):|default:|regex_exprs = \{").unwrap();
    for m in item.find_iter(switch) {
        let text = m.as_str();
        if let Some(t) = text.strip_prefix("case ") {
            labels.push(t.trim_end_matches(':').to_string());
        } else if text == "default:" {
            labels.push("default".to_string());
        } else {
            let list = string_list(&switch[m.end()..])?;
            for label in labels.drain(..) {
                by_type.insert(label, list.clone());
            }
        }
    }
    let fallback = by_type.get("default").ok_or("no default: case")?.clone();
    // The chain of `tokenizer_pre == "..."` tests that picks the type of each name.
    let chain = src
        .split("if (tokenizer_pre.empty())")
        .nth(1)
        .and_then(|s| s.split("unknown pre-tokenizer type").next())
        .ok_or("no tokenizer_pre chain")?;
    let item = Regex::new(
        r#"tokenizer_pre == "([^"]*)"|pre_type = (LLAMA_VOCAB_PRE_TYPE_\w+)|ignore_merges = true"#,
    )
    .unwrap();
    let mut table = Table::new();
    let mut group: Vec<String> = Vec::new();
    let mut group_done = false;
    for c in item.captures_iter(chain) {
        if let Some(name) = c.get(1) {
            if group_done {
                group.clear();
                group_done = false;
            }
            group.push(name.as_str().to_string());
        } else if let Some(ty) = c.get(2) {
            // A type without a case of its own takes the `default:` patterns.
            let patterns = by_type.get(ty.as_str()).unwrap_or(&fallback);
            for name in &group {
                table.insert(name.clone(), (patterns.clone(), false));
            }
            group_done = true;
        } else {
            for name in &group {
                if let Some(entry) = table.get_mut(name) {
                    entry.1 = true;
                }
            }
        }
    }
    if table.len() < 60 {
        return Err(format!("only {} names parsed: {table:?}", table.len()));
    }
    Ok(table)
}

#[test]
fn the_pattern_table_is_llama_cpp_s() {
    let src = match llama_vocab_cpp() {
        Ok(src) => src,
        Err(why) => {
            eprintln!("skipping: llama.cpp's llama-vocab.cpp is not readable: {why}");
            return;
        }
    };
    let theirs = parse_llama_vocab(&src).expect("llama-vocab.cpp parses");
    let mut wrong = Vec::new();
    let mut ours = BTreeSet::new();
    for recipe in PRE_TOKENIZER_RECIPES {
        for &name in recipe.names {
            ours.insert(name);
            let patterns: Vec<String> = recipe.patterns.iter().map(|p| p.to_string()).collect();
            match theirs.get(name) {
                None => wrong.push(format!("{name}: llama.cpp has no such name")),
                Some((p, _)) if *p != patterns => wrong.push(format!(
                    "{name}: patterns differ\n  ours:     {patterns:?}\n  llama.cpp: {p:?}"
                )),
                Some((_, ignore)) if *ignore != recipe.ignore_merges => wrong.push(format!(
                    "{name}: ignore_merges is {} here, {ignore} in llama.cpp",
                    recipe.ignore_merges
                )),
                Some(_) => {}
            }
        }
    }
    let refused: BTreeSet<&str> = REFUSED_PRE_TOKENIZERS.iter().map(|r| r.name).collect();
    for name in theirs.keys() {
        if !ours.contains(name.as_str()) && !refused.contains(name.as_str()) {
            wrong.push(format!("{name}: neither accepted nor listed as refused"));
        }
    }
    for name in &refused {
        if ours.contains(name) {
            wrong.push(format!("{name}: both accepted and refused"));
        }
        if !theirs.contains_key(*name) {
            wrong.push(format!("{name}: refused, but llama.cpp has no such name"));
        }
        let e = PreTokenizer::for_name(Some(name))
            .err()
            .map(|e| e.to_string());
        if !e.as_deref().is_some_and(|e| e.contains(name)) {
            wrong.push(format!(
                "{name}: listed as refused but for_name gives {e:?}"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Hand-written texts in the scripts where `\p{L}`, `\p{M}` and `\p{N}` matter most.
const TEXTS: &[&str] = &[
    "नमस्ते दुनिया, यह एक परीक्षण है। १२३४५ रुपये क्षत्रिय",
    "আমি বাংলায় গান গাই। ০১২৩৪৫৬৭৮৯ টাকা ক্ষমা",
    "สวัสดีครับ ภาษาไทยไม่มีช่องว่าง ๑๒๓ เก้า",
    "بِسْمِ اللَّهِ الرَّحْمَٰنِ الرَّحِيمِ ١٢٣٤ ۱۲۳ «مرحبا»؟",
    "안녕하세요, 세계! 한국어 텍스트 123개 ᄒᆞᆫ글 ㄱㄴㄷ",
    "👩\u{200d}👩\u{200d}👧\u{200d}👦 family 👨🏽\u{200d}💻 coder 🏳\u{fe0f}\u{200d}🌈 ❤\u{fe0f}\u{200d}🔥 1\u{fe0f}\u{20e3} #\u{fe0f}\u{20e3}",
    "0123 ٠١٢٣ ۰۱۲۳ ०१२३ ০১২৩ ๐๑๒๓ ０１２ ²³ ½ Ⅻ 𝟘𝟙𝟚 12345678901 3.14159 1,000,000",
    "東京タワーは333メートルです。ひらがなカタカナ漢字、中文标点！",
    "a\u{a0}b\u{3000}c\t\td\r\n\r\ne   f \u{2028}g\u{85}h  \n\n   ",
    "I'M don't WE'LL it's 'S 'Ve they'RE 'd'll",
    "fn main() {\n    let x = 42;\n    println!(\"{x}\");\n}\n",
    "e\u{301}cole nai\u{308}ve Ω≈ç√∫ Ἀθῆναι Москва ‘quotes’ — dash… ok",
    "ไทย१२३abc٣٤٥ΑΒΓ한글123👍🏿!?\n\n\tend",
    "",
    " ",
    "\n",
];

/// Every 128-code-point range holding an assigned character (Unicode blocks start at
/// multiples of 16, nearly all at multiples of 128, so each block lies in one or more of
/// these), each with its assigned characters. "Assigned" is the `regex` crate's Unicode
/// version, which Python's `regex` equals or follows.
fn unicode_ranges() -> Vec<Vec<char>> {
    let assigned = Regex::new(r"^\P{Cn}$").unwrap();
    let mut ranges = Vec::new();
    for start in (0..=char::MAX as u32).step_by(128) {
        // The private-use planes (15, 16) are one class: their first and last ranges do.
        if (0xF0080..0xFFF80).contains(&start) || (0x100080..0x10FF80).contains(&start) {
            continue;
        }
        let chars: Vec<char> = (start..start + 128)
            .filter_map(char::from_u32)
            .filter(|c| assigned.is_match(c.encode_utf8(&mut [0; 4])))
            .collect();
        if !chars.is_empty() {
            ranges.push(chars);
        }
    }
    ranges
}

/// Random strings, seeded: string `k` draws from range `k` (so every range is used) and two
/// random others, mixed with spaces, newlines, digits, apostrophes and ASCII.
fn random_texts() -> Vec<String> {
    let ranges = unicode_ranges();
    let glue: Vec<char> = " \n\r\t'sStT0123456789aZ.,!?-_()[]\u{a0}\u{200d}\u{301}"
        .chars()
        .collect();
    let mut rng = test_support::rng::seeded(25);
    let mut texts = Vec::new();
    for own in &ranges {
        let pools = [
            own,
            &ranges[rng.random_range(0..ranges.len())],
            &ranges[rng.random_range(0..ranges.len())],
        ];
        let len = rng.random_range(1..40);
        let text: String = (0..len)
            .map(|_| {
                if rng.random_bool(0.35) {
                    glue[rng.random_range(0..glue.len())]
                } else {
                    let pool = pools[rng.random_range(0..pools.len())];
                    pool[rng.random_range(0..pool.len())]
                }
            })
            .collect();
        texts.push(text);
    }
    texts
}

/// Python `regex`'s splits of every text by every pattern list, or `None` after a printed
/// skip (a failure under `HIPDECODE_REQUIRE_MODELS=1`, as CI runs).
fn python_splits(lists: &[Vec<&str>], texts: &[String]) -> Option<Vec<Vec<Vec<String>>>> {
    let script: PathBuf = workspace_root().join("tests/reference/pretokenize_ref.py");
    match Command::new("python3")
        .args(["-c", "import regex"])
        .output()
    {
        Err(_) => return skip_unless_required("python3 is not installed"),
        Ok(o) if !o.status.success() => return skip_unless_required(
            "Python's regex is missing: python3 -m pip install -r tests/reference/requirements.txt",
        ),
        Ok(_) => {}
    }
    let mut child = Command::new("python3")
        .arg(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 starts");
    let request = serde_json::json!({ "pattern_lists": lists, "texts": texts });
    let mut stdin = child.stdin.take().expect("stdin");
    // Written from a thread: the script answers while it reads, and both pipes are large.
    let writer = std::thread::spawn(move || stdin.write_all(request.to_string().as_bytes()));
    let out = child.wait_with_output().expect("python3 ends");
    let written = writer.join().expect("the writer thread ends");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}: {stderr}", script.display());
    written.expect("the texts reach python");
    let reply: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON splits");
    Some(serde_json::from_value(reply["splits"].clone()).expect("lists of lists of pieces"))
}

#[test]
fn pre_tokenizers_split_as_python_regex_splits_with_llama_cpp_s_patterns() {
    // One name per distinct pattern list.
    let mut lists: Vec<Vec<&str>> = Vec::new();
    let mut names = Vec::new();
    for recipe in PRE_TOKENIZER_RECIPES {
        let patterns = recipe.patterns_run();
        if !lists.contains(&patterns) {
            lists.push(patterns);
            names.push(recipe.names[0]);
        }
    }
    let mut texts: Vec<String> = TEXTS.iter().map(|t| t.to_string()).collect();
    texts.extend(random_texts());
    let Some(theirs) = python_splits(&lists, &texts) else {
        return;
    };
    assert_eq!(theirs.len(), lists.len());
    let mut wrong = Vec::new();
    let mut per_name = BTreeMap::new();
    for (name, theirs) in names.iter().zip(&theirs) {
        let pre = PreTokenizer::for_name(Some(name)).unwrap();
        for (text, want) in texts.iter().zip(theirs) {
            let got = pre.split(text);
            assert_eq!(got.concat(), *text, "{name}: the pieces lose text");
            if got != *want {
                *per_name.entry(*name).or_insert(0) += 1;
                wrong.push(format!(
                    "{name} {text:?}\n  ours:   {got:?}\n  python: {want:?}"
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} splits differ ({per_name:?}); the first:\n{}",
        wrong.len(),
        texts.len() * names.len(),
        wrong[..wrong.len().min(30)].join("\n")
    );
}
