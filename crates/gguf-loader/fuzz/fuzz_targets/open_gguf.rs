//! Arbitrary bytes as a GGUF file: opening, reading metadata, dequantizing tensors, describing
//! the model and rendering reports must never panic, whatever the input.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    gguf_loader::fuzzing::exercise(data);
});
