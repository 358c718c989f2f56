//! The model columns of a result row: name, size and parameter count, as llama-bench shows
//! them.

use decode::GgufFile;
use std::path::Path;

/// What identifies a model in the report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelInfo {
    /// The file name (the directory is noise in a table).
    pub name: String,
    /// The path as given.
    pub path: String,
    /// Bytes of tensor data (what the weights take, without metadata).
    pub size_bytes: u64,
    /// Elements over all tensors.
    pub params: u64,
}

impl ModelInfo {
    pub fn from_file(path: &Path, file: &GgufFile) -> ModelInfo {
        let (size_bytes, params) = file.tensors().iter().fold((0u64, 0u64), |(b, p), t| {
            (
                b.saturating_add(t.n_bytes),
                p.saturating_add(t.n_elements()),
            )
        });
        ModelInfo {
            name: file_name(path),
            path: path.display().to_string(),
            size_bytes,
            params,
        }
    }
}

/// The last component of a path, or the whole path when it has none.
pub fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

/// Size in GiB with two decimals (`4.58 GiB`).
pub fn format_size(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// Parameters in billions from 1e9 on, else in millions (`8.03 B`, `268.10 M`).
pub fn format_params(params: u64) -> String {
    let p = params as f64;
    if p >= 1e9 {
        format!("{:.2} B", p / 1e9)
    } else {
        format!("{:.2} M", p / 1e6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_parameter_counts_read_like_llama_bench() {
        assert_eq!(format_size(4_920_000_000), "4.58 GiB");
        assert_eq!(format_size(0), "0.00 GiB");
        assert_eq!(format_params(8_030_261_248), "8.03 B");
        assert_eq!(format_params(268_098_176), "268.10 M");
        assert_eq!(format_params(123_456), "0.12 M");
    }

    #[test]
    fn the_name_is_the_file_name() {
        assert_eq!(file_name(Path::new("/m/gemma.gguf")), "gemma.gguf");
        assert_eq!(file_name(Path::new("x.gguf")), "x.gguf");
        assert_eq!(file_name(Path::new("/")), "/");
    }
}
