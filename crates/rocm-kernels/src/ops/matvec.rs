//! Matrix-vector products over quantized weights, for decode (a few tokens per launch).
//!
//! `out[t][r] = sum_c W[r][c] * x[t][c]` with `W` a [`QuantMatrix`]: raw GGUF blocks in device
//! memory, never a dequantized copy. Activations and outputs are f32, row-major; `x` is
//! `[n_tokens][cols]`, `out` is `[n_tokens][rows]`.
//!
//! The kernel (`kernels/matvec.hip`) gives each output row one warp, whose lanes take runs of
//! eight columns (quantized formats) or single columns (dense formats) and sum with
//! `warp_sum`; each launch reads the weights once for up to [`MAX_TOKENS`] tokens, and
//! [`matvec`] launches once per group of [`MAX_TOKENS`] tokens. Accumulation is f32.
//!
//! Formats: [`WEIGHT_FORMATS`] (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K,
//! Q6_K, Q2_K, Q3_K, IQ4_NL, IQ4_XS); other formats are a [`KernelError::UnsupportedFormat`].

use crate::error::{check_shape, KernelError, Result};
use crate::kernels::Kernels;
use crate::source::KernelModule;
use crate::view::{DeviceSlice, DeviceSliceMut};
use gguf_loader::GgmlType;
use hip_ffi::{LaunchConfig, Stream};

const OP: &str = "matvec";

/// The weight formats the quantized-weight kernels (matvec, matmul, embed, MoE) read, in the
/// order of each module's per-format entry points (`FOR_EACH_WEIGHT_FORMAT` in `quant.h`).
pub const WEIGHT_FORMATS: [GgmlType; 15] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Bf16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::Iq4Nl,
    GgmlType::Iq4Xs,
];

/// [`WEIGHT_FORMATS`]' names, for messages: "F32, F16, BF16, Q4_0, ...".
pub fn weight_format_names() -> String {
    WEIGHT_FORMATS.map(GgmlType::name).join(", ")
}

/// Most tokens one matvec launch takes (the kernel keeps one accumulator per token).
pub const MAX_TOKENS: usize = 8;

/// Threads per matvec block: a multiple of both wave sizes (8 rows per block on wave32, 4 on
/// wave64).
pub(crate) const ROW_BLOCK_THREADS: u32 = 256;

/// The entry point of `module` for `format`: the module's per-format entry points start at
/// index `first` of [`KernelModule::entry_points`] and follow [`WEIGHT_FORMATS`].
pub(crate) fn format_entry(
    module: KernelModule,
    first: usize,
    op: &'static str,
    format: GgmlType,
) -> Result<&'static str> {
    let unsupported = || KernelError::UnsupportedFormat {
        op,
        format,
        supported: weight_format_names(),
    };
    let index = WEIGHT_FORMATS
        .iter()
        .position(|&f| f == format)
        .ok_or_else(unsupported)?;
    module
        .entry_points()
        .get(first + index)
        .copied()
        .ok_or_else(unsupported)
}

/// How many warps share one row: enough warps in the grid to keep every multiprocessor's loads
/// in flight (about 32 per multiprocessor), but never more than the row has lane items for
/// (two per lane at least).
pub(crate) fn warps_per_row(
    rows: usize,
    items_per_row: usize,
    wave: u32,
    multiprocessors: u32,
    block_threads: u32,
) -> u32 {
    let warps_per_block = block_threads / wave;
    let wanted = (multiprocessors.max(1) as usize) * 32;
    let mut wpr = 1u32;
    while wpr < warps_per_block
        && rows * (wpr as usize) < wanted
        && items_per_row >= (2 * wpr * wave) as usize
    {
        wpr *= 2;
    }
    wpr
}

/// Bytes of a `rows` x `cols` matrix of `format`, or `None` when `cols` is not a whole number
/// of blocks or the size overflows.
pub fn matrix_bytes(format: GgmlType, rows: usize, cols: usize) -> Option<usize> {
    let row = usize::try_from(format.bytes_for(cols as u64)?).ok()?;
    row.checked_mul(rows)
}

/// Checks a matrix shape against its bytes; shared by [`QuantMatrix`] and the CPU reference.
pub fn check_matrix(
    op: &'static str,
    format: GgmlType,
    rows: usize,
    cols: usize,
    bytes: usize,
) -> Result<()> {
    check_shape(rows > 0 && cols > 0, op, || {
        format!("a {rows} x {cols} matrix has no values")
    })?;
    check_shape(cols.is_multiple_of(format.block_size()), op, || {
        format!(
            "{cols} columns are not a whole number of {format} blocks ({} values each)",
            format.block_size()
        )
    })?;
    let want = matrix_bytes(format, rows, cols)
        .ok_or_else(|| shape_error(op, format!("a {rows} x {cols} {format} matrix overflows")))?;
    check_shape(bytes == want, op, || {
        format!("a {rows} x {cols} {format} matrix is {want} bytes, the data is {bytes}")
    })
}

pub(crate) fn shape_error(op: &'static str, message: String) -> KernelError {
    KernelError::Shape { op, message }
}

/// A weight matrix of `rows` (outputs) x `cols` (inputs) in device memory, stored as raw GGUF
/// data of `format` (rows are whole blocks, one after the other).
#[derive(Clone, Copy, Debug)]
pub struct QuantMatrix {
    data: DeviceSlice<u8>,
    format: GgmlType,
    rows: usize,
    cols: usize,
}

impl QuantMatrix {
    /// Describes `data` as a `rows` x `cols` matrix of `format`.
    ///
    /// Errors when the format has no kernel ([`WEIGHT_FORMATS`]), when `cols` is not a whole
    /// number of blocks, when `data` is not exactly the matrix's bytes, when a dimension is 0
    /// or above `u32::MAX` (the kernels' index type), or when the address is not aligned for
    /// the format's scalar fields (4 bytes for F32, 2 for the others; device allocations are).
    pub fn new(
        data: DeviceSlice<u8>,
        format: GgmlType,
        rows: usize,
        cols: usize,
    ) -> Result<QuantMatrix> {
        const OP: &str = "QuantMatrix";
        if !WEIGHT_FORMATS.contains(&format) {
            return Err(KernelError::UnsupportedFormat {
                op: OP,
                format,
                supported: weight_format_names(),
            });
        }
        check_shape(
            rows <= u32::MAX as usize && cols <= u32::MAX as usize,
            OP,
            || format!("a {rows} x {cols} matrix: each dimension must fit in 32 bits"),
        )?;
        check_matrix(OP, format, rows, cols, data.len())?;
        let align = if format == GgmlType::F32 { 4 } else { 2 };
        check_shape(data.addr().is_multiple_of(align), OP, || {
            format!(
                "{format} data at {:#x} is not {align}-byte aligned",
                data.addr()
            )
        })?;
        Ok(QuantMatrix {
            data,
            format,
            rows,
            cols,
        })
    }

    /// The raw blocks.
    pub fn data(&self) -> DeviceSlice<u8> {
        self.data
    }

    /// The storage format.
    pub fn format(&self) -> GgmlType {
        self.format
    }

    /// Rows (outputs).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns (inputs).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.data.len() / self.rows
    }
}

/// Checks `x` (`[n_tokens][cols]`) and `out` (`[n_tokens][rows]`) against `w`.
pub(crate) fn check_io(
    op: &'static str,
    w: &QuantMatrix,
    x_len: usize,
    out_len: usize,
    n_tokens: usize,
) -> Result<()> {
    let need_x = n_tokens.checked_mul(w.cols);
    check_shape(need_x.is_some_and(|n| x_len >= n), op, || {
        format!(
            "x holds {x_len} values; {n_tokens} tokens of {} need {need_x:?}",
            w.cols
        )
    })?;
    let need_out = n_tokens.checked_mul(w.rows);
    check_shape(need_out.is_some_and(|n| out_len >= n), op, || {
        format!(
            "out holds {out_len} values; {n_tokens} tokens of {} need {need_out:?}",
            w.rows
        )
    })
}

/// The signature [`matvec`], [`crate::ops::matmul::matmul`] and
/// [`crate::ops::matmul_mma::matmul_mma`] share: `out = w x` for `n_tokens` rows of `x`.
pub type MatrixProduct = fn(
    &Kernels,
    &Stream,
    &QuantMatrix,
    DeviceSlice<f32>,
    &mut DeviceSliceMut<f32>,
    usize,
) -> Result<()>;

/// `out[t][r] = sum_c w[r][c] * x[t][c]` for `t < n_tokens` (any count; one launch per
/// [`MAX_TOKENS`] tokens: for many tokens [`crate::ops::matmul::matmul`] reads the weights
/// fewer times).
///
/// Reads `n_tokens * cols` values of `x`, writes `n_tokens * rows` values of `out` (which must
/// not overlap `x`). `n_tokens == 0` queues nothing. Errors (nothing queued) when a view is too
/// short.
pub fn matvec(
    kernels: &Kernels,
    stream: &Stream,
    w: &QuantMatrix,
    x: DeviceSlice<f32>,
    out: &mut DeviceSliceMut<f32>,
    n_tokens: usize,
) -> Result<()> {
    check_io(OP, w, x.len(), out.len(), n_tokens)?;
    let entry = format_entry(KernelModule::Matvec, 0, OP, w.format)?;
    let function = kernels.function(KernelModule::Matvec, entry)?;
    // Lanes take runs of eight values (quantized) or single values (dense).
    let lane_items = if w.format.block_size() == 1 {
        w.cols
    } else {
        w.cols / 8
    };
    let wpr = warps_per_row(
        w.rows,
        lane_items,
        kernels.wave_size(),
        kernels.multiprocessors(),
        ROW_BLOCK_THREADS,
    );
    let rows_per_block = ROW_BLOCK_THREADS / kernels.wave_size() / wpr;
    let rows = w.rows as u32;
    let cols = w.cols as u32;
    let mut t0 = 0;
    while t0 < n_tokens {
        let nt = (n_tokens - t0).min(MAX_TOKENS);
        let xs = x
            .slice(t0 * w.cols, nt * w.cols)
            .ok_or_else(|| shape_error(OP, "x is too short".into()))?;
        let os = out
            .slice_mut(t0 * w.rows, nt * w.rows)
            .ok_or_else(|| shape_error(OP, "out is too short".into()))?;
        let nt_u = nt as u32;
        let (w_p, x_p, out_p) = (w.data.ptr(), xs.ptr(), os.ptr());
        let mut l = function.builder(stream);
        l.arg(&w_p)
            .arg(&x_p)
            .arg(&out_p)
            .arg(&rows)
            .arg(&cols)
            .arg(&nt_u)
            .arg(&wpr);
        // SAFETY: the arguments match `matvec_<format>(const u8*, const float*, float*, u32,
        // u32, u32, u32)`. The warps of row r < rows read row r of w (QuantMatrix::new checked
        // that w.data holds rows whole rows of the format), nt * cols values of xs and write
        // out[t * rows + r], t < nt, inside os (slices of the checked views); warps_per_row
        // divides the block's warps (both powers of two).
        unsafe {
            l.launch(LaunchConfig {
                grid: [rows.div_ceil(rows_per_block), 1, 1],
                block: [ROW_BLOCK_THREADS, 1, 1],
                shared_bytes: 0,
            })
        }?;
        t0 += nt;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ggml's lower-case name of a weight format: the suffix of its entry points.
    fn format_suffix(format: GgmlType) -> String {
        format.name().to_ascii_lowercase()
    }

    #[test]
    fn entry_points_follow_the_format_list() {
        // (module, entries before the per-format ones, op, entries after them: matmul_mma's
        // split-K reduction, moe's pair grouping).
        for (module, first, op, after) in [
            (KernelModule::Matvec, 0, "matvec", 0),
            (KernelModule::Matmul, 0, "matmul", 0),
            (KernelModule::MatmulMma, 0, "matmul_mma", 1),
            (KernelModule::Embed, 0, "embed", 0),
            (KernelModule::Moe, 2, "matvec_id", 1),
        ] {
            for format in WEIGHT_FORMATS {
                let entry = format_entry(module, first, op, format).unwrap();
                assert_eq!(entry, format!("{op}_{}", format_suffix(format)));
            }
            assert_eq!(
                module.entry_points().len(),
                first + WEIGHT_FORMATS.len() + after
            );
            let err = format_entry(module, first, op, GgmlType::Mxfp4).unwrap_err();
            assert!(err.to_string().contains("MXFP4"), "{err}");
        }
    }

    #[test]
    fn matrix_shapes_are_checked_against_the_bytes() {
        assert_eq!(matrix_bytes(GgmlType::Q4K, 3, 512), Some(3 * 2 * 144));
        assert_eq!(matrix_bytes(GgmlType::F16, 3, 7), Some(42));
        assert_eq!(matrix_bytes(GgmlType::Q8_0, 1, 33), None);
        check_matrix("t", GgmlType::Q6K, 2, 256, 420).unwrap();
        let err = check_matrix("t", GgmlType::Q6K, 2, 256, 421).unwrap_err();
        assert!(err.to_string().contains("420 bytes"), "{err}");
        let err = check_matrix("t", GgmlType::Q4_0, 2, 48, 54).unwrap_err();
        assert!(err.to_string().contains("whole number"), "{err}");
        assert!(check_matrix("t", GgmlType::F32, 0, 4, 0).is_err());
    }

    fn view(addr: u64, len: usize) -> DeviceSlice<u8> {
        // SAFETY: never dereferenced: these tests only check the descriptions.
        unsafe { DeviceSlice::from_raw(addr, len) }
    }

    #[test]
    fn quant_matrix_validates_format_length_and_alignment() {
        let m = QuantMatrix::new(view(0x1000, 2 * 34), GgmlType::Q8_0, 1, 64).unwrap();
        assert_eq!((m.rows(), m.cols(), m.row_bytes()), (1, 64, 68));
        let err = QuantMatrix::new(view(0x1000, 17), GgmlType::Mxfp4, 1, 32).unwrap_err();
        assert!(
            matches!(err, KernelError::UnsupportedFormat { .. }),
            "{err}"
        );
        assert!(QuantMatrix::new(view(0x1000, 67), GgmlType::Q8_0, 1, 64).is_err());
        assert!(QuantMatrix::new(view(0x1002, 16), GgmlType::F32, 2, 2).is_err());
        assert!(QuantMatrix::new(view(0x1002, 8), GgmlType::F16, 2, 2).is_ok());
        assert!(QuantMatrix::new(view(0x1001, 8), GgmlType::Bf16, 2, 2).is_err());
    }
}
