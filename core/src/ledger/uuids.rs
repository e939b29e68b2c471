//! What the ledger remembers of operation uuids: this manager's finished operations (its
//! history), earlier managers' results and the operations they admitted and never finished
//! (both seeded from a journal), and the records not yet handed out to the journal (admitted
//! and finished operations). [`UuidMemory`] owns those five lists and their bound
//! ([`HISTORY_LEN`] each); [`UuidMemory::seen`] is the one place a uuid is looked up in them.

use crate::command::RankTarget;
use crate::ids::{GlobalRank, OperationId};
use crate::operation::OperationReport;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, VecDeque};

/// How many finished operations the ledger remembers (for repeated ids and status).
pub const HISTORY_LEN: usize = 256;

/// What identifies a request under its uuid: a digest of every target's rank and side, in no
/// order (FNV-1a, 128 bits, over the sorted set: 4 bytes of rank, little-endian, and a byte of
/// side each). A command under a known uuid is the same request (a retry: the known answer)
/// when its fingerprint is the known one, and a reused uuid ([`super::SubmitError::IdReused`])
/// otherwise.
///
/// It is 16 bytes whatever the request's size, so a journal record of a whole-job switch of
/// 65,536 ranks is as small as one of a single device. Serialized as 32 hex digits; the list of
/// `[rank, side]` pairs that journals of earlier builds hold is read too, and digested.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RequestFingerprint(u128);

impl RequestFingerprint {
    /// The fingerprint of resolved targets (order and repetitions do not count).
    pub fn of(targets: &[RankTarget]) -> Self {
        Self::of_pairs(targets.iter().map(|t| (t.rank, t.use_backup)))
    }

    fn of_pairs(pairs: impl IntoIterator<Item = (GlobalRank, bool)>) -> Self {
        const OFFSET: u128 = 0x6c62272e07bb014262b821756295c58d;
        const PRIME: u128 = 0x0000000001000000000000000000013B;
        let set: BTreeSet<(GlobalRank, bool)> = pairs.into_iter().collect();
        let mut h = OFFSET;
        for (rank, side) in set {
            for b in rank.0.to_le_bytes().into_iter().chain([u8::from(side)]) {
                h ^= u128::from(b);
                h = h.wrapping_mul(PRIME);
            }
        }
        RequestFingerprint(h)
    }
}

impl Serialize for RequestFingerprint {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{:032x}", self.0))
    }
}

impl<'de> Deserialize<'de> for RequestFingerprint {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = RequestFingerprint;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("32 hex digits, or a list of [rank, backup] pairs")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                if v.len() != 32 {
                    return Err(E::invalid_length(v.len(), &self));
                }
                u128::from_str_radix(v, 16)
                    .map(RequestFingerprint)
                    .map_err(|_| E::invalid_value(serde::de::Unexpected::Str(v), &self))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Self::Value, A::Error> {
                let mut pairs = Vec::new();
                while let Some(p) = seq.next_element::<(GlobalRank, bool)>()? {
                    pairs.push(p);
                }
                Ok(RequestFingerprint::of_pairs(pairs))
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// A finished operation as a journal keeps it: what identified its request and its final
/// report. What [`super::JobLedger::take_finished`] hands out and [`super::JobLedger::seed`]
/// takes back.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FinishedOperation {
    /// The request the uuid was used for.
    pub fingerprint: RequestFingerprint,
    /// The operation's final report (its `id` is the uuid).
    pub report: OperationReport,
}

impl FinishedOperation {
    /// The record of a final report.
    pub fn of(report: &OperationReport) -> Self {
        FinishedOperation {
            fingerprint: RequestFingerprint::of(&report.targets),
            report: report.clone(),
        }
    }
}

/// An operation a manager admitted, as a journal keeps it until its final result: when the
/// manager stops before that, a later manager refuses its uuid
/// ([`super::SubmitError::Interrupted`]) instead of running it a second time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AdmittedOperation {
    /// The operation's uuid.
    pub id: OperationId,
    /// The request it was admitted for.
    pub fingerprint: RequestFingerprint,
}

/// What the memory knows of a uuid ([`UuidMemory::seen`]).
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Seen<'a> {
    /// It finished, here or under an earlier manager: its request and result.
    Finished {
        fingerprint: RequestFingerprint,
        report: &'a OperationReport,
    },
    /// An earlier manager admitted it and never finished it: its request.
    Interrupted { fingerprint: &'a RequestFingerprint },
}

/// The uuids the ledger knows, each list bounded to [`HISTORY_LEN`] (the oldest forgotten).
#[derive(Debug, Default)]
pub(crate) struct UuidMemory {
    /// This manager's finished operations, oldest first.
    history: VecDeque<OperationReport>,
    /// Results of earlier managers of the job: they answer repeated and reused uuids, but are
    /// not this manager's history.
    earlier: VecDeque<FinishedOperation>,
    /// Final results not yet handed out ([`UuidMemory::take_finished`]).
    finished: VecDeque<FinishedOperation>,
    /// Operations admitted and not yet handed out ([`UuidMemory::take_admitted`]).
    admitted: VecDeque<AdmittedOperation>,
    /// Operations earlier managers admitted and never finished.
    interrupted: VecDeque<AdmittedOperation>,
}

impl UuidMemory {
    /// Remembers earlier managers' results, oldest first.
    pub(crate) fn seed(&mut self, earlier: impl IntoIterator<Item = FinishedOperation>) {
        for op in earlier {
            push_bounded(&mut self.earlier, op);
        }
    }

    /// Remembers operations earlier managers admitted and never finished.
    pub(crate) fn seed_interrupted(&mut self, ops: impl IntoIterator<Item = AdmittedOperation>) {
        for op in ops {
            push_bounded(&mut self.interrupted, op);
        }
    }

    /// Records an operation just admitted (to hand out with [`UuidMemory::take_admitted`]).
    pub(crate) fn record_admitted(&mut self, op: AdmittedOperation) {
        push_bounded(&mut self.admitted, op);
    }

    /// Records a final result: in the history, and to hand out with
    /// [`UuidMemory::take_finished`].
    pub(crate) fn record_finished(&mut self, report: &OperationReport) {
        push_bounded(&mut self.finished, FinishedOperation::of(report));
        push_bounded(&mut self.history, report.clone());
    }

    /// Hands out the admitted operations recorded since the last call, oldest first.
    pub(crate) fn take_admitted(&mut self) -> Vec<AdmittedOperation> {
        self.admitted.drain(..).collect()
    }

    /// Hands out the final results recorded since the last call, oldest first.
    pub(crate) fn take_finished(&mut self) -> Vec<FinishedOperation> {
        self.finished.drain(..).collect()
    }

    /// Marks the finished operation `id` in the history as one whose result could not be
    /// journaled (`why`).
    pub(crate) fn note_not_journaled(&mut self, id: OperationId, why: &str) {
        if let Some(r) = self.history.iter_mut().rev().find(|r| r.id == id) {
            r.journal_error = Some(why.to_owned());
        }
    }

    /// This manager's finished operations, oldest first.
    pub(crate) fn history(&self) -> impl DoubleEndedIterator<Item = &OperationReport> {
        self.history.iter()
    }

    /// This manager's last finished operation.
    pub(crate) fn last_finished(&self) -> Option<&OperationReport> {
        self.history.back()
    }

    /// The final report of `id`: this manager's, else an earlier manager's.
    pub(crate) fn result_of(&self, id: OperationId) -> Option<&OperationReport> {
        match self.finished_seen(id)? {
            Seen::Finished { report, .. } => Some(report),
            Seen::Interrupted { .. } => None,
        }
    }

    /// What is known of `id`: a result (this manager's history first, then earlier managers'),
    /// else an interrupted admission; `None` for a uuid never seen.
    pub(crate) fn seen(&self, id: OperationId) -> Option<Seen<'_>> {
        self.finished_seen(id).or_else(|| {
            let i = self.interrupted.iter().rev().find(|i| i.id == id)?;
            Some(Seen::Interrupted {
                fingerprint: &i.fingerprint,
            })
        })
    }

    fn finished_seen(&self, id: OperationId) -> Option<Seen<'_>> {
        if let Some(r) = self.history.iter().rev().find(|r| r.id == id) {
            return Some(Seen::Finished {
                fingerprint: RequestFingerprint::of(&r.targets),
                report: r,
            });
        }
        let e = self.earlier.iter().rev().find(|e| e.report.id == id)?;
        Some(Seen::Finished {
            fingerprint: e.fingerprint.clone(),
            report: &e.report,
        })
    }
}

impl super::JobLedger {
    /// Takes back the operation `id` the ledger has just started, none of whose actions was
    /// carried out because its admission could not be journaled: a command the operator was
    /// not told was accepted must leave no trace, or a manager started after this one might
    /// run it again unknowingly (or refuse its uuid as interrupted). Nothing runs afterwards
    /// and the uuid is unknown again, so a retry under it starts afresh. `false` (and nothing
    /// changed) when `id` is not the operation in flight.
    pub fn withdraw(&mut self, id: OperationId) -> bool {
        if self.activity.operation().map(|op| op.id()) != Some(id) {
            return false;
        }
        self.activity = super::activity::Activity::Idle;
        self.uuids.admitted.retain(|a| a.id != id);
        true
    }
}

/// Appends `item`, forgetting the oldest past [`HISTORY_LEN`].
fn push_bounded<T>(list: &mut VecDeque<T>, item: T) {
    list.push_back(item);
    if list.len() > HISTORY_LEN {
        list.pop_front();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::Direction;
    use crate::ids::{DeviceId, NodeName};
    use crate::operation::Outcome;

    fn id(n: u128) -> OperationId {
        OperationId(uuid::Uuid::from_u128(n))
    }

    /// A final report of `n` that switched rank `n` to its backup NIC.
    fn report(n: u128) -> OperationReport {
        OperationReport {
            applied: true,
            ..OperationReport::new(
                id(n),
                Direction::ToBackup,
                vec![RankTarget {
                    node: NodeName::from("node-0"),
                    device: DeviceId(0),
                    rank: GlobalRank(n as u32),
                    use_backup: true,
                }],
                Outcome::Succeeded,
            )
        }
    }

    fn admitted(n: u128) -> AdmittedOperation {
        AdmittedOperation {
            id: id(n),
            fingerprint: RequestFingerprint::of(&report(n).targets),
        }
    }

    #[test]
    fn an_unknown_uuid_is_not_seen() {
        let m = UuidMemory::default();
        assert_eq!(m.seen(id(1)), None);
        assert_eq!(m.result_of(id(1)), None);
    }

    #[test]
    fn a_finished_uuid_is_seen_with_its_result_and_handed_out_once() {
        let mut m = UuidMemory::default();
        let r = report(1);
        m.record_finished(&r);
        let fingerprint = RequestFingerprint::of(&r.targets);
        assert_eq!(
            m.seen(id(1)),
            Some(Seen::Finished {
                fingerprint,
                report: &r
            })
        );
        assert_eq!(m.last_finished(), Some(&r));
        assert_eq!(m.take_finished(), vec![FinishedOperation::of(&r)]);
        assert_eq!(m.take_finished(), vec![]);
        // Handed out, still remembered.
        assert_eq!(m.result_of(id(1)), Some(&r));
    }

    #[test]
    fn earlier_results_answer_but_are_not_history() {
        let mut m = UuidMemory::default();
        m.seed([FinishedOperation::of(&report(1))]);
        assert_eq!(m.result_of(id(1)), Some(&report(1)));
        assert!(matches!(m.seen(id(1)), Some(Seen::Finished { .. })));
        assert_eq!(m.history().count(), 0);
        assert_eq!(m.last_finished(), None);
        assert_eq!(m.take_finished(), vec![]);
    }

    #[test]
    fn a_result_comes_before_an_interrupted_admission() {
        let mut m = UuidMemory::default();
        m.seed_interrupted([admitted(2)]);
        assert_eq!(
            m.seen(id(2)),
            Some(Seen::Interrupted {
                fingerprint: &admitted(2).fingerprint
            })
        );
        assert_eq!(m.result_of(id(2)), None);
        m.record_finished(&report(2));
        assert!(matches!(m.seen(id(2)), Some(Seen::Finished { .. })));
    }

    #[test]
    fn admissions_are_handed_out_once_and_are_not_seen() {
        let mut m = UuidMemory::default();
        m.record_admitted(admitted(3));
        assert_eq!(m.seen(id(3)), None);
        assert_eq!(m.take_admitted(), vec![admitted(3)]);
        assert_eq!(m.take_admitted(), vec![]);
    }

    #[test]
    fn not_journaled_marks_the_history() {
        let mut m = UuidMemory::default();
        m.record_finished(&report(4));
        m.note_not_journaled(id(4), "disk full");
        let r = m.result_of(id(4)).expect("remembered");
        assert_eq!(r.journal_error.as_deref(), Some("disk full"));
    }

    fn target(rank: u32, use_backup: bool) -> RankTarget {
        RankTarget {
            node: NodeName::from("node-0"),
            device: DeviceId(rank),
            rank: GlobalRank(rank),
            use_backup,
        }
    }

    #[test]
    fn a_fingerprint_is_the_set_of_ranks_and_sides_in_sixteen_bytes() {
        let a = RequestFingerprint::of(&[target(1, true), target(2, false)]);
        let again = RequestFingerprint::of(&[target(2, false), target(1, true), target(1, true)]);
        assert_eq!(a, again, "order and repetitions do not count");
        assert_ne!(
            a,
            RequestFingerprint::of(&[target(1, true), target(2, true)])
        );
        assert_ne!(a, RequestFingerprint::of(&[target(1, true)]));
        assert_ne!(
            a,
            RequestFingerprint::of(&[target(1, true), target(3, false)])
        );
        let text = serde_json::to_string(&a).unwrap();
        assert_eq!(text.len(), 34, "32 hex digits: {text}");
        let whole_job: Vec<RankTarget> = (0..65_536).map(|r| target(r, true)).collect();
        let big = serde_json::to_string(&RequestFingerprint::of(&whole_job)).unwrap();
        assert_eq!(big.len(), text.len(), "the same size for 65,536 targets");
        assert_eq!(
            serde_json::from_str::<RequestFingerprint>(&text).unwrap(),
            a
        );
        // What journals of earlier builds hold: the pairs themselves.
        let listed: RequestFingerprint = serde_json::from_str("[[2,false],[1,true]]").unwrap();
        assert_eq!(listed, a);
        for bad in ["\"abc\"", "\"zz\"", "3", "{}"] {
            assert!(
                serde_json::from_str::<RequestFingerprint>(bad).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn every_list_keeps_only_the_newest() {
        let mut m = UuidMemory::default();
        let n = HISTORY_LEN as u128;
        for i in 0..=n {
            m.record_finished(&report(i));
            m.record_admitted(admitted(i));
        }
        m.seed((0..=n).map(|i| FinishedOperation::of(&report(n + 1 + i))));
        m.seed_interrupted((0..=n).map(|i| admitted(3 * n + i)));
        assert_eq!(m.history().count(), HISTORY_LEN);
        assert_eq!(
            m.seen(id(0)),
            None,
            "the oldest of this manager is forgotten"
        );
        assert_eq!(m.seen(id(n + 1)), None, "the oldest earlier result too");
        assert_eq!(m.seen(id(3 * n)), None, "the oldest interrupted one too");
        assert!(m.seen(id(1)).is_some());
        assert_eq!(m.take_finished().len(), HISTORY_LEN);
        assert_eq!(m.take_admitted().len(), HISTORY_LEN);
    }
}
