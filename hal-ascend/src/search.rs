//! Where each vendor library is looked for, in what order, and what a failed search reports.
//!
//! The search reads the environment only through a lookup function handed in by the caller
//! ([`process_env`] in production, a map in tests), so it can be tested without touching the
//! process environment.
//!
//! Order, for each library:
//!
//! 1. the explicit path in the library's override variable (`TASKD_HCCL_LIBRARY`,
//!    `TASKD_ACL_LIBRARY`, `TASKD_DCMI_LIBRARY`). When it is set it is the **only** candidate:
//!    an operator who names a file wants that file, and falling back to another copy would hide
//!    a typo or load a second HCCL next to the framework's;
//! 2. `$ASCEND_HOME_PATH/lib64/<file>`;
//! 3. `$ASCEND_TOOLKIT_HOME/lib64/<file>`. These are where CANN puts HCCL and ACL. DCMI is not
//!    part of CANN (the NPU driver installs it, see 5.); the two candidates are tried for it
//!    too, for installs that copy it next to the toolkit, but a standard node has no
//!    `libdcmi.so` there;
//! 4. the plain file name, resolved by the dynamic loader (`LD_LIBRARY_PATH`, `ld.so.cache`,
//!    the `DT_RUNPATH` of the executable, the system directories);
//! 5. for DCMI only, the places the driver and `npu-smi` install it, which are often not on the
//!    loader path: `/usr/local/dcmi/libdcmi.so` (the directory the Ascend driver samples point
//!    `LD_LIBRARY_PATH` at: cann/driver `examples/dcmi/README_en.md`, "Environment
//!    Preparation") and `/usr/local/Ascend/driver/lib64/driver/libdcmi.so` (the driver's
//!    user-mode library directory).
//!
//! An empty variable counts as unset.

use std::fmt;
use std::path::PathBuf;

pub use taskd_core::env::{process_env, EnvLookup, ASCEND_HOME_PATH, ASCEND_TOOLKIT_HOME};

/// One vendor library: its file name, its override variable and any extra known locations.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct LibrarySpec {
    /// File name handed to the loader, e.g. `libhccl.so`.
    pub file_name: &'static str,
    /// The variable holding an explicit path, e.g. `TASKD_HCCL_LIBRARY`.
    pub override_var: &'static str,
    /// Absolute paths tried after the loader's default path.
    pub well_known: &'static [&'static str],
}

/// HCCL, the collective communication library (`libhccl.so`, part of CANN).
pub const HCCL: LibrarySpec = LibrarySpec {
    file_name: "libhccl.so",
    override_var: taskd_core::env::TASKD_HCCL_LIBRARY,
    well_known: &[],
};

/// ACL, the Ascend runtime (`libascendcl.so`, part of CANN).
pub const ACL: LibrarySpec = LibrarySpec {
    file_name: "libascendcl.so",
    override_var: taskd_core::env::TASKD_ACL_LIBRARY,
    well_known: &[],
};

/// DCMI, the device management library (`libdcmi.so`, shipped with the NPU driver and npu-smi).
pub const DCMI: LibrarySpec = LibrarySpec {
    file_name: "libdcmi.so",
    override_var: taskd_core::env::TASKD_DCMI_LIBRARY,
    well_known: &[
        "/usr/local/dcmi/libdcmi.so",
        "/usr/local/Ascend/driver/lib64/driver/libdcmi.so",
    ],
};

/// Why a path is a candidate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The explicit override variable, by name.
    Override(&'static str),
    /// `$ASCEND_HOME_PATH/lib64`.
    AscendHomePath,
    /// `$ASCEND_TOOLKIT_HOME/lib64`.
    AscendToolkitHome,
    /// The plain file name, resolved by the dynamic loader.
    LoaderDefault,
    /// A documented install location of the vendor.
    WellKnown,
    /// A path handed to an `open_path` function by the caller.
    Caller,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Override(var) => write!(f, "${var}"),
            Origin::AscendHomePath => write!(f, "${ASCEND_HOME_PATH}/lib64"),
            Origin::AscendToolkitHome => write!(f, "${ASCEND_TOOLKIT_HOME}/lib64"),
            Origin::LoaderDefault => f.write_str("dynamic loader search path"),
            Origin::WellKnown => f.write_str("vendor install location"),
            Origin::Caller => f.write_str("path given by the caller"),
        }
    }
}

/// One path the search tries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// What is handed to the loader: absolute, or a bare file name for the loader to resolve.
    pub path: PathBuf,
    /// Which rule of the search order produced it, so a failure report says why it was tried.
    pub origin: Origin,
}

/// The candidates for `spec`, in the order they are tried.
pub fn candidates(spec: &LibrarySpec, env: EnvLookup<'_>) -> Vec<Candidate> {
    let set = |name: &str| env(name).filter(|v| !v.is_empty());
    if let Some(explicit) = set(spec.override_var) {
        return vec![Candidate {
            path: PathBuf::from(explicit),
            origin: Origin::Override(spec.override_var),
        }];
    }
    let mut out = Vec::new();
    for (var, origin) in [
        (ASCEND_HOME_PATH, Origin::AscendHomePath),
        (ASCEND_TOOLKIT_HOME, Origin::AscendToolkitHome),
    ] {
        if let Some(root) = set(var) {
            out.push(Candidate {
                path: PathBuf::from(root).join("lib64").join(spec.file_name),
                origin,
            });
        }
    }
    out.push(Candidate {
        path: PathBuf::from(spec.file_name),
        origin: Origin::LoaderDefault,
    });
    out.extend(spec.well_known.iter().map(|p| Candidate {
        path: PathBuf::from(p),
        origin: Origin::WellKnown,
    }));
    out
}

/// One failed attempt to load a candidate, with the loader's message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attempt {
    /// The path tried and why.
    pub candidate: Candidate,
    /// The dynamic loader's message (`dlerror`), verbatim: it tells a missing file from a
    /// wrong architecture or an unresolved dependency.
    pub error: String,
}

/// A vendor library could not be loaded, or lacks a function this crate needs.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    /// No candidate loaded. With an override variable set there was exactly one attempt.
    #[error("{file_name} could not be loaded; tried:{}", list_attempts(.attempts))]
    NotFound {
        /// The library's file name ([`LibrarySpec::file_name`]), e.g. `libhccl.so`.
        file_name: &'static str,
        /// Every candidate tried, in order, with the loader's message for each.
        attempts: Vec<Attempt>,
    },
    /// A file loaded but lacks a required function: usually a CANN older than the call, or
    /// a different library under the expected name.
    #[error("symbol `{symbol}` not found in {}: {message}", .path.display())]
    MissingSymbol {
        /// The C function looked up, e.g. `HcclCommWorkingDevNicSet`.
        symbol: &'static str,
        /// The file that was loaded and searched.
        path: PathBuf,
        /// The loader's message (`dlerror`), verbatim.
        message: String,
    },
}

fn list_attempts(attempts: &[Attempt]) -> String {
    attempts
        .iter()
        .map(|a| {
            format!(
                "\n  {} (from {}): {}",
                a.candidate.path.display(),
                a.candidate.origin,
                a.error
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    use taskd_core::env::from_pairs as env;

    fn paths(c: &[Candidate]) -> Vec<String> {
        c.iter().map(|c| c.path.display().to_string()).collect()
    }

    #[test]
    fn nothing_set_leaves_the_loader_default() {
        let c = candidates(&HCCL, &env::<&str>(&[]));
        assert_eq!(
            c,
            vec![Candidate {
                path: "libhccl.so".into(),
                origin: Origin::LoaderDefault
            }]
        );
    }

    #[test]
    fn home_then_toolkit_then_loader_default() {
        let e = env(&[
            ("ASCEND_TOOLKIT_HOME", "/opt/tk"),
            ("ASCEND_HOME_PATH", "/opt/home"),
        ]);
        for (spec, file) in [(HCCL, "libhccl.so"), (ACL, "libascendcl.so")] {
            let c = candidates(&spec, &e);
            assert_eq!(
                paths(&c),
                vec![
                    format!("/opt/home/lib64/{file}"),
                    format!("/opt/tk/lib64/{file}"),
                    file.to_string()
                ]
            );
            assert_eq!(c[0].origin, Origin::AscendHomePath);
            assert_eq!(c[1].origin, Origin::AscendToolkitHome);
            assert_eq!(c[2].origin, Origin::LoaderDefault);
        }
    }

    #[test]
    fn each_override_is_the_only_candidate_and_only_for_its_library() {
        let e = env(&[
            ("ASCEND_HOME_PATH", "/opt/home"),
            ("TASKD_HCCL_LIBRARY", "/x/hccl.so"),
            ("TASKD_ACL_LIBRARY", "/x/acl.so"),
            ("TASKD_DCMI_LIBRARY", "/x/dcmi.so"),
        ]);
        for (spec, var, path) in [
            (HCCL, "TASKD_HCCL_LIBRARY", "/x/hccl.so"),
            (ACL, "TASKD_ACL_LIBRARY", "/x/acl.so"),
            (DCMI, "TASKD_DCMI_LIBRARY", "/x/dcmi.so"),
        ] {
            assert_eq!(
                candidates(&spec, &e),
                vec![Candidate {
                    path: path.into(),
                    origin: Origin::Override(var)
                }]
            );
        }
        // The HCCL override does not leak into the ACL search.
        let only_hccl = env(&[("TASKD_HCCL_LIBRARY", "/x/hccl.so")]);
        assert_eq!(paths(&candidates(&ACL, &only_hccl)), vec!["libascendcl.so"]);
    }

    #[test]
    fn dcmi_tries_vendor_locations_after_the_loader_default() {
        let c = candidates(&DCMI, &env(&[("ASCEND_HOME_PATH", "/opt/home")]));
        assert_eq!(
            paths(&c),
            vec![
                "/opt/home/lib64/libdcmi.so",
                "libdcmi.so",
                "/usr/local/dcmi/libdcmi.so",
                "/usr/local/Ascend/driver/lib64/driver/libdcmi.so",
            ]
        );
        assert_eq!(c[2].origin, Origin::WellKnown);
    }

    #[test]
    fn empty_values_count_as_unset() {
        let e = env(&[
            ("TASKD_HCCL_LIBRARY", ""),
            ("ASCEND_HOME_PATH", ""),
            ("ASCEND_TOOLKIT_HOME", "/opt/tk"),
        ]);
        assert_eq!(
            paths(&candidates(&HCCL, &e)),
            vec!["/opt/tk/lib64/libhccl.so", "libhccl.so"]
        );
    }

    #[test]
    fn not_found_lists_every_attempt() {
        let err = LoadError::NotFound {
            file_name: "libhccl.so",
            attempts: vec![
                Attempt {
                    candidate: Candidate {
                        path: "/a/lib64/libhccl.so".into(),
                        origin: Origin::AscendHomePath,
                    },
                    error: "no such file".into(),
                },
                Attempt {
                    candidate: Candidate {
                        path: "libhccl.so".into(),
                        origin: Origin::LoaderDefault,
                    },
                    error: "not on path".into(),
                },
            ],
        };
        assert_eq!(
            err.to_string(),
            "libhccl.so could not be loaded; tried:\n  /a/lib64/libhccl.so (from \
             $ASCEND_HOME_PATH/lib64): no such file\n  libhccl.so (from dynamic loader search \
             path): not on path"
        );
    }
}
