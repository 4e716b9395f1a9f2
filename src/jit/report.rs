//! Parsing ptxas' `-v` resource report out of an NVRTC program log.
//!
//! With `--ptxas-options=-v`, NVRTC 13 appends lines like these (real output, sm_90a):
//!
//! ```text
//! ptxas info    : Compiling entry function 'heavy' for 'sm_90a'
//! ptxas info    : Function properties for heavy
//! ptxas         .     1592 bytes stack frame, 3172 bytes spill stores, 4148 bytes spill loads
//! ptxas info    : Used 32 registers, used 0 barriers, 1592 bytes cumulative stack size
//! ```
//!
//! On sm_90a ptxas also says when it could not pipeline a function's warpgroup MMAs and issued
//! each one only after the one before had completed (real output, NVRTC 13.0):
//!
//! ```text
//! ptxas info    : (C7512) Potential Performance Loss: wgmma.mma_async instructions are serialized due to insufficient register resources for the function 'k'
//! ```
//!
//! "Function properties" blocks also appear for non-inlined device functions (mangled names);
//! their spills count towards the program's total, since they run inside the kernel. The
//! `Used ...` line belongs to the entry function announced last.

use serde::Serialize;

/// What ptxas reported for one function.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct FunctionResources {
    /// The (possibly mangled) function name.
    pub name: String,
    /// Whether it is a kernel entry point (`Compiling entry function`).
    pub is_entry: bool,
    /// Registers per thread (entries only).
    pub registers: u32,
    /// Named barriers used (entries only).
    pub barriers: u32,
    /// Static shared memory in bytes (entries only; dynamic shared memory is a launch setting).
    pub shared_bytes: u64,
    /// Constant bank 0 bytes (kernel parameters and constants).
    pub constant_bytes: u64,
    /// Stack frame bytes per thread.
    pub stack_frame_bytes: u64,
    /// Bytes stored to local memory because registers ran out.
    pub spill_store_bytes: u64,
    /// Bytes loaded back from those spills.
    pub spill_load_bytes: u64,
    /// Why ptxas serialized the function's wgmma instructions, when it did (its own words, e.g.
    /// `insufficient register resources`).
    pub wgmma_serialized: Option<String>,
}

/// The resources of one compiled kernel: its entry function's figures, plus spill totals over
/// every function in the program.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ResourceReport {
    /// The entry function's name.
    pub entry: String,
    /// Registers per thread of the entry.
    pub registers: u32,
    /// Named barriers of the entry.
    pub barriers: u32,
    /// Static shared memory of the entry, bytes.
    pub shared_bytes: u64,
    /// Stack frame of the entry, bytes per thread.
    pub stack_frame_bytes: u64,
    /// Spill stores summed over all functions, bytes.
    pub spill_store_bytes: u64,
    /// Spill loads summed over all functions, bytes.
    pub spill_load_bytes: u64,
    /// Why ptxas serialized the entry's wgmma instructions, when it did: each waits for the one
    /// before to complete, a performance loss the kernel's figures above do not show.
    pub wgmma_serialized: Option<String>,
    /// Every function ptxas reported, in log order.
    pub functions: Vec<FunctionResources>,
}

impl ResourceReport {
    /// Whether any function spills registers.
    pub fn spills(&self) -> bool {
        self.spill_store_bytes > 0 || self.spill_load_bytes > 0
    }

    /// Builds the report for `entry` from parsed functions; `None` when ptxas compiled no entry
    /// function of that name.
    pub fn for_entry(entry: &str, functions: Vec<FunctionResources>) -> Option<ResourceReport> {
        let e = functions
            .iter()
            .find(|f| f.is_entry && f.name == entry)?
            .clone();
        Some(ResourceReport {
            entry: e.name,
            registers: e.registers,
            barriers: e.barriers,
            shared_bytes: e.shared_bytes,
            stack_frame_bytes: e.stack_frame_bytes,
            spill_store_bytes: functions.iter().map(|f| f.spill_store_bytes).sum(),
            spill_load_bytes: functions.iter().map(|f| f.spill_load_bytes).sum(),
            wgmma_serialized: e.wgmma_serialized,
            functions,
        })
    }
}

const ENTRY_MARKER: &str = "Compiling entry function '";
const PROPERTIES_MARKER: &str = "Function properties for ";
const USED_MARKER: &str = "Used ";
const SERIALIZED_MARKER: &str = "wgmma.mma_async instructions are serialized due to ";

/// Parses every function's figures from a program log, in log order. Lines that are not part
/// of ptxas' report are ignored.
pub fn parse(log: &str) -> Vec<FunctionResources> {
    let mut out: Vec<FunctionResources> = Vec::new();
    // Index in `out` of the function the next "stack frame" line and "Used" line belong to.
    let mut properties_of: Option<usize> = None;
    let mut current_entry: Option<usize> = None;
    for line in log.lines().filter(|l| l.starts_with("ptxas")) {
        if let Some(rest) = after(line, SERIALIZED_MARKER) {
            if let Some((reason, name)) = serialization(rest) {
                let i = index_of(&mut out, name);
                out[i].wgmma_serialized = Some(reason.to_string());
            }
        } else if let Some(rest) = after(line, ENTRY_MARKER) {
            let name = rest.split('\'').next().unwrap_or_default();
            let i = index_of(&mut out, name);
            out[i].is_entry = true;
            current_entry = Some(i);
        } else if let Some(rest) = after(line, PROPERTIES_MARKER) {
            properties_of = Some(index_of(&mut out, rest.trim()));
        } else if line.contains("bytes stack frame") {
            if let Some(i) = properties_of {
                let f = &mut out[i];
                for (value, what) in figures(line) {
                    match what {
                        "bytes stack frame" => f.stack_frame_bytes = value,
                        "bytes spill stores" => f.spill_store_bytes = value,
                        "bytes spill loads" => f.spill_load_bytes = value,
                        _ => {}
                    }
                }
            }
        } else if let (Some(rest), Some(i)) = (after(line, USED_MARKER), current_entry) {
            let f = &mut out[i];
            for (value, what) in figures(&format!("{USED_MARKER}{rest}")) {
                match what {
                    "registers" => f.registers = saturate(value),
                    "barriers" => f.barriers = saturate(value),
                    "bytes smem" => f.shared_bytes = value,
                    "bytes cmem[0]" => f.constant_bytes = value,
                    _ => {}
                }
            }
        }
    }
    out
}

/// The reason and the function of a wgmma serialization note, from the text after "serialized
/// due to ": `insufficient register resources for the function 'k'` gives the reason and `k`
/// (ptxas words some reasons "... in the function 'k'").
fn serialization(rest: &str) -> Option<(&str, &str)> {
    let (reason, name) = rest.rsplit_once(" the function '")?;
    let name = name.strip_suffix('\'')?;
    let reason = reason
        .strip_suffix(" for")
        .or_else(|| reason.strip_suffix(" in"))
        .unwrap_or(reason);
    Some((reason, name))
}

fn saturate(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

fn after<'a>(line: &'a str, marker: &str) -> Option<&'a str> {
    line.find(marker).map(|i| &line[i + marker.len()..])
}

fn index_of(out: &mut Vec<FunctionResources>, name: &str) -> usize {
    if let Some(i) = out.iter().position(|f| f.name == name) {
        return i;
    }
    out.push(FunctionResources {
        name: name.to_string(),
        ..Default::default()
    });
    out.len() - 1
}

/// Splits the comma-separated part after the last `:` or `.` column marker into
/// `(number, unit)` pairs: `Used 10 registers, used 1 barriers, 1024 bytes smem` gives
/// `(10, "registers"), (1, "barriers"), (1024, "bytes smem")`.
fn figures(text: &str) -> Vec<(u64, &str)> {
    text.split(',')
        .filter_map(|part| {
            let mut words = part
                .split_whitespace()
                .skip_while(|w| w.parse::<u64>().is_err());
            let value = words.next()?.parse::<u64>().ok()?;
            let unit_start = part.find(words.clone().next()?)?;
            Some((value, part[unit_start..].trim()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Real NVRTC 13.0 output for two kernels (one with a static shared tile, one calling a
    /// non-inlined device function with a local array), sm_80.
    const TWO_KERNELS: &str = "ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'spill' for 'sm_80'
ptxas info    : Function properties for spill
ptxas         .     256 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, used 0 barriers, 256 bytes cumulative stack size, 364 bytes cmem[0]
ptxas info    : Compile time = 6.994 ms
ptxas info    : Function properties for _Z3bigPfi
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'add' for 'sm_80'
ptxas info    : Function properties for add
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 10 registers, used 1 barriers, 1024 bytes smem, 372 bytes cmem[0]
ptxas info    : Compile time = 1.606 ms
";

    /// Real NVRTC 13.0 output, sm_90a, a kernel forced to spill by `__launch_bounds__`.
    const SPILLING: &str = "ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'heavy' for 'sm_90a'
ptxas info    : Function properties for heavy
ptxas         .     1592 bytes stack frame, 3172 bytes spill stores, 4148 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers, 1592 bytes cumulative stack size
ptxas info    : Compile time = 184.187 ms
";

    #[test]
    fn entries_and_device_functions() {
        let fs = parse(TWO_KERNELS);
        assert_eq!(fs.len(), 3);
        let add = ResourceReport::for_entry("add", fs.clone()).unwrap();
        assert_eq!(
            (
                add.registers,
                add.barriers,
                add.shared_bytes,
                add.stack_frame_bytes
            ),
            (10, 1, 1024, 0)
        );
        assert_eq!(add.functions[2].constant_bytes, 372);
        let spill = ResourceReport::for_entry("spill", fs.clone()).unwrap();
        assert_eq!(
            (spill.registers, spill.stack_frame_bytes, spill.shared_bytes),
            (40, 256, 0)
        );
        assert!(!spill.spills());
        let dev = fs.iter().find(|f| f.name == "_Z3bigPfi").unwrap();
        assert!(!dev.is_entry);
        assert!(ResourceReport::for_entry("_Z3bigPfi", fs).is_none());
    }

    #[test]
    fn spills() {
        let r = ResourceReport::for_entry("heavy", parse(SPILLING)).unwrap();
        assert_eq!(r.registers, 32);
        assert_eq!(r.stack_frame_bytes, 1592);
        assert_eq!((r.spill_store_bytes, r.spill_load_bytes), (3172, 4148));
        assert!(r.spills());
    }

    /// Real NVRTC 13.0 output, sm_90a, for a prefill kernel whose wgmma ptxas serialized (the log
    /// of attnforge_prefill_f16_of16_qkf32_d128x128_none_none_ragged_w8q1kv64g at f93fea4, names
    /// shortened). The last line is not captured output: it is written after ptxas' wording of
    /// another reason ("... in the function"), to check that form too.
    const SERIALIZED: &str = "ptxas info    : (C7512) Potential Performance Loss: wgmma.mma_async instructions are serialized due to insufficient register resources for the function 'k'
ptxas info    : 229 bytes gmem
ptxas info    : Compiling entry function 'k_merge' for 'sm_90a'
ptxas info    : Function properties for k_merge
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 72 registers, used 0 barriers
ptxas info    : Compiling entry function 'k' for 'sm_90a'
ptxas info    : Function properties for k
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 126 registers, used 1 barriers
ptxas info    : (C7510) Potential Performance Loss: wgmma.mma_async instructions are serialized due to the presence of Extern calls in the function 'other'
";

    #[test]
    fn serialized_wgmma_is_reported_for_its_function() {
        let fs = parse(SERIALIZED);
        let k = ResourceReport::for_entry("k", fs.clone()).unwrap();
        assert_eq!(k.registers, 126);
        assert_eq!(
            k.wgmma_serialized.as_deref(),
            Some("insufficient register resources")
        );
        let merge = ResourceReport::for_entry("k_merge", fs.clone()).unwrap();
        assert_eq!(merge.wgmma_serialized, None);
        let other = fs.iter().find(|f| f.name == "other").unwrap();
        assert_eq!(
            other.wgmma_serialized.as_deref(),
            Some("the presence of Extern calls")
        );
        assert_eq!(
            ResourceReport::for_entry("add", parse(TWO_KERNELS))
                .unwrap()
                .wgmma_serialized,
            None
        );
    }

    #[test]
    fn non_report_lines_are_ignored() {
        assert!(parse("kernel.cu(3): warning #177-D: variable \"z\" was declared\n").is_empty());
    }
}
