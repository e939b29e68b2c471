//! The code tables of the libraries this backend calls besides HCCL: ACL's `aclError` and
//! DCMI's status codes, each with the vendor's name and the [`HalErrorKind`] it maps to.
//! (HCCL's `HcclResult` is the contract's own numbering, `taskd_core::HcclCode`.)
//!
//! Every ACL or DCMI failure this crate reports is built through these tables
//! ([`CodeTable::status`]), so its name and kind are filled in here, by the backend that made
//! the call; `taskd-core` knows neither library.

use taskd_core::{CodeTable, HalErrorKind, LibraryName};
use HalErrorKind::{InvalidArgument as Arg, NotSupported as NoSup, Other, Timeout, Unavailable};

/// ACL (`libascendcl.so`): devices, streams, memory; codes are `aclError`.
pub static ACL: CodeTable = CodeTable::new(LibraryName::new("acl"), &ACL_CODES);

/// DCMI (`libdcmi.so`): device management, link health; codes are DCMI's negative codes.
pub static DCMI: CodeTable = CodeTable::new(LibraryName::new("dcmi"), &DCMI_CODES);

/// DCMI's error codes (`dcmi_interface_api.h`, `DCMI_ERROR_CODE_BASE` = -8000). Kinds: the
/// caller's arguments (parameter, device id, no such device), `TIME_OUT`, not ready, upgrading
/// or occupied (try later), not supported (also: not in a container, and a configuration the
/// call needs that was never made, `CONFIG_INFO_NOT_EXIST`); the rest is
/// [`HalErrorKind::Other`] (the driver's own messaging, memory, files, resets).
const DCMI_CODES: [(i32, &str, HalErrorKind); 21] = [
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
const ACL_CODES: [(i32, &str, HalErrorKind); 35] = [
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_have_one_entry_per_code_and_names_of_their_library() {
        for (table, prefix) in [(&DCMI, "DCMI_ERR_CODE_"), (&ACL, "ACL_ERROR_")] {
            let codes = table.codes();
            for (i, (code, name, _)) in codes.iter().enumerate() {
                assert!(name.starts_with(prefix), "{name}");
                assert!(
                    codes[i + 1..].iter().all(|(c, _, _)| c != code),
                    "{code} twice"
                );
            }
        }
        assert_eq!(
            DCMI.lookup(-8006),
            Some(("DCMI_ERR_CODE_TIME_OUT", HalErrorKind::Timeout))
        );
        assert_eq!(
            ACL.lookup(107_001),
            Some((
                "ACL_ERROR_RT_INVALID_DEVICEID",
                HalErrorKind::InvalidArgument
            ))
        );
        assert_eq!(
            DCMI.lookup(-8023),
            Some((
                "DCMI_ERR_CODE_CONFIG_INFO_NOT_EXIST",
                HalErrorKind::NotSupported
            ))
        );
        // Numbers are read in their own library's numbering only: DCMI's 19 is not
        // HCCL_E_NETWORK.
        assert_eq!(DCMI.lookup(19), None);
        assert_eq!(ACL.lookup(-8006), None);
        let odd = DCMI.status(19);
        assert_eq!((odd.vendor.name, odd.kind), (None, HalErrorKind::Other));
        // The names reports and metric labels have always carried.
        assert_eq!(
            (ACL.library().as_str(), DCMI.library().as_str()),
            ("acl", "dcmi")
        );
    }
}
