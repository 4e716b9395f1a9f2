//! The inner kernels of the CPU backend: packing tiles into panels and the register-blocked
//! matrix micro-kernel that both products (`S = Q·Kᵀ` and `O += P·V`) run on.
//!
//! Vocabulary: a *panel* is a strip of a tile laid out so that the micro-kernel reads it front to
//! back. An A panel holds `MR` rows of the left operand, stored column by column (`[k][MR]`); a
//! B panel holds `NR` columns of the right operand, stored row by row (`[k][NR]`). The micro-kernel
//! then computes an `MR x NR` block of the product as `k` rank-one updates: broadcast one element
//! of A, multiply it with a contiguous `NR`-wide row of B, accumulate. Written with fixed-size
//! arrays and `chunks_exact`, the loops have no bounds checks and LLVM turns them into vector FMAs
//! when the caller is compiled with the matching target features (see `isa.rs`).

use crate::dtype::Element;
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

/// Rows of the left operand that one micro-kernel call covers.
pub(super) const MR: usize = 4;

/// Widening of a contiguous run of input elements to f32 (exact for f16, bf16 and f32).
pub(crate) trait Widen: Element {
    /// Writes `src` widened into `dst` (same length).
    fn widen(src: &[Self], dst: &mut [f32]);
}

impl Widen for f32 {
    fn widen(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
}

impl Widen for f16 {
    fn widen(src: &[f16], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst);
    }
}

impl Widen for bf16 {
    fn widen(src: &[bf16], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst);
    }
}

/// `a * b + c`, fused when the caller was compiled with FMA (`FMA = true`), else two roundings
/// (an unfused `mul_add` without hardware FMA would be a slow library call).
#[inline(always)]
pub(super) fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// The `MR x NR` block of `A·B` for an A panel (`[k][MR]`) and a B panel (`[k][NR]`) of the same
/// depth `k`.
#[inline(always)]
pub(super) fn micro<const NR: usize, const FMA: bool>(a: &[f32], b: &[f32]) -> [[f32; NR]; MR] {
    let mut acc = [[0.0f32; NR]; MR];
    for (ap, bp) in a.chunks_exact(MR).zip(b.chunks_exact(NR)) {
        // Fixed-size views: the loops below then have constant trip counts, unroll fully and
        // keep `acc` in registers.
        let (Ok(ap), Ok(bp)) = (<&[f32; MR]>::try_from(ap), <&[f32; NR]>::try_from(bp)) else {
            continue;
        };
        for i in 0..MR {
            for j in 0..NR {
                acc[i][j] = madd::<FMA>(ap[i], bp[j], acc[i][j]);
            }
        }
    }
    acc
}

/// `C = A·B` for A as `m / MR` panels of depth `k` and B as `n_panels` panels of depth `k`;
/// `C` is row-major with row stride `ldc`, and only its first `n_panels * NR` columns are written.
#[inline(always)]
pub(super) fn gemm_store<const NR: usize, const FMA: bool>(
    a: &[f32],
    b: &[f32],
    k: usize,
    n_panels: usize,
    c: &mut [f32],
    ldc: usize,
) {
    for (jp, bp) in b.chunks_exact(k * NR).take(n_panels).enumerate() {
        for (ap, c_rows) in a.chunks_exact(k * MR).zip(c.chunks_exact_mut(MR * ldc)) {
            let acc = micro::<NR, FMA>(ap, bp);
            for (row, c_row) in acc.iter().zip(c_rows.chunks_exact_mut(ldc)) {
                c_row[jp * NR..(jp + 1) * NR].copy_from_slice(row);
            }
        }
    }
}

/// `C += A·B` for A as panels of stride `a_stride` whose first `k` rows are used, B as panels of
/// stride `b_stride` (first `k` rows used), `C` row-major with row stride `ldc` covering every B
/// panel.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) fn gemm_accumulate<const NR: usize, const FMA: bool>(
    a: &[f32],
    a_stride: usize,
    b: &[f32],
    b_stride: usize,
    k: usize,
    c: &mut [f32],
    ldc: usize,
) {
    for (jp, bp) in b.chunks_exact(b_stride).enumerate() {
        let bp = &bp[..k * NR];
        for (ap, c_rows) in a.chunks_exact(a_stride).zip(c.chunks_exact_mut(MR * ldc)) {
            let acc = micro::<NR, FMA>(&ap[..k * MR], bp);
            for (row, c_row) in acc.iter().zip(c_rows.chunks_exact_mut(ldc)) {
                for (c, &x) in c_row[jp * NR..(jp + 1) * NR].iter_mut().zip(row) {
                    *c += x;
                }
            }
        }
    }
}

/// Stores row `row_index` (length `k`) of the left operand into A panels `[rows / MR][k][MR]`.
#[inline(always)]
pub(super) fn pack_a_row(dst: &mut [f32], k: usize, row_index: usize, row: &[f32]) {
    let panel = &mut dst[(row_index / MR) * k * MR..][..k * MR];
    let lane = row_index % MR;
    for (slot, &x) in panel.chunks_exact_mut(MR).zip(row) {
        slot[lane] = x;
    }
}

/// Stores `MR` rows (each of length `k`) at once as one A panel `[k][MR]`: a small transpose
/// whose loads are contiguous, cheaper than `MR` strided [`pack_a_row`] calls.
#[inline(always)]
pub(super) fn pack_a_panel(panel: &mut [f32], rows: [&[f32]; MR]) {
    for (j, slot) in panel.chunks_exact_mut(MR).enumerate() {
        for (s, row) in slot.iter_mut().zip(rows) {
            *s = row[j];
        }
    }
}

/// Packs `cols` (each of length `k`, `cols.len() <= nr`) as the columns of one B panel `[k][nr]`:
/// element `e` of column `c` goes to `panel[e * nr + c]`; missing columns are zero. Used for Kᵀ,
/// whose columns are key rows.
pub(super) fn pack_bt_panel(panel: &mut [f32], nr: usize, cols: &[f32], k: usize) {
    panel.fill(0.0);
    for (c, col) in cols.chunks_exact(k).enumerate() {
        for (slot, &x) in panel.chunks_exact_mut(nr).zip(col) {
            slot[c] = x;
        }
    }
}

/// Stores row `row_index` of a row-major operand B (`row.len()` = the number of columns, a
/// multiple of `nr`) into B panels of stride `panel_stride` (`[cols / nr][..][nr]`). Used for V.
pub(super) fn pack_b_row(
    dst: &mut [f32],
    nr: usize,
    panel_stride: usize,
    row_index: usize,
    row: &[f32],
) {
    for (panel, chunk) in dst.chunks_exact_mut(panel_stride).zip(row.chunks_exact(nr)) {
        panel[row_index * nr..(row_index + 1) * nr].copy_from_slice(chunk);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemm_matches_naive() {
        const NR: usize = 8;
        let (m, k, n) = (8, 5, 16);
        let a: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 - 3.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 * 0.5 - 1.0).collect();
        let mut ap = vec![0.0; m * k];
        for r in 0..m {
            pack_a_row(&mut ap, k, r, &a[r * k..(r + 1) * k]);
        }
        // B given as its transpose (rows of Bᵀ = columns of B).
        let mut bp = vec![0.0; k * n];
        for (jp, panel) in bp.chunks_exact_mut(k * NR).enumerate() {
            let columns: Vec<f32> = (jp * NR..(jp + 1) * NR)
                .flat_map(|col| (0..k).map(move |e| (e, col)))
                .map(|(e, col)| b[e * n + col])
                .collect();
            pack_bt_panel(panel, NR, &columns, k);
        }
        let mut c = vec![f32::NAN; m * n];
        gemm_store::<NR, false>(&ap, &bp, k, n / NR, &mut c, n);
        // Same B packed from its rows, accumulated onto zeros.
        let mut bp2 = vec![0.0; k * n];
        for e in 0..k {
            pack_b_row(&mut bp2, NR, k * NR, e, &b[e * n..(e + 1) * n]);
        }
        let mut ap2 = vec![0.0; m * k];
        for (i, panel) in ap2.chunks_exact_mut(k * MR).enumerate() {
            let rows: [&[f32]; MR] = std::array::from_fn(|r| &a[(i * MR + r) * k..][..k]);
            pack_a_panel(panel, rows);
        }
        assert_eq!(ap, ap2);
        let mut c2 = vec![0.0; m * n];
        gemm_accumulate::<NR, true>(&ap, k * MR, &bp2, k * NR, k, &mut c2, n);
        for i in 0..m {
            for j in 0..n {
                let want: f32 = (0..k).map(|e| a[i * k + e] * b[e * n + j]).sum();
                assert_eq!(c[i * n + j], want, "store ({i},{j})");
                assert_eq!(c2[i * n + j], want, "accumulate ({i},{j})");
            }
        }
    }
}
