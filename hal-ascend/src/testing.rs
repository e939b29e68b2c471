//! Stub vendor libraries, for tests and for running without NPUs (feature `testing`).
//!
//! The stubs are C sources (`tests/stub/*.c` of this crate, embedded here) that export the same
//! symbols as `libhccl.so`, `libascendcl.so` and `libdcmi.so`, record every call with its
//! arguments in a log, and can be told to fail. [`compile`] builds them with the C compiler
//! `cc` into a directory of the caller's choice; [`StubControl`] reads a loaded stub's log and
//! steers it. This crate's own tests, the root crate's tests and the hardware-in-the-loop rig
//! (`examples/hil_rig.rs`, `--stubs`) all go through here, so they exercise one code path.
//!
//! What the stubs do (the C files' header comments are the full contract):
//!
//! - **HCCL.** Communicators made with `HcclCommInitRootInfo` from one root info form a group
//!   of threads in this process; `HcclAllReduce` on them is a real collective (every member
//!   blocks until all have called, then gets the element-wise reduction), and
//!   `HcclCommWorkingDevNicSet` checks HCCL's rules: the member completed a collective before,
//!   is not inside one, and its k-th call has the same `ranks` and `useBackup` as every other
//!   member's k-th call. Communicators made by [`StubControl::new_comm`] stand for a
//!   framework's and have no peers: their all-reduce is the identity.
//!   It also applies HCCL's per-operator NIC rule: a NIC set reaches the operators a member
//!   had issued, a new operator starts on the default NIC; collectives that run on the default
//!   NIC of a switched communicator are counted ([`StubControl::hccl_collectives_on_default_nic`]).
//! - **ACL.** Device memory is host memory; streams are tokens. `aclInit` is reference-counted
//!   with `aclFinalizeReference`, as in recent CANN ([`Stub::AclLegacy`]: an older runtime,
//!   without it).
//! - **DCMI.** A configurable card/die topology ([`StubControl::dcmi_topology`], default two
//!   cards of two dies, card ids from 10; physical id `card_index * dies + chip`) of which a
//!   node sees some dies, renumbered as logical ids ([`StubControl::dcmi_visible`]; default
//!   all, logical = physical). Network health is `DCMI_RDFX_DETECT_OK` until set with
//!   [`StubControl::dcmi_health`]; a probe can be made to block until the test releases it
//!   ([`StubControl::dcmi_block_health`]).
//!
//! Nothing here reads or writes the process environment.

use libloading::Library;
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{c_char, c_int, c_long, c_void, CString};
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;

const STUB_COMMON_H: &str = include_str!("../tests/stub/stub_common.h");
const HCCL_STUB_C: &str = include_str!("../tests/stub/hccl_stub.c");
const ACL_STUB_C: &str = include_str!("../tests/stub/acl_stub.c");
const DCMI_STUB_C: &str = include_str!("../tests/stub/dcmi_stub.c");

/// One stub library variant.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Stub {
    /// `libhccl.so` with every function, `HcclCommResume` included.
    Hccl,
    /// HCCL without `HcclCommResume` (an optional function).
    HcclWithoutResume,
    /// A recent `libascendcl.so`: `aclInit` is reference-counted with `aclFinalizeReference`.
    Acl,
    /// An older ACL: no `aclFinalizeReference`, a repeated `aclInit` answers
    /// `ACL_ERROR_REPEAT_INITIALIZE`.
    AclLegacy,
    /// `libdcmi.so` with the configurable card/die topology (see the module docs).
    Dcmi,
}

impl Stub {
    /// Every variant.
    pub const ALL: [Stub; 5] = [
        Stub::Hccl,
        Stub::HcclWithoutResume,
        Stub::Acl,
        Stub::AclLegacy,
        Stub::Dcmi,
    ];

    /// The vendor's file name, e.g. `libhccl.so`.
    pub fn file_name(self) -> &'static str {
        match self {
            Stub::Hccl | Stub::HcclWithoutResume => "libhccl.so",
            Stub::Acl | Stub::AclLegacy => "libascendcl.so",
            Stub::Dcmi => "libdcmi.so",
        }
    }

    /// The name [`compile`] gives the built file (distinct per variant).
    pub fn build_name(self) -> &'static str {
        match self {
            Stub::Hccl => "hccl.so",
            Stub::HcclWithoutResume => "hccl_without_resume.so",
            Stub::Acl => "acl.so",
            Stub::AclLegacy => "acl_legacy.so",
            Stub::Dcmi => "dcmi.so",
        }
    }

    fn source(self) -> (&'static str, &'static str, &'static [&'static str]) {
        match self {
            Stub::Hccl => ("hccl_stub.c", HCCL_STUB_C, &[]),
            Stub::HcclWithoutResume => ("hccl_stub.c", HCCL_STUB_C, &["-DSTUB_OMIT_COMM_RESUME"]),
            Stub::Acl => ("acl_stub.c", ACL_STUB_C, &[]),
            Stub::AclLegacy => ("acl_stub.c", ACL_STUB_C, &["-DSTUB_ACL_LEGACY"]),
            Stub::Dcmi => ("dcmi_stub.c", DCMI_STUB_C, &[]),
        }
    }
}

/// A stub could not be built.
#[derive(Debug)]
pub struct BuildError(String);

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BuildError {}

/// Compiles `stub` with `cc` into `out_dir/<Stub::build_name>` (writing its sources to
/// `out_dir/src/` first) and returns the path. `out_dir` is created if needed. Each call
/// compiles again; callers that build once per process keep the result.
pub fn compile(stub: Stub, out_dir: &Path) -> Result<PathBuf, BuildError> {
    let src = out_dir.join("src");
    let io = |what: &str, e: std::io::Error| BuildError(format!("{what}: {e}"));
    std::fs::create_dir_all(&src).map_err(|e| io(&src.display().to_string(), e))?;
    let (file, text, flags) = stub.source();
    for (name, body) in [("stub_common.h", STUB_COMMON_H), (file, text)] {
        let p = src.join(name);
        std::fs::write(&p, body).map_err(|e| io(&p.display().to_string(), e))?;
    }
    let target = out_dir.join(stub.build_name());
    let output = Command::new("cc")
        .args([
            "-shared", "-fPIC", "-std=c11", "-Wall", "-Wextra", "-O1", "-pthread",
        ])
        .args(flags)
        .arg("-o")
        .arg(&target)
        .arg(src.join(file))
        .output()
        .map_err(|e| {
            BuildError(format!(
                "the stub vendor libraries are compiled with the C compiler `cc`, which could \
                 not be run ({e}); install one, e.g. `apt-get install gcc`"
            ))
        })?;
    if !output.status.success() {
        return Err(BuildError(format!(
            "cc failed on {file}:\n{}",
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    Ok(target)
}

/// The three stubs a node needs, each installed under its vendor file name in `lib64/`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StubInstall {
    /// The directory to use as `ASCEND_HOME_PATH` (it holds `lib64/`).
    pub root: PathBuf,
    /// `root/lib64/libhccl.so`.
    pub hccl: PathBuf,
    /// `root/lib64/libascendcl.so`.
    pub acl: PathBuf,
    /// `root/lib64/libdcmi.so`.
    pub dcmi: PathBuf,
}

impl StubInstall {
    /// The path of one library.
    pub fn path(&self, stub: Stub) -> &Path {
        match stub {
            Stub::Hccl | Stub::HcclWithoutResume => &self.hccl,
            Stub::Acl | Stub::AclLegacy => &self.acl,
            Stub::Dcmi => &self.dcmi,
        }
    }

    /// The overrides that make the library search pick these files:
    /// `TASKD_HCCL_LIBRARY`, `TASKD_ACL_LIBRARY` and `TASKD_DCMI_LIBRARY`.
    pub fn overrides(&self) -> Vec<(&'static str, PathBuf)> {
        vec![
            (crate::search::HCCL.override_var, self.hccl.clone()),
            (crate::search::ACL.override_var, self.acl.clone()),
            (crate::search::DCMI.override_var, self.dcmi.clone()),
        ]
    }
}

/// Compiles HCCL, ACL and DCMI stubs and installs them as `dir/lib64/libhccl.so`,
/// `dir/lib64/libascendcl.so`, `dir/lib64/libdcmi.so`. A fresh `dir` gives fresh library
/// instances (the loader maps each file once per process).
pub fn install(dir: &Path) -> Result<StubInstall, BuildError> {
    let build = dir.join("build");
    let lib64 = dir.join("lib64");
    std::fs::create_dir_all(&lib64).map_err(|e| BuildError(format!("{}: {e}", lib64.display())))?;
    let put = |stub: Stub| -> Result<PathBuf, BuildError> {
        let built = compile(stub, &build)?;
        let to = lib64.join(stub.file_name());
        std::fs::copy(&built, &to).map_err(|e| BuildError(format!("{}: {e}", to.display())))?;
        Ok(to)
    };
    Ok(StubInstall {
        root: dir.to_owned(),
        hccl: put(Stub::Hccl)?,
        acl: put(Stub::Acl)?,
        dcmi: put(Stub::Dcmi)?,
    })
}

/// The test-only side of one loaded stub instance: its call log and its knobs.
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
type FnTimeout = unsafe extern "C" fn(c_long);
type FnVisible = unsafe extern "C" fn(*const c_int, c_int) -> c_int;
type FnChip = unsafe extern "C" fn(c_int, c_int) -> c_int;
type FnWaitBlocked = unsafe extern "C" fn(c_int, c_long) -> c_int;
type FnCount = unsafe extern "C" fn() -> u64;

impl StubControl {
    /// Opens the same file the code under test opened: the loader returns the same instance.
    ///
    /// # Panics
    ///
    /// If `path` does not load.
    pub fn attach(path: &Path) -> Self {
        // SAFETY: one of the stubs compiled above, whose initialisers do nothing (only static
        // data), or a file the caller vouches for.
        let lib = unsafe { Library::new(path) }
            .unwrap_or_else(|e| panic!("attach to stub {}: {e}", path.display()));
        StubControl { lib }
    }

    fn func<T: Copy>(&self, name: &str) -> T {
        // SAFETY: each caller names a stub export with the matching C prototype (see
        // tests/stub/*.c); the library outlives every use of the copied pointer, which never
        // leaves `self`'s methods.
        unsafe {
            *self
                .lib
                .get::<T>(name.as_bytes())
                .unwrap_or_else(|e| panic!("{name}: {e}"))
        }
    }

    /// Every recorded call, one line each, oldest first.
    ///
    /// # Panics
    ///
    /// If the log overflowed (4 MiB) and lost lines.
    pub fn log(&self) -> Vec<String> {
        let f: FnLog = self.func("stub_log");
        let overflowed: FnInt = self.func("stub_log_overflowed");
        // SAFETY: a null buffer of capacity 0 is allowed; it only reports the length.
        let len = unsafe { f(std::ptr::null_mut(), 0) };
        let mut buf = vec![0u8; len + 1];
        // SAFETY: `buf` is writable for `buf.len()` bytes; the stub writes at most that many.
        unsafe { f(buf.as_mut_ptr().cast(), buf.len()) };
        // SAFETY: no arguments.
        assert_eq!(unsafe { overflowed() }, 0, "stub log overflowed");
        // Lines recorded between the two calls are not in `buf`; keep what was copied.
        buf.truncate(len);
        String::from_utf8(buf)
            .expect("utf-8 log")
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Whether the log filled up (4 MiB) and lost lines.
    pub fn log_overflowed(&self) -> bool {
        let overflowed: FnInt = self.func("stub_log_overflowed");
        // SAFETY: no arguments.
        unsafe { overflowed() != 0 }
    }

    /// The recorded calls starting with `prefix`.
    pub fn calls(&self, prefix: &str) -> Vec<String> {
        self.log()
            .into_iter()
            .filter(|l| l.starts_with(prefix))
            .collect()
    }

    /// Empties the call log, so a test's assertions see only the calls made after this point.
    pub fn clear_log(&self) {
        let f: FnVoid = self.func("stub_clear_log");
        // SAFETY: no arguments.
        unsafe { f() }
    }

    /// Makes the C function `func` return `code` from now on (0 restores success).
    ///
    /// # Panics
    ///
    /// If `func` is not a stubbed function of this library.
    pub fn set_result(&self, func: &str, code: i32) {
        let f: FnSetResult = self.func("stub_set_result");
        let name = CString::new(func).expect("no NUL in a function name");
        // SAFETY: `name` is a valid C string for the call's duration.
        let rc = unsafe { f(name.as_ptr(), code) };
        assert_eq!(rc, 0, "{func} is not stubbed");
    }

    /// A communicator as a framework would have created it (HCCL stub only). It has no peers
    /// in this process; the stub never frees it.
    pub fn new_comm(&self, name: &str, size: u32, rank: u32) -> *mut c_void {
        let f: FnNewComm = self.func("stub_hccl_new_comm");
        let name = CString::new(name).expect("no NUL in a communicator name");
        // SAFETY: `name` is a valid C string for the call's duration.
        unsafe { f(name.as_ptr(), size, rank) }
    }

    /// A communicator whose 128-byte name has no terminating NUL (HCCL stub only).
    pub fn new_comm_full_name(&self, fill: u8, size: u32, rank: u32) -> *mut c_void {
        let f: FnNewCommFull = self.func("stub_hccl_new_comm_full_name");
        // SAFETY: plain values.
        unsafe { f(fill as c_char, size, rank) }
    }

    /// How long a group member waits in a collective for its peers before it fails with
    /// `HCCL_E_TIMEOUT` (HCCL stub only; default 60 s).
    pub fn hccl_collective_timeout(&self, timeout: std::time::Duration) {
        let f: FnTimeout = self.func("stub_hccl_set_collective_timeout_ms");
        let ms = c_long::try_from(timeout.as_millis()).unwrap_or(c_long::MAX);
        // SAFETY: plain value.
        unsafe { f(ms) }
    }

    /// `cards` cards with ids `card_base..`, `dies` chips each (DCMI stub only).
    pub fn dcmi_topology(&self, cards: i32, dies: i32, card_base: i32) {
        let f: FnTopology = self.func("stub_dcmi_set_topology");
        // SAFETY: plain values.
        unsafe { f(cards, dies, card_base) }
    }

    /// The dies the node sees, by physical id, in logical order: logical id `i` is
    /// `physical[i]` (DCMI stub only; a topology change resets it to all, logical = physical).
    ///
    /// # Panics
    ///
    /// If a physical id is outside the topology.
    pub fn dcmi_visible(&self, physical: &[u32]) {
        let f: FnVisible = self.func("stub_dcmi_set_visible");
        let ids: Vec<c_int> = physical.iter().map(|p| *p as c_int).collect();
        // SAFETY: `ids` is valid for `ids.len()` reads for the call's duration.
        let rc = unsafe { f(ids.as_ptr(), ids.len() as c_int) };
        assert_eq!(rc, 0, "physical ids {physical:?} outside the topology");
    }

    /// From now on, `dcmi_get_device_network_health` of this chip blocks until
    /// [`StubControl::dcmi_release`] (DCMI stub only).
    ///
    /// # Panics
    ///
    /// If the chip is outside the topology.
    pub fn dcmi_block_health(&self, card_id: i32, device_id: i32) {
        let f: FnChip = self.func("stub_dcmi_block_health");
        // SAFETY: plain values.
        let rc = unsafe { f(card_id, device_id) };
        assert_eq!(rc, 0, "chip ({card_id}, {device_id}) out of range");
    }

    /// Waits until at least `n` health probes are blocked in the stub; `false` if `timeout`
    /// passed first (DCMI stub only).
    pub fn dcmi_wait_blocked(&self, n: i32, timeout: std::time::Duration) -> bool {
        let f: FnWaitBlocked = self.func("stub_dcmi_wait_blocked");
        let ms = c_long::try_from(timeout.as_millis()).unwrap_or(c_long::MAX);
        // SAFETY: plain values.
        unsafe { f(n, ms) == 0 }
    }

    /// Lets every blocked probe answer and clears every block (DCMI stub only).
    pub fn dcmi_release(&self) {
        let f: FnVoid = self.func("stub_dcmi_release");
        // SAFETY: no arguments.
        unsafe { f() }
    }

    /// The runtime's `aclInit` references now (ACL stub only; the legacy stub: 1 while
    /// initialised).
    pub fn acl_refs(&self) -> u64 {
        let f: FnCount = self.func("stub_acl_refs");
        // SAFETY: no arguments.
        unsafe { f() }
    }

    /// Collectives that ran on the default NIC of a switched communicator (HCCL stub only).
    pub fn hccl_collectives_on_default_nic(&self) -> u64 {
        let f: FnCount = self.func("stub_hccl_collectives_on_default_nic");
        // SAFETY: no arguments.
        unsafe { f() }
    }

    /// The `dcmi_rdfx_detect_result` of one chip (DCMI stub only).
    ///
    /// # Panics
    ///
    /// If the chip is outside the topology.
    pub fn dcmi_health(&self, card_id: i32, device_id: i32, result: i32) {
        let f: FnHealth = self.func("stub_dcmi_set_health");
        // SAFETY: plain values.
        let rc = unsafe { f(card_id, device_id, result) };
        assert_eq!(rc, 0, "chip ({card_id}, {device_id}) out of range");
    }
}

/// One `HcclCommWorkingDevNicSet` line of the HCCL stub's log, on a group communicator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NicSetRecord {
    /// The stub's communicator id (`comm=#<id>`).
    pub comm: i32,
    /// The arguments as the stub received them: `nRanks=.. ranks=[..] useBackup=[..]`.
    pub args: String,
    /// The group's name (`HcclGetCommName`).
    pub group: String,
    /// This member's rank in the group.
    pub rank: u32,
}

impl NicSetRecord {
    /// Parses a log line; `None` for other lines and for calls on framework-made
    /// communicators (which carry no group).
    pub fn parse(line: &str) -> Option<Self> {
        let rest = line.strip_prefix("HcclCommWorkingDevNicSet comm=#")?;
        let (comm, rest) = rest.split_once(' ')?;
        let (args, tail) = rest.split_once(" group=")?;
        let (group, rank) = tail.rsplit_once(" rank=")?;
        Some(NicSetRecord {
            comm: comm.parse().ok()?,
            args: args.to_owned(),
            group: group.to_owned(),
            rank: rank.parse().ok()?,
        })
    }
}

/// What the members of one group did with `HcclCommWorkingDevNicSet`, once they agree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupNicSets {
    /// The group ranks that called at least once.
    pub callers: BTreeSet<u32>,
    /// The calls' arguments (`nRanks=.. ranks=[..] useBackup=[..]`), in order: the same
    /// sequence for every caller.
    pub calls: Vec<String>,
}

/// Groups the NIC-set lines of an HCCL stub log by group and checks HCCL's rule: every
/// caller of a group made the same calls, with the same arguments, in the same order. An error
/// names the first group and members that differ. Lines on framework-made communicators
/// (no group) are ignored.
pub fn nic_set_agreement(log: &[String]) -> Result<BTreeMap<String, GroupNicSets>, String> {
    let mut by_group: BTreeMap<String, BTreeMap<u32, Vec<String>>> = BTreeMap::new();
    for r in log.iter().filter_map(|l| NicSetRecord::parse(l)) {
        by_group
            .entry(r.group)
            .or_default()
            .entry(r.rank)
            .or_default()
            .push(r.args);
    }
    let mut out = BTreeMap::new();
    for (group, members) in by_group {
        let mut it = members.iter();
        let (first_rank, first) = it.next().expect("a group appears with a caller");
        for (rank, calls) in it {
            if calls != first {
                return Err(format!(
                    "group {group}: rank {first_rank} called {first:?} but rank {rank} called \
                     {calls:?}"
                ));
            }
        }
        out.insert(
            group,
            GroupNicSets {
                callers: members.keys().copied().collect(),
                calls: first.clone(),
            },
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_group_nic_set_lines_only() {
        let r = NicSetRecord::parse(
            "HcclCommWorkingDevNicSet comm=#7 nRanks=2 ranks=[0,3] useBackup=[1,1] \
             group=stubcomm_1 rank=3",
        )
        .unwrap();
        assert_eq!(
            r,
            NicSetRecord {
                comm: 7,
                args: "nRanks=2 ranks=[0,3] useBackup=[1,1]".into(),
                group: "stubcomm_1".into(),
                rank: 3
            }
        );
        assert!(NicSetRecord::parse(
            "HcclCommWorkingDevNicSet comm=#1 nRanks=1 ranks=[3] useBackup=[0]"
        )
        .is_none());
        assert!(NicSetRecord::parse("HcclAllReduce send=buf#1").is_none());
    }

    #[test]
    fn agreement_needs_identical_sequences() {
        let line = |rank: u32, group: &str, b: u8| {
            format!(
                "HcclCommWorkingDevNicSet comm=#{rank} nRanks=1 ranks=[0] useBackup=[{b}] \
                 group={group} rank={rank}"
            )
        };
        let ok = vec![
            line(0, "g", 1),
            line(1, "g", 1),
            line(0, "h", 1),
            line(1, "g", 0),
            line(0, "g", 0),
            "HcclAllReduce whatever".to_string(),
        ];
        let got = nic_set_agreement(&ok).unwrap();
        assert_eq!(got["g"].callers, BTreeSet::from([0, 1]));
        assert_eq!(
            got["g"].calls,
            vec![
                "nRanks=1 ranks=[0] useBackup=[1]",
                "nRanks=1 ranks=[0] useBackup=[0]"
            ]
        );
        assert_eq!(got["h"].callers, BTreeSet::from([0]));
        let bad = vec![line(0, "g", 1), line(1, "g", 0)];
        assert!(nic_set_agreement(&bad).unwrap_err().contains("group g"));
        let short = vec![line(0, "g", 1), line(1, "g", 1), line(1, "g", 1)];
        assert!(nic_set_agreement(&short).is_err());
    }
}
