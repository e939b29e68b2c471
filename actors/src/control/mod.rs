//! The control API operators and AI platforms drive: ClusterD's `Recover` service
//! (wire-compatible) and taskd's own richer service beside it.

/// Generated from `proto/recover.proto` (no package, as ClusterD's).
pub mod recover {
    #![allow(clippy::all, missing_docs)]
    include!(concat!(env!("OUT_DIR"), "/_.rs"));
}
