//! The C API: the header says what `capi/src/ffi.rs` exports (every function, type and
//! constant), and bad arguments come back as codes with a message.

use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use taskd_capi::error::{TASKD_ERR_ARGUMENT, TASKD_ERR_CONFIG, TASKD_OK};
use taskd_capi::ffi;

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
        "Option<TaskdLastWordsFn>" | "TaskdLastWordsFn" => "taskd_last_words_fn",
        "Option<TaskdInFlightFn>" | "TaskdInFlightFn" => "taskd_in_flight_fn",
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
    // The types of the functions the library calls: the switch and the in-flight side.
    for (rust_name, c_name) in [
        ("TaskdSwitchFn", "taskd_switch_fn"),
        ("TaskdInFlightFn", "taskd_in_flight_fn"),
    ] {
        let fn_type = src
            .split(&format!("pub type {rust_name} = unsafe extern \"C\" fn("))
            .nth(1)
            .unwrap_or_else(|| panic!("no {rust_name}"));
        let (params, rest) = fn_type.split_once(')').unwrap();
        assert!(rest.trim_start().starts_with("-> bool;"), "{rust_name}");
        let typedef = header
            .split(&format!("typedef bool (*{c_name})("))
            .nth(1)
            .unwrap_or_else(|| panic!("no {c_name}"));
        let c_params: Vec<String> = typedef
            .split_once(')')
            .unwrap()
            .0
            .split(',')
            .map(c_param)
            .collect();
        assert_eq!(rust_params(params), c_params, "{rust_name}");
    }
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
    assert_eq!(r.len(), 12, "{r:?}");
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
    // SAFETY: null, or live NUL-terminated strings and writable locals, as taskd.h allows.
    let version = unsafe { CStr::from_ptr(ffi::taskd_version()) };
    assert_eq!(version.to_str().unwrap(), env!("CARGO_PKG_VERSION"));
    let mut out = std::ptr::null_mut();
    // SAFETY: null, or live NUL-terminated strings and writable locals, as taskd.h allows.
    let code = unsafe { ffi::taskd_manager_start(std::ptr::null(), 0, &mut out) };
    assert_eq!(code, TASKD_ERR_ARGUMENT);
    assert_eq!(last_error(), "config_json is a null pointer");
    let json = CString::new("[]").unwrap();
    // SAFETY: null, or live NUL-terminated strings and writable locals, as taskd.h allows.
    let code = unsafe { ffi::taskd_proxy_start(json.as_ptr(), &mut std::ptr::null_mut()) };
    assert_eq!(code, TASKD_ERR_ARGUMENT);
    assert_eq!(
        last_error(),
        "the proxy configuration must be a JSON object, not []"
    );
    let role = CString::new("worker").unwrap();
    let json = CString::new(r#"{"job_id": "j", "rank": 1, "proxy": "host"}"#).unwrap();
    // SAFETY: null, or live NUL-terminated strings and writable locals, as taskd.h allows.
    let code = unsafe { ffi::taskd_check_config(role.as_ptr(), json.as_ptr()) };
    assert_eq!(code, TASKD_ERR_CONFIG);
    assert!(
        last_error().contains("'host' for 'proxy"),
        "{}",
        last_error()
    );
    let json = CString::new(r#"{"job_id": "j", "rank": 1}"#).unwrap();
    assert_eq!(
        // SAFETY: null, or live NUL-terminated strings and writable locals, as taskd.h allows.
        unsafe { ffi::taskd_check_config(role.as_ptr(), json.as_ptr()) },
        TASKD_OK
    );
    // SAFETY: null, or live NUL-terminated strings and writable locals, as taskd.h allows.
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
    // A null worker's step is a bad argument; freeing null is a no-op.
    assert_eq!(
        // SAFETY: null, as taskd.h allows.
        unsafe { ffi::taskd_worker_step_completed(std::ptr::null(), 1) },
        TASKD_ERR_ARGUMENT
    );
    assert!(last_error().contains("null"), "{}", last_error());
    // SAFETY: null, or live NUL-terminated strings and writable locals, as taskd.h allows.
    unsafe {
        ffi::taskd_worker_free(std::ptr::null_mut());
        ffi::taskd_manager_free(std::ptr::null_mut());
        ffi::taskd_proxy_free(std::ptr::null_mut());
    }
    assert_eq!(
        // SAFETY: null, or live NUL-terminated strings and writable locals, as taskd.h allows.
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
