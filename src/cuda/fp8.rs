//! fp8 KV caches on the GPU: device buffers of fp8 codes ([`DeviceFp8Tensor`]), the scales
//! ([`DeviceKvScales`]), paged attention over them ([`PagedPlan::run_fp8_on`],
//! [`Engine::paged_host_fp8`]) and the quantising append ([`Engine::append_paged_kv_fp8`]).
//!
//! The kernels are the paged kernels with the `KV_FP8` spec constant: they dequantise the codes
//! into their f16/bf16 tiles exactly as `docs/semantics.md` defines ("fp8 KV cache"), so the
//! output is that of the plain kernels over the dequantised cache.

use super::append::DevicePagedKvMut;
use super::buffers::{DeviceBytes, DeviceTensor};
use super::engine::Engine;
use super::error::CudaError;
use super::memory;
use super::paged::{first_of, CacheBuffer, CacheElements, DevicePagedKv, PagedPlan, PagedRunMode};
use super::plan::{PlanOptions, ScaleAddress};
use crate::dtype::fp8::{Fp8Format, Fp8Tensor};
use crate::dtype::DType;
use crate::paged::{Fp8Kv, KvScales, PagedAttention, PagedKvLayout};
use crate::tensor::HostTensor;
use crate::{AttentionOutput, Error};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use std::sync::Arc;

/// A flat device buffer of fp8 codes of one format, owned or borrowed (another framework's
/// tensor, [`from_raw`](Self::from_raw)).
#[derive(Debug)]
pub struct DeviceFp8Tensor {
    /// At least one byte (the driver allocates nothing of size 0); `len` are the tensor's.
    bytes: DeviceBytes,
    len: usize,
    format: Fp8Format,
}

impl DeviceFp8Tensor {
    /// Wraps `len` codes of `format` at device address `address` (e.g. a `torch.float8_e4m3fn`
    /// tensor), without taking ownership: dropping the tensor frees nothing.
    ///
    /// # Safety
    /// `address` must be a device allocation of the context `stream` belongs to, at least `len`
    /// bytes long and 16-byte aligned, valid and not written by anything unordered with `stream`
    /// for as long as this tensor (and any launch using it) lives.
    pub unsafe fn from_raw(
        stream: &Arc<CudaStream>,
        address: u64,
        format: Fp8Format,
        len: usize,
    ) -> Result<DeviceFp8Tensor, CudaError> {
        // SAFETY: forwarded to the caller (see above).
        let bytes = unsafe { DeviceBytes::borrowed(stream, address, len.max(1))? };
        Ok(DeviceFp8Tensor { bytes, len, format })
    }

    /// Copies host codes to the device (on `stream`).
    pub fn upload(
        stream: &Arc<CudaStream>,
        host: &Fp8Tensor,
    ) -> Result<DeviceFp8Tensor, CudaError> {
        let what = format!("a {}-element {} tensor", host.len(), host.format);
        let data: &[u8] = if host.is_empty() { &[0] } else { &host.codes };
        Ok(DeviceFp8Tensor {
            bytes: DeviceBytes::owned(memory::upload(stream, data, &what)?),
            len: host.len(),
            format: host.format,
        })
    }

    /// `len` NaN codes (0x7F), so that a code never written shows in an output.
    pub fn nan(
        stream: &Arc<CudaStream>,
        format: Fp8Format,
        len: usize,
    ) -> Result<DeviceFp8Tensor, CudaError> {
        DeviceFp8Tensor::upload(stream, &Fp8Tensor::nan(format, len))
    }

    /// Overwrites the whole buffer with `host` (same format and length), in place, ordered on
    /// `stream`: kernels and captured graphs that hold the address read the new codes.
    pub fn write(&mut self, stream: &Arc<CudaStream>, host: &Fp8Tensor) -> Result<(), CudaError> {
        if host.format != self.format || host.len() != self.len {
            return Err(CudaError::Buffer {
                name: "write",
                reason: format!(
                    "{} {} codes into a buffer of {} {}",
                    host.len(),
                    host.format,
                    self.len,
                    self.format
                ),
            });
        }
        self.bytes.write(stream, &host.codes)
    }

    /// Copies back to the host (synchronises `stream`).
    pub fn download(&self, stream: &Arc<CudaStream>) -> Result<Fp8Tensor, CudaError> {
        Ok(Fp8Tensor {
            format: self.format,
            codes: self.bytes.read(stream, self.len)?,
        })
    }

    /// The format of every code.
    pub fn format(&self) -> Fp8Format {
        self.format
    }

    /// Number of codes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no code.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The K and V scales of an fp8 cache on the device, validated for one layout and format.
#[derive(Debug)]
pub struct DeviceKvScales {
    k: CudaSlice<f32>,
    v: CudaSlice<f32>,
    per_head: bool,
    num_kv_heads: usize,
}

impl DeviceKvScales {
    /// Validates `scales` for `layout` and `format` (`KvScales::validate`) and uploads them.
    pub fn upload(
        stream: &Arc<CudaStream>,
        scales: &KvScales,
        layout: &PagedKvLayout,
        format: Fp8Format,
    ) -> Result<DeviceKvScales, Error> {
        scales.validate(layout.num_kv_heads, format, layout.dtype)?;
        Ok(DeviceKvScales {
            k: memory::upload(stream, &scales.k, "k_scale")?,
            v: memory::upload(stream, &scales.v, "v_scale")?,
            per_head: scales.is_per_head(),
            num_kv_heads: layout.num_kv_heads,
        })
    }

    /// The kernels' view, after checking that the scales were made for `layout`'s heads.
    fn address(
        &self,
        stream: &Arc<CudaStream>,
        layout: &PagedKvLayout,
    ) -> Result<ScaleAddress, CudaError> {
        if self.num_kv_heads != layout.num_kv_heads {
            return Err(CudaError::Buffer {
                name: "kv_scales",
                reason: format!(
                    "were made for {} KV heads, the cache has {}",
                    self.num_kv_heads, layout.num_kv_heads
                ),
            });
        }
        Ok(ScaleAddress {
            k: self.k.device_ptr(stream).0,
            v: self.v.device_ptr(stream).0,
            head_stride: i32::from(self.per_head),
        })
    }
}

/// An fp8 cache on the device: its pages and scales.
#[derive(Clone, Copy, Debug)]
pub struct DeviceFp8Kv<'a> {
    /// The code buffers, stored as the layout says.
    pub pages: DevicePagedKv<'a, DeviceFp8Tensor>,
    /// The dequantisation scales.
    pub scales: &'a DeviceKvScales,
}

impl CacheBuffer for DeviceFp8Tensor {
    type Host = Fp8Tensor;
    type Element = Fp8Format;
    type Scales = DeviceKvScales;

    fn upload(stream: &Arc<CudaStream>, host: &Fp8Tensor) -> Result<Self, CudaError> {
        DeviceFp8Tensor::upload(stream, host)
    }

    fn nan_like(stream: &Arc<CudaStream>, host: &Fp8Tensor) -> Result<Self, CudaError> {
        DeviceFp8Tensor::nan(stream, host.format, host.len())
    }

    fn write(&mut self, stream: &Arc<CudaStream>, host: &Fp8Tensor) -> Result<(), CudaError> {
        DeviceFp8Tensor::write(self, stream, host)
    }

    fn first_difference(
        &self,
        stream: &Arc<CudaStream>,
        host: &Fp8Tensor,
    ) -> Result<Option<(usize, String, String, usize)>, CudaError> {
        let device = self.download(stream)?;
        Ok(first_of(
            device
                .codes
                .iter()
                .zip(&host.codes)
                .map(|(&a, &b)| (a == b, a, b)),
            |c| format!("code {c:#04x}"),
        ))
    }

    /// Every code's sign flipped.
    fn negated(host: &Fp8Tensor) -> Fp8Tensor {
        Fp8Tensor {
            format: host.format,
            codes: host.codes.iter().map(|c| c ^ 0x80).collect(),
        }
    }

    fn check(&self, name: &'static str, want: Fp8Format, need: usize) -> Result<(), CudaError> {
        if self.format != want {
            return Err(CudaError::Buffer {
                name,
                reason: format!("holds {} codes, the plan needs {want}", self.format),
            });
        }
        if self.len < need {
            return Err(CudaError::Buffer {
                name,
                reason: format!("has {} codes, the plan needs at least {need}", self.len),
            });
        }
        Ok(())
    }

    fn device_address(&self, stream: &Arc<CudaStream>) -> u64 {
        self.bytes.device_address(stream)
    }

    fn elements(
        &self,
        stream: &Arc<CudaStream>,
        layout: &PagedKvLayout,
        scales: &DeviceKvScales,
    ) -> Result<CacheElements, CudaError> {
        Ok(CacheElements {
            bytes: 1,
            fp8: Some((self.format, scales.address(stream, layout)?)),
        })
    }

    fn planned(plan: &PagedPlan) -> Result<Fp8Format, Error> {
        plan.kv_fp8().ok_or_else(|| Error::Unsupported {
            backend: "cuda",
            what: "an fp8 cache for a plan over pages of the problem's dtype".into(),
            supported: "PagedPlan::with_kv_fp8 for fp8 caches".into(),
        })
    }

    fn appended(first: &Self, _: &PagedKvLayout) -> Fp8Format {
        first.format
    }

    fn append_unsupported(dtype: DType) -> String {
        format!("{dtype} rows appended to an fp8 cache")
    }
}

impl PagedPlan {
    /// [`run_on`](Self::run_on) for a plan over an fp8 cache
    /// ([`with_kv_fp8`](Self::with_kv_fp8)): the cache's codes in the plan's layout and format,
    /// its scales. No allocation, no synchronisation: safe to capture in a CUDA graph.
    pub fn run_fp8_on(
        &self,
        stream: &Arc<CudaStream>,
        q: &DeviceTensor,
        cache: DeviceFp8Kv<'_>,
        o: &mut DeviceTensor,
        lse: Option<&mut DeviceTensor>,
    ) -> Result<(), Error> {
        self.run_cache(stream, q, cache.pages, cache.scales, o, lse)
    }
}

impl Engine {
    /// [`paged_host`](Self::paged_host) over an fp8 cache: uploads the codes and scales (for
    /// [`PagedRunMode::DeviceAppend`], an all-NaN cache that the quantising append fills from the
    /// mode's ragged K/V), poisons the outputs, launches (directly or through a replayed CUDA
    /// graph), synchronises and downloads.
    pub fn paged_host_fp8(
        &self,
        paged: &PagedAttention,
        q: &HostTensor,
        cache: Fp8Kv<'_>,
        mode: PagedRunMode<'_>,
        options: PlanOptions,
    ) -> Result<AttentionOutput, Error> {
        paged.validate_q(q)?;
        let layout = paged.layout();
        cache.validate(layout)?;
        let format = cache.format();
        let plan = PagedPlan::with_kv_fp8(self, paged, Some(format), options)?;
        let scales = DeviceKvScales::upload(self.stream(), cache.scales, layout, format)?;
        self.paged_host_cache::<DeviceFp8Tensor>(paged, q, plan, cache.pages, &scales, mode)
    }

    /// [`append_paged_kv`](Self::append_paged_kv) into an fp8 cache: the new f16/bf16 rows are
    /// quantised with `scales` on the way in (`docs/semantics.md`, "fp8 KV cache"), after the
    /// same checks as the host's `append_paged_kv_fp8` except for the values themselves, which
    /// stay on the device: a NaN becomes the NaN code and an infinity saturates. No
    /// synchronisation.
    #[allow(clippy::too_many_arguments)]
    pub fn append_paged_kv_fp8(
        &self,
        stream: &Arc<CudaStream>,
        layout: &PagedKvLayout,
        table: &crate::paged::PageTable,
        append_indptr: &[i32],
        new: (&DeviceTensor, &DeviceTensor),
        cache: DevicePagedKvMut<'_, DeviceFp8Tensor>,
        scales: &DeviceKvScales,
    ) -> Result<(), Error> {
        self.append_to_cache(stream, layout, table, append_indptr, new, cache, scales)
    }
}
