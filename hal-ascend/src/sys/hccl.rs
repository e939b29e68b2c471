//! `libhccl.so`: the HCCL entry points taskd and a hardware rig need.
//!
//! Prototypes are those of CANN's `hccl.h` / `hccl_types.h` (`docs/hal.md` lists the calls taskd makes).
//! `HcclResult`, `HcclDataType` and `HcclReduceOp` are C enums, passed as `int`.

use super::acl::{DevicePtr, StreamHandle};
use super::Loaded;
use crate::search::{EnvLookup, LoadError, HCCL};
use std::ffi::{c_char, c_void};
use std::path::Path;
use std::ptr::NonNull;

/// `HcclResult`: 0 is `HCCL_SUCCESS`.
pub type HcclResult = i32;

/// Size of `HcclRootInfo`, an opaque blob (`char internal[4108]`).
pub const HCCL_ROOT_INFO_BYTES: usize = 4108;

/// Size of the buffer `HcclGetCommName` writes (`HCCL_COMM_NAME_MAX_LENGTH`).
pub const HCCL_COMM_NAME_MAX_LENGTH: usize = 128;

/// `HcclRootInfo`: produced by `HcclGetRootInfo` on the root rank and handed to every rank out
/// of band.
#[repr(C)]
#[derive(Clone)]
pub struct HcclRootInfo {
    /// HCCL's bytes, opaque to everyone else: copied verbatim to every rank, never interpreted.
    pub internal: [u8; HCCL_ROOT_INFO_BYTES],
}

/// `HcclDataType`, the values of `hccl_types.h`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum HcclDataType {
    /// `HCCL_DATA_TYPE_INT8`: 8-bit signed integer.
    Int8 = 0,
    /// `HCCL_DATA_TYPE_INT16`: 16-bit signed integer.
    Int16 = 1,
    /// `HCCL_DATA_TYPE_INT32`: 32-bit signed integer.
    Int32 = 2,
    /// `HCCL_DATA_TYPE_FP16`: IEEE half-precision float.
    Fp16 = 3,
    /// `HCCL_DATA_TYPE_FP32`: IEEE single-precision float.
    Fp32 = 4,
    /// `HCCL_DATA_TYPE_INT64`: 64-bit signed integer.
    Int64 = 5,
    /// `HCCL_DATA_TYPE_UINT64`: 64-bit unsigned integer.
    Uint64 = 6,
    /// `HCCL_DATA_TYPE_UINT8`: 8-bit unsigned integer.
    Uint8 = 7,
    /// `HCCL_DATA_TYPE_UINT16`: 16-bit unsigned integer.
    Uint16 = 8,
    /// `HCCL_DATA_TYPE_UINT32`: 32-bit unsigned integer.
    Uint32 = 9,
    /// `HCCL_DATA_TYPE_FP64`: IEEE double-precision float.
    Fp64 = 10,
    /// `HCCL_DATA_TYPE_BFP16`: bfloat16 (8-bit exponent, 7-bit mantissa).
    Bfp16 = 11,
}

impl HcclDataType {
    /// Bytes per element.
    pub fn size_bytes(self) -> usize {
        use HcclDataType::*;
        match self {
            Int8 | Uint8 => 1,
            Int16 | Uint16 | Fp16 | Bfp16 => 2,
            Int32 | Uint32 | Fp32 => 4,
            Int64 | Uint64 | Fp64 => 8,
        }
    }
}

/// `HcclReduceOp`, the values of `hccl_types.h`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum HcclReduceOp {
    /// `HCCL_REDUCE_SUM`: element-wise sum.
    Sum = 0,
    /// `HCCL_REDUCE_PROD`: element-wise product.
    Prod = 1,
    /// `HCCL_REDUCE_MAX`: element-wise maximum.
    Max = 2,
    /// `HCCL_REDUCE_MIN`: element-wise minimum.
    Min = 3,
}

/// A live `HcclComm`. Not `Clone`: `HcclCommDestroy` consumes it, so it cannot be used after.
#[derive(Debug)]
pub struct CommHandle(NonNull<c_void>);

// SAFETY: an HcclComm is an opaque pointer into HCCL's heap and is not bound to the thread that
// created it (frameworks create communicators on one thread and use them from others). The
// handle is deliberately not `Sync`: HCCL forbids concurrent calls on one communicator, and
// without `Sync` no two threads can reach the same handle at once through this crate.
unsafe impl Send for CommHandle {}

impl CommHandle {
    /// Wraps a communicator created elsewhere, e.g. by the training framework.
    ///
    /// # Safety
    ///
    /// `raw` must be a live `HcclComm` created through the same loaded `libhccl.so` as the
    /// [`HcclLib`] it will be used with (the same file: the dynamic loader then shares one
    /// instance with the framework), and must stay live while this handle is used. Pass it to
    /// [`HcclLib::comm_destroy`] only if you own it.
    pub unsafe fn from_raw(raw: *mut c_void) -> Option<Self> {
        NonNull::new(raw).map(CommHandle)
    }

    /// The `HcclComm` pointer, for handing back to C code (the framework, a test stub). The
    /// handle keeps it: destroying it is still [`HcclLib::comm_destroy`]'s job, once.
    pub fn as_raw(&self) -> *mut c_void {
        self.0.as_ptr()
    }
}

type FnWorkingDevNicSet = unsafe extern "C" fn(*mut c_void, *mut u32, *mut bool, u32) -> HcclResult;
type FnGetRootInfo = unsafe extern "C" fn(*mut HcclRootInfo) -> HcclResult;
type FnCommInitRootInfo =
    unsafe extern "C" fn(u32, *const HcclRootInfo, u32, *mut *mut c_void) -> HcclResult;
type FnCommU32 = unsafe extern "C" fn(*mut c_void, *mut u32) -> HcclResult;
type FnAllReduce = unsafe extern "C" fn(
    *mut c_void,
    *mut c_void,
    u64,
    i32,
    i32,
    *mut c_void,
    *mut c_void,
) -> HcclResult;
type FnComm = unsafe extern "C" fn(*mut c_void) -> HcclResult;
type FnGetCommName = unsafe extern "C" fn(*mut c_void, *mut c_char) -> HcclResult;

/// Every function the table requires, in binding order: what a preflight looks for
/// ([`super::probe_symbols`]).
pub const SYMBOLS: &[&str] = &[
    "HcclCommWorkingDevNicSet",
    "HcclGetRootInfo",
    "HcclCommInitRootInfo",
    "HcclGetRankId",
    "HcclGetRankSize",
    "HcclAllReduce",
    "HcclCommDestroy",
    "HcclGetCommName",
];

/// Functions bound when the library has them. `HcclCommResume` is documented as reserved and
/// the worker never calls it, so a `libhccl.so` without it loads all the same.
pub const OPTIONAL_SYMBOLS: &[&str] = &["HcclCommResume"];

/// The HCCL function table.
pub struct HcclLib {
    working_dev_nic_set: FnWorkingDevNicSet,
    get_root_info: FnGetRootInfo,
    comm_init_root_info: FnCommInitRootInfo,
    get_rank_id: FnCommU32,
    get_rank_size: FnCommU32,
    all_reduce: FnAllReduce,
    comm_resume: Option<FnComm>,
    comm_destroy: FnComm,
    get_comm_name: FnGetCommName,
    // Keeps the library mapped for as long as the pointers above exist.
    loaded: Loaded,
}

impl HcclLib {
    /// Searches for `libhccl.so` (see [`crate::search`]) and binds every function
    /// ([`SYMBOLS`] must all be there, [`OPTIONAL_SYMBOLS`] when present).
    pub fn open(env: EnvLookup<'_>) -> Result<Self, LoadError> {
        Self::bind(Loaded::search(&HCCL, env)?)
    }

    /// Loads exactly `path` and binds every function.
    pub fn open_path(path: impl AsRef<Path>) -> Result<Self, LoadError> {
        Self::bind(Loaded::path(&HCCL, path.as_ref())?)
    }

    /// The file the library was loaded from (as the candidate was written).
    pub fn path(&self) -> &Path {
        self.loaded.file()
    }

    fn bind(loaded: Loaded) -> Result<Self, LoadError> {
        // SAFETY: each type alias above transcribes the C prototype of the symbol it is bound
        // to (HcclComm and aclrtStream are `void*`, C `bool` is one byte like Rust's, the enums
        // are `int`). The pointers are stored next to `loaded`, which keeps the library mapped.
        unsafe {
            Ok(HcclLib {
                working_dev_nic_set: loaded.function("HcclCommWorkingDevNicSet")?,
                get_root_info: loaded.function("HcclGetRootInfo")?,
                comm_init_root_info: loaded.function("HcclCommInitRootInfo")?,
                get_rank_id: loaded.function("HcclGetRankId")?,
                get_rank_size: loaded.function("HcclGetRankSize")?,
                all_reduce: loaded.function("HcclAllReduce")?,
                comm_resume: loaded.optional_function("HcclCommResume"),
                comm_destroy: loaded.function("HcclCommDestroy")?,
                get_comm_name: loaded.function("HcclGetCommName")?,
                loaded,
            })
        }
    }

    /// `HcclCommWorkingDevNicSet(comm, ranks, useBackup, nRanks)` with `nRanks = ranks.len()`.
    ///
    /// # Panics
    ///
    /// If the slices differ in length or hold more than `u32::MAX` entries (the result layer
    /// checks both first and reports an error instead).
    pub fn comm_working_dev_nic_set(
        &self,
        comm: &CommHandle,
        ranks: &mut [u32],
        use_backup: &mut [bool],
    ) -> HcclResult {
        assert_eq!(
            ranks.len(),
            use_backup.len(),
            "one use_backup flag per rank"
        );
        let n = u32::try_from(ranks.len()).expect("nRanks fits in uint32_t");
        // SAFETY: `comm` is live (CommHandle invariant); both pointers are valid for `n`
        // elements. HCCL declares them non-const, so they are exclusive borrows: even a write
        // would stay inside our buffers.
        unsafe {
            (self.working_dev_nic_set)(
                comm.as_raw(),
                ranks.as_mut_ptr(),
                use_backup.as_mut_ptr(),
                n,
            )
        }
    }

    /// `HcclGetRootInfo(rootInfo)`.
    pub fn get_root_info(&self, out: &mut HcclRootInfo) -> HcclResult {
        // SAFETY: `out` is a valid, exclusive HcclRootInfo of the size HCCL writes.
        unsafe { (self.get_root_info)(out) }
    }

    /// `HcclCommInitRootInfo(nRanks, rootInfo, rank, &comm)`. The handle is returned when HCCL
    /// wrote a non-null one.
    pub fn comm_init_root_info(
        &self,
        n_ranks: u32,
        root: &HcclRootInfo,
        rank: u32,
    ) -> (HcclResult, Option<CommHandle>) {
        let mut raw: *mut c_void = std::ptr::null_mut();
        // SAFETY: `root` is a valid HcclRootInfo HCCL only reads; `raw` is a valid out slot.
        let code = unsafe { (self.comm_init_root_info)(n_ranks, root, rank, &mut raw) };
        // A handle HCCL just created is live and owned by the caller.
        (code, NonNull::new(raw).map(CommHandle))
    }

    /// `HcclGetRankId(comm, &rank)`.
    pub fn get_rank_id(&self, comm: &CommHandle) -> (HcclResult, u32) {
        let mut v = 0u32;
        // SAFETY: `comm` is live; `v` is a valid out slot.
        let code = unsafe { (self.get_rank_id)(comm.as_raw(), &mut v) };
        (code, v)
    }

    /// `HcclGetRankSize(comm, &size)`.
    pub fn get_rank_size(&self, comm: &CommHandle) -> (HcclResult, u32) {
        let mut v = 0u32;
        // SAFETY: `comm` is live; `v` is a valid out slot.
        let code = unsafe { (self.get_rank_size)(comm.as_raw(), &mut v) };
        (code, v)
    }

    /// `HcclAllReduce(send, recv, count, dataType, op, comm, stream)`, enqueued on `stream`.
    ///
    /// # Panics
    ///
    /// If `count` elements of `data_type` do not fit in either buffer (the result layer checks
    /// first and reports an error instead).
    #[allow(clippy::too_many_arguments)]
    pub fn all_reduce(
        &self,
        send: &DevicePtr,
        recv: &mut DevicePtr,
        count: u64,
        data_type: HcclDataType,
        op: HcclReduceOp,
        comm: &CommHandle,
        stream: &StreamHandle,
    ) -> HcclResult {
        let bytes = usize::try_from(count)
            .ok()
            .and_then(|c| c.checked_mul(data_type.size_bytes()));
        assert!(
            bytes.is_some_and(|b| b <= send.size() && b <= recv.size()),
            "count fits in both buffers"
        );
        // SAFETY: `comm` and `stream` are live handles; `send` and `recv` are live device
        // allocations holding at least `count` elements (checked above), `recv` borrowed
        // exclusively.
        unsafe {
            (self.all_reduce)(
                send.as_raw(),
                recv.as_raw(),
                count,
                data_type as i32,
                op as i32,
                comm.as_raw(),
                stream.as_raw(),
            )
        }
    }

    /// `HcclCommResume(comm)`; `None` when this `libhccl.so` has no such function.
    pub fn comm_resume(&self, comm: &CommHandle) -> Option<HcclResult> {
        let f = self.comm_resume?;
        // SAFETY: `comm` is live.
        Some(unsafe { f(comm.as_raw()) })
    }

    /// `HcclCommDestroy(comm)`. Consumes the handle whatever the result.
    pub fn comm_destroy(&self, comm: CommHandle) -> HcclResult {
        // SAFETY: `comm` is live and, being moved in, is never used again.
        unsafe { (self.comm_destroy)(comm.as_raw()) }
    }

    /// `HcclGetCommName(comm, name)` into a buffer of `HCCL_COMM_NAME_MAX_LENGTH` bytes.
    pub fn get_comm_name(
        &self,
        comm: &CommHandle,
        name: &mut [u8; HCCL_COMM_NAME_MAX_LENGTH],
    ) -> HcclResult {
        // SAFETY: `comm` is live; `name` is a writable buffer of the size HCCL fills.
        unsafe { (self.get_comm_name)(comm.as_raw(), name.as_mut_ptr().cast()) }
    }
}
