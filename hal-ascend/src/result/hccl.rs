//! HCCL calls returning `Result<_, HalError>`.

use crate::sys::acl::{DevicePtr, StreamHandle};
use crate::sys::hccl::{
    CommHandle, HcclDataType, HcclLib, HcclReduceOp, HcclResult, HcclRootInfo,
    HCCL_COMM_NAME_MAX_LENGTH,
};
use taskd_core::{HalError, HalErrorKind, HcclCode};

// The `op` of a `HalError` from each call below, so a caller can tell which call failed
// without comparing free-form strings.

/// `op` of errors from [`comm_working_dev_nic_set`].
pub const OP_WORKING_DEV_NIC_SET: &str = "HcclCommWorkingDevNicSet";
/// `op` of errors from [`get_root_info`].
pub const OP_GET_ROOT_INFO: &str = "HcclGetRootInfo";
/// `op` of errors from [`comm_init_root_info`].
pub const OP_COMM_INIT_ROOT_INFO: &str = "HcclCommInitRootInfo";
/// `op` of errors from [`get_rank_id`].
pub const OP_GET_RANK_ID: &str = "HcclGetRankId";
/// `op` of errors from [`get_rank_size`].
pub const OP_GET_RANK_SIZE: &str = "HcclGetRankSize";
/// `op` of errors from [`all_reduce`].
pub const OP_ALL_REDUCE: &str = "HcclAllReduce";
/// `op` of errors from [`comm_resume`].
pub const OP_COMM_RESUME: &str = "HcclCommResume";
/// `op` of errors from [`comm_destroy`].
pub const OP_COMM_DESTROY: &str = "HcclCommDestroy";
/// `op` of errors from [`get_comm_name`].
pub const OP_GET_COMM_NAME: &str = "HcclGetCommName";

/// `Ok` for `HCCL_SUCCESS`, otherwise a `HalError` naming `op` and keeping the code.
pub fn check(op: &str, code: HcclResult, detail: impl FnOnce() -> String) -> Result<(), HalError> {
    match HcclCode::from_raw(code) {
        HcclCode::Success => Ok(()),
        failed => Err(HalError::new(op, failed, detail())),
    }
}

fn not_called(op: &str, why: String) -> HalError {
    HalError::new(op, HcclCode::Para, format!("{why}; not called"))
}

/// `HcclCommWorkingDevNicSet`: `ranks[i]` (group ranks) use their backup NIC when
/// `use_backup[i]`. The arrays reach HCCL unchanged, in this order.
pub fn comm_working_dev_nic_set(
    lib: &HcclLib,
    comm: &CommHandle,
    ranks: &[u32],
    use_backup: &[bool],
) -> Result<(), HalError> {
    let op = OP_WORKING_DEV_NIC_SET;
    if ranks.len() != use_backup.len() {
        return Err(not_called(
            op,
            format!(
                "{} ranks but {} use_backup flags",
                ranks.len(),
                use_backup.len()
            ),
        ));
    }
    if u32::try_from(ranks.len()).is_err() {
        return Err(not_called(
            op,
            format!("{} ranks exceed uint32_t", ranks.len()),
        ));
    }
    // HCCL takes non-const arrays: hand it copies, never the caller's data.
    let (mut r, mut b) = (ranks.to_vec(), use_backup.to_vec());
    let code = lib.comm_working_dev_nic_set(comm, &mut r, &mut b);
    check(op, code, || {
        format!(
            "nRanks={} ranks={ranks:?} useBackup={use_backup:?}",
            ranks.len()
        )
    })
}

/// `HcclGetRootInfo`.
pub fn get_root_info(lib: &HcclLib) -> Result<Box<HcclRootInfo>, HalError> {
    let mut info = Box::new(HcclRootInfo {
        internal: [0; crate::sys::hccl::HCCL_ROOT_INFO_BYTES],
    });
    check(OP_GET_ROOT_INFO, lib.get_root_info(&mut info), String::new)?;
    Ok(info)
}

/// `HcclCommInitRootInfo`: joins the communicator described by `root` as `rank` of `n_ranks`.
pub fn comm_init_root_info(
    lib: &HcclLib,
    n_ranks: u32,
    root: &HcclRootInfo,
    rank: u32,
) -> Result<CommHandle, HalError> {
    let op = OP_COMM_INIT_ROOT_INFO;
    let (code, comm) = lib.comm_init_root_info(n_ranks, root, rank);
    check(op, code, || format!("nRanks={n_ranks} rank={rank}"))?;
    comm.ok_or_else(|| HalError::new(op, HcclCode::Ptr, "returned success but a null comm"))
}

/// `HcclGetRankId`: this process's rank in the communicator.
pub fn get_rank_id(lib: &HcclLib, comm: &CommHandle) -> Result<u32, HalError> {
    let (code, v) = lib.get_rank_id(comm);
    check(OP_GET_RANK_ID, code, String::new).map(|()| v)
}

/// `HcclGetRankSize`: the number of ranks in the communicator.
pub fn get_rank_size(lib: &HcclLib, comm: &CommHandle) -> Result<u32, HalError> {
    let (code, v) = lib.get_rank_size(comm);
    check(OP_GET_RANK_SIZE, code, String::new).map(|()| v)
}

/// `HcclAllReduce` of `count` elements, enqueued on `stream`.
#[allow(clippy::too_many_arguments)]
pub fn all_reduce(
    lib: &HcclLib,
    send: &DevicePtr,
    recv: &mut DevicePtr,
    count: u64,
    data_type: HcclDataType,
    reduce_op: HcclReduceOp,
    comm: &CommHandle,
    stream: &StreamHandle,
) -> Result<(), HalError> {
    let op = OP_ALL_REDUCE;
    let bytes = usize::try_from(count)
        .ok()
        .and_then(|c| c.checked_mul(data_type.size_bytes()));
    match bytes {
        Some(b) if b <= send.size() && b <= recv.size() => {}
        _ => {
            return Err(not_called(
                op,
                format!(
                    "{count} x {data_type:?} does not fit in send ({} B) and recv ({} B)",
                    send.size(),
                    recv.size()
                ),
            ))
        }
    }
    let code = lib.all_reduce(send, recv, count, data_type, reduce_op, comm, stream);
    check(op, code, || {
        format!("count={count} dataType={data_type:?} op={reduce_op:?}")
    })
}

/// `HcclCommResume` (documented as reserved; taskd's worker never calls it). A library
/// without the function answers [`HalErrorKind::NotSupported`].
pub fn comm_resume(lib: &HcclLib, comm: &CommHandle) -> Result<(), HalError> {
    match lib.comm_resume(comm) {
        Some(code) => check(OP_COMM_RESUME, code, String::new),
        None => Err(HalError::uncoded(
            OP_COMM_RESUME,
            HcclCode::LIBRARY,
            HalErrorKind::NotSupported,
            format!("{} has no {OP_COMM_RESUME}", lib.path().display()),
        )),
    }
}

/// `HcclCommDestroy`. The handle is gone whatever the result.
pub fn comm_destroy(lib: &HcclLib, comm: CommHandle) -> Result<(), HalError> {
    check(OP_COMM_DESTROY, lib.comm_destroy(comm), String::new)
}

/// `HcclGetCommName`: the group's name, unique in the job and identical on every member.
/// Bytes up to the first NUL (or all 128) are decoded as UTF-8, lossily.
pub fn get_comm_name(lib: &HcclLib, comm: &CommHandle) -> Result<String, HalError> {
    let mut buf = [0u8; HCCL_COMM_NAME_MAX_LENGTH];
    check(
        OP_GET_COMM_NAME,
        lib.get_comm_name(comm, &mut buf),
        String::new,
    )?;
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
}
