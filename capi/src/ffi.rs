//! The C ABI (`capi/include/taskd.h` declares it; `capi/tests/abi.rs` checks the header
//! against this file). The only module of the crate with `unsafe` code: every block reads or
//! writes memory the C caller handed in, under the rules the header states.
//!
//! Conventions: functions return a status code (`TASKD_OK` or a `TASKD_ERR_*` of
//! [`crate::error`]); on failure `taskd_last_error()` has the message, per thread. Every entry
//! point runs under `catch_unwind`: no panic crosses into C. Handles are opaque; every function
//! taking a handle may be called from any thread, concurrently, except `taskd_*_free`, which
//! must be the last call on its handle.

#![deny(unsafe_op_in_unsafe_fn)]

use crate::error::{self, guard, CapiError};
use crate::framework::FrameworkSwitch;
use crate::state::timeout_ms;
use crate::{manager, proxy, worker, EmbeddedManager, EmbeddedProxy, EmbeddedWorker};
use std::ffi::{c_char, c_void, CStr};
use taskd_core::StepOutcome;

/// A manager (opaque to C).
pub struct TaskdManager(EmbeddedManager);
/// A proxy (opaque to C).
pub struct TaskdProxy(EmbeddedProxy);
/// A worker (opaque to C).
pub struct TaskdWorker(EmbeddedWorker);

/// The framework's switch function: `ranks[i]` (global ranks) use their backup NIC when
/// `use_backup[i]`, for `n` targets, within `timeout_ms`. Returns whether every communicator
/// switched; on `false` it may write a NUL-terminated reason of at most `err_len` bytes into
/// `err`. Called on the training thread, inside its `taskd_worker_step_completed`.
pub type TaskdSwitchFn = unsafe extern "C" fn(
    ranks: *const u32,
    use_backup: *const bool,
    n: usize,
    timeout_ms: u64,
    user: *mut c_void,
    err: *mut c_char,
    err_len: usize,
) -> bool;

/// `taskd_manager_start` flag: SIGINT, SIGTERM and SIGHUP stop the manager, not the process.
pub const TASKD_MANAGER_SIGNALS: u32 = 1;
/// `taskd_manager_addr`: the port proxies connect to.
pub const TASKD_ADDR_LISTEN: i32 = 0;
/// `taskd_manager_addr`: the operators' control API (empty when not served).
pub const TASKD_ADDR_CONTROL: i32 = 1;
/// Bytes a switch function may write as its reason.
const SWITCH_ERR_LEN: usize = 1024;

static VERSION: &CStr =
    match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
        Ok(v) => v,
        Err(_) => panic!("the version has no NUL inside"),
    };

/// Text from C: not null, UTF-8.
///
/// # Safety
/// `p` is null or a NUL-terminated string that lives for the call.
unsafe fn text<'a>(p: *const c_char, what: &str) -> Result<&'a str, CapiError> {
    if p.is_null() {
        return Err(CapiError::Argument(format!("{what} is a null pointer")));
    }
    // SAFETY: not null, and NUL-terminated for the call by the caller's contract.
    let c = unsafe { CStr::from_ptr(p) };
    c.to_str()
        .map_err(|e| CapiError::Argument(format!("{what} is not UTF-8: {e}")))
}

/// The object behind a handle.
///
/// # Safety
/// `p` is null or a handle returned by the matching `_start` and not freed.
unsafe fn handle<'a, T>(p: *const T) -> Result<&'a T, CapiError> {
    // SAFETY: a live handle by the caller's contract; null is refused.
    unsafe { p.as_ref() }.ok_or_else(|| CapiError::Argument("the handle is a null pointer".into()))
}

/// Writes `s` and a NUL into `buf`, refusing a buffer too small for it.
///
/// # Safety
/// `buf` is null or writable for `len` bytes.
unsafe fn write_text(buf: *mut c_char, len: usize, s: &str) -> Result<(), CapiError> {
    if buf.is_null() || len <= s.len() {
        return Err(CapiError::Argument(format!(
            "the buffer of {len} bytes is too small: {:?} needs {}",
            s,
            s.len() + 1
        )));
    }
    // SAFETY: `buf` is writable for `len` > `s.len()` bytes; the regions cannot overlap
    // (`s` is Rust-owned).
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf.cast::<u8>(), s.len());
        *buf.add(s.len()) = 0;
    }
    Ok(())
}

/// Writes `s` into an optional buffer: nothing when `buf` is null.
///
/// # Safety
/// As [`write_text`].
unsafe fn write_optional(buf: *mut c_char, len: usize, s: &str) -> Result<(), CapiError> {
    if buf.is_null() {
        return Ok(());
    }
    // SAFETY: forwarded contract.
    unsafe { write_text(buf, len, s) }
}

/// Stores a new handle in `*out`.
///
/// # Safety
/// `out` is null or writable.
unsafe fn put<T>(out: *mut *mut T, value: T) -> Result<(), CapiError> {
    if out.is_null() {
        return Err(CapiError::Argument("the output pointer is null".into()));
    }
    // SAFETY: not null and writable by the caller's contract.
    unsafe { *out = Box::into_raw(Box::new(value)) };
    Ok(())
}

/// Frees a handle.
///
/// # Safety
/// `p` is null or a live handle that no other thread uses any more.
unsafe fn free<T>(p: *mut T) {
    if !p.is_null() {
        // SAFETY: created by `Box::into_raw` in `put`, freed once by the caller's contract.
        drop(unsafe { Box::from_raw(p) });
    }
}

/// The library's version, a static string.
#[no_mangle]
pub extern "C" fn taskd_version() -> *const c_char {
    VERSION.as_ptr()
}

/// The calling thread's last error message ("" if none): valid until the thread's next failing
/// call into the library.
#[no_mangle]
pub extern "C" fn taskd_last_error() -> *const c_char {
    error::with_last_error(|m| m.as_ptr())
}

/// Checks the configuration of a role (`"manager"`, `"proxy"` or `"worker"`) without starting
/// anything.
///
/// # Safety
/// Both arguments are NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn taskd_check_config(
    role: *const c_char,
    config_json: *const c_char,
) -> i32 {
    guard(|| {
        // SAFETY: strings by the caller's contract.
        let (role, json) = unsafe { (text(role, "role")?, text(config_json, "config_json")?) };
        match role {
            "manager" => manager::check(json),
            "proxy" => proxy::check(json),
            "worker" => worker::check(json),
            other => Err(CapiError::Argument(format!(
                "unknown role {other:?}: manager, proxy or worker"
            ))),
        }
    })
}

/// Starts a manager; returns once it listens.
///
/// # Safety
/// `config_json` is a NUL-terminated string; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn taskd_manager_start(
    config_json: *const c_char,
    flags: u32,
    out: *mut *mut TaskdManager,
) -> i32 {
    guard(|| {
        // SAFETY: a string by the caller's contract.
        let json = unsafe { text(config_json, "config_json")? };
        if flags & !TASKD_MANAGER_SIGNALS != 0 {
            return Err(CapiError::Argument(format!("unknown flags {flags:#x}")));
        }
        let m = EmbeddedManager::start(json, flags & TASKD_MANAGER_SIGNALS != 0)?;
        // SAFETY: `out` is writable by the caller's contract.
        unsafe { put(out, TaskdManager(m)) }
    })
}

/// Writes one of the manager's addresses (`TASKD_ADDR_LISTEN`, `TASKD_ADDR_CONTROL`) as text.
///
/// # Safety
/// `m` is a live handle; `buf` is writable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn taskd_manager_addr(
    m: *const TaskdManager,
    which: i32,
    buf: *mut c_char,
    len: usize,
) -> i32 {
    guard(|| {
        // SAFETY: a live handle by the caller's contract.
        let info = unsafe { handle(m)? }.0.info();
        let addr = match which {
            TASKD_ADDR_LISTEN => info.listen.to_string(),
            TASKD_ADDR_CONTROL => info.control.map(|a| a.to_string()).unwrap_or_default(),
            other => return Err(CapiError::Argument(format!("unknown address {other}"))),
        };
        // SAFETY: writable for `len` bytes by the caller's contract.
        unsafe { write_text(buf, len, &addr) }
    })
}

/// Waits until every expected worker registered and the job is verified.
///
/// # Safety
/// `m` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn taskd_manager_wait_ready(m: *const TaskdManager, timeout_ms_: u64) -> i32 {
    guard(|| {
        // SAFETY: a live handle by the caller's contract.
        unsafe { handle(m)? }.0.wait_ready(timeout_ms(timeout_ms_))
    })
}

/// Waits until the manager stopped; writes why into `why` (may be null).
///
/// # Safety
/// `m` is a live handle; `why` is null or writable for `why_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn taskd_manager_wait(
    m: *const TaskdManager,
    timeout_ms_: u64,
    why: *mut c_char,
    why_len: usize,
) -> i32 {
    guard(|| {
        // SAFETY: a live handle by the caller's contract.
        let reason = unsafe { handle(m)? }.0.wait(timeout_ms(timeout_ms_))?;
        // SAFETY: null or writable for `why_len` bytes by the caller's contract.
        unsafe { write_optional(why, why_len, &reason) }
    })
}

/// The host's last-words function: takes a checkpoint from the ranks alive (`dead[0..n]`
/// died) within `timeout_ms`; returns whether one was taken and may write a NUL-terminated
/// line of at most `detail_len` bytes into `detail`. Called on a thread of the library's own.
pub type TaskdLastWordsFn = unsafe extern "C" fn(
    dead: *const u32,
    n: usize,
    timeout_ms: u64,
    user: *mut c_void,
    detail: *mut c_char,
    detail_len: usize,
) -> bool;

/// A last-words function and its `user` pointer.
struct CLastWords {
    f: TaskdLastWordsFn,
    user: *mut c_void,
}

// SAFETY: the header tells the caller of `taskd_manager_set_last_words` that the function is
// called with `user` on a thread of the library's own, one call at a time, until
// `taskd_manager_free` returned; the pointer is only passed back to that function.
unsafe impl Send for CLastWords {}
// SAFETY: as above: the manager never calls it twice at once, and `&CLastWords` only reads
// the two values.
unsafe impl Sync for CLastWords {}

impl taskd_actors::manager::LastWordsHost for CLastWords {
    fn last_words(
        &self,
        dead: &[taskd_core::GlobalRank],
        within: std::time::Duration,
    ) -> taskd_core::ledger::LastWords {
        let ranks: Vec<u32> = dead.iter().map(|r| r.0).collect();
        let mut detail = vec![0u8; SWITCH_ERR_LEN];
        let timeout_ms = u64::try_from(within.as_millis()).unwrap_or(u64::MAX);
        // SAFETY: `ranks` holds `ranks.len()` elements and `detail` is writable for its length,
        // both for the duration of the call; `f` and `user` come from the caller of
        // `taskd_manager_set_last_words`, who vouches for them.
        let taken = unsafe {
            (self.f)(
                ranks.as_ptr(),
                ranks.len(),
                timeout_ms,
                self.user,
                detail.as_mut_ptr().cast::<c_char>(),
                detail.len(),
            )
        };
        let end = detail.iter().position(|b| *b == 0).unwrap_or(detail.len());
        let detail = String::from_utf8_lossy(&detail[..end]).trim().to_owned();
        taskd_core::ledger::LastWords {
            taken,
            detail: if detail.is_empty() {
                if taken {
                    "checkpoint taken"
                } else {
                    "no checkpoint"
                }
                .to_owned()
            } else {
                detail
            },
        }
    }
}

/// Asks `last_words` (with `user`) for a last-words checkpoint before every stop of training,
/// each within `timeout_ms`.
///
/// # Safety
/// `m` is a live handle; `last_words` may be called with `user` on a thread of the library's
/// own, one call at a time, until `taskd_manager_free` returned.
#[no_mangle]
pub unsafe extern "C" fn taskd_manager_set_last_words(
    m: *const TaskdManager,
    last_words: Option<TaskdLastWordsFn>,
    user: *mut c_void,
    timeout_ms_: u64,
) -> i32 {
    guard(|| {
        let f = last_words
            .ok_or_else(|| CapiError::Argument("the last-words function is null".into()))?;
        let within = timeout_ms(timeout_ms_).unwrap_or(std::time::Duration::MAX);
        // SAFETY: a live handle by the caller's contract.
        unsafe { handle(m)? }
            .0
            .set_last_words(std::sync::Arc::new(CLastWords { f, user }), within)
    })
}

/// The process of `rank` died, as something outside taskd's transport saw it.
///
/// # Safety
/// `m` is a live handle; `why` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn taskd_manager_report_fault(
    m: *const TaskdManager,
    rank: u32,
    why: *const c_char,
) -> i32 {
    guard(|| {
        // SAFETY: a live handle and a string by the caller's contract.
        let (m, why) = unsafe { (handle(m)?, text(why, "why")?) };
        m.0.report_fault(rank, why)
    })
}

/// Asks the manager to stop; returns at once.
///
/// # Safety
/// `m` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn taskd_manager_stop(m: *const TaskdManager) -> i32 {
    guard(|| {
        // SAFETY: a live handle by the caller's contract.
        unsafe { handle(m)? }.0.stop("taskd_manager_stop");
        Ok(())
    })
}

/// Stops the manager if it runs, waits for it, and frees the handle.
///
/// # Safety
/// `m` is null or a live handle no other thread uses any more.
#[no_mangle]
pub unsafe extern "C" fn taskd_manager_free(m: *mut TaskdManager) {
    let _ = guard(|| {
        // SAFETY: forwarded contract.
        unsafe { free(m) };
        Ok(())
    });
}

/// Starts a proxy; returns once it listens (it joins the manager in the background).
///
/// # Safety
/// `config_json` is a NUL-terminated string; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn taskd_proxy_start(
    config_json: *const c_char,
    out: *mut *mut TaskdProxy,
) -> i32 {
    guard(|| {
        // SAFETY: a string by the caller's contract.
        let json = unsafe { text(config_json, "config_json")? };
        let p = EmbeddedProxy::start(json)?;
        // SAFETY: `out` is writable by the caller's contract.
        unsafe { put(out, TaskdProxy(p)) }
    })
}

/// Writes the address the node's workers connect to.
///
/// # Safety
/// `p` is a live handle; `buf` is writable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn taskd_proxy_addr(
    p: *const TaskdProxy,
    buf: *mut c_char,
    len: usize,
) -> i32 {
    guard(|| {
        // SAFETY: a live handle by the caller's contract.
        let addr = unsafe { handle(p)? }.0.local_addr().to_string();
        // SAFETY: writable for `len` bytes by the caller's contract.
        unsafe { write_text(buf, len, &addr) }
    })
}

/// Waits until the manager admitted the proxy; writes the node's name into `node` (may be
/// null).
///
/// # Safety
/// `p` is a live handle; `node` is null or writable for `node_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn taskd_proxy_wait_registered(
    p: *const TaskdProxy,
    timeout_ms_: u64,
    node: *mut c_char,
    node_len: usize,
) -> i32 {
    guard(|| {
        // SAFETY: a live handle by the caller's contract.
        let a = unsafe { handle(p)? }
            .0
            .wait_registered(timeout_ms(timeout_ms_))?;
        // SAFETY: null or writable for `node_len` bytes by the caller's contract.
        unsafe { write_optional(node, node_len, &a.node) }
    })
}

/// Waits at most `timeout_ms` for the manager's next order for the node's launcher and writes
/// it as JSON into `buf`: `{"order": "restart", "number": N, "reason": ...}` (stop every
/// worker of the node and start them all again, as restart N of the job) or `{"order":
/// "end", "reason": ...}` (end the job on this node). `TASKD_ERR_TIMEOUT` when none came.
///
/// # Safety
/// `p` is a live handle; `buf` is writable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn taskd_proxy_next_order(
    p: *const TaskdProxy,
    timeout_ms_: u64,
    buf: *mut c_char,
    len: usize,
) -> i32 {
    guard(|| {
        // SAFETY: a live handle by the caller's contract.
        let o = unsafe { handle(p)? }
            .0
            .next_order(timeout_ms(timeout_ms_))?;
        // SAFETY: writable for `len` bytes by the caller's contract.
        unsafe { write_text(buf, len, &proxy::order_json(&o)) }
    })
}

/// The launcher saw the process of `rank` end: `status` says how, for people; `clean` when it
/// exited with status 0; `generation` is the job restart it was started for (0: the first
/// start). The manager learns it even of a worker that never registered.
///
/// # Safety
/// `p` is a live handle; `status` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn taskd_proxy_worker_exited(
    p: *const TaskdProxy,
    rank: u32,
    status: *const c_char,
    clean: bool,
    generation: u32,
) -> i32 {
    guard(|| {
        // SAFETY: a string and a live handle by the caller's contract.
        let (p, status) = unsafe { (handle(p)?, text(status, "status")?) };
        p.0.worker_exited(rank, status, clean, generation)
    })
}

/// Stops the proxy and waits until it has.
///
/// # Safety
/// `p` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn taskd_proxy_stop(p: *const TaskdProxy) -> i32 {
    guard(|| {
        // SAFETY: a live handle by the caller's contract.
        unsafe { handle(p)? }.0.stop("taskd_proxy_stop");
        Ok(())
    })
}

/// Stops the proxy if it runs and frees the handle.
///
/// # Safety
/// `p` is null or a live handle no other thread uses any more.
#[no_mangle]
pub unsafe extern "C" fn taskd_proxy_free(p: *mut TaskdProxy) {
    let _ = guard(|| {
        // SAFETY: forwarded contract.
        unsafe { free(p) };
        Ok(())
    });
}

/// A switch function and its `user` pointer, called on the training thread held in
/// `taskd_worker_step_completed`.
struct CSwitch {
    f: TaskdSwitchFn,
    user: *mut c_void,
}

// SAFETY: the header tells the caller of `taskd_worker_start` that the switch function is
// called with `user` on the training thread, inside its `taskd_worker_step_completed`, never
// two calls at once; the pointer is only passed back to that function.
unsafe impl Send for CSwitch {}

impl FrameworkSwitch for CSwitch {
    fn switch_nic(
        &mut self,
        ranks: &[u32],
        use_backup: &[bool],
        timeout: std::time::Duration,
    ) -> Result<(), String> {
        let mut err = vec![0u8; SWITCH_ERR_LEN];
        let timeout_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        let n = ranks.len().min(use_backup.len());
        // SAFETY: `ranks` and `use_backup` hold at least `n` elements and `err` is writable
        // for its length, all for the duration of the call; `f` and `user` come from the
        // caller of `taskd_worker_start`, who vouches for them.
        let ok = unsafe {
            (self.f)(
                ranks.as_ptr(),
                use_backup.as_ptr(),
                n,
                timeout_ms,
                self.user,
                err.as_mut_ptr().cast::<c_char>(),
                err.len(),
            )
        };
        if ok {
            return Ok(());
        }
        let end = err.iter().position(|b| *b == 0).unwrap_or(err.len());
        let reason = String::from_utf8_lossy(&err[..end]).trim().to_owned();
        Err(if reason.is_empty() {
            "the framework's switch function returned false".to_owned()
        } else {
            reason
        })
    }
}

/// The framework's in-flight side: one JSON request in, its JSON answer (or the reason it
/// failed) written NUL-terminated into `reply` (at most `reply_len` bytes); see
/// `taskd_worker_set_in_flight`.
pub type TaskdInFlightFn = unsafe extern "C" fn(
    request: *const c_char,
    reply: *mut c_char,
    reply_len: usize,
    user: *mut c_void,
) -> bool;

/// Bytes an in-flight answer may have.
const IN_FLIGHT_REPLY_LEN: usize = 1 << 16;

struct CInFlight {
    f: TaskdInFlightFn,
    user: *mut c_void,
}

// SAFETY: the header tells the caller of `taskd_worker_set_in_flight` that its function is
// called with `user` from a thread of taskd's (one call at a time), until the worker is freed;
// the pointer is only passed back to that function.
unsafe impl Send for CInFlight {}
// SAFETY: as above: calls are made one at a time by the worker, never concurrently.
unsafe impl Sync for CInFlight {}

impl CInFlight {
    fn call(&self, request: &str) -> Result<String, String> {
        let req = std::ffi::CString::new(request).map_err(|e| e.to_string())?;
        let mut reply = vec![0u8; IN_FLIGHT_REPLY_LEN];
        // SAFETY: `req` is NUL-terminated and `reply` writable for its length for the call;
        // `f` and `user` come from the caller of `taskd_worker_set_in_flight`.
        let ok = unsafe {
            (self.f)(
                req.as_ptr(),
                reply.as_mut_ptr().cast::<c_char>(),
                reply.len(),
                self.user,
            )
        };
        let end = reply.iter().position(|b| *b == 0).unwrap_or(reply.len());
        let text = String::from_utf8_lossy(&reply[..end]).trim().to_owned();
        if ok {
            Ok(text)
        } else if text.is_empty() {
            Err("the framework's in-flight function returned false".to_owned())
        } else {
            Err(text)
        }
    }
}

/// Registers the training process's in-flight side (taskd's Gloo switch has one): how it
/// aborts its collectives in flight and finishes the step on rebuilt groups when the manager
/// moves the job inside a step. Requests are JSON objects (`{"op": "abort" | "switch" |
/// "give_up", ...}`, see the header); `f` is called with `user` from a thread of taskd's,
/// never the training thread, one call at a time, until `taskd_worker_free`. Returns
/// `TASKD_OK`, or `TASKD_ERR_ARGUMENT` for a null handle or function, or when one was
/// registered already.
///
/// # Safety
/// `w` is null or a live handle; `f` may be called with `user` as said, until the worker is
/// freed.
#[no_mangle]
pub unsafe extern "C" fn taskd_worker_set_in_flight(
    w: *const TaskdWorker,
    f: Option<TaskdInFlightFn>,
    user: *mut c_void,
) -> i32 {
    guard(|| {
        // SAFETY: null or a live handle by the caller's contract.
        let w = unsafe { w.as_ref() }
            .ok_or_else(|| CapiError::Argument("the worker is a null pointer".into()))?;
        let f = f.ok_or_else(|| {
            CapiError::Argument("the in-flight function is a null pointer".into())
        })?;
        let c = CInFlight { f, user };
        if w.0.set_in_flight(Box::new(move |req| c.call(req))) {
            Ok(())
        } else {
            Err(CapiError::Argument(
                "this worker has an in-flight side already".into(),
            ))
        }
    })
}

/// Starts a worker that switches through `switch_fn` (with `user`); returns at once.
///
/// # Safety
/// `config_json` is a NUL-terminated string; `out` is writable; `switch_fn` may be called
/// with `user` on the training thread, inside `taskd_worker_step_completed`, until
/// `taskd_worker_stop`/`_free` returned.
#[no_mangle]
pub unsafe extern "C" fn taskd_worker_start(
    config_json: *const c_char,
    switch_fn: Option<TaskdSwitchFn>,
    user: *mut c_void,
    out: *mut *mut TaskdWorker,
) -> i32 {
    guard(|| {
        // SAFETY: a string by the caller's contract.
        let json = unsafe { text(config_json, "config_json")? };
        let f = switch_fn.ok_or_else(|| {
            CapiError::Argument("switch_fn is a null pointer: the worker needs one".into())
        })?;
        let w = EmbeddedWorker::start(json, Box::new(CSwitch { f, user }))?;
        // SAFETY: `out` is writable by the caller's contract.
        unsafe { put(out, TaskdWorker(w)) }
    })
}

/// The step gate: the training loop completed `step`. Returns `TASKD_OK` at once unless an
/// operation holds the rank here (the framework's switch function is then called on this
/// thread, inside this call); `TASKD_STOP_TRAINING` once the manager stopped training, with
/// the reason as the thread's last error; `TASKD_ERR_ARGUMENT` for a null handle.
///
/// # Safety
/// `w` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn taskd_worker_step_completed(w: *const TaskdWorker, step: u64) -> i32 {
    // SAFETY: null or a live handle by the caller's contract.
    let Some(w) = (unsafe { w.as_ref() }) else {
        return error::record(&CapiError::Argument("the worker is a null pointer".into()));
    };
    // The gate never panics on this path; a bug there must still not unwind into C.
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w.0.step_completed(step))) {
        Ok(StepOutcome::Go) => error::TASKD_OK,
        Ok(StepOutcome::Stop(why)) => {
            error::set_last_error(&why);
            error::TASKD_STOP_TRAINING
        }
        Err(p) => error::record(&CapiError::from_panic(p)),
    }
}

/// Waits until the proxy admitted the worker; writes the node's name into `node` (may be
/// null).
///
/// # Safety
/// `w` is a live handle; `node` is null or writable for `node_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn taskd_worker_wait_registered(
    w: *const TaskdWorker,
    timeout_ms_: u64,
    node: *mut c_char,
    node_len: usize,
) -> i32 {
    guard(|| {
        // SAFETY: a live handle by the caller's contract.
        let r = unsafe { handle(w)? }
            .0
            .wait_registered(timeout_ms(timeout_ms_))?;
        // SAFETY: null or writable for `node_len` bytes by the caller's contract.
        unsafe { write_optional(node, node_len, &r.node.0) }
    })
}

/// Waits until the job is whole: every rank registered with the manager, which then asked this
/// one in a verification round. For a training loop before its first step.
///
/// # Safety
/// `w` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn taskd_worker_wait_job_whole(
    w: *const TaskdWorker,
    timeout_ms_: u64,
) -> i32 {
    guard(|| {
        // SAFETY: a live handle by the caller's contract.
        unsafe { handle(w)? }
            .0
            .wait_job_whole(timeout_ms(timeout_ms_))
    })
}

/// Stops the worker (the gate opens for good) and waits until it has; the handle stays valid
/// and later steps pass at once.
///
/// # Safety
/// `w` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn taskd_worker_stop(w: *const TaskdWorker) -> i32 {
    guard(|| {
        // SAFETY: a live handle by the caller's contract.
        unsafe { handle(w)? }.0.stop("taskd_worker_stop");
        Ok(())
    })
}

/// Stops the worker if it runs and frees the handle.
///
/// # Safety
/// `w` is null or a live handle no other thread uses any more.
#[no_mangle]
pub unsafe extern "C" fn taskd_worker_free(w: *mut TaskdWorker) {
    let _ = guard(|| {
        // SAFETY: forwarded contract.
        unsafe { free(w) };
        Ok(())
    });
}
