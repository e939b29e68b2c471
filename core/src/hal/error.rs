//! The device layer's error, shaped like embedded-hal's: a small vendor-neutral
//! [`HalErrorKind`] the control plane can act on without knowing the hardware, and beside it the
//! vendor's own identity of the failure ([`VendorCode`]: library, numeric code, the vendor's
//! name for it), kept as the library returned it and never re-read in another library's
//! numbering.

use super::codes::{self, HcclCode};
use serde::{Deserialize, Serialize};
use std::fmt;

/// What kind of failure a HAL call had, whatever the library.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum HalErrorKind {
    /// The library refused the call's arguments (a group or rank it does not know, arrays that
    /// do not match): the same call fails the same way again. In a switch this points at the
    /// planner, the launcher's group description, or groups that changed under taskd.
    InvalidArgument,
    /// The library gave up waiting: a peer never joined the call, a probe got no answer.
    Timeout,
    /// A link or the network failed: connect, transfer, or the library's own retry gave up.
    Network,
    /// A peer of the call is gone: its process failed or left the group.
    PeerLost,
    /// The library or device cannot serve now (not initialised, busy, suspending, shut down);
    /// the same call may succeed later.
    Unavailable,
    /// This library, device or setup cannot do it at all.
    NotSupported,
    /// Anything else: internal, memory and driver errors, and codes this build does not know.
    Other,
}

impl HalErrorKind {
    /// Every kind, in declaration order.
    pub const ALL: [HalErrorKind; 7] = [
        HalErrorKind::InvalidArgument,
        HalErrorKind::Timeout,
        HalErrorKind::Network,
        HalErrorKind::PeerLost,
        HalErrorKind::Unavailable,
        HalErrorKind::NotSupported,
        HalErrorKind::Other,
    ];

    /// The name in metrics labels, logs and serialised reports: `invalid_argument`, ...
    pub fn as_str(self) -> &'static str {
        match self {
            HalErrorKind::InvalidArgument => "invalid_argument",
            HalErrorKind::Timeout => "timeout",
            HalErrorKind::Network => "network",
            HalErrorKind::PeerLost => "peer_lost",
            HalErrorKind::Unavailable => "unavailable",
            HalErrorKind::NotSupported => "not_supported",
            HalErrorKind::Other => "other",
        }
    }
}

impl fmt::Display for HalErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The vendor library a HAL call went to, which is the numbering its code is in.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Library {
    /// HCCL (`libhccl.so`): communicators and NIC switching; codes are `HcclResult`.
    Hccl,
    /// ACL (`libascendcl.so`): devices, streams, memory; codes are `aclError`.
    Acl,
    /// DCMI (`libdcmi.so`): device management, link health; codes are DCMI's negative codes.
    Dcmi,
    /// taskd's simulated hardware (`taskd-hal-mock`) where it stands for no vendor library;
    /// it has no codes of its own. (Its simulated HCCL answers with HCCL's codes.)
    Mock,
}

impl Library {
    /// Every library, in declaration order.
    pub const ALL: [Library; 4] = [Library::Hccl, Library::Acl, Library::Dcmi, Library::Mock];

    /// The name in serialised errors and on the wire: `hccl`, `acl`, `dcmi`, `mock`.
    pub fn as_str(self) -> &'static str {
        match self {
            Library::Hccl => "hccl",
            Library::Acl => "acl",
            Library::Dcmi => "dcmi",
            Library::Mock => "mock",
        }
    }

    /// This build's name for `code` in this library's numbering (`DCMI_ERR_CODE_TIME_OUT`);
    /// `None` for a code it does not know, and always for the mock, which has no codes.
    pub fn code_name(self, code: i32) -> Option<&'static str> {
        codes::lookup(self, code).map(|(n, _)| n)
    }
}

impl fmt::Display for Library {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Library::Hccl => "HCCL",
            Library::Acl => "ACL",
            Library::Dcmi => "DCMI",
            Library::Mock => "mock",
        })
    }
}

/// The label value for a code this build has no name for (and for no code at all).
pub const OTHER_CODE_NAME: &str = "OTHER";

/// The vendor's identity of a failure, as the library reported it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct VendorCode {
    /// The library, and so the numbering of `code`.
    pub library: Library,
    /// The status the library returned; `None` when the HAL failed the call itself, before or
    /// without a library call (see [`HalError::uncoded`]).
    pub code: Option<i32>,
    /// The vendor's name for `code` (`HCCL_E_NETWORK`, `DCMI_ERR_CODE_TIME_OUT`) as the process
    /// that met the error knew it; `None` for a code its build has no name for.
    pub name: Option<String>,
}

impl VendorCode {
    /// `code` in `library`'s numbering, named from this build's tables.
    pub fn new(library: Library, code: i32) -> Self {
        VendorCode {
            library,
            code: Some(code),
            name: library.code_name(code).map(str::to_owned),
        }
    }

    /// No code: the HAL of `library` failed the call without the library answering.
    pub fn none(library: Library) -> Self {
        VendorCode {
            library,
            code: None,
            name: None,
        }
    }

    /// The kind this build maps the code to; [`HalErrorKind::Other`] for an unknown code or
    /// none.
    pub fn kind(&self) -> HalErrorKind {
        self.code
            .and_then(|c| codes::lookup(self.library, c))
            .map_or(HalErrorKind::Other, |(_, k)| k)
    }

    /// The `code` label of `taskd_hal_errors_total`: this build's name of the code, else
    /// [`OTHER_CODE_NAME`]. Looked up again from (library, code), never taken from `name`, so
    /// the label's values are the names in this build's tables plus one, whatever a peer sent.
    pub fn metric_name(&self) -> &'static str {
        self.code
            .and_then(|c| codes::lookup(self.library, c))
            .map_or(OTHER_CODE_NAME, |(n, _)| n)
    }
}

impl From<HcclCode> for VendorCode {
    fn from(c: HcclCode) -> Self {
        VendorCode::new(Library::Hccl, c.raw())
    }
}

impl fmt::Display for VendorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.code, &self.name) {
            (Some(c), Some(n)) => write!(f, "{n} ({c})"),
            (Some(c), None) => write!(f, "{} code {c}", self.library),
            (None, _) => write!(f, "no {} code", self.library),
        }
    }
}

/// An error from the device layer: what failed, its kind, the vendor's code, and what was
/// being done.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HalError {
    /// The call that failed: the C function (`HcclCommWorkingDevNicSet`) or the HAL's step.
    pub op: String,
    /// What the control plane can act on.
    pub kind: HalErrorKind,
    /// The library's own identity of the failure. Boxed: it keeps `HalError`, and every
    /// `Result` and report that carries one, small.
    pub vendor: Box<VendorCode>,
    /// What was being done, and what the library or HAL said, in words.
    pub detail: String,
}

impl HalError {
    /// `op` failed with `vendor`'s code; the kind is this build's mapping of the code (see
    /// [`HcclCode::kind`] and the tables in `core/src/hal/codes.rs`).
    pub fn new(
        op: impl Into<String>,
        vendor: impl Into<VendorCode>,
        detail: impl Into<String>,
    ) -> Self {
        let vendor = vendor.into();
        HalError {
            op: op.into(),
            kind: vendor.kind(),
            vendor: Box::new(vendor),
            detail: detail.into(),
        }
    }

    /// `op` failed in the HAL of `library` without a code from the library: a precondition
    /// the HAL checks itself, a library that is not there.
    pub fn uncoded(
        op: impl Into<String>,
        library: Library,
        kind: HalErrorKind,
        detail: impl Into<String>,
    ) -> Self {
        HalError {
            op: op.into(),
            kind,
            vendor: Box::new(VendorCode::none(library)),
            detail: detail.into(),
        }
    }

    /// A failure of taskd's simulated hardware (or a test's scripted one) of this `kind`.
    pub fn mock(op: impl Into<String>, kind: HalErrorKind, detail: impl Into<String>) -> Self {
        HalError::uncoded(op, Library::Mock, kind, detail)
    }

    /// The `HcclResult`, when HCCL returned the error.
    pub fn hccl(&self) -> Option<HcclCode> {
        match (self.vendor.library, self.vendor.code) {
            (Library::Hccl, Some(c)) => Some(HcclCode::from_raw(c)),
            _ => None,
        }
    }

    /// The numeric `HcclResult`, when HCCL returned the error (what the control API's
    /// `hccl_code` carries; a DCMI or ACL code is never reported as one).
    pub fn hccl_code(&self) -> Option<i32> {
        self.hccl().map(HcclCode::raw)
    }
}

impl fmt::Display for HalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.vendor.code {
            Some(_) => write!(
                f,
                "{} failed with {}: {}",
                self.op, self.vendor, self.detail
            ),
            None => write!(f, "{} failed ({}): {}", self.op, self.kind, self.detail),
        }
    }
}

impl std::error::Error for HalError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_hccl_error_keeps_its_code_and_name_and_gets_its_kind() {
        let e = HalError::new("HcclCommWorkingDevNicSet", HcclCode::Network, "link down");
        assert_eq!(e.kind, HalErrorKind::Network);
        assert_eq!(e.vendor.library, Library::Hccl);
        assert_eq!(e.vendor.code, Some(19));
        assert_eq!(e.vendor.name.as_deref(), Some("HCCL_E_NETWORK"));
        assert_eq!(e.hccl(), Some(HcclCode::Network));
        assert_eq!(e.hccl_code(), Some(19));
        assert_eq!(
            e.to_string(),
            "HcclCommWorkingDevNicSet failed with HCCL_E_NETWORK (19): link down"
        );
    }

    #[test]
    fn a_dcmi_code_is_never_read_as_hccl() {
        let e = HalError::new(
            "dcmi_get_device_network_health",
            VendorCode::new(Library::Dcmi, -8006),
            "card_id=1, device_id=0",
        );
        assert_eq!(e.kind, HalErrorKind::Timeout);
        assert_eq!(e.vendor.name.as_deref(), Some("DCMI_ERR_CODE_TIME_OUT"));
        assert_eq!(e.hccl(), None);
        assert_eq!(e.hccl_code(), None);
        assert_eq!(e.vendor.metric_name(), "DCMI_ERR_CODE_TIME_OUT");
        assert!(
            e.to_string().contains("DCMI_ERR_CODE_TIME_OUT (-8006)"),
            "{e}"
        );
        // DCMI's 19 is not HCCL_E_NETWORK.
        let odd = VendorCode::new(Library::Dcmi, 19);
        assert_eq!(
            (odd.name.as_deref(), odd.kind()),
            (None, HalErrorKind::Other)
        );
    }

    #[test]
    fn unknown_codes_keep_their_number_and_count_as_other() {
        let e = HalError::new("HcclCommResume", HcclCode::Other(77), "");
        assert_eq!(e.kind, HalErrorKind::Other);
        assert_eq!((e.vendor.code, e.vendor.name.as_deref()), (Some(77), None));
        assert_eq!(e.hccl_code(), Some(77));
        assert_eq!(e.vendor.metric_name(), OTHER_CODE_NAME);
        assert_eq!(e.to_string(), "HcclCommResume failed with HCCL code 77: ");
        let acl = VendorCode::new(Library::Acl, 123_456);
        assert_eq!(acl.to_string(), "ACL code 123456");
    }

    #[test]
    fn the_metric_name_comes_from_this_build_never_from_a_peer() {
        let mut e = HalError::new("HcclCommWorkingDevNicSet", HcclCode::Timeout, "");
        e.vendor.name = Some("HCCL_E_FROM_A_NEWER_PEER".into());
        assert_eq!(e.vendor.metric_name(), "HCCL_E_TIMEOUT");
        e.vendor.code = Some(1000);
        assert_eq!(e.vendor.metric_name(), OTHER_CODE_NAME);
    }

    #[test]
    fn an_uncoded_error_says_its_kind() {
        let e = HalError::uncoded(
            "dcmi",
            Library::Dcmi,
            HalErrorKind::NotSupported,
            "no device management library",
        );
        assert_eq!(*e.vendor, VendorCode::none(Library::Dcmi));
        assert_eq!(e.vendor.metric_name(), OTHER_CODE_NAME);
        assert_eq!(
            e.to_string(),
            "dcmi failed (not_supported): no device management library"
        );
        assert_eq!(e.vendor.to_string(), "no DCMI code");
        let m = HalError::mock("sim", HalErrorKind::PeerLost, "gone");
        assert_eq!(
            (m.vendor.library, m.kind),
            (Library::Mock, HalErrorKind::PeerLost)
        );
    }

    #[test]
    fn it_round_trips_through_serde_with_readable_names() {
        let e = HalError::new(
            "aclrtMalloc",
            VendorCode::new(Library::Acl, 207_001),
            "1 MiB",
        );
        let json = serde_json::to_value(&e).unwrap();
        assert_eq!(json["kind"], "other");
        assert_eq!(json["vendor"]["library"], "acl");
        assert_eq!(json["vendor"]["name"], "ACL_ERROR_RT_MEMORY_ALLOCATION");
        assert_eq!(serde_json::from_value::<HalError>(json).unwrap(), e);
        for k in HalErrorKind::ALL {
            assert_eq!(serde_json::to_value(k).unwrap(), k.as_str());
        }
    }
}
