//! The vendor GEMM library (cuBLASLt / hipBLASLt) against a CPU product of the same f16 inputs.
//!
//! Where the library is not installed the test skips with the reason, unless
//! `HIPDECODE_REQUIRE_BLAS=1` (set on the verification machine, which has it).

use half::f16;
use hip_ffi::knobs::REQUIRE_BLAS;
use hip_ffi::testing::device_or_skip;
use hip_ffi::{BlasLt, DeviceBuffer, DevicePtr, GemmShape, Stream};

fn open_or_skip(test: &str) -> Option<(hip_ffi::Device, BlasLt)> {
    let device = device_or_skip(test)?;
    match BlasLt::open(&device) {
        Ok(blas) => Some((device, blas)),
        Err(reason) => {
            let required = hip_ffi::testing::required(&REQUIRE_BLAS, test);
            assert!(!required, "{test}: HIPDECODE_REQUIRE_BLAS=1 but {reason}");
            eprintln!("skipping {test}: {reason}");
            None
        }
    }
}

/// A deterministic spread of values in [-1, 1), rounded to f16.
fn values(n: usize, seed: u32) -> Vec<f16> {
    (0..n)
        .map(|i| {
            let h = (i as u32)
                .wrapping_mul(2_654_435_761)
                .wrapping_add(seed.wrapping_mul(97));
            f16::from_f32(((h >> 8) % 2001) as f32 / 1000.0 - 1.0)
        })
        .collect()
}

fn upload(device: &hip_ffi::Device, data: &[u16]) -> DeviceBuffer {
    let mut buf = DeviceBuffer::alloc(device, data.len() * 2).unwrap();
    buf.copy_from_host(data).unwrap();
    buf
}

#[test]
fn half_gemm_matches_the_cpu_at_odd_shapes() {
    let Some((device, blas)) = open_or_skip("half_gemm_matches_the_cpu_at_odd_shapes") else {
        return;
    };
    eprintln!("{}", blas.describe());
    let stream = Stream::new(&device).unwrap();
    for (m, n, k) in [(123, 37, 200), (64, 1, 64), (1000, 512, 640), (7, 9, 8)] {
        let a = values(m * k, 1);
        let b = values(n * k, 2);
        let bits = |v: &[f16]| v.iter().map(|x| x.to_bits()).collect::<Vec<u16>>();
        let (da, db) = (upload(&device, &bits(&a)), upload(&device, &bits(&b)));
        let dd = DeviceBuffer::alloc(&device, m * n * 4).unwrap();
        let plan = blas.plan(GemmShape::dense(m, n, k), 32 << 20).unwrap();
        let ws = (plan.workspace_bytes() > 0)
            .then(|| DeviceBuffer::alloc(&device, plan.workspace_bytes()).unwrap());
        let ws_ptr = ws.as_ref().map_or(DevicePtr::NULL, |w| w.ptr());
        // SAFETY: the buffers hold m·k and n·k f16, m·n f32 and the plan's workspace, and live
        // until the stream is synchronized below.
        unsafe { blas.gemm(&plan, da.ptr(), db.ptr(), dd.ptr(), ws_ptr, &stream) }.unwrap();
        stream.synchronize().unwrap();
        let got: Vec<f32> = dd.to_host_vec().unwrap();
        let mut worst = 0f32;
        for t in 0..n {
            for r in 0..m {
                let want: f32 = (0..k)
                    .map(|i| a[r * k + i].to_f32() * b[t * k + i].to_f32())
                    .sum();
                let diff = (got[t * m + r] - want).abs();
                // NaN fails: `!(diff <= tol)`.
                assert!(
                    diff <= 1e-3 * (1.0 + want.abs()),
                    "{m}x{n}x{k}: d[{t}][{r}] = {} against {want}",
                    got[t * m + r]
                );
                worst = worst.max(diff);
            }
        }
        eprintln!(
            "{m}x{n}x{k}: max |Δ| {worst:.2e}, workspace {} B",
            plan.workspace_bytes()
        );
    }
}

#[test]
fn an_empty_product_is_refused_before_the_library_sees_it() {
    let Some((_device, blas)) =
        open_or_skip("an_empty_product_is_refused_before_the_library_sees_it")
    else {
        return;
    };
    let err = blas
        .plan(GemmShape::dense(0, 4, 8), 0)
        .err()
        .expect("refused");
    assert!(err.to_string().contains("empty product"), "{err}");
    let narrow = GemmShape {
        d_stride: 3,
        ..GemmShape::dense(4, 4, 8)
    };
    let err = blas.plan(narrow, 0).err().expect("refused");
    assert!(err.to_string().contains("cannot hold"), "{err}");
}

/// Two products over the two halves of the weights' rows, each writing its columns of one wider
/// result, equal the product over all rows.
#[test]
fn row_blocks_write_their_columns_of_a_wider_result() {
    let Some((device, blas)) = open_or_skip("row_blocks_write_their_columns_of_a_wider_result")
    else {
        return;
    };
    let stream = Stream::new(&device).unwrap();
    let (m, n, k) = (96, 40, 128);
    let a = values(m * k, 3);
    let b = values(n * k, 4);
    let bits = |v: &[f16]| v.iter().map(|x| x.to_bits()).collect::<Vec<u16>>();
    let (da, db) = (upload(&device, &bits(&a)), upload(&device, &bits(&b)));
    let whole = DeviceBuffer::alloc(&device, m * n * 4).unwrap();
    let halves = DeviceBuffer::alloc(&device, m * n * 4).unwrap();
    let plan = blas.plan(GemmShape::dense(m, n, k), 0).unwrap();
    let half = blas
        .plan(
            GemmShape {
                d_stride: m,
                ..GemmShape::dense(m / 2, n, k)
            },
            0,
        )
        .unwrap();
    // SAFETY: as in the test above; the half products read rows [0, m/2) and [m/2, m) of `a`
    // and write columns [0, m/2) and [m/2, m) of `halves`, inside both buffers.
    unsafe {
        blas.gemm(
            &plan,
            da.ptr(),
            db.ptr(),
            whole.ptr(),
            DevicePtr::NULL,
            &stream,
        )
        .unwrap();
        for h in 0..2u64 {
            let rows = (m / 2) as u64 * h;
            let a_at = da.ptr().offset(rows * k as u64 * 2);
            let d_at = halves.ptr().offset(rows * 4);
            blas.gemm(&half, a_at, db.ptr(), d_at, DevicePtr::NULL, &stream)
                .unwrap();
        }
    }
    stream.synchronize().unwrap();
    let (w, h): (Vec<f32>, Vec<f32>) =
        (whole.to_host_vec().unwrap(), halves.to_host_vec().unwrap());
    assert!(w.iter().all(|v| v.is_finite()));
    // The two products may pick different algorithms (summation orders), so not bit-equal.
    for (i, (x, y)) in w.iter().zip(&h).enumerate() {
        let diff = (x - y).abs();
        assert!(
            diff <= 1e-4 * (1.0 + x.abs()),
            "value {i}: whole {x}, blocked {y}"
        );
    }
}
