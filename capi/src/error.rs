//! What can go wrong at the C boundary, the code each kind is returned as, and the calling
//! thread's last error message.
//!
//! Every C function returns one of the codes below; when it is not [`TASKD_OK`] the message
//! (naming the bad value) is the calling thread's last error until its next failing call, read
//! with `taskd_last_error()`.

use std::cell::RefCell;
use std::ffi::CString;
use std::time::Duration;

/// Success.
pub const TASKD_OK: i32 = 0;
/// A bad argument: a null pointer, text that is not UTF-8, a configuration that is not a JSON
/// object.
pub const TASKD_ERR_ARGUMENT: i32 = 1;
/// The configuration is refused: an unknown key, a bad value, a missing job id, ...
pub const TASKD_ERR_CONFIG: i32 = 2;
/// The role could not start: a port taken, a TLS file, a thread.
pub const TASKD_ERR_START: i32 = 3;
/// The manager or the proxy refused the registration for good.
pub const TASKD_ERR_REFUSED: i32 = 4;
/// A wait ran out of time.
pub const TASKD_ERR_TIMEOUT: i32 = 5;
/// The role stopped (or was stopped) before what was waited for happened.
pub const TASKD_ERR_STOPPED: i32 = 6;
/// A bug in taskd: a panic, caught at the boundary (it never unwinds into C).
pub const TASKD_ERR_PANIC: i32 = 7;
/// `taskd_worker_step_completed`: the manager stopped training. End the training loop and
/// exit with a failure (the launcher restarts the process); `taskd_last_error()` has the
/// reason, one line.
pub const TASKD_STOP_TRAINING: i32 = 8;

/// Why a call of the C API failed.
#[derive(Debug, thiserror::Error)]
pub enum CapiError {
    /// A bad argument at the boundary.
    #[error("{0}")]
    Argument(String),
    /// The role's configuration is refused.
    #[error("{role} configuration: {message}")]
    Config {
        /// `manager`, `proxy` or `worker`.
        role: &'static str,
        /// What is wrong, naming the key and the value.
        message: String,
    },
    /// The role could not start.
    #[error("the {role} could not start: {message}")]
    Start {
        /// `manager`, `proxy` or `worker`.
        role: &'static str,
        /// Why.
        message: String,
    },
    /// Refused for good by the manager or the proxy.
    #[error("refused: {0}")]
    Refused(String),
    /// A wait ran out of time.
    #[error("timed out after {0:?} waiting for {1}")]
    Timeout(Duration, &'static str),
    /// The role stopped first.
    #[error("stopped: {0}")]
    Stopped(String),
    /// A panic caught at the boundary.
    #[error("internal error (caught at the C boundary): {0}")]
    Panic(String),
}

impl CapiError {
    /// The code the C API returns for this error.
    pub fn code(&self) -> i32 {
        match self {
            CapiError::Argument(_) => TASKD_ERR_ARGUMENT,
            CapiError::Config { .. } => TASKD_ERR_CONFIG,
            CapiError::Start { .. } => TASKD_ERR_START,
            CapiError::Refused(_) => TASKD_ERR_REFUSED,
            CapiError::Timeout(..) => TASKD_ERR_TIMEOUT,
            CapiError::Stopped(_) => TASKD_ERR_STOPPED,
            CapiError::Panic(_) => TASKD_ERR_PANIC,
        }
    }

    /// A panic's payload as an error (the message when it is text).
    pub fn from_panic(payload: Box<dyn std::any::Any + Send>) -> CapiError {
        let msg = payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".to_owned());
        CapiError::Panic(msg)
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `e` as this thread's last error and returns its code.
pub fn record(e: &CapiError) -> i32 {
    set_last_error(&e.to_string());
    e.code()
}

/// Sets this thread's last error message (an interior NUL ends it).
pub fn set_last_error(msg: &str) {
    let text = msg.split('\0').next().unwrap_or_default();
    let c = CString::new(text).unwrap_or_default();
    LAST_ERROR.with(|l| *l.borrow_mut() = c);
}

/// Runs `f` with this thread's last error message.
pub fn with_last_error<R>(f: impl FnOnce(&CString) -> R) -> R {
    LAST_ERROR.with(|l| f(&l.borrow()))
}

/// Runs `f`, turning its error or its panic into a code (and the last error message).
pub fn guard(f: impl FnOnce() -> Result<(), CapiError>) -> i32 {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => TASKD_OK,
        Ok(Err(e)) => record(&e),
        Err(payload) => record(&CapiError::from_panic(payload)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_a_code_and_a_message() {
        let code = guard(|| panic!("the bug"));
        assert_eq!(code, TASKD_ERR_PANIC);
        with_last_error(|m| {
            assert_eq!(
                m.to_str().unwrap(),
                "internal error (caught at the C boundary): the bug"
            )
        });
        let code = guard(|| Err(CapiError::Refused("rank 9 is not on node-0".into())));
        assert_eq!(code, TASKD_ERR_REFUSED);
        with_last_error(|m| assert_eq!(m.to_str().unwrap(), "refused: rank 9 is not on node-0"));
        assert_eq!(guard(|| Ok(())), TASKD_OK);
    }

    #[test]
    fn the_last_error_is_per_thread() {
        set_last_error("here");
        std::thread::spawn(|| with_last_error(|m| assert!(m.as_bytes().is_empty())))
            .join()
            .unwrap();
        with_last_error(|m| assert_eq!(m.to_str().unwrap(), "here"));
        set_last_error("cut\0off");
        with_last_error(|m| assert_eq!(m.to_str().unwrap(), "cut"));
    }
}
