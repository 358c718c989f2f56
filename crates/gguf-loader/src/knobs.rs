//! The `HIPDECODE_*` variables this crate reads (see the `knobs` crate).

use knobs::{parse, Knob, Scope, Table};

pub static MODELS_DIR: Knob<Option<String>> = Knob {
    name: "HIPDECODE_MODELS_DIR",
    default: "",
    doc: "the models folder that `cargo xtask fetch-model` fills and the tests read (unset: \
          <workspace>/models)",
    scope: Scope::Test,
    parse: parse::text,
};

pub static REQUIRE_MODELS: Knob<bool> = Knob {
    name: "HIPDECODE_REQUIRE_MODELS",
    default: "0",
    doc: "1: a real-model test whose model or Python reference is missing fails instead of \
          skipping",
    scope: Scope::Test,
    parse: parse::switch,
};

pub static TABLE: Table = &[&MODELS_DIR, &REQUIRE_MODELS];
