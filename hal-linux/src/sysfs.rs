//! A Linux interface's state as the kernel shows it under `/sys/class/net/IF/`.
//!
//! `operstate` (RFC 2863: `up`, `down`, `lowerlayerdown`, `dormant`, `unknown`, ...) and
//! `carrier` (1 with a carrier; reading it fails with `EINVAL` while the interface is
//! administratively down). A link is up when `operstate` is `up`, or `unknown` (drivers that do
//! not report it, e.g. some virtual ones) with carrier 1; and carrier is not 0.

use std::fmt;
use std::path::PathBuf;

/// Where the interfaces are read.
#[derive(Clone, Debug)]
pub struct SysNet {
    root: PathBuf,
}

impl Default for SysNet {
    fn default() -> Self {
        SysNet {
            root: PathBuf::from("/sys/class/net"),
        }
    }
}

/// An interface that cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("cannot read {path}: {source}")]
pub struct ReadError {
    /// The file.
    pub path: String,
    /// Why.
    pub source: std::io::Error,
}

/// What the kernel says of one interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelLink {
    /// The interface.
    pub name: String,
    /// `operstate`, trimmed.
    pub operstate: String,
    /// `carrier`; `None` when it cannot be read (the interface is down).
    pub carrier: Option<bool>,
}

impl KernelLink {
    /// Whether the link can carry traffic.
    pub fn is_up(&self) -> bool {
        let state_ok = match self.operstate.as_str() {
            "up" => true,
            "unknown" => self.carrier == Some(true),
            _ => false,
        };
        state_ok && self.carrier != Some(false)
    }
}

impl fmt::Display for KernelLink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let carrier = match self.carrier {
            Some(true) => "carrier",
            Some(false) => "no carrier",
            None => "carrier not readable",
        };
        write!(
            f,
            "{}: operstate {}, {}",
            self.name, self.operstate, carrier
        )
    }
}

/// The most of a sysfs attribute read: one page.
const ATTRIBUTE_BYTES: u64 = 4096;

impl SysNet {
    /// Interfaces under `root` instead of `/sys/class/net`.
    pub fn at(root: impl Into<PathBuf>) -> Self {
        SysNet { root: root.into() }
    }

    /// The state of interface `name` (each attribute read as a regular file of at most a
    /// page, as sysfs has them).
    pub fn link(&self, name: &str) -> Result<KernelLink, ReadError> {
        let dir = self.root.join(name);
        let path = dir.join("operstate");
        let read = |p: &std::path::Path| {
            crate::config::read_regular(p, ATTRIBUTE_BYTES)
                .map(|b| String::from_utf8_lossy(&b).into_owned())
        };
        let operstate = read(&path).map_err(|source| ReadError {
            path: path.display().to_string(),
            source,
        })?;
        let carrier = read(&dir.join("carrier"))
            .ok()
            .and_then(|c| match c.trim() {
                "1" => Some(true),
                "0" => Some(false),
                _ => None,
            });
        Ok(KernelLink {
            name: name.to_owned(),
            operstate: operstate.trim().to_owned(),
            carrier,
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A directory laid out like `/sys/class/net`.
    pub(crate) struct FakeSys {
        dir: PathBuf,
    }

    impl FakeSys {
        pub(crate) fn new() -> Self {
            static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let dir = std::env::temp_dir().join(format!("taskd-sysnet-{}-{n}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            FakeSys { dir }
        }

        pub(crate) fn set(&self, name: &str, operstate: &str, carrier: Option<&str>) {
            let d = self.dir.join(name);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("operstate"), format!("{operstate}\n")).unwrap();
            match carrier {
                Some(c) => std::fs::write(d.join("carrier"), format!("{c}\n")).unwrap(),
                None => {
                    let _ = std::fs::remove_file(d.join("carrier"));
                }
            }
        }

        pub(crate) fn sys(&self) -> SysNet {
            SysNet::at(&self.dir)
        }
    }

    impl Drop for FakeSys {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    #[test]
    fn up_needs_the_state_and_no_missing_carrier() {
        let link = |s: &str, c| KernelLink {
            name: "x".into(),
            operstate: s.into(),
            carrier: c,
        };
        assert!(link("up", Some(true)).is_up());
        assert!(link("up", None).is_up());
        assert!(!link("up", Some(false)).is_up());
        assert!(link("unknown", Some(true)).is_up());
        assert!(!link("unknown", None).is_up());
        assert!(!link("lowerlayerdown", Some(false)).is_up());
        assert!(!link("down", None).is_up());
        assert_eq!(
            link("down", None).to_string(),
            "x: operstate down, carrier not readable"
        );
    }

    #[test]
    fn a_missing_interface_names_the_file() {
        let fake = FakeSys::new();
        let e = fake.sys().link("eth9").unwrap_err();
        assert!(e.path.ends_with("eth9/operstate"), "{e}");
        fake.set("eth9", "up", Some("1"));
        assert!(fake.sys().link("eth9").unwrap().is_up());
    }
}
