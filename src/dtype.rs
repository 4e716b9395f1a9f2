//! Element types of attention inputs and outputs, and the conversions between them.
//!
//! The GPU kernels take f16 and bf16; the CPU backends take f32 as well. A quantised KV cache
//! stores fp8 codes ([`fp8`]): those are not a [`DType`] of attention inputs but a storage format
//! of the paged cache, dequantised to the problem's dtype on the way in (`paged::KvScales`).

use half::{bf16, f16};
use std::fmt;

pub mod fp8;

/// The element type of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum DType {
    /// IEEE binary16.
    F16,
    /// bfloat16 (8 exponent bits, 7 mantissa bits).
    Bf16,
    /// IEEE binary32 (CPU backends only).
    F32,
}

impl DType {
    /// Size of one element in bytes.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F16 | DType::Bf16 => 2,
            DType::F32 => 4,
        }
    }

    /// The bit pattern of this type's quiet NaN, in the low `8 * size_bytes()` bits: what
    /// poisoned outputs are filled with (f16 `0x7E00`, bf16 `0x7FC0`, f32 `0x7FC0_0000`).
    pub fn nan_bits(self) -> u32 {
        match self {
            DType::F16 => u32::from(f16::NAN.to_bits()),
            DType::Bf16 => u32::from(bf16::NAN.to_bits()),
            DType::F32 => f32::NAN.to_bits(),
        }
    }

    /// Short lowercase name, as used on the command line and in kernel names.
    pub fn name(self) -> &'static str {
        match self {
            DType::F16 => "f16",
            DType::Bf16 => "bf16",
            DType::F32 => "f32",
        }
    }

    /// Parses the names printed by [`DType::name`].
    pub fn parse(s: &str) -> Option<DType> {
        match s {
            "f16" | "fp16" | "half" => Some(DType::F16),
            "bf16" | "bfloat16" => Some(DType::Bf16),
            "f32" | "fp32" | "float" => Some(DType::F32),
            _ => None,
        }
    }

    /// Rounds an f64 to this type and returns it widened back to f64. For f16 and bf16 this goes
    /// through `half`, which rounds via f32 and can round twice (off by one unit in the last place
    /// in rare ties): fine for drawing test inputs, its only use; exact semantics (the reference's
    /// f16 accumulation) round once, in fixed point.
    pub fn round_f64(self, x: f64) -> f64 {
        match self {
            DType::F16 => f16::from_f64(x).to_f64(),
            DType::Bf16 => bf16::from_f64(x).to_f64(),
            DType::F32 => x as f32 as f64,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An element type that host tensors can hold.
pub trait Element: Copy + Send + Sync + 'static {
    /// The [`DType`] tag of this type.
    const DTYPE: DType;
    /// Exact widening to f32.
    fn to_f32(self) -> f32;
    /// Round-to-nearest-even narrowing from f32.
    fn from_f32(x: f32) -> Self;
}

impl Element for f16 {
    const DTYPE: DType = DType::F16;
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
}

impl Element for bf16 {
    const DTYPE: DType = DType::Bf16;
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(x: f32) -> Self {
        x
    }
}
