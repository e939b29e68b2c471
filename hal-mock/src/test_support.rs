//! Helpers for the unit tests: build a fabric, run every rank's part of a conversation on
//! its own thread, collect what each rank got back.

use crate::{Fabric, FabricConfig, MockRankHal};
use std::sync::Arc;
use std::time::Duration;
use taskd_core::{plan_calls, GlobalRank, HalError, HcclCode, NicSide, RankHal};

/// A fabric with a 5 s HCCL timeout: a safety net so a broken test fails instead of hanging.
pub(crate) fn fabric(nodes: u32, devices: u32, tp: u32) -> Arc<Fabric> {
    Fabric::new(FabricConfig {
        tp_size: tp,
        hccl_timeout: Duration::from_secs(5),
        ..FabricConfig::new(nodes, devices)
    })
}

/// A fabric whose rendezvous give up after `ms` milliseconds.
pub(crate) fn fabric_with_timeout(nodes: u32, devices: u32, tp: u32, ms: u64) -> Arc<Fabric> {
    Fabric::new(FabricConfig {
        tp_size: tp,
        hccl_timeout: Duration::from_millis(ms),
        ..FabricConfig::new(nodes, devices)
    })
}

pub(crate) fn r(rank: u32) -> GlobalRank {
    GlobalRank(rank)
}

pub(crate) fn code<T: std::fmt::Debug>(res: &Result<T, HalError>) -> HcclCode {
    match res {
        Ok(_) => HcclCode::Success,
        Err(e) => e
            .hccl()
            .expect("the simulated HCCL answers with HCCL codes"),
    }
}

/// Runs `body` for each of `ranks` on its own thread; results in the order of `ranks`.
pub(crate) fn on_ranks<T: Send>(
    f: &Arc<Fabric>,
    ranks: &[u32],
    body: impl Fn(MockRankHal) -> T + Sync,
) -> Vec<T> {
    std::thread::scope(|s| {
        let handles: Vec<_> = ranks
            .iter()
            .map(|rank| {
                let hal = f.rank_hal(GlobalRank(*rank));
                let body = &body;
                s.spawn(move || body(hal))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank thread panicked"))
            .collect()
    })
}

pub(crate) fn all_ranks(f: &Arc<Fabric>) -> Vec<u32> {
    (0..f.world_size()).collect()
}

/// One training step by hand: every rank all-reduces on each of its groups, in the fixed
/// order. Returns `(rank, group, result)` for every call.
pub(crate) fn step_all(f: &Arc<Fabric>) -> Vec<(u32, String, Result<f64, HalError>)> {
    on_ranks(f, &all_ranks(f), |hal| {
        let rank = hal.rank();
        f.groups_of(rank)
            .into_iter()
            .map(|g| {
                let res = hal.all_reduce(&g.name, 1.0);
                (rank.0, g.name, res)
            })
            .collect::<Vec<_>>()
    })
    .into_iter()
    .flatten()
    .collect()
}

/// Runs one collective on every group, so NIC sets are allowed afterwards.
pub(crate) fn warm_up(f: &Arc<Fabric>) {
    for (rank, group, res) in step_all(f) {
        assert!(
            res.is_ok(),
            "warm-up all-reduce of rank {rank} on {group}: {res:?}"
        );
    }
}

/// What the worker of every rank does for a switch: plan with the core planner and call the
/// HAL once per planned group, in order. Returns `(group, result)` per call, per rank.
pub(crate) fn switch_all(
    f: &Arc<Fabric>,
    targets: &[(u32, bool)],
) -> Vec<Vec<(String, Result<(), HalError>)>> {
    let targets: Vec<(GlobalRank, NicSide)> = targets
        .iter()
        .map(|(r, b)| (GlobalRank(*r), NicSide::from_use_backup(*b)))
        .collect();
    on_ranks(f, &all_ranks(f), |mut hal| {
        let groups = hal.groups().expect("groups of a live rank");
        plan_calls(&groups, &targets)
            .into_iter()
            .map(|c| {
                let res = hal.set_working_nic(&c.group, &c.ranks, &c.use_backup());
                (c.group, res)
            })
            .collect()
    })
}

/// Asserts every call of a [`switch_all`] succeeded.
pub(crate) fn assert_all_ok(calls: &[Vec<(String, Result<(), HalError>)>]) {
    for (rank, calls) in calls.iter().enumerate() {
        for (group, res) in calls {
            assert!(res.is_ok(), "rank {rank}, group {group}: {res:?}");
        }
    }
}
