//! A manager's state directory on a file system of its own, which the process campaign (and
//! the tests of a full or frozen state directory) can fill up or freeze: a small tmpfs, or an
//! ext4 image mounted through a loop device (`fsfreeze` needs a file system that can be
//! frozen; tmpfs cannot). It needs root and `mount`, `mkfs.ext4`, `fsfreeze`; each way it
//! cannot be had is an error naming why, for the caller to skip its disk faults and say so.
//!
//! Every file system made here is registered until it is released, so a campaign stopped by
//! a signal ([`super::children::kill_all`]) thaws and unmounts them all: a frozen file system
//! left behind would hold every process that touches it.

use std::collections::BTreeSet;
use std::io::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

/// The mount points made here and not released yet.
static MOUNTED: Mutex<BTreeSet<PathBuf>> = Mutex::new(BTreeSet::new());

/// Thaws and unmounts every file system made here (a campaign stopped by a signal).
pub fn release_all() {
    let all = std::mem::take(&mut *MOUNTED.lock().unwrap_or_else(|e| e.into_inner()));
    for m in all {
        release(&m);
    }
}

fn release(mount: &Path) {
    let _ = quiet("fsfreeze", &["-u"], mount);
    if quiet("umount", &[], mount).is_err() {
        let _ = quiet("umount", &["-l"], mount);
    }
}

/// Whether this process runs as root (its effective uid, from `/proc/self/status`).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let uids = s.lines().find_map(|l| l.strip_prefix("Uid:"))?.to_owned();
            uids.split_whitespace().nth(1).map(|e| e == "0")
        })
        .unwrap_or(false)
}

/// Runs `cmd args... path`, its output discarded: `Err` naming the command and its status.
fn quiet(cmd: &str, args: &[&str], path: &Path) -> Result<(), String> {
    let st = Command::new(cmd)
        .args(args)
        .arg(path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| format!("{cmd}: {e}"))?;
    if st.success() {
        Ok(())
    } else {
        Err(format!("{cmd} {} {}: {st}", args.join(" "), path.display()))
    }
}

/// A file system mounted at a state directory; unmounted (thawed first) when dropped.
#[derive(Debug)]
pub struct StateDisk {
    mount: PathBuf,
    /// The ext4 image, removed when dropped.
    image: Option<PathBuf>,
    frozen: bool,
}

impl StateDisk {
    /// A tmpfs of `bytes` mounted at `dir` (created), the manager's alone (mode 0700).
    pub fn tmpfs(dir: &Path, bytes: u64) -> Result<StateDisk, String> {
        if !is_root() {
            return Err("not root: a tmpfs cannot be mounted".into());
        }
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let opts = format!("size={bytes},mode=0700");
        quiet("mount", &["-t", "tmpfs", "-o", &opts, "tmpfs"], dir)?;
        Ok(StateDisk::mounted(dir, None))
    }

    /// An ext4 file system of 16 MiB in `image`, mounted at `dir` (created) through a loop
    /// device: one that can be frozen. The manager's alone (mode 0700).
    pub fn ext4(dir: &Path, image: &Path) -> Result<StateDisk, String> {
        if !is_root() {
            return Err("not root: a loop device cannot be mounted".into());
        }
        let made = std::fs::File::create(image).and_then(|f| f.set_len(16 << 20));
        made.map_err(|e| format!("{}: {e}", image.display()))?;
        let mkfs = quiet("mkfs.ext4", &["-q", "-F", "-b", "4096"], image);
        if let Err(e) = mkfs {
            let _ = std::fs::remove_file(image);
            return Err(e);
        }
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let image_arg = image.display().to_string();
        if let Err(e) = quiet("mount", &["-o", "loop", &image_arg], dir) {
            let _ = std::fs::remove_file(image);
            return Err(e);
        }
        let disk = StateDisk::mounted(dir, Some(image.to_owned()));
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| format!("{}: {e}", dir.display()))?;
        Ok(disk)
    }

    fn mounted(dir: &Path, image: Option<PathBuf>) -> StateDisk {
        MOUNTED
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(dir.to_owned());
        StateDisk {
            mount: dir.to_owned(),
            image,
            frozen: false,
        }
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        &self.mount
    }

    fn filler(&self) -> PathBuf {
        self.mount.join("filler")
    }

    /// Writes a file until the file system is full; the bytes written.
    pub fn fill(&self) -> std::io::Result<u64> {
        let mut f = std::fs::File::create(self.filler())?;
        let block = vec![0u8; 4096];
        let mut n = 0u64;
        loop {
            match f.write(&block) {
                Ok(0) => return Ok(n),
                Ok(k) => n += k as u64,
                Err(e) if e.raw_os_error() == Some(28) => return Ok(n),
                Err(e) => return Err(e),
            }
        }
    }

    /// Removes what [`StateDisk::fill`] wrote.
    pub fn free(&self) {
        let _ = std::fs::remove_file(self.filler());
    }

    /// Freezes the file system (`fsfreeze -f`): every write to it blocks until it thaws.
    pub fn freeze(&mut self) -> Result<(), String> {
        quiet("fsfreeze", &["-f"], &self.mount)?;
        self.frozen = true;
        Ok(())
    }

    /// Thaws it (`fsfreeze -u`).
    pub fn thaw(&mut self) -> Result<(), String> {
        if self.frozen {
            quiet("fsfreeze", &["-u"], &self.mount)?;
            self.frozen = false;
        }
        Ok(())
    }
}

impl Drop for StateDisk {
    fn drop(&mut self) {
        let _ = self.thaw();
        MOUNTED
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.mount);
        release(&self.mount);
        if let Some(image) = &self.image {
            let _ = std::fs::remove_file(image);
        }
    }
}
