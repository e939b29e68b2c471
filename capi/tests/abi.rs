//! The C API: the header says what `capi/src/ffi.rs` exports (every function, type and
//! constant), bad arguments come back as codes with a message, and the embedded roles run a
//! whole job in one process, with a framework switch function that gets the whole target list
//! once per operation.

use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use taskd::actors::net::AdminClient;
use taskd::core::command::Target;
use taskd::core::{DeviceId, JobId, NodeName, Outcome, SwitchCommand};
use taskd_capi::error::{TASKD_ERR_ARGUMENT, TASKD_ERR_CONFIG, TASKD_OK};
use taskd_capi::{ffi, EmbeddedManager, EmbeddedProxy, EmbeddedWorker};

// ---------------------------------------------------------------------------------------------
// The header against the code

fn read(rel: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `a *  b` -> `a *b`, one space between words, none inside `**`.
fn norm(c: &str) -> String {
    let spaced = c.replace('*', " * ");
    let words: Vec<&str> = spaced.split_whitespace().collect();
    words.join(" ").replace("* *", "**").replace("* ", "*")
}

/// A Rust FFI type in C.
fn c_type(rust: &str) -> String {
    let rust = rust.trim();
    for (ptr, konst) in [("*const ", true), ("*mut ", false)] {
        if let Some(inner) = rust.strip_prefix(ptr) {
            let inner_c = c_type(inner);
            let c = if konst && !inner_c.ends_with('*') {
                format!("const {inner_c} *")
            } else {
                format!("{inner_c} *")
            };
            return norm(&c);
        }
    }
    let named = match rust {
        "c_char" => "char",
        "c_void" => "void",
        "u32" => "uint32_t",
        "u64" => "uint64_t",
        "i32" => "int32_t",
        "usize" => "size_t",
        "bool" => "bool",
        "TaskdManager" => "taskd_manager",
        "TaskdProxy" => "taskd_proxy",
        "TaskdWorker" => "taskd_worker",
        "Option<TaskdSwitchFn>" | "TaskdSwitchFn" => "taskd_switch_fn",
        other => panic!("no C type for the Rust type {other}"),
    };
    named.to_owned()
}

/// `name: Type, ...` -> C parameter types.
fn rust_params(list: &str) -> Vec<String> {
    list.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| c_type(p.split_once(':').expect("name: Type").1))
        .collect()
}

/// `(return type, parameter types)` of every exported function of ffi.rs, by name.
fn rust_functions(src: &str) -> BTreeMap<String, (String, Vec<String>)> {
    let mut out = BTreeMap::new();
    for part in src.split("extern \"C\" fn ").skip(1) {
        let (name, rest) = part.split_once('(').unwrap();
        if name.contains(' ') || name.is_empty() {
            continue; // the switch function's type, below
        }
        let (params, rest) = rest.split_once(')').unwrap();
        let ret = rest
            .split('{')
            .next()
            .unwrap()
            .trim()
            .strip_prefix("->")
            .map_or("void".to_owned(), c_type);
        out.insert(name.trim().to_owned(), (ret, rust_params(params)));
    }
    out
}

/// A C parameter without its name: `const char *config_json` -> `const char *`.
fn c_param(p: &str) -> String {
    let p = norm(p);
    let cut = p.rfind(['*', ' ']).map_or(p.len(), |i| i + 1);
    norm(&p[..cut])
}

fn strip_comments(h: &str) -> String {
    let mut out = String::new();
    let mut rest = h;
    while let Some(i) = rest.find("/*") {
        out.push_str(&rest[..i]);
        rest = &rest[i + 2..];
        rest = &rest[rest.find("*/").map_or(rest.len(), |j| j + 2)..];
    }
    out.push_str(rest);
    out
}

/// `(return type, parameter types)` of every function the header declares, by name.
fn c_functions(h: &str) -> BTreeMap<String, (String, Vec<String>)> {
    let code: String = strip_comments(h)
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join(" ");
    let mut out = BTreeMap::new();
    for decl in code.split(';').map(str::trim) {
        if decl.starts_with("typedef") || !decl.contains("taskd_") || !decl.ends_with(')') {
            continue;
        }
        let open = decl.find('(').unwrap();
        let head = norm(&decl[..open]);
        let name_at = head.rfind([' ', '*']).unwrap() + 1;
        let (ret, name) = (norm(&head[..name_at]), head[name_at..].to_owned());
        let params = &decl[open + 1..decl.len() - 1];
        let params = if params.trim() == "void" {
            Vec::new()
        } else {
            params.split(',').map(c_param).collect()
        };
        out.insert(name, (ret, params));
    }
    out
}

/// `NAME -> value` of `pub const TASKD_*` in Rust and `#define TASKD_*` in C.
fn constants(rust: &str, c: &str) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let r = rust
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub const TASKD_"))
        .map(|l| {
            let (name, rest) = l.split_once(':').unwrap();
            let value = rest.split('=').nth(1).unwrap().trim().trim_end_matches(';');
            (format!("TASKD_{name}"), value.to_owned())
        })
        .collect();
    let h = c
        .lines()
        .filter_map(|l| l.trim().strip_prefix("#define TASKD_"))
        .filter(|l| l.trim() != "H")
        .map(|l| {
            let mut w = l.split_whitespace();
            (
                format!("TASKD_{}", w.next().unwrap()),
                w.next().unwrap().to_owned(),
            )
        })
        .collect();
    (r, h)
}

#[test]
fn the_header_declares_what_the_library_exports() {
    let src = read("src/ffi.rs");
    let header = read("include/taskd.h");
    let rust = rust_functions(&src);
    let c = c_functions(&header);
    assert!(rust.len() >= 19, "{rust:?}");
    assert_eq!(
        rust.keys().collect::<Vec<_>>(),
        c.keys().collect::<Vec<_>>(),
        "the same functions"
    );
    for (name, sig) in &rust {
        assert_eq!(Some(sig), c.get(name), "the signature of {name}");
    }
    // The switch function's type.
    let fn_type = src
        .split("pub type TaskdSwitchFn = unsafe extern \"C\" fn(")
        .nth(1)
        .unwrap();
    let (params, rest) = fn_type.split_once(')').unwrap();
    assert!(rest.trim_start().starts_with("-> bool;"));
    let typedef = header
        .split("typedef bool (*taskd_switch_fn)(")
        .nth(1)
        .unwrap();
    let c_params: Vec<String> = typedef
        .split_once(')')
        .unwrap()
        .0
        .split(',')
        .map(c_param)
        .collect();
    assert_eq!(rust_params(params), c_params);
    // Opaque handles.
    for (rust_name, c_name) in [
        ("TaskdManager", "taskd_manager"),
        ("TaskdProxy", "taskd_proxy"),
        ("TaskdWorker", "taskd_worker"),
    ] {
        assert!(src.contains(&format!("pub struct {rust_name}(")));
        assert!(header.contains(&format!("typedef struct {rust_name} {c_name};")));
    }
    // Constants: every code and flag, and the timeout that waits for ever.
    let (mut r, mut h) = constants(&(read("src/error.rs") + &src), &header);
    assert_eq!(h.remove("TASKD_FOREVER").as_deref(), Some("UINT64_MAX"));
    assert_eq!(taskd_capi::state::timeout_ms(u64::MAX), None);
    r.retain(|k, _| k != "TASKD_FOREVER");
    assert_eq!(r, h);
    assert_eq!(r.len(), 11, "{r:?}");
}

#[test]
fn the_parsers_read_both_sides_of_a_declaration() {
    let c = c_functions(
        "int32_t taskd_x(const char *a,\n uint32_t b, taskd_w **out); /* c */ void taskd_y(void);",
    );
    assert_eq!(
        c["taskd_x"],
        (
            "int32_t".to_owned(),
            vec![
                "const char *".into(),
                "uint32_t".into(),
                "taskd_w **".into()
            ]
        )
    );
    assert_eq!(c["taskd_y"], ("void".to_owned(), vec![]));
    let r = rust_functions(
        "pub unsafe extern \"C\" fn taskd_x(a: *const c_char, b: u32, out: *mut *mut TaskdWorker) -> i32 {",
    );
    assert_eq!(
        r["taskd_x"],
        (
            "int32_t".to_owned(),
            vec![
                "const char *".into(),
                "uint32_t".into(),
                "taskd_worker **".into()
            ]
        )
    );
}

// ---------------------------------------------------------------------------------------------
// Codes and messages at the boundary

fn last_error() -> String {
    // SAFETY: taskd_last_error returns a NUL-terminated string owned by the library.
    unsafe { CStr::from_ptr(ffi::taskd_last_error()) }
        .to_string_lossy()
        .into_owned()
}

#[test]
fn bad_arguments_are_codes_with_a_message() {
    // SAFETY (every call below): the pointers are null, or point to live NUL-terminated
    // strings and writable locals, as the header allows.
    let version = unsafe { CStr::from_ptr(ffi::taskd_version()) };
    assert_eq!(version.to_str().unwrap(), env!("CARGO_PKG_VERSION"));
    let mut out = std::ptr::null_mut();
    let code = unsafe { ffi::taskd_manager_start(std::ptr::null(), 0, &mut out) };
    assert_eq!(code, TASKD_ERR_ARGUMENT);
    assert_eq!(last_error(), "config_json is a null pointer");
    let json = CString::new("[]").unwrap();
    let code = unsafe { ffi::taskd_proxy_start(json.as_ptr(), &mut std::ptr::null_mut()) };
    assert_eq!(code, TASKD_ERR_ARGUMENT);
    assert_eq!(
        last_error(),
        "the proxy configuration must be a JSON object, not []"
    );
    let role = CString::new("worker").unwrap();
    let json = CString::new(r#"{"job_id": "j", "rank": 1, "proxy": "host"}"#).unwrap();
    let code = unsafe { ffi::taskd_check_config(role.as_ptr(), json.as_ptr()) };
    assert_eq!(code, TASKD_ERR_CONFIG);
    assert!(
        last_error().contains("'host' for 'proxy"),
        "{}",
        last_error()
    );
    let json = CString::new(r#"{"job_id": "j", "rank": 1}"#).unwrap();
    assert_eq!(
        unsafe { ffi::taskd_check_config(role.as_ptr(), json.as_ptr()) },
        TASKD_OK
    );
    let code = unsafe {
        ffi::taskd_worker_start(
            json.as_ptr(),
            None,
            std::ptr::null_mut(),
            &mut std::ptr::null_mut(),
        )
    };
    assert_eq!(code, TASKD_ERR_ARGUMENT);
    assert!(last_error().starts_with("switch_fn is a null pointer"));
    // A null worker is a no-op; freeing null is too.
    unsafe {
        ffi::taskd_worker_step_completed(std::ptr::null(), 1);
        ffi::taskd_worker_free(std::ptr::null_mut());
        ffi::taskd_manager_free(std::ptr::null_mut());
        ffi::taskd_proxy_free(std::ptr::null_mut());
    }
    assert_eq!(
        unsafe { ffi::taskd_worker_stop(std::ptr::null()) },
        TASKD_ERR_ARGUMENT
    );
}

#[test]
fn a_buffer_too_small_is_refused_naming_the_size() {
    let json = CString::new(
        r#"{"job_id": "buf", "nodes": 1, "procs_per_node": 1, "listen": "127.0.0.1:0"}"#,
    )
    .unwrap();
    let mut m = std::ptr::null_mut();
    // SAFETY: live strings and locals; the handle is freed once, last.
    unsafe {
        assert_eq!(ffi::taskd_manager_start(json.as_ptr(), 0, &mut m), TASKD_OK);
        let mut small = [0i8; 4];
        let code =
            ffi::taskd_manager_addr(m, ffi::TASKD_ADDR_LISTEN, small.as_mut_ptr(), small.len());
        assert_eq!(code, TASKD_ERR_ARGUMENT);
        assert!(
            last_error().contains("the buffer of 4 bytes is too small"),
            "{}",
            last_error()
        );
        let mut buf = [0i8; 64];
        let code = ffi::taskd_manager_addr(m, ffi::TASKD_ADDR_LISTEN, buf.as_mut_ptr(), buf.len());
        assert_eq!(code, TASKD_OK);
        let addr = CStr::from_ptr(buf.as_ptr()).to_str().unwrap().to_owned();
        assert!(
            addr.starts_with("127.0.0.1:") && !addr.ends_with(":0"),
            "{addr}"
        );
        let code = ffi::taskd_manager_addr(m, ffi::TASKD_ADDR_CONTROL, buf.as_mut_ptr(), buf.len());
        assert_eq!((code, buf[0]), (TASKD_OK, 0), "no control API: empty");
        assert_eq!(ffi::taskd_manager_stop(m), TASKD_OK);
        let mut why = [0i8; 64];
        assert_eq!(
            ffi::taskd_manager_wait(m, 10_000, why.as_mut_ptr(), why.len()),
            TASKD_OK
        );
        assert_eq!(
            CStr::from_ptr(why.as_ptr()).to_str().unwrap(),
            "taskd_manager_stop"
        );
        ffi::taskd_manager_free(m);
    }
}

// ---------------------------------------------------------------------------------------------
// A whole job in this process

/// One call of a framework's switch function: ranks, flags, whether a training step ran.
type Call = (Vec<u32>, Vec<bool>, bool);

/// What one rank's framework was told: every call, and whether a training step ran then.
#[derive(Default)]
struct Framework {
    calls: Mutex<Vec<Call>>,
    in_step: AtomicBool,
    fail: AtomicBool,
}

struct Rank {
    framework: Arc<Framework>,
    worker: Arc<EmbeddedWorker>,
    steps: Arc<AtomicU64>,
    training: std::thread::JoinHandle<()>,
}

fn start_rank(job: &str, rank: u32, proxy: &str, stop: Arc<AtomicBool>) -> Rank {
    let framework = Arc::new(Framework::default());
    let fw = framework.clone();
    let switch = move |ranks: &[u32], flags: &[bool]| {
        let in_step = fw.in_step.load(Ordering::SeqCst);
        fw.calls
            .lock()
            .unwrap()
            .push((ranks.to_vec(), flags.to_vec(), in_step));
        if fw.fail.swap(false, Ordering::SeqCst) {
            Err("_comm_switch_nic returned False".to_owned())
        } else {
            Ok(())
        }
    };
    let cfg = format!(
        r#"{{"job_id": "{job}", "rank": {rank}, "proxy": "{proxy}", "tsp": true, "heartbeat_ms": 100}}"#
    );
    let worker = Arc::new(EmbeddedWorker::start(&cfg, Box::new(switch)).unwrap());
    let steps = Arc::new(AtomicU64::new(0));
    let (w, fw, n) = (worker.clone(), framework.clone(), steps.clone());
    let training = std::thread::spawn(move || {
        let mut step = 0;
        while !stop.load(Ordering::SeqCst) {
            fw.in_step.store(true, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(1)); // the step's compute
            fw.in_step.store(false, Ordering::SeqCst);
            step += 1;
            n.store(step, Ordering::SeqCst);
            w.step_completed(step);
        }
    });
    Rank {
        framework,
        worker,
        steps,
        training,
    }
}

fn command(job: &str, devices: &[u32], use_backup: bool) -> SwitchCommand {
    SwitchCommand {
        job: JobId(job.into()),
        id: None,
        targets: devices
            .iter()
            .map(|d| Target {
                node: NodeName("node-1".into()),
                device: DeviceId(*d),
                use_backup,
            })
            .collect(),
    }
}

#[test]
fn an_embedded_job_switches_through_the_frameworks_function() {
    // The workers' capabilities: HCCL's L2 retry (read from the environment, as on a node).
    std::env::set_var("HCCL_OP_RETRY_ENABLE", "L0:0, L1:1, L2:1");
    let job = "embedded";
    let manager = EmbeddedManager::start(
        &format!(r#"{{"job_id": "{job}", "node_nums": 2, "proc_per_node": 2, "listen": "127.0.0.1:0", "heartbeat_ms": 100}}"#),
        false,
    )
    .unwrap();
    let listen = manager.info().listen.to_string();
    let proxies: Vec<EmbeddedProxy> = (0..2)
        .map(|k| {
            let cfg = format!(r#"{{"job_id": "{job}", "UpstreamAddr": "127.0.0.1", "UpstreamPort": "{}", "ListenAddr": "127.0.0.1", "ListenPort": "0", "ServerRank": "{k}", "sim": true}}"#, manager.info().listen.port());
            EmbeddedProxy::start(&cfg).unwrap()
        })
        .collect();
    for (k, p) in proxies.iter().enumerate() {
        let a = p.wait_registered(Some(Duration::from_secs(30))).unwrap();
        assert_eq!(a.node, format!("node-{k}"));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let ranks: Vec<Rank> = (0..4)
        .map(|r| {
            start_rank(
                job,
                r,
                &proxies[r as usize / 2].local_addr().to_string(),
                stop.clone(),
            )
        })
        .collect();
    for r in &ranks {
        let reg = r
            .worker
            .wait_registered(Some(Duration::from_secs(30)))
            .unwrap();
        assert_eq!(reg.world_size, 4);
    }
    manager.wait_ready(Some(Duration::from_secs(30))).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut admin = rt.block_on(AdminClient::connect(&listen, None)).unwrap();

    // To the backup NIC and back: one call per operation on every rank, the whole list.
    for (use_backup, flags) in [(true, vec![true, true]), (false, vec![false, false])] {
        let before: Vec<u64> = ranks
            .iter()
            .map(|r| r.steps.load(Ordering::SeqCst))
            .collect();
        let report = rt
            .block_on(admin.run(&command(job, &[1, 0], use_backup)))
            .unwrap();
        assert_eq!(report.outcome, Outcome::Succeeded, "{report:?}");
        for (i, r) in ranks.iter().enumerate() {
            let calls = r.framework.calls.lock().unwrap();
            assert_eq!(
                calls.last().unwrap(),
                &(vec![3, 2], flags.clone(), false),
                "rank {i}"
            );
            assert!(r.steps.load(Ordering::SeqCst) >= before[i], "rank {i}");
        }
    }
    assert!(ranks
        .iter()
        .all(|r| r.framework.calls.lock().unwrap().len() == 2));

    // Rank 1's framework answers False: the operation fails naming rank 1 and rolls back,
    // which calls every framework again with the previous state.
    ranks[1].framework.fail.store(true, Ordering::SeqCst);
    let report = rt.block_on(admin.run(&command(job, &[0], true))).unwrap();
    assert_eq!(report.outcome, Outcome::Failed);
    assert!(report.rolled_back, "{report:?}");
    let (rank, _, err) = &report.rank_errors[0];
    assert_eq!(rank.0, 1);
    assert!(
        err.to_string().contains("_comm_switch_nic returned False"),
        "{err}"
    );
    for r in &ranks {
        let calls = r.framework.calls.lock().unwrap();
        assert_eq!(calls.len(), 4);
        assert_eq!(calls[2], (vec![2], vec![true], false));
        assert_eq!(calls[3], (vec![2], vec![false], false));
    }

    // Training went on after each operation.
    let after: Vec<u64> = ranks
        .iter()
        .map(|r| r.steps.load(Ordering::SeqCst))
        .collect();
    let wanted: Vec<u64> = after.iter().map(|s| s + 3).collect();
    for (r, want) in ranks.iter().zip(&wanted) {
        while r.steps.load(Ordering::SeqCst) < *want {
            std::thread::yield_now();
        }
    }
    stop.store(true, Ordering::SeqCst);
    // Every communication group agrees on its NIC configuration: each rank's framework was
    // last told the same thing (here: nothing on backup).
    let last: Vec<_> = ranks
        .iter()
        .map(|r| r.framework.calls.lock().unwrap().last().cloned().unwrap())
        .collect();
    assert!(last.windows(2).all(|w| w[0] == w[1]), "{last:?}");
    drop(admin);
    for r in ranks {
        r.training.join().unwrap();
        r.worker.stop("test over");
    }
    for p in &proxies {
        p.stop("test over");
    }
    manager.stop("test over");
    assert_eq!(
        manager.wait(Some(Duration::from_secs(30))).unwrap(),
        "test over"
    );
}
