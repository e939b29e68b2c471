//! The device layer's error, shaped like embedded-hal's: a small vendor-neutral
//! [`HalErrorKind`] the control plane can act on without knowing the hardware, and beside it the
//! vendor's own identity of the failure ([`VendorCode`]: library, numeric code, the vendor's
//! name for it), kept as the library returned it and never re-read in another library's
//! numbering.
//!
//! The kind is the contract's and closed; the vendor is open. Each backend names its library
//! ([`LibraryName`]) and owns the table of its codes ([`super::CodeTable`]), which fills in the
//! name and the kind when the backend builds the error: a new backend adds its table to its
//! own crate and touches nothing here.

use super::codes::HcclCode;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::borrow::Cow;
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

/// The vendor library a HAL call went to, which is the numbering its code is in: `hccl`,
/// `acl`, `dcmi`, `mock`, or whatever name a new backend gives its library.
///
/// A short lowercase identifier (a letter, then letters, digits or `_`; at most
/// [`LibraryName::MAX_LEN`] bytes): it is a metric label's neighbour, a JSON value and a wire
/// field, so it is checked wherever one is read ([`LibraryName::parse`]) and at compile time
/// for a backend's own ([`LibraryName::new`] in a `const`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LibraryName(Cow<'static, str>);

/// A library name that is not a short lowercase identifier.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "library name {0:?} is not a short lowercase identifier \
     (a-z, then a-z, 0-9 or _, at most {max} bytes)",
    max = LibraryName::MAX_LEN
)]
pub struct LibraryNameError(pub String);

/// Whether `b` is a valid library name; `const` so a backend's own name is checked when it
/// compiles.
const fn valid_library_name(b: &[u8]) -> bool {
    if b.is_empty() || b.len() > LibraryName::MAX_LEN || !b[0].is_ascii_lowercase() {
        return false;
    }
    let mut i = 1;
    while i < b.len() {
        let c = b[i];
        if !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_') {
            return false;
        }
        i += 1;
    }
    true
}

impl LibraryName {
    /// The longest name, in bytes.
    pub const MAX_LEN: usize = 16;

    /// A training framework's own switch function and settings (`taskd-capi`'s framework HAL,
    /// the framework's TSP): no vendor library answers there, so an error under this name has
    /// no code, only the framework's words.
    pub const FRAMEWORK: LibraryName = LibraryName::new("framework");

    /// A backend's name for its library. Panics on a name that is not a short lowercase
    /// identifier, which in a `const` is a compile error:
    ///
    /// ```
    /// const ACME: taskd_core::LibraryName = taskd_core::LibraryName::new("acme");
    /// assert_eq!(ACME.as_str(), "acme");
    /// ```
    ///
    /// ```compile_fail
    /// const ACME: taskd_core::LibraryName = taskd_core::LibraryName::new("ACME NICs");
    /// ```
    pub const fn new(name: &'static str) -> Self {
        assert!(
            valid_library_name(name.as_bytes()),
            "a library name is a short lowercase identifier"
        );
        LibraryName(Cow::Borrowed(name))
    }

    /// A name read from outside (a peer, a file).
    pub fn parse(name: impl Into<String>) -> Result<Self, LibraryNameError> {
        let name = name.into();
        if valid_library_name(name.as_bytes()) {
            Ok(LibraryName(Cow::Owned(name)))
        } else {
            Err(LibraryNameError(name))
        }
    }

    /// The name in serialised errors and on the wire.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for LibraryName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for LibraryName {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for LibraryName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        LibraryName::parse(String::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

/// The label value for a code this build has no name for (and for no code at all).
pub const OTHER_CODE_NAME: &str = "OTHER";

/// The vendor's identity of a failure, as the library reported it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct VendorCode {
    /// The library, and so the numbering of `code`.
    pub library: LibraryName,
    /// The status the library returned; `None` when the HAL failed the call itself, before or
    /// without a library call (see [`HalError::uncoded`]).
    pub code: Option<i32>,
    /// The vendor's name for `code` (`HCCL_E_NETWORK`, `DCMI_ERR_CODE_TIME_OUT`) as the process
    /// that met the error knew it; `None` for a code its build has no name for. Borrowed when
    /// it comes from a code table of this build, owned when it was read from a peer or a file.
    pub name: Option<Cow<'static, str>>,
}

impl VendorCode {
    /// No code: the HAL of `library` failed the call without the library answering.
    pub fn none(library: LibraryName) -> Self {
        VendorCode {
            library,
            code: None,
            name: None,
        }
    }

    /// The `code` label of `taskd_hal_errors_total`: the name when a code table of this build
    /// gave it (a `'static` name), else [`OTHER_CODE_NAME`]. A name read from a peer or a file
    /// is never a label, so the label's values are the names in this build's tables plus one,
    /// whatever a peer sent.
    pub fn metric_name(&self) -> &'static str {
        match self.name {
            Some(Cow::Borrowed(n)) => n,
            _ => OTHER_CODE_NAME,
        }
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

/// A library's status as the backend that called it reads it: the vendor's identity and the
/// kind the backend's table maps it to. What [`HalError::new`] is built from
/// ([`super::CodeTable::status`], or an [`HcclCode`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VendorStatus {
    /// The library, code and name.
    pub vendor: VendorCode,
    /// What the control plane can make of it.
    pub kind: HalErrorKind,
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
    /// `op` failed with the library's `status`: its code and name, and the kind the backend's
    /// table maps it to (see [`HcclCode::kind`] and [`super::CodeTable`]).
    pub fn new(
        op: impl Into<String>,
        status: impl Into<VendorStatus>,
        detail: impl Into<String>,
    ) -> Self {
        let VendorStatus { vendor, kind } = status.into();
        HalError {
            op: op.into(),
            kind,
            vendor: Box::new(vendor),
            detail: detail.into(),
        }
    }

    /// `op` failed in the HAL of `library` without a code from the library: a precondition
    /// the HAL checks itself, a library that is not there.
    pub fn uncoded(
        op: impl Into<String>,
        library: LibraryName,
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

    /// The `HcclResult`, when HCCL returned the error.
    pub fn hccl(&self) -> Option<HcclCode> {
        match self.vendor.code {
            Some(c) if self.vendor.library == HcclCode::LIBRARY => Some(HcclCode::from_raw(c)),
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
    use super::super::CodeTable;
    use super::*;

    /// A backend's table, as a new backend's crate would write it.
    const NICS: CodeTable = CodeTable::new(
        LibraryName::new("nicvendor"),
        &[
            (-2, "NIC_E_TIMEOUT", HalErrorKind::Timeout),
            (-7, "NIC_E_LINK", HalErrorKind::Network),
        ],
    );

    #[test]
    fn an_hccl_error_keeps_its_code_and_name_and_gets_its_kind() {
        let e = HalError::new("HcclCommWorkingDevNicSet", HcclCode::Network, "link down");
        assert_eq!(e.kind, HalErrorKind::Network);
        assert_eq!(e.vendor.library.as_str(), "hccl");
        assert_eq!(e.vendor.code, Some(19));
        assert_eq!(e.vendor.name.as_deref(), Some("HCCL_E_NETWORK"));
        assert_eq!(e.vendor.metric_name(), "HCCL_E_NETWORK");
        assert_eq!(e.hccl(), Some(HcclCode::Network));
        assert_eq!(e.hccl_code(), Some(19));
        assert_eq!(
            e.to_string(),
            "HcclCommWorkingDevNicSet failed with HCCL_E_NETWORK (19): link down"
        );
    }

    #[test]
    fn a_backends_code_is_named_by_its_table_and_never_read_as_hccl() {
        let e = HalError::new("nic_probe", NICS.status(-2), "port 1");
        assert_eq!(e.kind, HalErrorKind::Timeout);
        assert_eq!(e.vendor.library.as_str(), "nicvendor");
        assert_eq!(e.vendor.name.as_deref(), Some("NIC_E_TIMEOUT"));
        assert_eq!((e.hccl(), e.hccl_code()), (None, None));
        assert_eq!(e.vendor.metric_name(), "NIC_E_TIMEOUT");
        assert_eq!(
            e.to_string(),
            "nic_probe failed with NIC_E_TIMEOUT (-2): port 1"
        );
        // The vendor's 19 is not HCCL_E_NETWORK, and an HCCL number means nothing here.
        let odd = NICS.status(19);
        assert_eq!(
            (odd.vendor.name.as_deref(), odd.kind),
            (None, HalErrorKind::Other)
        );
        assert_eq!(odd.vendor.to_string(), "nicvendor code 19");
    }

    #[test]
    fn unknown_codes_keep_their_number_and_count_as_other() {
        let e = HalError::new("HcclCommResume", HcclCode::Other(77), "");
        assert_eq!(e.kind, HalErrorKind::Other);
        assert_eq!((e.vendor.code, e.vendor.name.as_deref()), (Some(77), None));
        assert_eq!(e.hccl_code(), Some(77));
        assert_eq!(e.vendor.metric_name(), OTHER_CODE_NAME);
        assert_eq!(e.to_string(), "HcclCommResume failed with hccl code 77: ");
    }

    #[test]
    fn the_metric_name_comes_from_this_build_never_from_a_peer() {
        let mut e = HalError::new("HcclCommWorkingDevNicSet", HcclCode::Timeout, "");
        assert_eq!(e.vendor.metric_name(), "HCCL_E_TIMEOUT");
        // What a peer sent, or a report read back from a file, is an owned name.
        e.vendor.name = Some(Cow::Owned("HCCL_E_FROM_A_NEWER_PEER".into()));
        assert_eq!(e.vendor.metric_name(), OTHER_CODE_NAME);
        let read: HalError = serde_json::from_value(
            serde_json::to_value(HalError::new("op", HcclCode::Timeout, "")).unwrap(),
        )
        .unwrap();
        assert_eq!(read.vendor.name.as_deref(), Some("HCCL_E_TIMEOUT"));
        assert_eq!(read.vendor.metric_name(), OTHER_CODE_NAME);
    }

    #[test]
    fn an_uncoded_error_says_its_kind() {
        let e = NICS.uncoded("nic", HalErrorKind::NotSupported, "no management library");
        assert_eq!(*e.vendor, VendorCode::none(LibraryName::new("nicvendor")));
        assert_eq!(e.vendor.metric_name(), OTHER_CODE_NAME);
        assert_eq!(
            e.to_string(),
            "nic failed (not_supported): no management library"
        );
        assert_eq!(e.vendor.to_string(), "no nicvendor code");
    }

    #[test]
    fn it_round_trips_through_serde_with_readable_names() {
        let e = HalError::new("nic_probe", NICS.status(-7), "1 MiB");
        let json = serde_json::to_value(&e).unwrap();
        assert_eq!(json["kind"], "network");
        assert_eq!(json["vendor"]["library"], "nicvendor");
        assert_eq!(json["vendor"]["name"], "NIC_E_LINK");
        assert_eq!(serde_json::from_value::<HalError>(json).unwrap(), e);
        for k in HalErrorKind::ALL {
            assert_eq!(serde_json::to_value(k).unwrap(), k.as_str());
        }
        let mut bad = serde_json::to_value(&e).unwrap();
        bad["vendor"]["library"] = "Nic Vendor".into();
        let err = serde_json::from_value::<HalError>(bad).unwrap_err();
        assert!(err.to_string().contains("\"Nic Vendor\""), "{err}");
    }

    #[test]
    fn library_names_are_short_lowercase_identifiers() {
        for good in ["hccl", "dcmi", "a", "nic_v2", "abcdefghijklmnop"] {
            assert_eq!(LibraryName::parse(good).unwrap().as_str(), good);
        }
        for bad in [
            "",
            "HCCL",
            "2nic",
            "_x",
            "nic-v2",
            "a b",
            "abcdefghijklmnopq",
            "é",
        ] {
            assert_eq!(
                LibraryName::parse(bad),
                Err(LibraryNameError(bad.into())),
                "{bad:?}"
            );
        }
        assert!(std::panic::catch_unwind(|| LibraryName::new("Acme")).is_err());
        // A name read from a peer equals the backend's own.
        assert_eq!(LibraryName::parse("hccl").unwrap(), HcclCode::LIBRARY);
    }
}
