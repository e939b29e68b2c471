//! The vendor libraries' status codes this build knows: their names, as the vendors' headers
//! spell them, and the [`HalErrorKind`] each maps to.
//!
//! A code missing here is still kept, with its number, wherever it travels; it only has no
//! name in this build and maps to [`HalErrorKind::Other`]. The tables are also what keeps the
//! `code` label of `taskd_hal_errors_total` bounded: the label is a name from these tables or
//! `OTHER` (see [`super::VendorCode::metric_name`]).

use super::{HalErrorKind, Library};
use serde::{Deserialize, Serialize};
use std::fmt;

/// `HcclResult` as HCCL defines it (`hccl_types.h`). [`HcclCode::Other`] keeps any code a newer
/// HCCL adds.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum HcclCode {
    /// `HCCL_SUCCESS` (0): not an error.
    Success,
    /// `HCCL_E_PARA` (1): an invalid parameter.
    Para,
    /// `HCCL_E_PTR` (2): an invalid pointer.
    Ptr,
    /// `HCCL_E_MEMORY` (3): memory error.
    Memory,
    /// `HCCL_E_INTERNAL` (4): HCCL internal error.
    Internal,
    /// `HCCL_E_NOT_SUPPORT` (5): not supported.
    NotSupport,
    /// `HCCL_E_NOT_FOUND` (6): no such resource (communicator, rank).
    NotFound,
    /// `HCCL_E_UNAVAIL` (7): resource unavailable.
    Unavail,
    /// `HCCL_E_SYSCALL` (8): a system call failed.
    Syscall,
    /// `HCCL_E_TIMEOUT` (9): timed out.
    Timeout,
    /// `HCCL_E_OPEN_FILE_FAILURE` (10): a file could not be opened.
    OpenFileFailure,
    /// `HCCL_E_TCP_CONNECT` (11): TCP connect failed.
    TcpConnect,
    /// `HCCL_E_ROCE_CONNECT` (12): RoCE connect failed.
    RoceConnect,
    /// `HCCL_E_TCP_TRANSFER` (13): TCP transfer failed.
    TcpTransfer,
    /// `HCCL_E_ROCE_TRANSFER` (14): RoCE transfer failed.
    RoceTransfer,
    /// `HCCL_E_RUNTIME` (15): the runtime failed.
    Runtime,
    /// `HCCL_E_DRV` (16): the driver failed.
    Drv,
    /// `HCCL_E_PROFILING` (17): profiling failed.
    Profiling,
    /// `HCCL_E_CCE` (18): CCE error.
    Cce,
    /// `HCCL_E_NETWORK` (19): network error.
    Network,
    /// `HCCL_E_AGAIN` (20): try again.
    Again,
    /// `HCCL_E_REMOTE` (21): a remote rank failed.
    Remote,
    /// `HCCL_E_SUSPENDING` (22): the communicator is suspending.
    Suspending,
    /// `HCCL_E_OPRETRY_FAIL` (23): HCCL's operation retry failed.
    OpretryFail,
    /// `HCCL_E_OOM` (24): out of memory.
    Oom,
    /// `HCCL_E_IN_STATUS` (1041): the error information is in the status an asynchronous call
    /// reports (recent `hccl_types.h`; outside the contiguous 0..=24 range).
    InStatus,
    /// A code this build does not know, kept as HCCL returned it.
    Other(i32),
}

/// In `HcclResult` order: the index is the numeric code (0 to 24).
const HCCL_NAMES: [(HcclCode, &str); 25] = [
    (HcclCode::Success, "HCCL_SUCCESS"),
    (HcclCode::Para, "HCCL_E_PARA"),
    (HcclCode::Ptr, "HCCL_E_PTR"),
    (HcclCode::Memory, "HCCL_E_MEMORY"),
    (HcclCode::Internal, "HCCL_E_INTERNAL"),
    (HcclCode::NotSupport, "HCCL_E_NOT_SUPPORT"),
    (HcclCode::NotFound, "HCCL_E_NOT_FOUND"),
    (HcclCode::Unavail, "HCCL_E_UNAVAIL"),
    (HcclCode::Syscall, "HCCL_E_SYSCALL"),
    (HcclCode::Timeout, "HCCL_E_TIMEOUT"),
    (HcclCode::OpenFileFailure, "HCCL_E_OPEN_FILE_FAILURE"),
    (HcclCode::TcpConnect, "HCCL_E_TCP_CONNECT"),
    (HcclCode::RoceConnect, "HCCL_E_ROCE_CONNECT"),
    (HcclCode::TcpTransfer, "HCCL_E_TCP_TRANSFER"),
    (HcclCode::RoceTransfer, "HCCL_E_ROCE_TRANSFER"),
    (HcclCode::Runtime, "HCCL_E_RUNTIME"),
    (HcclCode::Drv, "HCCL_E_DRV"),
    (HcclCode::Profiling, "HCCL_E_PROFILING"),
    (HcclCode::Cce, "HCCL_E_CCE"),
    (HcclCode::Network, "HCCL_E_NETWORK"),
    (HcclCode::Again, "HCCL_E_AGAIN"),
    (HcclCode::Remote, "HCCL_E_REMOTE"),
    (HcclCode::Suspending, "HCCL_E_SUSPENDING"),
    (HcclCode::OpretryFail, "HCCL_E_OPRETRY_FAIL"),
    (HcclCode::Oom, "HCCL_E_OOM"),
];

/// Codes outside the contiguous range, with their numbers.
const HCCL_SPARSE: [(HcclCode, i32, &str); 1] = [(HcclCode::InStatus, 1041, "HCCL_E_IN_STATUS")];

/// Every named code with its number and name: the contiguous ones, then the sparse ones.
fn hccl_table() -> impl Iterator<Item = (HcclCode, i32, &'static str)> {
    let contiguous = HCCL_NAMES
        .iter()
        .enumerate()
        .map(|(i, (c, n))| (*c, i as i32, *n));
    contiguous.chain(HCCL_SPARSE.iter().copied())
}

impl HcclCode {
    /// Maps the numeric `HcclResult`.
    pub fn from_raw(code: i32) -> Self {
        hccl_table()
            .find(|(_, n, _)| *n == code)
            .map_or(HcclCode::Other(code), |(c, _, _)| c)
    }

    /// The numeric `HcclResult`.
    pub fn raw(self) -> i32 {
        match self {
            HcclCode::Other(c) => c,
            known => hccl_table()
                .find(|(c, _, _)| *c == known)
                .map(|(_, n, _)| n)
                .expect("every named code is in a table"),
        }
    }

    /// The name HCCL's headers and logs use, e.g. `HCCL_E_NETWORK`; `None` for
    /// [`HcclCode::Other`].
    pub fn name(self) -> Option<&'static str> {
        hccl_table().find(|(c, _, _)| *c == self).map(|(_, _, n)| n)
    }

    /// What the control plane can make of the code.
    ///
    /// - the caller's arguments (`PARA`, `PTR`, `NOT_FOUND`: no such communicator or rank):
    ///   [`HalErrorKind::InvalidArgument`], the same call fails the same way again;
    /// - links (`TCP_*`, `ROCE_*`, `NETWORK`, and `OPRETRY_FAIL`, HCCL's own retry over the
    ///   network giving up): [`HalErrorKind::Network`];
    /// - `TIMEOUT`: [`HalErrorKind::Timeout`]; `REMOTE` (a peer's process failed or left):
    ///   [`HalErrorKind::PeerLost`];
    /// - the communicator cannot serve now (`UNAVAIL`, `AGAIN`, `SUSPENDING`):
    ///   [`HalErrorKind::Unavailable`]; `NOT_SUPPORT`: [`HalErrorKind::NotSupported`];
    /// - everything else (memory, internal, system call, runtime, driver, ..., and codes a
    ///   newer HCCL adds), and `IN_STATUS` (the failure is described by a status the caller
    ///   reads separately, so its kind is not known from the code): [`HalErrorKind::Other`].
    pub fn kind(self) -> HalErrorKind {
        use HcclCode::*;
        match self {
            Para | Ptr | NotFound => HalErrorKind::InvalidArgument,
            TcpConnect | RoceConnect | TcpTransfer | RoceTransfer | Network | OpretryFail => {
                HalErrorKind::Network
            }
            Timeout => HalErrorKind::Timeout,
            Remote => HalErrorKind::PeerLost,
            Unavail | Again | Suspending => HalErrorKind::Unavailable,
            NotSupport => HalErrorKind::NotSupported,
            Success | Memory | Internal | Syscall | OpenFileFailure | Runtime | Drv | Profiling
            | Cce | Oom | InStatus | Other(_) => HalErrorKind::Other,
        }
    }
}

impl fmt::Display for HcclCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => write!(f, "{name} ({})", self.raw()),
            None => write!(f, "HCCL code {}", self.raw()),
        }
    }
}

use HalErrorKind::{InvalidArgument as Arg, NotSupported as NoSup, Other, Timeout, Unavailable};

/// DCMI's error codes (`dcmi_interface_api.h`, `DCMI_ERROR_CODE_BASE` = -8000). Kinds: the
/// caller's arguments (parameter, device id, no such device), `TIME_OUT`, not ready, upgrading
/// or occupied (try later), not supported (also: not in a container, and a configuration the
/// call needs that was never made, `CONFIG_INFO_NOT_EXIST`); the rest is
/// [`HalErrorKind::Other`] (the driver's own messaging, memory, files, resets).
const DCMI: [(i32, &str, HalErrorKind); 21] = [
    (-8001, "DCMI_ERR_CODE_INVALID_PARAMETER", Arg),
    (-8002, "DCMI_ERR_CODE_OPER_NOT_PERMITTED", Other),
    (-8003, "DCMI_ERR_CODE_MEM_OPERATE_FAIL", Other),
    (-8004, "DCMI_ERR_CODE_SECURE_FUN_FAIL", Other),
    (-8005, "DCMI_ERR_CODE_INNER_ERR", Other),
    (-8006, "DCMI_ERR_CODE_TIME_OUT", Timeout),
    (-8007, "DCMI_ERR_CODE_INVALID_DEVICE_ID", Arg),
    (-8008, "DCMI_ERR_CODE_DEVICE_NOT_EXIST", Arg),
    (-8009, "DCMI_ERR_CODE_IOCTL_FAIL", Other),
    (-8010, "DCMI_ERR_CODE_SEND_MSG_FAIL", Other),
    (-8011, "DCMI_ERR_CODE_RECV_MSG_FAIL", Other),
    (-8012, "DCMI_ERR_CODE_NOT_REDAY", Unavailable),
    (-8013, "DCMI_ERR_CODE_NOT_SUPPORT_IN_CONTAINER", NoSup),
    (-8014, "DCMI_ERR_CODE_FILE_OPERATE_FAIL", Other),
    (-8015, "DCMI_ERR_CODE_RESET_FAIL", Other),
    (-8016, "DCMI_ERR_CODE_ABORT_OPERATE", Other),
    (-8017, "DCMI_ERR_CODE_IS_UPGRADING", Unavailable),
    (-8020, "DCMI_ERR_CODE_RESOURCE_OCCUPIED", Unavailable),
    (-8022, "DCMI_ERR_CODE_PARTITION_NOT_RIGHT", Other),
    (-8023, "DCMI_ERR_CODE_CONFIG_INFO_NOT_EXIST", NoSup),
    (-8255, "DCMI_ERR_CODE_NOT_SUPPORT", NoSup),
];

/// The `aclError` codes the ACL calls of taskd (init, device, stream, memory) can return:
/// `acl_base.h` (1xxxxx parameters, 2xxxxx resources, 5xxxxx internal) and the runtime's
/// `acl/error_codes/rt_error_codes.h` (`ACL_ERROR_RT_*`). Kinds as for DCMI; the runtime's
/// wait, task and report timeouts are [`HalErrorKind::Timeout`].
const ACL: [(i32, &str, HalErrorKind); 35] = [
    (100_000, "ACL_ERROR_INVALID_PARAM", Arg),
    (100_001, "ACL_ERROR_UNINITIALIZE", Unavailable),
    (100_002, "ACL_ERROR_REPEAT_INITIALIZE", Other),
    (100_003, "ACL_ERROR_INVALID_FILE", Arg),
    (100_037, "ACL_ERROR_REPEAT_FINALIZE", Other),
    (107_000, "ACL_ERROR_RT_PARAM_INVALID", Arg),
    (107_001, "ACL_ERROR_RT_INVALID_DEVICEID", Arg),
    (107_002, "ACL_ERROR_RT_CONTEXT_NULL", Arg),
    (107_003, "ACL_ERROR_RT_STREAM_CONTEXT", Arg),
    (107_017, "ACL_ERROR_RT_INVALID_HANDLE", Arg),
    (107_019, "ACL_ERROR_RT_WAIT_TIMEOUT", Timeout),
    (107_020, "ACL_ERROR_RT_TASK_TIMEOUT", Timeout),
    (200_000, "ACL_ERROR_BAD_ALLOC", Other),
    (200_001, "ACL_ERROR_API_NOT_SUPPORT", NoSup),
    (200_002, "ACL_ERROR_INVALID_DEVICE", Arg),
    (200_003, "ACL_ERROR_MEMORY_ADDRESS_UNALIGNED", Arg),
    (200_004, "ACL_ERROR_RESOURCE_NOT_MATCH", Arg),
    (200_005, "ACL_ERROR_INVALID_RESOURCE_HANDLE", Arg),
    (200_006, "ACL_ERROR_FEATURE_UNSUPPORTED", NoSup),
    (207_000, "ACL_ERROR_RT_FEATURE_NOT_SUPPORT", NoSup),
    (207_001, "ACL_ERROR_RT_MEMORY_ALLOCATION", Other),
    (207_002, "ACL_ERROR_RT_MEMORY_FREE", Other),
    (207_004, "ACL_ERROR_RT_NO_DEVICE", Unavailable),
    (207_005, "ACL_ERROR_RT_RESOURCE_ALLOC_FAIL", Other),
    (207_008, "ACL_ERROR_RT_NO_STREAM_RESOURCE", Unavailable),
    (300_000, "ACL_ERROR_STORAGE_OVER_LIMIT", Other),
    (500_000, "ACL_ERROR_INTERNAL_ERROR", Other),
    (500_001, "ACL_ERROR_FAILURE", Other),
    (500_003, "ACL_ERROR_RT_FAILURE", Other),
    (500_004, "ACL_ERROR_DRV_FAILURE", Other),
    (507_000, "ACL_ERROR_RT_INTERNAL_ERROR", Other),
    (507_001, "ACL_ERROR_RT_TS_ERROR", Other),
    (507_012, "ACL_ERROR_RT_REPORT_TIMEOUT", Timeout),
    (507_899, "ACL_ERROR_RT_DRV_INTERNAL_ERROR", Other),
    (507_901, "ACL_ERROR_RT_SOCKET_CLOSE", Other),
];

fn find(
    table: &[(i32, &'static str, HalErrorKind)],
    code: i32,
) -> Option<(&'static str, HalErrorKind)> {
    table
        .iter()
        .find(|(c, _, _)| *c == code)
        .map(|(_, n, k)| (*n, *k))
}

/// This build's name and kind of `code` in `library`'s numbering; `None` when it has none
/// (an unknown code, or the mock, which has no codes of its own).
pub(super) fn lookup(library: Library, code: i32) -> Option<(&'static str, HalErrorKind)> {
    match library {
        Library::Hccl => {
            let c = HcclCode::from_raw(code);
            c.name().map(|n| (n, c.kind()))
        }
        Library::Acl => find(&ACL, code),
        Library::Dcmi => find(&DCMI, code),
        Library::Mock => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_hccl_code_round_trips() {
        for raw in 0..25 {
            let c = HcclCode::from_raw(raw);
            assert_eq!(c.raw(), raw);
            assert!(!matches!(c, HcclCode::Other(_)));
            assert!(c.name().is_some());
        }
        assert_eq!(HcclCode::from_raw(19), HcclCode::Network);
        assert_eq!(HcclCode::Network.name(), Some("HCCL_E_NETWORK"));
        assert_eq!(HcclCode::from_raw(9).name(), Some("HCCL_E_TIMEOUT"));
        assert_eq!(HcclCode::from_raw(99), HcclCode::Other(99));
        assert_eq!(HcclCode::Other(99).raw(), 99);
        assert_eq!(HcclCode::Other(99).name(), None);
        assert_eq!(HcclCode::from_raw(-1), HcclCode::Other(-1));
        assert_eq!(HcclCode::Oom.raw(), 24);
        assert_eq!(HcclCode::Network.to_string(), "HCCL_E_NETWORK (19)");
        assert_eq!(HcclCode::Other(99).to_string(), "HCCL code 99");
        // The one code outside 0..=24.
        assert_eq!(HcclCode::from_raw(1041), HcclCode::InStatus);
        assert_eq!(HcclCode::InStatus.raw(), 1041);
        assert_eq!(HcclCode::InStatus.name(), Some("HCCL_E_IN_STATUS"));
        assert_eq!(HcclCode::InStatus.kind(), HalErrorKind::Other);
        assert_eq!(HcclCode::from_raw(25), HcclCode::Other(25));
    }

    #[test]
    fn hccl_codes_map_to_the_kind_a_caller_acts_on() {
        let kind = |c: i32| HcclCode::from_raw(c).kind();
        assert_eq!(kind(1), HalErrorKind::InvalidArgument); // PARA
        assert_eq!(kind(6), HalErrorKind::InvalidArgument); // NOT_FOUND
        assert_eq!(kind(9), HalErrorKind::Timeout);
        for network in [11, 12, 13, 14, 19, 23] {
            assert_eq!(kind(network), HalErrorKind::Network, "{network}");
        }
        assert_eq!(kind(21), HalErrorKind::PeerLost); // REMOTE
        for later in [7, 20, 22] {
            assert_eq!(kind(later), HalErrorKind::Unavailable, "{later}");
        }
        assert_eq!(kind(5), HalErrorKind::NotSupported);
        assert_eq!(kind(4), HalErrorKind::Other); // INTERNAL
        assert_eq!(kind(77), HalErrorKind::Other);
    }

    #[test]
    fn tables_have_one_entry_per_code_and_names_of_their_library() {
        for (table, prefix) in [(&DCMI[..], "DCMI_ERR_CODE_"), (&ACL[..], "ACL_ERROR_")] {
            for (i, (code, name, _)) in table.iter().enumerate() {
                assert!(name.starts_with(prefix), "{name}");
                assert!(
                    table[i + 1..].iter().all(|(c, _, _)| c != code),
                    "{code} twice"
                );
            }
        }
        assert_eq!(
            lookup(Library::Dcmi, -8006),
            Some(("DCMI_ERR_CODE_TIME_OUT", HalErrorKind::Timeout))
        );
        assert_eq!(
            lookup(Library::Acl, 107_001),
            Some((
                "ACL_ERROR_RT_INVALID_DEVICEID",
                HalErrorKind::InvalidArgument
            ))
        );
        assert_eq!(
            lookup(Library::Dcmi, -8023),
            Some((
                "DCMI_ERR_CODE_CONFIG_INFO_NOT_EXIST",
                HalErrorKind::NotSupported
            ))
        );
        assert_eq!(
            lookup(Library::Hccl, 1041),
            Some(("HCCL_E_IN_STATUS", HalErrorKind::Other))
        );
        // Numbers are read in their own library's numbering only.
        assert_eq!(lookup(Library::Dcmi, 19), None);
        assert_eq!(lookup(Library::Hccl, -8006), None);
        assert_eq!(lookup(Library::Mock, 1), None);
    }
}
