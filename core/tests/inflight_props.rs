//! Property tests of the agreement on where an aborted group's collectives are redone from
//! (`taskd_core::inflight`).
//!
//! A random group of ranks runs a random sequence of collectives; the link dies at a random
//! moment: each rank has issued some prefix of the sequence (never more than one collective
//! past a peer's last issue plus what it may run ahead) and completed a random subset of what
//! every member issued (out of order, as Gloo's threads complete them). The ranks report their
//! positions, [`agree`] picks the redo point, every rank re-issues from it on the rebuilt group
//! and goes on to the end. Checked: every collective's result is taken exactly once by every
//! rank (none lost, none applied twice), every rank's sequence on the new group is the same,
//! and nothing that completed everywhere is redone.

use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use taskd_core::inflight::{agree, to_reissue, CollectivePosition, RedoError};
use taskd_core::GlobalRank;

#[derive(Debug, Clone)]
struct World {
    /// Collectives in the whole run.
    total: u64,
    /// Per rank: issued count.
    issued: Vec<u64>,
    /// Per rank: which collectives completed on it (each one issued by every member).
    done: Vec<BTreeSet<u64>>,
}

fn world() -> impl Strategy<Value = World> {
    (1usize..=8, 1u64..=12).prop_flat_map(|(n, total)| {
        (
            Just(total),
            proptest::collection::vec(0..=total, n),
            proptest::collection::vec(proptest::collection::vec(any::<bool>(), total as usize), n),
        )
            .prop_map(|(total, issued, coins)| {
                // A collective can complete only once every member issued it.
                let everyone = *issued.iter().min().unwrap();
                let done = coins
                    .iter()
                    .map(|c| (0..everyone).filter(|j| c[*j as usize]).collect())
                    .collect();
                World {
                    total,
                    issued,
                    done,
                }
            })
    })
}

fn prefix(done: &BTreeSet<u64>) -> u64 {
    (0..).find(|j| !done.contains(j)).unwrap()
}

fn positions(w: &World) -> BTreeMap<GlobalRank, Vec<CollectivePosition>> {
    let size = w.issued.len() as u32;
    w.issued
        .iter()
        .zip(&w.done)
        .enumerate()
        .map(|(r, (&issued, done))| {
            let p = CollectivePosition {
                group: "0".into(),
                size,
                completed: prefix(done),
                issued,
            };
            (GlobalRank(r as u32), vec![p])
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn redo_loses_nothing_and_applies_nothing_twice(w in world()) {
        let reports = positions(&w);
        let points = agree(&reports).expect("a consistent group always agrees");
        prop_assert_eq!(points.len(), 1);
        let point = &points[0];
        // Nothing completed everywhere is redone: everything before the point completed on
        // every rank, and the point itself did not on some rank.
        for done in &w.done {
            prop_assert!((0..point.from).all(|j| done.contains(&j)));
        }
        let everyone: BTreeSet<u64> = (0..w.total)
            .filter(|j| w.done.iter().all(|d| d.contains(j)))
            .collect();
        prop_assert!(!everyone.contains(&point.from) || point.from == w.total);

        // Every rank: what it takes as results (its completions before the abort, then the
        // redo's and the new ones), and its sequence on the rebuilt group.
        let mut sequences = Vec::new();
        for (r, done) in w.done.iter().enumerate() {
            let mine = &reports[&GlobalRank(r as u32)][0];
            let mut taken: BTreeMap<u64, u32> = done.iter().map(|j| (*j, 1)).collect();
            let mut seq: Vec<u64> = to_reissue(point, mine).collect();
            seq.extend(mine.issued..w.total);
            for j in &seq {
                // A redone collective this rank had completed: its result is dropped.
                if !done.contains(j) {
                    *taken.entry(*j).or_default() += 1;
                }
            }
            prop_assert!((0..w.total).all(|j| taken.get(&j) == Some(&1)),
                "rank {} took {:?}", r, taken);
            sequences.push(seq);
        }
        prop_assert!(sequences.windows(2).all(|s| s[0] == s[1]));
        prop_assert_eq!(sequences[0].first().copied().unwrap_or(w.total), point.from.min(w.total));
    }

    #[test]
    fn a_member_missing_from_the_reports_fails_the_agreement(w in world(), gone in any::<prop::sample::Index>()) {
        let mut reports = positions(&w);
        let n = reports.len();
        prop_assume!(n > 1);
        reports.remove(&GlobalRank(gone.index(n) as u32));
        let incomplete = matches!(agree(&reports), Err(RedoError::Incomplete { .. }));
        prop_assert!(incomplete);
    }
}
