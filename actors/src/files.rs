//! Reading the files a role is given (its journal, rank table, token, TLS material) without
//! ever blocking: each is opened non-blocking and refused unless it is a regular file, so a
//! FIFO, a terminal or a device (`/dev/zero`) named by mistake is an error at once instead of
//! a start that hangs where no stop signal can end it; and each is read with a size bound.
//!
//! The manager's state directory is used through a descriptor of the directory itself
//! (`*_at`): nothing there is opened through a symbolic link, and what it creates it creates
//! exclusively, so a file planted under a name it writes is removed, never written through.

use std::fs::File;
use std::io::{self, Read as _};
use std::os::fd::BorrowedFd;
use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _};
use std::path::Path;

/// `O_NONBLOCK`, for [`std::os::unix::fs::OpenOptionsExt::custom_flags`].
pub(crate) const NONBLOCK: i32 = rustix::fs::OFlags::NONBLOCK.bits() as i32;

/// Takes an exclusive `flock` on `f` without waiting: `Ok(false)` when another open file holds
/// it (released when that file is closed, or its process dies).
pub(crate) fn try_lock_exclusive(f: impl std::os::fd::AsFd) -> io::Result<bool> {
    use rustix::fs::{flock, FlockOperation};
    match flock(f, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(true),
        Err(e) if e == rustix::io::Errno::WOULDBLOCK => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// What kind of file `t` is, for a message ("a FIFO", "a directory", ...).
fn kind(t: std::fs::FileType) -> &'static str {
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_symlink() {
        "a symbolic link"
    } else {
        "not a regular file"
    }
}

/// The error of a file that is not a regular one: `InvalidInput`, naming what it is.
fn not_regular(t: std::fs::FileType) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{}, not a regular file", kind(t)),
    )
}

/// Opens `path` for reading without blocking (a FIFO without a writer would otherwise block
/// the open itself), and refuses it unless it is a regular file (a symbolic link to one is
/// followed).
pub fn open_regular(path: &Path) -> io::Result<File> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(NONBLOCK)
        .open(path)?;
    let t = f.metadata()?.file_type();
    if !t.is_file() {
        return Err(not_regular(t));
    }
    Ok(f)
}

/// Whether `path` itself (not what a link names) is a symbolic link or another file that is
/// not a regular one: `Err` naming what it is; `Ok(false)` when it does not exist.
pub fn check_regular_or_absent(path: &Path) -> io::Result<bool> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_file() => Ok(true),
        Ok(m) => Err(not_regular(m.file_type())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// The whole of the regular file at `path` ([`open_regular`]); `InvalidData` when it holds
/// more than `max` bytes (it is then not what the caller expects).
pub fn read_regular(path: &Path, max: u64) -> io::Result<Vec<u8>> {
    let f = open_regular(path)?;
    let mut bytes = Vec::new();
    f.take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("larger than {max} bytes"),
        ));
    }
    Ok(bytes)
}

/// The flags of every open in a directory here: no blocking on a FIFO, never through a
/// symbolic link, not inherited by a child process.
fn at_flags() -> rustix::fs::OFlags {
    use rustix::fs::OFlags;
    OFlags::NONBLOCK | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

/// `ELOOP` from an open with `O_NOFOLLOW`: the name is a symbolic link.
fn link_refused(e: rustix::io::Errno) -> io::Error {
    if e == rustix::io::Errno::LOOP {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "a symbolic link, not a regular file",
        )
    } else {
        e.into()
    }
}

/// `f` unless it is not a regular file (then `InvalidInput` naming what it is).
fn regular(f: File) -> io::Result<File> {
    let t = f.metadata()?.file_type();
    if !t.is_file() {
        return Err(not_regular(t));
    }
    Ok(f)
}

/// Opens `name` in the directory `dir` for reading, without blocking and without following a
/// symbolic link: `Ok(None)` when there is none, `InvalidInput` naming what it is unless it
/// is a regular file.
pub(crate) fn open_regular_at(dir: BorrowedFd<'_>, name: &str) -> io::Result<Option<File>> {
    use rustix::fs::{Mode, OFlags};
    match rustix::fs::openat(dir, name, OFlags::RDONLY | at_flags(), Mode::empty()) {
        Ok(fd) => regular(File::from(fd)).map(Some),
        Err(e) if e == rustix::io::Errno::NOENT => Ok(None),
        Err(e) => Err(link_refused(e)),
    }
}

/// Opens `name` in `dir` for reading and writing, creating it when missing (mode 0644),
/// never through a symbolic link; refused unless it is a regular file.
pub(crate) fn open_or_create_at(dir: BorrowedFd<'_>, name: &str) -> io::Result<File> {
    use rustix::fs::{Mode, OFlags};
    let flags = OFlags::RDWR | OFlags::CREATE | at_flags();
    let fd =
        rustix::fs::openat(dir, name, flags, Mode::from_raw_mode(0o644)).map_err(link_refused)?;
    regular(File::from(fd))
}

/// Creates `name` in `dir` for appending (mode 0644), exclusively and never through a
/// symbolic link (`O_CREAT | O_EXCL | O_NOFOLLOW`): whatever has the name already (a link
/// planted there, the file of a writer that was killed) is removed, not written through, and
/// the name created again; if it is created again meanwhile, that is an error.
pub(crate) fn create_exclusive_at(dir: BorrowedFd<'_>, name: &str) -> io::Result<File> {
    use rustix::fs::{AtFlags, Mode, OFlags};
    let flags = OFlags::WRONLY | OFlags::APPEND | OFlags::CREATE | OFlags::EXCL | at_flags();
    let create = || rustix::fs::openat(dir, name, flags, Mode::from_raw_mode(0o644));
    let fd = match create() {
        Err(e) if e == rustix::io::Errno::EXIST => {
            rustix::fs::unlinkat(dir, name, AtFlags::empty())?;
            create()?
        }
        other => other?,
    };
    Ok(File::from(fd))
}

/// Held by the tests that fork a process and by those that lock a state directory twice in
/// a row: a child forked between the two holds the first lock until it execs.
#[cfg(test)]
pub(crate) static FORKING: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

/// Makes a FIFO at `path` (with `mkfifo(1)`: no unsafe code here); the caller holds
/// [`FORKING`].
#[cfg(test)]
pub(crate) fn mkfifo(path: &Path) {
    let made = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap();
    assert!(made.success());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!(
            "taskd-files-{name}-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4()
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn only_regular_files_are_read_and_a_fifo_does_not_block() {
        let d = temp("kinds");
        let file = d.join("f");
        std::fs::write(&file, b"hello").unwrap();
        assert_eq!(read_regular(&file, 5).unwrap(), b"hello");
        let e = read_regular(&file, 4).unwrap_err();
        assert!(e.to_string().contains("larger than 4 bytes"), "{e}");

        // A FIFO nobody writes: opening it blocking would never return.
        let fifo = d.join("fifo");
        {
            let _fork = FORKING.lock();
            mkfifo(&fifo);
        }
        let e = read_regular(&fifo, 10).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("a FIFO"), "{e}");
        assert!(check_regular_or_absent(&fifo).is_err());

        let e = read_regular(Path::new("/dev/zero"), 10).unwrap_err();
        assert!(e.to_string().contains("a character device"), "{e}");
        let e = read_regular(&d, 10).unwrap_err();
        assert!(e.to_string().contains("a directory"), "{e}");

        let link = d.join("link");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert_eq!(read_regular(&link, 5).unwrap(), b"hello", "followed");
        let e = check_regular_or_absent(&link).unwrap_err();
        assert!(e.to_string().contains("a symbolic link"), "{e}");
        assert!(!check_regular_or_absent(&d.join("none")).unwrap());
        assert!(check_regular_or_absent(&file).unwrap());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
