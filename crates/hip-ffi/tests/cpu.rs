//! Tests that need no GPU: detection, environment parsing, errors, sysfs parsing.

use hip_ffi::sysfs::{
    gfx_arch, gfx_arch_for_pci, gfx_name_from_override, gfx_name_from_target_version, gtt_info,
    kfd_process_vram,
};
use hip_ffi::{Api, ErrorKind, GttInfo, HipError, PciLocation, Platform, PlatformKind, Visibility};
use std::path::{Path, PathBuf};

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hip-ffi-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create temp dir");
    dir
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    std::fs::write(path, text).expect("write");
}

#[test]
fn detection_returns_a_consistent_answer_without_panicking() {
    let platform = Platform::detect();
    match platform.kind() {
        PlatformKind::None => {
            assert_eq!(platform.device_count(), 0);
            assert!(platform.version().is_none());
            let err = platform
                .device(0)
                .expect_err("no device without a platform");
            assert_eq!(err.kind, ErrorKind::NoDevice);
            assert!(
                err.to_string().contains("HIP_VISIBLE_DEVICES"),
                "the error should say what to check: {err}"
            );
        }
        PlatformKind::Amd | PlatformKind::Nvidia => {
            assert!(platform.device_count() > 0);
            assert!(platform.version().is_some());
            let beyond = platform.device(platform.device_count());
            assert_eq!(
                beyond.expect_err("out of range").kind,
                ErrorKind::InvalidArgument
            );
        }
    }
    // Detection is cached: a second call gives the same object.
    assert!(std::ptr::eq(platform, Platform::detect()));
}

/// Runs this test binary again with every device hidden and checks the child sees none.
#[test]
fn visible_devices_minus_one_hides_every_gpu() {
    const CHILD: &str = "HIP_FFI_TEST_CHILD";
    if std::env::var_os(CHILD).is_some() {
        let platform = Platform::detect();
        assert_eq!(platform.kind(), PlatformKind::None);
        assert!(
            platform
                .notes()
                .iter()
                .any(|n| n.contains("hide every device")),
            "notes: {:?}",
            platform.notes()
        );
        return;
    }
    let exe = std::env::current_exe().expect("test binary path");
    let output = std::process::Command::new(exe)
        .args([
            "--exact",
            "visible_devices_minus_one_hides_every_gpu",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .env("HIP_VISIBLE_DEVICES", "-1")
        .env("CUDA_VISIBLE_DEVICES", "-1")
        .env_remove("HIPDECODE_PLATFORM")
        .output()
        .expect("spawn child test");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "child failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn visibility_parsing_follows_runtime_rules() {
    assert_eq!(Visibility::parse(None), Visibility::All);
    assert_eq!(Visibility::parse(Some("")), Visibility::Hidden);
    assert_eq!(Visibility::parse(Some("-1")), Visibility::Hidden);
    assert_eq!(
        Visibility::parse(Some("0,2")),
        Visibility::Only(vec!["0".into(), "2".into()])
    );
    // The list ends at the first negative index.
    assert_eq!(
        Visibility::parse(Some("1,-1,3")),
        Visibility::Only(vec!["1".into()])
    );
    assert_eq!(
        Visibility::parse(Some(" GPU-8f2a , 0 ")),
        Visibility::Only(vec!["GPU-8f2a".into(), "0".into()])
    );
    assert!(Visibility::parse(Some("-1")).hides_all());
    assert!(!Visibility::parse(Some("0")).hides_all());
}

#[test]
fn host_errors_name_operation_and_fix() {
    let err = HipError::host(
        "hipMalloc",
        ErrorKind::InvalidArgument,
        "zero-byte allocation",
    );
    assert_eq!(err.api, Api::Host);
    assert_eq!(err.code, 0);
    assert_eq!(
        err.to_string(),
        "hipMalloc failed: InvalidArgument: zero-byte allocation"
    );
    let err = err.with_detail("while loading weights");
    assert_eq!(
        err.detail.as_deref(),
        Some("zero-byte allocation; while loading weights")
    );
    assert!(!err.is_out_of_memory());
}

#[test]
fn gtt_is_read_from_the_pci_device_directory() {
    let root = temp_dir("gtt");
    let pci = PciLocation {
        domain: 0,
        bus: 0xc3,
        device: 0,
    };
    assert_eq!(pci.sysfs_name(), "0000:c3:00.0");
    assert_eq!(gtt_info(&root, pci), None, "no files yet");
    write(
        &root.join("0000:c3:00.0/mem_info_gtt_total"),
        "103079215104\n",
    );
    assert_eq!(gtt_info(&root, pci), None, "used is still missing");
    write(&root.join("0000:c3:00.0/mem_info_gtt_used"), "52428800\n");
    assert_eq!(
        gtt_info(&root, pci),
        Some(GttInfo {
            total: 103_079_215_104,
            used: 52_428_800
        })
    );
    write(&root.join("0000:c3:00.0/mem_info_gtt_used"), "garbage\n");
    assert_eq!(
        gtt_info(&root, pci),
        None,
        "unparsable values are not guessed"
    );
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn gfx_names_decode_target_versions() {
    assert_eq!(
        gfx_name_from_target_version(110501).as_deref(),
        Some("gfx1151")
    );
    assert_eq!(
        gfx_name_from_target_version(90010).as_deref(),
        Some("gfx90a")
    );
    assert_eq!(
        gfx_name_from_target_version(90402).as_deref(),
        Some("gfx942")
    );
    assert_eq!(
        gfx_name_from_target_version(100300).as_deref(),
        Some("gfx1030")
    );
    assert_eq!(gfx_name_from_target_version(0), None);
}

#[test]
fn gfx_arch_is_found_by_pci_location_in_kfd_topology() {
    let topo = temp_dir("kfd");
    // Node 0 is the CPU, node 1 a dGPU at 03:00.0, node 2 an APU at c3:00.0.
    write(
        &topo.join("0/properties"),
        "cpu_cores_count 16\ngfx_target_version 0\nlocation_id 0\n",
    );
    write(
        &topo.join("1/properties"),
        &format!(
            "gfx_target_version 100300\nlocation_id {}\ndomain 0\n",
            0x03 << 8
        ),
    );
    write(
        &topo.join("2/properties"),
        &format!(
            "gfx_target_version 110501\nlocation_id {}\ndomain 0\n",
            0xc3 << 8
        ),
    );
    assert_eq!(
        gfx_arch_for_pci(&topo, 0, 0xc3, 0).as_deref(),
        Some("gfx1151")
    );
    assert_eq!(
        gfx_arch_for_pci(&topo, 0, 0x03, 0).as_deref(),
        Some("gfx1030")
    );
    assert_eq!(gfx_arch_for_pci(&topo, 0, 0x04, 0), None);
    assert_eq!(
        gfx_arch_for_pci(&topo, 1, 0xc3, 0),
        None,
        "domain must match"
    );
    assert_eq!(
        gfx_arch_for_pci(Path::new("/nonexistent/kfd"), 0, 0, 0),
        None
    );
    let _ = std::fs::remove_dir_all(&topo);
}

/// A process's device memory on an AMD GPU is amdkfd's `proc/<pid>/vram_<gpu_id>`, the GPU
/// named by the `gpu_id` of the topology node at its PCI location; anything missing is `None`.
#[test]
fn process_vram_is_read_from_kfd_for_the_gpu_at_the_pci_location() {
    let root = temp_dir("kfd-proc");
    let (topo, procs) = (root.join("topology/nodes"), root.join("proc"));
    write(
        &topo.join("0/properties"),
        "cpu_cores_count 16\ngfx_target_version 0\nlocation_id 0\n",
    );
    write(&topo.join("0/gpu_id"), "0\n");
    for (node, bus, gpu_id) in [(1, 0x03, 17_422), (2, 0xc3, 2_501)] {
        write(
            &topo.join(format!("{node}/properties")),
            &format!(
                "gfx_target_version 110501\nlocation_id {}\ndomain 0\n",
                bus << 8
            ),
        );
        write(&topo.join(format!("{node}/gpu_id")), &format!("{gpu_id}\n"));
    }
    write(&procs.join("4242/vram_2501"), "912261120\n");
    write(&procs.join("4242/vram_17422"), "1048576\n");
    let at = |bus| PciLocation {
        domain: 0,
        bus,
        device: 0,
    };
    assert_eq!(
        kfd_process_vram(&topo, &procs, at(0xc3), 4242),
        Some(912_261_120)
    );
    assert_eq!(
        kfd_process_vram(&topo, &procs, at(0x03), 4242),
        Some(1_048_576)
    );
    assert_eq!(
        kfd_process_vram(&topo, &procs, at(0xc3), 4243),
        None,
        "another pid"
    );
    assert_eq!(
        kfd_process_vram(&topo, &procs, at(0x04), 4242),
        None,
        "no GPU there"
    );
    let _ = std::fs::remove_dir_all(&root);
}

/// `HSA_OVERRIDE_GFX_VERSION`, as the ROCm runtime reads it, decides the arch kernels are
/// compiled for over the KFD topology's; empty means unset, and a malformed value is an error
/// that names the variable and the form, never a silent fallback to the topology.
#[test]
fn hsa_override_gfx_version_sets_the_arch_over_the_kfd_topology() {
    for (text, want) in [
        ("11.0.0", "gfx1100"),
        ("10.3.0", "gfx1030"),
        ("9.0.10", "gfx90a"),
        ("9.4.2", "gfx942"),
        (" 11.5.1 ", "gfx1151"),
        ("12.0.1", "gfx1201"),
    ] {
        assert_eq!(gfx_name_from_override(text).as_deref(), Ok(want), "{text}");
    }
    for bad in [
        "11", "11.0", "11.0.0.0", "gfx1100", "11.x.0", "11.0.16", "0.0.0", "-1.0.0",
    ] {
        let e = gfx_name_from_override(bad).unwrap_err();
        assert!(
            e.contains("HSA_OVERRIDE_GFX_VERSION") && e.contains("MAJOR.MINOR.STEPPING"),
            "{bad}: {e}"
        );
    }

    let topo = temp_dir("kfd-override");
    write(
        &topo.join("1/properties"),
        &format!(
            "gfx_target_version 110501\nlocation_id {}\ndomain 0\n",
            0xc3 << 8
        ),
    );
    let apu = PciLocation {
        domain: 0,
        bus: 0xc3,
        device: 0,
    };
    assert_eq!(gfx_arch(&topo, apu, None), Ok(Some("gfx1151".into())));
    assert_eq!(gfx_arch(&topo, apu, Some("")), Ok(Some("gfx1151".into())));
    assert_eq!(
        gfx_arch(&topo, apu, Some("11.0.0")),
        Ok(Some("gfx1100".into()))
    );
    assert!(gfx_arch(&topo, apu, Some("11.0")).is_err());
    let _ = std::fs::remove_dir_all(&topo);
}

#[test]
fn mem_info_clamps_free_to_total() {
    let info = hip_ffi::MemInfo::new(10, 8, None);
    assert_eq!((info.free, info.total), (8, 8));
    let info = hip_ffi::MemInfo::new(3, 8, None);
    assert_eq!((info.free, info.total), (3, 8));
}

#[test]
fn launch_config_covers_every_element() {
    let cfg = hip_ffi::LaunchConfig::for_elements(1000, 256);
    assert_eq!(cfg.grid, [4, 1, 1]);
    assert!(cfg.grid[0] * cfg.block[0] >= 1000);
    assert_eq!(hip_ffi::LaunchConfig::for_elements(0, 256).grid, [1, 1, 1]);
}

#[test]
fn handles_can_move_between_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<hip_ffi::Device>();
    send_sync::<hip_ffi::Stream>();
    send_sync::<hip_ffi::Event>();
    send_sync::<hip_ffi::DeviceBuffer>();
    send_sync::<hip_ffi::PinnedHostBuffer>();
    send_sync::<hip_ffi::ManagedBuffer>();
    send_sync::<hip_ffi::Module>();
    send_sync::<hip_ffi::Function>();
    send_sync::<hip_ffi::Compiler>();
    fn clone_static<T: Clone + 'static>() {}
    // A function holds its module itself: no lifetime ties it to the `Module` handle.
    clone_static::<hip_ffi::Function>();
    send_sync::<hip_ffi::GraphExec>();
    send_sync::<HipError>();
}

/// Runs one test of this binary again in a child with `envs` set; returns (passed, output).
fn run_child(test: &str, envs: &[(&str, &str)]) -> (bool, String) {
    let exe = std::env::current_exe().expect("test binary path");
    let mut command = std::process::Command::new(exe);
    command
        .args(["--exact", test, "--test-threads=1", "--nocapture"])
        .env("HIP_FFI_TEST_CHILD", "1")
        .env_remove("HIPDECODE_REQUIRE_GPU")
        .env_remove("HIPDECODE_PLATFORM");
    for (key, value) in envs {
        command.env(key, value);
    }
    let output = command.output().expect("spawn child test");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

/// The body the children below run: asks for a GPU while the platform is forced to none.
#[test]
fn device_or_skip_child_body() {
    if std::env::var_os("HIP_FFI_TEST_CHILD").is_none() {
        return;
    }
    assert!(Platform::detect().unusable_reason().is_some());
    assert!(hip_ffi::testing::device_or_skip("probe_test").is_none());
}

#[test]
fn device_or_skip_skips_with_reason_or_fails_when_a_gpu_is_required() {
    let none = [("HIPDECODE_PLATFORM", "none")];
    let (passed, output) = run_child("device_or_skip_child_body", &none);
    assert!(passed, "skipping must pass:\n{output}");
    assert!(
        output.contains("SKIP probe_test: HIPDECODE_PLATFORM=none"),
        "the skip line names the test and the reason:\n{output}"
    );

    let required = [
        ("HIPDECODE_PLATFORM", "none"),
        ("HIPDECODE_REQUIRE_GPU", "1"),
    ];
    let (passed, output) = run_child("device_or_skip_child_body", &required);
    assert!(
        !passed,
        "a required GPU that is missing must fail:\n{output}"
    );
    assert!(
        output.contains("HIPDECODE_REQUIRE_GPU=1 but no GPU is usable")
            && output.contains("HIPDECODE_PLATFORM=none"),
        "the panic says why:\n{output}"
    );

    let garbage = [
        ("HIPDECODE_PLATFORM", "none"),
        ("HIPDECODE_REQUIRE_GPU", "yes"),
    ];
    let (passed, output) = run_child("device_or_skip_child_body", &garbage);
    assert!(!passed, "an unknown value must fail:\n{output}");
    assert!(output.contains("use 1"), "names accepted values:\n{output}");
}

/// Without `generate-bindings` the build must not run bindgen, even where HIP headers exist.
#[cfg(not(feature = "generate-bindings"))]
#[test]
fn default_build_uses_the_committed_bindings() {
    // Read at run time, so a wrong build fails this test with the message below.
    let generated = std::hint::black_box(hip_ffi::sys::GENERATED_AT_BUILD_TIME);
    assert!(
        !generated,
        "bindings were generated although the generate-bindings feature is off"
    );
}
