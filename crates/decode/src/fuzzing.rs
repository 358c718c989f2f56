//! The hostile-input harnesses shared by the cargo-fuzz targets in `fuzz/` and the tests: a
//! model and a tokenizer built from arbitrary bytes. Either may refuse the bytes with an error;
//! any panic, abort or hang is a bug.

use crate::backend::cpu::CpuBackend;
use crate::backend::Precision;
use crate::context::ContextOptions;
use crate::session::Session;
use crate::tokenizer::{TextStream, Tokenizer};
use gguf_loader::GgufFile;
use std::sync::Arc;

/// Text with spaces, digits, multi-byte characters and the special-token texts of the synthetic
/// vocabularies, so that every encoder path runs.
const TEXT: &str = "Hello  world 12345\n<start_of_turn>user ünï 日本<end_of_turn><|im_end|>\t!";

/// Opens `data` as a GGUF image and, when it opens, loads it as a model with a small cache and
/// runs two tokens through it. Returns whether a model was loaded (for statistics only).
pub fn load_model(data: &[u8]) -> bool {
    let Ok(file) = GgufFile::from_bytes(data.to_vec()) else {
        return false;
    };
    let options = ContextOptions {
        context: 8,
        max_batch: 2,
        all_logits: false,
        sequences: 1,
        kv_blocks: None,
    };
    let Ok(mut model) = Session::load(&Arc::new(file), CpuBackend::new(Precision::Fast), options)
    else {
        return false;
    };
    let vocab = model.spec().vocab as u32;
    let tokens = [0, vocab.saturating_sub(1)];
    if model.forward(&tokens).is_ok() {
        let _ = model.last_argmax();
        let _ = model.decode(1 % vocab.max(1));
    }
    true
}

/// Opens `data` as a GGUF image and, when it opens, builds its tokenizer and encodes, decodes
/// and streams a fixed text. Returns whether a tokenizer was built.
pub fn build_tokenizer(data: &[u8]) -> bool {
    let Ok(file) = GgufFile::from_bytes(data.to_vec()) else {
        return false;
    };
    let Ok(tokenizer) = Tokenizer::from_gguf(&file) else {
        return false;
    };
    let ids = tokenizer.encode(TEXT, true);
    let _ = tokenizer.decode(&ids);
    let mut stream = TextStream::new(&tokenizer);
    for &id in &ids {
        let _ = stream.push(id);
        let _ = tokenizer.is_stop(id);
    }
    let _ = stream.finish();
    // Ids past the vocabulary decode to nothing rather than panicking.
    let _ = tokenizer.decode(&[u32::MAX, tokenizer.len() as u32]);
    true
}
