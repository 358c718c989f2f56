//! The ggml tensor type ids and each type's block geometry. A file of its own, so that the
//! dequantization code can name [`GgmlType`] without importing the `quant` module, which
//! re-exports the dequantization.

use super::blocks::{
    BlockIq4Nl, BlockIq4Xs, BlockMxfp4, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1,
    BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8K, BlockQ8_0,
};
use crate::GgufError;

/// Elements per super-block of the K-quants.
pub const QK_K: usize = 256;

/// The ggml tensor types this crate knows the geometry of. Ids are ggml's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum GgmlType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q2K = 10,
    Q3K = 11,
    Q4K = 12,
    Q5K = 13,
    Q6K = 14,
    Q8K = 15,
    Iq4Nl = 20,
    Iq4Xs = 23,
    Bf16 = 30,
    Mxfp4 = 39,
}

/// Names of ggml type ids that exist in ggml but that this crate does not handle, so that an
/// error can say "IQ2_XXS is not supported" rather than "unknown id 16".
fn known_unsupported_name(id: u32) -> Option<&'static str> {
    Some(match id {
        9 => "Q8_1",
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        21 => "IQ3_S",
        22 => "IQ2_S",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        34 => "TQ1_0",
        35 => "TQ2_0",
        _ => return None,
    })
}

impl GgmlType {
    /// Every supported type, in id order.
    pub const ALL: [GgmlType; 17] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q2K,
        GgmlType::Q3K,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
        GgmlType::Q8K,
        GgmlType::Iq4Nl,
        GgmlType::Iq4Xs,
        GgmlType::Bf16,
        GgmlType::Mxfp4,
    ];

    /// The type with ggml id `id`. Unknown or unsupported ids are an error, never a guess.
    pub fn from_id(id: u32) -> Result<GgmlType, GgufError> {
        if let Some(ty) = GgmlType::ALL.iter().copied().find(|t| t.id() == id) {
            return Ok(ty);
        }
        Err(match known_unsupported_name(id) {
            Some(name) => GgufError::UnsupportedGgmlType {
                name,
                id,
                context: String::new(),
            },
            None => GgufError::UnknownGgmlType {
                id,
                context: String::new(),
            },
        })
    }

    /// The type called `name` (ggml spelling, case-insensitive, e.g. `Q4_K`, `bf16`).
    pub fn from_name(name: &str) -> Option<GgmlType> {
        GgmlType::ALL
            .iter()
            .copied()
            .find(|t| t.name().eq_ignore_ascii_case(name))
    }

    pub fn id(self) -> u32 {
        self as u32
    }

    /// ggml's name for the type, as gguf-py prints it.
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q5_0 => "Q5_0",
            GgmlType::Q5_1 => "Q5_1",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::Q2K => "Q2_K",
            GgmlType::Q3K => "Q3_K",
            GgmlType::Q4K => "Q4_K",
            GgmlType::Q5K => "Q5_K",
            GgmlType::Q6K => "Q6_K",
            GgmlType::Q8K => "Q8_K",
            GgmlType::Iq4Nl => "IQ4_NL",
            GgmlType::Iq4Xs => "IQ4_XS",
            GgmlType::Bf16 => "BF16",
            GgmlType::Mxfp4 => "MXFP4",
        }
    }

    /// Elements per block.
    pub fn block_size(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::Bf16 => 1,
            GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q8_0
            | GgmlType::Iq4Nl
            | GgmlType::Mxfp4 => 32,
            GgmlType::Q2K
            | GgmlType::Q3K
            | GgmlType::Q4K
            | GgmlType::Q5K
            | GgmlType::Q6K
            | GgmlType::Q8K
            | GgmlType::Iq4Xs => QK_K,
        }
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::Bf16 => 2,
            GgmlType::Q4_0 => size_of::<BlockQ4_0>(),
            GgmlType::Q4_1 => size_of::<BlockQ4_1>(),
            GgmlType::Q5_0 => size_of::<BlockQ5_0>(),
            GgmlType::Q5_1 => size_of::<BlockQ5_1>(),
            GgmlType::Q8_0 => size_of::<BlockQ8_0>(),
            GgmlType::Q2K => size_of::<BlockQ2K>(),
            GgmlType::Q3K => size_of::<BlockQ3K>(),
            GgmlType::Q4K => size_of::<BlockQ4K>(),
            GgmlType::Q5K => size_of::<BlockQ5K>(),
            GgmlType::Q6K => size_of::<BlockQ6K>(),
            GgmlType::Q8K => size_of::<BlockQ8K>(),
            GgmlType::Iq4Nl => size_of::<BlockIq4Nl>(),
            GgmlType::Iq4Xs => size_of::<BlockIq4Xs>(),
            GgmlType::Mxfp4 => size_of::<BlockMxfp4>(),
        }
    }

    /// Whether [`dequantize`](super::dequantize) handles this type.
    pub fn can_dequantize(self) -> bool {
        self != GgmlType::Q8K
    }

    /// Bytes taken by `n_elements` elements, or `None` if `n_elements` is not a whole number of
    /// blocks or the size overflows.
    pub fn bytes_for(self, n_elements: u64) -> Option<u64> {
        let block = self.block_size() as u64;
        if !n_elements.is_multiple_of(block) {
            return None;
        }
        (n_elements / block).checked_mul(self.type_size() as u64)
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
