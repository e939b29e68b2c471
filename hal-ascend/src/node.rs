//! [`AscendNodeHal`]: the per-node HAL over DCMI, every probe bounded in time.

use crate::codes::DCMI;
use crate::result::{self, DcmiError, NetworkHealth};
use crate::search::EnvLookup;
use crate::sys::dcmi::DcmiLib;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use taskd_core::env::{self, EnvError, TASKD_DCMI_TIMEOUT_MS};
use taskd_core::{DeviceId, HalError, HalErrorKind, LinkHealth, NodeHal, SideState};

/// How long one DCMI call may take before its answer counts as unknown: 1 s, the bound
/// MindCluster puts on `dcmi_get_device_network_health`, which it documents as occasionally
/// blocking for a long time after a card drops.
pub const DEFAULT_PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// The probe timeout from [`TASKD_DCMI_TIMEOUT_MS`] (milliseconds, at least 1); unset:
/// [`DEFAULT_PROBE_TIMEOUT`]. A value that is not a number, or 0, is an error naming it.
pub fn probe_timeout_from_env(env: EnvLookup<'_>) -> Result<Duration, EnvError> {
    Ok(
        env::parse_positive(env, TASKD_DCMI_TIMEOUT_MS)?.map_or(DEFAULT_PROBE_TIMEOUT, |ms| {
            Duration::from_millis(u64::from(ms))
        }),
    )
}

/// Where a die sits in DCMI's own numbering: `card_id` as `dcmi_get_card_list` returns it,
/// `device_id` the chip's index on that card. On Atlas A3 a card carries the two dies of one
/// NPU, chips 0 and 1.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DcmiLocation {
    /// DCMI's card id.
    pub card_id: i32,
    /// The chip's index on the card.
    pub device_id: i32,
}

impl DcmiLocation {
    /// The other die of the same NPU, in DCMI's numbering: the same card, chip `device_id ^ 1`.
    /// (Whether DCMI knows such a chip, and this node sees it, only a call can tell.)
    pub fn partner(self) -> DcmiLocation {
        DcmiLocation {
            card_id: self.card_id,
            device_id: self.device_id ^ 1,
        }
    }
}

impl fmt::Display for DcmiLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "card {} chip {}", self.card_id, self.device_id)
    }
}

/// A die this node's DCMI shows, in all three numberings.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct VisibleDie {
    /// Its logical id here (what `aclrtSetDevice` takes in this container).
    pub logical: u32,
    /// Its physical id (the rank table's).
    pub physical: DeviceId,
    /// Its place in DCMI's numbering.
    pub location: DcmiLocation,
}

/// A DCMI call that gave no usable answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProbeError {
    /// DCMI answered with an error code.
    #[error(transparent)]
    Dcmi(#[from] DcmiError),
    /// The call did not return within the probe timeout (it goes on, on a thread of its own).
    #[error("{call} did not answer within {after:?}")]
    TimedOut {
        /// The call and its arguments.
        call: String,
        /// The timeout it exceeded.
        after: Duration,
    },
    /// The same call, started earlier, has still not returned: it is not started again.
    #[error("{call} has not returned since it was started {since:?} ago")]
    StillRunning {
        /// The call and its arguments.
        call: String,
        /// How long it has been running.
        since: Duration,
    },
    /// No thread could be started for the call, or it died.
    #[error("{call} could not run: {reason}")]
    Thread {
        /// The call and its arguments.
        call: String,
        /// What went wrong.
        reason: String,
    },
}

impl From<ProbeError> for HalError {
    /// A DCMI code stays DCMI's; a probe without an answer is a [`HalErrorKind::Timeout`].
    fn from(e: ProbeError) -> Self {
        match e {
            ProbeError::Dcmi(e) => e.into(),
            ProbeError::TimedOut { ref call, .. } | ProbeError::StillRunning { ref call, .. } => {
                let op = call.split('(').next().unwrap_or(call).to_owned();
                DCMI.uncoded(op, HalErrorKind::Timeout, e.to_string())
            }
            ProbeError::Thread { ref call, .. } => {
                let op = call.split('(').next().unwrap_or(call).to_owned();
                DCMI.uncoded(op, HalErrorKind::Other, e.to_string())
            }
        }
    }
}

/// Calls started and not returned yet, by call (a stuck one is not started twice), and a
/// condition variable told whenever one returns.
#[derive(Default)]
struct InFlight {
    calls: Mutex<BTreeMap<String, Instant>>,
    returned: Condvar,
}

impl InFlight {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, Instant>> {
        // The map stays valid whatever panicked while it was held.
        self.calls.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn done(&self, call: &str) {
        self.lock().remove(call);
        self.returned.notify_all();
    }
}

/// A call running on its probe thread.
struct Pending<T> {
    call: String,
    answer: Result<mpsc::Receiver<Result<T, DcmiError>>, ProbeError>,
}

/// The per-node HAL: NIC link health (the proxy's [`NodeHal`]) and, for preflight and the
/// hardware rig, the node's dies, read through DCMI.
///
/// **Device numbering.** [`NodeHal::link_health`] takes a die's *physical* id, the rank
/// table's ([`DeviceId`]), and resolves it with `dcmi_get_card_id_device_id_from_phyid`.
/// Logical ids (renumbered from 0 inside a container) enter only through the calls named
/// `*_logical`. The partner die is `(card_id, device_id ^ 1)` in DCMI's own numbering
/// ([`DcmiLocation::partner`]), never derived from a logical id.
///
/// **Link health.** The primary side is `dcmi_get_device_network_health` of the die itself,
/// the backup side the same probe on its partner die: on Atlas A3 each card carries the two
/// dies of one NPU, and a die's backup NIC is its partner's NIC. The probe reports reachability
/// of a detect IP the operator configures per NIC (`hccn_tool -i <id> -netdetect -s address
/// <ip>`), so a NIC without one never reads as up; which results count as up is written down
/// at [`NetworkHealth::is_up`], and a side that is not up is [`SideState::Down`] with the
/// probe's result. A side whose probe fails, times out, or names a die this node cannot see (a
/// partner outside the container) is [`SideState::Unknown`] with the reason, and the manager
/// refuses a switch onto it. DCMI has no degraded state.
///
/// **Bounded probes.** Every DCMI call runs on a thread of its own and is waited for at most
/// the probe timeout ([`DEFAULT_PROBE_TIMEOUT`], [`probe_timeout_from_env`]); a call that does
/// not return in time is given up on (its thread finishes whenever DCMI returns) and is not
/// started again while it hangs. No lock is held while a call runs, so a stuck probe delays
/// nobody beyond the timeout: not the next operation's sample phase, not `taskd doctor`.
pub struct AscendNodeHal {
    dcmi: Arc<DcmiLib>,
    timeout: Duration,
    in_flight: Arc<InFlight>,
}

impl AscendNodeHal {
    /// Calls `dcmi_init` and keeps the library; probes are bounded by [`DEFAULT_PROBE_TIMEOUT`].
    pub fn new(dcmi: DcmiLib) -> Result<Self, ProbeError> {
        Self::with_timeout(dcmi, DEFAULT_PROBE_TIMEOUT)
    }

    /// As [`AscendNodeHal::new`], with every DCMI call bounded by `timeout`.
    pub fn with_timeout(dcmi: DcmiLib, timeout: Duration) -> Result<Self, ProbeError> {
        let hal = AscendNodeHal {
            dcmi: Arc::new(dcmi),
            timeout,
            in_flight: Arc::default(),
        };
        hal.bounded("dcmi_init()".into(), result::dcmi::init)?;
        Ok(hal)
    }

    /// How long one DCMI call may take.
    pub fn probe_timeout(&self) -> Duration {
        self.timeout
    }

    /// DCMI calls given up on that have not returned yet, with how long they have run.
    pub fn probes_in_flight(&self) -> Vec<(String, Duration)> {
        self.in_flight
            .lock()
            .iter()
            .map(|(c, t)| (c.clone(), t.elapsed()))
            .collect()
    }

    /// Waits until every DCMI call started so far has returned, or `timeout` passes; whether
    /// none is left. For an orderly shutdown and for tests; nothing else needs to wait.
    pub fn wait_probes_returned(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut calls = self.in_flight.lock();
        while !calls.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            calls = self
                .in_flight
                .returned
                .wait_timeout(calls, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        true
    }

    /// Where the die of physical id `device` sits (`dcmi_get_card_id_device_id_from_phyid`).
    pub fn locate_physical(&self, device: DeviceId) -> Result<DcmiLocation, ProbeError> {
        let call = format!("dcmi_get_card_id_device_id_from_phyid(device_phy_id={device})");
        let (card_id, device_id) = self.bounded(call, move |l| {
            result::dcmi::get_card_id_device_id_from_phyid(l, device.0)
        })?;
        Ok(DcmiLocation { card_id, device_id })
    }

    /// Where the die of logical id `logical` sits (`dcmi_get_card_id_device_id_from_logicid`).
    pub fn locate_logical(&self, logical: u32) -> Result<DcmiLocation, ProbeError> {
        let call = format!("dcmi_get_card_id_device_id_from_logicid(device_logic_id={logical})");
        let (card_id, device_id) = self.bounded(call, move |l| {
            result::dcmi::get_card_id_device_id_from_logicid(l, logical)
        })?;
        Ok(DcmiLocation { card_id, device_id })
    }

    /// The physical id of logical id `logical` (`dcmi_get_device_phyid_from_logicid`).
    pub fn physical_of_logical(&self, logical: u32) -> Result<DeviceId, ProbeError> {
        let call = format!("dcmi_get_device_phyid_from_logicid(logicid={logical})");
        self.bounded(call, move |l| {
            result::dcmi::get_device_phyid_from_logicid(l, logical)
        })
        .map(DeviceId)
    }

    /// The raw probe result of one die's own NIC.
    pub fn network_health(&self, at: DcmiLocation) -> Result<NetworkHealth, ProbeError> {
        let p = self.start_health(at);
        self.finish(p, Instant::now() + self.timeout)
    }

    /// The node's dies as DCMI counts them: the sum of `dcmi_get_device_num_in_card` over
    /// `dcmi_get_card_list`. Only preflight and the rig ask; the proxy never needs it.
    pub fn device_count(&self) -> Result<u32, ProbeError> {
        let cards = self.bounded("dcmi_get_card_list()".into(), result::dcmi::get_card_list)?;
        let mut total: u32 = 0;
        for card in cards {
            let call = format!("dcmi_get_device_num_in_card(card_id={card})");
            let n = self.bounded(call, move |l| result::dcmi::get_device_num_in_card(l, card))?;
            total += u32::try_from(n).unwrap_or(0);
        }
        Ok(total)
    }

    /// Every die this node's DCMI shows (logical ids `0..device_count()`), in all three
    /// numberings, by logical id.
    pub fn visible_dies(&self) -> Result<Vec<VisibleDie>, ProbeError> {
        (0..self.device_count()?)
            .map(|logical| {
                Ok(VisibleDie {
                    logical,
                    physical: self.physical_of_logical(logical)?,
                    location: self.locate_logical(logical)?,
                })
            })
            .collect()
    }

    /// Runs `call` on a thread of its own and waits for it at most the probe timeout.
    fn bounded<T: Send + 'static>(
        &self,
        call: String,
        f: impl FnOnce(&DcmiLib) -> Result<T, DcmiError> + Send + 'static,
    ) -> Result<T, ProbeError> {
        let p = self.start(call, f);
        self.finish(p, Instant::now() + self.timeout)
    }

    fn start_health(&self, at: DcmiLocation) -> Pending<NetworkHealth> {
        let call = format!(
            "dcmi_get_device_network_health(card_id={}, device_id={})",
            at.card_id, at.device_id
        );
        self.start(call, move |l| {
            result::dcmi::get_device_network_health(l, at.card_id, at.device_id)
        })
    }

    /// Starts `f` on a probe thread, unless the same call is still running from before.
    fn start<T: Send + 'static>(
        &self,
        call: String,
        f: impl FnOnce(&DcmiLib) -> Result<T, DcmiError> + Send + 'static,
    ) -> Pending<T> {
        if let Some(started) = self.in_flight.lock().get(&call) {
            let since = started.elapsed();
            return Pending {
                answer: Err(ProbeError::StillRunning {
                    call: call.clone(),
                    since,
                }),
                call,
            };
        }
        self.in_flight.lock().insert(call.clone(), Instant::now());
        let (tx, rx) = mpsc::sync_channel(1);
        let (lib, in_flight, key) = (
            Arc::clone(&self.dcmi),
            Arc::clone(&self.in_flight),
            call.clone(),
        );
        let spawned = std::thread::Builder::new()
            .name("dcmi-probe".into())
            .spawn(move || {
                let answer = f(&lib);
                in_flight.done(&key);
                // The caller may have stopped waiting: nobody to tell then.
                let _ = tx.send(answer);
            });
        let answer = match spawned {
            Ok(_) => Ok(rx),
            Err(e) => {
                self.in_flight.done(&call);
                Err(ProbeError::Thread {
                    call: call.clone(),
                    reason: e.to_string(),
                })
            }
        };
        Pending { call, answer }
    }

    /// The answer of `p`, waiting until `deadline` at most.
    fn finish<T>(&self, p: Pending<T>, deadline: Instant) -> Result<T, ProbeError> {
        let rx = p.answer?;
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(answer) => answer.map_err(ProbeError::from),
            Err(mpsc::RecvTimeoutError::Timeout) => Err(ProbeError::TimedOut {
                call: p.call,
                after: self.timeout,
            }),
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(ProbeError::Thread {
                call: p.call,
                reason: "the probe thread ended without an answer".into(),
            }),
        }
    }
}

impl NodeHal for AscendNodeHal {
    /// `device` is a physical id. Both dies are probed at once, within one probe timeout.
    fn link_health(&mut self, device: DeviceId) -> Result<LinkHealth, HalError> {
        let own = self.locate_physical(device)?;
        let partner = own.partner();
        let deadline = Instant::now() + self.timeout;
        let (p_own, p_partner) = (self.start_health(own), self.start_health(partner));
        let primary = match self.finish(p_own, deadline) {
            Ok(h) => side_state(h),
            Err(e) => SideState::Unknown(format!(
                "the probe of its own NIC ({own}) gave no answer: {e}"
            )),
        };
        let backup = match self.finish(p_partner, deadline) {
            Ok(h) => side_state(h),
            Err(e) => SideState::Unknown(format!(
                "its backup NIC is its partner die's ({partner}), whose probe gave no \
                 answer: {e}{}",
                partner_hint(&e)
            )),
        };
        Ok(LinkHealth {
            device,
            primary,
            backup,
        })
    }
}

/// A side the probe answered for: up, or down with the probe's result.
fn side_state(h: NetworkHealth) -> SideState {
    if h.is_up() {
        SideState::Up
    } else {
        SideState::Down(format!("DCMI network health {h}"))
    }
}

/// What a DCMI refusal to probe the partner usually means.
fn partner_hint(e: &ProbeError) -> &'static str {
    match e {
        ProbeError::Dcmi(d) if matches!(d.code, -8007 | -8008) => {
            " (the partner die is not visible here; HCCL switches only when both dies of the \
             NPU are visible to the job)"
        }
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    #[test]
    fn partners_are_the_other_chip_of_the_same_card() {
        let a = DcmiLocation {
            card_id: 12,
            device_id: 0,
        };
        assert_eq!(a.partner().card_id, 12);
        assert_eq!(a.partner().device_id, 1);
        assert_eq!(a.partner().partner(), a);
        assert_eq!(a.to_string(), "card 12 chip 0");
    }

    #[test]
    fn the_probe_timeout_comes_from_the_environment() {
        let env = |v: Option<&'static str>| {
            move |k: &str| {
                (k == TASKD_DCMI_TIMEOUT_MS)
                    .then_some(v)
                    .flatten()
                    .map(OsString::from)
            }
        };
        assert_eq!(
            probe_timeout_from_env(&env(None)).unwrap(),
            DEFAULT_PROBE_TIMEOUT
        );
        assert_eq!(
            probe_timeout_from_env(&env(Some("250"))).unwrap(),
            Duration::from_millis(250)
        );
        for bad in ["0", "soon", "-5"] {
            let e = probe_timeout_from_env(&env(Some(bad))).unwrap_err();
            assert!(e.to_string().contains(TASKD_DCMI_TIMEOUT_MS), "{e}");
        }
    }

    #[test]
    fn a_probe_without_an_answer_is_a_timeout_and_a_dcmi_code_stays_dcmis() {
        let e: HalError = ProbeError::TimedOut {
            call: "dcmi_get_device_network_health(card_id=1, device_id=0)".into(),
            after: Duration::from_secs(1),
        }
        .into();
        assert_eq!(
            (e.op.as_str(), e.kind, &e.vendor.library, e.vendor.code),
            (
                "dcmi_get_device_network_health",
                HalErrorKind::Timeout,
                DCMI.library(),
                None
            )
        );
        let e: HalError = ProbeError::Dcmi(DcmiError {
            op: "dcmi_init",
            args: String::new(),
            code: -8023,
        })
        .into();
        assert_eq!(
            e.vendor.name.as_deref(),
            Some("DCMI_ERR_CODE_CONFIG_INFO_NOT_EXIST")
        );
        assert_eq!(e.kind, HalErrorKind::NotSupported);
    }
}
