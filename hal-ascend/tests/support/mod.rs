//! Builds the stub vendor libraries from `tests/stub/*.c` with the `cc` on PATH, gives each
//! test its own copy (so no two tests share a loaded instance or its call log), and talks to
//! the stub's test-only exports (`stub_log`, `stub_set_result`, ...).
//!
//! Nothing here reads or writes the process environment: libraries are found through explicit
//! paths or through an environment map handed to the search.

#![allow(dead_code)]

use libloading::Library;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CString, OsString};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// One stub library variant.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Stub {
    Hccl,
    /// HCCL without `HcclCommResume`.
    HcclWithoutResume,
    Acl,
    Dcmi,
}

impl Stub {
    /// The vendor's file name, which the installed copy gets.
    pub fn file_name(self) -> &'static str {
        match self {
            Stub::Hccl | Stub::HcclWithoutResume => "libhccl.so",
            Stub::Acl => "libascendcl.so",
            Stub::Dcmi => "libdcmi.so",
        }
    }

    fn build_name(self) -> &'static str {
        match self {
            Stub::Hccl => "hccl.so",
            Stub::HcclWithoutResume => "hccl_without_resume.so",
            Stub::Acl => "acl.so",
            Stub::Dcmi => "dcmi.so",
        }
    }

    fn source_and_flags(self) -> (&'static str, &'static [&'static str]) {
        match self {
            Stub::Hccl => ("hccl_stub.c", &[]),
            Stub::HcclWithoutResume => ("hccl_stub.c", &["-DSTUB_OMIT_COMM_RESUME"]),
            Stub::Acl => ("acl_stub.c", &[]),
            Stub::Dcmi => ("dcmi_stub.c", &[]),
        }
    }
}

const ALL: [Stub; 4] = [Stub::Hccl, Stub::HcclWithoutResume, Stub::Acl, Stub::Dcmi];

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
        std::fs::create_dir_all(&out).expect("create stub build dir");
        let src = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests")
            .join("stub");
        for stub in ALL {
            let (file, flags) = stub.source_and_flags();
            let target = out.join(stub.build_name());
            let result = Command::new("cc")
                .args(["-shared", "-fPIC", "-std=c11", "-Wall", "-Wextra", "-O1"])
                .args(flags)
                .arg("-o")
                .arg(&target)
                .arg(src.join(file))
                .output();
            let output = match result {
                Ok(o) => o,
                Err(e) => panic!(
                    "these tests compile stub vendor libraries with the C compiler `cc`, which \
                     could not be run ({e}); install one, e.g. `apt-get install gcc`"
                ),
            };
            assert!(
                output.status.success(),
                "cc failed on {file}:\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        out
    })
}

/// A fresh, empty directory for one test.
pub fn fresh_dir(test: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = scratch().join(format!("{test}-{}", N.fetch_add(1, Ordering::Relaxed)));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create test dir");
    dir
}

/// Copies a stub into `dir` under the vendor's file name and returns the path. A copy is a
/// new file, so the loader maps a new instance with state of its own.
pub fn install(stub: Stub, dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).expect("create install dir");
    let to = dir.join(stub.file_name());
    std::fs::copy(built().join(stub.build_name()), &to).expect("copy stub");
    to
}

/// A fresh copy of `stub` for `test`, in `<fresh dir>/lib64/`.
pub fn fresh(stub: Stub, test: &str) -> PathBuf {
    install(stub, &fresh_dir(test).join("lib64"))
}

/// An environment map for the library search.
pub fn env(pairs: &[(&str, &Path)]) -> impl Fn(&str) -> Option<OsString> {
    let map: HashMap<String, OsString> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.as_os_str().to_owned()))
        .collect();
    move |k| map.get(k).cloned()
}

/// The test-only side of one loaded stub instance.
pub struct StubControl {
    lib: Library,
}

type FnLog = unsafe extern "C" fn(*mut c_char, usize) -> usize;
type FnInt = unsafe extern "C" fn() -> c_int;
type FnVoid = unsafe extern "C" fn();
type FnSetResult = unsafe extern "C" fn(*const c_char, c_int) -> c_int;
type FnNewComm = unsafe extern "C" fn(*const c_char, u32, u32) -> *mut c_void;
type FnNewCommFull = unsafe extern "C" fn(c_char, u32, u32) -> *mut c_void;
type FnTopology = unsafe extern "C" fn(c_int, c_int, c_int);
type FnHealth = unsafe extern "C" fn(c_int, c_int, c_int) -> c_int;

impl StubControl {
    /// Opens the same file the code under test opened: the loader returns the same instance.
    pub fn attach(path: &Path) -> Self {
        // SAFETY: our own stub, whose initialisers do nothing.
        let lib = unsafe { Library::new(path) }.expect("attach to stub");
        StubControl { lib }
    }

    fn func<T: Copy>(&self, name: &str) -> T {
        // SAFETY: each caller names a stub export with the matching C prototype (see
        // tests/stub/*.c); the library outlives the copied pointer's use.
        unsafe { *self.lib.get::<T>(name.as_bytes()).expect(name) }
    }

    /// Every recorded call, one line each, oldest first.
    pub fn log(&self) -> Vec<String> {
        let f: FnLog = self.func("stub_log");
        let overflowed: FnInt = self.func("stub_log_overflowed");
        // SAFETY: a null buffer of capacity 0 is allowed; it only reports the length.
        let len = unsafe { f(std::ptr::null_mut(), 0) };
        let mut buf = vec![0u8; len + 1];
        // SAFETY: `buf` is writable for `buf.len()` bytes.
        unsafe { f(buf.as_mut_ptr().cast(), buf.len()) };
        // SAFETY: no arguments.
        assert_eq!(unsafe { overflowed() }, 0, "stub log overflowed");
        buf.truncate(len);
        String::from_utf8(buf)
            .expect("utf-8 log")
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// The recorded calls starting with `prefix`.
    pub fn calls(&self, prefix: &str) -> Vec<String> {
        self.log()
            .into_iter()
            .filter(|l| l.starts_with(prefix))
            .collect()
    }

    pub fn clear_log(&self) {
        let f: FnVoid = self.func("stub_clear_log");
        // SAFETY: no arguments.
        unsafe { f() }
    }

    /// Makes the C function `func` return `code` from now on.
    pub fn set_result(&self, func: &str, code: i32) {
        let f: FnSetResult = self.func("stub_set_result");
        let name = CString::new(func).unwrap();
        // SAFETY: `name` is a valid C string for the call's duration.
        let rc = unsafe { f(name.as_ptr(), code) };
        assert_eq!(rc, 0, "{func} is not stubbed");
    }

    /// A communicator as a framework would have created it (HCCL stub only).
    pub fn new_comm(&self, name: &str, size: u32, rank: u32) -> *mut c_void {
        let f: FnNewComm = self.func("stub_hccl_new_comm");
        let name = CString::new(name).unwrap();
        // SAFETY: `name` is a valid C string for the call's duration.
        unsafe { f(name.as_ptr(), size, rank) }
    }

    /// A communicator whose 128-byte name has no terminating NUL (HCCL stub only).
    pub fn new_comm_full_name(&self, fill: u8, size: u32, rank: u32) -> *mut c_void {
        let f: FnNewCommFull = self.func("stub_hccl_new_comm_full_name");
        // SAFETY: plain values.
        unsafe { f(fill as c_char, size, rank) }
    }

    /// `cards` cards with ids `card_base..`, `dies` chips each (DCMI stub only).
    pub fn dcmi_topology(&self, cards: i32, dies: i32, card_base: i32) {
        let f: FnTopology = self.func("stub_dcmi_set_topology");
        // SAFETY: plain values.
        unsafe { f(cards, dies, card_base) }
    }

    /// The `dcmi_rdfx_detect_result` of one chip (DCMI stub only).
    pub fn dcmi_health(&self, card_id: i32, device_id: i32, result: i32) {
        let f: FnHealth = self.func("stub_dcmi_set_health");
        // SAFETY: plain values.
        assert_eq!(
            unsafe { f(card_id, device_id, result) },
            0,
            "chip out of range"
        );
    }
}
