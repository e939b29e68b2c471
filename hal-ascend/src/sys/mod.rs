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

/// What a preflight learns about one library: where the search found it, what it tried before,
/// and which of the functions this crate binds the file lacks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LibraryProbe {
    /// The candidate that loaded.
    pub loaded: Candidate,
    /// Earlier candidates that did not load, with the loader's message.
    pub skipped: Vec<Attempt>,
    /// Required symbols not found in the file, in the order given: the `open` functions fail.
    pub missing: Vec<&'static str>,
    /// Optional symbols not found in the file: bound when present, never required.
    pub optional_missing: Vec<&'static str>,
}

/// Runs the search for `spec`, then looks up each of `symbols` (e.g. [`hccl::SYMBOLS`]) and of
/// `optional` (e.g. [`hccl::OPTIONAL_SYMBOLS`]) in the file that loaded, without calling
/// anything, and unloads it. Unlike the `open` functions, which stop at the first missing
/// symbol, this reports all of them.
pub fn probe_symbols(
    spec: &LibrarySpec,
    symbols: &[&'static str],
    optional: &[&'static str],
    env: EnvLookup<'_>,
) -> Result<LibraryProbe, LoadError> {
    let (loaded, candidate, skipped) = Loaded::search_reporting(spec, env)?;
    let absent = |list: &[&'static str]| {
        list.iter()
            .copied()
            .filter(|s| !loaded.has_symbol(s))
            .collect()
    };
    Ok(LibraryProbe {
        loaded: candidate,
        skipped,
        missing: absent(symbols),
        optional_missing: absent(optional),
    })
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
        Self::first_of(spec, candidates(spec, env)).map(|(l, _, _)| l)
    }

    /// As [`Loaded::search`], also returning the winning candidate and the failed attempts
    /// before it.
    fn search_reporting(
        spec: &LibrarySpec,
        env: EnvLookup<'_>,
    ) -> Result<(Self, Candidate, Vec<Attempt>), LoadError> {
        Self::first_of(spec, candidates(spec, env))
    }

    /// Loads exactly `path` (no search), reporting a failure like a one-candidate search.
    pub(crate) fn path(spec: &LibrarySpec, path: &Path) -> Result<Self, LoadError> {
        let only = Candidate {
            path: path.to_owned(),
            origin: Origin::Caller,
        };
        Self::first_of(spec, vec![only]).map(|(l, _, _)| l)
    }

    fn first_of(
        spec: &LibrarySpec,
        candidates: Vec<Candidate>,
    ) -> Result<(Self, Candidate, Vec<Attempt>), LoadError> {
        let mut attempts = Vec::new();
        for candidate in candidates {
            match open(&candidate.path) {
                Ok(lib) => {
                    let loaded = Loaded {
                        lib,
                        path: candidate.path.clone(),
                    };
                    return Ok((loaded, candidate, attempts));
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

    /// Whether the library exports `symbol` (looked up, never called).
    fn has_symbol(&self, symbol: &str) -> bool {
        // SAFETY: the pointer is only tested for presence and dropped at once: no call, no
        // dereference, so its type does not matter.
        unsafe { self.lib.get::<*const std::ffi::c_void>(symbol.as_bytes()) }.is_ok()
    }

    /// As [`Loaded::function`], but `None` when the library does not export `symbol`: for
    /// functions some versions of a library have and others do not.
    ///
    /// # Safety
    ///
    /// As for [`Loaded::function`].
    pub(crate) unsafe fn optional_function<T: Copy>(&self, symbol: &'static str) -> Option<T> {
        // SAFETY: the caller's guarantees are those `function` needs.
        unsafe { self.function(symbol) }.ok()
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
