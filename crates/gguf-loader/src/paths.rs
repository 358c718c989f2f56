//! Where models live, by the project's convention: `$HIPDECODE_MODELS_DIR` if set, else
//! `<workspace root>/models`.

use std::path::PathBuf;

/// File name of the real test model inside the models directory.
pub const GEMMA3_270M_FILE: &str = "gemma3-270m-q4_k_m.gguf";

/// The models directory.
///
/// # Panics
/// When `HIPDECODE_MODELS_DIR` is not UTF-8 (the message says so): the tools and tests that
/// use this folder must not quietly look elsewhere.
pub fn models_dir() -> PathBuf {
    match crate::knobs::MODELS_DIR.read() {
        Ok(Some(dir)) => PathBuf::from(dir),
        Ok(None) => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models"),
        Err(e) => panic!("{e}"),
    }
}

/// Path of the Gemma 3 270M Q4_K_M test model (it may not exist; see [`require_models`]).
pub fn gemma3_270m_path() -> PathBuf {
    models_dir().join(GEMMA3_270M_FILE)
}

/// Whether real-model tests must run (`HIPDECODE_REQUIRE_MODELS=1`) rather than skip.
///
/// # Panics
/// When the variable holds a value other than empty, `0` or `1`: a test machine's typo must
/// not turn a requirement into a skip.
pub fn require_models() -> bool {
    crate::knobs::REQUIRE_MODELS
        .read()
        .unwrap_or_else(|e| panic!("{e}"))
}
