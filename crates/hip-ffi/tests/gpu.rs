//! GPU tests. Each gets the device through `common::gpu_or_skip`, which prints
//! `SKIP <test>: <reason>` and returns `None` when there is no GPU (and panics instead when
//! `HIPDECODE_REQUIRE_GPU=1`). Every test allocates and some read device-wide free memory, so
//! all are `#[serial]`: a free-memory figure is then never disturbed by another test's buffers.

mod common;

use common::gpu_or_skip;
use hip_ffi::{
    DeviceBuffer, DevicePtr, ErrorKind, Event, HostRegistration, LaunchConfig, ManagedBuffer,
    PinnedHostBuffer, PlatformKind, Stream,
};
use rand::Rng;
use serial_test::serial;

/// Kernels in the HIP/CUDA common subset; WARP_SIZE comes from the device attribute.
const KERNELS: &str = r#"
extern "C" __global__ void fill_index(float* out, unsigned int n, float scale) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = scale * (float)i + (float)(threadIdx.x % WARP_SIZE);
}

extern "C" __global__ void double_from_host(const int* host_in, int* out, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = 2 * host_in[i] + 1;
}

extern "C" __global__ void add_one(int* data, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) data[i] += 1;
}

extern "C" __global__ void spin(float* data, unsigned int n, unsigned int rounds) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = data[i];
    for (unsigned int r = 0; r < rounds; ++r) x = x * 0.999f + 0.5f;
    data[i] = x;
}

// Counts the bytes of data[0..n) that differ from `value` (one atomic per thread with misses).
extern "C" __global__ void count_not_equal(const unsigned char* data, unsigned long long n,
                                           unsigned int value, unsigned long long* mismatches) {
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long misses = 0;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += stride) {
        if (data[i] != (unsigned char)value) ++misses;
    }
    if (misses != 0) atomicAdd(mismatches, misses);
}
"#;

/// A deterministic pseudo-random sequence so inputs are not zeros or a ramp.
fn noise(n: usize, seed: u32) -> Vec<i32> {
    let mut rng = test_support::rng::seeded(seed.into());
    (0..n).map(|_| rng.random_range(-50_000..50_000)).collect()
}

#[test]
#[serial]
fn device_attributes_are_plausible() {
    let Some(device) = gpu_or_skip("device_attributes_are_plausible") else {
        return;
    };
    let attrs = device.attributes().expect("attributes");
    assert!(!attrs.name.is_empty());
    assert!(
        attrs.warp_size == 32 || attrs.warp_size == 64,
        "{}",
        attrs.warp_size
    );
    assert!(attrs.multiprocessor_count > 0);
    assert!(attrs.total_memory > 0);
    assert!(attrs.max_threads_per_block >= 256);
    match device.platform() {
        PlatformKind::Nvidia => {
            let arch = attrs.arch.expect("NVIDIA arch is always known");
            let (major, minor) = attrs.compute_capability;
            assert_eq!(arch, format!("sm_{major}{minor}"));
            assert_eq!(attrs.warp_size, 32);
        }
        PlatformKind::Amd => {
            if let Some(arch) = attrs.arch {
                assert!(arch.starts_with("gfx"), "{arch}");
            }
        }
        PlatformKind::None => unreachable!("a device implies a platform"),
    }
}

#[test]
#[serial]
fn mem_get_info_is_sane_and_sees_allocations() {
    let Some(device) = gpu_or_skip("mem_get_info_is_sane_and_sees_allocations") else {
        return;
    };
    let before = device.mem_get_info().expect("mem_get_info");
    assert!(before.total > 0);
    assert!(before.free <= before.total);
    let total_attr = device.total_memory().expect("total memory");
    // Both describe the same memory. Discrete GPUs report the same figure (or mem_get_info a
    // reserved slice less); UMA APUs may report a different carve-out, so allow a factor 2
    // either way, which still catches unit mistakes (KiB vs bytes) and garbage.
    assert!(
        before.total <= total_attr.saturating_mul(2) && before.total >= total_attr / 2,
        "mem_get_info total {} vs device total {total_attr}",
        before.total
    );
    if !device.is_integrated().expect("integrated") {
        assert!(
            before.total <= total_attr,
            "a discrete GPU cannot have more memory ({}) than its size ({total_attr})",
            before.total
        );
    }

    const BYTES: usize = 256 << 20;
    if before.free < 2 * BYTES as u64 {
        eprintln!("skipping: allocation part: only {} bytes free", before.free);
        return;
    }
    let mut buffer = DeviceBuffer::alloc(&device, BYTES).expect("alloc 256 MiB");
    buffer.memset(0x5a).expect("touch it");
    let during = device.mem_get_info().expect("mem_get_info");
    assert!(
        before.free - during.free.min(before.free) >= (BYTES as u64) * 3 / 4,
        "free went from {} to {} after a {BYTES}-byte allocation",
        before.free,
        during.free
    );
    drop(buffer);
    let after = device.mem_get_info().expect("mem_get_info");
    assert!(
        after.free >= during.free + (BYTES as u64) * 3 / 4,
        "freeing 256 MiB must return it: free went from {} to {}",
        during.free,
        after.free
    );
}

/// The process's device memory as nvidia-smi or rocm-smi list it holds the context (more than
/// nothing before any allocation) and grows by a 256 MiB allocation. Where the driver cannot
/// list this process (no NVML or amdkfd, a container's PID namespace), the error must say so.
#[test]
#[serial]
fn the_per_process_figure_holds_the_context_and_counts_an_allocation() {
    let test = "the_per_process_figure_holds_the_context_and_counts_an_allocation";
    let Some(device) = gpu_or_skip(test) else {
        return;
    };
    let before = match device.process_memory() {
        Ok(p) => p,
        Err(why) => {
            assert!(
                why.contains("NVML") || why.contains("amdkfd"),
                "the reason names its source: {why}"
            );
            eprintln!("{test}: the per-process figure is not readable here: {why}");
            return;
        }
    };
    eprintln!(
        "{test}: {} bytes from {} before",
        before.bytes, before.source
    );
    assert!(before.bytes > 0, "the context alone takes device memory");
    const BYTES: usize = 256 << 20;
    let mut buffer = DeviceBuffer::alloc(&device, BYTES).expect("alloc 256 MiB");
    buffer.memset(0x5a).expect("touch it");
    device.synchronize().expect("synchronize");
    let during = device.process_memory().expect("readable a moment ago");
    let grown = during.bytes.saturating_sub(before.bytes);
    assert!(
        grown >= BYTES as u64 && grown <= BYTES as u64 + (64 << 20),
        "a {BYTES}-byte allocation grew the figure by {grown} ({} -> {})",
        before.bytes,
        during.bytes
    );
}

#[test]
#[serial]
fn copies_round_trip_sync_and_async() {
    let Some(device) = gpu_or_skip("copies_round_trip_sync_and_async") else {
        return;
    };
    let input = noise(1 << 16, 7);
    let bytes = input.len() * 4;
    let mut a = DeviceBuffer::alloc(&device, bytes).expect("alloc a");
    let mut b = DeviceBuffer::alloc(&device, bytes).expect("alloc b");
    a.copy_from_host(&input).expect("h2d");
    b.memset(0xff).expect("poison b");
    b.copy_from_device(&a).expect("d2d");
    assert_eq!(b.to_host_vec::<i32>().expect("d2h"), input);

    // memset really writes: every byte 0x11.
    a.memset(0x11).expect("memset");
    assert!(a
        .to_host_vec::<u8>()
        .expect("d2h")
        .iter()
        .all(|&x| x == 0x11));

    // Async path on a stream, ordered by the stream alone.
    let stream = Stream::new(&device).expect("stream");
    let other = noise(input.len(), 99);
    let mut out = vec![0i32; input.len()];
    // SAFETY: `other` and `out` outlive the synchronize below and are not touched before it.
    unsafe {
        a.copy_from_host_async(&other, &stream).expect("h2d async");
        b.copy_from_device_async(&a, &stream).expect("d2d async");
        b.copy_to_host_async(&mut out, &stream).expect("d2h async");
    }
    stream.synchronize().expect("sync");
    assert_eq!(out, other);
    assert!(stream.query().expect("query"), "idle after synchronize");

    // A copy that does not fit is refused before reaching the runtime.
    let too_big = vec![0i32; input.len() + 1];
    let err = a.copy_from_host(&too_big).expect_err("oversized copy");
    assert_eq!(err.kind, ErrorKind::InvalidArgument);
    assert!(
        DeviceBuffer::alloc(&device, 0).is_err(),
        "zero bytes is refused"
    );
}

#[test]
#[serial]
fn stream_ordered_allocation_works_where_supported() {
    let Some(device) = gpu_or_skip("stream_ordered_allocation_works_where_supported") else {
        return;
    };
    if !device.supports_async_alloc().expect("attribute") {
        eprintln!("skipping: device has no stream-ordered allocator");
        return;
    }
    let stream = Stream::new(&device).expect("stream");
    let mut buf = DeviceBuffer::alloc_async(&stream, 4096).expect("malloc async");
    buf.memset_async(0x7e, &stream).expect("memset async");
    stream.synchronize().expect("sync");
    assert!(buf
        .to_host_vec::<u8>()
        .expect("d2h")
        .iter()
        .all(|&x| x == 0x7e));
    // SAFETY: only this stream used the buffer.
    unsafe { buf.free_async(&stream) }.expect("free async");
    stream.synchronize().expect("sync");
}

#[test]
#[serial]
fn runtime_compiled_kernel_writes_every_element() {
    let Some(device) = gpu_or_skip("runtime_compiled_kernel_writes_every_element") else {
        return;
    };
    let module = device
        .compile_module(KERNELS, "kernels.cu", &[])
        .expect("compile");
    let fill = module.function("fill_index").expect("lookup");
    let warp = device.warp_size().expect("warp size");
    let n: u32 = 100_003; // not a multiple of the block size
    let mut out = DeviceBuffer::alloc(&device, n as usize * 4).expect("alloc");
    out.memset(0xff).expect("poison with NaNs");
    let stream = Stream::new(&device).expect("stream");
    let cfg = LaunchConfig::for_elements(n, 256);
    let (ptr, scale) = (out.ptr(), 0.5f32);
    let mut launch = fill.builder(&stream);
    launch.arg(&ptr).arg(&n).arg(&scale);
    // SAFETY: argument types match the kernel (pointer, unsigned int, float); the buffer holds
    // n floats and outlives the synchronize.
    unsafe { launch.launch(cfg) }.expect("launch");
    stream.synchronize().expect("sync");
    let host: Vec<f32> = out.to_host_vec().expect("d2h");
    for (i, &value) in host.iter().enumerate() {
        let lane = (i as u32 % 256) % warp;
        let expected = scale * i as f32 + lane as f32;
        assert_eq!(value, expected, "element {i}");
    }

    let err = device
        .compile_module("extern \"C\" __global__ void broken( {", "broken.cu", &[])
        .expect_err("syntax error");
    assert_eq!(err.kind, ErrorKind::Compile);
    assert!(
        err.detail.is_some_and(|log| !log.is_empty()),
        "log attached"
    );
    assert!(module.function("no_such_kernel").is_err());
    for (grid, block) in [([0, 1, 1], [1, 1, 1]), ([1, 1, 1], [32, 0, 1])] {
        let config = LaunchConfig {
            grid,
            block,
            shared_bytes: 0,
        };
        // SAFETY: the arguments match; rejected before launch (zero dimension).
        let zero = unsafe { launch.launch(config) };
        assert_eq!(
            zero.expect_err("zero dimension").kind,
            ErrorKind::InvalidArgument
        );
    }
}

#[test]
#[serial]
fn a_kernels_resources_are_read_from_the_driver_on_nvidia() {
    let Some(device) = gpu_or_skip("a_kernels_resources_are_read_from_the_driver_on_nvidia") else {
        return;
    };
    // 3 KiB of static shared memory, and a per-thread array indexed at run time, which the
    // compiler places in local memory.
    let source = r#"
extern "C" __global__ void uses_shared_and_local(float* out, unsigned int i) {
    __shared__ float tile[768];
    float scratch[64];
    for (unsigned int k = 0; k < 64; ++k) scratch[k] = out[k] * (float)(k + i);
    tile[threadIdx.x] = scratch[(threadIdx.x * 7 + i) % 64];
    __syncthreads();
    out[threadIdx.x] = tile[(threadIdx.x + 1) % 768];
}
"#;
    let module = device
        .compile_module(source, "resources.cu", &[])
        .expect("compile");
    let function = module.function("uses_shared_and_local").expect("lookup");
    let resources = function.resources().expect("the query answers");
    match device.platform() {
        PlatformKind::Nvidia => {
            let r = resources.expect("NVIDIA reports a kernel's resources");
            eprintln!("uses_shared_and_local: {r:?}");
            assert!(r.registers > 0, "{r:?}");
            assert_eq!(r.static_shared_bytes, 768 * 4, "{r:?}");
            assert!(
                r.local_bytes >= 64 * 4,
                "the run-time indexed array is local: {r:?}"
            );
            assert!(r.max_threads_per_block >= 256, "{r:?}");
        }
        // HIP's answer comes from the code object's metadata (rocm-kernels), not the runtime.
        _ => assert_eq!(resources, None),
    }
}

#[test]
#[serial]
fn kernel_reads_mapped_pinned_host_memory() {
    let Some(device) = gpu_or_skip("kernel_reads_mapped_pinned_host_memory") else {
        return;
    };
    let module = device
        .compile_module(KERNELS, "kernels.cu", &[])
        .expect("compile");
    let input = noise(4099, 3);
    let mut pinned = PinnedHostBuffer::alloc(&device, input.len() * 4).expect("pinned");
    pinned.as_mut_slice::<i32>().copy_from_slice(&input);
    assert_doubled_in_place(&device, &module, &pinned, &input);
    let stream = Stream::new(&device).expect("stream");

    // Registered (not runtime-allocated) host memory, written by the device in place.
    let add = module.function("add_one").expect("lookup");
    let mut host = noise(1000, 11);
    let original = host.clone();
    {
        let registration = HostRegistration::new(&device, &mut host).expect("register");
        let (ptr, len) = (registration.device_ptr(), 1000u32);
        let mut launch = add.builder(&stream);
        launch.arg(&ptr).arg(&len);
        // SAFETY: pointer/uint match; the registration keeps the memory mapped until dropped,
        // after the synchronize.
        unsafe { launch.launch(LaunchConfig::for_elements(len, 128)) }.expect("launch");
        stream.synchronize().expect("sync");
    }
    let expected: Vec<i32> = original.iter().map(|x| x + 1).collect();
    assert_eq!(host, expected);
}

#[test]
#[serial]
fn pinned_copy_of_host_bytes_is_read_by_a_kernel_in_place() {
    let Some(device) = gpu_or_skip("pinned_copy_of_host_bytes_is_read_by_a_kernel_in_place") else {
        return;
    };
    let module = device
        .compile_module(KERNELS, "kernels.cu", &[])
        .expect("compile");
    let input = noise(5003, 17);
    let bytes: Vec<u8> = input.iter().flat_map(|x| x.to_ne_bytes()).collect();
    let pinned = PinnedHostBuffer::from_bytes(&device, &bytes).expect("pinned copy");
    assert_eq!(pinned.len_bytes(), bytes.len());
    assert_eq!(
        pinned.as_slice::<i32>(),
        &input[..],
        "host view of the copy"
    );
    assert_doubled_in_place(&device, &module, &pinned, &input);
}

/// Runs `double_from_host` over `pinned` read in place through its device address and checks
/// the device result is 2x + 1 of `input`, the buffer's contents.
fn assert_doubled_in_place(
    device: &hip_ffi::Device,
    module: &hip_ffi::Module,
    pinned: &PinnedHostBuffer,
    input: &[i32],
) {
    let kernel = module.function("double_from_host").expect("lookup");
    let n = input.len() as u32;
    let out = DeviceBuffer::alloc(device, input.len() * 4).expect("alloc");
    let stream = Stream::new(device).expect("stream");
    let (src, dst) = (pinned.device_ptr(), out.ptr());
    let mut launch = kernel.builder(&stream);
    launch.arg(&src).arg(&dst).arg(&n);
    // SAFETY: pointer/pointer/uint match the kernel; both buffers hold n ints and live past
    // the synchronize.
    unsafe { launch.launch(LaunchConfig::for_elements(n, 128)) }.expect("launch");
    stream.synchronize().expect("sync");
    let expected: Vec<i32> = input.iter().map(|x| 2 * x + 1).collect();
    assert_eq!(out.to_host_vec::<i32>().expect("d2h"), expected);
}

#[test]
#[serial]
fn a_pinning_failure_names_the_size_the_cause_and_the_fix() {
    let Some(device) = gpu_or_skip("a_pinning_failure_names_the_size_the_cause_and_the_fix") else {
        return;
    };
    // 1 PiB: more than any host can lock, refused at once by the runtime.
    let bytes = 1usize << 50;
    let err = PinnedHostBuffer::alloc(&device, bytes).expect_err("1 PiB cannot be pinned");
    let text = err.to_string();
    assert!(text.contains(&format!("pinning {bytes} bytes")), "{text}");
    assert!(text.contains("ulimit -l"), "{text}");
    assert!(text.contains("free host RAM"), "{text}");
    assert!(text.contains("larger budget"), "{text}");
}

#[test]
#[serial]
fn events_time_and_order_work() {
    let Some(device) = gpu_or_skip("events_time_and_order_work") else {
        return;
    };
    let module = device
        .compile_module(KERNELS, "kernels.cu", &[])
        .expect("compile");
    let spin = module.function("spin").expect("lookup");
    let n: u32 = 1 << 20;
    let mut data = DeviceBuffer::alloc(&device, n as usize * 4).expect("alloc");
    data.memset(0).expect("memset");
    let stream = Stream::new(&device).expect("stream");
    let (start, end) = (
        Event::new(&device).expect("event"),
        Event::new(&device).expect("event"),
    );
    assert!(
        start.query().expect("query"),
        "an unrecorded event counts as complete"
    );
    let (ptr, rounds) = (data.ptr(), 2000u32);
    start.record(&stream).expect("record");
    let mut launch = spin.builder(&stream);
    launch.arg(&ptr).arg(&n).arg(&rounds);
    // SAFETY: pointer/uint/uint match; the buffer lives past the synchronize.
    unsafe { launch.launch(LaunchConfig::for_elements(n, 256)) }.expect("launch");
    end.record(&stream).expect("record");
    // A second stream waits on the event, then records its own marker.
    let other = Stream::new(&device).expect("stream");
    other.wait_event(&end).expect("wait");
    let after = Event::new_without_timing(&device).expect("event");
    after.record(&other).expect("record");
    after.synchronize().expect("sync");
    assert!(
        end.query().expect("query"),
        "the waited-on event is complete"
    );
    let ms = end.elapsed_ms_since(&start).expect("elapsed");
    assert!(ms.is_finite() && ms > 0.0, "elapsed {ms} ms");
    assert!(ms < 60_000.0, "elapsed {ms} ms");
    let untimed = after.elapsed_ms_since(&start).expect_err("untimed event");
    assert_eq!(untimed.kind, ErrorKind::InvalidArgument);
    // The kernel changed the data: x -> x*0.999+0.5 from 0 is positive.
    let host: Vec<f32> = data.to_host_vec().expect("d2h");
    assert!(host.iter().all(|&x| x > 0.0));
}

#[test]
#[serial]
fn graph_capture_and_replay() {
    let Some(device) = gpu_or_skip("graph_capture_and_replay") else {
        return;
    };
    let module = device
        .compile_module(KERNELS, "kernels.cu", &[])
        .expect("compile");
    let add = module.function("add_one").expect("lookup");
    // A second module whose kernel runs on a side stream joined into the capture.
    let side_module = device
        .compile_module(KERNELS, "kernels_side.cu", &[])
        .expect("compile");
    let side_add = side_module.function("add_one").expect("lookup");
    let n: u32 = 10_000;
    let mut data = DeviceBuffer::alloc(&device, n as usize * 4).expect("alloc");
    let start = noise(n as usize, 5);
    data.copy_from_host(&start).expect("h2d");
    let stream = Stream::new(&device).expect("stream");
    let side = Stream::new(&device).expect("side stream");
    let (fork, join) = (
        Event::new_without_timing(&device).expect("event"),
        Event::new_without_timing(&device).expect("event"),
    );
    let (ptr, len) = (data.ptr(), n);
    assert!(!stream.is_capturing().expect("is_capturing"));
    stream.begin_capture().expect("begin capture");
    assert!(stream.is_capturing().expect("is_capturing"));
    for _ in 0..3 {
        let mut launch = add.builder(&stream);
        launch.arg(&ptr).arg(&len);
        // SAFETY: pointer/uint match; the buffer outlives every replay below.
        unsafe { launch.launch(LaunchConfig::for_elements(len, 256)) }.expect("captured launch");
    }
    // Fork onto the side stream and join back: one more +1, from the other module.
    fork.record(&stream).expect("fork");
    side.wait_event(&fork).expect("side waits");
    assert!(
        side.is_capturing().expect("is_capturing"),
        "joined the capture"
    );
    let mut launch = side_add.builder(&side);
    launch.arg(&ptr).arg(&len);
    // SAFETY: as above.
    unsafe { launch.launch(LaunchConfig::for_elements(len, 256)) }.expect("side launch");
    join.record(&side).expect("join");
    stream.wait_event(&join).expect("join back");
    let graph = stream.end_capture().expect("end capture");
    assert!(!stream.is_capturing().expect("is_capturing"));
    assert_eq!(
        graph.kernel_nodes(),
        3,
        "the capturing stream's own launches (the side stream's is not counted)"
    );
    let mut exec = graph.instantiate().expect("instantiate");
    exec.keep_alive(&side_add);
    // The graph alone must keep both modules loaded now.
    drop((add, module, side_add, side_module, graph));
    stream.synchronize().expect("sync");
    assert_eq!(
        data.to_host_vec::<i32>().expect("d2h"),
        start,
        "capturing must not run the kernels"
    );
    const REPLAYS: i32 = 4;
    for _ in 0..REPLAYS {
        // SAFETY: `data` is alive and unused by other work until the synchronize below.
        unsafe { exec.launch(&stream) }.expect("graph launch");
    }
    stream.synchronize().expect("sync");
    let expected: Vec<i32> = start.iter().map(|x| x + 4 * REPLAYS).collect();
    assert_eq!(data.to_host_vec::<i32>().expect("d2h"), expected);
}

#[test]
#[serial]
fn a_function_keeps_its_module_loaded() {
    let Some(device) = gpu_or_skip("a_function_keeps_its_module_loaded") else {
        return;
    };
    let module = device
        .compile_module(KERNELS, "kernels.cu", &[])
        .expect("compile");
    let add = module.function("add_one").expect("lookup");
    drop(module);
    let input = noise(5000, 31);
    let mut data = DeviceBuffer::alloc(&device, input.len() * 4).expect("alloc");
    data.copy_from_host(&input).expect("h2d");
    let stream = Stream::new(&device).expect("stream");
    // A clone used from another thread launches through the same (still loaded) module.
    let add_elsewhere = add.clone();
    let (ptr, len) = (data.ptr(), input.len() as u32);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut launch = add_elsewhere.builder(&stream);
            launch.arg(&ptr).arg(&len);
            // SAFETY: pointer/uint match; `data` outlives the synchronize below.
            unsafe { launch.launch(LaunchConfig::for_elements(len, 256)) }.expect("launch");
        });
    });
    let mut launch = add.builder(&stream);
    launch.arg(&ptr).arg(&len);
    // SAFETY: as above.
    unsafe { launch.launch(LaunchConfig::for_elements(len, 256)) }.expect("launch");
    stream.synchronize().expect("sync");
    let expected: Vec<i32> = input.iter().map(|x| x + 2).collect();
    assert_eq!(data.to_host_vec::<i32>().expect("d2h"), expected);
}

#[test]
#[serial]
fn dropping_the_last_handle_waits_for_a_running_kernel() {
    let Some(device) = gpu_or_skip("dropping_the_last_handle_waits_for_a_running_kernel") else {
        return;
    };
    let module = device
        .compile_module(KERNELS, "spin.cu", &[])
        .expect("compile");
    let spin = module.function("spin").expect("lookup");
    drop(module);
    let n: u32 = 1 << 20;
    let mut data = DeviceBuffer::alloc(&device, n as usize * 4).expect("alloc");
    data.memset(0).expect("zero");
    let stream = Stream::new(&device).expect("stream");
    // Long enough (tens of milliseconds or more) that the unload below happens mid-kernel
    // unless it waits.
    let (ptr, rounds) = (data.ptr(), 4_000_000u32);
    let mut launch = spin.builder(&stream);
    launch.arg(&ptr).arg(&n).arg(&rounds);
    // SAFETY: pointer/uint/uint match; `data` outlives the kernel (checked below).
    unsafe { launch.launch(LaunchConfig::for_elements(n, 256)) }.expect("launch");
    drop(launch);
    assert!(
        !stream.query().expect("query"),
        "the kernel should still be running when the module is released"
    );
    drop(spin); // the last handle: synchronises the device, then unloads
    assert!(
        stream.query().expect("query"),
        "the unload waited for the kernel"
    );

    // The device is healthy: a new module loads and computes the right answer.
    let module = device
        .compile_module(KERNELS, "kernels.cu", &[])
        .expect("compile again");
    let add = module.function("add_one").expect("lookup");
    let input = noise(4096, 77);
    let mut other = DeviceBuffer::alloc(&device, input.len() * 4).expect("alloc");
    other.copy_from_host(&input).expect("h2d");
    let (ptr, len) = (other.ptr(), input.len() as u32);
    let mut launch = add.builder(&stream);
    launch.arg(&ptr).arg(&len);
    // SAFETY: pointer/uint match; `other` outlives the synchronize.
    unsafe { launch.launch(LaunchConfig::for_elements(len, 256)) }.expect("launch after unload");
    stream.synchronize().expect("sync");
    let expected: Vec<i32> = input.iter().map(|x| x + 1).collect();
    assert_eq!(other.to_host_vec::<i32>().expect("d2h"), expected);
    // x -> 0.999 x + 0.5 from 0 converges to 500; after millions of rounds every element is
    // there, so the spin kernel really ran to the end.
    let spun: Vec<f32> = data.to_host_vec().expect("d2h");
    for (i, &x) in spun.iter().enumerate() {
        assert!((x - 500.0).abs() < 1.0, "element {i}: {x}");
    }
}

#[test]
#[serial]
fn memset_is_complete_before_work_on_another_stream_starts() {
    let Some(device) = gpu_or_skip("memset_is_complete_before_work_on_another_stream_starts")
    else {
        return;
    };
    const BYTES: usize = 1 << 30;
    let free = device.mem_get_info().expect("mem_get_info").free;
    if free < 2 * BYTES as u64 {
        eprintln!(
            "SKIP memset_is_complete_before_work_on_another_stream_starts: needs 2 GiB free, \
             {free} bytes are"
        );
        return;
    }
    let module = device
        .compile_module(KERNELS, "kernels.cu", &[])
        .expect("compile");
    let count = module.function("count_not_equal").expect("lookup");
    let mut data = DeviceBuffer::alloc(&device, BYTES).expect("alloc 1 GiB");
    let mut counter = DeviceBuffer::alloc(&device, 8).expect("alloc counter");
    let reader = Stream::new(&device).expect("stream");
    let blocks = device.multiprocessor_count().expect("CUs") * 4;
    let config = LaunchConfig {
        grid: [blocks, 1, 1],
        block: [256, 1, 1],
        shared_bytes: 0,
    };
    for round in 0..8u32 {
        let value: u8 = if round % 2 == 0 { 0xa5 } else { 0x3c };
        counter.memset(0).expect("reset counter");
        data.memset(value).expect("memset 1 GiB");
        // At once, on a different non-blocking stream: the memset must already be done.
        let (ptr, n, wanted, out): (DevicePtr, u64, u32, DevicePtr) =
            (data.ptr(), BYTES as u64, u32::from(value), counter.ptr());
        let mut launch = count.builder(&reader);
        launch.arg(&ptr).arg(&n).arg(&wanted).arg(&out);
        // SAFETY: (const uchar*, ull, uint, ull*) match; both buffers outlive the synchronize.
        unsafe { launch.launch(config) }.expect("launch reader");
        reader.synchronize().expect("sync");
        let mismatches = counter.to_host_vec::<u64>().expect("d2h")[0];
        assert_eq!(
            mismatches, 0,
            "round {round}: {mismatches} bytes were not yet {value:#x} when the reader ran"
        );
    }
}

#[test]
#[serial]
fn managed_memory_works_or_reports_unsupported() {
    let Some(device) = gpu_or_skip("managed_memory_works_or_reports_unsupported") else {
        return;
    };
    let supported = device.supports_managed_memory().expect("attribute");
    let result = ManagedBuffer::alloc(&device, 4096);
    if !supported {
        assert_eq!(
            result.expect_err("unsupported").kind,
            ErrorKind::NotSupported
        );
        return;
    }
    let mut managed = result.expect("managed alloc");
    let module = device
        .compile_module(KERNELS, "kernels.cu", &[])
        .expect("compile");
    let add = module.function("add_one").expect("lookup");
    let input = noise(1024, 21);
    // SAFETY: no device work is in flight on this memory yet.
    unsafe { managed.host_slice_mut::<i32>() }.copy_from_slice(&input);
    let stream = Stream::new(&device).expect("stream");
    let (ptr, len) = (managed.ptr(), 1024u32);
    let mut launch = add.builder(&stream);
    launch.arg(&ptr).arg(&len);
    // SAFETY: pointer/uint match; the buffer lives past the synchronize.
    unsafe { launch.launch(LaunchConfig::for_elements(len, 256)) }.expect("launch");
    stream.synchronize().expect("sync");
    // SAFETY: the kernel has finished.
    let host = unsafe { managed.host_slice_mut::<i32>() };
    let expected: Vec<i32> = input.iter().map(|x| x + 1).collect();
    assert_eq!(host, expected.as_slice());
}

#[test]
#[serial]
fn raw_copies_are_ordered_on_their_stream() {
    let Some(device) = gpu_or_skip("raw_copies_are_ordered_on_their_stream") else {
        return;
    };
    let module = device
        .compile_module(KERNELS, "raw_copies.cu", &[])
        .expect("compile");
    let add_one = module.function("add_one").expect("add_one");
    let stream = Stream::new(&device).expect("stream");
    let n = 1usize << 20;
    let buffer = DeviceBuffer::alloc(&device, n * 4).expect("alloc");
    let input = noise(n, 7);
    let n_u32 = n as u32;
    let dst = buffer.ptr();
    // Copy in, add one on the same stream, copy out: each step sees the previous one only if
    // the raw copies are ordered on the stream like the kernel.
    let mut output = vec![0i32; n];
    // SAFETY: `buffer` holds n i32 and outlives the stream's work (synchronized below);
    // `input` and `output` stay untouched until then.
    unsafe {
        stream.copy_from_host_raw(dst, &input).expect("copy in");
        let mut launch = add_one.builder(&stream);
        launch.arg(&dst).arg(&n_u32);
        launch
            .launch(LaunchConfig::for_elements(n_u32, 256))
            .expect("launch");
        stream.copy_to_host_raw(&mut output, dst).expect("copy out");
    }
    stream.synchronize().expect("sync");
    let wrong = input
        .iter()
        .zip(&output)
        .filter(|(a, b)| **a + 1 != **b)
        .count();
    assert_eq!(wrong, 0, "{wrong} of {n} values were not input + 1");
}
