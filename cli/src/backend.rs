//! Choosing a backend on the command line. The backends themselves live in the library
//! (`attnforge::cpu::CpuBackend`, `attnforge::cuda::CudaBackend`) behind
//! `attnforge::verify::Backend`.
//!
//! Choosing a backend that cannot run here is an error that says why; nothing ever falls back to
//! another backend silently. Only the default (no `--backend`) looks for the best one present.

use attnforge::codegen::TileConfig;
use attnforge::cpu::CpuBackend;
use attnforge::cuda::{driver_present, CudaBackend, SplitChoice};
use attnforge::jit::Arch;
use attnforge::verify::Backend;

/// A backend named on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendKind {
    /// The fast CPU backend (tiled online softmax, rayon).
    Cpu,
    /// The CUDA backend (NVRTC-compiled kernels).
    Cuda,
}

impl BackendKind {
    /// The best backend present: the GPU when a CUDA driver is installed, else the CPU. (With a
    /// driver but no working GPU or NVRTC, opening it fails with the reason.)
    pub fn best() -> BackendKind {
        if driver_present().is_ok() {
            BackendKind::Cuda
        } else {
            BackendKind::Cpu
        }
    }

    /// The backend itself, or why it cannot be had.
    pub fn open(self) -> Result<Box<dyn Backend>, String> {
        self.open_with_tiles_of(None)
    }

    /// [`open`](Self::open), the CUDA backend planning the tiles of `tiles_of` rather than the
    /// device's (`None`: the device's); a CPU backend with `tiles_of` is an error (it has one
    /// tiling).
    pub fn open_with_tiles_of(self, tiles_of: Option<Arch>) -> Result<Box<dyn Backend>, String> {
        self.open_with(tiles_of, None, None)
    }

    /// [`open_with_tiles_of`](Self::open_with_tiles_of), the CUDA backend computing every
    /// problem with `tile` when one is given and splitting every KV range into chunks of
    /// `split_keys` keys when that is given (a CPU backend with either is an error).
    pub fn open_with(
        self,
        tiles_of: Option<Arch>,
        tile: Option<TileConfig>,
        split_keys: Option<usize>,
    ) -> Result<Box<dyn Backend>, String> {
        if let (BackendKind::Cpu, Some(tile)) = (self, tile) {
            return Err(format!(
                "--tile {} is a GPU tile; the cpu backend has none (use --backend cuda)",
                tile.label()
            ));
        }
        if let (BackendKind::Cpu, Some(keys)) = (self, split_keys) {
            return Err(format!(
                "--split-keys {keys} splits GPU plans; the cpu backend has none (use --backend cuda)"
            ));
        }
        match (self, tiles_of) {
            (BackendKind::Cpu, None) => Ok(Box::new(CpuBackend::detect())),
            (BackendKind::Cpu, Some(arch)) => Err(format!(
                "--tiles-of {} plans GPU tiles; the cpu backend has none (use --backend cuda)",
                arch.name()
            )),
            (BackendKind::Cuda, tiles_of) => {
                let backend = CudaBackend::new(0)
                    .map_err(|e| format!("the cuda backend is not available: {e}"))?;
                let backend = match tiles_of {
                    Some(arch) => backend.with_tiles_of(arch).map_err(|e| e.to_string())?,
                    None => backend,
                };
                let backend = match tile {
                    Some(tile) => backend.with_tile(tile),
                    None => backend,
                };
                let backend = match split_keys {
                    Some(keys) => backend.with_split(SplitChoice::ChunkKeys(keys)),
                    None => backend,
                };
                Ok(Box::new(backend))
            }
        }
    }
}

/// A tile named on the command line (`--tile w8q1kv64g`, `--tile ws4q1kv64`).
pub fn parse_tile(s: &str) -> Result<TileConfig, String> {
    TileConfig::parse(s).ok_or_else(|| {
        format!(
            "{s:?} is not a tile like w4q2kv64 (warps, m16 tiles per warp, keys) or ws4q1kv64 (warp-specialised: K/V stages, keys 64 or 128)"
        )
    })
}

/// An architecture named on the command line (`--tiles-of sm_80`).
pub fn parse_arch(s: &str) -> Result<Arch, String> {
    Arch::parse(s).map_err(|e| e.to_string())
}
