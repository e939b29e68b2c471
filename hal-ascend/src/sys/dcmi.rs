//! `libdcmi.so`: the device management calls that map a die's physical or logical id to DCMI's
//! `(card_id, device_id)` and read RoCE link health.
//!
//! Sources followed (Huawei's DCMI API reference on hiascend.com, 设备管理接口 section, and the
//! driver header `dcmi_interface_api.h`):
//!
//! - `int dcmi_init(void)`, header.
//! - `int dcmi_get_card_list(int *card_num, int *card_list, int list_len)`: card count (at most
//!   64) and card ids; the reference (e.g. Atlas 200I A2 24.1.0 `re/api/api_008.html`) marks
//!   `dcmi_get_card_num_list` deprecated in its favour.
//! - `int dcmi_get_device_num_in_card(int card_id, int *device_num)`, header.
//! - `int dcmi_get_card_id_device_id_from_logicid(int *card_id, int *device_id, unsigned int
//!   device_logic_id)` (`re/api/api_102.html`).
//! - `int dcmi_get_card_id_device_id_from_phyid(int *card_id, int *device_id, unsigned int
//!   device_phy_id)` (`re/api/api_101.html`): the physical id is the `N` of `/dev/davinciN`,
//!   the id HCCL's rank table carries.
//! - `int dcmi_get_device_phyid_from_logicid(unsigned int logicid, unsigned int *phyid)`
//!   (`re/api/api_099.html`; HDK A2DCMI `dcmi_113.html`).
//! - `int dcmi_get_device_network_health(int card_id, int device_id, enum
//!   dcmi_rdfx_detect_result *result)` (`re/api/api_074.html`; HDK A2DCMI `dcmi_088.html`):
//!   "查询RoCE网卡的IP地址的连通状态", the connectivity of the RoCE NIC's IP, with `result` one of
//!   `DCMI_RDFX_DETECT_OK` 0, `SOCK_FAIL` 1, `RECV_TIMEOUT` 2, `UNREACH` 3, `TIME_EXCEEDED` 4,
//!   `FAULT` 5, `INIT` 6, `THREAD_ERR` 7, `IP_SET` 8, `MAX` 0xFF.
//!
//! `card_id` values are the ids `dcmi_get_card_list` returns (not necessarily 0..n);
//! `device_id` is the chip index inside a card ("通过dcmi_get_device_id_in_card接口获取"). Every
//! call returns 0 (`DCMI_OK`) or a negative `DCMI_ERR_CODE_*`.
//!
//! The Atlas A3 DCMI reference lists `dcmi_init`, `dcmi_get_card_list`,
//! `dcmi_get_device_num_in_card`, `dcmi_get_card_id_device_id_from_logicid` and
//! `dcmi_get_device_network_health` as supported on every A3 product, in unprivileged
//! containers too. The two physical-id calls were followed in the A2-series editions (bare
//! metal and containers: supported) and have not been checked against the A3 edition.

use super::Loaded;
use crate::search::{EnvLookup, LoadError, DCMI};
use std::path::Path;

/// DCMI status: 0 is `DCMI_OK`, failures are negative (`DCMI_ERROR_CODE_BASE` = -8000).
pub type DcmiResult = i32;

/// `MAX_CARD_NUM` in `dcmi_interface_api.h`: a node has at most 64 cards.
pub const MAX_CARD_NUM: usize = 64;

type FnInit = unsafe extern "C" fn() -> DcmiResult;
type FnGetCardList = unsafe extern "C" fn(*mut i32, *mut i32, i32) -> DcmiResult;
type FnGetDeviceNumInCard = unsafe extern "C" fn(i32, *mut i32) -> DcmiResult;
type FnFromLogicId = unsafe extern "C" fn(*mut i32, *mut i32, u32) -> DcmiResult;
type FnFromPhyId = unsafe extern "C" fn(*mut i32, *mut i32, u32) -> DcmiResult;
type FnPhyIdFromLogicId = unsafe extern "C" fn(u32, *mut u32) -> DcmiResult;
type FnNetworkHealth = unsafe extern "C" fn(i32, i32, *mut i32) -> DcmiResult;

/// Every function the table binds, in binding order: what a preflight looks for
/// ([`super::probe_symbols`]).
pub const SYMBOLS: &[&str] = &[
    "dcmi_init",
    "dcmi_get_card_list",
    "dcmi_get_device_num_in_card",
    "dcmi_get_card_id_device_id_from_logicid",
    "dcmi_get_card_id_device_id_from_phyid",
    "dcmi_get_device_phyid_from_logicid",
    "dcmi_get_device_network_health",
];

/// The DCMI function table. `Send + Sync`: the calls carry no handle and DCMI serves them from
/// any thread, so the node HAL runs each probe on a thread of its own (to bound it in time).
pub struct DcmiLib {
    init: FnInit,
    get_card_list: FnGetCardList,
    get_device_num_in_card: FnGetDeviceNumInCard,
    card_id_device_id_from_logicid: FnFromLogicId,
    card_id_device_id_from_phyid: FnFromPhyId,
    device_phyid_from_logicid: FnPhyIdFromLogicId,
    device_network_health: FnNetworkHealth,
    // Keeps the library mapped for as long as the pointers above exist.
    loaded: Loaded,
}

impl DcmiLib {
    /// Searches for `libdcmi.so` (see [`crate::search`]) and binds every function.
    pub fn open(env: EnvLookup<'_>) -> Result<Self, LoadError> {
        Self::bind(Loaded::search(&DCMI, env)?)
    }

    /// Loads exactly `path` and binds every function.
    pub fn open_path(path: impl AsRef<Path>) -> Result<Self, LoadError> {
        Self::bind(Loaded::path(&DCMI, path.as_ref())?)
    }

    /// The file the library was loaded from (as the candidate was written).
    pub fn path(&self) -> &Path {
        self.loaded.file()
    }

    fn bind(loaded: Loaded) -> Result<Self, LoadError> {
        // SAFETY: each type alias above transcribes the documented prototype of its symbol;
        // `enum dcmi_rdfx_detect_result` is a C enum whose values fit in `int`, so it is
        // `int`-sized. The pointers are stored next to `loaded`, which keeps the library mapped.
        unsafe {
            Ok(DcmiLib {
                init: loaded.function("dcmi_init")?,
                get_card_list: loaded.function("dcmi_get_card_list")?,
                get_device_num_in_card: loaded.function("dcmi_get_device_num_in_card")?,
                card_id_device_id_from_logicid: loaded
                    .function("dcmi_get_card_id_device_id_from_logicid")?,
                card_id_device_id_from_phyid: loaded
                    .function("dcmi_get_card_id_device_id_from_phyid")?,
                device_phyid_from_logicid: loaded.function("dcmi_get_device_phyid_from_logicid")?,
                device_network_health: loaded.function("dcmi_get_device_network_health")?,
                loaded,
            })
        }
    }

    /// `dcmi_init()`.
    pub fn init(&self) -> DcmiResult {
        // SAFETY: no arguments.
        unsafe { (self.init)() }
    }

    /// `dcmi_get_card_list(&card_num, card_list, list_len)` with `list_len = list.len()`.
    /// Returns the status and the card count DCMI reported (which may exceed `list.len()`).
    pub fn get_card_list(&self, list: &mut [i32]) -> (DcmiResult, i32) {
        let len = i32::try_from(list.len()).unwrap_or(i32::MAX);
        let mut num = 0i32;
        // SAFETY: `list` is writable for `len` ints (never more than its length); `num` is a
        // valid out slot.
        let code = unsafe { (self.get_card_list)(&mut num, list.as_mut_ptr(), len) };
        (code, num)
    }

    /// `dcmi_get_device_num_in_card(card_id, &device_num)`.
    pub fn get_device_num_in_card(&self, card_id: i32) -> (DcmiResult, i32) {
        let mut num = 0i32;
        // SAFETY: `num` is a valid out slot.
        let code = unsafe { (self.get_device_num_in_card)(card_id, &mut num) };
        (code, num)
    }

    /// `dcmi_get_card_id_device_id_from_logicid(&card_id, &device_id, device_logic_id)`.
    pub fn get_card_id_device_id_from_logicid(&self, logic_id: u32) -> (DcmiResult, i32, i32) {
        let (mut card, mut device) = (0i32, 0i32);
        // SAFETY: both are valid out slots.
        let code =
            unsafe { (self.card_id_device_id_from_logicid)(&mut card, &mut device, logic_id) };
        (code, card, device)
    }

    /// `dcmi_get_card_id_device_id_from_phyid(&card_id, &device_id, device_phy_id)`.
    pub fn get_card_id_device_id_from_phyid(&self, phy_id: u32) -> (DcmiResult, i32, i32) {
        let (mut card, mut device) = (0i32, 0i32);
        // SAFETY: both are valid out slots.
        let code = unsafe { (self.card_id_device_id_from_phyid)(&mut card, &mut device, phy_id) };
        (code, card, device)
    }

    /// `dcmi_get_device_phyid_from_logicid(logicid, &phyid)`.
    pub fn get_device_phyid_from_logicid(&self, logic_id: u32) -> (DcmiResult, u32) {
        let mut phy = 0u32;
        // SAFETY: `phy` is a valid out slot.
        let code = unsafe { (self.device_phyid_from_logicid)(logic_id, &mut phy) };
        (code, phy)
    }

    /// `dcmi_get_device_network_health(card_id, device_id, &result)`; the result is the raw
    /// `enum dcmi_rdfx_detect_result` value.
    pub fn get_device_network_health(&self, card_id: i32, device_id: i32) -> (DcmiResult, i32) {
        // DCMI_RDFX_DETECT_MAX, as the reference's call example initialises it.
        let mut result = 0xFF_i32;
        // SAFETY: `result` is a valid, int-sized out slot.
        let code = unsafe { (self.device_network_health)(card_id, device_id, &mut result) };
        (code, result)
    }
}
