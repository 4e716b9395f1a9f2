//! `Engine`: one GPU, one stream, the JIT and the loaded kernels.
//!
//! Kernels are rendered by `codegen`, compiled (or loaded from the disk cache) by `jit`, and
//! loaded into the device once; the engine keeps the loaded functions keyed by the JIT's cache
//! key, which hashes the source, the options and the architecture, so two different kernels can
//! never share an entry.

use super::buffers::DeviceTensor;
use super::device::{self, DeviceInfo};
use super::error::{CudaError, DriverContext};
use crate::codegen::{RenderedFixed, RenderedKernel};
use crate::jit::{CompileOptions, Jit, KernelSource};
use crate::tensor::HostTensor;
use crate::Error;
use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream};
use cudarc::nvrtc::Ptx;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Shared memory a block gets without opting in.
const DEFAULT_SMEM_LIMIT: u32 = 48 * 1024;

/// A kernel loaded on the device, with what launching it needs.
#[derive(Debug)]
pub struct LoadedKernel {
    /// Entry point of the prefill kernel.
    pub function: CudaFunction,
    /// Entry point of its split-KV merge kernel (same module).
    pub merge: CudaFunction,
    /// Keeps the module alive as long as the function.
    _module: Arc<CudaModule>,
    /// Readable name.
    pub name: String,
    /// Threads per CTA.
    pub threads: u32,
    /// Dynamic shared memory per CTA.
    pub smem_bytes: u32,
    /// CTAs of the attention kernel one SM holds at once (the driver's occupancy figure).
    pub ctas_per_sm: u32,
}

/// A GPU with its stream, JIT and kernel cache.
pub struct Engine {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    info: DeviceInfo,
    jit: Jit,
    kernels: Mutex<HashMap<String, Arc<LoadedKernel>>>,
    /// Single-entry modules (the kernels without specialisation: append, public merge; the
    /// reference kernels) by JIT cache key, loaded on first use.
    single: Mutex<HashMap<String, (Arc<CudaModule>, CudaFunction)>>,
}

impl Engine {
    /// Opens GPU `ordinal` with the JIT found from the environment (NVRTC, disk cache).
    pub fn new(ordinal: usize) -> Result<Engine, Error> {
        let (ctx, info) = device::open(ordinal)?;
        let jit = Jit::from_env(true)?;
        Engine::with_jit(ctx, info, jit)
    }

    fn with_jit(ctx: Arc<CudaContext>, info: DeviceInfo, jit: Jit) -> Result<Engine, Error> {
        // One stream, ordered: cudarc's per-buffer event tracking would only add host work.
        // SAFETY: every buffer the engine creates is used on this one stream only.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().during("stream creation")?;
        Ok(Engine {
            ctx,
            stream,
            info,
            jit,
            kernels: Mutex::new(HashMap::new()),
            single: Mutex::new(HashMap::new()),
        })
    }

    /// The device's properties.
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// The engine's stream: every launch and copy of the engine goes there, in order.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The CUDA context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The JIT.
    pub fn jit(&self) -> &Jit {
        &self.jit
    }

    /// Copies a host tensor to the device.
    pub fn upload(&self, host: &HostTensor) -> Result<DeviceTensor, Error> {
        Ok(DeviceTensor::upload(&self.stream, host)?)
    }

    /// Waits for all work on the engine's stream; reports a failed kernel.
    pub fn synchronize(&self) -> Result<(), Error> {
        Ok(self.stream.synchronize().during("stream synchronisation")?)
    }

    /// A kernel without specialisation (`render` is one of `codegen`'s fixed renderers),
    /// compiled or fetched from the caches, and loaded once.
    pub(crate) fn fixed_kernel(
        &self,
        render: fn() -> RenderedFixed,
    ) -> Result<CudaFunction, Error> {
        let rendered = render();
        self.single_entry(&KernelSource {
            name: &rendered.entry,
            entry: &rendered.entry,
            source: &rendered.source,
            snippets: &[],
        })
    }

    /// The one entry point of a module (a fixed kernel, a reference kernel), compiled or
    /// fetched from the caches, and loaded once: modules are kept by the JIT's cache key, which
    /// hashes the source, so two kernels of one name (custom variants) never share an entry.
    pub(crate) fn single_entry(&self, source: &KernelSource<'_>) -> Result<CudaFunction, Error> {
        let options = CompileOptions::new(self.info.arch);
        let key = self.jit.key(source, &options).hex();
        let mut loaded = self
            .single
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some((_, f)) = loaded.get(&key) {
            return Ok(f.clone());
        }
        let (module, function) = self.compile_and_load(source, &options)?;
        loaded.insert(key, (module, function.clone()));
        Ok(function)
    }

    /// Compiles `source` (or fetches it from the JIT's caches), loads the module into the
    /// device and finds its entry point; the callers keep both.
    fn compile_and_load(
        &self,
        source: &KernelSource<'_>,
        options: &CompileOptions,
    ) -> Result<(Arc<CudaModule>, CudaFunction), Error> {
        let compiled = self.jit.compile(source, options)?;
        let module = self
            .ctx
            .load_module(Ptx::from_binary(compiled.kernel.cubin))
            .during(format!("loading the module of {}", source.name))?;
        let function = module
            .load_function(source.entry)
            .during(format!("finding {}", source.entry))?;
        Ok((module, function))
    }

    /// Compiles (or fetches from the caches) and loads a rendered kernel.
    pub fn load(&self, kernel: &RenderedKernel) -> Result<Arc<LoadedKernel>, Error> {
        let source = KernelSource {
            name: &kernel.name,
            entry: &kernel.entry,
            source: &kernel.source,
            snippets: &kernel.snippets,
        };
        let options = CompileOptions::new(self.info.arch);
        let key = self.jit.key(&source, &options).hex();
        let mut loaded = self
            .kernels
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(k) = loaded.get(&key) {
            return Ok(Arc::clone(k));
        }
        if kernel.smem_bytes > self.info.max_smem_per_block {
            return Err(CudaError::Buffer {
                name: "shared memory",
                reason: format!(
                    "{} needs {} bytes per block, {} allows {}",
                    kernel.name, kernel.smem_bytes, self.info.name, self.info.max_smem_per_block
                ),
            }
            .into());
        }
        let (module, function) = self.compile_and_load(&source, &options)?;
        if kernel.smem_bytes > DEFAULT_SMEM_LIMIT {
            function
                .set_attribute(
                    CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    kernel.smem_bytes as i32,
                )
                .during(format!(
                    "raising the shared memory limit of {}",
                    kernel.name
                ))?;
        }
        let ctas_per_sm = function
            .occupancy_max_active_blocks_per_multiprocessor(
                kernel.threads,
                kernel.smem_bytes as usize,
                None,
            )
            .during(format!("the occupancy of {}", kernel.name))?;
        let merge = module
            .load_function(&kernel.merge_entry)
            .during(format!("finding {}", kernel.merge_entry))?;
        let k = Arc::new(LoadedKernel {
            function,
            merge,
            _module: module,
            name: kernel.name.clone(),
            threads: kernel.threads,
            smem_bytes: kernel.smem_bytes,
            ctas_per_sm,
        });
        loaded.insert(key, Arc::clone(&k));
        Ok(k)
    }
}
