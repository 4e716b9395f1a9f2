//! The GPU architectures attnforge compiles CUBIN for.
//!
//! CUBIN is tied to one architecture, so the architecture is part of every compile and every
//! cache key. On a 9.0 device attnforge targets `sm_90a`, not `sm_90`, so that Hopper-only
//! instructions (wgmma, TMA) are available; `sm_90a` CUBIN runs on 9.0 devices only.

use std::fmt;

use super::error::JitError;

/// A compilation target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Arch {
    /// Ampere data-centre (A100): compute capability 8.0.
    Sm80,
    /// Ampere consumer (RTX 30xx, A40): 8.6.
    Sm86,
    /// Ada (RTX 40xx, L4, L40): 8.9.
    Sm89,
    /// Hopper (H100, H200) with the architecture-specific features: 9.0.
    Sm90a,
}

impl Arch {
    /// Every supported target, oldest first.
    pub const ALL: [Arch; 4] = [Arch::Sm80, Arch::Sm86, Arch::Sm89, Arch::Sm90a];

    /// The `sm_XX` name NVRTC's `--gpu-architecture` takes.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Sm80 => "sm_80",
            Arch::Sm86 => "sm_86",
            Arch::Sm89 => "sm_89",
            Arch::Sm90a => "sm_90a",
        }
    }

    /// The compute capability `(major, minor)` this target runs on.
    pub fn compute_capability(self) -> (u32, u32) {
        match self {
            Arch::Sm80 => (8, 0),
            Arch::Sm86 => (8, 6),
            Arch::Sm89 => (8, 9),
            Arch::Sm90a => (9, 0),
        }
    }

    /// Shared memory of one SM that resident CTAs can share, in bytes (the CUDA programming
    /// guide's table: 164 KB on 8.0, 100 KB on 8.6 and 8.9, 228 KB on 9.0).
    pub fn shared_memory_per_sm(self) -> u32 {
        match self {
            Arch::Sm80 => 164 * 1024,
            Arch::Sm86 | Arch::Sm89 => 100 * 1024,
            Arch::Sm90a => 228 * 1024,
        }
    }

    /// Shared memory the driver reserves for each resident CTA, in bytes.
    pub const RESERVED_SHARED_MEMORY_PER_CTA: u32 = 1024;

    /// How many CTAs using `smem_bytes` of dynamic shared memory fit on one SM at once, by
    /// shared memory alone (at least 1: a CTA that needs more does not launch at all).
    pub fn ctas_per_sm_by_shared_memory(self, smem_bytes: u32) -> u32 {
        (self.shared_memory_per_sm() / (smem_bytes + Self::RESERVED_SHARED_MEMORY_PER_CTA)).max(1)
    }

    /// The `__CUDA_ARCH__` value of device code compiled for this target.
    pub fn cuda_arch_macro(self) -> u32 {
        let (major, minor) = self.compute_capability();
        major * 100 + minor * 10
    }

    /// The target for a device of compute capability `major.minor` (9.0 maps to `sm_90a`).
    pub fn from_compute_capability(major: u32, minor: u32) -> Result<Arch, JitError> {
        Arch::ALL
            .into_iter()
            .find(|a| a.compute_capability() == (major, minor))
            .ok_or_else(|| JitError::UnsupportedArch {
                value: format!("compute capability {major}.{minor}"),
                supported: supported_list(),
            })
    }

    /// Parses `sm_80`, `sm_86`, `sm_89`, `sm_90a` (also `sm_90`, read as `sm_90a`, and the
    /// spellings `80`, `8.0`).
    pub fn parse(s: &str) -> Result<Arch, JitError> {
        let t = s.trim().to_ascii_lowercase();
        let digits = t.strip_prefix("sm_").unwrap_or(&t).replace('.', "");
        let arch = match digits.as_str() {
            "80" => Some(Arch::Sm80),
            "86" => Some(Arch::Sm86),
            "89" => Some(Arch::Sm89),
            "90" | "90a" => Some(Arch::Sm90a),
            _ => None,
        };
        arch.ok_or_else(|| JitError::UnsupportedArch {
            value: s.to_string(),
            supported: supported_list(),
        })
    }

    /// Parses a comma-separated list, e.g. `sm_90a,sm_80`; duplicates are dropped, order kept.
    pub fn parse_list(s: &str) -> Result<Vec<Arch>, JitError> {
        let mut out = Vec::new();
        for part in s.split(',').filter(|p| !p.trim().is_empty()) {
            let a = Arch::parse(part)?;
            if !out.contains(&a) {
                out.push(a);
            }
        }
        if out.is_empty() {
            return Err(JitError::UnsupportedArch {
                value: s.to_string(),
                supported: supported_list(),
            });
        }
        Ok(out)
    }
}

fn supported_list() -> String {
    Arch::ALL.map(Arch::name).join(", ")
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_memory_bounds_resident_ctas() {
        // The D=128 128-row tile (96 KB): two on Hopper, one on A100 and Ada.
        let wide = 96 * 1024;
        assert_eq!(Arch::Sm90a.ctas_per_sm_by_shared_memory(wide), 2);
        assert_eq!(Arch::Sm80.ctas_per_sm_by_shared_memory(wide), 1);
        assert_eq!(Arch::Sm89.ctas_per_sm_by_shared_memory(wide), 1);
        // The 1 KB the driver reserves per CTA counts: 3 x (76 + 1) KB do not fit in 228 KB.
        assert_eq!(Arch::Sm90a.ctas_per_sm_by_shared_memory(76 * 1024), 2);
        assert_eq!(Arch::Sm90a.ctas_per_sm_by_shared_memory(75 * 1024), 3);
        // A CTA larger than the SM's memory still counts as one (its launch fails elsewhere).
        assert_eq!(Arch::Sm86.ctas_per_sm_by_shared_memory(200 * 1024), 1);
        assert_eq!(Arch::Sm90a.cuda_arch_macro(), 900);
        assert_eq!(Arch::Sm86.cuda_arch_macro(), 860);
    }

    #[test]
    fn hopper_maps_to_sm_90a() {
        assert_eq!(Arch::from_compute_capability(9, 0).unwrap(), Arch::Sm90a);
        assert_eq!(Arch::from_compute_capability(8, 9).unwrap(), Arch::Sm89);
        let e = Arch::from_compute_capability(7, 5).unwrap_err().to_string();
        assert!(e.contains("7.5") && e.contains("sm_90a"), "{e}");
    }

    #[test]
    fn parse_round_trips_and_rejects() {
        for a in Arch::ALL {
            assert_eq!(Arch::parse(a.name()).unwrap(), a);
        }
        assert_eq!(Arch::parse("sm_90").unwrap(), Arch::Sm90a);
        assert_eq!(
            Arch::parse_list("sm_90a, sm_80,sm_90a").unwrap(),
            vec![Arch::Sm90a, Arch::Sm80]
        );
        assert!(Arch::parse("sm_75").is_err());
        assert!(Arch::parse_list(",").is_err());
    }
}
