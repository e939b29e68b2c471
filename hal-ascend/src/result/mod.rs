//! The result layer: one thin function per C call, turning the status code into a `Result`.
//!
//! HCCL calls fail with [`taskd_core::HalError`], whose `op` is the C function's name and whose
//! vendor code is the returned `HcclResult` (an unknown future code is kept by number, as
//! `HcclCode::Other`). ACL and DCMI calls fail with [`AclError`] / [`DcmiError`], which keep
//! their own numeric codes; both convert into a `HalError` whose vendor code stays in its own
//! library's numbering (this crate's [`crate::codes`] tables name it and give its kind), so a
//! DCMI code is never mistaken for an HCCL one.
//!
//! Preconditions that would make the raw layer panic (mismatched lengths, a count beyond a
//! buffer) are checked here first and reported with the library's "invalid parameter" code
//! (`HCCL_E_PARA`, `ACL_ERROR_INVALID_PARAM`) and a detail saying the call was not made.

pub mod acl;
pub mod dcmi;
pub mod hccl;

pub use acl::AclError;
pub use dcmi::{DcmiError, NetworkHealth};
