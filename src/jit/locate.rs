//! Finding libnvrtc on disk, so [`super::nvrtc::Nvrtc::load`] can open it by absolute path.
//!
//! Search order (the first match wins):
//! 1. `ATTNFORGE_NVRTC_LIB` (the library file) or `ATTNFORGE_CUDA_HOME` (a toolkit or wheel root
//!    holding `lib/libnvrtc.so*`). These are explicit: when set but wrong, the search stops with
//!    an error instead of quietly using some other NVRTC.
//! 2. `CUDA_HOME`, `CUDA_PATH`, `/usr/local/cuda`.
//! 3. The project-local wheel folder `.cache/cuda/site/nvidia/cu13` (what `scripts/test`
//!    installs), relative to the current directory and to every ancestor of the executable.
//! 4. `nvidia/cu13` (and `nvidia/cuda_nvrtc`, the CUDA 12 wheel layout) under Python
//!    site-packages: common install paths first, then, as the last resort, whatever
//!    `python3 -c 'import site; ...'` answers within [`PYTHON_TIMEOUT`].
//!
//! A root qualifies when its `lib/` (or `lib64/`) holds `libnvrtc.so*` and, beside it,
//! `libnvrtc-builtins.so*` (NVRTC opens the builtins itself at compile time). attnforge's
//! generated kernels include no toolkit headers, so the include directory is optional and only
//! reported for custom code that wants it.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::error::{JitError, SearchedPlace};

/// The project-local wheel root, relative to a project directory.
pub const LOCAL_WHEEL_ROOT: &str = ".cache/cuda/site/nvidia/cu13";
/// Wheel roots under a site-packages directory: CUDA 13 wheels, then CUDA 12's layout.
const SITE_WHEEL_ROOTS: [&str; 2] = ["nvidia/cu13", "nvidia/cuda_nvrtc"];
/// How long the last-resort `python3` query may take.
pub const PYTHON_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the `python3` child is polled while waiting for it.
const PYTHON_POLL: Duration = Duration::from_millis(10);
/// Library directories under a root.
const LIB_DIRS: [&str; 2] = ["lib", "lib64"];
const NVRTC_PREFIX: &str = "libnvrtc.so";
const BUILTINS_PREFIX: &str = "libnvrtc-builtins.so";

/// Where NVRTC was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvrtcLocation {
    /// Absolute path of `libnvrtc.so*`.
    pub lib: PathBuf,
    /// Absolute path of `libnvrtc-builtins.so*` beside it, when present.
    pub builtins: Option<PathBuf>,
    /// `<root>/include`, when it exists (only custom code that includes toolkit headers needs it).
    pub include_dir: Option<PathBuf>,
    /// Which rule found it, e.g. `ATTNFORGE_CUDA_HOME`.
    pub origin: String,
}

/// The inputs of a search; [`Search::from_process`] reads them from the running process, tests
/// build them by hand.
#[derive(Debug, Clone, Default)]
pub struct Search {
    /// Environment variables consulted (`ATTNFORGE_NVRTC_LIB`, `ATTNFORGE_CUDA_HOME`,
    /// `CUDA_HOME`, `CUDA_PATH`); absent ones are unset.
    pub env: Vec<(String, OsString)>,
    /// Fixed toolkit roots after the variables (`/usr/local/cuda`).
    pub system_roots: Vec<PathBuf>,
    /// Directories in which to look for [`LOCAL_WHEEL_ROOT`].
    pub project_dirs: Vec<PathBuf>,
    /// site-packages directories to look in before asking Python.
    pub site_packages: Vec<PathBuf>,
    /// Whether to ask `python3` for its site-packages as a last resort.
    pub ask_python: bool,
}

/// The variables consulted, in order.
const ENV_VARS: [&str; 4] = [
    "ATTNFORGE_NVRTC_LIB",
    "ATTNFORGE_CUDA_HOME",
    "CUDA_HOME",
    "CUDA_PATH",
];

impl Search {
    /// The search a normal run performs: this process's environment, current directory and
    /// executable location, the usual site-packages folders, and `python3` last.
    pub fn from_process() -> Self {
        let env = ENV_VARS
            .iter()
            .filter_map(|k| std::env::var_os(k).map(|v| (k.to_string(), v)))
            .collect();
        let mut project_dirs = Vec::new();
        if let Ok(cwd) = std::env::current_dir() {
            project_dirs.push(cwd);
        }
        if let Ok(exe) = std::env::current_exe() {
            project_dirs.extend(exe.ancestors().skip(1).map(Path::to_path_buf));
        }
        dedup_in_order(&mut project_dirs);
        Search {
            env,
            system_roots: vec![PathBuf::from("/usr/local/cuda")],
            project_dirs,
            site_packages: common_site_packages(),
            ask_python: true,
        }
    }

    fn var(&self, key: &str) -> Option<&OsString> {
        self.env.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// Runs the search.
    pub fn run(&self) -> Result<NvrtcLocation, JitError> {
        let mut searched = Vec::new();

        // 1. Explicit settings: authoritative when set.
        if let Some(lib) = self.var("ATTNFORGE_NVRTC_LIB") {
            let lib = PathBuf::from(lib);
            return explicit_lib(&lib).map_err(|outcome| JitError::NvrtcNotFound {
                searched: vec![SearchedPlace {
                    origin: "ATTNFORGE_NVRTC_LIB (explicit; nothing else searched)".into(),
                    path: lib,
                    outcome,
                }],
            });
        }
        searched.push(unset("ATTNFORGE_NVRTC_LIB"));
        if let Some(home) = self.var("ATTNFORGE_CUDA_HOME") {
            let home = PathBuf::from(home);
            return check_root(&home, "ATTNFORGE_CUDA_HOME").map_err(|outcome| {
                JitError::NvrtcNotFound {
                    searched: vec![SearchedPlace {
                        origin: "ATTNFORGE_CUDA_HOME (explicit; nothing else searched)".into(),
                        path: home,
                        outcome,
                    }],
                }
            });
        }
        searched.push(unset("ATTNFORGE_CUDA_HOME"));

        // 2. Conventional toolkit locations.
        for key in ["CUDA_HOME", "CUDA_PATH"] {
            match self.var(key) {
                Some(v) => {
                    if let Some(found) = try_root(Path::new(v), key, &mut searched) {
                        return Ok(found);
                    }
                }
                None => searched.push(unset(key)),
            }
        }
        for root in &self.system_roots {
            if let Some(found) = try_root(root, "system toolkit", &mut searched) {
                return Ok(found);
            }
        }

        // 3. Project-local wheels.
        for dir in &self.project_dirs {
            let root = dir.join(LOCAL_WHEEL_ROOT);
            if let Some(found) = try_root(&root, "project wheel folder", &mut searched) {
                return Ok(found);
            }
        }

        // 4. Python site-packages: known folders, then ask Python.
        for site in &self.site_packages {
            if let Some(found) = try_site(site, "site-packages", &mut searched) {
                return Ok(found);
            }
        }
        if self.ask_python {
            match python_site_packages() {
                Ok(dirs) => {
                    for site in dirs.iter().filter(|d| !self.site_packages.contains(d)) {
                        if let Some(found) = try_site(site, "python3 site-packages", &mut searched)
                        {
                            return Ok(found);
                        }
                    }
                }
                Err(why) => searched.push(SearchedPlace {
                    origin: "python3 site-packages".into(),
                    path: PathBuf::new(),
                    outcome: why,
                }),
            }
        }
        Err(JitError::NvrtcNotFound { searched })
    }
}

/// Finds NVRTC the way a normal run does ([`Search::from_process`]).
pub fn locate() -> Result<NvrtcLocation, JitError> {
    Search::from_process().run()
}

fn unset(key: &str) -> SearchedPlace {
    SearchedPlace {
        origin: key.into(),
        path: PathBuf::new(),
        outcome: "not set".into(),
    }
}

fn dedup_in_order(v: &mut Vec<PathBuf>) {
    let mut seen = std::collections::HashSet::new();
    v.retain(|p| seen.insert(p.clone()));
}

fn try_root(root: &Path, origin: &str, searched: &mut Vec<SearchedPlace>) -> Option<NvrtcLocation> {
    match check_root(root, origin) {
        Ok(found) => Some(found),
        Err(outcome) => {
            searched.push(SearchedPlace {
                origin: origin.into(),
                path: root.to_path_buf(),
                outcome,
            });
            None
        }
    }
}

fn try_site(site: &Path, origin: &str, searched: &mut Vec<SearchedPlace>) -> Option<NvrtcLocation> {
    SITE_WHEEL_ROOTS
        .iter()
        .find_map(|sub| try_root(&site.join(sub), origin, searched))
}

/// Checks one root; `Err` carries why it does not qualify.
fn check_root(root: &Path, origin: &str) -> Result<NvrtcLocation, String> {
    if !root.is_dir() {
        return Err("no such directory".into());
    }
    let root = absolute(root)?;
    let mut why = format!("no {}/{NVRTC_PREFIX}*", LIB_DIRS.join("|"));
    for lib_dir in LIB_DIRS.iter().map(|d| root.join(d)) {
        let Some(lib) = find_prefixed(&lib_dir, NVRTC_PREFIX) else {
            continue;
        };
        let Some(builtins) = find_prefixed(&lib_dir, BUILTINS_PREFIX) else {
            why = format!(
                "{} found but no {BUILTINS_PREFIX}* beside it (NVRTC needs both)",
                lib.display()
            );
            continue;
        };
        let include = root.join("include");
        return Ok(NvrtcLocation {
            lib,
            builtins: Some(builtins),
            include_dir: include.is_dir().then_some(include),
            origin: origin.into(),
        });
    }
    Err(why)
}

fn explicit_lib(lib: &Path) -> Result<NvrtcLocation, String> {
    if !lib.is_file() {
        return Err("no such file".into());
    }
    let lib = absolute(lib)?;
    let dir = lib.parent().map(Path::to_path_buf).unwrap_or_default();
    let include = dir
        .parent()
        .map(|r| r.join("include"))
        .filter(|p| p.is_dir());
    Ok(NvrtcLocation {
        builtins: find_prefixed(&dir, BUILTINS_PREFIX),
        lib,
        include_dir: include,
        origin: "ATTNFORGE_NVRTC_LIB".into(),
    })
}

fn absolute(p: &Path) -> Result<PathBuf, String> {
    std::path::absolute(p).map_err(|e| format!("cannot make the path absolute: {e}"))
}

/// The best file in `dir` whose name starts with `prefix`: the plain name first, then versioned
/// names (`.so.13` before `.so.13.0`), skipping the `.alt.` variants and the builtins when looking
/// for libnvrtc itself.
fn find_prefixed(dir: &Path, prefix: &str) -> Option<PathBuf> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_file())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with(prefix))
        .collect();
    names.sort_by_key(|n| (n.len(), n.clone()));
    names.first().map(|n| dir.join(n))
}

/// site-packages directories at the usual places, without running Python.
fn common_site_packages() -> Vec<PathBuf> {
    let mut lib_dirs = vec![PathBuf::from("/usr/local/lib"), PathBuf::from("/usr/lib")];
    if let Some(home) = dirs::home_dir() {
        lib_dirs.insert(0, home.join(".local/lib"));
    }
    let mut out = Vec::new();
    for lib in lib_dirs {
        let Ok(entries) = std::fs::read_dir(&lib) else {
            continue;
        };
        let mut pythons: Vec<PathBuf> = entries
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
            .map(|e| e.path())
            .collect();
        pythons.sort();
        for py in pythons {
            for sub in ["site-packages", "dist-packages"] {
                let p = py.join(sub);
                if p.is_dir() {
                    out.push(p);
                }
            }
        }
    }
    out
}

/// Asks `python3` for its site-packages (system and user), giving up after [`PYTHON_TIMEOUT`].
fn python_site_packages() -> Result<Vec<PathBuf>, String> {
    const SCRIPT: &str = "import site\n\
        print('\\n'.join(site.getsitepackages() + [site.getusersitepackages()]))";
    let mut child = Command::new("python3")
        .args(["-c", SCRIPT])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot run python3: {e}"))?;
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if start.elapsed() < PYTHON_TIMEOUT => std::thread::sleep(PYTHON_POLL),
            Ok(None) => {
                // Best effort: the child is abandoned either way.
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("python3 did not answer within {PYTHON_TIMEOUT:?}"));
            }
            Err(e) => return Err(format!("waiting for python3 failed: {e}")),
        }
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("reading python3's answer failed: {e}"))?;
    if !out.status.success() {
        return Err(format!("python3 exited with {}", out.status));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(PathBuf::from)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_root(dir: &Path, with_builtins: bool) -> PathBuf {
        let lib = dir.join("lib");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::write(lib.join("libnvrtc.so.13"), b"").unwrap();
        std::fs::write(lib.join("libnvrtc.alt.so.13"), b"").unwrap();
        if with_builtins {
            std::fs::write(lib.join("libnvrtc-builtins.so.13.0"), b"").unwrap();
        }
        dir.to_path_buf()
    }

    fn bare() -> Search {
        Search::default()
    }

    #[test]
    fn explicit_home_wins_and_picks_the_plain_library() {
        let t = tempfile::tempdir().unwrap();
        let root = fake_root(t.path(), true);
        let mut s = bare();
        s.env
            .push(("ATTNFORGE_CUDA_HOME".into(), root.clone().into()));
        let found = s.run().unwrap();
        assert_eq!(found.lib, root.join("lib/libnvrtc.so.13"));
        assert_eq!(
            found.builtins,
            Some(root.join("lib/libnvrtc-builtins.so.13.0"))
        );
        assert_eq!(found.origin, "ATTNFORGE_CUDA_HOME");
    }

    #[test]
    fn a_wrong_explicit_home_is_an_error_not_a_fallback() {
        let t = tempfile::tempdir().unwrap();
        let good = fake_root(&t.path().join("good"), true);
        let mut s = bare();
        s.env.push((
            "ATTNFORGE_CUDA_HOME".into(),
            t.path().join("missing").into(),
        ));
        s.system_roots.push(good);
        let err = s.run().unwrap_err().to_string();
        assert!(err.contains("ATTNFORGE_CUDA_HOME (explicit"), "{err}");
        assert!(err.contains("no such directory"), "{err}");
        assert!(
            err.contains("pip install nvidia-cuda-nvrtc==13.0.88"),
            "{err}"
        );
    }

    #[test]
    fn missing_builtins_disqualify_a_root_and_are_reported() {
        let t = tempfile::tempdir().unwrap();
        let root = fake_root(t.path(), false);
        let mut s = bare();
        s.system_roots.push(root);
        let err = s.run().unwrap_err().to_string();
        assert!(err.contains("no libnvrtc-builtins.so* beside it"), "{err}");
    }

    #[test]
    fn project_wheel_folder_and_site_packages_are_searched_in_order() {
        let t = tempfile::tempdir().unwrap();
        let project = t.path().join("proj");
        fake_root(&project.join(LOCAL_WHEEL_ROOT), true);
        let site = t.path().join("site");
        fake_root(&site.join("nvidia/cu13"), true);
        let mut s = bare();
        s.project_dirs.push(t.path().join("elsewhere"));
        s.project_dirs.push(project.clone());
        s.site_packages.push(site.clone());
        assert_eq!(s.run().unwrap().origin, "project wheel folder");
        s.project_dirs.clear();
        let found = s.run().unwrap();
        assert_eq!(found.origin, "site-packages");
        assert_eq!(found.lib, site.join("nvidia/cu13/lib/libnvrtc.so.13"));
    }

    #[test]
    fn not_found_lists_every_place() {
        let t = tempfile::tempdir().unwrap();
        let mut s = bare();
        s.env.push(("CUDA_HOME".into(), t.path().join("a").into()));
        s.system_roots.push(t.path().join("b"));
        s.project_dirs.push(t.path().join("c"));
        s.site_packages.push(t.path().join("d"));
        let JitError::NvrtcNotFound { searched } = s.run().unwrap_err() else {
            panic!("wrong error kind");
        };
        let origins: Vec<&str> = searched.iter().map(|p| p.origin.as_str()).collect();
        assert_eq!(
            origins,
            [
                "ATTNFORGE_NVRTC_LIB",
                "ATTNFORGE_CUDA_HOME",
                "CUDA_HOME",
                "CUDA_PATH",
                "system toolkit",
                "project wheel folder",
                "site-packages",
                "site-packages"
            ]
        );
    }

    #[test]
    fn explicit_library_file() {
        let t = tempfile::tempdir().unwrap();
        let root = fake_root(t.path(), true);
        let mut s = bare();
        let lib = root.join("lib/libnvrtc.so.13");
        s.env
            .push(("ATTNFORGE_NVRTC_LIB".into(), lib.clone().into()));
        let found = s.run().unwrap();
        assert_eq!(found.lib, lib);
        assert!(found.builtins.is_some());
    }
}
