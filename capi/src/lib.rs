//! # taskd-capi
//!
//! taskd inside a host process: the manager, a node's proxy and a training process's worker
//! started from a JSON configuration, for C and C++ launchers (the C ABI of [`ffi`], declared
//! in `capi/include/taskd.h`) and for the `taskd` Python package (`python/`), which is a thin
//! `ctypes` layer over the same functions.
//!
//! - [`EmbeddedManager`], [`EmbeddedProxy`], [`EmbeddedWorker`]: each role on threads of its
//!   own, configured like the matching `taskd` subcommand ([`config`]).
//! - [`FrameworkHal`]: the rank HAL of a training framework that switches every communicator of
//!   the process itself, in one call with the whole target list (MindSpore's and torch_npu's
//!   `_comm_switch_nic`), reached through a [`FrameworkSwitch`].
//!
//! The library is built as `libtaskd.so` (`cargo build -p taskd-capi`: the file is
//! `libtaskd_capi.so`, its SONAME `libtaskd.so`).

#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod config;
pub mod error;
#[allow(unsafe_code)]
pub mod ffi;
pub mod framework;
pub mod in_flight;
pub mod manager;
pub mod proxy;
pub mod role;
pub mod state;
pub mod worker;

pub use error::CapiError;
pub use framework::{FrameworkHal, FrameworkSwitch, FRAMEWORK_GROUP};
pub use manager::EmbeddedManager;
pub use proxy::EmbeddedProxy;
pub use worker::EmbeddedWorker;

/// Logs of the embedded roles go to stderr, filtered by `RUST_LOG` (default: warnings), unless
/// the host process installed a `tracing` subscriber of its own first.
pub fn init_logging() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        use tracing_subscriber::EnvFilter;
        let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
        // Colour only on a terminal: the host's stderr is often a log file (msrun's worker
        // logs, the manager's log).
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init();
    });
}

/// A role's refused configuration as the C API's error for `role`.
fn config_error(role: &'static str, e: taskd_roles::ConfigError) -> CapiError {
    CapiError::Config {
        role,
        message: e.to_string(),
    }
}
