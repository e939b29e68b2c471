//! The safe layer: RAII owners of HCCL and ACL resources.
//!
//! Each type holds an `Arc` of the function table it was made with, so the library stays
//! loaded while anything it created is alive, and releases its resource in `Drop` (errors on
//! drop are ignored; call the explicit `destroy`/`free` to see them).

use crate::result::{self, AclError};
use crate::sys::acl::{AclLib, DevicePtr, MemMallocPolicy, StreamHandle};
use crate::sys::hccl::{
    CommHandle, HcclDataType, HcclLib, HcclReduceOp, HcclRootInfo, HCCL_ROOT_INFO_BYTES,
};
use std::fmt;
use std::sync::Arc;
use taskd_core::HalError;

/// The 4108-byte `HcclRootInfo` the root rank creates and every rank needs to join.
#[derive(Clone)]
pub struct RootInfo(Box<HcclRootInfo>);

impl RootInfo {
    /// `HcclGetRootInfo`, on the root rank.
    pub fn generate(hccl: &HcclLib) -> Result<Self, HalError> {
        result::hccl::get_root_info(hccl).map(RootInfo)
    }

    /// The bytes to send to the other ranks out of band.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0.internal
    }

    /// A root info received from the root rank; `None` unless exactly 4108 bytes.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        let internal: [u8; HCCL_ROOT_INFO_BYTES] = bytes.try_into().ok()?;
        Some(RootInfo(Box::new(HcclRootInfo { internal })))
    }

    /// The C struct itself, for the result layer's
    /// [`comm_init_root_info`](result::hccl::comm_init_root_info) when a caller joins without
    /// [`Comm::init_root_info`].
    pub fn raw(&self) -> &HcclRootInfo {
        &self.0
    }
}

impl fmt::Debug for RootInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RootInfo({} bytes)", HCCL_ROOT_INFO_BYTES)
    }
}

/// An HCCL communicator.
///
/// An *owned* communicator (made by [`Comm::init_root_info`] or [`Comm::adopt`]) calls
/// `HcclCommDestroy` when dropped. A *borrowed* one ([`Comm::borrow`]) belongs to someone
/// else, typically the training framework, and is left alone.
pub struct Comm {
    hccl: Arc<HcclLib>,
    handle: Option<CommHandle>,
    owned: bool,
}

impl Comm {
    /// `HcclCommInitRootInfo`: joins as `rank` of `n_ranks`. Every rank must call it.
    pub fn init_root_info(
        hccl: &Arc<HcclLib>,
        n_ranks: u32,
        root: &RootInfo,
        rank: u32,
    ) -> Result<Self, HalError> {
        let handle = result::hccl::comm_init_root_info(hccl, n_ranks, root.raw(), rank)?;
        Ok(Self::adopt(hccl, handle))
    }

    /// Takes ownership of a handle: it is destroyed on drop.
    pub fn adopt(hccl: &Arc<HcclLib>, handle: CommHandle) -> Self {
        Comm {
            hccl: Arc::clone(hccl),
            handle: Some(handle),
            owned: true,
        }
    }

    /// Uses a handle someone else owns: it is not destroyed on drop.
    pub fn borrow(hccl: &Arc<HcclLib>, handle: CommHandle) -> Self {
        Comm {
            hccl: Arc::clone(hccl),
            handle: Some(handle),
            owned: false,
        }
    }

    /// Whether dropping this value destroys the communicator.
    pub fn is_owned(&self) -> bool {
        self.owned
    }

    /// The raw handle, for result-layer calls this type does not wrap. Lending it out does not
    /// change who destroys the communicator: this `Comm` still does, if it owns it.
    pub fn handle(&self) -> &CommHandle {
        self.handle.as_ref().expect("present until drop")
    }

    /// `HcclGetCommName`.
    pub fn name(&self) -> Result<String, HalError> {
        result::hccl::get_comm_name(&self.hccl, self.handle())
    }

    /// `HcclGetRankId`.
    pub fn rank_id(&self) -> Result<u32, HalError> {
        result::hccl::get_rank_id(&self.hccl, self.handle())
    }

    /// `HcclGetRankSize`.
    pub fn rank_size(&self) -> Result<u32, HalError> {
        result::hccl::get_rank_size(&self.hccl, self.handle())
    }

    /// `HcclCommWorkingDevNicSet` with the arrays passed through unchanged.
    pub fn set_working_nic(&self, ranks: &[u32], use_backup: &[bool]) -> Result<(), HalError> {
        result::hccl::comm_working_dev_nic_set(&self.hccl, self.handle(), ranks, use_backup)
    }

    /// `HcclCommResume`.
    pub fn resume(&self) -> Result<(), HalError> {
        result::hccl::comm_resume(&self.hccl, self.handle())
    }

    /// `HcclAllReduce` of `count` elements from `send` into `recv`, enqueued on `stream`.
    pub fn all_reduce(
        &self,
        send: &DeviceBuffer,
        recv: &mut DeviceBuffer,
        count: u64,
        data_type: HcclDataType,
        op: HcclReduceOp,
        stream: &Stream,
    ) -> Result<(), HalError> {
        result::hccl::all_reduce(
            &self.hccl,
            send.ptr(),
            recv.ptr_mut(),
            count,
            data_type,
            op,
            self.handle(),
            stream.handle(),
        )
    }

    /// Destroys an owned communicator now, reporting HCCL's answer. A borrowed one is only
    /// let go of.
    pub fn destroy(mut self) -> Result<(), HalError> {
        match (self.owned, self.handle.take()) {
            (true, Some(h)) => result::hccl::comm_destroy(&self.hccl, h),
            _ => Ok(()),
        }
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        if let (true, Some(h)) = (self.owned, self.handle.take()) {
            let _ = result::hccl::comm_destroy(&self.hccl, h);
        }
    }
}

impl fmt::Debug for Comm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Comm")
            .field("handle", &self.handle)
            .field("owned", &self.owned)
            .finish()
    }
}

/// An ACL stream, destroyed on drop.
pub struct Stream {
    acl: Arc<AclLib>,
    handle: Option<StreamHandle>,
}

impl Stream {
    /// `aclrtCreateStream` on the calling thread's current device (see
    /// [`result::acl::set_device`]).
    pub fn new(acl: &Arc<AclLib>) -> Result<Self, AclError> {
        let handle = result::acl::create_stream(acl)?;
        Ok(Stream {
            acl: Arc::clone(acl),
            handle: Some(handle),
        })
    }

    /// The raw handle, for result-layer calls that enqueue work on this stream (an
    /// all-reduce). The stream is still destroyed when this value drops.
    pub fn handle(&self) -> &StreamHandle {
        self.handle.as_ref().expect("present until drop")
    }

    /// `aclrtSynchronizeStream`: waits for all work enqueued on the stream.
    pub fn synchronize(&self) -> Result<(), AclError> {
        result::acl::synchronize_stream(&self.acl, self.handle())
    }

    /// `aclrtDestroyStream` now, reporting ACL's answer.
    pub fn destroy(mut self) -> Result<(), AclError> {
        match self.handle.take() {
            Some(h) => result::acl::destroy_stream(&self.acl, h),
            None => Ok(()),
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if let Some(h) = self.handle.take() {
            let _ = result::acl::destroy_stream(&self.acl, h);
        }
    }
}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stream")
            .field("handle", &self.handle)
            .finish()
    }
}

/// Device memory from `aclrtMalloc`, freed with `aclrtFree` on drop.
pub struct DeviceBuffer {
    acl: Arc<AclLib>,
    ptr: Option<DevicePtr>,
}

impl DeviceBuffer {
    /// `aclrtMalloc` of `size` bytes.
    pub fn alloc(
        acl: &Arc<AclLib>,
        size: usize,
        policy: MemMallocPolicy,
    ) -> Result<Self, AclError> {
        let ptr = result::acl::malloc(acl, size, policy)?;
        Ok(DeviceBuffer {
            acl: Arc::clone(acl),
            ptr: Some(ptr),
        })
    }

    /// Bytes allocated.
    pub fn len(&self) -> usize {
        self.ptr().size()
    }

    /// Whether the allocation holds no bytes, so no collective can use it.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The device address and size, for result-layer calls that read the buffer; this value
    /// keeps owning (and eventually frees) the memory.
    pub fn ptr(&self) -> &DevicePtr {
        self.ptr.as_ref().expect("present until drop")
    }

    /// The device address for result-layer calls that write the buffer (an all-reduce's
    /// `recv`, a host-to-device copy); this value keeps owning the memory.
    pub fn ptr_mut(&mut self) -> &mut DevicePtr {
        self.ptr.as_mut().expect("present until drop")
    }

    /// Copies `src` to the start of the buffer (`aclrtMemcpy`, host to device).
    pub fn copy_from_host(&mut self, src: &[u8]) -> Result<(), AclError> {
        let acl = Arc::clone(&self.acl);
        result::acl::memcpy_host_to_device(&acl, self.ptr_mut(), src)
    }

    /// Fills `dst` from the start of the buffer (`aclrtMemcpy`, device to host).
    pub fn copy_to_host(&self, dst: &mut [u8]) -> Result<(), AclError> {
        result::acl::memcpy_device_to_host(&self.acl, dst, self.ptr())
    }

    /// `aclrtFree` now, reporting ACL's answer.
    pub fn free(mut self) -> Result<(), AclError> {
        match self.ptr.take() {
            Some(p) => result::acl::free(&self.acl, p),
            None => Ok(()),
        }
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if let Some(p) = self.ptr.take() {
            let _ = result::acl::free(&self.acl, p);
        }
    }
}

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("ptr", &self.ptr)
            .finish()
    }
}
