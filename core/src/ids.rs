//! Identifiers. Each is a newtype so a device index can never be passed where a rank is meant.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A training job, as named by the platform (`MINDX_TASK_ID`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct JobId(pub String);

/// A node (server) of the job, by the name the operator uses (the key of ClusterD's `nicOps`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NodeName(pub String);

/// An NPU die on a node, numbered from 0 as the driver numbers them.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct DeviceId(pub u32);

/// A process's rank in the whole job (the world group).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct GlobalRank(pub u32);

/// A rank's index inside one communication group; what `HcclCommWorkingDevNicSet` takes.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct GroupRank(pub u32);

/// The id of one switch operation: a client-chosen or generated UUID. A repeated id returns
/// the known result instead of running twice.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct OperationId(pub uuid::Uuid);

macro_rules! display_inner {
    ($($t:ty),*) => {$(
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }
    )*};
}
display_inner!(
    JobId,
    NodeName,
    DeviceId,
    GlobalRank,
    GroupRank,
    OperationId
);

impl From<&str> for JobId {
    fn from(s: &str) -> Self {
        JobId(s.to_owned())
    }
}

impl From<&str> for NodeName {
    fn from(s: &str) -> Self {
        NodeName(s.to_owned())
    }
}

impl std::str::FromStr for OperationId {
    type Err = uuid::Error;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        uuid::Uuid::parse_str(s).map(OperationId)
    }
}
