//! The `HIPDECODE_*` environment variables, checked once at start-up whatever the device: a
//! malformed limit is an error even on a CPU run that never creates an allocator, and a name
//! nothing reads (a typo) is a warning listing the names that are read.

use crate::error::{DecodeError, Result};

/// Every `HIPDECODE_*` variable the workspace reads, each taken from the crate that reads it;
/// the test-only switches are listed by name.
pub fn known_vars() -> Vec<&'static str> {
    let mut v: Vec<&'static str> = rocm_alloc::limits::ENV_VARS.to_vec();
    v.extend([
        rocm_kernels::cache::CACHE_VAR,
        hip_ffi::knobs::PLATFORM.name,
        hip_ffi::knobs::REQUIRE_GPU.name,
        hip_ffi::knobs::NVRTC_PATH.name,
        crate::backend::gpu::MATVEC_VAR,
        crate::backend::gpu::KV_TYPE_VAR,
        crate::backend::vendor_gemm::PrefillPath::ENV,
        crate::backend::gpu::ATTN_PREFILL_VAR,
        crate::backend::gpu::CPU_SHARE_VAR,
        crate::backend::host_pool::POOL_VAR,
        crate::backend::prefetch::PREFILL_VAR,
        crate::budget_run::STREAM_VAR,
        rocm_kernels::kernels::MATVEC_DEPTH_VAR,
        rocm_kernels::kernels::MATVEC_BLOCKS_PER_SM_VAR,
        rocm_kernels::kernels::EARLY_LAUNCH_VAR,
        crate::backend::gpu::capture_stream::CAPTURE_STREAM_VAR,
        crate::backend::gpu::capture_stream::GRAPH_POOL_VAR,
        rocm_alloc::TRIM_WINDOW_ENV,
        offload::BUDGET_ENV,
        crate::budget_run::HOST_BUDGET_ENV,
        hip_ffi::knobs::REQUIRE_BLAS.name,
        hip_ffi::knobs::REQUIRE_RTC.name,
        "HIPDECODE_REQUIRE_MODELS",
        "HIPDECODE_MODELS_DIR",
        "HIPDECODE_SYNTH_MODELS",
    ]);
    v
}

/// Checks the process environment; returns warnings to print.
pub fn check() -> Result<Vec<String>> {
    let vars: Vec<(String, String)> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.to_string_lossy().into_owned())))
        .collect();
    check_vars(&vars)
}

/// Like [`check`], over the given `(name, value)` pairs.
pub fn check_vars(vars: &[(String, String)]) -> Result<Vec<String>> {
    let lookup = |name: &str| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    rocm_alloc::limits::check_env_with(&lookup)
        .map_err(|e| DecodeError::InvalidArgument(e.to_string()))?;
    if let Some(v) = lookup(crate::backend::gpu::MATVEC_VAR) {
        crate::backend::gpu::MatvecPath::parse(&v)?;
    }
    if let Some(v) = lookup(crate::backend::gpu::KV_TYPE_VAR) {
        crate::backend::gpu::KvType::parse(&v)?;
    }
    if let Some(v) = lookup(crate::backend::vendor_gemm::PrefillPath::ENV) {
        crate::backend::vendor_gemm::PrefillPath::parse(&v)?;
    }
    if let Some(v) = lookup(crate::backend::gpu::ATTN_PREFILL_VAR) {
        crate::backend::gpu::AttnPrefill::parse(&v)?;
    }
    if let Some(v) = lookup(crate::backend::gpu::CPU_SHARE_VAR) {
        crate::backend::gpu::CpuShare::parse(&v)?;
    }
    if let Some(v) = lookup(crate::backend::host_pool::POOL_VAR) {
        crate::backend::host_pool::PoolKind::parse(&v)?;
    }
    if let Some(v) = lookup(crate::backend::prefetch::PREFILL_VAR) {
        crate::backend::prefetch::HostPrefill::parse(&v)?;
    }
    if let Some(v) = lookup(crate::budget_run::STREAM_VAR) {
        crate::budget_run::parse_stream(&v)?;
    }
    if let Some(v) = lookup(rocm_kernels::kernels::MATVEC_DEPTH_VAR) {
        rocm_kernels::kernels::matvec_depth(Some(&v))
            .map_err(|e| DecodeError::InvalidArgument(e.to_string()))?;
    }
    if let Some(v) = lookup(rocm_kernels::kernels::MATVEC_BLOCKS_PER_SM_VAR) {
        rocm_kernels::kernels::matvec_blocks_per_sm(Some(&v))
            .map_err(|e| DecodeError::InvalidArgument(e.to_string()))?;
    }
    if let Some(v) = lookup(rocm_kernels::kernels::EARLY_LAUNCH_VAR) {
        rocm_kernels::kernels::early_launch(Some(&v))
            .map_err(|e| DecodeError::InvalidArgument(e.to_string()))?;
    }
    if let Some(v) = lookup(crate::backend::gpu::capture_stream::CAPTURE_STREAM_VAR) {
        crate::backend::gpu::capture_stream::CaptureStream::parse(&v)?;
    }
    if let Some(v) = lookup(crate::backend::gpu::capture_stream::GRAPH_POOL_VAR) {
        crate::backend::gpu::capture_stream::GraphPoolMode::parse(&v)?;
    }
    rocm_alloc::trim_window_from_env(&lookup)
        .map_err(|e| DecodeError::InvalidArgument(e.to_string()))?;
    offload::Budget::from_env_with(&|var| lookup(var))
        .map_err(|e| DecodeError::InvalidArgument(e.to_string()))?;
    if let Some(v) = lookup(crate::budget_run::HOST_BUDGET_ENV) {
        offload::parse_size(crate::budget_run::HOST_BUDGET_ENV, &v)
            .map_err(|e| DecodeError::InvalidArgument(e.to_string()))?;
    }
    let known = known_vars();
    Ok(vars
        .iter()
        .filter(|(k, _)| k.starts_with("HIPDECODE_") && !known.contains(&k.as_str()))
        .map(|(k, _)| {
            format!(
                "{k} is set but nothing reads it (a typo?); the known variables are {}",
                known.join(", ")
            )
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_prefill_switch_is_known_and_checked() {
        let ok = check_vars(&vars(&[("HIPDECODE_GPU_PREFILL", "kernels")])).unwrap();
        assert!(ok.is_empty(), "{ok:?}");
        let e = check_vars(&vars(&[("HIPDECODE_GPU_PREFILL", "cublas")]))
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
        let ok = check_vars(&vars(&[
            ("HIPDECODE_GPU_BUDGET", "8GiB"),
            ("HIPDECODE_HOST_BUDGET", "32GiB"),
            ("HIPDECODE_GPU_ATTN_PREFILL", "per-query"),
            ("HIPDECODE_MATVEC_DEPTH", "4"),
            ("HIPDECODE_MATVEC_BLOCKS_PER_SM", "8"),
            ("HIPDECODE_GPU_PDL", "off"),
        ]))
        .unwrap();
        assert!(ok.is_empty(), "{ok:?}");
        for (var, bad) in [
            ("HIPDECODE_GPU_BUDGET", "lots"),
            ("HIPDECODE_HOST_BUDGET", "half"),
            ("HIPDECODE_GPU_ATTN_PREFILL", "flash"),
            ("HIPDECODE_MATVEC_DEPTH", "3"),
            ("HIPDECODE_MATVEC_BLOCKS_PER_SM", "lots"),
            ("HIPDECODE_GPU_PDL", "on"),
        ] {
            let e = check_vars(&vars(&[(var, bad)])).unwrap_err().to_string();
            assert!(e.contains(var) && e.contains(bad), "{e}");
        }
    }

    #[test]
    fn the_offload_switches_are_known_and_checked() {
        let ok = check_vars(&vars(&[
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
            let e = check_vars(&vars(&[(var, bad)])).unwrap_err().to_string();
            assert!(
                e.contains(var) && e.contains(bad) && e.contains(accepted),
                "{e}"
            );
        }
    }

    #[test]
    fn a_malformed_limit_is_an_error_naming_the_variable_value_and_forms() {
        let e = check_vars(&vars(&[("HIPDECODE_CACHE_LIMIT", "abc")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("HIPDECODE_CACHE_LIMIT"), "{e}");
        assert!(e.contains("\"abc\""), "{e}");
        assert!(e.contains("accepted forms"), "{e}");
    }

    #[test]
    fn the_matvec_path_is_checked_strictly() {
        assert!(check_vars(&vars(&[("HIPDECODE_GPU_MATVEC", "int8")])).is_ok());
        assert!(check_vars(&vars(&[("HIPDECODE_GPU_MATVEC", "exact")])).is_ok());
        let e = check_vars(&vars(&[("HIPDECODE_GPU_MATVEC", "fast")]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("HIPDECODE_GPU_MATVEC") && e.contains("'int8'"),
            "{e}"
        );
    }

    #[test]
    fn an_unknown_name_is_a_warning_listing_the_known_ones() {
        let w = check_vars(&vars(&[
            ("HIPDECODE_CACHE_LIMT", "1G"),
            ("HIPDECODE_MEMORY_LIMIT", "50%"),
            ("PATH", "/bin"),
        ]))
        .unwrap();
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("HIPDECODE_CACHE_LIMT"), "{}", w[0]);
        assert!(w[0].contains("HIPDECODE_CACHE_LIMIT"), "{}", w[0]);
    }
}
