//! Arbitrary bytes as a tokenizer: built from the GGUF vocabulary, then encoding, decoding and
//! streaming a fixed text. Errors are fine; a panic is a bug.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    decode::fuzzing::build_tokenizer(data);
});
