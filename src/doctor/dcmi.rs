//! The doctor's DCMI checks: the dies this node shows, whether each one's partner die is
//! visible too, and the link health of both NICs of each, every DCMI call bounded in time
//! (`taskd_hal_ascend::node`), so the doctor answers even when a probe hangs.

use super::{Check, DoctorConfig};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use taskd_core::env::{self as flags, EnvLookup};
use taskd_core::{NicSide, NodeHal};
use taskd_hal_ascend::node::{self, DcmiLocation, VisibleDie};
use taskd_hal_ascend::sys::dcmi::DcmiLib;
use taskd_hal_ascend::AscendNodeHal;

const DEVICES: &str = "dcmi:devices";
const PARTNERS: &str = "dcmi:partners";
const LINKS: &str = "dcmi:links";

const DRIVER_FIX: &str = "check that the NPU driver is installed and loaded (`npu-smi info`) and \
                          that this process may open the devices (run as root or in the \
                          container with the devices mounted)";

/// `dcmi:devices`, then (when DCMI listed the dies) `dcmi:partners` and `dcmi:links`.
pub(crate) fn checks(cfg: &DoctorConfig, env: EnvLookup<'_>) -> Vec<Check> {
    let (devices, found) = devices(cfg, env);
    let mut out = vec![devices];
    if let Some((mut hal, dies)) = found {
        let usable = usable(&dies, env);
        out.push(partners(&dies, &usable));
        out.push(links(&mut hal, &usable));
    }
    out
}

/// The probe timeout: the configured one, else `TASKD_DCMI_TIMEOUT_MS`, else 1 s; and what
/// was wrong with the variable, if anything.
fn timeout(cfg: &DoctorConfig, env: EnvLookup<'_>) -> (Duration, Option<String>) {
    if let Some(t) = cfg.probe_timeout {
        return (t, None);
    }
    match node::probe_timeout_from_env(env) {
        Ok(t) => (t, None),
        Err(e) => (node::DEFAULT_PROBE_TIMEOUT, Some(e.to_string())),
    }
}

/// `dcmi_init` and the dies DCMI lists, in all three numberings.
fn devices(
    cfg: &DoctorConfig,
    env: EnvLookup<'_>,
) -> (Check, Option<(AscendNodeHal, Vec<VisibleDie>)>) {
    let (timeout, bad_env) = timeout(cfg, env);
    let hal = DcmiLib::open(env)
        .map_err(|e| e.to_string())
        .and_then(|l| AscendNodeHal::with_timeout(l, timeout).map_err(|e| e.to_string()));
    let hal = match hal {
        Ok(h) => h,
        Err(e) => return (Check::warn(DEVICES, e, DRIVER_FIX), None),
    };
    let dies = match hal.visible_dies() {
        Ok(d) if d.is_empty() => {
            return (
                Check::warn(DEVICES, "DCMI shows no NPU die", DRIVER_FIX),
                None,
            )
        }
        Ok(d) => d,
        Err(e) => return (Check::warn(DEVICES, e.to_string(), DRIVER_FIX), None),
    };
    let physical: Vec<String> = dies.iter().map(|d| d.physical.to_string()).collect();
    let detail = format!(
        "dcmi_init ok, {} NPU dies visible (physical ids {}; probes bounded to {timeout:?})",
        dies.len(),
        physical.join(", ")
    );
    let check = match bad_env {
        None => Check::pass(DEVICES, detail),
        Some(e) => Check::warn(
            DEVICES,
            format!("{detail}; {e}, so the default is used"),
            format!(
                "set {} to a number of milliseconds, or unset it",
                flags::TASKD_DCMI_TIMEOUT_MS
            ),
        ),
    };
    (check, Some((hal, dies)))
}

/// Where the job may run: every die DCMI shows, or only those `ASCEND_RT_VISIBLE_DEVICES`
/// lists (logical ids), with what was wrong with the variable.
struct Usable {
    dies: Vec<VisibleDie>,
    /// The variable's value, when it narrows the dies.
    narrowed_by: Option<String>,
    problem: Option<String>,
}

fn usable(dies: &[VisibleDie], env: EnvLookup<'_>) -> Usable {
    let Some(v) = flags::get(env, flags::ASCEND_RT_VISIBLE_DEVICES) else {
        return Usable {
            dies: dies.to_vec(),
            narrowed_by: None,
            problem: None,
        };
    };
    let ids: Result<BTreeSet<u32>, _> = v.split(',').map(|x| x.trim().parse::<u32>()).collect();
    match ids {
        Ok(ids) => Usable {
            dies: dies
                .iter()
                .filter(|d| ids.contains(&d.logical))
                .copied()
                .collect(),
            narrowed_by: Some(v),
            problem: None,
        },
        Err(_) => Usable {
            dies: dies.to_vec(),
            narrowed_by: None,
            problem: Some(format!(
                "{}={v:?} is not a list of device numbers; checked every die instead",
                flags::ASCEND_RT_VISIBLE_DEVICES
            )),
        },
    }
}

/// Every usable die's partner die (`(card, chip ^ 1)` in DCMI's numbering) must be usable too:
/// HCCL switches a die to its backup NIC only when both dies of the NPU are visible to the job.
fn partners(all: &[VisibleDie], usable: &Usable) -> Check {
    let seen: BTreeMap<DcmiLocation, &VisibleDie> = all.iter().map(|d| (d.location, d)).collect();
    let here: BTreeSet<DcmiLocation> = usable.dies.iter().map(|d| d.location).collect();
    let mut lonely = Vec::new();
    for d in &usable.dies {
        let p = d.location.partner();
        if here.contains(&p) {
            continue;
        }
        let why = match (seen.get(&p), &usable.narrowed_by) {
            (Some(_), Some(v)) => format!("hidden by ASCEND_RT_VISIBLE_DEVICES={v}"),
            _ => "not visible in this container".to_owned(),
        };
        lonely.push(format!(
            "device {} (logical {}, {}): its partner die ({p}) is {why}",
            d.physical, d.logical, d.location
        ));
    }
    if let Some(problem) = &usable.problem {
        lonely.push(problem.clone());
    }
    if lonely.is_empty() {
        return Check::pass(
            PARTNERS,
            format!(
                "both dies of every NPU are visible ({} dies)",
                usable.dies.len()
            ),
        );
    }
    Check::warn(
        PARTNERS,
        format!(
            "{}; HCCL switches a die to its backup NIC (its partner's) only when both dies of \
             the NPU are visible to the job, so the manager refuses such a switch",
            lonely.join("; ")
        ),
        "give the job both dies of every NPU it uses (the pod's devices and \
         ASCEND_RT_VISIBLE_DEVICES)",
    )
}

/// Link health of both NICs of every usable die, as the proxy reads it.
fn links(hal: &mut AscendNodeHal, usable: &Usable) -> Check {
    let mut down = Vec::new();
    let mut unknown = Vec::new();
    let mut errors = Vec::new();
    for d in &usable.dies {
        let dev = d.physical;
        match hal.link_health(dev) {
            Ok(h) => {
                let mut sides = Vec::new();
                for side in [NicSide::Primary, NicSide::Backup] {
                    match h.unknown(side) {
                        Some(why) => unknown.push(format!("{dev} ({side}: {why})")),
                        None if !h.is_up(side) => sides.push(side.to_string()),
                        None => {}
                    }
                }
                if !sides.is_empty() {
                    down.push(format!("{dev} ({})", sides.join("+")));
                }
            }
            Err(e) => errors.push(format!("{dev}: {e}")),
        }
    }
    if down.is_empty() && unknown.is_empty() && errors.is_empty() {
        return Check::pass(
            LINKS,
            format!(
                "all {} devices: primary and backup NIC reachable",
                usable.dies.len()
            ),
        );
    }
    let mut detail = Vec::new();
    for (what, list) in [
        ("not reachable: device", &down),
        ("unknown: device", &unknown),
        ("could not read:", &errors),
    ] {
        if !list.is_empty() {
            detail.push(format!("{what} {}", list.join(", ")));
        }
    }
    Check::warn(
        LINKS,
        format!(
            "{}; a switch to a NIC that is not reachable, or whose state is unknown, is refused",
            detail.join("; ")
        ),
        "give every NIC a detect IP (`hccn_tool -i <device> -netdetect -s address <gateway>`) and \
         check its link (`hccn_tool -i <device> -link -g`); a probe that does not answer \
         (TASKD_DCMI_TIMEOUT_MS) points at the card or its driver (`npu-smi info`)",
    )
}
