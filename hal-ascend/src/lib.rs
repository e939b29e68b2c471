//! # taskd-hal-ascend
//!
//! The device layer of taskd for real Ascend NPUs: [`AscendRankHal`] implements
//! [`taskd_core::RankHal`] over HCCL communicators, [`AscendNodeHal`] implements
//! [`taskd_core::NodeHal`] over DCMI. The vendor libraries are loaded at run time, so building
//! this crate needs no CANN, driver or NPU.
//!
//! ## Where it sits
//!
//! `taskd-core` defines what a device layer offers ([`taskd_core::RankHal`], owned by each
//! training process's worker; [`taskd_core::NodeHal`], owned by each node's proxy) and the
//! error it fails with; `docs/hal.md` is that contract in prose, with HCCL's rules for
//! `HcclCommWorkingDevNicSet`. This crate is the implementation over the real libraries;
//! `taskd-hal-mock` is the simulated one that `taskd sim` and most tests run. The actors in
//! `taskd-actors` see only the traits and never name this crate: the `taskd` binary builds an
//! [`AscendNodeHal`] for `taskd proxy`, its doctor (`src/doctor.rs`) and hardware rig
//! (`src/rig.rs`) use the lower layers directly, and a training process's launcher builds the
//! [`AscendRankHal`] from its framework's communicators (example at the end).
//!
//! ## Where to start reading
//!
//! [`rank`] (a NIC switch as HCCL calls, and the capability check that refuses a switch HCCL
//! would silently ignore) and [`node`] (link health through DCMI, every probe bounded in time).
//! Then the layers below them, bottom-up when checking soundness: [`sys`], [`result`],
//! [`safe`] (next section). [`search`] decides which file is loaded.
//!
//! **Verification status: this crate has been run only against stub libraries** that the
//! tests compile from `tests/stub/*.c` (same symbols, recording every call). It has not run
//! against real `libhccl.so`, `libascendcl.so` or `libdcmi.so`, nor on an Atlas A3 node. The
//! prototypes, enum values, error codes and sizes were checked against public copies of the
//! vendor headers (`hccl.h`, `hccl_types.h`, `acl_base.h`, `acl_rt.h`,
//! `dcmi_interface_api.h`) and the Atlas A3 DCMI reference; how ids, results and timing behave
//! on a node is what a first run on hardware must confirm.
//!
//! ## Device numbering
//!
//! A `DeviceId` in this crate's control-plane API ([`AscendNodeHal`]'s `link_health`) is a
//! die's **physical** id, the rank table's (see `taskd_core::DeviceId`). Logical ids (what
//! `aclrtSetDevice` takes; renumbered from 0 in a container) appear only where a call takes
//! them, and the names say so (`set_device`, `locate_logical`, `physical_of_logical`).
//!
//! ## Layers
//!
//! Like cudarc, three layers per library:
//!
//! - [`sys`]: the raw function tables ([`sys::hccl::HcclLib`], [`sys::acl::AclLib`],
//!   [`sys::dcmi::DcmiLib`]), loaded with `libloading`. The only module with `unsafe` code;
//!   every block says why it is sound. Handles ([`sys::hccl::CommHandle`],
//!   [`sys::acl::StreamHandle`], [`sys::acl::DevicePtr`]) can only come from a successful C
//!   call or an `unsafe` constructor, and are consumed by the call that releases them.
//! - [`result`]: one function per C call returning `Result`: [`taskd_core::HalError`] for
//!   HCCL (`op` = the C function name, the vendor code the `HcclResult`), [`result::AclError`]
//!   and [`result::DcmiError`] keeping their numeric codes (and converting into a `HalError`
//!   in their own library's numbering).
//! - [`safe`]: RAII types: [`Comm`] (`HcclCommDestroy` on drop when owned), [`RootInfo`]
//!   (the 4108-byte blob), [`Stream`] (`aclrtDestroyStream` on drop), [`DeviceBuffer`]
//!   (`aclrtFree` on drop).
//!
//! On top: [`AscendRankHal`] and [`AscendNodeHal`].
//!
//! ## Stubs (feature `testing`)
//!
//! `testing` (off by default) compiles the stub libraries of `tests/stub/*.c` with `cc` and
//! reads their call logs; see its module docs. Tests of this crate and of the `taskd` crate,
//! and the hardware-in-the-loop rig (`taskd`'s `examples/hil_rig.rs --stubs`), use it to run
//! the production code path on a machine without NPUs. The HCCL stub runs real multi-rank
//! collectives between threads and enforces HCCL's NIC-set rules (see the module docs).
//!
//! ## Where the libraries are looked for
//!
//! For each library, in order (details in [`search`]):
//!
//! | | HCCL | ACL | DCMI |
//! |---|---|---|---|
//! | 1. explicit path, if set (then the only candidate) | `$TASKD_HCCL_LIBRARY` | `$TASKD_ACL_LIBRARY` | `$TASKD_DCMI_LIBRARY` |
//! | 2. | `$ASCEND_HOME_PATH/lib64/libhccl.so` | `…/libascendcl.so` | `…/libdcmi.so` |
//! | 3. | `$ASCEND_TOOLKIT_HOME/lib64/libhccl.so` | `…/libascendcl.so` | `…/libdcmi.so` |
//! | 4. loader default path | `libhccl.so` | `libascendcl.so` | `libdcmi.so` |
//! | 5. vendor locations | | | `/usr/local/dcmi/libdcmi.so`, `/usr/local/Ascend/driver/lib64/driver/libdcmi.so` (where the driver installs it) |
//!
//! Rows 2 and 3 are where CANN installs HCCL and ACL; DCMI comes with the NPU driver, not CANN,
//! and is tried there only for installs that copy it next to the toolkit.
//!
//! Functions a library may lack are bound as optional (`HcclCommResume`, documented as
//! reserved; `aclFinalizeReference`, absent from older runtimes): the `open` functions do not
//! require them.
//!
//! A library that cannot be loaded is a [`LoadError::NotFound`] listing every candidate with
//! the loader's message; a missing function is a [`LoadError::MissingSymbol`] naming the
//! symbol and the file. The search takes an environment lookup function
//! ([`search::process_env`] in production) so it is testable without touching the process
//! environment.
//!
//! ## On a real A3 node
//!
//! - `source /usr/local/Ascend/cann/set_env.sh` (CANN 8.5 and later; earlier releases:
//!   `/usr/local/Ascend/ascend-toolkit/set_env.sh`): sets `ASCEND_HOME_PATH`, so HCCL and ACL
//!   are found. DCMI is found at the driver's own location (row 5 above).
//! - `TASKD_DCMI_TIMEOUT_MS`: how long one DCMI probe may take (default 1000); see
//!   [`node::probe_timeout_from_env`].
//! - `HCCL_OP_RETRY_ENABLE="L0:0, L1:1, L2:1"`: without `L2:1`, `HcclCommWorkingDevNicSet`
//!   answers success and switches nothing; [`AscendRankHal`] reports L2 retry missing then.
//! - `TASKD_HCCL_RDMA=0` only if the job has no RoCE links (HCCL cannot be asked; the HAL
//!   assumes RDMA otherwise, see [`rank::TASKD_HCCL_RDMA`]).
//! - A detect IP per NIC (`hccn_tool -i <id> -netdetect -s address <gateway>`), which is what
//!   DCMI's network health probes; without one no link reads as up.
//! - Optionally `TASKD_HCCL_LIBRARY=/path/to/libhccl.so` to pin the file. It **must** be the
//!   same file the framework (torch_npu, MindSpore) loaded: the loader then shares one HCCL
//!   instance, and the framework's communicator handles are valid here. A different copy
//!   would be a second HCCL that knows none of them.
//!
//! The launcher builds the rank HAL from the framework's communicators:
//!
//! ```no_run
//! use std::sync::Arc;
//! use taskd_core::{GlobalRank, GroupInfo};
//! use taskd_hal_ascend::{search, sys, AscendRankHal, Comm};
//!
//! # fn raw_comm_from_framework() -> *mut std::ffi::c_void { std::ptr::null_mut() }
//! let hccl = Arc::new(sys::hccl::HcclLib::open(&search::process_env)?);
//! // SAFETY: the framework created this communicator through the same libhccl.so and keeps
//! // it alive for the whole job.
//! let handle = unsafe { sys::hccl::CommHandle::from_raw(raw_comm_from_framework()) }
//!     .expect("non-null");
//! let world = GroupInfo { name: String::new(), members: (0..16).map(GlobalRank).collect() };
//! let hal = AscendRankHal::new(vec![(Comm::borrow(&hccl, handle), world)], &search::process_env);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod codes;
pub mod node;
pub mod rank;
pub mod result;
pub mod safe;
pub mod search;
pub mod sys;
#[cfg(feature = "testing")]
pub mod testing;

pub use node::AscendNodeHal;
pub use rank::AscendRankHal;
pub use safe::{Comm, DeviceBuffer, RootInfo, Stream};
pub use search::LoadError;
