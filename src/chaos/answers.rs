//! What the control API answered for each uuid, read from outside the manager: the first
//! final result of a uuid is the only one it may ever give (asked again, on this manager or a
//! later one), and a uuid that was admitted never runs a second time.

use std::collections::{BTreeMap, BTreeSet};
use taskd_core::OperationSummary;

/// The parts of a final result that say what happened (the timings are the report's, not the
/// outcome's).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// `succeeded`, `failed` or `rejected`.
    pub result: String,
    /// Whether the targets' new NIC state is in effect.
    pub applied: bool,
    /// Whether a rollback restored the previous state.
    pub rolled_back: bool,
    /// The job's state after it.
    pub job_state: String,
    /// `to_backup`, `to_primary` or `mixed`.
    pub direction: String,
}

impl From<&OperationSummary> for Answer {
    fn from(s: &OperationSummary) -> Answer {
        Answer {
            result: s.result.clone(),
            applied: s.applied,
            rolled_back: s.rolled_back,
            job_state: s.job_state.clone(),
            direction: s.direction.clone(),
        }
    }
}

/// Every uuid's admission and first answer.
#[derive(Default)]
pub struct Answers {
    admitted: BTreeSet<String>,
    first: BTreeMap<String, Answer>,
    /// How many answers were checked against a first one.
    pub repeats_checked: u64,
}

impl Answers {
    /// The manager accepted `uuid`; `known`: it said the uuid had run before. A uuid admitted
    /// before and accepted as new runs twice.
    pub fn accepted(&mut self, uuid: &str, known: bool) -> Result<(), String> {
        let fresh = self.admitted.insert(uuid.to_owned());
        if !fresh && !known {
            return Err(format!(
                "uuid {uuid} was admitted before and was accepted again as new: it runs twice"
            ));
        }
        Ok(())
    }

    /// A final result for `uuid`: the first is kept, every later one must be the same.
    pub fn answered(&mut self, uuid: &str, s: &OperationSummary) -> Result<(), String> {
        let now = Answer::from(s);
        match self.first.get(uuid) {
            None => {
                self.first.insert(uuid.to_owned(), now);
                Ok(())
            }
            Some(first) => {
                self.repeats_checked += 1;
                if *first == now {
                    Ok(())
                } else {
                    Err(format!(
                        "uuid {uuid} answered {first:?} first and {now:?} later"
                    ))
                }
            }
        }
    }

    /// The first answer of `uuid`, if it has one.
    pub fn first(&self, uuid: &str) -> Option<&Answer> {
        self.first.get(uuid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(result: &str, applied: bool) -> OperationSummary {
        OperationSummary {
            uuid: "u".into(),
            direction: "to_backup".into(),
            targets: Vec::new(),
            result: result.into(),
            error: None,
            rolled_back: false,
            pause_step: None,
            phases_ms: Default::default(),
            stall_ms: None,
            job_state: "running".into(),
            applied,
            rank_errors: Vec::new(),
            lost_ranks: Vec::new(),
            trigger: Default::default(),
            journal_error: None,
            hold: None,
        }
    }

    #[test]
    fn the_same_answer_twice_is_fine() {
        let mut a = Answers::default();
        a.accepted("u", false).unwrap();
        a.answered("u", &summary("succeeded", true)).unwrap();
        a.accepted("u", true).unwrap();
        a.answered("u", &summary("succeeded", true)).unwrap();
        assert_eq!(a.repeats_checked, 1);
        assert_eq!(a.first("u").map(|x| x.result.as_str()), Some("succeeded"));
    }

    #[test]
    fn a_forged_second_answer_is_caught() {
        let mut a = Answers::default();
        a.answered("u", &summary("succeeded", true)).unwrap();
        let e = a.answered("u", &summary("failed", false)).unwrap_err();
        assert!(e.contains("answered"), "{e}");
    }

    #[test]
    fn a_uuid_run_again_as_new_is_caught() {
        let mut a = Answers::default();
        a.accepted("u", false).unwrap();
        let e = a.accepted("u", false).unwrap_err();
        assert!(e.contains("runs twice"), "{e}");
    }
}
