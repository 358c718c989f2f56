//! The device communicator on one GPU. NCCL refuses two ranks of one group on the same device,
//! so this is a group of one rank; it checks that every entry point is called with nccl.h's
//! arguments (an out-of-place sum and gather of one rank copy `send` to `recv`, so a wrong
//! count, type or argument order shows in the values), the asynchronous error query, and that
//! an aborted communicator refuses further work by name.
//!
//! Without a GPU the test skips with a printed reason; with `HIPDECODE_REQUIRE_GPU=1` a missing
//! GPU or collective library fails it. NCCL runs with `NCCL_NVLS_ENABLE=0` (the library
//! refuses to load without it).

use collective::device::{DeviceComm, UniqueId};
use collective::library::Library;
use hip_ffi::{DeviceBuffer, Stream};
use std::sync::Arc;

#[test]
fn one_rank_sums_gathers_and_refuses_work_after_an_abort() {
    let name = "one_rank_sums_gathers_and_refuses_work_after_an_abort";
    let Some(device) = hip_ffi::testing::device_or_skip(name) else {
        return;
    };
    let library = match Library::open() {
        Ok(library) => Arc::new(library),
        Err(e) => {
            let required = hip_ffi::knobs::REQUIRE_GPU.read().unwrap_or(false);
            assert!(
                !required,
                "{name}: a GPU is required, and so its collectives: {e}"
            );
            eprintln!("SKIP {name}: {e}");
            return;
        }
    };
    let stream = Stream::new(&device).expect("a stream");
    let id = UniqueId::new(&library).expect("a unique id");
    let mut comm = DeviceComm::join(Arc::clone(&library), &id, 0, 1).expect("rank 0 of 1 joins");
    assert_eq!((comm.rank(), comm.ranks()), (0, 1));

    let n = 1000;
    let values: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 7.25).collect();
    let mut send = DeviceBuffer::alloc(&device, n * 4).expect("send");
    send.copy_from_host(&values).expect("upload");
    let mut recv = DeviceBuffer::alloc(&device, n * 4).expect("recv");
    recv.memset(0xFF).expect("recv filled with NaN bits");
    let raw_stream = stream.raw().value() as *mut std::ffi::c_void;
    // SAFETY: both buffers hold n f32 on this device and outlive the stream's sync below.
    unsafe { comm.all_reduce_sum_f32(send.ptr().0, recv.ptr().0, n, raw_stream) }
        .expect("the sum is queued");
    stream.synchronize().expect("the sum runs");
    assert_eq!(
        recv.to_host_vec::<f32>().unwrap(),
        values,
        "one rank's sum is its values"
    );

    recv.memset(0xFF).expect("recv refilled");
    // Only the first half: a count taken as bytes, or as the whole buffer, would show.
    // SAFETY: as above; recv holds n / 2 * ranks f32.
    unsafe { comm.all_gather_f32(send.ptr().0, recv.ptr().0, n / 2, raw_stream) }
        .expect("the gather is queued");
    stream.synchronize().expect("the gather runs");
    let gathered = recv.to_host_vec::<f32>().unwrap();
    assert_eq!(gathered[..n / 2], values[..n / 2], "the gathered half");
    assert!(
        gathered[n / 2..].iter().all(|v| v.is_nan()),
        "the gather wrote past its count"
    );

    comm.check_async().expect("no asynchronous error");
    comm.abort().expect("the abort");
    // SAFETY: as above; the call is refused before the library sees it.
    let refused = unsafe { comm.all_reduce_sum_f32(send.ptr().0, recv.ptr().0, n, raw_stream) };
    let e = refused
        .expect_err("an aborted communicator refuses work")
        .to_string();
    assert!(e.contains("aborted"), "{e}");
    assert!(comm.check_async().is_err(), "the query is refused too");

    // A rank outside its group is refused before the library is called.
    let e = DeviceComm::join(library, &id, 1, 1)
        .err()
        .expect("rank 1 of 1")
        .to_string();
    assert!(e.contains("rank 1 of 1"), "{e}");
}
