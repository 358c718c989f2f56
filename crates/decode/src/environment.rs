//! The `HIPDECODE_*` variables ("knobs") of every crate the `hipdecode` binary links, gathered
//! from their tables, and this crate's own table.
//!
//! Each knob is defined once, beside the type it sets, in the crate that reads it. The binary
//! checks them all at start-up whatever the device: a malformed limit is an error even on a CPU
//! run that never creates an allocator, and a name no table defines (a typo) is a warning that
//! names the nearest known one. `hipdecode env` lists them, and docs/memory.md carries their
//! table (checked against [`markdown_table`] by a test).

use crate::error::Result;
use knobs::{Env, Knob, Scope, Table};

pub static SYNTH_MODELS: Knob<Option<String>> = Knob {
    name: "HIPDECODE_SYNTH_MODELS",
    default: "",
    doc: "real-shape synthetic models (`cargo xtask synth-model`) the GPU tests also run, \
          colon-separated paths (they are several GB, so they are made where the GPU is)",
    scope: Scope::Test,
    parse: knobs::parse::text,
};

pub static BLESS_GOLDEN: Knob<Option<String>> = Knob {
    name: "HIPDECODE_BLESS_GOLDEN",
    default: "",
    doc: "a path: the golden-token test writes the committed file with this run's entries \
          replaced there, instead of comparing",
    scope: Scope::Test,
    parse: knobs::parse::text,
};

/// Retired: the KV cache type is the flags' now, since a context's type belongs with its
/// other sizes on the command line (and llama.cpp users know the flags). Kept as a knob whose
/// every value is an error, so a script that still sets it stops instead of running on f16.
pub static RETIRED_KV_TYPE: Knob<()> = Knob {
    name: "HIPDECODE_KV_TYPE",
    default: "",
    doc: "retired: any value is an error; the KV cache type is `-ctk` / `--cache-type-k` and \
          `-ctv` / `--cache-type-v` (f32, f16, q8_0)",
    scope: Scope::Run,
    parse: |v| {
        if v.is_empty() {
            Ok(())
        } else {
            Err(
                "the KV cache type moved to the flags -ctk/--cache-type-k and \
                 -ctv/--cache-type-v; unset HIPDECODE_KV_TYPE and pass, e.g., -ctk f32 -ctv f32"
                    .into(),
            )
        }
    },
};

/// This crate's knobs.
pub static TABLE: Table = &[
    &RETIRED_KV_TYPE,
    &crate::backend::gpu::MATVEC_PATH,
    &crate::backend::gpu::vendor_gemm::GPU_PREFILL,
    &crate::backend::gpu::ATTN_PREFILL,
    &crate::backend::gpu::ATTN_DECODE,
    &crate::backend::gpu::MMA_MAX_ROWS,
    &crate::backend::gpu::INT8_MMA_MAX_ROWS,
    &crate::backend::gpu::MOE_GROUPED,
    &crate::backend::gpu::MOE_INDEX,
    &crate::backend::gpu::EMBED_TABLE,
    &crate::backend::gpu::KV_POOL,
    &crate::backend::gpu::capture_stream::CAPTURE_STREAM,
    &crate::backend::gpu::capture_stream::GRAPH_POOL,
    &crate::backend::gpu::GRAPH_ROWS,
    &crate::backend::gpu::CPU_SHARE,
    &crate::backend::host::pool::HOST_POOL,
    &crate::backend::gpu::offload::prefetch::OFFLOAD_PREFILL,
    &crate::budget_run::OFFLOAD_STREAM,
    &crate::budget_run::HOST_BUDGET,
    &crate::layout::kv_fit::KV_BUDGET,
    &crate::engine::KV_IDLE_RELEASE,
    &crate::kv::KV_BLOCK,
    &SYNTH_MODELS,
    &BLESS_GOLDEN,
];

/// The tables of every crate the binary links, lowest first.
pub fn tables() -> [Table; 6] {
    [
        hip_ffi::knobs::TABLE,
        rocm_alloc::knobs::TABLE,
        rocm_kernels::knobs::TABLE,
        gguf_loader::knobs::TABLE,
        offload::knobs::TABLE,
        TABLE,
    ]
}

/// Checks the process environment; returns warnings to print.
pub fn check() -> Result<Vec<String>> {
    check_env(&Env::process())
}

/// Like [`check`], over `env`.
pub fn check_env(env: &Env) -> Result<Vec<String>> {
    Ok(knobs::check(&tables(), env)?)
}

/// `hipdecode env`: every knob with its value here, or its default.
pub fn listing(env: &Env) -> String {
    knobs::listing(&tables(), env)
}

/// The knob table of docs/memory.md.
pub fn markdown_table() -> String {
    knobs::markdown_table(&tables())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&'static str, &'static str)]) -> Env {
        Env::from_pairs(pairs.iter().copied())
    }

    #[test]
    /// Every crate's table (each name once, with a doc and a default its parser takes).
    fn the_tables_are_valid_and_every_name_is_defined_once() {
        knobs::validate(&tables()).unwrap();
    }

    #[test]
    fn the_prefill_switch_is_known_and_checked() {
        let ok = check_env(&env(&[("HIPDECODE_GPU_PREFILL", "kernels")])).unwrap();
        assert!(ok.is_empty(), "{ok:?}");
        let e = check_env(&env(&[("HIPDECODE_GPU_PREFILL", "cublas")]))
            .unwrap_err()
            .to_string();
        for word in [
            "HIPDECODE_GPU_PREFILL",
            "cublas",
            "auto",
            "vendor",
            "kernels",
        ] {
            assert!(e.contains(word), "{word} missing from: {e}");
        }
    }

    #[test]
    fn the_budget_attention_and_matvec_depth_switches_are_known_and_checked() {
        let ok = check_env(&env(&[
            ("HIPDECODE_GPU_BUDGET", "8GiB"),
            ("HIPDECODE_HOST_BUDGET", "32GiB"),
            ("HIPDECODE_GPU_ATTN_PREFILL", "per-query"),
            ("HIPDECODE_GPU_ATTN_DECODE", "warp-per-key"),
            ("HIPDECODE_MATVEC_DEPTH", "4"),
            ("HIPDECODE_MATVEC_BLOCKS_PER_SM", "8"),
            ("HIPDECODE_GPU_PDL", "off"),
        ]))
        .unwrap();
        assert!(ok.is_empty(), "{ok:?}");
        for (var, bad) in [
            ("HIPDECODE_GPU_BUDGET", "lots"),
            ("HIPDECODE_HOST_BUDGET", "half"),
            ("HIPDECODE_GPU_ATTN_PREFILL", "flashy"),
            ("HIPDECODE_GPU_ATTN_DECODE", "tiles"),
            ("HIPDECODE_GPU_MMA_ROWS", "many"),
            ("HIPDECODE_GPU_INT8_MMA_ROWS", "all"),
            ("HIPDECODE_GPU_MOE_GROUPED", "cublas"),
            ("HIPDECODE_GPU_EMBED_TABLE", "pinned"),
            ("HIPDECODE_MATVEC_DEPTH", "3"),
            ("HIPDECODE_MATVEC_BLOCKS_PER_SM", "lots"),
            ("HIPDECODE_GPU_PDL", "on"),
        ] {
            let e = check_env(&env(&[(var, bad)])).unwrap_err().to_string();
            assert!(e.contains(var) && e.contains(bad), "{e}");
        }
    }

    #[test]
    fn the_offload_switches_are_known_and_checked() {
        let ok = check_env(&env(&[
            ("HIPDECODE_OFFLOAD_CPU_SHARE", "off"),
            ("HIPDECODE_HOST_POOL", "rayon"),
            ("HIPDECODE_OFFLOAD_PREFILL", "in-place"),
            ("HIPDECODE_OFFLOAD_STREAM", "off"),
        ]))
        .unwrap();
        assert!(ok.is_empty(), "{ok:?}");
        for (var, bad, accepted) in [
            ("HIPDECODE_OFFLOAD_CPU_SHARE", "most", "auto"),
            ("HIPDECODE_HOST_POOL", "tokio", "spin"),
            ("HIPDECODE_OFFLOAD_PREFILL", "copy", "in-place"),
            ("HIPDECODE_OFFLOAD_STREAM", "on", "auto"),
        ] {
            let e = check_env(&env(&[(var, bad)])).unwrap_err().to_string();
            assert!(
                e.contains(var) && e.contains(bad) && e.contains(accepted),
                "{e}"
            );
        }
    }

    #[test]
    fn a_malformed_limit_is_an_error_naming_the_variable_value_and_forms() {
        let e = check_env(&env(&[("HIPDECODE_CACHE_LIMIT", "abc")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("HIPDECODE_CACHE_LIMIT"), "{e}");
        assert!(e.contains("\"abc\""), "{e}");
        assert!(e.contains("accepted forms"), "{e}");
    }

    #[test]
    fn the_matvec_path_is_checked_strictly() {
        assert!(check_env(&env(&[("HIPDECODE_GPU_MATVEC", "int8")])).is_ok());
        assert!(check_env(&env(&[("HIPDECODE_GPU_MATVEC", "exact")])).is_ok());
        let e = check_env(&env(&[("HIPDECODE_GPU_MATVEC", "fast")]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("HIPDECODE_GPU_MATVEC") && e.contains("'int8'"),
            "{e}"
        );
    }

    #[test]
    fn an_unknown_name_is_a_warning_naming_the_nearest_known_one() {
        let w = check_env(&env(&[
            ("HIPDECODE_CACHE_LIMT", "1G"),
            ("HIPDECODE_MEMORY_LIMIT", "50%"),
        ]))
        .unwrap();
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("HIPDECODE_CACHE_LIMT"), "{}", w[0]);
        assert!(
            w[0].contains("did you mean HIPDECODE_CACHE_LIMIT?"),
            "{}",
            w[0]
        );
    }

    #[test]
    fn the_docs_carry_the_current_knob_table() {
        let doc_path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/memory.md");
        let doc = std::fs::read_to_string(doc_path).expect("docs/memory.md");
        let (begin, end) = ("<!-- knobs:begin -->\n", "<!-- knobs:end -->");
        let start = doc
            .find(begin)
            .expect("docs/memory.md has a knobs:begin marker")
            + begin.len();
        let stop = doc[start..].find(end).expect("a knobs:end marker") + start;
        let table = markdown_table();
        assert!(
            doc[start..stop] == table,
            "docs/memory.md's knob table is stale; replace the text between the markers with \
             `hipdecode env --markdown`:\n{table}"
        );
    }
}
