//! DCMI calls returning `Result<_, DcmiError>`.
//!
//! Codes and the `dcmi_rdfx_detect_result` values are those of the DCMI API reference
//! (hiascend.com, `dcmi_get_device_network_health` page) and `dcmi_interface_api.h`.

use crate::codes::DCMI;
use crate::sys::dcmi::{DcmiLib, DcmiResult, MAX_CARD_NUM};
use std::fmt;
use taskd_core::HalError;

/// The header's name for a DCMI status (`dcmi_interface_api.h`, `DCMI_ERROR_CODE_BASE` =
/// -8000; the table is [`DCMI`], shared with the error's kind), or
/// `DCMI_ERR_CODE_UNKNOWN`.
pub fn dcmi_error_name(code: i32) -> &'static str {
    match code {
        0 => "DCMI_OK",
        c => DCMI.name(c).unwrap_or("DCMI_ERR_CODE_UNKNOWN"),
    }
}

/// A failed DCMI call: the C function's name, its arguments, and the code it returned.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{op}({args}) failed with {} ({code})", dcmi_error_name(*.code))]
pub struct DcmiError {
    /// The C function, e.g. `dcmi_get_device_network_health`.
    pub op: &'static str,
    /// The arguments as the call saw them (`card_id=10, device_id=0`): DCMI addresses dies by
    /// card and chip, so the code alone does not say which die failed.
    pub args: String,
    /// The status DCMI returned, in `dcmi_interface_api.h`'s numbering (e.g. -8005,
    /// `DCMI_ERR_CODE_INNER_ERR`; [`dcmi_error_name`] names it); never 0.
    pub code: i32,
}

impl From<DcmiError> for HalError {
    /// Keeps the code as DCMI's, never as an `HcclResult`.
    fn from(e: DcmiError) -> Self {
        HalError::new(e.op, DCMI.status(e.code), e.args)
    }
}

fn check(
    op: &'static str,
    code: DcmiResult,
    args: impl FnOnce() -> String,
) -> Result<(), DcmiError> {
    if code == 0 {
        Ok(())
    } else {
        Err(DcmiError {
            op,
            args: args(),
            code,
        })
    }
}

/// `enum dcmi_rdfx_detect_result`: the state of the RoCE NIC's connectivity probe.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum NetworkHealth {
    /// 0 `DCMI_RDFX_DETECT_OK`: network healthy.
    Ok,
    /// 1 `DCMI_RDFX_DETECT_SOCK_FAIL`: socket creation failed.
    SockFail,
    /// 2 `DCMI_RDFX_DETECT_RECV_TIMEOUT`: receive timed out.
    RecvTimeout,
    /// 3 `DCMI_RDFX_DETECT_UNREACH`: detect IP unreachable.
    Unreach,
    /// 4 `DCMI_RDFX_DETECT_TIME_EXCEEDED`: sending the probe timed out.
    TimeExceeded,
    /// 5 `DCMI_RDFX_DETECT_FAULT`: sending the probe failed.
    Fault,
    /// 6 `DCMI_RDFX_DETECT_INIT`: probe task initialising.
    Init,
    /// 7 `DCMI_RDFX_DETECT_THREAD_ERR`: probe task could not be created.
    ThreadErr,
    /// 8 `DCMI_RDFX_DETECT_IP_SET`: detect IP being set.
    IpSet,
    /// Any other value, e.g. 0xFF `DCMI_RDFX_DETECT_MAX`.
    Other(i32),
}

impl NetworkHealth {
    const KNOWN: [NetworkHealth; 9] = [
        NetworkHealth::Ok,
        NetworkHealth::SockFail,
        NetworkHealth::RecvTimeout,
        NetworkHealth::Unreach,
        NetworkHealth::TimeExceeded,
        NetworkHealth::Fault,
        NetworkHealth::Init,
        NetworkHealth::ThreadErr,
        NetworkHealth::IpSet,
    ];

    /// The enum value DCMI wrote; [`NetworkHealth::Other`] for any value outside 0..=8.
    pub fn from_raw(v: i32) -> Self {
        usize::try_from(v)
            .ok()
            .and_then(|i| Self::KNOWN.get(i).copied())
            .unwrap_or(NetworkHealth::Other(v))
    }

    /// The numeric `dcmi_rdfx_detect_result`.
    pub fn raw(self) -> i32 {
        match self {
            NetworkHealth::Other(v) => v,
            known => Self::KNOWN.iter().position(|k| *k == known).unwrap_or(0) as i32,
        }
    }

    /// Where taskd decides what "up" means: `DCMI_RDFX_DETECT_OK` and `DCMI_RDFX_DETECT_INIT`.
    ///
    /// This follows MindCluster's own tools, which count both as healthy: its device plugin
    /// reports a die's network healthy for OK and INIT and unhealthy for every other value,
    /// and its npu-exporter does the same. INIT is what the probe reports while its detect
    /// task starts (after a driver load or a detect IP change), on links that carry traffic;
    /// reading it as down refused switches onto working NICs. Every other value (socket or
    /// thread failures, no answer, unreachable, the detect IP being set, unknown values)
    /// counts as down.
    pub fn is_up(self) -> bool {
        matches!(self, NetworkHealth::Ok | NetworkHealth::Init)
    }
}

impl fmt::Display for NetworkHealth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:?} ({})", self.raw())
    }
}

/// `dcmi_init`: must precede every other DCMI call.
pub fn init(lib: &DcmiLib) -> Result<(), DcmiError> {
    check("dcmi_init", lib.init(), String::new)
}

/// `dcmi_get_card_list`: the ids of the node's cards (at most `MAX_CARD_NUM`).
pub fn get_card_list(lib: &DcmiLib) -> Result<Vec<i32>, DcmiError> {
    let mut list = [0i32; MAX_CARD_NUM];
    let (code, num) = lib.get_card_list(&mut list);
    check("dcmi_get_card_list", code, || {
        format!("list_len={MAX_CARD_NUM}")
    })?;
    let n = usize::try_from(num).unwrap_or(0).min(MAX_CARD_NUM);
    Ok(list[..n].to_vec())
}

/// `dcmi_get_device_num_in_card`: the number of chips on `card_id`.
pub fn get_device_num_in_card(lib: &DcmiLib, card_id: i32) -> Result<i32, DcmiError> {
    let (code, n) = lib.get_device_num_in_card(card_id);
    check("dcmi_get_device_num_in_card", code, || {
        format!("card_id={card_id}")
    })
    .map(|()| n)
}

/// `dcmi_get_card_id_device_id_from_logicid`: `(card_id, device_id)` of a logical NPU id.
pub fn get_card_id_device_id_from_logicid(
    lib: &DcmiLib,
    logic_id: u32,
) -> Result<(i32, i32), DcmiError> {
    let (code, card, device) = lib.get_card_id_device_id_from_logicid(logic_id);
    located(
        "dcmi_get_card_id_device_id_from_logicid",
        code,
        (card, device),
    )
    .map_err(|e| with_args(e, format!("device_logic_id={logic_id}")))
}

/// `dcmi_get_card_id_device_id_from_phyid`: `(card_id, device_id)` of a physical id (the `N`
/// of `/dev/davinciN`, the rank table's id).
pub fn get_card_id_device_id_from_phyid(
    lib: &DcmiLib,
    phy_id: u32,
) -> Result<(i32, i32), DcmiError> {
    let (code, card, device) = lib.get_card_id_device_id_from_phyid(phy_id);
    located(
        "dcmi_get_card_id_device_id_from_phyid",
        code,
        (card, device),
    )
    .map_err(|e| with_args(e, format!("device_phy_id={phy_id}")))
}

/// `at` when `code` is `DCMI_OK`, else the error of `op` (its arguments filled in by the
/// caller).
fn located(op: &'static str, code: DcmiResult, at: (i32, i32)) -> Result<(i32, i32), DcmiError> {
    check(op, code, String::new).map(|()| at)
}

fn with_args(mut e: DcmiError, args: String) -> DcmiError {
    e.args = args;
    e
}

/// `dcmi_get_device_phyid_from_logicid`: the physical id of a logical id.
pub fn get_device_phyid_from_logicid(lib: &DcmiLib, logic_id: u32) -> Result<u32, DcmiError> {
    let (code, phy) = lib.get_device_phyid_from_logicid(logic_id);
    check("dcmi_get_device_phyid_from_logicid", code, || {
        format!("logicid={logic_id}")
    })
    .map(|()| phy)
}

/// `dcmi_get_device_network_health`: the RoCE NIC's connectivity probe on one chip.
pub fn get_device_network_health(
    lib: &DcmiLib,
    card_id: i32,
    device_id: i32,
) -> Result<NetworkHealth, DcmiError> {
    let (code, v) = lib.get_device_network_health(card_id, device_id);
    check("dcmi_get_device_network_health", code, || {
        format!("card_id={card_id}, device_id={device_id}")
    })
    .map(|()| NetworkHealth::from_raw(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detect_results_round_trip_and_ok_and_init_are_up() {
        for v in 0..=8 {
            let h = NetworkHealth::from_raw(v);
            assert_eq!(h.raw(), v);
            assert!(!matches!(h, NetworkHealth::Other(_)));
            assert_eq!(h.is_up(), v == 0 || v == 6, "{h}");
        }
        assert!(NetworkHealth::Init.is_up());
        assert!(!NetworkHealth::IpSet.is_up());
        assert_eq!(NetworkHealth::from_raw(3), NetworkHealth::Unreach);
        assert_eq!(NetworkHealth::from_raw(0xFF), NetworkHealth::Other(0xFF));
        assert_eq!(NetworkHealth::from_raw(-1), NetworkHealth::Other(-1));
        assert!(!NetworkHealth::Other(0xFF).is_up());
    }

    #[test]
    fn dcmi_errors_keep_their_code_and_name() {
        let e = DcmiError {
            op: "dcmi_get_device_network_health",
            args: "card_id=1, device_id=0".into(),
            code: -8005,
        };
        assert_eq!(
            e.to_string(),
            "dcmi_get_device_network_health(card_id=1, device_id=0) failed with \
             DCMI_ERR_CODE_INNER_ERR (-8005)"
        );
        let h: HalError = e.into();
        assert_eq!(h.op, "dcmi_get_device_network_health");
        assert_eq!(
            (&h.vendor.library, h.vendor.code, h.vendor.name.as_deref()),
            (DCMI.library(), Some(-8005), Some("DCMI_ERR_CODE_INNER_ERR"))
        );
        assert_eq!((h.kind, h.hccl()), (taskd_core::HalErrorKind::Other, None));
        assert_eq!(dcmi_error_name(-8255), "DCMI_ERR_CODE_NOT_SUPPORT");
        assert_eq!(dcmi_error_name(-1), "DCMI_ERR_CODE_UNKNOWN");
    }
}
