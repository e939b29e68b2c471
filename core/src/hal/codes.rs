//! Vendor status codes: [`CodeTable`], the shape in which a backend writes down its library's
//! codes (their names, as the vendor's headers spell them, and the [`HalErrorKind`] each maps
//! to), and [`HcclCode`], HCCL's `HcclResult`.
//!
//! The contract knows no vendor's numbering: an error carries its library beside its code, and
//! the control API reports both (`library`, `code`; `hccl_code` is kept for HCCL's codes). HCCL's
//! `HcclResult` is written here, not in `taskd-hal-ascend`, because two backends answer in it,
//! the real HCCL and the simulated one (`taskd-hal-mock`, which must not depend on the real
//! one's crate). Every other library's table is its backend's (`taskd-hal-ascend` has ACL's and
//! DCMI's), and a new backend keeps its own in its crate.
//!
//! A code missing from a table is still kept, with its number, wherever it travels; it only has
//! no name in this build and maps to [`HalErrorKind::Other`]. The tables are also what keeps the
//! `code` label of `taskd_hal_errors_total` bounded: the label is a name from a table of this
//! build or `OTHER` (see [`super::VendorCode::metric_name`]).

use super::{HalError, HalErrorKind, LibraryName, VendorCode, VendorStatus};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::fmt;

/// One library's codes as its backend knows them: `(code, vendor's name, kind)`.
///
/// A backend keeps its table in its own crate, next to the calls that return the codes, and
/// builds its errors through it ([`CodeTable::status`], [`CodeTable::uncoded`]), so the name
/// and the kind are filled in where the code is known:
///
/// ```
/// use taskd_core::{CodeTable, HalError, HalErrorKind, LibraryName};
///
/// static ACME: CodeTable = CodeTable::new(
///     LibraryName::new("acme"),
///     &[(-7, "ACME_E_LINK", HalErrorKind::Network)],
/// );
/// let e = HalError::new("acme_set_port", ACME.status(-7), "port 2");
/// assert_eq!((e.kind, e.vendor.metric_name()), (HalErrorKind::Network, "ACME_E_LINK"));
/// assert_eq!(e.to_string(), "acme_set_port failed with ACME_E_LINK (-7): port 2");
/// ```
#[derive(Clone, Debug)]
pub struct CodeTable {
    library: LibraryName,
    codes: &'static [(i32, &'static str, HalErrorKind)],
}

impl CodeTable {
    /// `library`'s codes. One entry per code; a code a table does not list is kept by number
    /// and maps to [`HalErrorKind::Other`].
    pub const fn new(
        library: LibraryName,
        codes: &'static [(i32, &'static str, HalErrorKind)],
    ) -> Self {
        CodeTable { library, codes }
    }

    /// The library whose numbering the codes are in.
    pub fn library(&self) -> &LibraryName {
        &self.library
    }

    /// Every entry, in the table's order.
    pub fn codes(&self) -> &'static [(i32, &'static str, HalErrorKind)] {
        self.codes
    }

    /// The vendor's name and the kind of `code`; `None` for a code the table does not list.
    pub fn lookup(&self, code: i32) -> Option<(&'static str, HalErrorKind)> {
        self.codes
            .iter()
            .find(|(c, _, _)| *c == code)
            .map(|(_, n, k)| (*n, *k))
    }

    /// The vendor's name for `code`, when the table has one.
    pub fn name(&self, code: i32) -> Option<&'static str> {
        self.lookup(code).map(|(n, _)| n)
    }

    /// `code` as the library returned it, named and mapped to its kind by this table.
    pub fn status(&self, code: i32) -> VendorStatus {
        let known = self.lookup(code);
        VendorStatus {
            vendor: VendorCode {
                library: self.library.clone(),
                code: Some(code),
                name: known.map(|(n, _)| Cow::Borrowed(n)),
            },
            kind: known.map_or(HalErrorKind::Other, |(_, k)| k),
        }
    }

    /// `op` failed in this library's HAL without the library answering (see
    /// [`HalError::uncoded`]).
    pub fn uncoded(
        &self,
        op: impl Into<String>,
        kind: HalErrorKind,
        detail: impl Into<String>,
    ) -> HalError {
        HalError::uncoded(op, self.library.clone(), kind, detail)
    }
}

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
    /// HCCL (`libhccl.so`), whose codes are `HcclResult`s.
    pub const LIBRARY: LibraryName = LibraryName::new("hccl");

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

impl From<HcclCode> for VendorStatus {
    fn from(c: HcclCode) -> Self {
        VendorStatus {
            vendor: VendorCode {
                library: HcclCode::LIBRARY,
                code: Some(c.raw()),
                name: c.name().map(Cow::Borrowed),
            },
            kind: c.kind(),
        }
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
    fn an_hccl_status_is_named_and_mapped_from_hcclresult() {
        let s = VendorStatus::from(HcclCode::from_raw(12));
        assert_eq!(s.kind, HalErrorKind::Network);
        assert_eq!(s.vendor.library.as_str(), "hccl");
        assert_eq!(
            (s.vendor.code, s.vendor.name.as_deref()),
            (Some(12), Some("HCCL_E_ROCE_CONNECT"))
        );
        let unknown = VendorStatus::from(HcclCode::from_raw(-8006));
        assert_eq!(
            (unknown.vendor.name, unknown.kind),
            (None, HalErrorKind::Other)
        );
    }

    #[test]
    fn a_table_reads_codes_in_its_own_numbering_only() {
        const T: CodeTable = CodeTable::new(
            LibraryName::new("vendor"),
            &[(-1, "V_E_ARG", HalErrorKind::InvalidArgument)],
        );
        assert_eq!(
            T.lookup(-1),
            Some(("V_E_ARG", HalErrorKind::InvalidArgument))
        );
        assert_eq!((T.name(1), T.lookup(1)), (None, None));
        assert_eq!(T.library().as_str(), "vendor");
        assert_eq!(T.codes().len(), 1);
        let e = T.uncoded("v_init", HalErrorKind::NotSupported, "absent");
        assert_eq!((e.vendor.library.as_str(), e.vendor.code), ("vendor", None));
    }
}
