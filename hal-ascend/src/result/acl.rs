//! ACL calls returning `Result<_, AclError>`.

use crate::sys::acl::{AclLib, AclResult, DevicePtr, MemMallocPolicy, StreamHandle};
use taskd_core::{HalError, Library, VendorCode};

/// `ACL_ERROR_INVALID_PARAM` in `acl_base.h`.
pub const ACL_ERROR_INVALID_PARAM: i32 = 100_000;

/// A failed ACL call: the C function's name and the `aclError` it returned.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{op} failed with aclError {code}{}", if .detail.is_empty() { String::new() } else { format!(": {}", .detail) })]
pub struct AclError {
    pub op: &'static str,
    pub code: i32,
    pub detail: String,
}

impl From<AclError> for HalError {
    /// Keeps the `aclError` as ACL's code (its name and kind from `taskd_core`'s ACL table).
    fn from(e: AclError) -> Self {
        HalError::new(e.op, VendorCode::new(Library::Acl, e.code), e.detail)
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

/// `ACL_ERROR_REPEAT_INITIALIZE` in `acl_base.h`: `aclInit` was already called.
pub const ACL_ERROR_REPEAT_INITIALIZE: i32 = 100_002;

/// `aclInit(NULL)`, once per process before any other ACL call. `Ok(true)` if this call
/// initialised the runtime, `Ok(false)` if it already was (a framework in the same process did
/// it: `ACL_ERROR_REPEAT_INITIALIZE`), in which case the caller must not finalize it.
pub fn init(lib: &AclLib) -> Result<bool, AclError> {
    match lib.init() {
        ACL_ERROR_REPEAT_INITIALIZE => Ok(false),
        code => check("aclInit", code).map(|()| true),
    }
}

/// `aclFinalize`, after every stream and allocation was released.
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
