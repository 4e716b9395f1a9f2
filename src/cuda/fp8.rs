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
use super::paged::{replay_in_graph, DevicePagedKv, PagedPlan, PagedRunMode};
use super::plan::{PlanOptions, ScaleAddress};
use crate::dtype::fp8::{Fp8Format, Fp8Tensor};
use crate::paged::{Fp8Kv, KvScales, PagedAttention, PagedKv, PagedKvLayout};
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

    pub(crate) fn device_address(&self, stream: &Arc<CudaStream>) -> u64 {
        self.bytes.device_address(stream)
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

/// Checks one code buffer against the plan's format and size.
fn check_codes(
    name: &'static str,
    t: &DeviceFp8Tensor,
    format: Fp8Format,
    need: usize,
) -> Result<(), CudaError> {
    if t.format != format {
        return Err(CudaError::Buffer {
            name,
            reason: format!("holds {} codes, the plan needs {format}", t.format),
        });
    }
    if t.len < need {
        return Err(CudaError::Buffer {
            name,
            reason: format!("has {} codes, the plan needs at least {need}", t.len),
        });
    }
    Ok(())
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
        let Some(format) = self.kv_fp8() else {
            return Err(Error::Unsupported {
                backend: "cuda",
                what: "an fp8 cache for a plan over pages of the problem's dtype".into(),
                supported: "PagedPlan::with_kv_fp8 for fp8 caches".into(),
            });
        };
        let layout = self.layout();
        let (k, v) = cache
            .pages
            .checked_with(layout, |name, t, need| check_codes(name, t, format, need))?;
        let scales = cache.scales.address(stream, layout)?;
        let buffers = (k.device_address(stream), v.device_address(stream));
        self.launch_paged(stream, q, buffers, 1, Some(scales), o, lse)
    }
}

fn pages_of<B>(buffers: &[B]) -> DevicePagedKv<'_, B> {
    match buffers {
        [k, v] => DevicePagedKv::Separate { k, v },
        [kv] => DevicePagedKv::Combined(kv),
        _ => unreachable!("a cache has one or two buffers"),
    }
}

fn device_kv<'a>(buffers: &'a [DeviceFp8Tensor], scales: &'a DeviceKvScales) -> DeviceFp8Kv<'a> {
    DeviceFp8Kv {
        pages: pages_of(buffers),
        scales,
    }
}

/// `t` with every code's sign flipped: decoy contents of the same size and format.
fn negated(t: &Fp8Tensor) -> Fp8Tensor {
    Fp8Tensor {
        format: t.format,
        codes: t.codes.iter().map(|c| c ^ 0x80).collect(),
    }
}

/// `t` with every element negated (f16/bf16 decoy queries).
fn negated_q(t: &HostTensor) -> HostTensor {
    HostTensor::from_f32(
        t.dtype(),
        &t.to_f32_vec().iter().map(|x| -x).collect::<Vec<_>>(),
    )
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
        let mut plan = PagedPlan::with_kv_fp8(self, paged, Some(format), options)?;
        let stream = self.stream();
        let name = plan.spec().name();
        let host_buffers: Vec<&Fp8Tensor> = match cache.pages {
            PagedKv::Separate { k, v } => vec![k, v],
            PagedKv::Combined(kv) => vec![kv],
        };
        let scales = DeviceKvScales::upload(stream, cache.scales, layout, format)?;
        let mut qd = self.upload(q)?;
        let mut buffers = host_buffers
            .iter()
            .map(|h| match mode {
                PagedRunMode::DeviceAppend { .. } => DeviceFp8Tensor::nan(stream, format, h.len()),
                _ => DeviceFp8Tensor::upload(stream, h),
            })
            .collect::<Result<Vec<_>, _>>()?;
        match mode {
            PagedRunMode::DeviceAppend { k, v } => {
                let (kd, vd) = (self.upload(k)?, self.upload(v)?);
                let pages = match &mut buffers[..] {
                    [kb, vb] => DevicePagedKvMut::Separate { k: kb, v: vb },
                    [kv] => DevicePagedKvMut::Combined(kv),
                    _ => unreachable!("a cache has one or two buffers"),
                };
                self.append_paged_kv_fp8(
                    stream,
                    layout,
                    paged.table(),
                    &paged.problem().batch.kv_indptr,
                    (&kd, &vd),
                    pages,
                    &scales,
                )?;
                self.run_poisoned(paged.problem(), &name, |o, lse| {
                    plan.run_fp8_on(stream, &qd, device_kv(&buffers, &scales), o, lse)
                })
            }
            PagedRunMode::Direct => self.run_poisoned(paged.problem(), &name, |o, lse| {
                plan.run_fp8_on(stream, &qd, device_kv(&buffers, &scales), o, lse)
            }),
            PagedRunMode::GraphReplay => {
                qd.write(stream, &negated_q(q))?;
                for (d, h) in buffers.iter_mut().zip(&host_buffers) {
                    d.write(stream, &negated(h))?;
                }
                let mut state = (qd, buffers);
                self.run_poisoned(paged.problem(), &name, |o, lse| {
                    replay_in_graph(
                        stream,
                        &mut plan,
                        &mut state,
                        (o, lse),
                        |plan, (qd, buffers), o, lse| {
                            plan.run_fp8_on(stream, qd, device_kv(buffers, &scales), o, lse)
                        },
                        |(qd, buffers)| {
                            qd.write(stream, q)?;
                            for (d, h) in buffers.iter_mut().zip(&host_buffers) {
                                d.write(stream, h)?;
                            }
                            Ok(())
                        },
                    )
                })
            }
        }
    }
}

impl Engine {
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
        (k_new, v_new): (&DeviceTensor, &DeviceTensor),
        cache: DevicePagedKvMut<'_, DeviceFp8Tensor>,
        scales: &DeviceKvScales,
    ) -> Result<(), Error> {
        crate::paged::validate_append(
            layout,
            table,
            append_indptr,
            (k_new.dtype(), k_new.len()),
            (v_new.dtype(), v_new.len()),
        )?;
        if layout.dtype.size_bytes() != 2 {
            return Err(Error::Unsupported {
                backend: "cuda",
                what: format!("{} rows appended to an fp8 cache", layout.dtype),
                supported: "f16, bf16".into(),
            });
        }
        let format = match cache.as_ref() {
            DevicePagedKv::Separate { k, .. } | DevicePagedKv::Combined(k) => k.format(),
        };
        let (k, v) = cache
            .as_ref()
            .checked_with(layout, |name, t, need| check_codes(name, t, format, need))?;
        let scale_address = scales.address(stream, layout)?;
        self.launch_append(
            stream,
            layout,
            table,
            append_indptr,
            (k_new.device_address(stream), v_new.device_address(stream)),
            (k.device_address(stream), v.device_address(stream)),
            1,
            Some((format, scale_address)),
        )
    }
}
