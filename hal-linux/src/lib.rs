//! taskd-hal-linux: the node HAL for devices whose NICs are Linux network interfaces (a rig of
//! namespaces, a PyTorch job on Gloo, any host whose planes are kernel interfaces).
//!
//! Each device names its primary and backup interface ([`LinkConfig`]). A side is
//!
//! - **down** when the kernel says so: `operstate` is not `up` (or `unknown` with carrier) or
//!   `carrier` is 0, read from `/sys/class/net/IF/` ([`sysfs`]);
//! - **degraded** when it is up but the probe on its plane ([`probe`]: a short train of ICMP
//!   echo requests to the job's peers on that plane, sent from that interface) loses more than
//!   `max_loss` of them or its slowest answer takes longer than `max_rtt_ms`. A train rather
//!   than one echo: a link that is up but starved (rate-limited, congested) delays the last
//!   echoes of the train behind the first ones, which a single ping does not see;
//! - **up** otherwise; **unknown** when the interface cannot be read or a probe fails to send.
//!   A proxy that cannot open a raw ICMP socket (it needs `CAP_NET_RAW`) says so once and goes
//!   by the kernel's state alone, as without a probe.
//!
//! A device the configuration does not name is unknown on both sides, with that reason.
//! Several devices sharing an interface are read and probed once per round: answers are kept
//! for `cache_ms`.

pub mod config;
pub mod netlink;
pub mod probe;
pub mod sysfs;

pub use config::{ConfigError, DeviceLinks, LinkConfig, ProbeConfig};

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use taskd_core::hal::LinkWake;
use taskd_core::{DeviceId, HalError, LinkHealth, NicSide, NodeHal};

/// What one interface was found to be: the control plane's own link state. Up: carrier, and
/// answers within the thresholds; degraded: up, but the probe's loss or round-trip time is past
/// a threshold; down: no carrier or administratively down, in the kernel's words; unknown: it
/// could not be read or probed.
pub use taskd_core::SideState;

/// The node HAL over Linux interfaces.
pub struct LinuxNodeHal {
    cfg: LinkConfig,
    sys: sysfs::SysNet,
    cache: HashMap<(String, NicSide), (Instant, SideState)>,
    /// The probe cannot run in this process (no raw socket): said once, then not tried again.
    no_probe: bool,
    /// Interfaces the kernel said changed since they were last read: read afresh, whatever
    /// the cache holds ([`NodeHal::watch`]).
    changed: Arc<Mutex<BTreeSet<String>>>,
}

impl LinuxNodeHal {
    /// A HAL reading `/sys/class/net`, probing as `cfg` says.
    pub fn new(cfg: LinkConfig) -> Self {
        LinuxNodeHal::with_sysfs(cfg, sysfs::SysNet::default())
    }

    /// A HAL reading interfaces under another root (tests).
    pub fn with_sysfs(cfg: LinkConfig, sys: sysfs::SysNet) -> Self {
        LinuxNodeHal {
            cfg,
            sys,
            cache: HashMap::new(),
            no_probe: false,
            changed: Arc::default(),
        }
    }

    /// Every interface the configuration names.
    pub fn interfaces(&self) -> BTreeSet<String> {
        self.cfg
            .devices
            .values()
            .flat_map(|d| [d.primary.clone(), d.backup.clone()])
            .collect()
    }

    /// The state of `iface`, the interface of `side`: the kernel's, then the probe's.
    pub fn side_state(&mut self, iface: &str, side: NicSide) -> SideState {
        let key = (iface.to_owned(), side);
        let ttl = Duration::from_millis(self.cfg.cache_ms);
        let fresh = self
            .changed
            .lock()
            .map(|mut c| c.remove(iface))
            .unwrap_or(false);
        if let Some((at, s)) = self.cache.get(&key).filter(|_| !fresh) {
            if at.elapsed() < ttl {
                return s.clone();
            }
        }
        let state = self.measure(iface, side);
        self.cache.insert(key, (Instant::now(), state.clone()));
        state
    }

    fn measure(&mut self, iface: &str, side: NicSide) -> SideState {
        match self.sys.link(iface) {
            Err(e) => SideState::Unknown(e.to_string()),
            Ok(l) if !l.is_up() => SideState::Down(l.to_string()),
            Ok(_) => self.probe_side(iface, side),
        }
    }

    fn probe_side(&mut self, iface: &str, side: NicSide) -> SideState {
        let Some(p) = &self.cfg.probe else {
            return SideState::Up;
        };
        let peers = p.peers(side);
        if peers.is_empty() || self.no_probe {
            return SideState::Up;
        }
        match probe::probe(iface, peers, p) {
            Err(e @ probe::ProbeError::Socket(_)) => {
                tracing::warn!(error = %e, "link probe off: links are up or down as the kernel says");
                self.no_probe = true;
                SideState::Up
            }
            Err(e) => SideState::Unknown(e.to_string()),
            Ok(stats) => match stats.verdict(p) {
                None => SideState::Up,
                Some(why) => SideState::Degraded(why),
            },
        }
    }
}

impl NodeHal for LinuxNodeHal {
    fn link_health(&mut self, device: DeviceId) -> Result<LinkHealth, HalError> {
        let Some(links) = self.cfg.devices.get(&device.0).cloned() else {
            let why = format!(
                "device {} has no interfaces in the link configuration",
                device.0
            );
            return Ok(LinkHealth {
                device,
                primary: SideState::Unknown(why.clone()),
                backup: SideState::Unknown(why),
            });
        };
        let primary = self.side_state(&links.primary, NicSide::Primary);
        let backup = self.side_state(&links.backup, NicSide::Backup);
        Ok(LinkHealth {
            device,
            primary,
            backup,
        })
    }

    /// The kernel's link messages ([`netlink`]): a change of a configured interface marks it to
    /// be read afresh and wakes the proxy.
    fn watch(&mut self, wake: LinkWake) -> bool {
        let changed = self.changed.clone();
        let on_event = Box::new(move |e: &netlink::LinkEvent| {
            if let Ok(mut c) = changed.lock() {
                c.insert(e.ifname.clone());
            }
            tracing::debug!(ifname = %e.ifname, carrier = e.has_carrier(), "the kernel says a link changed");
            wake();
        });
        match netlink::watch(self.interfaces(), on_event) {
            Ok(_) => true,
            Err(e) => {
                tracing::warn!(error = %e, "no kernel link events: link changes are seen at the probe rounds");
                false
            }
        }
    }
}

/// The [`LinkHealth`] both sides' states make: the states as they are.
pub fn health(device: DeviceId, primary: &SideState, backup: &SideState) -> LinkHealth {
    LinkHealth {
        device,
        primary: primary.clone(),
        backup: backup.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn cfg() -> LinkConfig {
        let mut devices = BTreeMap::new();
        for d in 0..2 {
            devices.insert(
                d,
                DeviceLinks {
                    primary: "pri".into(),
                    backup: "bak".into(),
                },
            );
        }
        LinkConfig {
            devices,
            probe: None,
            cache_ms: 0,
        }
    }

    #[test]
    fn the_kernels_state_is_each_sides_state() {
        let dir = sysfs::tests::FakeSys::new();
        dir.set("pri", "up", Some("1"));
        dir.set("bak", "down", None);
        let mut hal = LinuxNodeHal::with_sysfs(cfg(), dir.sys());
        let h = hal.link_health(DeviceId(1)).unwrap();
        assert!(h.is_up(NicSide::Primary) && !h.is_up(NicSide::Backup));
        assert_eq!(
            h.unknown(NicSide::Backup),
            None,
            "down is known, not unknown"
        );
        dir.set("bak", "up", Some("1"));
        dir.set("pri", "lowerlayerdown", Some("0"));
        let h = hal.link_health(DeviceId(0)).unwrap();
        assert!(!h.is_up(NicSide::Primary) && h.is_up(NicSide::Backup));
    }

    #[test]
    fn a_missing_interface_or_device_is_unknown() {
        let dir = sysfs::tests::FakeSys::new();
        dir.set("pri", "up", Some("1"));
        let mut hal = LinuxNodeHal::with_sysfs(cfg(), dir.sys());
        let h = hal.link_health(DeviceId(0)).unwrap();
        assert!(h.unknown(NicSide::Backup).unwrap().contains("bak"));
        let h = hal.link_health(DeviceId(7)).unwrap();
        assert!(h.unknown(NicSide::Primary).unwrap().contains("device 7"));
        assert!(!h.is_up(NicSide::Backup));
    }

    #[test]
    fn an_interface_the_kernel_said_changed_is_read_past_the_cache_and_down_says_why() {
        let dir = sysfs::tests::FakeSys::new();
        dir.set("pri", "up", Some("1"));
        dir.set("bak", "up", Some("1"));
        let mut hal = LinuxNodeHal::with_sysfs(
            LinkConfig {
                cache_ms: 3_600_000,
                ..cfg()
            },
            dir.sys(),
        );
        assert!(hal
            .link_health(DeviceId(0))
            .unwrap()
            .is_up(NicSide::Primary));
        // The carrier goes: the cache still says up until the kernel's event marks `pri`
        // (what the watch's callback does) ...
        dir.set("pri", "down", Some("0"));
        assert!(hal
            .link_health(DeviceId(0))
            .unwrap()
            .is_up(NicSide::Primary));
        hal.changed.lock().unwrap().insert("pri".into());
        // ... then it is down, in the kernel's words.
        let h = hal.link_health(DeviceId(0)).unwrap();
        match &h.primary {
            SideState::Down(why) => assert!(why.contains("no carrier"), "{why}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(h.backup, SideState::Up);
    }

    #[test]
    fn a_degraded_side_is_up_and_says_why() {
        let h = health(
            DeviceId(3),
            &SideState::Degraded("loss 50% > 25%".into()),
            &SideState::Up,
        );
        assert!(h.is_up(NicSide::Primary));
        assert_eq!(h.degraded(NicSide::Primary), Some("loss 50% > 25%"));
        assert_eq!(h.degraded(NicSide::Backup), None);
    }
}
