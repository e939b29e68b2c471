//! The environment taskd runs in: the name of every variable it reads, one way to read them
//! ([`EnvLookup`]), and the interpretation of their values (flag lists, node rank, addresses).
//!
//! Reading goes through a lookup function handed in by the caller ([`process_env`] in the
//! binaries, a map in tests), so every rule here is testable without touching the process
//! environment. A variable that is set but blank counts as unset; a value that is set and
//! malformed is an [`EnvError`] naming the variable and the value, never silently ignored.

use std::ffi::{OsStr, OsString};
use std::net::IpAddr;
use std::time::Duration;

// ---------------------------------------------------------------------------------------------
// Names

/// The job's id, set by MindCluster on every pod.
pub const MINDX_TASK_ID: &str = "MINDX_TASK_ID";
/// The scheduler (manager) host: an IP address (v4 or v6) or a host name.
pub const MS_SCHED_HOST: &str = "MS_SCHED_HOST";
/// This pod's IP address (Kubernetes downward API `status.podIP`).
pub const POD_IP: &str = "POD_IP";
/// The node rank as MindSpore's launcher sets it.
pub const MS_NODE_RANK: &str = "MS_NODE_RANK";
/// The global rank of a training process (PyTorch's launcher).
pub const RANK: &str = "RANK";
/// Training processes per node (PyTorch's launcher).
pub const LOCAL_WORLD_SIZE: &str = "LOCAL_WORLD_SIZE";
/// Training processes in the job (PyTorch's launcher).
pub const WORLD_SIZE: &str = "WORLD_SIZE";
/// A training process's index on its node (PyTorch's launcher).
pub const LOCAL_RANK: &str = "LOCAL_RANK";
/// MindCluster's fault-tolerance features; `TSP:1` enables the NIC switch-back.
pub const MS_ENABLE_TFT: &str = "MS_ENABLE_TFT";
/// HCCL's retry levels; `L2:1` is needed for `HcclCommWorkingDevNicSet` to switch anything.
pub const HCCL_OP_RETRY_ENABLE: &str = "HCCL_OP_RETRY_ENABLE";
/// MindCluster's process-level recovery (`on`).
pub const PROCESS_RECOVER: &str = "PROCESS_RECOVER";
/// MindCluster's elastic process recovery (`1`).
pub const ELASTIC_PROCESS_RECOVER_ENABLE: &str = "ELASTIC_PROCESS_RECOVER_ENABLE";
/// Declares whether the job's HCCL topology has RDMA (RoCE) links; HCCL cannot be asked.
/// Unset means yes; `0`, `false`, `off` or `no` means no.
pub const TASKD_HCCL_RDMA: &str = "TASKD_HCCL_RDMA";
/// An explicit path of `libhccl.so` (then the only candidate the library search tries).
pub const TASKD_HCCL_LIBRARY: &str = "TASKD_HCCL_LIBRARY";
/// An explicit path of `libascendcl.so`.
pub const TASKD_ACL_LIBRARY: &str = "TASKD_ACL_LIBRARY";
/// An explicit path of `libdcmi.so`.
pub const TASKD_DCMI_LIBRARY: &str = "TASKD_DCMI_LIBRARY";
/// `ASCEND_HOME_PATH`, set by CANN's `set_env.sh` to the toolkit's `latest` directory.
pub const ASCEND_HOME_PATH: &str = "ASCEND_HOME_PATH";
/// `ASCEND_TOOLKIT_HOME`, set by older CANN `set_env.sh` scripts.
pub const ASCEND_TOOLKIT_HOME: &str = "ASCEND_TOOLKIT_HOME";
/// The bearer token of the control API (when no token file is given).
pub const TASKD_CONTROL_TOKEN: &str = "TASKD_CONTROL_TOKEN";
/// The `taskd` binary's log format (`text` or `json`).
pub const TASKD_LOG_FORMAT: &str = "TASKD_LOG_FORMAT";
/// The proxy a worker started by hand connects to (`examples/remote_worker.rs`), and the
/// proxy of an embedded worker (`taskd-capi`, the Python package).
pub const TASKD_PROXY: &str = "TASKD_PROXY";
/// How long one DCMI probe may take before its answer counts as unknown, in milliseconds
/// (default 1000; `taskd_hal_ascend::node`).
pub const TASKD_DCMI_TIMEOUT_MS: &str = "TASKD_DCMI_TIMEOUT_MS";
/// The dies the Ascend runtime lets a process use: a comma-separated list of the logical ids
/// this container sees, which the runtime renumbers from 0 in the listed order. HCCL switches a
/// die to its backup NIC only when both dies of the NPU are visible.
pub const ASCEND_RT_VISIBLE_DEVICES: &str = "ASCEND_RT_VISIBLE_DEVICES";
/// The control API address of an embedded manager whose configuration does not name one.
pub const TASKD_CONTROL_ADDR: &str = "TASKD_CONTROL_ADDR";
/// The proxies' port of an embedded manager whose configuration does not name one.
pub const TASKD_MANAGER_LISTEN: &str = "TASKD_MANAGER_LISTEN";
/// ClusterD's address (Ascend Operator sets it on every pod); the manager connects to it on
/// port 8899 unless told otherwise.
pub const MINDX_SERVER_IP: &str = "MINDX_SERVER_IP";
/// `on`: ClusterD is reached through a local proxy at `127.0.0.1:8899`.
pub const LOCAL_PROXY_ENABLE: &str = "LOCAL_PROXY_ENABLE";

// ---------------------------------------------------------------------------------------------
// Reading

/// Reads one environment variable. [`process_env`] reads the real environment.
pub type EnvLookup<'a> = &'a dyn Fn(&str) -> Option<OsString>;

/// The process environment, as an [`EnvLookup`].
pub fn process_env(name: &str) -> Option<OsString> {
    std::env::var_os(name)
}

/// A fixed environment of `(name, value)` pairs, as a lookup: what tests and tools hand the
/// readers here instead of the process environment. A name listed twice reads its first value.
pub fn from_pairs<V: AsRef<OsStr>>(pairs: &[(&str, V)]) -> impl Fn(&str) -> Option<OsString> {
    let map: Vec<(String, OsString)> = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.as_ref().to_owned()))
        .collect();
    move |name| map.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
}

/// A variable's value, trimmed, when it is set and not blank.
pub fn get(env: EnvLookup<'_>, name: &str) -> Option<String> {
    env(name)
        .map(|v| v.to_string_lossy().trim().to_owned())
        .filter(|v| !v.is_empty())
}

/// A variable that is set to something taskd cannot use.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{var}={value:?} is not {expected}")]
pub struct EnvError {
    /// The variable.
    pub var: &'static str,
    /// What it is set to.
    pub value: String,
    /// What it should be, e.g. "a non-negative integer".
    pub expected: &'static str,
}

/// A non-negative integer variable: `Ok(None)` when unset or blank.
pub fn parse_u32(env: EnvLookup<'_>, var: &'static str) -> Result<Option<u32>, EnvError> {
    match get(env, var) {
        None => Ok(None),
        Some(v) => v.parse().map(Some).map_err(|_| EnvError {
            expected: if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
                "an integer of at most 4294967295"
            } else {
                "a non-negative integer"
            },
            var,
            value: v,
        }),
    }
}

/// A positive integer variable: `Ok(None)` when unset or blank.
pub fn parse_positive(env: EnvLookup<'_>, var: &'static str) -> Result<Option<u32>, EnvError> {
    match parse_u32(env, var)? {
        Some(0) => Err(EnvError {
            var,
            value: "0".into(),
            expected: "a positive integer",
        }),
        v => Ok(v),
    }
}

// ---------------------------------------------------------------------------------------------
// Flags

/// Whether a flag list such as `{TTP:1,TSP:1}` or `L0:0, L1:1, L2:1` sets `key` to `1`.
/// Braces, quotes and blanks are ignored; keys compare case-insensitively.
pub fn flag_enabled(list: &str, key: &str) -> bool {
    list.trim()
        .trim_matches(|c| c == '{' || c == '}' || c == '\'' || c == '"')
        .split(',')
        .filter_map(|kv| kv.split_once(':'))
        .any(|(k, v)| k.trim().eq_ignore_ascii_case(key) && v.trim() == "1")
}

/// The job restart a launcher started this process for (taskd's agent sets it; torchrun's
/// workers have it as `TORCHELASTIC_RESTART_COUNT`).
pub const TASKD_RESTART_COUNT: &str = "TASKD_RESTART_COUNT";

/// The job restart this process was started for: `TASKD_RESTART_COUNT`, else
/// `TORCHELASTIC_RESTART_COUNT`; 0 when neither is a count.
pub fn restart_count(env: EnvLookup<'_>) -> u32 {
    [TASKD_RESTART_COUNT, "TORCHELASTIC_RESTART_COUNT"]
        .iter()
        .find_map(|name| get(env, name).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0)
}

/// `MS_ENABLE_TFT` enables the switch-back feature (`TSP:1`).
pub fn tsp_enabled(ms_enable_tft: Option<&str>) -> bool {
    ms_enable_tft.is_some_and(|v| flag_enabled(v, "TSP"))
}

/// The worker's hang watch: milliseconds without a finished step (while the gate does not hold
/// training) after which the worker reports its rank hung; `0` or `off` turns it off.
pub const TASKD_HANG_TIMEOUT_MS: &str = "TASKD_HANG_TIMEOUT_MS";

/// HCCL's execution timeout, in seconds: how long its watchdog lets a collective run.
pub const HCCL_EXEC_TIMEOUT: &str = "HCCL_EXEC_TIMEOUT";

/// HCCL's default execution timeout on Atlas A2 and A3 (CANN's `HCCL_EXEC_TIMEOUT`
/// documentation).
pub const DEFAULT_HCCL_EXEC_TIMEOUT: Duration = Duration::from_secs(1836);

/// The worker's hang watch timeout: `TASKD_HANG_TIMEOUT_MS` when set (`0` or `off`: none);
/// otherwise, under `TSP:1` (`tsp`), which turns HCCL's watchdog off, the timeout that
/// watchdog would have had (`HCCL_EXEC_TIMEOUT` seconds, default
/// [`DEFAULT_HCCL_EXEC_TIMEOUT`]; `0` there means no timeout); without TSP none (HCCL's
/// watchdog watches).
pub fn hang_timeout(env: EnvLookup<'_>, tsp: bool) -> Result<Option<Duration>, EnvError> {
    if let Some(v) = get(env, TASKD_HANG_TIMEOUT_MS) {
        if v.eq_ignore_ascii_case("off") {
            return Ok(None);
        }
        let ms: u64 = v.parse().map_err(|_| EnvError {
            var: TASKD_HANG_TIMEOUT_MS,
            value: v.clone(),
            expected: "a number of milliseconds, or off",
        })?;
        return Ok((ms > 0).then(|| Duration::from_millis(ms)));
    }
    if !tsp {
        return Ok(None);
    }
    Ok(match parse_u32(env, HCCL_EXEC_TIMEOUT)? {
        None => Some(DEFAULT_HCCL_EXEC_TIMEOUT),
        Some(0) => None,
        Some(s) => Some(Duration::from_secs(s.into())),
    })
}

/// `HCCL_OP_RETRY_ENABLE` enables HCCL's L2 retry (`L2:1`), without which
/// `HcclCommWorkingDevNicSet` reports success and switches nothing.
pub fn l2_retry_enabled(hccl_op_retry_enable: Option<&str>) -> bool {
    hccl_op_retry_enable.is_some_and(|v| flag_enabled(v, "L2"))
}

// ---------------------------------------------------------------------------------------------
// Ranks

/// This process's global rank from `RANK`: `Ok(None)` when unset.
pub fn rank(env: EnvLookup<'_>) -> Result<Option<u32>, EnvError> {
    parse_u32(env, RANK)
}

/// The node rank of a process: `MS_NODE_RANK` (MindSpore), else `RANK / LOCAL_WORLD_SIZE`
/// (PyTorch). `Ok(None)` when neither is complete (unset, or `RANK` without
/// `LOCAL_WORLD_SIZE`); an error when a variable that is set is malformed
/// (`MS_NODE_RANK=-1`, `LOCAL_WORLD_SIZE=0`, ...), naming it and its value.
pub fn node_rank(env: EnvLookup<'_>) -> Result<Option<u32>, EnvError> {
    let ms = parse_u32(env, MS_NODE_RANK)?;
    let rank = parse_u32(env, RANK)?;
    let lws = parse_positive(env, LOCAL_WORLD_SIZE)?;
    Ok(ms.or(match (rank, lws) {
        (Some(r), Some(l)) => Some(r / l),
        _ => None,
    }))
}

// ---------------------------------------------------------------------------------------------
// Addresses

/// An address as MindCluster writes it: a bare IPv4 or IPv6 address, IPv6 possibly in
/// brackets or with a zone (`fe80::1%eth0`, the zone is dropped). `None` for a host name.
pub fn parse_ip(s: &str) -> Option<IpAddr> {
    let s = s.trim();
    let s = s
        .strip_prefix('[')
        .and_then(|x| x.strip_suffix(']'))
        .unwrap_or(s);
    let s = s.split_once('%').map_or(s, |(a, _)| a);
    s.parse().ok()
}

/// Whether two hosts are the same: equal addresses however they are spelled (`fd00::1` and
/// `[fd00::0001]`), else equal text ignoring case (host names).
pub fn same_host(a: &str, b: &str) -> bool {
    match (parse_ip(a), parse_ip(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a.trim().eq_ignore_ascii_case(b.trim()),
    }
}

/// `HOST:PORT` for connecting to `host`: an IPv6 address goes in brackets (`[fd00::1]:9601`),
/// whether or not it came with them.
pub fn host_port(host: &str, port: u16) -> String {
    let host = host.trim();
    match parse_ip(host) {
        Some(IpAddr::V6(ip)) => format!("[{ip}]:{port}"),
        Some(IpAddr::V4(ip)) => format!("{ip}:{port}"),
        None => format!("{host}:{port}"),
    }
}

/// Where ClusterD is, from the environment, as TaskD finds it: `127.0.0.1:PORT` when
/// `LOCAL_PROXY_ENABLE=on`, else `$MINDX_SERVER_IP:PORT` (an IPv6 address in brackets), else
/// `None` (no ClusterD: a standalone job).
pub fn clusterd_addr(env: EnvLookup<'_>, port: u16) -> Option<String> {
    if get(env, LOCAL_PROXY_ENABLE).is_some_and(|v| v == "on") {
        return Some(host_port("127.0.0.1", port));
    }
    get(env, MINDX_SERVER_IP).map(|ip| host_port(&ip, port))
}

/// Why a `HOST:PORT` is not one.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{addr:?} is not HOST:PORT: {why}")]
pub struct AddressError {
    /// The text given.
    pub addr: String,
    /// What is wrong with it.
    pub why: &'static str,
}

/// Checks a `HOST:PORT` to connect to: a port from 1 to 65535, and a host that is an IPv4
/// address, an IPv6 address in brackets, or a host name (letters, digits, `-`, `.`, `_`).
/// Host names are not resolved here (the name may appear in DNS later; clients retry).
pub fn check_host_port(addr: &str) -> Result<(), AddressError> {
    let bad = |why| AddressError {
        addr: addr.to_owned(),
        why,
    };
    let (host, port) = addr.rsplit_once(':').ok_or_else(|| bad("no port"))?;
    match port.parse::<u16>() {
        Ok(0) | Err(_) => return Err(bad("the port must be a number from 1 to 65535")),
        Ok(_) => {}
    }
    if let Some(inner) = host.strip_prefix('[') {
        let inner = inner.strip_suffix(']').ok_or_else(|| bad("unclosed '['"))?;
        return match inner.parse::<std::net::Ipv6Addr>() {
            Ok(_) => Ok(()),
            Err(_) => Err(bad("not an IPv6 address in the brackets")),
        };
    }
    if host.is_empty() {
        return Err(bad("the host is empty"));
    }
    if host.contains(':') {
        return Err(bad("an IPv6 address needs brackets: [ADDR]:PORT"));
    }
    if !host
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
    {
        return Err(bad("the host is neither an address nor a host name"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_hang_watch_stands_in_for_hccls_watchdog_only_where_tsp_turns_it_off() {
        let t = |pairs: &[(&str, &str)], tsp| hang_timeout(&from_pairs(pairs), tsp);
        assert_eq!(t(&[], false), Ok(None));
        assert_eq!(t(&[], true), Ok(Some(DEFAULT_HCCL_EXEC_TIMEOUT)));
        assert_eq!(
            t(&[(HCCL_EXEC_TIMEOUT, "600")], true),
            Ok(Some(Duration::from_secs(600)))
        );
        assert_eq!(t(&[(HCCL_EXEC_TIMEOUT, "0")], true), Ok(None));
        assert_eq!(
            t(&[(TASKD_HANG_TIMEOUT_MS, "250")], false),
            Ok(Some(Duration::from_millis(250)))
        );
        assert_eq!(t(&[(TASKD_HANG_TIMEOUT_MS, "off")], true), Ok(None));
        assert_eq!(t(&[(TASKD_HANG_TIMEOUT_MS, "0")], true), Ok(None));
        let e = t(&[(TASKD_HANG_TIMEOUT_MS, "5s")], true).unwrap_err();
        assert_eq!(
            e.to_string(),
            "TASKD_HANG_TIMEOUT_MS=\"5s\" is not a number of milliseconds, or off"
        );
        assert!(t(&[(HCCL_EXEC_TIMEOUT, "-1")], true).is_err());
    }

    #[test]
    fn parses_reference_deployment_values() {
        assert!(tsp_enabled(Some("{TTP:1,TSP:1}")));
        assert!(tsp_enabled(Some("'{TTP:1,TSP:1}'")));
        assert!(!tsp_enabled(Some("{TTP:1,TSP:0}")));
        assert!(!tsp_enabled(Some("{TTP:1}")));
        assert!(!tsp_enabled(None));
        assert!(l2_retry_enabled(Some("L0:0, L1:1, L2:1")));
        assert!(!l2_retry_enabled(Some("L0:0, L1:1, L2:0")));
        assert!(!l2_retry_enabled(Some("L1:1")));
        assert!(!l2_retry_enabled(Some("")));
    }

    #[test]
    fn node_rank_from_either_framework() {
        let nr = |pairs: &[(&str, &str)]| node_rank(&from_pairs(pairs));
        assert_eq!(nr(&[(MS_NODE_RANK, "3")]), Ok(Some(3)));
        assert_eq!(nr(&[(RANK, "37"), (LOCAL_WORLD_SIZE, "16")]), Ok(Some(2)));
        assert_eq!(nr(&[(LOCAL_WORLD_SIZE, "16")]), Ok(None));
        assert_eq!(nr(&[(RANK, "37")]), Ok(None));
        assert_eq!(nr(&[(MS_NODE_RANK, " ")]), Ok(None));
    }

    #[test]
    fn malformed_node_rank_names_the_variable_and_value() {
        let e = node_rank(&from_pairs(&[(MS_NODE_RANK, "-1")])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "MS_NODE_RANK=\"-1\" is not a non-negative integer"
        );
        let e = node_rank(&from_pairs(&[(MS_NODE_RANK, "99999999999")])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "MS_NODE_RANK=\"99999999999\" is not an integer of at most 4294967295"
        );
        let e = node_rank(&from_pairs(&[(RANK, "37"), (LOCAL_WORLD_SIZE, "0")])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "LOCAL_WORLD_SIZE=\"0\" is not a positive integer"
        );
        let e = rank(&from_pairs(&[(RANK, "seven")])).unwrap_err();
        assert_eq!((e.var, e.value.as_str()), (RANK, "seven"));
    }

    #[test]
    fn clusterd_is_found_as_taskd_finds_it() {
        let at = |pairs: &[(&str, &str)]| clusterd_addr(&from_pairs(pairs), 8899);
        assert_eq!(at(&[]), None);
        assert_eq!(at(&[(MINDX_SERVER_IP, " ")]), None);
        assert_eq!(
            at(&[(MINDX_SERVER_IP, "10.96.0.7")]).as_deref(),
            Some("10.96.0.7:8899")
        );
        assert_eq!(
            at(&[(MINDX_SERVER_IP, "fd00::7")]).as_deref(),
            Some("[fd00::7]:8899")
        );
        // The local proxy wins over the service address, as in TaskD.
        let both = [(MINDX_SERVER_IP, "10.96.0.7"), (LOCAL_PROXY_ENABLE, "on")];
        assert_eq!(at(&both).as_deref(), Some("127.0.0.1:8899"));
        let off = [(MINDX_SERVER_IP, "10.96.0.7"), (LOCAL_PROXY_ENABLE, "off")];
        assert_eq!(at(&off).as_deref(), Some("10.96.0.7:8899"));
        assert_eq!(at(&[(LOCAL_PROXY_ENABLE, "off")]), None);
    }

    #[test]
    fn hosts_and_addresses() {
        assert!(same_host("[fd00::0001]", "fd00::1"));
        assert!(same_host("10.0.0.1", " 10.0.0.1"));
        assert!(!same_host("fd00::1", "fd00::2"));
        assert!(same_host("Mgr-0", "mgr-0"));
        assert_eq!(host_port("fd00::1", 9601), "[fd00::1]:9601");
        assert_eq!(host_port("[fd00::1]", 9601), "[fd00::1]:9601");
        assert_eq!(host_port("10.0.0.1", 9601), "10.0.0.1:9601");
        assert_eq!(host_port("mgr-0", 9601), "mgr-0:9601");
        for ok in [
            "10.0.0.1:9601",
            "[fd00::1]:9601",
            "mgr-0.svc:1",
            "localhost:65535",
        ] {
            assert_eq!(check_host_port(ok), Ok(()), "{ok}");
        }
        for bad in [
            "notanaddress",
            "host:",
            "host:0",
            "host:70000",
            ":9601",
            "fd00::1:9601",
            "[fd00::1:9601",
            "[nope]:9601",
            "a b:9601",
            "http://x:1",
        ] {
            let e = check_host_port(bad).unwrap_err();
            assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
        }
        for h in ["fd00::1", "10.1.2.3", "mgr-0"] {
            assert_eq!(check_host_port(&host_port(h, 9601)), Ok(()), "{h}");
        }
    }

    fn var_value() -> impl Strategy<Value = Option<String>> {
        prop_oneof![
            Just(None),
            "[0-9]{1,12}".prop_map(Some),
            "-?[0-9 ]{0,4}".prop_map(Some),
            any::<String>().prop_map(Some),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        // Environment parsing never panics, and its answers follow the documented rules.
        #[test]
        fn env_parsing_is_total_and_consistent(
            ms in var_value(), rank in var_value(), lws in var_value(), flags in any::<String>()
        ) {
            let mut pairs = Vec::new();
            for (k, v) in [(MS_NODE_RANK, &ms), (RANK, &rank), (LOCAL_WORLD_SIZE, &lws)] {
                if let Some(v) = v {
                    pairs.push((k, v.as_str()));
                }
            }
            let env = from_pairs(&pairs);
            let num = |v: &Option<String>| v.as_deref().map(str::trim).filter(|v| !v.is_empty()).map(|v| v.parse::<u32>());
            match node_rank(&env) {
                Ok(Some(n)) => match num(&ms) {
                    Some(m) => prop_assert_eq!(Ok(n), m.map_err(drop)),
                    None => {
                        let (r, l) = (num(&rank).unwrap().unwrap(), num(&lws).unwrap().unwrap());
                        prop_assert_eq!(n, r / l);
                    }
                },
                Ok(None) => prop_assert!(num(&ms).is_none()),
                Err(e) => {
                    prop_assert!([MS_NODE_RANK, RANK, LOCAL_WORLD_SIZE].contains(&e.var));
                    prop_assert!(e.to_string().contains(e.var));
                }
            }
            let _ = tsp_enabled(Some(&flags));
            let _ = l2_retry_enabled(Some(&flags));
            let _ = parse_ip(&flags);
            let _ = check_host_port(&flags);
            let _ = host_port(&flags, 1);
            prop_assert!(same_host(&flags, &flags));
        }
    }
}
