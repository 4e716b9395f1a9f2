//! Ragged batches: requests of different lengths laid end to end, delimited by index pointers.

use super::error::{InvalidProblem, Validation};

/// Query and key/value lengths of each request, as prefix sums (`indptr[r]..indptr[r+1]` are the
/// tokens of request `r`). Both arrays have `batch + 1` entries, start at 0 and never decrease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RaggedBatch {
    /// Query token ranges per request.
    pub qo_indptr: Vec<i32>,
    /// Key/value token ranges per request.
    pub kv_indptr: Vec<i32>,
}

impl RaggedBatch {
    /// One request of `qo_len` queries over `kv_len` keys; an error if a length does not fit
    /// the kernels' 32-bit token indices.
    pub fn single(qo_len: usize, kv_len: usize) -> Result<RaggedBatch, InvalidProblem> {
        RaggedBatch::from_lens(&[(qo_len, kv_len)])
    }

    /// A batch from per-request `(qo_len, kv_len)` pairs; an error naming the first request
    /// whose running total of query or key tokens does not fit the kernels' 32-bit token indices
    /// (`i32::MAX`).
    pub fn from_lens(lens: &[(usize, usize)]) -> Result<RaggedBatch, InvalidProblem> {
        let mut qo_indptr = vec![0i32];
        let mut kv_indptr = vec![0i32];
        let mut totals = (0usize, 0usize);
        for (r, &(q, k)) in lens.iter().enumerate() {
            totals = (totals.0.saturating_add(q), totals.1.saturating_add(k));
            for (name, total, indptr) in [
                ("qo_indptr", totals.0, &mut qo_indptr),
                ("kv_indptr", totals.1, &mut kv_indptr),
            ] {
                let end = i32::try_from(total).map_err(|_| {
                    InvalidProblem::new(
                        name,
                        format!(
                            "request {r} brings the batch to {total} tokens, more than the {} that 32-bit token indices hold",
                            i32::MAX
                        ),
                    )
                })?;
                indptr.push(end);
            }
        }
        Ok(RaggedBatch {
            qo_indptr,
            kv_indptr,
        })
    }

    /// Number of requests.
    pub fn len(&self) -> usize {
        self.qo_indptr.len().saturating_sub(1)
    }

    /// Whether the batch has no request.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Total query tokens.
    pub fn total_qo(&self) -> usize {
        *self.qo_indptr.last().unwrap_or(&0) as usize
    }

    /// Total key/value tokens.
    pub fn total_kv(&self) -> usize {
        *self.kv_indptr.last().unwrap_or(&0) as usize
    }

    /// `(qo_start, qo_len, kv_start, kv_len)` of request `r`.
    pub fn request(&self, r: usize) -> (usize, usize, usize, usize) {
        let qs = self.qo_indptr[r] as usize;
        let ks = self.kv_indptr[r] as usize;
        (
            qs,
            self.qo_indptr[r + 1] as usize - qs,
            ks,
            self.kv_indptr[r + 1] as usize - ks,
        )
    }

    /// `(qo_len, kv_len)` of every request.
    pub fn lens(&self) -> Vec<(usize, usize)> {
        (0..self.len())
            .map(|r| (self.request(r).1, self.request(r).3))
            .collect()
    }

    /// Checks lengths, starts and monotonicity of both index pointers.
    pub fn validate(&self) -> Validation {
        check_indptr("qo_indptr", &self.qo_indptr)?;
        check_indptr("kv_indptr", &self.kv_indptr)?;
        if self.qo_indptr.len() != self.kv_indptr.len() {
            return Err(InvalidProblem::new(
                "kv_indptr",
                format!(
                    "has {} entries but qo_indptr has {}; both need batch + 1",
                    self.kv_indptr.len(),
                    self.qo_indptr.len()
                ),
            ));
        }
        Ok(())
    }
}

fn check_indptr(name: &str, indptr: &[i32]) -> Validation {
    match indptr.first() {
        None => {
            return Err(InvalidProblem::new(
                name,
                "is empty; it needs batch + 1 >= 2 entries",
            ))
        }
        Some(_) if indptr.len() < 2 => {
            return Err(InvalidProblem::new(
                name,
                "has 1 entry; it needs batch + 1 >= 2 entries",
            ))
        }
        Some(&first) if first != 0 => {
            return Err(InvalidProblem::new(
                format!("{name}[0]"),
                format!("is {first}; it must be 0"),
            ))
        }
        Some(_) => {}
    }
    for (r, w) in indptr.windows(2).enumerate() {
        if w[1] < w[0] {
            return Err(InvalidProblem::new(
                format!("{name}[{}]", r + 1),
                format!(
                    "{} is less than {name}[{r}] = {}; indptr must not decrease",
                    w[1], w[0]
                ),
            ));
        }
    }
    Ok(())
}
