//! GPU tests. Each gets the device through `common::gpu_or_skip`, which prints
//! `skipping: <reason>` and returns `None` when there is no GPU.

mod common;

use common::gpu_or_skip;
use hip_ffi::{
    kernel_arg, DeviceBuffer, ErrorKind, Event, HostRegistration, LaunchConfig, ManagedBuffer,
    PinnedHostBuffer, PlatformKind, Stream,
};

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
"#;

/// A deterministic pseudo-random sequence so inputs are not zeros or a ramp.
fn noise(n: usize, seed: u32) -> Vec<i32> {
    let mut state = seed.wrapping_mul(2_654_435_761).max(1);
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            (state % 100_000) as i32 - 50_000
        })
        .collect()
}

#[test]
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
fn mem_get_info_is_sane_and_sees_allocations() {
    let Some(device) = gpu_or_skip("mem_get_info_is_sane_and_sees_allocations") else {
        return;
    };
    let before = device.mem_get_info().expect("mem_get_info");
    assert!(before.total > 0);
    assert!(before.free <= before.total);
    let total_attr = device.total_memory().expect("total memory");
    // Both describe the same memory; drivers differ by a reserved slice at most.
    assert!(before.total <= total_attr.max(before.total));
    assert!(
        before.total >= total_attr / 2,
        "{} vs {total_attr}",
        before.total
    );

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
    assert!(after.free > during.free, "freeing must return memory");
}

#[test]
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
    let (ptr, scale) = (out.ptr().0, 0.5f32);
    // SAFETY: argument types match the kernel (pointer, unsigned int, float); the buffer holds
    // n floats and outlives the synchronize.
    unsafe {
        fill.launch(
            &cfg,
            &stream,
            &mut [kernel_arg(&ptr), kernel_arg(&n), kernel_arg(&scale)],
        )
    }
    .expect("launch");
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
    // SAFETY: rejected before launch (zero grid).
    let zero = unsafe {
        fill.launch(
            &LaunchConfig {
                grid: [0, 1, 1],
                block: [1, 1, 1],
                shared_bytes: 0,
            },
            &stream,
            &mut [],
        )
    };
    assert_eq!(
        zero.expect_err("zero grid").kind,
        ErrorKind::InvalidArgument
    );
}

#[test]
fn kernel_reads_mapped_pinned_host_memory() {
    let Some(device) = gpu_or_skip("kernel_reads_mapped_pinned_host_memory") else {
        return;
    };
    let module = device
        .compile_module(KERNELS, "kernels.cu", &[])
        .expect("compile");
    let kernel = module.function("double_from_host").expect("lookup");
    let n: u32 = 4099;
    let input = noise(n as usize, 3);
    let mut pinned = PinnedHostBuffer::alloc(&device, n as usize * 4).expect("pinned");
    pinned.as_mut_slice::<i32>().copy_from_slice(&input);
    let out = DeviceBuffer::alloc(&device, n as usize * 4).expect("alloc");
    let stream = Stream::new(&device).expect("stream");
    let (src, dst) = (pinned.device_ptr().0, out.ptr().0);
    // SAFETY: pointer/pointer/uint match the kernel; both buffers hold n ints and live past
    // the synchronize.
    unsafe {
        kernel.launch(
            &LaunchConfig::for_elements(n, 128),
            &stream,
            &mut [kernel_arg(&src), kernel_arg(&dst), kernel_arg(&n)],
        )
    }
    .expect("launch");
    stream.synchronize().expect("sync");
    let expected: Vec<i32> = input.iter().map(|x| 2 * x + 1).collect();
    assert_eq!(out.to_host_vec::<i32>().expect("d2h"), expected);

    // Registered (not runtime-allocated) host memory, written by the device in place.
    let add = module.function("add_one").expect("lookup");
    let mut host = noise(1000, 11);
    let original = host.clone();
    {
        let registration = HostRegistration::new(&device, &mut host).expect("register");
        let (ptr, len) = (registration.device_ptr().0, 1000u32);
        // SAFETY: pointer/uint match; the registration keeps the memory mapped until dropped,
        // after the synchronize.
        unsafe {
            add.launch(
                &LaunchConfig::for_elements(len, 128),
                &stream,
                &mut [kernel_arg(&ptr), kernel_arg(&len)],
            )
        }
        .expect("launch");
        stream.synchronize().expect("sync");
    }
    let expected: Vec<i32> = original.iter().map(|x| x + 1).collect();
    assert_eq!(host, expected);
}

#[test]
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
    let (ptr, rounds) = (data.ptr().0, 2000u32);
    start.record(&stream).expect("record");
    // SAFETY: pointer/uint/uint match; the buffer lives past the synchronize.
    unsafe {
        spin.launch(
            &LaunchConfig::for_elements(n, 256),
            &stream,
            &mut [kernel_arg(&ptr), kernel_arg(&n), kernel_arg(&rounds)],
        )
    }
    .expect("launch");
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
fn graph_capture_and_replay() {
    let Some(device) = gpu_or_skip("graph_capture_and_replay") else {
        return;
    };
    let module = device
        .compile_module(KERNELS, "kernels.cu", &[])
        .expect("compile");
    let add = module.function("add_one").expect("lookup");
    let n: u32 = 10_000;
    let mut data = DeviceBuffer::alloc(&device, n as usize * 4).expect("alloc");
    let start = noise(n as usize, 5);
    data.copy_from_host(&start).expect("h2d");
    let stream = Stream::new(&device).expect("stream");
    let (ptr, len) = (data.ptr().0, n);
    stream.begin_capture().expect("begin capture");
    for _ in 0..3 {
        // SAFETY: pointer/uint match; the buffer outlives every replay below.
        unsafe {
            add.launch(
                &LaunchConfig::for_elements(len, 256),
                &stream,
                &mut [kernel_arg(&ptr), kernel_arg(&len)],
            )
        }
        .expect("captured launch");
    }
    let graph = stream.end_capture().expect("end capture");
    let exec = graph.instantiate().expect("instantiate");
    stream.synchronize().expect("sync");
    assert_eq!(
        data.to_host_vec::<i32>().expect("d2h"),
        start,
        "capturing must not run the kernels"
    );
    const REPLAYS: i32 = 4;
    for _ in 0..REPLAYS {
        exec.launch(&stream).expect("graph launch");
    }
    stream.synchronize().expect("sync");
    let expected: Vec<i32> = start.iter().map(|x| x + 3 * REPLAYS).collect();
    assert_eq!(data.to_host_vec::<i32>().expect("d2h"), expected);
}

#[test]
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
    let (ptr, len) = (managed.ptr().0, 1024u32);
    // SAFETY: pointer/uint match; the buffer lives past the synchronize.
    unsafe {
        add.launch(
            &LaunchConfig::for_elements(len, 256),
            &stream,
            &mut [kernel_arg(&ptr), kernel_arg(&len)],
        )
    }
    .expect("launch");
    stream.synchronize().expect("sync");
    // SAFETY: the kernel has finished.
    let host = unsafe { managed.host_slice_mut::<i32>() };
    let expected: Vec<i32> = input.iter().map(|x| x + 1).collect();
    assert_eq!(host, expected.as_slice());
}
