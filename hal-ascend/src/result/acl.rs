//! ACL calls returning `Result<_, AclError>`.

use crate::codes::ACL;
use crate::sys::acl::{AclLib, AclResult, DevicePtr, MemMallocPolicy, StreamHandle};
use taskd_core::HalError;

/// `ACL_ERROR_INVALID_PARAM` in `acl_base.h`.
pub const ACL_ERROR_INVALID_PARAM: i32 = 100_000;

/// A failed ACL call: the C function's name and the `aclError` it returned.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{op} failed with aclError {code}{}", if .detail.is_empty() { String::new() } else { format!(": {}", .detail) })]
pub struct AclError {
    /// The C function, e.g. `aclrtSetDevice`: an `aclError` means little without it.
    pub op: &'static str,
    /// The `aclError` as returned (`acl_base.h` numbering, e.g. 100000 for an invalid
    /// parameter); never 0 (`ACL_SUCCESS`).
    pub code: i32,
    /// What this crate adds: the arguments, or why the call was not made; empty when the code
    /// says it all.
    pub detail: String,
}

impl From<AclError> for HalError {
    /// Keeps the `aclError` as ACL's code (its name and kind from this crate's [`ACL`] table).
    fn from(e: AclError) -> Self {
        HalError::new(e.op, ACL.status(e.code), e.detail)
    }
}

fn check(op: &'static str, code: AclResult) -> Result<(), AclError> {
    if code == 0 {
        Ok(())
    } else {
        Err(AclError {
            op,
            code,
            detail: String::new(),
        })
    }
}

/// `ACL_ERROR_REPEAT_INITIALIZE` in `acl_base.h`: an older runtime's answer to a second
/// `aclInit`.
pub const ACL_ERROR_REPEAT_INITIALIZE: i32 = 100_002;

/// How this process holds the Ascend runtime after [`init`], and so how [`release`] lets go.
///
/// Recent CANN counts references: every `aclInit` adds one and `aclFinalizeReference` takes
/// one away, deinitialising only when none is left, while `aclFinalize` deinitialises at
/// once whatever the count. A tool that shares the process with a training framework must
/// therefore pair `aclInit` with `aclFinalizeReference`: calling `aclFinalize` would pull the
/// runtime from under the framework. Older runtimes have no `aclFinalizeReference`; their
/// second `aclInit` answers `ACL_ERROR_REPEAT_INITIALIZE`, and only the first caller may
/// finalize.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum AclInit {
    /// A reference-counted runtime: this call took a reference, [`release`] gives it back
    /// with `aclFinalizeReference`.
    Counted,
    /// An older runtime this call initialised: [`release`] calls `aclFinalize`.
    Owned,
    /// An older runtime someone in the process had initialised before (the second `aclInit`
    /// answered `ACL_ERROR_REPEAT_INITIALIZE`): [`release`] leaves it alone.
    Borrowed,
}

/// `aclInit(NULL)`, before any other ACL call of this caller; see [`AclInit`] for what the
/// answer means.
pub fn init(lib: &AclLib) -> Result<AclInit, AclError> {
    match lib.init() {
        ACL_ERROR_REPEAT_INITIALIZE => Ok(AclInit::Borrowed),
        code => check("aclInit", code).map(|()| {
            if lib.has_finalize_reference() {
                AclInit::Counted
            } else {
                AclInit::Owned
            }
        }),
    }
}

/// Lets go of what [`init`] took, after every stream and allocation of the caller was
/// released: `aclFinalizeReference` for [`AclInit::Counted`] (returning the references left
/// in the process), `aclFinalize` for [`AclInit::Owned`], nothing for [`AclInit::Borrowed`].
pub fn release(lib: &AclLib, how: AclInit) -> Result<Option<u64>, AclError> {
    match how {
        AclInit::Counted => match lib.finalize_reference() {
            Some((code, left)) => check("aclFinalizeReference", code).map(|()| Some(left)),
            None => Err(AclError {
                op: "aclFinalizeReference",
                code: ACL_ERROR_INVALID_PARAM,
                detail: "this libascendcl.so has no aclFinalizeReference; not called".into(),
            }),
        },
        AclInit::Owned => finalize(lib).map(|()| None),
        AclInit::Borrowed => Ok(None),
    }
}

/// `aclFinalize`: deinitialises the runtime at once, whatever its reference count. Only for a
/// runtime this process alone uses; see [`release`].
pub fn finalize(lib: &AclLib) -> Result<(), AclError> {
    check("aclFinalize", lib.finalize())
}

/// `aclrtSetDevice`: binds the calling thread to a device (logical id).
pub fn set_device(lib: &AclLib, device_id: i32) -> Result<(), AclError> {
    check("aclrtSetDevice", lib.set_device(device_id))
}

/// `aclrtCreateStream`.
pub fn create_stream(lib: &AclLib) -> Result<StreamHandle, AclError> {
    let op = "aclrtCreateStream";
    let (code, s) = lib.create_stream();
    check(op, code)?;
    s.ok_or_else(|| AclError {
        op,
        code,
        detail: "returned success but a null stream".into(),
    })
}

/// `aclrtDestroyStream`. The handle is gone whatever the result.
pub fn destroy_stream(lib: &AclLib, stream: StreamHandle) -> Result<(), AclError> {
    check("aclrtDestroyStream", lib.destroy_stream(stream))
}

/// `aclrtSynchronizeStream`: waits for everything enqueued on `stream`.
pub fn synchronize_stream(lib: &AclLib, stream: &StreamHandle) -> Result<(), AclError> {
    check("aclrtSynchronizeStream", lib.synchronize_stream(stream))
}

/// `aclrtMalloc`.
pub fn malloc(lib: &AclLib, size: usize, policy: MemMallocPolicy) -> Result<DevicePtr, AclError> {
    let op = "aclrtMalloc";
    let (code, p) = lib.malloc(size, policy);
    check(op, code)?;
    p.ok_or_else(|| AclError {
        op,
        code,
        detail: "returned success but a null pointer".into(),
    })
}

/// `aclrtFree`. The allocation is gone whatever the result.
pub fn free(lib: &AclLib, ptr: DevicePtr) -> Result<(), AclError> {
    check("aclrtFree", lib.free(ptr))
}

/// `aclrtMemcpy` host to device of all of `src`.
pub fn memcpy_host_to_device(
    lib: &AclLib,
    dst: &mut DevicePtr,
    src: &[u8],
) -> Result<(), AclError> {
    let op = "aclrtMemcpy";
    if src.len() > dst.size() {
        return Err(AclError {
            op,
            code: ACL_ERROR_INVALID_PARAM,
            detail: format!("{} B do not fit in {} B; not called", src.len(), dst.size()),
        });
    }
    check(op, lib.memcpy_host_to_device(dst, src))
}

/// `aclrtMemcpy` device to host filling all of `dst`.
pub fn memcpy_device_to_host(
    lib: &AclLib,
    dst: &mut [u8],
    src: &DevicePtr,
) -> Result<(), AclError> {
    let op = "aclrtMemcpy";
    if dst.len() > src.size() {
        return Err(AclError {
            op,
            code: ACL_ERROR_INVALID_PARAM,
            detail: format!(
                "{} B asked of a {} B allocation; not called",
                dst.len(),
                src.size()
            ),
        });
    }
    check(op, lib.memcpy_device_to_host(dst, src))
}
