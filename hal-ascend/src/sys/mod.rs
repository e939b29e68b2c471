//! The raw layer: one function table per vendor library, loaded at run time.
//!
//! This is the only module with `unsafe` code. Each table keeps the loaded library alive next
//! to the function pointers taken from it, and exposes one method per C function. Those
//! methods are safe to call because their arguments are typed so that the C side only ever
//! sees what it expects: handles that came out of a successful C call (or an `unsafe`
//! constructor whose contract the caller signs), and Rust slices whose lengths are passed
//! along with their pointers. They return the library's raw status code; turning it into a
//! `Result` is the job of [`crate::result`].

pub mod acl;
pub mod dcmi;
pub mod hccl;

use crate::search::{candidates, Attempt, Candidate, EnvLookup, LibrarySpec, LoadError, Origin};

/// Which file the search for `spec` would load, without binding any function: loads the first
/// candidate that loads, reports its path, and unloads it again. Meant for preflight checks
/// ("which libhccl.so would this worker use?").
pub fn probe(spec: &LibrarySpec, env: EnvLookup<'_>) -> Result<PathBuf, LoadError> {
    Loaded::search(spec, env).map(|l| l.path)
}
use libloading::Library;
use std::path::{Path, PathBuf};

/// A loaded shared library and the path it was loaded from.
pub(crate) struct Loaded {
    lib: Library,
    path: PathBuf,
}

impl Loaded {
    /// Tries the candidates for `spec` in order; the first that loads wins.
    pub(crate) fn search(spec: &LibrarySpec, env: EnvLookup<'_>) -> Result<Self, LoadError> {
        Self::first_of(spec, candidates(spec, env))
    }

    /// Loads exactly `path` (no search), reporting a failure like a one-candidate search.
    pub(crate) fn path(spec: &LibrarySpec, path: &Path) -> Result<Self, LoadError> {
        let only = Candidate {
            path: path.to_owned(),
            origin: Origin::Caller,
        };
        Self::first_of(spec, vec![only])
    }

    fn first_of(spec: &LibrarySpec, candidates: Vec<Candidate>) -> Result<Self, LoadError> {
        let mut attempts = Vec::new();
        for candidate in candidates {
            match open(&candidate.path) {
                Ok(lib) => {
                    return Ok(Loaded {
                        lib,
                        path: candidate.path,
                    })
                }
                Err(e) => attempts.push(Attempt {
                    candidate,
                    error: e.to_string(),
                }),
            }
        }
        Err(LoadError::NotFound {
            file_name: spec.file_name,
            attempts,
        })
    }

    pub(crate) fn file(&self) -> &Path {
        &self.path
    }

    /// Copies the function pointer named `symbol` out of the library.
    ///
    /// # Safety
    ///
    /// `T` must be the `unsafe extern "C" fn` type matching the C prototype of `symbol`. The
    /// returned pointer is valid only while this `Loaded` is alive, so it must be stored next
    /// to it (every table in this module does).
    pub(crate) unsafe fn function<T: Copy>(&self, symbol: &'static str) -> Result<T, LoadError> {
        // SAFETY: the caller guarantees `T` is the symbol's true type; `dlsym` itself only
        // reads the library's symbol table.
        let found = unsafe { self.lib.get::<T>(symbol.as_bytes()) };
        found.map(|s| *s).map_err(|e| LoadError::MissingSymbol {
            symbol,
            path: self.path.clone(),
            message: e.to_string(),
        })
    }
}

fn open(path: &Path) -> Result<Library, libloading::Error> {
    // SAFETY: loading a library runs its initialisers, which Rust cannot check. The candidates
    // are the vendor's own libraries, at the places its installer puts them or at a path the
    // operator named explicitly; their initialisers are expected to be sound, and there is no
    // way to load them without running that code.
    unsafe { Library::new(path) }
}
