//! `libascendcl.so`: the runtime calls a rig needs around HCCL (init, device, stream, memory).
//!
//! Prototypes are those of CANN's `acl_rt.h`; every call returns `aclError` (`int`, 0 =
//! `ACL_SUCCESS`).

use super::Loaded;
use crate::search::{EnvLookup, LoadError, ACL};
use std::ffi::{c_char, c_void};
use std::path::Path;
use std::ptr::NonNull;

/// `aclError`: 0 is `ACL_SUCCESS`.
pub type AclResult = i32;

/// `aclrtMemMallocPolicy`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum MemMallocPolicy {
    /// `ACL_MEM_MALLOC_HUGE_FIRST`
    HugeFirst = 0,
    /// `ACL_MEM_MALLOC_HUGE_ONLY`
    HugeOnly = 1,
    /// `ACL_MEM_MALLOC_NORMAL_ONLY`
    NormalOnly = 2,
}

/// `ACL_MEMCPY_HOST_TO_DEVICE`.
pub const ACL_MEMCPY_HOST_TO_DEVICE: i32 = 1;
/// `ACL_MEMCPY_DEVICE_TO_HOST`.
pub const ACL_MEMCPY_DEVICE_TO_HOST: i32 = 2;

/// A live `aclrtStream`. Not `Clone`: `aclrtDestroyStream` consumes it.
#[derive(Debug)]
pub struct StreamHandle(NonNull<c_void>);

// SAFETY: an aclrtStream is an opaque runtime handle, usable from any thread that has set the
// device it belongs to. Not `Sync`, so two threads never reach one handle through this crate.
unsafe impl Send for StreamHandle {}

impl StreamHandle {
    /// The `aclrtStream` pointer, as C calls take it; the handle stays the one to destroy.
    pub fn as_raw(&self) -> *mut c_void {
        self.0.as_ptr()
    }
}

/// A live device allocation from `aclrtMalloc`, with its size. Not `Clone`: `aclrtFree`
/// consumes it.
#[derive(Debug)]
pub struct DevicePtr {
    ptr: NonNull<c_void>,
    size: usize,
}

// SAFETY: device memory is not tied to a host thread; the pointer is only handed to the runtime.
// Not `Sync`: writes go through `&mut DevicePtr`.
unsafe impl Send for DevicePtr {}

impl DevicePtr {
    /// The device address, as C calls take it (never dereferenced on the host); the value
    /// stays the one to free.
    pub fn as_raw(&self) -> *mut c_void {
        self.ptr.as_ptr()
    }

    /// Bytes allocated.
    pub fn size(&self) -> usize {
        self.size
    }
}

type FnInit = unsafe extern "C" fn(*const c_char) -> AclResult;
type FnFinalize = unsafe extern "C" fn() -> AclResult;
type FnFinalizeReference = unsafe extern "C" fn(*mut u64) -> AclResult;
type FnSetDevice = unsafe extern "C" fn(i32) -> AclResult;
type FnCreateStream = unsafe extern "C" fn(*mut *mut c_void) -> AclResult;
type FnStream = unsafe extern "C" fn(*mut c_void) -> AclResult;
type FnMalloc = unsafe extern "C" fn(*mut *mut c_void, usize, i32) -> AclResult;
type FnFree = unsafe extern "C" fn(*mut c_void) -> AclResult;
type FnMemcpy = unsafe extern "C" fn(*mut c_void, usize, *const c_void, usize, i32) -> AclResult;

/// Every function the table binds, in binding order: what a preflight looks for
/// ([`super::probe_symbols`]).
pub const SYMBOLS: &[&str] = &[
    "aclrtSetDevice",
    "aclrtCreateStream",
    "aclrtDestroyStream",
    "aclrtSynchronizeStream",
    "aclrtMalloc",
    "aclrtFree",
    "aclrtMemcpy",
    "aclInit",
    "aclFinalize",
];

/// Functions bound when the library has them: `aclFinalizeReference`, the release half of the
/// reference-counted `aclInit` of recent CANN (older runtimes lack it).
pub const OPTIONAL_SYMBOLS: &[&str] = &["aclFinalizeReference"];

/// The ACL function table.
pub struct AclLib {
    set_device: FnSetDevice,
    create_stream: FnCreateStream,
    destroy_stream: FnStream,
    synchronize_stream: FnStream,
    malloc: FnMalloc,
    free: FnFree,
    memcpy: FnMemcpy,
    init: FnInit,
    finalize: FnFinalize,
    finalize_reference: Option<FnFinalizeReference>,
    // Keeps the library mapped for as long as the pointers above exist.
    loaded: Loaded,
}

impl AclLib {
    /// Searches for `libascendcl.so` (see [`crate::search`]) and binds every function.
    pub fn open(env: EnvLookup<'_>) -> Result<Self, LoadError> {
        Self::bind(Loaded::search(&ACL, env)?)
    }

    /// Loads exactly `path` and binds every function.
    pub fn open_path(path: impl AsRef<Path>) -> Result<Self, LoadError> {
        Self::bind(Loaded::path(&ACL, path.as_ref())?)
    }

    /// The file the library was loaded from (as the candidate was written).
    pub fn path(&self) -> &Path {
        self.loaded.file()
    }

    fn bind(loaded: Loaded) -> Result<Self, LoadError> {
        // SAFETY: each type alias above transcribes the C prototype of its symbol (aclrtStream
        // is `void*`, the enums are `int`, size_t is usize). The pointers are stored next to
        // `loaded`, which keeps the library mapped.
        unsafe {
            Ok(AclLib {
                set_device: loaded.function("aclrtSetDevice")?,
                create_stream: loaded.function("aclrtCreateStream")?,
                destroy_stream: loaded.function("aclrtDestroyStream")?,
                synchronize_stream: loaded.function("aclrtSynchronizeStream")?,
                malloc: loaded.function("aclrtMalloc")?,
                free: loaded.function("aclrtFree")?,
                memcpy: loaded.function("aclrtMemcpy")?,
                init: loaded.function("aclInit")?,
                finalize: loaded.function("aclFinalize")?,
                finalize_reference: loaded.optional_function("aclFinalizeReference"),
                loaded,
            })
        }
    }

    /// `aclInit(NULL)`: initialises the runtime for this process, without a config file.
    pub fn init(&self) -> AclResult {
        // SAFETY: a null configPath is documented as "no configuration file".
        unsafe { (self.init)(std::ptr::null()) }
    }

    /// `aclFinalize()`: deinitialises the runtime whatever its reference count.
    pub fn finalize(&self) -> AclResult {
        // SAFETY: no arguments.
        unsafe { (self.finalize)() }
    }

    /// Whether the runtime has `aclFinalizeReference` (and so a reference-counted `aclInit`).
    pub fn has_finalize_reference(&self) -> bool {
        self.finalize_reference.is_some()
    }

    /// `aclFinalizeReference(&refCount)`: the status and the count left; `None` when this
    /// `libascendcl.so` has no such function.
    pub fn finalize_reference(&self) -> Option<(AclResult, u64)> {
        let f = self.finalize_reference?;
        let mut count = 0u64;
        // SAFETY: `count` is a valid out slot (the documented input is ignored, the output is
        // the count left).
        let code = unsafe { f(&mut count) };
        Some((code, count))
    }

    /// `aclrtSetDevice(deviceId)`.
    pub fn set_device(&self, device_id: i32) -> AclResult {
        // SAFETY: plain integer argument.
        unsafe { (self.set_device)(device_id) }
    }

    /// `aclrtCreateStream(&stream)`.
    pub fn create_stream(&self) -> (AclResult, Option<StreamHandle>) {
        let mut raw: *mut c_void = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out slot.
        let code = unsafe { (self.create_stream)(&mut raw) };
        (code, NonNull::new(raw).map(StreamHandle))
    }

    /// `aclrtDestroyStream(stream)`. Consumes the handle whatever the result.
    pub fn destroy_stream(&self, stream: StreamHandle) -> AclResult {
        // SAFETY: `stream` is live and, being moved in, never used again.
        unsafe { (self.destroy_stream)(stream.as_raw()) }
    }

    /// `aclrtSynchronizeStream(stream)`.
    pub fn synchronize_stream(&self, stream: &StreamHandle) -> AclResult {
        // SAFETY: `stream` is live.
        unsafe { (self.synchronize_stream)(stream.as_raw()) }
    }

    /// `aclrtMalloc(&ptr, size, policy)`.
    pub fn malloc(&self, size: usize, policy: MemMallocPolicy) -> (AclResult, Option<DevicePtr>) {
        let mut raw: *mut c_void = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out slot; size and policy are plain values.
        let code = unsafe { (self.malloc)(&mut raw, size, policy as i32) };
        (code, NonNull::new(raw).map(|ptr| DevicePtr { ptr, size }))
    }

    /// `aclrtFree(ptr)`. Consumes the allocation whatever the result.
    pub fn free(&self, ptr: DevicePtr) -> AclResult {
        // SAFETY: `ptr` came from aclrtMalloc and, being moved in, is never used again.
        unsafe { (self.free)(ptr.as_raw()) }
    }

    /// `aclrtMemcpy(dst, dst.size(), src, src.len(), ACL_MEMCPY_HOST_TO_DEVICE)`.
    ///
    /// # Panics
    ///
    /// If `src` is longer than the allocation (the result layer checks first).
    pub fn memcpy_host_to_device(&self, dst: &mut DevicePtr, src: &[u8]) -> AclResult {
        assert!(src.len() <= dst.size(), "source fits in the allocation");
        // SAFETY: `dst` is a live allocation of `dst.size()` bytes borrowed exclusively; `src`
        // is valid for `src.len()` bytes of reads, no more than `dst` holds.
        unsafe {
            (self.memcpy)(
                dst.as_raw(),
                dst.size(),
                src.as_ptr().cast(),
                src.len(),
                ACL_MEMCPY_HOST_TO_DEVICE,
            )
        }
    }

    /// `aclrtMemcpy(dst, dst.len(), src, dst.len(), ACL_MEMCPY_DEVICE_TO_HOST)`.
    ///
    /// # Panics
    ///
    /// If `dst` is longer than the allocation (the result layer checks first).
    pub fn memcpy_device_to_host(&self, dst: &mut [u8], src: &DevicePtr) -> AclResult {
        assert!(
            dst.len() <= src.size(),
            "destination no longer than the allocation"
        );
        // SAFETY: `dst` is valid for `dst.len()` bytes of writes, borrowed exclusively; `src`
        // is a live allocation holding at least that many bytes.
        unsafe {
            (self.memcpy)(
                dst.as_mut_ptr().cast(),
                dst.len(),
                src.as_raw(),
                dst.len(),
                ACL_MEMCPY_DEVICE_TO_HOST,
            )
        }
    }
}
