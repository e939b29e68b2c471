//! The link configuration a proxy is given (`taskd proxy --linux-links FILE`, JSON).
//!
//! ```json
//! {"devices": {"0": {"primary": "pri", "backup": "bak"}},
//!  "probe": {"primary_peers": ["10.251.1.2"], "backup_peers": ["10.251.2.2"],
//!            "count": 8, "size": 1400, "timeout_ms": 150, "max_loss": 0.25, "max_rtt_ms": 20},
//!  "cache_ms": 100}
//! ```
//!
//! `probe` is optional (without it a side is up or down as the kernel says); `cache_ms`
//! defaults to 100.
//!
//! The file is opened without blocking and refused unless it is a regular file, and read with
//! a bound ([`MAX_CONFIG_BYTES`]), as every file a role is given: `/dev/zero` or a FIFO named
//! by mistake is an error at once, not a start that reads until memory runs out or hangs.

use serde::Deserialize;
use std::collections::BTreeMap;
use std::io::Read as _;
use std::net::Ipv4Addr;
use std::path::Path;
use taskd_core::NicSide;

/// The largest link configuration read: a node's devices and their peers take a few
/// kilobytes.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// The longest interface name Linux has (`IFNAMSIZ` less its terminating byte).
const MAX_IFNAME: usize = 15;

/// The whole of the regular file at `path`, opened without blocking (a FIFO without a writer
/// would block the open itself): `InvalidInput` naming what it is when it is not a regular
/// file, `InvalidData` when it holds more than `max` bytes.
pub(crate) fn read_regular(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _};
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
        .open(path)?;
    let t = f.metadata()?.file_type();
    if !t.is_file() {
        let what = if t.is_dir() {
            "a directory"
        } else if t.is_fifo() {
            "a FIFO"
        } else if t.is_char_device() {
            "a character device"
        } else if t.is_block_device() {
            "a block device"
        } else if t.is_socket() {
            "a socket"
        } else {
            "not a regular file"
        };
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{what}, not a regular file"),
        ));
    }
    let mut bytes = Vec::new();
    f.take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {max} bytes"),
        ));
    }
    Ok(bytes)
}

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read the link configuration {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The JSON does not describe a link configuration.
    #[error("the link configuration {path} is not valid: {source}")]
    Parse {
        /// The file.
        path: String,
        /// Why.
        source: serde_json::Error,
    },
    /// A value is out of range.
    #[error("the link configuration {path}: {what}")]
    Invalid {
        /// The file.
        path: String,
        /// What is wrong.
        what: String,
    },
}

/// One device's two interfaces.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceLinks {
    /// The primary NIC's interface.
    pub primary: String,
    /// The backup NIC's interface.
    pub backup: String,
}

/// The active probe: whom to ask on each plane and when a link counts as degraded.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProbeConfig {
    /// The job's peers on the primary plane.
    #[serde(default)]
    pub primary_peers: Vec<Ipv4Addr>,
    /// The job's peers on the backup plane.
    #[serde(default)]
    pub backup_peers: Vec<Ipv4Addr>,
    /// Echo requests per peer in one train.
    pub count: u16,
    /// Bytes of each request's payload.
    pub size: u16,
    /// How long a train waits for its answers.
    pub timeout_ms: u64,
    /// More than this share of lost answers is degraded (0..1).
    pub max_loss: f64,
    /// A slowest answer later than this is degraded.
    pub max_rtt_ms: f64,
}

impl ProbeConfig {
    /// The peers on `side`'s plane.
    pub fn peers(&self, side: NicSide) -> &[Ipv4Addr] {
        match side {
            NicSide::Primary => &self.primary_peers,
            NicSide::Backup => &self.backup_peers,
        }
    }
}

/// Every device's interfaces and the probe.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkConfig {
    /// Device id (the rank table's) to its interfaces.
    pub devices: BTreeMap<u32, DeviceLinks>,
    /// The probe; none: the kernel's state only.
    #[serde(default)]
    pub probe: Option<ProbeConfig>,
    /// How long a side's state is reused for other devices on the same interface.
    #[serde(default = "default_cache_ms")]
    pub cache_ms: u64,
}

fn default_cache_ms() -> u64 {
    100
}

impl LinkConfig {
    /// Reads and checks `path` (a regular file of at most [`MAX_CONFIG_BYTES`]).
    pub fn load(path: &Path) -> Result<LinkConfig, ConfigError> {
        let p = path.display().to_string();
        let read_err = |source| ConfigError::Read {
            path: p.clone(),
            source,
        };
        let bytes = read_regular(path, MAX_CONFIG_BYTES).map_err(read_err)?;
        let text = String::from_utf8(bytes)
            .map_err(|e| read_err(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))?;
        LinkConfig::parse(&text, &p)
    }

    /// Parses and checks `text` (`path` names it in errors).
    pub fn parse(text: &str, path: &str) -> Result<LinkConfig, ConfigError> {
        let cfg: LinkConfig = serde_json::from_str(text).map_err(|source| ConfigError::Parse {
            path: path.to_owned(),
            source,
        })?;
        cfg.check().map_err(|what| ConfigError::Invalid {
            path: path.to_owned(),
            what,
        })?;
        Ok(cfg)
    }

    fn check(&self) -> Result<(), String> {
        if self.devices.is_empty() {
            return Err("no devices".into());
        }
        for (dev, links) in &self.devices {
            for name in [&links.primary, &links.backup] {
                let bad = name.is_empty()
                    || name.len() > MAX_IFNAME
                    || name.contains('/')
                    || name == "."
                    || name == ".."
                    || name.chars().any(|c| c.is_whitespace() || c.is_control());
                if bad {
                    return Err(format!(
                        "device {dev}: {name:?} is not an interface name (1 to {MAX_IFNAME} bytes, no '/', no space)"
                    ));
                }
            }
        }
        let Some(p) = &self.probe else { return Ok(()) };
        if p.count == 0 || p.count > 64 {
            return Err(format!("probe count {} is not in 1..=64", p.count));
        }
        if !(8..=8972).contains(&p.size) {
            return Err(format!("probe size {} is not in 8..=8972", p.size));
        }
        if p.timeout_ms == 0 || p.timeout_ms > 10_000 {
            return Err(format!(
                "probe timeout_ms {} is not in 1..=10000",
                p.timeout_ms
            ));
        }
        if !(0.0..=1.0).contains(&p.max_loss) || p.max_rtt_ms <= 0.0 {
            return Err("max_loss must be in 0..1 and max_rtt_ms positive".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_example_parses() {
        let text = r#"{"devices": {"0": {"primary": "pri", "backup": "bak"}},
          "probe": {"primary_peers": ["10.251.1.2"], "backup_peers": ["10.251.2.2"],
                    "count": 8, "size": 1400, "timeout_ms": 150, "max_loss": 0.25, "max_rtt_ms": 20}}"#;
        let c = LinkConfig::parse(text, "x.json").unwrap();
        assert_eq!(c.devices[&0].backup, "bak");
        assert_eq!(c.cache_ms, 100);
        let p = c.probe.unwrap();
        assert_eq!(
            p.peers(NicSide::Backup),
            &["10.251.2.2".parse::<Ipv4Addr>().unwrap()]
        );
    }

    #[test]
    fn bad_configurations_name_what_is_wrong() {
        let e = LinkConfig::parse(r#"{"devices": {}}"#, "a.json").unwrap_err();
        assert_eq!(e.to_string(), "the link configuration a.json: no devices");
        let e = LinkConfig::parse(r#"{"devices": {"0": {"primary": "p"}}}"#, "b.json").unwrap_err();
        assert!(e.to_string().contains("missing field `backup`"), "{e}");
        let text = r#"{"devices": {"0": {"primary": "p", "backup": "b"}},
          "probe": {"count": 0, "size": 100, "timeout_ms": 10, "max_loss": 0.1, "max_rtt_ms": 5}}"#;
        let e = LinkConfig::parse(text, "c.json").unwrap_err();
        assert!(e.to_string().contains("probe count 0"), "{e}");
        for name in ["", "../../../dev", "a/b", "..", "sixteen-letters!", "a b"] {
            let text = format!(r#"{{"devices": {{"0": {{"primary": "p", "backup": {name:?}}}}}}}"#);
            let e = LinkConfig::parse(&text, "d.json").unwrap_err();
            assert!(
                e.to_string().contains("not an interface name"),
                "{name}: {e}"
            );
        }
    }

    /// `/dev/zero` is refused at once instead of read until memory runs out, a FIFO without
    /// a writer instead of blocking the start, a file above the bound for its size.
    #[test]
    fn only_a_regular_file_of_bounded_size_is_read() {
        let e = LinkConfig::load(Path::new("/dev/zero")).unwrap_err();
        assert!(e.to_string().contains("a character device"), "{e}");
        let dir = std::env::temp_dir().join(format!("taskd-links-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("links.fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        let e = LinkConfig::load(&fifo).unwrap_err();
        assert!(e.to_string().contains("a FIFO"), "{e}");
        let big = dir.join("big.json");
        let f = std::fs::File::create(&big).unwrap();
        f.set_len(MAX_CONFIG_BYTES + 1).unwrap();
        let e = LinkConfig::load(&big).unwrap_err();
        assert!(e.to_string().contains("larger than"), "{e}");
        let good = dir.join("good.json");
        std::fs::write(
            &good,
            r#"{"devices": {"0": {"primary": "p", "backup": "b"}}}"#,
        )
        .unwrap();
        assert_eq!(LinkConfig::load(&good).unwrap().devices.len(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
