//! The GPU as a [`Backend`](crate::verify::Backend) of the verify suite, with the GPU reference
//! kernel as its full reference.

use super::append_check;
use super::buffers::DeviceTensor;
use super::engine::Engine;
use super::error::CudaError;
use super::paged::{PagedPlan, PagedRunMode};
use super::plan::{persistent_plannable, plan_arch, PlanOptions};
use super::schedule::{choose_tile_on, SplitChoice};
use crate::codegen::{self, KernelSpec, KvCache, ReferenceSpec, TileConfig};
use crate::compare::Comparison;
use crate::dtype::DType;
use crate::jit::batch::{compile_in_background, BackgroundCompile, BatchJob};
use crate::jit::{Arch, CompileOptions, JitError};
use crate::merge::MergeShape;
use crate::paged::{PagedAttention, PagedCache};
use crate::problem::{AttentionProblem, HeadDims, InvalidProblem, QkAccum};
use crate::tensor::HostTensor;
use crate::testing::{BackendCaps, Case, PagedRun, TileRequest};
use crate::verify::{run_case, Backend, CaseResult, Oracle, SELF_CHECK};
use crate::{AttentionOutput, Error};
use std::collections::HashSet;
use std::io::Write;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Runs each problem through [`Engine::prefill_host_with_options`] (outputs poisoned with NaN
/// first).
pub struct CudaBackend {
    engine: Engine,
    /// The architecture whose tiles the plans take ([`PlanOptions::tiles_of`]; `None`: the
    /// device's).
    tiles_of: Option<Arch>,
    /// The tile every plan takes, whatever the case asks (`None`: the case's request).
    tile: Option<TileConfig>,
    /// How every plan splits the KV range (but the opposite-split runs of paged cases).
    split: SplitChoice,
    /// The compile [`Backend::prepare`] started, kept so that dropping the backend stops it
    /// (see `prepare`).
    background: Mutex<StoppingCompile>,
}

impl CudaBackend {
    /// Opens GPU `ordinal`.
    pub fn new(ordinal: usize) -> Result<CudaBackend, Error> {
        Ok(CudaBackend {
            engine: Engine::new(ordinal)?,
            tiles_of: None,
            tile: None,
            split: SplitChoice::Planned,
            background: Mutex::new(StoppingCompile(None)),
        })
    }

    /// This backend computing every problem with `tile` (`verify --tile`): a problem the tile
    /// cannot compute fails with the plan's error, which names what the tile supports.
    pub fn with_tile(self, tile: TileConfig) -> CudaBackend {
        CudaBackend {
            tile: Some(tile),
            ..self
        }
    }

    /// This backend splitting every plan's KV range as `split` says rather than as the planner
    /// chooses (`verify --split-keys`: the split path of a tile the planner never splits); the
    /// opposite-split runs of paged cases keep their own split.
    pub fn with_split(self, split: SplitChoice) -> CudaBackend {
        CudaBackend { split, ..self }
    }

    /// This backend planning the tiles of `arch` rather than the device's (see
    /// [`PlanOptions::tiles_of`]); an error when the device cannot run them.
    pub fn with_tiles_of(self, arch: Arch) -> Result<CudaBackend, Error> {
        plan_arch(Some(arch), self.engine.info().arch)?;
        Ok(CudaBackend {
            tiles_of: Some(arch),
            ..self
        })
    }

    /// The architecture whose tiles the plans take.
    fn arch(&self) -> Arch {
        self.tiles_of.unwrap_or(self.engine.info().arch)
    }

    /// The tile that `tile` asks for over K/V from `kv` (`None`: the planner's).
    fn requested_tile(
        &self,
        problem: &AttentionProblem,
        kv: KvCache,
        tile: TileRequest,
    ) -> Result<Option<TileConfig>, Error> {
        if self.tile.is_some() {
            return Ok(self.tile);
        }
        match tile {
            TileRequest::Planned => Ok(None),
            TileRequest::WidestRows => {
                widest_row_tile_on(problem.head_dims, problem.qk_accum, kv, self.arch()).map(Some)
            }
        }
    }

    /// The plan options of a run: the requested tile, `split`, this backend's architecture.
    fn options(
        &self,
        problem: &AttentionProblem,
        kv: KvCache,
        tile: TileRequest,
        split: SplitChoice,
    ) -> Result<PlanOptions, Error> {
        Ok(PlanOptions {
            tile: self.requested_tile(problem, kv, tile)?,
            split,
            tiles_of: self.tiles_of,
        })
    }

    /// The split that the planner would not choose for `p`: none when it splits; else chunks
    /// of a third of the longest request's keys (rounded up to the KV tile), an error when that
    /// request fits in one tile and there is nothing to split.
    fn opposite_split(&self, p: &PagedAttention) -> Result<SplitChoice, Error> {
        // With this backend's tile (`verify --tile`), so that the chunks are whole tiles of it.
        let options = PlanOptions {
            tile: self.tile,
            tiles_of: self.tiles_of,
            ..PlanOptions::default()
        };
        let planned = PagedPlan::with_options(&self.engine, p, options)?;
        if planned.kv_split().is_some() {
            return Ok(SplitChoice::Unsplit);
        }
        let kv_tile = planned.spec().tile.kv_tile as usize;
        let max_kv = p
            .problem()
            .batch
            .lens()
            .iter()
            .map(|l| l.1)
            .max()
            .unwrap_or(0);
        if max_kv <= kv_tile {
            return Err(InvalidProblem::new(
                "kv_indptr",
                format!("the longest request has {max_kv} keys, one KV tile of {kv_tile}: nothing to split"),
            )
            .into());
        }
        Ok(SplitChoice::ChunkKeys(
            max_kv.div_ceil(3).div_ceil(kv_tile) * kv_tile,
        ))
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Asks for NaN buffers the GPU cannot hold: one of as many f16 elements as it has bytes
    /// (twice its memory), one halfway between its free and its total memory (the driver's
    /// out-of-memory error). `Ok` with the errors' messages when both are refused with
    /// [`CudaError::OutOfMemory`] naming the size asked, else what happened instead.
    fn refuses_oversized_buffers(&self) -> Result<Vec<String>, String> {
        let (free, total) = self
            .engine
            .context()
            .mem_get_info()
            .map_err(|e| format!("cuMemGetInfo failed: {e}"))?;
        let size = DType::F16.size_bytes();
        [total * size, free + (total - free) / 2]
            .into_iter()
            .map(|bytes| {
                let len = bytes / size;
                match DeviceTensor::nan(self.engine.stream(), DType::F16, len) {
                    Ok(_) => Err(format!(
                        "a buffer of {} bytes was allocated with {free} of {total} bytes free",
                        len * size
                    )),
                    Err(e @ CudaError::OutOfMemory { requested, .. })
                        if requested == len * size =>
                    {
                        Ok(e.to_string())
                    }
                    Err(e) => Err(format!(
                        "a buffer of {} bytes: expected an out-of-memory error, got: {e}",
                        len * size
                    )),
                }
            })
            .collect()
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn describe(&self) -> String {
        let info = self.engine.info();
        let mut tiles = match self.tiles_of {
            Some(arch) => format!(", planning the tiles of {}", arch.name()),
            None => String::new(),
        };
        if let Some(tile) = self.tile {
            tiles.push_str(&format!(", every plan on tile {}", tile.label()));
        }
        format!(
            "cuda ({}, {}, {} SMs{tiles})",
            info.name,
            info.arch.name(),
            info.sm_count
        )
    }

    fn caps(&self) -> BackendCaps {
        BackendCaps::cuda()
    }

    fn run(
        &self,
        problem: &AttentionProblem,
        q: &HostTensor,
        k: &HostTensor,
        v: &HostTensor,
        tile: TileRequest,
    ) -> Result<AttentionOutput, Error> {
        let options = self.options(problem, KvCache::Ragged, tile, self.split)?;
        self.engine
            .prefill_host_with_options(problem, q, k, v, options)
    }

    /// Starts compiling the distinct kernels of `cases` (the fast kernel and the GPU reference
    /// kernel of each) into the disk cache on background threads, one core fewer than the
    /// machine has (at least one), in the order of the cases, and returns at once. Each case's
    /// run then waits only for its own kernels: a kernel a worker is compiling is waited for
    /// through the cache's build lock and loaded, one no worker has reached yet is compiled by
    /// the run itself (the worker later finds it cached). So results come as soon as their
    /// kernels exist, and a run cut short keeps the cases it got through. Without a disk cache
    /// there is nothing to keep the kernels in, and each run compiles its own. A kernel that
    /// fails in the background is named on stderr at once (one line) and fails again in its
    /// case's run, which reports it.
    ///
    /// The cases never wait for the compile as a whole. When the backend is dropped (the suite
    /// ended, or stopped because the context was lost), its workers take no further kernel and
    /// the compiles they are in are waited for (at most one per worker, seconds), so that the
    /// process does not exit while NVRTC is compiling on another thread.
    fn prepare(&self, cases: &[Case]) -> Result<(), Error> {
        let jit = self.engine.jit();
        if jit.cache().is_none() {
            return Ok(());
        }
        let options = CompileOptions::new(self.engine.info().arch);
        let sm_count = self.engine.info().sm_count as usize;
        let mut seen = HashSet::new();
        let mut jobs = Vec::new();
        for case in cases {
            let kv = if case.paged.is_some() {
                KvCache::Paged
            } else {
                KvCache::Ragged
            };
            let tile = match self.requested_tile(&case.problem, kv, case.tile) {
                Ok(Some(tile)) => tile,
                Ok(None) => {
                    let persistent = persistent_plannable(&case.problem, kv, self.split, false);
                    choose_tile_on(&case.problem, kv, sm_count, self.arch(), persistent)
                }
                // Reported by the case's run.
                Err(_) => continue,
            };
            let kv_fp8 = case.paged.and_then(|p| p.fp8).map(|f| f.format);
            if let Ok(spec) =
                KernelSpec::for_problem(&case.problem, kv, tile).and_then(|s| s.with_kv_fp8(kv_fp8))
            {
                let r = codegen::render(&spec);
                if seen.insert(r.source.clone()) {
                    jobs.push(BatchJob {
                        name: r.name,
                        entry: r.entry,
                        source: r.source,
                        snippets: r.snippets,
                        options: options.clone(),
                    });
                }
            }
            if let Ok(spec) = ReferenceSpec::for_problem(&case.problem) {
                let r = codegen::render_reference(&spec);
                if seen.insert(r.source.clone()) {
                    jobs.push(BatchJob {
                        name: r.entry.clone(),
                        entry: r.entry,
                        source: r.source,
                        snippets: r.snippets,
                        options: options.clone(),
                    });
                }
            }
        }
        if jobs.is_empty() {
            return Ok(());
        }
        // One core stays free for the case runs, which compile what no worker has reached.
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .saturating_sub(1)
            .max(1);
        let total = jobs.len();
        let compile = compile_in_background(jit.clone(), jobs, threads, |job, result| {
            if let Err(e) = result {
                // Written, not `eprintln!`ed: a closed stderr must not panic a worker.
                let _ = writeln!(
                    std::io::stderr(),
                    "verify: kernel {} ({}) failed to compile: {}",
                    job.name,
                    job.options.arch,
                    first_line(e)
                );
            }
        })?;
        println!(
            "verify: compiling {total} kernels on {} threads in the background; each case waits for its own",
            compile.workers()
        );
        // A compile started by an earlier call is dropped here: stopped, and waited for.
        *self
            .background
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = StoppingCompile(Some(compile));
        Ok(())
    }

    /// The GPU reference kernel ([`Engine::reference_attention`]) on the problem's ragged
    /// tensors (a paged case passes the tensors its cache was built from).
    fn full_reference(
        &self,
        problem: &AttentionProblem,
        q: &HostTensor,
        k: &HostTensor,
        v: &HostTensor,
    ) -> Option<Result<AttentionOutput, Error>> {
        Some(self.engine.reference_attention(problem, q, k, v))
    }

    fn run_paged(
        &self,
        p: &PagedAttention,
        q: &HostTensor,
        cache: PagedCache<'_>,
        (k, v): (&HostTensor, &HostTensor),
        run: PagedRun,
        tile: TileRequest,
    ) -> Result<AttentionOutput, Error> {
        let (mode, split) = match run {
            PagedRun::Direct => (PagedRunMode::Direct, self.split),
            PagedRun::GraphReplay => (PagedRunMode::GraphReplay, self.split),
            PagedRun::DeviceAppend => (PagedRunMode::DeviceAppend { k, v }, self.split),
            PagedRun::OppositeSplit => (PagedRunMode::Direct, self.opposite_split(p)?),
        };
        let options = self.options(p.problem(), KvCache::Paged, tile, split)?;
        match cache {
            PagedCache::Plain(cache) => self.engine.paged_host(p, q, cache, mode, options),
            PagedCache::Fp8(cache) => self.engine.paged_host_fp8(p, q, cache, mode, options),
        }
    }

    /// Lost when the stream no longer synchronises: a kernel's illegal address (or another
    /// sticky error) poisons the context, and every later call fails with it.
    fn lost(&self) -> Option<String> {
        self.engine
            .synchronize()
            .err()
            .map(|e| format!("the CUDA context is unusable ({e})"))
    }

    /// Two states go through [`Engine::merge_state`] (separate tensors), any other number
    /// through [`Engine::merge_states`] (stored together, `[rows, n, heads, head_dim]`); the
    /// outputs are NaN before the launch.
    fn merge_states(
        &self,
        shape: MergeShape,
        states: &[(HostTensor, Vec<f32>)],
    ) -> Result<(HostTensor, Vec<f32>), Error> {
        let engine = &self.engine;
        let stream = engine.stream();
        let dtype = states.first().map_or(DType::F32, |(o, _)| o.dtype());
        let mut o = DeviceTensor::nan(stream, dtype, shape.o_len())?;
        let mut lse = DeviceTensor::nan(stream, DType::F32, shape.lse_len())?;
        let lse_tensor = |l: &[f32]| HostTensor::from_f32(DType::F32, l);
        if let [(o_a, lse_a), (o_b, lse_b)] = states {
            let a = (engine.upload(o_a)?, engine.upload(&lse_tensor(lse_a))?);
            let b = (engine.upload(o_b)?, engine.upload(&lse_tensor(lse_b))?);
            engine.merge_state(
                stream,
                shape,
                (&a.0, &a.1),
                (&b.0, &b.1),
                (&mut o, &mut lse),
            )?;
        } else {
            let (o_all, lse_all) = interleave(shape, states);
            let all = (engine.upload(&o_all)?, engine.upload(&lse_all)?);
            engine.merge_states(
                stream,
                shape,
                states.len(),
                (&all.0, &all.1),
                (&mut o, &mut lse),
            )?;
        }
        engine.synchronize()?;
        let lse = lse.download(stream)?.to_f32_vec();
        Ok((o.download(stream)?, lse))
    }

    /// A buffer beyond the GPU's memory is refused with an error, and the engine stays usable:
    /// `small` then runs and passes.
    fn self_checks(&self, small: &Case) -> Vec<CaseResult> {
        let name = format!("{SELF_CHECK}out-of-memory, then {}", small.name);
        let result = match self.refuses_oversized_buffers() {
            Ok(messages) => {
                let mut result = run_case(self, small);
                result.name = name;
                let refused = messages
                    .into_iter()
                    .map(|m| ("refused as expected".to_string(), Err(m), true));
                result.also.splice(0..0, refused);
                result
            }
            Err(why) => CaseResult {
                name,
                outcome: Err(why),
                passed: false,
                oracle: Oracle::Exact,
                also: Vec::new(),
                backend_time: Duration::ZERO,
            },
        };
        let started = Instant::now();
        let codes = append_check::fp8_append_codes(&self.engine);
        let fp8_append = CaseResult {
            name: format!(
                "{SELF_CHECK}fp8 append codes: every f16 and bf16 value into e4m3 and e5m2, both launches"
            ),
            passed: codes.is_ok(),
            outcome: codes.map(|n| Comparison {
                rows: n,
                ..Comparison::default()
            }),
            oracle: Oracle::Exact,
            also: Vec::new(),
            backend_time: started.elapsed(),
        };
        vec![result, fp8_append]
    }
}

/// The background compile of [`CudaBackend::prepare`]: dropped (with the backend, or when a
/// later `prepare` replaces it), it stops and waits for the kernels being compiled.
struct StoppingCompile(Option<BackgroundCompile>);

impl Drop for StoppingCompile {
    fn drop(&mut self) {
        if let Some(compile) = self.0.take() {
            compile.stop_and_wait();
        }
    }
}

/// One line saying why a kernel failed to compile: NVRTC's first error line for a compile error
/// (its message's first line only names the kernel), else the message's first line.
fn first_line(e: &JitError) -> String {
    let line = match e {
        JitError::Compile { log, .. } => log
            .lines()
            .find(|l| l.contains("error"))
            .or_else(|| log.lines().find(|l| !l.trim().is_empty())),
        _ => None,
    };
    match line {
        Some(line) => line.trim().to_string(),
        None => e.to_string().lines().next().unwrap_or_default().to_string(),
    }
}

/// States given one by one (`[rows, heads, head_dim]` each) stored together:
/// `o [rows, n, heads, head_dim]`, `lse [rows, n, heads]`.
fn interleave(shape: MergeShape, states: &[(HostTensor, Vec<f32>)]) -> (HostTensor, HostTensor) {
    let dtype = states.first().map_or(DType::F32, |(o, _)| o.dtype());
    let row_o = shape.heads * shape.head_dim;
    let (mut o, mut lse) = (Vec::new(), Vec::new());
    let wide: Vec<Vec<f32>> = states.iter().map(|(o, _)| o.to_f32_vec()).collect();
    for r in 0..shape.rows {
        for (w, (_, l)) in wide.iter().zip(states) {
            o.extend_from_slice(&w[r * row_o..(r + 1) * row_o]);
            lse.extend_from_slice(&l[r * shape.heads..(r + 1) * shape.heads]);
        }
    }
    (
        HostTensor::from_f32(dtype, &o),
        HostTensor::from_f32(DType::F32, &lse),
    )
}

/// The widest row tile (most query rows) of a kernel with these head dims and QK accumulation
/// over K/V from `kv` that runs on a GPU of architecture `arch` ([`TileConfig::row_tiles_on`]):
/// the tile of long prefills, which the verify suite's widest-tile cases ask for.
fn widest_row_tile_on(
    dims: HeadDims,
    qk_accum: QkAccum,
    kv: KvCache,
    arch: Arch,
) -> Result<TileConfig, Error> {
    TileConfig::row_tiles_on(dims, qk_accum, kv, arch)
        .into_iter()
        .max_by_key(|t| t.cta_q())
        .ok_or_else(|| Error::Unsupported {
            backend: "cuda",
            what: format!("a row tile at head dims ({}, {})", dims.qk(), dims.vo()),
            supported: "head dims with one".into(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    // The widest row tile: 128 rows at head dim 128 (the wgmma twin on sm_90a); at head dim 256
    // over ragged K/V two warpgroups of 64 rows on sm_90a, the one-buffer 64-row tile elsewhere;
    // over a paged cache its one 32-key tile.
    #[test]
    fn the_widest_row_tile_is_the_long_prefill_tile_of_each_architecture() {
        let d = |n| HeadDims::new(n, n).expect("head dims");
        let label = |dims, kv, arch| {
            widest_row_tile_on(dims, QkAccum::F32, kv, arch)
                .expect("a row tile")
                .label()
        };
        assert_eq!(label(d(128), KvCache::Ragged, Arch::Sm80), "w4q2kv64");
        assert_eq!(label(d(128), KvCache::Paged, Arch::Sm90a), "w8q1kv64g");
        assert_eq!(label(d(256), KvCache::Ragged, Arch::Sm80), "w4q1kv64b1");
        assert_eq!(label(d(256), KvCache::Ragged, Arch::Sm90a), "w8q1kv64g");
        assert_eq!(label(d(256), KvCache::Paged, Arch::Sm90a), "w4q1kv32");
    }
}
