//! The HAL against real interfaces: two network namespaces of this test's own joined by a veth
//! pair. The test (root, with `ip` and `tc`) builds them, then runs `inside_a_namespace` in
//! the first one (a fresh sysfs there shows that namespace's interfaces): the HAL sees the
//! link up and healthy, its carrier go when the far end goes down and come back, and the
//! probe call it degraded when `tc tbf` starves it and when it drops the probe's echoes.
//! Where namespaces cannot be made (not root, a container without CAP_SYS_ADMIN) it says so
//! and checks nothing.

use std::process::Command;
use std::time::{Duration, Instant};
use taskd_core::{DeviceId, LinkHealth, NicSide, NodeHal};
use taskd_hal_linux::{LinkConfig, LinuxNodeHal};

const PEER_NS: &str = "TASKD_HAL_LINUX_PEER_NS";

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// The two namespaces; removed on drop.
struct Pair {
    a: String,
    b: String,
}

impl Pair {
    fn build() -> Result<Pair, String> {
        let id = std::process::id();
        let pair = Pair {
            a: format!("tdhal-{id}-a"),
            b: format!("tdhal-{id}-b"),
        };
        ip(&["netns", "add", &pair.a])?;
        ip(&["netns", "add", &pair.b])?;
        ip(&[
            "link", "add", "ta", "netns", &pair.a, "type", "veth", "peer", "name", "tb", "netns",
            &pair.b,
        ])?;
        for (ns, dev, addr) in [
            (&pair.a, "ta", "10.253.0.1/24"),
            (&pair.b, "tb", "10.253.0.2/24"),
        ] {
            ip(&["-n", ns, "addr", "add", addr, "dev", dev])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(pair)
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.a]);
        let _ = ip(&["netns", "del", &self.b]);
    }
}

#[test]
fn the_hal_sees_carrier_starvation_and_loss_on_a_veth_pair() {
    let pair = match Pair::build() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("skipped: network namespaces are not allowed here ({e})");
            return;
        }
    };
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("ip")
        .args(["netns", "exec", &pair.a])
        .arg(exe)
        .args([
            "--ignored",
            "--exact",
            "inside_a_namespace",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(PEER_NS, &pair.b)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "inside the namespace:\n{text}");
    assert!(text.contains("1 passed"), "the inner test ran:\n{text}");
}

fn config() -> LinkConfig {
    let text = r#"{"devices": {"0": {"primary": "ta", "backup": "lo"}},
      "probe": {"primary_peers": ["10.253.0.2"], "count": 8, "size": 1400,
                "timeout_ms": 400, "max_loss": 0.25, "max_rtt_ms": 20},
      "cache_ms": 0}"#;
    LinkConfig::parse(text, "test").unwrap()
}

fn tc(args: &[&str]) {
    let ok = Command::new("tc").args(args).status().unwrap().success();
    assert!(ok, "tc {}", args.join(" "));
}

/// The HAL's answer once `done` holds, or the last one after 5 s (the kernel's operstate
/// follows a carrier change asynchronously).
fn until(hal: &mut LinuxNodeHal, done: impl Fn(&LinkHealth) -> bool) -> LinkHealth {
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let h = hal.link_health(DeviceId(0)).unwrap();
        if done(&h) || Instant::now() > end {
            return h;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
#[ignore = "run inside its namespace by the_hal_sees_carrier_starvation_and_loss_on_a_veth_pair"]
fn inside_a_namespace() {
    let peer = std::env::var(PEER_NS).expect("run by the outer test");
    let mut hal = LinuxNodeHal::new(config());
    let h = hal.link_health(DeviceId(0)).unwrap();
    assert!(h.is_up(NicSide::Primary), "{h:?}");
    assert_eq!(h.degraded(NicSide::Primary), None, "{h:?}");
    assert!(h.is_up(NicSide::Backup), "loopback, no probe: up ({h:?})");

    ip(&["-n", &peer, "link", "set", "tb", "down"]).unwrap();
    let h = until(&mut hal, |h| !h.is_up(NicSide::Primary));
    assert!(!h.is_up(NicSide::Primary), "the far end went down: {h:?}");
    ip(&["-n", &peer, "link", "set", "tb", "up"]).unwrap();
    let h = until(&mut hal, |h| h.is_up(NicSide::Primary));
    assert!(h.is_up(NicSide::Primary), "the far end came back: {h:?}");

    // 8 x 1.4 kB at 1 Mbit/s: the train's last echo waits about 90 ms.
    let starve = [
        "qdisc", "replace", "dev", "ta", "root", "tbf", "rate", "1mbit", "burst", "1600",
        "latency", "400ms",
    ];
    tc(&starve);
    let h = hal.link_health(DeviceId(0)).unwrap();
    let why = h.degraded(NicSide::Primary).unwrap_or_default();
    assert!(why.contains("slowest echo"), "starved: {h:?}");
    // A queue of two packets: most of the train is dropped.
    tc(&[
        "qdisc", "replace", "dev", "ta", "root", "tbf", "rate", "1mbit", "burst", "1600", "limit",
        "3000",
    ]);
    let h = hal.link_health(DeviceId(0)).unwrap();
    let why = h.degraded(NicSide::Primary).unwrap_or_default();
    assert!(why.contains("lost"), "dropping: {h:?}");
    tc(&["qdisc", "del", "dev", "ta", "root"]);
    let h = hal.link_health(DeviceId(0)).unwrap();
    assert_eq!(h.degraded(NicSide::Primary), None, "healed: {h:?}");
}
