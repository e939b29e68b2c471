//! Builds the stub vendor libraries from `tests/stub/*.c` (through `taskd_hal_ascend::testing`,
//! with the `cc` on PATH), gives each test its own copy (so no two tests share a loaded
//! instance or its call log), and talks to the stub's test-only exports (`stub_log`,
//! `stub_set_result`, ...) through `testing::StubControl`.
//!
//! Nothing here reads or writes the process environment: libraries are found through explicit
//! paths or through an environment map handed to the search.

#![allow(dead_code)]

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
pub(crate) use taskd_hal_ascend::testing::{Stub, StubControl};

/// This test process's scratch directory (the pid keeps concurrent runs apart).
fn scratch() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("hal-ascend-stubs")
        .join(std::process::id().to_string())
}

/// Compiles every stub once per test process.
fn built() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let out = scratch().join("build");
        for stub in Stub::ALL {
            taskd_hal_ascend::testing::compile(stub, &out).unwrap_or_else(|e| panic!("{e}"));
        }
        out
    })
}

/// A fresh, empty directory for one test.
pub(crate) fn fresh_dir(test: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = scratch().join(format!("{test}-{}", N.fetch_add(1, Ordering::Relaxed)));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create test dir");
    dir
}

/// Copies a stub into `dir` under the vendor's file name and returns the path. A copy is a
/// new file, so the loader maps a new instance with state of its own.
pub(crate) fn install(stub: Stub, dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).expect("create install dir");
    let to = dir.join(stub.file_name());
    std::fs::copy(built().join(stub.build_name()), &to).expect("copy stub");
    to
}

/// A fresh copy of `stub` for `test`, in `<fresh dir>/lib64/`.
pub(crate) fn fresh(stub: Stub, test: &str) -> PathBuf {
    install(stub, &fresh_dir(test).join("lib64"))
}

/// An environment map for the library search.
pub(crate) fn env(pairs: &[(&str, &Path)]) -> impl Fn(&str) -> Option<OsString> {
    let pairs: Vec<(&str, OsString)> = pairs.iter().map(|(k, v)| (*k, v.into())).collect();
    taskd_core::env::from_pairs(&pairs)
}
