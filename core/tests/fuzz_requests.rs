//! Bounded fuzzing of what an operator's request becomes (on stable, inside `cargo test`):
//! ClusterD's `nicOps` map (`SwitchCommand::from_nic_ops`) and its resolution against the rank
//! table must accept or refuse any input, never panic, and a refusal must name the value that
//! is wrong; what is accepted names only devices the job has, each once.

use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use taskd_core::command::ValidationError;
use taskd_core::{JobId, RankTable, SwitchCommand};

fn device_text() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => (0u32..10).prop_map(|d| d.to_string()),
        1 => (0u32..10).prop_map(|d| format!(" {d} ")),
        1 => any::<u32>().prop_map(|d| d.to_string()),
        1 => "-?[0-9]{1,12}",
        1 => any::<String>(),
    ]
}

fn node_name() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => (0u32..4).prop_map(|n| format!("node-{n}")),
        1 => any::<String>(),
    ]
}

fn nic_ops() -> impl Strategy<Value = BTreeMap<String, (Vec<String>, Vec<bool>)>> {
    prop::collection::btree_map(
        node_name(),
        (
            prop::collection::vec(device_text(), 0..6),
            prop::collection::vec(any::<bool>(), 0..6),
        ),
        0..4,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn any_nic_ops_map_is_accepted_or_refused_naming_the_culprit(ops in nic_ops()) {
        let table = RankTable::uniform(3, 8);
        match SwitchCommand::from_nic_ops(JobId("j".into()), None, &ops) {
            Err(e) => {
                let text = e.to_string();
                match &e {
                    // Named as written, quoted and escaped (a control character stays visible).
                    ValidationError::BadDevice { value, .. } => {
                        prop_assert!(text.contains(&format!("{value:?}")), "{}", text)
                    }
                    ValidationError::LengthMismatch { node, .. } => {
                        prop_assert!(text.contains(&node.0), "{}", text)
                    }
                    _ => {}
                }
            }
            Ok(cmd) => match cmd.resolve(&table) {
                Ok(plan) => {
                    let mut seen = BTreeSet::new();
                    for t in &plan.targets {
                        prop_assert_eq!(table.rank_of(&t.node, t.device), Some(t.rank));
                        prop_assert!(seen.insert(t.rank), "rank {} twice", t.rank);
                    }
                    prop_assert!(!plan.targets.is_empty());
                }
                Err(e) => {
                    // Every refusal is a sentence a person can act on.
                    prop_assert!(!e.to_string().is_empty());
                }
            },
        }
    }
}
