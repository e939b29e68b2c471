//! `taskd doctor`: preflight for a node about to run a job.
//!
//! Each check looks at one thing a switch depends on and answers [`Status::Pass`],
//! [`Status::Warn`] or [`Status::Fail`], with what it saw and, unless it passed, how to fix it.
//! The node is ready when nothing fails ([`ready`]).
//!
//! | check | FAIL when | WARN when |
//! |---|---|---|
//! | `library:hccl`, `library:acl` | the library does not load, or lacks a function taskd binds | it loaded, but only after an earlier candidate failed |
//! | `library:dcmi` | | it does not load or lacks a function (no link health) |
//! | `dcmi:devices` (only if DCMI loaded) | | `dcmi_init` or listing the dies fails, no die, a bad `TASKD_DCMI_TIMEOUT_MS` |
//! | `dcmi:partners` (only if DCMI listed dies) | | a die's partner die (the other die of its NPU, whose NIC is its backup NIC) is not visible to the job |
//! | `dcmi:links` (only if DCMI listed dies) | | some die's primary or backup NIC is not reachable, or its probe gave no answer |
//! | `env:HCCL_OP_RETRY_ENABLE` | no `L2:1` (HCCL would answer success and switch nothing) | |
//! | `env:MS_ENABLE_TFT` | no `TSP:1` (the manager refuses every switch) | |
//! | `env:PROCESS_RECOVER` | | not `on` |
//! | `env:ELASTIC_PROCESS_RECOVER_ENABLE` | | not `1` |
//! | `env:TASKD_HCCL_RDMA` | set to `0`/`false`/`off`/`no` (no RoCE links: nothing can switch) | |
//! | `job:id` | `MINDX_TASK_ID` unset | |
//! | `job:role` | `MS_SCHED_HOST` or `POD_IP` unset or not an address | one is a host name, the other an address |
//! | `job:node-rank` | no node rank, a value that is not a number, or values that disagree | |
//! | `job:mindio` (only when `MS_ENABLE_TFT` makes every rank a MindIO processor) | `MS_TFT_IP` or `MS_TFT_PORT` unset or unusable (every rank ends itself about 85 s after it starts); on the manager host, `TTP_PORT` or the job's size (`WORLD_SIZE`, `MS_WORKER_NUM`) missing (the manager cannot host MindIO's controller) | `MS_TFT_PORT` is not the manager's `TTP_PORT`, `MINDIO_FOR_MINDSPORE` is not `1` |
//! | `port` | the taskd port cannot be bound on this host (manager host or role unknown) | the same on a worker host |
//!
//! `PROCESS_RECOVER` and `ELASTIC_PROCESS_RECOVER_ENABLE` only warn: taskd does not read them,
//! and a switch works without them. The reference deployment sets them for MindCluster's
//! process-level recovery, which is what brings back a job an operation had to leave in
//! `needs_recovery`.
//!
//! Every check reads the environment through an [`EnvLookup`] (the process environment in
//! the binary, a map in tests) and finds the vendor libraries through the same search as the
//! worker (`taskd_hal_ascend::search`), so what the doctor loads is what a worker would load.
//! Devices are named by their physical ids (the rank table's, `/dev/davinciN`). Every DCMI
//! call is bounded by the probe timeout (`TASKD_DCMI_TIMEOUT_MS`, default 1 s): a probe that
//! hangs makes its side unknown, never the doctor stall.

use serde::Serialize;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};
use std::time::Duration;
use taskd_core::env::{self as flags, EnvLookup};
use taskd_hal_ascend::search::{self, LibrarySpec, LoadError, Origin};
use taskd_hal_ascend::sys::{self, LibraryProbe};

mod dcmi;

/// The port of the taskd network in the reference deployment (container port `taskd-port`):
/// the manager's port.
pub use taskd_actors::net::DEFAULT_MANAGER_PORT as DEFAULT_PORT;

/// The verdict of one check.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Status {
    /// Nothing to do.
    Pass,
    /// Worth a look, not known to break the job; the exit status stays 0.
    Warn,
    /// Something the job needs is missing or wrong here: `taskd doctor` exits non-zero.
    Fail,
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Status::Pass => "PASS",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
        })
    }
}

/// One check's result. Serialized as `{check, status, detail, fix}` (`fix` is `null` for a
/// pass).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Check {
    /// Stable name, e.g. `env:HCCL_OP_RETRY_ENABLE`.
    pub check: String,
    /// The verdict.
    pub status: Status,
    /// What was seen.
    pub detail: String,
    /// How to fix it; `None` when the check passed.
    pub fix: Option<String>,
}

impl Check {
    fn pass(check: impl Into<String>, detail: impl Into<String>) -> Self {
        Check {
            check: check.into(),
            status: Status::Pass,
            detail: detail.into(),
            fix: None,
        }
    }

    fn warn(check: impl Into<String>, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Check {
            check: check.into(),
            status: Status::Warn,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }

    fn fail(check: impl Into<String>, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Check {
            check: check.into(),
            status: Status::Fail,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }

    /// The check's one line: `STATUS  check  detail[  fix: ...]`.
    pub fn line(&self) -> String {
        let mut s = format!("{}  {}  {}", self.status, self.check, self.detail);
        if let Some(fix) = &self.fix {
            s.push_str("  fix: ");
            s.push_str(fix);
        }
        // One line per check, whatever a loader message contained.
        s.replace('\n', " ")
    }
}

/// What the doctor checks besides the environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DoctorConfig {
    /// The taskd port to try to bind.
    pub port: u16,
    /// How long one DCMI call may take; `None`: `TASKD_DCMI_TIMEOUT_MS`, else 1 s.
    pub probe_timeout: Option<Duration>,
}

impl Default for DoctorConfig {
    fn default() -> Self {
        DoctorConfig {
            port: DEFAULT_PORT,
            probe_timeout: None,
        }
    }
}

/// Runs every check, in the order of the table in the module docs.
pub fn run(cfg: &DoctorConfig, env: EnvLookup<'_>) -> Vec<Check> {
    let mut out = vec![
        library(Library::Hccl, env),
        library(Library::Acl, env),
        library(Library::Dcmi, env),
    ];
    if out[2].status == Status::Pass {
        out.extend(dcmi(cfg, env));
    }
    out.extend(FLAGS.iter().map(|f| flag(f, env)));
    out.extend([rdma(env), job_id(env)]);
    let (role_check, role) = role(env);
    out.push(role_check);
    out.push(node_rank(env));
    out.extend(mindio(env, role));
    out.push(port(cfg.port, role));
    out
}

/// The features of `MS_ENABLE_TFT` for which MindSpore 2.10.0 on Ascend makes every rank a
/// MindIO TTP processor, which must reach MindIO's controller (hosted by the job's manager).
const NEEDS_MINDIO: &[&str] = &["TTP:1", "UCE:1", "ARF:1", "TSP:1", "HCCE:1"];

/// MindIO's controller and its processors: where the ranks find the controller
/// (`MS_TFT_IP`, `MS_TFT_PORT`) and, on the manager host, what the manager needs to host it
/// (`TTP_PORT`, the job's size). No check when `MS_ENABLE_TFT` needs no MindIO.
pub fn mindio(env: EnvLookup<'_>, role: Role) -> Option<Check> {
    let name = "job:mindio";
    let tft = get(env, flags::MS_ENABLE_TFT).unwrap_or_default();
    let compact: String = tft.chars().filter(|c| !c.is_whitespace()).collect();
    let needs: Vec<&str> = NEEDS_MINDIO
        .iter()
        .copied()
        .filter(|f| compact.contains(f))
        .collect();
    if needs.is_empty() {
        return None;
    }
    let why = format!(
        "MS_ENABLE_TFT has {}: on an Ascend device every rank is a MindIO processor",
        needs.join(", ")
    );
    let rank_fix =
        "set MS_TFT_IP=$MS_SCHED_HOST and MS_TFT_PORT=$TTP_PORT (the port the manager's \
                    MindIO controller listens on, e.g. 8000) in the launcher's environment";
    let mut fails = Vec::new();
    let tft_port = get_set(env, "MS_TFT_PORT");
    match get_set(env, "MS_TFT_IP") {
        None => fails.push("MS_TFT_IP is unset".to_owned()),
        Some(ip) if flags::parse_ip(ip.trim()).is_none() => {
            fails.push(format!("MS_TFT_IP={ip:?} is not an IP address"))
        }
        Some(_) => {}
    }
    match &tft_port {
        None => fails.push("MS_TFT_PORT is unset (MindSpore's int() of it raises)".to_owned()),
        Some(p) if p.trim().parse::<u16>().map_or(true, |p| p == 0) => {
            fails.push(format!("MS_TFT_PORT={p:?} is not a port"))
        }
        Some(_) => {}
    }
    if !fails.is_empty() {
        let detail = format!(
            "{why}, which cannot reach the controller: {}; every rank would end itself about 85 s \
             after it starts",
            fails.join("; ")
        );
        return Some(Check::fail(name, detail, rank_fix));
    }
    let mut warns = Vec::new();
    if role == Role::Manager {
        let ttp = get_set(env, "TTP_PORT");
        match &ttp {
            None => fails.push("TTP_PORT is unset".to_owned()),
            Some(p) if p.trim().parse::<u16>().map_or(true, |p| p == 0) => {
                fails.push(format!("TTP_PORT={p:?} is not a port"))
            }
            Some(p) if tft_port.as_deref().map(str::trim) != Some(p.trim()) => warns.push(format!(
                "MS_TFT_PORT={:?} is not TTP_PORT={p:?}: the ranks look for the controller \
                 elsewhere",
                tft_port.as_deref().unwrap_or_default()
            )),
            Some(_) => {}
        }
        if get_set(env, flags::WORLD_SIZE).is_none() && get_set(env, "MS_WORKER_NUM").is_none() {
            fails.push("neither WORLD_SIZE nor MS_WORKER_NUM is set".to_owned());
        }
        if !fails.is_empty() {
            let detail = format!(
                "{why}; the manager host cannot host MindIO's controller: {}",
                fails.join("; ")
            );
            let fix =
                "set TTP_PORT (the controller's port, the container port named ttp-port) and \
                       MS_WORKER_NUM (or WORLD_SIZE) in the pod";
            return Some(Check::fail(name, detail, fix));
        }
    }
    if get(env, "MINDIO_FOR_MINDSPORE").map(|v| v.trim().to_owned()) != Some("1".into()) {
        warns.push(
            "MINDIO_FOR_MINDSPORE is not 1: MindIO's processors would import torch and              torch_npu instead of MindSpore"
                .to_owned(),
        );
    }
    let detail = format!("{why}, which finds the controller at MS_TFT_IP:MS_TFT_PORT");
    Some(if warns.is_empty() {
        Check::pass(name, detail)
    } else {
        Check::warn(
            name,
            format!("{detail}; {}", warns.join("; ")),
            "set MS_TFT_PORT=$TTP_PORT and MINDIO_FOR_MINDSPORE=1 for a MindSpore job",
        )
    })
}

/// Whether the node may run the job: no check failed.
pub fn ready(checks: &[Check]) -> bool {
    checks.iter().all(|c| c.status != Status::Fail)
}

/// One line per check.
pub fn render_text(checks: &[Check]) -> String {
    checks.iter().map(|c| c.line() + "\n").collect()
}

fn get(env: EnvLookup<'_>, name: &str) -> Option<String> {
    env(name).map(|v| v.to_string_lossy().into_owned())
}

/// Set and not blank.
fn get_set(env: EnvLookup<'_>, name: &str) -> Option<String> {
    get(env, name).filter(|v| !v.trim().is_empty())
}

fn shown(v: &Option<String>) -> String {
    match v {
        Some(v) => format!("{v:?}"),
        None => "unset".into(),
    }
}

/// `unset` or `"value" has no FLAG`.
fn lacks(v: &Option<String>, flag: &str) -> String {
    match v {
        Some(v) => format!("{v:?} has no {flag}"),
        None => "unset".into(),
    }
}

// ---------------------------------------------------------------------------------------------
// Libraries

/// A vendor library the doctor probes.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Library {
    /// `libhccl.so`: the NIC switch itself.
    Hccl,
    /// `libascendcl.so`: the runtime a rank's HAL and the hardware rig need.
    Acl,
    /// `libdcmi.so`: the proxy's link-health probes.
    Dcmi,
}

impl Library {
    fn spec(self) -> LibrarySpec {
        match self {
            Library::Hccl => search::HCCL,
            Library::Acl => search::ACL,
            Library::Dcmi => search::DCMI,
        }
    }

    fn symbols(self) -> &'static [&'static str] {
        match self {
            Library::Hccl => sys::hccl::SYMBOLS,
            Library::Acl => sys::acl::SYMBOLS,
            Library::Dcmi => sys::dcmi::SYMBOLS,
        }
    }

    /// Functions bound when present (not needed: their absence is only mentioned).
    fn optional(self) -> &'static [&'static str] {
        match self {
            Library::Hccl => sys::hccl::OPTIONAL_SYMBOLS,
            Library::Acl => sys::acl::OPTIONAL_SYMBOLS,
            Library::Dcmi => &[],
        }
    }

    fn check_name(self) -> &'static str {
        match self {
            Library::Hccl => "library:hccl",
            Library::Acl => "library:acl",
            Library::Dcmi => "library:dcmi",
        }
    }

    /// What is lost without it, for the detail of a failure.
    fn without(self) -> &'static str {
        match self {
            Library::Hccl => "a worker cannot reach HCCL, so nothing can be switched",
            Library::Acl => "the Ascend runtime is missing (training cannot run on this node)",
            Library::Dcmi => {
                "the proxy cannot read NIC link health, so a switch to a NIC that is down is not \
                 refused up front"
            }
        }
    }

    fn fix(self) -> String {
        let spec = self.spec();
        match self {
            Library::Hccl | Library::Acl => format!(
                "source the CANN environment (`source /usr/local/Ascend/cann/set_env.sh` for \
                 CANN 8.5 and later, `/usr/local/Ascend/ascend-toolkit/set_env.sh` before: it sets \
                 ASCEND_HOME_PATH and LD_LIBRARY_PATH), or set {}=/path/to/{} (the same file the \
                 training framework loads)",
                spec.override_var, spec.file_name
            ),
            Library::Dcmi => format!(
                "install the NPU driver (it ships {} in /usr/local/Ascend/driver/lib64/driver, \
                 which is searched), put its directory on LD_LIBRARY_PATH, or set {}=/path/to/{}",
                spec.file_name, spec.override_var, spec.file_name
            ),
        }
    }

    /// Severity when the library is unusable.
    fn severity(self) -> Status {
        match self {
            Library::Hccl | Library::Acl => Status::Fail,
            Library::Dcmi => Status::Warn,
        }
    }
}

fn from_where(probe: &LibraryProbe) -> String {
    let c = &probe.loaded;
    match c.origin {
        Origin::LoaderDefault => format!("{} (resolved by the dynamic loader)", c.path.display()),
        ref o => format!("{} (from {o})", c.path.display()),
    }
}

/// Where the search finds `lib` and whether it has every function taskd binds.
pub fn library(lib: Library, env: EnvLookup<'_>) -> Check {
    let spec = lib.spec();
    let name = lib.check_name();
    let bad = |detail: String| Check {
        check: name.into(),
        status: lib.severity(),
        detail,
        fix: Some(lib.fix()),
    };
    match sys::probe_symbols(&spec, lib.symbols(), lib.optional(), env) {
        Err(LoadError::NotFound {
            file_name,
            attempts,
        }) => {
            let tried: Vec<String> = attempts
                .iter()
                .map(|a| {
                    format!(
                        "{} (from {}): {}",
                        a.candidate.path.display(),
                        a.candidate.origin,
                        a.error
                    )
                })
                .collect();
            bad(format!(
                "{file_name} could not be loaded; tried {}; {}",
                tried.join("; "),
                lib.without()
            ))
        }
        Err(e) => bad(e.to_string()),
        Ok(p) if !p.missing.is_empty() => bad(format!(
            "{} lacks {}; {}",
            from_where(&p),
            p.missing.join(", "),
            lib.without()
        )),
        Ok(p) if !p.skipped.is_empty() => {
            let skipped: Vec<String> = p
                .skipped
                .iter()
                .map(|a| {
                    format!(
                        "{} (from {}): {}",
                        a.candidate.path.display(),
                        a.candidate.origin,
                        a.error
                    )
                })
                .collect();
            Check::warn(
                name,
                format!(
                    "{}, all {} functions present, but an earlier candidate did not load: {}",
                    from_where(&p),
                    lib.symbols().len(),
                    skipped.join("; ")
                ),
                format!(
                    "make the first candidate load or remove it, so taskd and the framework use \
                     the same {} (or pin it with {})",
                    spec.file_name, spec.override_var
                ),
            )
        }
        Ok(p) => Check::pass(
            name,
            format!(
                "{}, all {} functions present{}",
                from_where(&p),
                lib.symbols().len(),
                optional_note(&p)
            ),
        ),
    }
}

/// `; optional, absent: X` when the library lacks a function taskd binds only if present.
fn optional_note(p: &LibraryProbe) -> String {
    if p.optional_missing.is_empty() {
        String::new()
    } else {
        format!(
            "; optional, absent (not needed): {}",
            p.optional_missing.join(", ")
        )
    }
}

/// The DCMI checks: `dcmi:devices`, then, when DCMI listed the node's dies, `dcmi:partners`
/// (both dies of each NPU visible) and `dcmi:links` (both NICs of each die reachable). Every
/// DCMI call is bounded by the probe timeout, so a hanging probe makes a side unknown and never
/// stalls the doctor.
pub fn dcmi(cfg: &DoctorConfig, env: EnvLookup<'_>) -> Vec<Check> {
    dcmi::checks(cfg, env)
}

// ---------------------------------------------------------------------------------------------
// Enable flags

/// One enable flag the training processes need: the variable, the value it needs, what goes
/// wrong without it, and how to set it.
#[derive(Copy, Clone, Debug)]
pub struct FlagCheck {
    /// The variable.
    pub var: &'static str,
    /// What it must hold, as the detail says it: `has TSP:1` or `"on"`.
    pub wants: Wants,
    /// Whether the value is enough.
    pub enabled: fn(Option<&str>) -> bool,
    /// What a value that is not enough costs: [`Status::Fail`] or [`Status::Warn`].
    pub severity: Status,
    /// What goes wrong without it.
    pub without: &'static str,
    /// The command that sets it.
    pub fix: &'static str,
}

/// The value an enable flag needs.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Wants {
    /// A list that holds this entry (`L2:1` in `L0:0, L1:1, L2:1`).
    Entry(&'static str),
    /// Exactly this value, spaces aside.
    Exactly(&'static str),
}

/// `HCCL_OP_RETRY_ENABLE` must contain `L2:1` (the fix quotes the reference deployment's value):
/// `L2:1` is what makes `HcclCommWorkingDevNicSet` switch at all.
pub const L2_RETRY: FlagCheck = FlagCheck {
    var: flags::HCCL_OP_RETRY_ENABLE,
    wants: Wants::Entry("L2:1"),
    enabled: flags::l2_retry_enabled,
    severity: Status::Fail,
    without: "HcclCommWorkingDevNicSet would report success and switch nothing",
    fix: "export HCCL_OP_RETRY_ENABLE=\"L0:0, L1:1, L2:1\" for the training processes",
};

/// `MS_ENABLE_TFT` must contain `TSP:1` (the fix quotes the reference deployment's value): it is
/// what a worker reports as its TSP capability.
pub const TSP: FlagCheck = FlagCheck {
    var: flags::MS_ENABLE_TFT,
    wants: Wants::Entry("TSP:1"),
    enabled: flags::tsp_enabled,
    severity: Status::Fail,
    without: "the manager refuses every switch involving this node's ranks",
    fix: "export MS_ENABLE_TFT='{TTP:1,TSP:1}' for the training processes",
};

/// `PROCESS_RECOVER=on` (warning only; see the module docs).
pub const PROCESS_RECOVER: FlagCheck = FlagCheck {
    var: flags::PROCESS_RECOVER,
    wants: Wants::Exactly("on"),
    enabled: |v| v.map(str::trim) == Some("on"),
    severity: Status::Warn,
    without: "switching works, but a job an operation leaves in needs_recovery cannot be \
              recovered in place by MindCluster",
    fix: "export PROCESS_RECOVER=on (and label the pod process-recover-enable: \"on\", annotate \
          it recover-strategy: \"retry\")",
};

/// `ELASTIC_PROCESS_RECOVER_ENABLE=1` (warning only; see the module docs).
pub const ELASTIC_PROCESS_RECOVER: FlagCheck = FlagCheck {
    var: flags::ELASTIC_PROCESS_RECOVER_ENABLE,
    wants: Wants::Exactly("1"),
    enabled: |v| v.map(str::trim) == Some("1"),
    severity: Status::Warn,
    without: "switching works, but MindCluster's process-level recovery is off",
    fix: "export ELASTIC_PROCESS_RECOVER_ENABLE=1",
};

/// The enable flags, in the order the doctor reports them.
pub const FLAGS: [FlagCheck; 4] = [L2_RETRY, TSP, PROCESS_RECOVER, ELASTIC_PROCESS_RECOVER];

/// Checks one enable flag: `env:<VAR>`, passing when its value is enough.
pub fn flag(f: &FlagCheck, env: EnvLookup<'_>) -> Check {
    let name = format!("env:{}", f.var);
    let v = get(env, f.var);
    if (f.enabled)(v.as_deref()) {
        return match f.wants {
            Wants::Entry(e) => Check::pass(name, format!("{} has {e}", shown(&v))),
            Wants::Exactly(want) => Check::pass(name, format!("{want:?}")),
        };
    }
    let seen = match f.wants {
        Wants::Entry(e) => lacks(&v, e),
        Wants::Exactly(want) => format!("{}, not {want:?}", shown(&v)),
    };
    let detail = format!("{seen}: {}", f.without);
    match f.severity {
        Status::Warn => Check::warn(name, detail, f.fix),
        _ => Check::fail(name, detail, f.fix),
    }
}

/// `TASKD_HCCL_RDMA` must not declare the topology RDMA-less.
pub fn rdma(env: EnvLookup<'_>) -> Check {
    let name = "env:TASKD_HCCL_RDMA";
    let v = get(env, flags::TASKD_HCCL_RDMA);
    let caps = taskd_hal_ascend::rank::capabilities_from_env(env);
    if caps.rdma {
        Check::pass(
            name,
            format!("{}: RoCE links assumed (HCCL cannot be asked)", shown(&v)),
        )
    } else {
        Check::fail(
            name,
            format!(
                "{}: declared without RDMA links, where HcclCommWorkingDevNicSet switches nothing",
                shown(&v)
            ),
            "run the job over RoCE between pods; unset TASKD_HCCL_RDMA once it does",
        )
    }
}

// ---------------------------------------------------------------------------------------------
// Job environment (the MindCluster variables of the node setup, docs/a3-node.md)

/// `MINDX_TASK_ID` names the job.
pub fn job_id(env: EnvLookup<'_>) -> Check {
    let name = "job:id";
    match get_set(env, flags::MINDX_TASK_ID) {
        Some(id) => Check::pass(name, format!("MINDX_TASK_ID={:?}", id.trim())),
        None => Check::fail(
            name,
            "MINDX_TASK_ID is unset: the manager and the workers cannot agree on the job",
            "run under MindCluster (it sets MINDX_TASK_ID) or export MINDX_TASK_ID=<job id> the \
             same on every node",
        ),
    }
}

/// Whether this host runs the job's manager.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// `MS_SCHED_HOST` names this host (`POD_IP`): it runs the manager, which must be able
    /// to bind the taskd port.
    Manager,
    /// The manager runs elsewhere: a taskd port that cannot be bound here is only a warning.
    Worker,
    /// `MS_SCHED_HOST` or `POD_IP` is missing or unusable: the port check cannot tell which
    /// applies, and fails like a manager's.
    Unknown,
}

fn family(ip: IpAddr) -> &'static str {
    match ip {
        IpAddr::V4(_) => "IPv4",
        IpAddr::V6(_) => "IPv6",
    }
}

const ROLE_FIX: &str = "set MS_SCHED_HOST to the IP of the pod that runs the manager (the same \
                        on every node) and POD_IP to this pod's IP (Kubernetes downward API: \
                        status.podIP)";

/// `MS_SCHED_HOST` vs `POD_IP`: the manager runs where they are the same host (addresses
/// compared as addresses, as `taskd manager` compares them).
pub fn role(env: EnvLookup<'_>) -> (Check, Role) {
    let name = "job:role";
    let (sched, pod) = match (
        flags::get(env, flags::MS_SCHED_HOST),
        flags::get(env, flags::POD_IP),
    ) {
        (Some(s), Some(p)) => (s, p),
        (s, p) => {
            let unset: Vec<&str> = [(flags::MS_SCHED_HOST, &s), (flags::POD_IP, &p)]
                .iter()
                .filter(|(_, v)| v.is_none())
                .map(|(n, _)| *n)
                .collect();
            let detail = format!(
                "{} unset: cannot tell whether this host runs the manager",
                unset.join(" and ")
            );
            return (Check::fail(name, detail, ROLE_FIX), Role::Unknown);
        }
    };
    let Some(pod_ip) = flags::parse_ip(&pod) else {
        let detail = format!("POD_IP={pod:?} is not an IP address");
        return (Check::fail(name, detail, ROLE_FIX), Role::Unknown);
    };
    let Some(sched_ip) = flags::parse_ip(&sched) else {
        return role_by_host_name(&sched, &pod);
    };
    let fam = if family(sched_ip) == family(pod_ip) {
        family(pod_ip).to_string()
    } else {
        format!("{} / {}", family(sched_ip), family(pod_ip))
    };
    if sched_ip == pod_ip {
        let detail = format!("manager host: MS_SCHED_HOST = POD_IP = {pod_ip} ({fam})");
        (Check::pass(name, detail), Role::Manager)
    } else {
        let detail = format!(
            "worker host: the manager runs at MS_SCHED_HOST={sched_ip}, this pod is \
             POD_IP={pod_ip} ({fam})"
        );
        (Check::pass(name, detail), Role::Worker)
    }
}

/// `MS_SCHED_HOST` is a host name: equal text still means this host.
fn role_by_host_name(sched: &str, pod: &str) -> (Check, Role) {
    let name = "job:role";
    if flags::same_host(sched, pod) {
        let detail = format!("manager host: MS_SCHED_HOST = POD_IP = {pod}");
        return (Check::pass(name, detail), Role::Manager);
    }
    let detail = format!(
        "MS_SCHED_HOST={sched:?} is a host name and POD_IP={pod} an address: taskd compares \
         them as text and takes this host for a worker"
    );
    let fix = "set MS_SCHED_HOST to the manager pod's IP address";
    (Check::warn(name, detail, fix), Role::Worker)
}

/// The launchers' rank variables, each parsed (set and malformed is an error).
struct RankVars {
    ms: Option<u32>,
    rank: Option<u32>,
    lws: Option<u32>,
    world: Option<u32>,
    local: Option<u32>,
}

impl RankVars {
    /// Every malformed variable, named with its value.
    fn read(env: EnvLookup<'_>) -> Result<RankVars, Vec<String>> {
        let parsed = [
            flags::MS_NODE_RANK,
            flags::RANK,
            flags::LOCAL_WORLD_SIZE,
            flags::WORLD_SIZE,
            flags::LOCAL_RANK,
        ]
        .map(|n| flags::parse_u32(env, n));
        let errors: Vec<String> = parsed
            .iter()
            .filter_map(|r| r.as_ref().err().map(|e| e.to_string()))
            .collect();
        if !errors.is_empty() {
            return Err(errors);
        }
        let [ms, rank, lws, world, local] = parsed.map(|r| r.ok().flatten());
        Ok(RankVars {
            ms,
            rank,
            lws,
            world,
            local,
        })
    }

    /// `RANK / LOCAL_WORLD_SIZE`, when both are set and the size is not zero.
    fn torch_node_rank(&self) -> Option<u32> {
        match (self.rank, self.lws) {
            (Some(r), Some(l)) if l > 0 => Some(r / l),
            _ => None,
        }
    }

    /// `RANK`, `LOCAL_WORLD_SIZE` and `MS_NODE_RANK`: present together and agreeing.
    fn pairing_problems(&self, out: &mut Vec<String>) {
        if self.lws == Some(0) {
            out.push("LOCAL_WORLD_SIZE=0".to_string());
        }
        if self.ms.is_none() {
            match (self.rank, self.lws) {
                (Some(_), None) => out.push("RANK is set without LOCAL_WORLD_SIZE".into()),
                (None, Some(_)) => out.push("LOCAL_WORLD_SIZE is set without RANK".into()),
                _ => {}
            }
        }
        if let (Some(m), Some(t)) = (self.ms, self.torch_node_rank()) {
            if m != t {
                out.push(format!(
                    "MS_NODE_RANK={m} but RANK / LOCAL_WORLD_SIZE = {} / {} = {t}",
                    self.rank.unwrap_or(0),
                    self.lws.unwrap_or(0)
                ));
            }
        }
    }

    /// `WORLD_SIZE` and `LOCAL_RANK` against the rest.
    fn size_problems(&self, node: Option<u32>, out: &mut Vec<String>) {
        let lws = self.lws.filter(|l| *l > 0);
        if let (Some(w), Some(l)) = (self.world, lws) {
            if w % l != 0 {
                out.push(format!(
                    "WORLD_SIZE={w} is not a multiple of LOCAL_WORLD_SIZE={l}"
                ));
            } else if let Some(n) = node.filter(|n| *n >= w / l) {
                out.push(format!(
                    "node rank {n} is not below the node count WORLD_SIZE / LOCAL_WORLD_SIZE = {}",
                    w / l
                ));
            }
        }
        if let (Some(w), Some(r)) = (self.world, self.rank) {
            if r >= w {
                out.push(format!("RANK={r} is not below WORLD_SIZE={w}"));
            }
        }
        if let (Some(lr), Some(l)) = (self.local, self.lws) {
            if lr >= l {
                out.push(format!("LOCAL_RANK={lr} is not below LOCAL_WORLD_SIZE={l}"));
            } else if let Some(r) = self.rank.filter(|r| r % l != lr) {
                out.push(format!(
                    "LOCAL_RANK={lr} but RANK % LOCAL_WORLD_SIZE = {r} % {l} = {}",
                    r % l
                ));
            }
        }
    }

    /// Where the node rank came from, for the detail of a pass.
    fn source(&self) -> String {
        let torch = || {
            format!(
                "RANK={} / LOCAL_WORLD_SIZE={}",
                self.rank.unwrap_or(0),
                self.lws.unwrap_or(0)
            )
        };
        match (self.ms, self.torch_node_rank()) {
            (Some(_), Some(_)) => format!("MS_NODE_RANK, agreeing with {}", torch()),
            (Some(_), None) => flags::MS_NODE_RANK.to_string(),
            _ => torch(),
        }
    }
}

/// The node rank: `MS_NODE_RANK` (MindSpore) or `RANK / LOCAL_WORLD_SIZE` (PyTorch), each
/// well-formed, and consistent with each other and with `WORLD_SIZE` / `LOCAL_RANK` when set.
pub fn node_rank(env: EnvLookup<'_>) -> Check {
    let name = "job:node-rank";
    let fix = "set MS_NODE_RANK (MindSpore) or RANK and LOCAL_WORLD_SIZE (PyTorch) as the \
               launcher does, consistently on every node";
    let vars = match RankVars::read(env) {
        Ok(v) => v,
        Err(errors) => return Check::fail(name, errors.join("; "), fix),
    };
    // The rule the proxy applies (`taskd_core::env::node_rank`).
    let node = flags::node_rank(env).ok().flatten();
    let mut problems = Vec::new();
    vars.pairing_problems(&mut problems);
    vars.size_problems(node, &mut problems);
    if !problems.is_empty() {
        return Check::fail(name, problems.join("; "), fix);
    }
    match node {
        None => Check::fail(
            name,
            "no node rank: MS_NODE_RANK, RANK and LOCAL_WORLD_SIZE are unset",
            fix,
        ),
        Some(n) => Check::pass(name, format!("node rank {n} (from {})", vars.source())),
    }
}

// ---------------------------------------------------------------------------------------------
// Port

/// Whether the taskd port can be bound on every address (IPv4 and, where the host has it,
/// IPv6). Only the manager listens on it, so on a worker host a failure is a warning.
pub fn port(port: u16, role: Role) -> Check {
    let name = "port";
    // One at a time: a dual-stack [::] socket would collide with our own 0.0.0.0 one.
    let v4 = TcpListener::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port))).map(drop);
    let v6 = TcpListener::bind(SocketAddr::from((Ipv6Addr::UNSPECIFIED, port))).map(drop);
    // IPv6 may be absent from the host; that alone is no failure.
    let v6_absent = matches!(&v6, Err(e) if matches!(
        e.raw_os_error(),
        Some(97) /* EAFNOSUPPORT */ | Some(99) /* EADDRNOTAVAIL */
    ));
    let mut bound = Vec::new();
    let mut failed = Vec::new();
    match &v4 {
        Ok(_) => bound.push("0.0.0.0"),
        Err(e) => failed.push(format!("0.0.0.0:{port}: {e}")),
    }
    match &v6 {
        Ok(_) => bound.push("[::]"),
        Err(_) if v6_absent => {}
        Err(e) => failed.push(format!("[::]:{port}: {e}")),
    }
    if failed.is_empty() {
        let mut detail = format!("taskd port {port} is free on {}", bound.join(" and "));
        if v6_absent {
            detail.push_str(" (no IPv6 on this host)");
        }
        return Check::pass(name, detail);
    }
    let detail = format!(
        "taskd port {port} cannot be bound: {}{}",
        failed.join("; "),
        match role {
            Role::Worker => " (only the manager host listens on it)",
            _ => "",
        }
    );
    let fix = format!(
        "free port {port} (`ss -ltnp 'sport = :{port}'` shows who holds it) or run taskd on \
         another port with --port, matching the pod's containerPort named taskd-port"
    );
    match role {
        Role::Worker => Check::warn(name, detail, fix),
        Role::Manager | Role::Unknown => Check::fail(name, detail, fix),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use taskd_core::env::from_pairs as env;

    #[test]
    fn l2_retry_passes_only_with_l2_1() {
        assert_eq!(
            flag(
                &L2_RETRY,
                &env(&[("HCCL_OP_RETRY_ENABLE", "L0:0, L1:1, L2:1")])
            )
            .status,
            Status::Pass
        );
        for bad in [
            env(&[("HCCL_OP_RETRY_ENABLE", "L0:0, L1:1, L2:0")]),
            env(&[("HCCL_OP_RETRY_ENABLE", "L1:1")]),
            env::<&str>(&[]),
        ] {
            let c = flag(&L2_RETRY, &bad);
            assert_eq!(c.status, Status::Fail, "{c:?}");
            assert!(c.detail.contains("switch nothing"), "{}", c.detail);
            assert!(c.fix.unwrap().contains("L2:1"));
        }
    }

    #[test]
    fn tsp_passes_only_with_tsp_1() {
        assert_eq!(
            flag(&TSP, &env(&[("MS_ENABLE_TFT", "'{TTP:1,TSP:1}'")])).status,
            Status::Pass
        );
        assert_eq!(
            flag(&TSP, &env(&[("MS_ENABLE_TFT", "{TTP:1}")])).status,
            Status::Fail
        );
        let c = flag(&TSP, &env::<&str>(&[]));
        assert_eq!(c.status, Status::Fail);
        assert!(c.detail.starts_with("unset"), "{}", c.detail);
    }

    #[test]
    fn recovery_flags_warn_when_off() {
        assert_eq!(
            flag(&PROCESS_RECOVER, &env(&[("PROCESS_RECOVER", "on")])).status,
            Status::Pass
        );
        assert_eq!(
            flag(&PROCESS_RECOVER, &env(&[("PROCESS_RECOVER", "off")])).status,
            Status::Warn
        );
        assert_eq!(
            flag(&PROCESS_RECOVER, &env::<&str>(&[])).status,
            Status::Warn
        );
        assert_eq!(
            flag(
                &ELASTIC_PROCESS_RECOVER,
                &env(&[("ELASTIC_PROCESS_RECOVER_ENABLE", "1")])
            )
            .status,
            Status::Pass
        );
        assert_eq!(
            flag(
                &ELASTIC_PROCESS_RECOVER,
                &env(&[("ELASTIC_PROCESS_RECOVER_ENABLE", "0")])
            )
            .status,
            Status::Warn
        );
    }

    #[test]
    fn rdma_fails_only_when_declared_absent() {
        assert_eq!(rdma(&env::<&str>(&[])).status, Status::Pass);
        assert_eq!(rdma(&env(&[("TASKD_HCCL_RDMA", "1")])).status, Status::Pass);
        assert_eq!(
            rdma(&env(&[("TASKD_HCCL_RDMA", "off")])).status,
            Status::Fail
        );
    }

    #[test]
    fn mindio_variables_are_checked_where_every_rank_is_a_processor() {
        let base = [
            ("MS_ENABLE_TFT", "{TTP:1,TSP:1}"),
            ("MS_TFT_IP", "10.0.0.1"),
            ("MS_TFT_PORT", "8000"),
            ("MINDIO_FOR_MINDSPORE", "1"),
        ];
        // No MindIO feature: no check.
        assert!(mindio(&env(&[("MS_ENABLE_TFT", "{UCE:0}")]), Role::Worker).is_none());
        let c = mindio(&env(&base), Role::Worker).unwrap();
        assert_eq!(c.status, Status::Pass, "{c:?}");
        let mut unset = base.to_vec();
        unset.retain(|(k, _)| *k != "MS_TFT_PORT");
        let c = mindio(&env(&unset), Role::Worker).unwrap();
        assert_eq!(c.status, Status::Fail);
        assert!(c.detail.contains("MS_TFT_PORT is unset"), "{c:?}");
        assert!(c.detail.contains("85 s"), "{c:?}");
        // The manager host also needs TTP_PORT and the job's size.
        let c = mindio(&env(&base), Role::Manager).unwrap();
        assert_eq!(c.status, Status::Fail);
        assert!(c.detail.contains("TTP_PORT is unset"), "{c:?}");
        assert!(c.detail.contains("MS_WORKER_NUM"), "{c:?}");
        let mut manager = base.to_vec();
        manager.extend([("TTP_PORT", "8001"), ("MS_WORKER_NUM", "16")]);
        let c = mindio(&env(&manager), Role::Manager).unwrap();
        assert_eq!(c.status, Status::Warn, "{c:?}");
        assert!(c.detail.contains("is not TTP_PORT"), "{c:?}");
        manager.retain(|(k, _)| *k != "TTP_PORT");
        manager.push(("TTP_PORT", "8000"));
        let c = mindio(&env(&manager), Role::Manager).unwrap();
        assert_eq!(c.status, Status::Pass, "{c:?}");
    }

    #[test]
    fn job_id_must_be_set() {
        assert_eq!(
            job_id(&env(&[("MINDX_TASK_ID", "job-7")])).status,
            Status::Pass
        );
        assert_eq!(job_id(&env(&[("MINDX_TASK_ID", " ")])).status, Status::Fail);
        assert_eq!(job_id(&env::<&str>(&[])).status, Status::Fail);
    }

    #[test]
    fn role_from_sched_host_and_pod_ip() {
        let (c, r) = role(&env(&[
            ("MS_SCHED_HOST", "10.0.0.1"),
            ("POD_IP", "10.0.0.1"),
        ]));
        assert_eq!((c.status, r), (Status::Pass, Role::Manager));
        let (c, r) = role(&env(&[
            ("MS_SCHED_HOST", "10.0.0.1"),
            ("POD_IP", "10.0.0.2"),
        ]));
        assert_eq!((c.status, r), (Status::Pass, Role::Worker));
        assert!(c.detail.contains("worker host"), "{}", c.detail);
        // IPv6, in any spelling, is fine.
        let (c, r) = role(&env(&[
            ("MS_SCHED_HOST", "[fd00::0001]"),
            ("POD_IP", "fd00::1"),
        ]));
        assert_eq!((c.status, r), (Status::Pass, Role::Manager));
        assert!(c.detail.contains("IPv6"), "{}", c.detail);
        let (c, r) = role(&env(&[("MS_SCHED_HOST", "fd00::1"), ("POD_IP", "fd00::2")]));
        assert_eq!((c.status, r), (Status::Pass, Role::Worker));
        // Unset, garbage, host names.
        let (c, r) = role(&env(&[("POD_IP", "10.0.0.1")]));
        assert_eq!((c.status, r), (Status::Fail, Role::Unknown));
        assert!(c.detail.contains("MS_SCHED_HOST unset"), "{}", c.detail);
        let (c, _) = role(&env::<&str>(&[]));
        assert!(
            c.detail.contains("MS_SCHED_HOST and POD_IP"),
            "{}",
            c.detail
        );
        let (c, r) = role(&env(&[("MS_SCHED_HOST", "10.0.0.1"), ("POD_IP", "pod-a")]));
        assert_eq!((c.status, r), (Status::Fail, Role::Unknown));
        let (c, r) = role(&env(&[("MS_SCHED_HOST", "mgr-0"), ("POD_IP", "10.0.0.1")]));
        assert_eq!((c.status, r), (Status::Warn, Role::Worker));
    }

    #[test]
    fn node_rank_from_either_framework_and_consistent() {
        let ok = |pairs: &[(&str, &str)]| {
            let c = node_rank(&env(pairs));
            assert_eq!(c.status, Status::Pass, "{pairs:?}: {}", c.detail);
            c.detail
        };
        let bad = |pairs: &[(&str, &str)], needle: &str| {
            let c = node_rank(&env(pairs));
            assert_eq!(c.status, Status::Fail, "{pairs:?}: {}", c.detail);
            assert!(c.detail.contains(needle), "{pairs:?}: {}", c.detail);
        };
        assert!(ok(&[("MS_NODE_RANK", "3")]).starts_with("node rank 3"));
        assert!(ok(&[("RANK", "37"), ("LOCAL_WORLD_SIZE", "16")]).starts_with("node rank 2"));
        ok(&[
            ("MS_NODE_RANK", "2"),
            ("RANK", "37"),
            ("LOCAL_WORLD_SIZE", "16"),
            ("WORLD_SIZE", "64"),
            ("LOCAL_RANK", "5"),
        ]);
        bad(&[], "no node rank");
        bad(&[("MS_NODE_RANK", "two")], "not a non-negative integer");
        bad(&[("RANK", "37")], "RANK is set without LOCAL_WORLD_SIZE");
        bad(
            &[("RANK", "3"), ("LOCAL_WORLD_SIZE", "0")],
            "LOCAL_WORLD_SIZE=0",
        );
        bad(
            &[
                ("MS_NODE_RANK", "1"),
                ("RANK", "37"),
                ("LOCAL_WORLD_SIZE", "16"),
            ],
            "MS_NODE_RANK=1 but",
        );
        bad(
            &[
                ("RANK", "64"),
                ("LOCAL_WORLD_SIZE", "16"),
                ("WORLD_SIZE", "64"),
            ],
            "not below WORLD_SIZE",
        );
        bad(
            &[
                ("RANK", "3"),
                ("LOCAL_WORLD_SIZE", "16"),
                ("WORLD_SIZE", "40"),
            ],
            "not a multiple",
        );
        bad(
            &[
                ("RANK", "37"),
                ("LOCAL_WORLD_SIZE", "16"),
                ("LOCAL_RANK", "4"),
            ],
            "LOCAL_RANK=4 but",
        );
        bad(
            &[
                ("MS_NODE_RANK", "4"),
                ("LOCAL_WORLD_SIZE", "16"),
                ("WORLD_SIZE", "64"),
            ],
            "not below the node count",
        );
    }

    #[test]
    fn port_fails_when_taken_on_the_manager_host_and_warns_on_a_worker() {
        let held = TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0)).unwrap();
        let p = held.local_addr().unwrap().port();
        let c = port(p, Role::Manager);
        assert_eq!(c.status, Status::Fail, "{c:?}");
        assert!(c.detail.contains(&format!("0.0.0.0:{p}")), "{}", c.detail);
        assert!(c.fix.as_deref().unwrap().contains("--port"));
        assert_eq!(port(p, Role::Unknown).status, Status::Fail);
        assert_eq!(port(p, Role::Worker).status, Status::Warn);
        drop(held);
    }

    #[test]
    fn a_line_per_check_and_the_json_shape() {
        let checks = vec![
            Check::pass("a", "fine"),
            Check::fail("b", "broken\nacross lines", "mend it"),
        ];
        assert_eq!(
            render_text(&checks),
            "PASS  a  fine\nFAIL  b  broken across lines  fix: mend it\n"
        );
        assert!(!ready(&checks));
        assert!(ready(&checks[..1]));
        let json = serde_json::to_value(&checks).unwrap();
        assert_eq!(
            json,
            serde_json::json!([
                {"check": "a", "status": "PASS", "detail": "fine", "fix": null},
                {"check": "b", "status": "FAIL", "detail": "broken\nacross lines", "fix": "mend it"},
            ])
        );
    }
}
