//! Backend conformance: every op on every backend against the CPU exact path, at several shapes.
//!
//! `test_device!(op)` expands the generic body `op<B: Backend>(make: impl Fn() -> B)` into one
//! test per backend: `op::cpu_fast` (the CPU backend's fast path) and `op::gpu` (the GPU
//! backend, which prints SKIP without a GPU). Each body computes the same op with
//! `CpuBackend::new(Precision::Exact)` and with the backend under test, on deterministic
//! pseudo-random inputs, and compares the results with a NaN-failing max |diff| bounded by
//! a tolerance times max(1, RMS of the reference).

mod common;

use common::preset_file;
use decode::backend::cpu::CpuBackend;
use decode::backend::gpu::vendor_gemm::VENDOR_GEMM_MIN_ROWS;
use decode::backend::gpu::{
    GpuBackend, GpuWeight, KvType, MatvecPath, MoeGrouped, MoeIndex, ReadPath,
};
use decode::backend::{
    Attention, Backend, BlockTables, GateActivation, KvGroup, KvLayer, MoeShape, Precision, Rope,
    StepBounds, WeightSource,
};
use decode::batch::{RowOutput, StepBatch};
use decode::gguf_loader::synth::Preset;
use decode::gguf_loader::GgmlType;
use decode::layout::workspace::MOE_GROUPED_MIN_ROWS;
use decode::memory::MemoryTag;
use rand::Rng;
use std::any::Any;
use test_support::rng::{seeded, uniform_vec};
use test_support::tolerance::{compare, max_abs_diff};

/// Ops whose result is f32 arithmetic on both sides (norms, element-wise ops, rope, attention):
/// the backends differ only in summation order and transcendental implementations.
const F32_TOL: f32 = 1e-5;
/// Matmul with f32 activations (the GPU): quantized weights dequantized exactly on both sides,
/// so only the summation order over up to ~1000 products differs.
const MATMUL_F32_TOL: f32 = 1e-4;
/// Matmul on `cpu_fast`: activations are quantized to 16-bit integers per group, a relative
/// error of about 2^-15 per value that grows with the row length.
const MATMUL_FAST_TOL: f32 = 2e-3;

macro_rules! test_device {
    ($op:ident) => {
        mod $op {
            #[test]
            fn cpu_fast() {
                super::$op(|| super::CpuBackend::new(super::Precision::Fast));
            }

            #[test]
            fn gpu() {
                let _lock = test_support::gpu::gpu_lock();
                let Some(device) = hip_ffi::testing::device_or_skip(concat!(
                    "backend_conformance::",
                    stringify!($op),
                    "::gpu"
                )) else {
                    return;
                };
                super::$op(move || {
                    let mut be =
                        super::GpuBackend::new(device, 64, false).expect("the GPU backend starts");
                    be.set_matvec_path(super::MatvecPath::Exact);
                    be.set_kv_type(super::KvType::F32);
                    be
                });
            }

            #[test]
            fn gpu_int8() {
                let _lock = test_support::gpu::gpu_lock();
                let Some(device) = hip_ffi::testing::device_or_skip(concat!(
                    "backend_conformance::",
                    stringify!($op),
                    "::gpu_int8"
                )) else {
                    return;
                };
                super::$op(move || {
                    let mut be =
                        super::GpuBackend::new(device, 64, false).expect("the GPU backend starts");
                    be.set_matvec_path(super::MatvecPath::Int8);
                    be.set_kv_type(super::KvType::F16);
                    be
                });
            }
        }
    };
}

/// Matmul on `gpu_int8`: activations quantized to 8 bits per group of 32 for products of at
/// most eight rows (and, on matrix cores, up to `HIPDECODE_GPU_INT8_MMA_ROWS`), a relative error of about 0.4 % per value; over a row the errors average
/// to about that share of the output's RMS, and the largest of many outputs stays within a
/// few times it.
const MATMUL_INT8_TOL: f32 = 3e-2;

/// Matmul on the vendor GEMM (`gpu_int8`, prefill): weights and activations rounded to f16,
/// 2^-11 relative per value, products summed in f32.
const MATMUL_F16_TOL: f32 = 2e-3;

/// The mixture-of-experts FFN on the vendor GEMM (`gpu_int8`, prefill): two products in a row
/// (gate and up, then down), each over f16-rounded inputs and weights, the gated activations
/// between them rounded to f16 again; so twice a product's bound, and a share of it again for
/// the largest of the many outputs. Measured on the H200 (2026-12-01): 3.8e-3 x RMS at seed 23.
const MOE_F16_TOL: f32 = 3.0 * MATMUL_F16_TOL;

/// The mixture-of-experts FFN of a grouped step on the int8 matrix-core kernel: the same two
/// products in a row, each with its activations quantized to 8 bits (the rows, then the gated
/// hidden values), so the same multiple of a product's bound as `MOE_F16_TOL`, for the largest
/// of many outputs. Measured on the H200 (2026-12-06, seed 23, 40 rows): 5.0e-2 x RMS.
const MOE_INT8_TOL: f32 = 3.0 * MATMUL_INT8_TOL;

/// Attention over an f16 KV cache (`gpu_int8`): keys and values rounded to 11 significant bits,
/// a relative error of at most 2^-11 per stored value (the caches are compared too).
const KV_F16_TOL: f32 = 2e-3;

/// Whether `be` stores its KV cache in f16.
fn stores_f16_kv<B: Backend + 'static>(be: &B) -> bool {
    (be as &dyn Any)
        .downcast_ref::<GpuBackend>()
        .is_some_and(|g| g.kv_type() == KvType::F16)
}

/// The matmul tolerance for `be`: how its activations are rounded before products of `rows`
/// rows by a matrix of `format` (`None`: the MoE's experts, which take 8-bit activations only
/// up to the matrix-vector kernels' rows).
fn matmul_tolerance<B: Backend + 'static>(be: &B, rows: usize, format: Option<GgmlType>) -> f32 {
    let any = be as &dyn Any;
    if any
        .downcast_ref::<CpuBackend>()
        .is_some_and(|c| c.precision() == Precision::Fast)
    {
        return MATMUL_FAST_TOL;
    }
    let gpu_int8 = any
        .downcast_ref::<GpuBackend>()
        .is_some_and(|g| g.matvec_path() == MatvecPath::Int8);
    let int8_matrix_cores = any
        .downcast_ref::<GpuBackend>()
        .zip(format)
        .is_some_and(|(g, f)| g.int8_matrix_cores_take(rows, f));
    if gpu_int8 && (rows <= decode::backend::gpu::INT8_MAX_ROWS || int8_matrix_cores) {
        return MATMUL_INT8_TOL;
    }
    if gpu_int8 && rows >= VENDOR_GEMM_MIN_ROWS {
        return MATMUL_F16_TOL;
    }
    MATMUL_F32_TOL
}

fn exact() -> CpuBackend {
    CpuBackend::new(Precision::Exact)
}

/// A step of one sequence from `pos0` with `tokens`. These op tests stand a one-row step for a
/// decode step (so a GPU backend takes its decode kernels) and a longer one for a prefill
/// chunk, as a model's steps are.
fn step_at(pos0: usize, tokens: &[u32]) -> StepBatch {
    if let [token] = tokens {
        StepBatch::decode(0, pos0, *token, RowOutput::Nothing)
    } else {
        StepBatch::prefill(0, pos0, tokens, RowOutput::Nothing)
    }
}

/// One sequence's table over a cache of `slots` rows in order (blocks of one row, so any
/// slot count is whole blocks): the unpaged layout the ops below are checked on.
fn one_table(slots: usize) -> BlockTables {
    BlockTables::new(1, 1, slots, slots, &[]).expect("tables")
}

fn pool_layer(slots: usize) -> KvLayer {
    KvLayer {
        slots,
        group: KvGroup::POOL,
    }
}

fn upload<B: Backend>(be: &mut B, data: &[f32]) -> B::Buffer {
    let mut buf = be.alloc(MemoryTag::Activations, data.len()).expect("alloc");
    be.write(&mut buf, 0, data).expect("write");
    buf
}

fn download<B: Backend>(be: &mut B, buf: &B::Buffer, n: usize) -> Vec<f32> {
    let mut out = vec![0.0; n];
    be.read(buf, 0, &mut out).expect("read");
    out
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// An F32 vector weight (norm weights, biases, rope factors).
fn load_vector<B: Backend>(be: &mut B, name: &str, v: &[f32]) -> B::Weight {
    let bytes = f32_bytes(v);
    be.load_weight(&WeightSource {
        name,
        format: GgmlType::F32,
        dims: [v.len(), 1, 1],
        bytes: &bytes,
        mapped: None,
        lookup_only: false,
    })
    .expect("load a vector")
}

/// Fails unless max |got - want| <= tol * max(1, RMS of want) (and neither holds NaN).
fn check(what: &str, got: &[f32], want: &[f32], tol: f32) {
    let (diff, rms) = compare(got, want);
    let bound = tol * rms.max(1.0);
    assert!(
        diff <= bound,
        "{what}: max |diff| {diff:e} > {bound:e} (tol {tol:e}, reference RMS {rms})"
    );
}

/// A matrix in its stored format, owned.
#[derive(Clone)]
struct Matrix {
    name: String,
    format: GgmlType,
    dims: [usize; 3],
    bytes: Vec<u8>,
}

impl Matrix {
    fn source(&self) -> WeightSource<'_> {
        WeightSource {
            name: &self.name,
            format: self.format,
            dims: self.dims,
            bytes: &self.bytes,
            mapped: None,
            lookup_only: false,
        }
    }

    /// The first `rows` rows (whole rows of bytes).
    fn rows(&self, rows: usize) -> Matrix {
        let row_bytes = self.bytes.len() / self.dims[1];
        Matrix {
            name: format!("{}[..{rows}]", self.name),
            format: self.format,
            dims: [self.dims[0], rows, 1],
            bytes: self.bytes[..rows * row_bytes].to_vec(),
        }
    }
}

/// One 2-D tensor of each of `formats` from the tiny synthetic models.
fn matrices(formats: &[GgmlType]) -> Vec<Matrix> {
    let mut found: Vec<Matrix> = Vec::new();
    for preset in [
        Preset::TinyLlama,
        Preset::TinyQwen3,
        Preset::TinyGemma3,
        Preset::TinyQwen3Moe,
    ] {
        let file = preset_file(preset);
        for t in file.tensors() {
            let format = t.ggml_type;
            let dims: Vec<usize> = t.dims.iter().map(|&d| d as usize).collect();
            let is_matrix = dims.len() >= 2 && dims[1] >= 8 && dims[2..].iter().all(|&d| d == 1);
            if !is_matrix || !formats.contains(&format) || found.iter().any(|m| m.format == format)
            {
                continue;
            }
            found.push(Matrix {
                name: t.name.clone(),
                format,
                dims: [dims[0], dims[1], 1],
                bytes: file.tensor_data(t).to_vec(),
            });
        }
    }
    for f in formats {
        assert!(
            found.iter().any(|m| m.format == *f),
            "no {f} matrix in the tiny models"
        );
    }
    found
}

const ROWS: [usize; 3] = [1, 3, 17];
/// Token rows of matrix products: [`ROWS`] (17: a step of the int8 matrix-core kernel's rows),
/// and steps past that kernel's default cap of 32 rows for the vendor GEMM.
const MATMUL_ROWS: [usize; 5] = [1, 3, 17, 40, 70];
const DIMS: [usize; 3] = [7, 64, 1152];
/// Row lengths of ops with a vector weight (an F32 vector may have any length).
const WEIGHT_DIMS: [usize; 4] = [7, 32, 96, 1152];

test_device!(rms_norm);
fn rms_norm<B: Backend + 'static>(make: impl Fn() -> B) {
    fn go<C: Backend>(be: &mut C, x: &[f32], w: &[f32], rows: usize, dim: usize) -> Vec<f32> {
        let weight = load_vector(be, "norm", w);
        let xb = upload(be, x);
        let mut out = be.alloc(MemoryTag::Activations, x.len()).unwrap();
        be.rms_norm(&xb, &weight, &mut out, rows, dim, 1e-6)
            .expect("rms_norm");
        download(be, &out, rows * dim)
    }
    let mut rng = seeded(1);
    for rows in ROWS {
        for dim in WEIGHT_DIMS {
            let x = uniform_vec(&mut rng, rows * dim, -3.0, 3.0);
            let w = uniform_vec(&mut rng, dim, -1.5, 1.5);
            let want = go(&mut exact(), &x, &w, rows, dim);
            let got = go(&mut make(), &x, &w, rows, dim);
            check(&format!("rms_norm {rows}x{dim}"), &got, &want, F32_TOL);
        }
    }
}

test_device!(add_rms_norm);
/// The residual add and the next norm, with and without the add; then a product that reads
/// the normed rows, which on `gpu_int8` takes the 8-bit copy the fused kernel left.
fn add_rms_norm<B: Backend + 'static>(make: impl Fn() -> B) {
    struct Out {
        x: Vec<f32>,
        normed: Vec<f32>,
        product: Vec<f32>,
    }
    #[allow(clippy::too_many_arguments)]
    fn go<C: Backend>(
        be: &mut C,
        x: &[f32],
        y: Option<&[f32]>,
        w: &[f32],
        m: &Matrix,
        rows: usize,
        dim: usize,
    ) -> Out {
        let weight = load_vector(be, "norm", w);
        let mut xb = upload(be, x);
        let yb = y.map(|y| upload(be, y));
        let mut out = be.alloc(MemoryTag::Activations, x.len()).unwrap();
        be.add_rms_norm(&mut xb, yb.as_ref(), &weight, &mut out, rows, dim, 1e-6)
            .expect("add_rms_norm");
        let mw = be.load_weight(&m.source()).expect("load the matrix");
        let n_out = m.dims[1];
        let mut prod = be.alloc(MemoryTag::Activations, rows * n_out).unwrap();
        be.matmul(&mw, &out, &mut prod, rows).expect("matmul");
        Out {
            x: download(be, &xb, rows * dim),
            normed: download(be, &out, rows * dim),
            product: download(be, &prod, rows * n_out),
        }
    }
    let probe = make();
    let mut rng = seeded(21);
    for m in matrices(&[GgmlType::Q4K, GgmlType::Q8_0]) {
        let dim = m.dims[0];
        for rows in ROWS {
            for with_y in [false, true] {
                let x = uniform_vec(&mut rng, rows * dim, -3.0, 3.0);
                let y = uniform_vec(&mut rng, rows * dim, -3.0, 3.0);
                let w = uniform_vec(&mut rng, dim, -1.5, 1.5);
                let y = with_y.then_some(&y[..]);
                let want = go(&mut exact(), &x, y, &w, &m, rows, dim);
                let got = go(&mut make(), &x, y, &w, &m, rows, dim);
                let what = format!("add_rms_norm {rows}x{dim} add {with_y} then {}", m.name);
                check(&format!("{what}: x"), &got.x, &want.x, F32_TOL);
                check(
                    &format!("{what}: normed"),
                    &got.normed,
                    &want.normed,
                    F32_TOL,
                );
                let tol = matmul_tolerance(&probe, rows, Some(m.format));
                check(
                    &format!("{what}: product"),
                    &got.product,
                    &want.product,
                    tol,
                );
            }
        }
    }
}

test_device!(rms_norm_inplace);
fn rms_norm_inplace<B: Backend + 'static>(make: impl Fn() -> B) {
    fn go<C: Backend>(be: &mut C, x: &[f32], w: &[f32], rows: usize, dim: usize) -> Vec<f32> {
        let weight = load_vector(be, "head_norm", w);
        let mut xb = upload(be, x);
        be.rms_norm_inplace(&mut xb, &weight, rows, dim, 1e-6)
            .expect("rms_norm_inplace");
        download(be, &xb, x.len())
    }
    let mut rng = seeded(2);
    // Per-head norms: rows = tokens x heads.
    for (tokens, heads) in [(1, 4), (3, 2), (17, 4)] {
        for dim in [32, 64, 128, 256] {
            let rows = tokens * heads;
            // One row more than normed, which must stay untouched.
            let x = uniform_vec(&mut rng, (rows + 1) * dim, -2.0, 2.0);
            let w = uniform_vec(&mut rng, dim, -1.5, 1.5);
            let want = go(&mut exact(), &x, &w, rows, dim);
            let got = go(&mut make(), &x, &w, rows, dim);
            check(
                &format!("rms_norm_inplace {tokens} tokens x {heads} heads x {dim}"),
                &got,
                &want,
                F32_TOL,
            );
        }
    }
}

test_device!(matmul);
fn matmul<B: Backend + 'static>(make: impl Fn() -> B) {
    fn go<C: Backend>(be: &mut C, m: &Matrix, x: &[f32], rows: usize) -> Vec<f32> {
        let w = be.load_weight(&m.source()).expect("load the matrix");
        // As a model does after loading: the GPU takes its prefill buffers (vendor GEMM) here.
        let bounds = StepBounds {
            max_tokens: MATMUL_ROWS[MATMUL_ROWS.len() - 1],
            decode_attention: Vec::new(),
            moe: None,
            table_entries: 0,
        };
        be.reserve_workspace(&bounds, &[]).expect("reserve");
        let xb = upload(be, x);
        let n_out = m.dims[1];
        let mut out = be.alloc(MemoryTag::Activations, rows * n_out).unwrap();
        be.matmul(&w, &xb, &mut out, rows).expect("matmul");
        download(be, &out, rows * n_out)
    }
    let probe = make();
    let formats = [
        GgmlType::F32,
        GgmlType::Q4K,
        GgmlType::Q5_0,
        GgmlType::Q6K,
        GgmlType::Q8_0,
    ];
    let mut rng = seeded(3);
    for full in matrices(&formats) {
        for m in [full.rows(7), full] {
            // On gpu_int8, 17 rows take the int8 matrix-core kernel (formats it reads, on
            // matrix cores) or the vendor GEMM, 40 and 70 the vendor GEMM.
            for rows in MATMUL_ROWS {
                let x = uniform_vec(&mut rng, rows * m.dims[0], -1.0, 1.0);
                let want = go(&mut exact(), &m, &x, rows);
                let got = go(&mut make(), &m, &x, rows);
                let tol = matmul_tolerance(&probe, rows, Some(m.format));
                check(
                    &format!(
                        "matmul {} {} {:?} x {rows} rows",
                        m.name,
                        m.format.name(),
                        m.dims
                    ),
                    &got,
                    &want,
                    tol,
                );
            }
        }
    }
}

test_device!(dense_rows_of_any_length);
/// F16 and BF16 matrices whose rows are not whole blocks of 32 (a dense type's block is one
/// element): loaded, multiplied and embedded like any other, against an f64 reference computed
/// from the stored values.
fn dense_rows_of_any_length<B: Backend + 'static>(make: impl Fn() -> B) {
    let mut rng = seeded(12);
    let (n_out, rows) = (5, 3);
    for format in [GgmlType::F16, GgmlType::Bf16] {
        for cols in [7, 301] {
            let values = uniform_vec(&mut rng, n_out * cols, -1.0, 1.0);
            // Each value's stored bytes and the value they hold.
            let encode = |v: f32| -> ([u8; 2], f32) {
                if format == GgmlType::F16 {
                    let h = half::f16::from_f32(v);
                    (h.to_le_bytes(), h.to_f32())
                } else {
                    let h = half::bf16::from_f32(v);
                    (h.to_le_bytes(), h.to_f32())
                }
            };
            let (bytes, stored): (Vec<[u8; 2]>, Vec<f32>) =
                values.iter().map(|&v| encode(v)).unzip();
            let bytes = bytes.concat();
            let what = format!("{format} {n_out} x {cols}");
            let m = Matrix {
                name: what.clone(),
                format,
                dims: [cols, n_out, 1],
                bytes,
            };
            let mut be = make();
            let w = be.load_weight(&m.source()).expect("load a dense matrix");

            let x = uniform_vec(&mut rng, rows * cols, -1.0, 1.0);
            let xb = upload(&mut be, &x);
            let mut out = be.alloc(MemoryTag::Activations, rows * n_out).unwrap();
            be.matmul(&w, &xb, &mut out, rows).expect("matmul");
            let want: Vec<f32> = (0..rows * n_out)
                .map(|i| {
                    let (t, r) = (i / n_out, i % n_out);
                    let dot: f64 = (0..cols)
                        .map(|c| stored[r * cols + c] as f64 * x[t * cols + c] as f64)
                        .sum();
                    dot as f32
                })
                .collect();
            let got = download(&mut be, &out, rows * n_out);
            check(&format!("matmul {what}"), &got, &want, MATMUL_F32_TOL);

            let tokens = [4u32, 0, 2];
            let mut emb = be.alloc(MemoryTag::Activations, 3 * cols).unwrap();
            be.begin_step(&step_at(0, &tokens), &one_table(1))
                .expect("begin_step");
            be.embed(&w, 3, 1.0, &mut emb).expect("embed");
            let want: Vec<f32> = tokens
                .iter()
                .flat_map(|&t| stored[t as usize * cols..(t as usize + 1) * cols].to_vec())
                .collect();
            assert_eq!(download(&mut be, &emb, 3 * cols), want, "embed {what}");
        }
    }
}

test_device!(add_bias);
fn add_bias<B: Backend + 'static>(make: impl Fn() -> B) {
    fn go<C: Backend>(be: &mut C, x: &[f32], b: &[f32], rows: usize) -> Vec<f32> {
        let bias = load_vector(be, "bias", b);
        let mut xb = upload(be, x);
        be.add_bias(&mut xb, &bias, rows).expect("add_bias");
        download(be, &xb, x.len())
    }
    let mut rng = seeded(4);
    for rows in ROWS {
        for dim in WEIGHT_DIMS {
            let x = uniform_vec(&mut rng, (rows + 1) * dim, -2.0, 2.0);
            let b = uniform_vec(&mut rng, dim, -2.0, 2.0);
            let want = go(&mut exact(), &x, &b, rows);
            let got = go(&mut make(), &x, &b, rows);
            check(&format!("add_bias {rows}x{dim}"), &got, &want, F32_TOL);
        }
    }
}

test_device!(gated);
fn gated<B: Backend + 'static>(make: impl Fn() -> B) {
    fn go<C: Backend>(
        be: &mut C,
        g: &[f32],
        u: &[f32],
        len: usize,
        act: GateActivation,
    ) -> Vec<f32> {
        let mut gb = upload(be, g);
        let ub = upload(be, u);
        be.gated(&mut gb, &ub, len, act).expect("gated");
        download(be, &gb, g.len())
    }
    let mut rng = seeded(5);
    for act in [GateActivation::Silu, GateActivation::GeluTanh] {
        for len in [1, 7, 64 * 3, 1152 * 17] {
            let g = uniform_vec(&mut rng, len + 5, -6.0, 6.0);
            let u = uniform_vec(&mut rng, len + 5, -2.0, 2.0);
            let want = go(&mut exact(), &g, &u, len, act);
            let got = go(&mut make(), &g, &u, len, act);
            check(&format!("gated {act:?} {len}"), &got, &want, F32_TOL);
        }
    }
}

test_device!(gated_then_product);
/// A decode step's gated activation and the down projection that reads it (on `gpu_int8` from
/// the 8-bit copy the fused kernel left).
fn gated_then_product<B: Backend + 'static>(make: impl Fn() -> B) {
    fn go<C: Backend>(be: &mut C, g: &[f32], u: &[f32], m: &Matrix, rows: usize) -> Vec<f32> {
        let len = rows * m.dims[0];
        be.begin_step(&step_at(0, &vec![0; rows]), &one_table(1))
            .expect("begin_step");
        let mut gb = upload(be, g);
        let ub = upload(be, u);
        be.gated(&mut gb, &ub, len, GateActivation::Silu)
            .expect("gated");
        let mw = be.load_weight(&m.source()).expect("load the matrix");
        let mut prod = be.alloc(MemoryTag::Activations, rows * m.dims[1]).unwrap();
        be.matmul(&mw, &gb, &mut prod, rows).expect("matmul");
        let mut all = download(be, &gb, len);
        all.extend(download(be, &prod, rows * m.dims[1]));
        all
    }
    let probe = make();
    let mut rng = seeded(22);
    for m in matrices(&[GgmlType::Q6K, GgmlType::Q5_0]) {
        for rows in [1, 3] {
            let len = rows * m.dims[0];
            let g = uniform_vec(&mut rng, len, -3.0, 3.0);
            let u = uniform_vec(&mut rng, len, -2.0, 2.0);
            let want = go(&mut exact(), &g, &u, &m, rows);
            let got = go(&mut make(), &g, &u, &m, rows);
            let what = format!("gated then {} x {rows} rows", m.name);
            check(
                &format!("{what}: gated"),
                &got[..len],
                &want[..len],
                F32_TOL,
            );
            let tol = matmul_tolerance(&probe, rows, Some(m.format));
            check(&format!("{what}: product"), &got[len..], &want[len..], tol);
        }
    }
}

/// What a model does after loading and at each step, for one MoE layer's op tests: the GPU
/// takes its MoE scratch (and for long chunks the grouped prefill's buffers), then a step of
/// `shape.rows` rows of one sequence begins.
fn begin_moe_step<C: Backend>(be: &mut C, shape: &MoeShape) {
    let bounds = StepBounds {
        max_tokens: shape.rows,
        decode_attention: Vec::new(),
        moe: Some(*shape),
        table_entries: 0,
    };
    be.reserve_workspace(&bounds, &[]).expect("reserve");
    be.begin_step(&step_at(0, &vec![0; shape.rows]), &one_table(1))
        .expect("begin_step");
}

test_device!(moe);
/// The whole mixture-of-experts FFN over the tiny Qwen3-MoE model's first layer experts, for a
/// decode step and a short prefill: routing, the selected experts and the weighted sum.
fn moe<B: Backend + 'static>(make: impl Fn() -> B) {
    let file = preset_file(Preset::TinyQwen3Moe);
    let stack = |suffix: &str| -> Matrix {
        let name = format!("blk.0.ffn_{suffix}_exps.weight");
        let t = file
            .tensors()
            .iter()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("the tiny MoE model has no {name}"));
        let d: Vec<usize> = t.dims.iter().map(|&d| d as usize).collect();
        Matrix {
            name,
            format: t.ggml_type,
            dims: [d[0], d[1], d[2]],
            bytes: file.tensor_data(t).to_vec(),
        }
    };
    let (gate, up, down) = (stack("gate"), stack("up"), stack("down"));
    let [n_embd, n_ff, n_expert] = gate.dims;
    fn go<C: Backend>(
        be: &mut C,
        w: [&Matrix; 3],
        x: &[f32],
        logits: &[f32],
        shape: &MoeShape,
    ) -> Vec<f32> {
        let [g, u, d] = w.map(|m| be.load_weight(&m.source()).expect("load experts"));
        begin_moe_step(be, shape);
        let xb = upload(be, x);
        let lb = upload(be, logits);
        let mut out = be
            .alloc(MemoryTag::Activations, shape.rows * shape.n_embd)
            .unwrap();
        be.moe(&xb, &lb, &g, &u, &d, &mut out, shape).expect("moe");
        download(be, &out, shape.rows * shape.n_embd)
    }
    let probe = make();
    let formats = [gate.format, up.format, down.format];
    let gpu = (&probe as &dyn Any).downcast_ref::<GpuBackend>();
    // 40 rows run grouped by expert (gpu_int8): in place on the int8 matrix-core kernel where
    // it takes the formats, and on the vendor GEMM, which the second arm asks for.
    let in_place = gpu.is_some_and(|g| g.moe_grouped_in_place(formats));
    let mut rng = seeded(23);
    for rows in [1, 3, 40] {
        let shape = MoeShape {
            rows,
            n_embd,
            n_ff,
            n_expert,
            k: 4.min(n_expert),
            act: GateActivation::Silu,
        };
        let x = uniform_vec(&mut rng, rows * n_embd, -2.0, 2.0);
        let logits = uniform_vec(&mut rng, rows * n_expert, -3.0, 3.0);
        let want = go(&mut exact(), [&gate, &up, &down], &x, &logits, &shape);
        let got = go(&mut make(), [&gate, &up, &down], &x, &logits, &shape);
        let what = format!("moe {} x {rows} rows", gate.format.name());
        let grouped = rows >= MOE_GROUPED_MIN_ROWS;
        let tol = match matmul_tolerance(&probe, rows, None) {
            MATMUL_F16_TOL if grouped && in_place => MOE_INT8_TOL,
            MATMUL_F16_TOL => MOE_F16_TOL,
            tol => tol,
        };
        check(&what, &got, &want, tol);
        if grouped && in_place {
            // The grouped kernel rounds as the decode kernels do, so the same rows run as
            // decode steps of 8 agree with it far closer than either with the exact path: a
            // row sent to the wrong expert, or a tile left out, would not.
            let mut by_steps = Vec::new();
            for chunk in 0..rows.div_ceil(8) {
                let (r0, r1) = (chunk * 8, (chunk * 8 + 8).min(rows));
                let step = MoeShape {
                    rows: r1 - r0,
                    ..shape
                };
                let xs = &x[r0 * n_embd..r1 * n_embd];
                let ls = &logits[r0 * n_expert..r1 * n_expert];
                by_steps.extend(go(&mut make(), [&gate, &up, &down], xs, ls, &step));
            }
            check(
                &format!("{what}: grouped against decode steps of 8"),
                &got,
                &by_steps,
                MATMUL_INT8_TOL,
            );
        }
        let int8_gpu = gpu.is_some_and(|g| g.matvec_path() == MatvecPath::Int8);
        if grouped && in_place && int8_gpu {
            // The index built on the device: the same slots per expert in another order, and
            // each slot's row is its own, so the output is the host-built index's.
            let mut on_device = make();
            if let Some(g) = (&mut on_device as &mut dyn Any).downcast_mut::<GpuBackend>() {
                g.set_moe_index(MoeIndex::Device);
            }
            let other = go(&mut on_device, [&gate, &up, &down], &x, &logits, &shape);
            check(
                &format!("{what}: index built on the device"),
                &other,
                &got,
                F32_TOL,
            );
        }
        if grouped && in_place && int8_gpu {
            let mut vendor = make();
            if let Some(g) = (&mut vendor as &mut dyn Any).downcast_mut::<GpuBackend>() {
                g.set_moe_grouped(MoeGrouped::Vendor);
            }
            let got = go(&mut vendor, [&gate, &up, &down], &x, &logits, &shape);
            check(&format!("{what} (vendor GEMM)"), &got, &want, MOE_F16_TOL);
        }
    }
    // Whether the in-place arm ran is the backend's answer, printed for the log.
    eprintln!("moe: grouped prefill in place on the int8 kernel: {in_place} ({formats:?})");
}

test_device!(rope_qk_then_store_kv);
/// A layer's fused position work: queries and keys rotated together, then keys and values
/// stored together into ring caches; every buffer is compared.
fn rope_qk_then_store_kv<B: Backend + 'static>(make: impl Fn() -> B) {
    const HD: usize = 64;
    let (n_head, n_kv) = (4, 2);
    let (kd, vd) = (n_kv * HD, n_kv * HD);
    let rope = Rope {
        neox: true,
        freq_base: 10_000.0,
        position_scale: 1.0,
        n_rot: HD,
    };
    #[allow(clippy::too_many_arguments)]
    fn go<C: Backend>(
        be: &mut C,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        rows: usize,
        pos0: usize,
        slots: usize,
        rope: &Rope,
    ) -> Vec<f32> {
        let (n_head, n_kv, kd) = (4, 2, 2 * HD);
        be.begin_step(&step_at(pos0, &vec![0; rows]), &one_table(slots))
            .expect("begin_step");
        let mut qb = upload(be, q);
        let mut kb = upload(be, k);
        let vb = upload(be, v);
        let mut kc = be.alloc(MemoryTag::KvCache, slots * kd).unwrap();
        let mut vc = be.alloc(MemoryTag::KvCache, slots * kd).unwrap();
        be.rope_qk(&mut qb, &mut kb, rows, n_head, n_kv, HD, rope, None)
            .expect("rope_qk");
        be.store_kv(&kb, &vb, &mut kc, &mut vc, rows, kd, kd, pool_layer(slots))
            .expect("store_kv");
        let mut all = download(be, &qb, q.len());
        all.extend(download(be, &kb, k.len()));
        all.extend(download(be, &kc, slots * kd));
        all.extend(download(be, &vc, slots * kd));
        all
    }
    let mut rng = seeded(24);
    for (rows, pos0, slots) in [(1, 0, 8), (3, 11, 8), (17, 40, 64)] {
        let q = uniform_vec(&mut rng, rows * n_head * HD, -2.0, 2.0);
        let k = uniform_vec(&mut rng, rows * kd, -2.0, 2.0);
        let v = uniform_vec(&mut rng, rows * vd, -2.0, 2.0);
        let want = go(&mut exact(), &q, &k, &v, rows, pos0, slots, &rope);
        let mut be = make();
        let tol = if stores_f16_kv(&be) {
            KV_F16_TOL
        } else {
            F32_TOL
        };
        let got = go(&mut be, &q, &k, &v, rows, pos0, slots, &rope);
        check(
            &format!("rope_qk + store_kv {rows} rows at {pos0}, {slots} slots"),
            &got,
            &want,
            tol,
        );
    }
}

test_device!(matmul_pair);
/// Two products over one input (gate and up; Q and K): same format (one launch on the GPU's
/// int8 path) and mixed formats (two launches).
fn matmul_pair<B: Backend + 'static>(make: impl Fn() -> B) {
    fn go<C: Backend>(be: &mut C, m: &Matrix, m2: &Matrix, x: &[f32], rows: usize) -> Vec<f32> {
        let w = be.load_weight(&m.source()).expect("load");
        let w2 = be.load_weight(&m2.source()).expect("load");
        let xb = upload(be, x);
        let mut out = be.alloc(MemoryTag::Activations, rows * m.dims[1]).unwrap();
        let mut out2 = be.alloc(MemoryTag::Activations, rows * m2.dims[1]).unwrap();
        be.matmul_pair(&w, &w2, &xb, &mut out, &mut out2, rows)
            .expect("matmul_pair");
        let mut all = download(be, &out, rows * m.dims[1]);
        all.extend(download(be, &out2, rows * m2.dims[1]));
        all
    }
    let probe = make();
    let mut rng = seeded(25);
    let found = matrices(&[GgmlType::Q4K, GgmlType::Q8_0, GgmlType::Q5_0]);
    for m in &found {
        let partner = found
            .iter()
            .find(|o| o.format != m.format && o.dims[0] == m.dims[0]);
        let pairs = [Some(m.rows(7)), partner.cloned()];
        for m2 in pairs.into_iter().flatten() {
            for rows in [1, 3] {
                let x = uniform_vec(&mut rng, rows * m.dims[0], -1.0, 1.0);
                let want = go(&mut exact(), m, &m2, &x, rows);
                let got = go(&mut make(), m, &m2, &x, rows);
                let what = format!("matmul_pair {} with {} x {rows} rows", m.name, m2.name);
                check(
                    &what,
                    &got,
                    &want,
                    matmul_tolerance(&probe, rows, Some(m.format)),
                );
            }
        }
    }
}

test_device!(add);
fn add<B: Backend + 'static>(make: impl Fn() -> B) {
    fn go<C: Backend>(be: &mut C, x: &[f32], y: &[f32], len: usize) -> Vec<f32> {
        let mut xb = upload(be, x);
        let yb = upload(be, y);
        be.add(&mut xb, &yb, len).expect("add");
        download(be, &xb, x.len())
    }
    let mut rng = seeded(6);
    for len in [1, 7, 1000, 1152 * 17] {
        let x = uniform_vec(&mut rng, len + 3, -4.0, 4.0);
        let y = uniform_vec(&mut rng, len + 3, -4.0, 4.0);
        let want = go(&mut exact(), &x, &y, len);
        let got = go(&mut make(), &x, &y, len);
        check(&format!("add {len}"), &got, &want, F32_TOL);
    }
}

test_device!(copy_row);
fn copy_row<B: Backend + 'static>(make: impl Fn() -> B) {
    fn go<C: Backend>(
        be: &mut C,
        src: &[f32],
        dst: &[f32],
        rows: (usize, usize),
        dim: usize,
    ) -> Vec<f32> {
        let sb = upload(be, src);
        let mut db = upload(be, dst);
        be.copy_row(&sb, rows.0, &mut db, rows.1, dim)
            .expect("copy_row");
        download(be, &db, dst.len())
    }
    let mut rng = seeded(7);
    for dim in DIMS {
        for rows in [(0, 0), (3, 1), (4, 3)] {
            let src = uniform_vec(&mut rng, 5 * dim, -3.0, 3.0);
            let dst = uniform_vec(&mut rng, 4 * dim, -3.0, 3.0);
            let want = go(&mut exact(), &src, &dst, rows, dim);
            assert_eq!(&want[rows.1 * dim..][..dim], &src[rows.0 * dim..][..dim]);
            let got = go(&mut make(), &src, &dst, rows, dim);
            assert_eq!(max_abs_diff(&got, &want), 0.0, "copy_row {rows:?} of {dim}");
        }
    }
}

test_device!(zero);
fn zero<B: Backend + 'static>(make: impl Fn() -> B) {
    fn go<C: Backend>(be: &mut C, x: &[f32], len: usize) -> Vec<f32> {
        let mut xb = upload(be, x);
        be.zero(&mut xb, len).expect("zero");
        download(be, &xb, x.len())
    }
    let mut rng = seeded(8);
    for len in [1, 7, 1000, 1152 * 17] {
        let x = uniform_vec(&mut rng, len + 9, -3.0, 3.0);
        let want = go(&mut exact(), &x, len);
        assert!(want[..len].iter().all(|&v| v == 0.0));
        assert_eq!(want[len..], x[len..]);
        let got = go(&mut make(), &x, len);
        assert_eq!(max_abs_diff(&got, &want), 0.0, "zero {len}");
    }
}

test_device!(argmax);
fn argmax<B: Backend + 'static>(make: impl Fn() -> B) {
    fn go<C: Backend>(be: &mut C, x: &[f32], row: usize, n: usize) -> u32 {
        let xb = upload(be, x);
        be.argmax(&xb, row, n).expect("argmax")
    }
    let mut rng = seeded(9);
    let mut cases: Vec<(Vec<f32>, usize, usize, String)> = Vec::new();
    for n in [1, 7, 1000, 32_000, 151_936] {
        let rows = 3;
        let mut x = uniform_vec(&mut rng, rows * n, -5.0, 5.0);
        cases.push((x.clone(), 1, n, format!("random n={n}")));
        // Ties: the first index wins, even across the GPU's reduction blocks.
        if n > 1 {
            let (a, b) = (n / 3 + 1, n - 1);
            x[2 * n + a] = 9.0;
            x[2 * n + b] = 9.0;
            cases.push((x.clone(), 2, n, format!("tie {a}/{b} of {n}")));
            x[2 * n] = 9.0;
            cases.push((x.clone(), 2, n, format!("tie 0/{a}/{b} of {n}")));
        }
        // All negative, all equal.
        let neg: Vec<f32> = x.iter().map(|v| -v.abs() - 1.0).collect();
        cases.push((neg, 0, n, format!("negative n={n}")));
        cases.push((vec![-2.5; n], 0, n, format!("all equal n={n}")));
    }
    for (x, row, n, what) in cases {
        let want = rocm_kernels::reference::sampling::argmax(&x[row * n..][..n]) as u32;
        assert_eq!(go(&mut exact(), &x, row, n), want, "cpu exact: {what}");
        assert_eq!(go(&mut make(), &x, row, n), want, "argmax {what}");
    }
}

test_device!(argmax_rows);
fn argmax_rows<B: Backend + 'static>(make: impl Fn() -> B) {
    let mut rng = seeded(29);
    let mut blocks: Vec<(usize, Vec<Vec<f32>>)> = Vec::new();
    // An odd row length (no vector loads), a few values past a 1024-thread block's stride.
    let n = 1001;
    let mut rows = vec![uniform_vec(&mut rng, n, -5.0, 5.0)];
    // Ties a block's stride apart and at the end: the first index wins.
    let mut tie = uniform_vec(&mut rng, n, -5.0, 5.0);
    for i in [100, 612, 1000] {
        tie[i] = 9.0;
    }
    rows.push(tie);
    // NaN and +inf-free: NaN at index 0 and at the largest value's neighbours never wins.
    let mut nan = uniform_vec(&mut rng, n, -5.0, 5.0);
    nan[0] = f32::NAN;
    nan[700] = f32::NAN;
    nan[702] = f32::NAN;
    nan[701] = 8.0;
    rows.push(nan);
    // -inf never wins, even over a huge negative value.
    let mut minus_inf = vec![f32::NEG_INFINITY; n];
    minus_inf[500] = -1e30;
    rows.push(minus_inf);
    // -0 equals +0: the first of them wins, whichever sign it has.
    let mut zeros = vec![-1.0f32; n];
    zeros[200] = -0.0;
    zeros[300] = 0.0;
    rows.push(zeros);
    let mut zeros = vec![-1.0f32; n];
    zeros[200] = 0.0;
    zeros[300] = -0.0;
    rows.push(zeros);
    // No winner: 0.
    rows.push(vec![f32::NAN; n]);
    rows.push(vec![f32::NEG_INFINITY; n]);
    blocks.push((n, rows));
    // A real vocabulary's length.
    let n = 150_000;
    let mut rows = vec![uniform_vec(&mut rng, n, -12.0, 18.0)];
    let mut tie = uniform_vec(&mut rng, n, -1.0, 1.0);
    for i in [70_001, 140_000, 149_999] {
        tie[i] = 7.0;
    }
    rows.push(tie);
    let mut nan = uniform_vec(&mut rng, n, -1.0, 1.0);
    nan[149_999] = 3.0;
    nan[149_998] = f32::NAN;
    nan[1] = f32::NAN;
    rows.push(nan);
    rows.push(vec![f32::NAN; n]);
    blocks.push((n, rows));

    for (n, rows) in &blocks {
        let (n, n_rows) = (*n, rows.len());
        let flat = rows.concat();
        let want: Vec<u32> = rows
            .iter()
            .map(|r| rocm_kernels::reference::sampling::argmax(r) as u32)
            .collect();
        // The CPU's per-row argmax is the reference's.
        let mut cpu = exact();
        let cb = upload(&mut cpu, &flat);
        let cpu_rows: Vec<u32> = (0..n_rows)
            .map(|row| cpu.argmax(&cb, row, n).expect("cpu argmax"))
            .collect();
        assert_eq!(cpu_rows, want, "cpu exact argmax of rows of {n}");

        let mut be = make();
        let xb = upload(&mut be, &flat);
        let single: Vec<u32> = (0..n_rows)
            .map(|row| be.argmax(&xb, row, n).expect("argmax"))
            .collect();
        assert_eq!(single, want, "single-row argmax of rows of {n}");
        assert_eq!(
            be.argmax_rows(&xb, 0, n_rows, n).expect("argmax_rows"),
            want,
            "argmax_rows of {n_rows} rows of {n}"
        );
        // A run that starts past row 0, and one of a single row.
        assert_eq!(
            be.argmax_rows(&xb, 1, n_rows - 1, n).expect("argmax_rows"),
            want[1..],
            "argmax_rows of rows 1.. of {n}"
        );
        assert_eq!(
            be.argmax_rows(&xb, 2, 1, n).expect("argmax_rows"),
            want[2..3],
            "argmax_rows of row 2 of {n}"
        );
        assert_eq!(
            be.argmax_rows(&xb, 0, 0, n).expect("argmax_rows"),
            Vec::<u32>::new(),
            "argmax_rows of no rows"
        );
        assert!(
            be.argmax_rows(&xb, 1, n_rows, n).is_err(),
            "argmax_rows past the buffer's rows of {n}"
        );
    }

    // More rows than the GPU's step block holds a token for: an error, not a panic.
    let mut be = make();
    if (&be as &dyn Any).is::<GpuBackend>() {
        let (n, n_rows) = (3, 65);
        let xb = upload(&mut be, &vec![1.0; n * n_rows]);
        assert!(
            be.argmax_rows(&xb, 0, n_rows, n).is_err(),
            "argmax_rows of {n_rows} rows on a backend sized for 64"
        );
    }
}

test_device!(embed);
fn embed<B: Backend + 'static>(make: impl Fn() -> B) {
    // `lookup_only` marks an untied embedding, which the GPU backend keeps in pinned host
    // memory by default (`HIPDECODE_GPU_EMBED_TABLE=host`) and reads in place.
    fn go<C: Backend>(
        be: &mut C,
        m: &Matrix,
        tokens: &[u32],
        scale: f32,
        lookup_only: bool,
    ) -> Vec<f32>
    where
        C::Weight: 'static,
    {
        let source = WeightSource {
            lookup_only,
            ..m.source()
        };
        let table = be.load_weight(&source).expect("load the table");
        if let Some(w) = (&table as &dyn Any).downcast_ref::<GpuWeight>() {
            let on_host = w.read_path() == ReadPath::ZeroCopy;
            assert_eq!(on_host, lookup_only, "{}: where the table lives", m.name);
        }
        let n = tokens.len();
        let mut out = be.alloc(MemoryTag::Activations, n * m.dims[0]).unwrap();
        be.begin_step(&step_at(5, tokens), &one_table(1))
            .expect("begin_step");
        be.embed(&table, n, scale, &mut out).expect("embed");
        download(be, &out, n * m.dims[0])
    }
    let mut rng = seeded(10);
    let (cols, vocab) = (96, 51);
    let mut tables = vec![Matrix {
        name: "random f32 table".into(),
        format: GgmlType::F32,
        dims: [cols, vocab, 1],
        bytes: f32_bytes(&uniform_vec(&mut rng, cols * vocab, -1.0, 1.0)),
    }];
    let file = preset_file(Preset::TinyLlama);
    let t = file
        .tensors()
        .iter()
        .find(|t| t.name == "token_embd.weight")
        .expect("token_embd");
    tables.push(Matrix {
        name: t.name.clone(),
        format: t.ggml_type,
        dims: [t.dims[0] as usize, t.dims[1] as usize, 1],
        bytes: file.tensor_data(t).to_vec(),
    });
    for m in &tables {
        let vocab = m.dims[1] as u32;
        for n in ROWS {
            let tokens: Vec<u32> = (0..n)
                .map(|i| match i {
                    0 => vocab - 1,
                    1 => 0,
                    _ => rng.random_range(0..vocab),
                })
                .collect();
            for (scale, lookup_only) in [(1.0, false), ((m.dims[0] as f32).sqrt(), true)] {
                let want = go(&mut exact(), m, &tokens, scale, false);
                let got = go(&mut make(), m, &tokens, scale, lookup_only);
                check(
                    &format!(
                        "embed {} {} x{scale} (lookup only: {lookup_only})",
                        m.name, n
                    ),
                    &got,
                    &want,
                    F32_TOL,
                );
            }
        }
    }
}

test_device!(rope);
fn rope<B: Backend + 'static>(make: impl Fn() -> B) {
    struct Case {
        pos0: usize,
        rows: usize,
        n_heads: usize,
        head_dim: usize,
        rope: Rope,
        factors: Option<Vec<f32>>,
    }
    fn go<C: Backend>(be: &mut C, x: &[f32], c: &Case) -> Vec<f32> {
        let factors = c.factors.as_ref().map(|f| load_vector(be, "rope_freqs", f));
        let mut xb = upload(be, x);
        be.begin_step(&step_at(c.pos0, &vec![0; c.rows]), &one_table(1))
            .expect("begin_step");
        be.rope(
            &mut xb,
            c.rows,
            c.n_heads,
            c.head_dim,
            &c.rope,
            factors.as_ref(),
        )
        .expect("rope");
        download(be, &xb, x.len())
    }
    let mut rng = seeded(11);
    let mut cases = Vec::new();
    for neox in [false, true] {
        for (head_dim, n_rot) in [(64, 64), (64, 32), (128, 128), (256, 64)] {
            for (pos0, rows) in [(0, 1), (7, 3), (1000, 17)] {
                cases.push(Case {
                    pos0,
                    rows,
                    n_heads: 3,
                    head_dim,
                    rope: Rope {
                        neox,
                        freq_base: if neox { 1e6 } else { 10_000.0 },
                        position_scale: if head_dim == 128 { 8.0 } else { 1.0 },
                        n_rot,
                    },
                    factors: (head_dim == 128)
                        .then(|| (0..n_rot / 2).map(|_| rng.random_range(1.0..8.0)).collect()),
                });
            }
        }
    }
    for c in &cases {
        let x = uniform_vec(&mut rng, (c.rows + 1) * c.n_heads * c.head_dim, -2.0, 2.0);
        let want = go(&mut exact(), &x, c);
        let got = go(&mut make(), &x, c);
        check(
            &format!(
                "rope {:?} pos {} x{} heads {} x {}",
                c.rope, c.pos0, c.rows, c.n_heads, c.head_dim
            ),
            &got,
            &want,
            F32_TOL,
        );
    }
}

test_device!(attention);
/// `store_rows` into the K and V caches over several steps (ring caches smaller than the
/// positions for sliding windows), then `attention` of the last step's queries; both caches and
/// the output are compared.
fn attention<B: Backend + 'static>(make: impl Fn() -> B) {
    const N_HEAD: usize = 4;
    const N_HEAD_KV: usize = 2;
    const HEAD_DIM: usize = 64;
    const KD: usize = N_HEAD_KV * HEAD_DIM;
    const QD: usize = N_HEAD * HEAD_DIM;
    /// The keys, values and queries of every position (a step's rows are contiguous).
    struct Inputs {
        k: Vec<f32>,
        v: Vec<f32>,
        q: Vec<f32>,
    }
    /// `prefill` makes the step under test a prompt chunk even of one row (the prefill
    /// kernels), else a one-row step is a decode step.
    fn go<C: Backend>(
        be: &mut C,
        inp: &Inputs,
        shape: &Attention,
        pos0: usize,
        prefill: bool,
    ) -> Vec<f32> {
        let n = shape.n_tokens;
        let slots = shape.slots;
        let mut k_cache = be.alloc(MemoryTag::KvCache, slots * KD).unwrap();
        let mut v_cache = be.alloc(MemoryTag::KvCache, slots * KD).unwrap();
        let mut kb = be.alloc(MemoryTag::Activations, n * KD).unwrap();
        let mut vb = be.alloc(MemoryTag::Activations, n * KD).unwrap();
        let mut qb = be.alloc(MemoryTag::Activations, n * QD).unwrap();
        let mut out = be.alloc(MemoryTag::Activations, n * QD).unwrap();
        // Earlier steps in chunks of at most n rows, then the step under test.
        let mut p = 0;
        while p <= pos0 {
            let rows = if p == pos0 { n } else { n.min(pos0 - p) };
            let batch = if p == pos0 && prefill {
                StepBatch::prefill(0, p, &vec![0; rows], RowOutput::Nothing)
            } else {
                step_at(p, &vec![0; rows])
            };
            be.begin_step(&batch, &one_table(slots))
                .expect("begin_step");
            be.write(&mut kb, 0, &inp.k[p * KD..][..rows * KD]).unwrap();
            be.write(&mut vb, 0, &inp.v[p * KD..][..rows * KD]).unwrap();
            be.store_rows(&kb, &mut k_cache, rows, KD, pool_layer(slots))
                .expect("store k");
            be.store_rows(&vb, &mut v_cache, rows, KD, pool_layer(slots))
                .expect("store v");
            if p == pos0 {
                break;
            }
            p += rows;
        }
        be.write(&mut qb, 0, &inp.q[pos0 * QD..][..n * QD]).unwrap();
        be.attention(&qb, &k_cache, &v_cache, &mut out, shape, KvGroup::POOL)
            .expect("attention");
        let mut all = download(be, &out, n * QD);
        all.extend(download(be, &k_cache, slots * KD));
        all.extend(download(be, &v_cache, slots * KD));
        all
    }
    let mut rng = seeded(12);
    let max_pos = 64;
    let inp = Inputs {
        k: uniform_vec(&mut rng, max_pos * KD, -2.0, 2.0),
        v: uniform_vec(&mut rng, max_pos * KD, -2.0, 2.0),
        q: uniform_vec(&mut rng, max_pos * QD, -2.0, 2.0),
    };
    for window in [None, Some(8), Some(5)] {
        for n in ROWS {
            for pos0 in [0, 11, 40] {
                let slots = match window {
                    // A ring cache: position p in slot p % slots, far fewer slots than positions.
                    Some(w) => w + n - 1,
                    None => max_pos,
                };
                let shape = Attention {
                    n_tokens: n,
                    n_head: N_HEAD,
                    n_head_kv: N_HEAD_KV,
                    head_dim_k: HEAD_DIM,
                    head_dim_v: HEAD_DIM,
                    scale: 1.0 / (HEAD_DIM as f32).sqrt(),
                    softcap: None,
                    window,
                    slots,
                };
                // A one-row step runs as a decode step and as a one-token prompt chunk.
                for prefill in [false, true].into_iter().filter(|&p| !p || n == 1) {
                    let want = go(&mut exact(), &inp, &shape, pos0, prefill);
                    let mut be = make();
                    let tol = if stores_f16_kv(&be) {
                        KV_F16_TOL
                    } else {
                        F32_TOL
                    };
                    let got = go(&mut be, &inp, &shape, pos0, prefill);
                    let phase = if prefill { "prefill" } else { "step" };
                    check(
                        &format!(
                            "attention window {window:?} {n} tokens at {pos0}, {slots} slots \
                             ({phase})"
                        ),
                        &got,
                        &want,
                        tol,
                    );
                }
            }
        }
    }
}
