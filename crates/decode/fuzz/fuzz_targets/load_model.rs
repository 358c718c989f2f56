//! Arbitrary bytes as a model: `Session::load` on the CPU backend, then two tokens forward. Errors
//! are fine; a panic, an allocation abort or a hang is a bug.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    decode::fuzzing::load_model(data);
});
