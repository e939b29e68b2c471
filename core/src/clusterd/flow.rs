//! What the [`Sequencer`](super::Sequencer) knows of ClusterD's flow: whether it drives an
//! operation ([`Flow`]) and where ClusterD's requests have taken it ([`Stage`]), the one thing
//! left to do once an operation has ended ([`Pending`]), and the requests it has taken
//! ([`Heard`]), so that one delivered again is not taken twice.

use super::{Origin, Signal};
use crate::ids::OperationId;
use std::collections::VecDeque;
use std::fmt;

/// A `SwitchRankList` as ClusterD sent it: what tells one delivered again from a new one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankList {
    /// `rankID`: global rank ids, as ClusterD writes them.
    pub ranks: Vec<String>,
    /// `op`: `ops[i]` true sends rank `ranks[i]` to its backup NIC.
    pub ops: Vec<bool>,
}

impl RankList {
    /// The list of `ranks` and `ops`.
    pub fn new(ranks: &[String], ops: &[bool]) -> RankList {
        RankList {
            ranks: ranks.to_vec(),
            ops: ops.to_vec(),
        }
    }
}

/// Where ClusterD's requests have taken the operation it drives. A pause starts it (or a
/// `stop_train` with nothing held, which starts it [`Stage::Stopping`]); ClusterD's one rank
/// list comes while it is paused; then `continue`, or `stop_train` / `killMaster`, tell it how
/// to end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Pausing, or every rank held: waiting for ClusterD's rank list (or its word on how the
    /// operation ends).
    Paused,
    /// ClusterD's rank list came, the one of this pause: being switched, switched or rolled
    /// back, or refused.
    Switching(RankList),
    /// ClusterD said `continue`: the operation resumes (after the rank list it had, if any).
    Continued(Option<RankList>),
    /// ClusterD said `stop_train` or `killMaster`: the operation ends at a hold point with
    /// every gate shut (or by itself, if the word came as it resumed); then training stops.
    Stopping {
        /// Why training stops (ClusterD's first such word, in one line).
        reason: String,
        /// The rank list of the pause, if ClusterD sent one.
        list: Option<RankList>,
    },
}

impl Stage {
    /// The rank list ClusterD sent in this pause, if it has.
    pub fn list(&self) -> Option<&RankList> {
        match self {
            Stage::Paused => None,
            Stage::Switching(list) => Some(list),
            Stage::Continued(list) | Stage::Stopping { list, .. } => list.as_ref(),
        }
    }

    /// Whether ClusterD has said how the operation ends (`continue`, `stop_train` or
    /// `killMaster`): the end of its session then lets it end so.
    pub fn told_to_end(&self) -> bool {
        matches!(self, Stage::Continued(_) | Stage::Stopping { .. })
    }

    /// `list` is the pause's rank list (there was none).
    pub(super) fn take_list(&mut self, list: RankList) {
        *self = match std::mem::replace(self, Stage::Paused) {
            Stage::Paused | Stage::Switching(_) => Stage::Switching(list),
            Stage::Continued(_) => Stage::Continued(Some(list)),
            Stage::Stopping { reason, .. } => Stage::Stopping {
                reason,
                list: Some(list),
            },
        };
    }

    /// ClusterD said `continue`. A stop it said before still wins: the operation ends held.
    pub(super) fn resume(&mut self) {
        *self = match std::mem::replace(self, Stage::Paused) {
            Stage::Paused => Stage::Continued(None),
            Stage::Switching(list) => Stage::Continued(Some(list)),
            told => told,
        };
    }

    /// ClusterD said `stop_train` or `killMaster` for `reason`; the first reason stays.
    pub(super) fn stop(&mut self, reason: String) {
        *self = match std::mem::replace(self, Stage::Paused) {
            Stage::Stopping { reason, list } => Stage::Stopping { reason, list },
            other => Stage::Stopping {
                reason,
                list: other.list().cloned(),
            },
        };
    }
}

/// What the sequencer does once the operation in flight has ended: at most one thing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pending {
    /// A `stop_train` came as ClusterD's operation was resuming, too late to keep it held: once
    /// it has ended, the stop is taken again (a new pause that keeps every rank held). Dropped
    /// if its session ends first, and overtaken by a `killMaster`.
    StopTrainAgain {
        /// The `stop_train`'s uuid.
        uuid: String,
        /// Where it came from: its answer goes there.
        from: Origin,
    },
    /// A `killMaster` came while an operator's operation ran, which it does not cut: once
    /// that operation has ended, training stops for `reason`.
    StopTraining {
        /// Why, in one line.
        reason: String,
    },
}

/// A report owed to ClusterD, in the order of the requests.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(super) enum Owed {
    StopComplete,
    SwitchResult,
    RecoverStatus,
}

/// The operation ClusterD drives.
#[derive(Clone, Debug)]
pub(super) struct Driven {
    /// The uuid of the pause (or of the `stop_train`) that started it.
    pub(super) uuid: String,
    /// That request's origin: the reports of the operation go there.
    pub(super) from: Origin,
    pub(super) op: OperationId,
    pub(super) stage: Stage,
    /// The reports it is owed, in the order of the requests.
    pub(super) owed: Vec<Owed>,
}

/// What the last flows left behind, so that their requests delivered late are known.
#[derive(Clone, Debug, Default)]
pub(super) struct Past {
    /// The last operation ClusterD drove, once over: a late `continue` or pause names its
    /// uuid, and its rank list delivered again is not a new one.
    pub(super) last: Option<Ended>,
    /// The last rank list refused with no pause in effect (one delivered again is not a new
    /// request: only a new pause comes before a new switch).
    pub(super) orphan: Option<RankList>,
}

/// What an operation ClusterD drove leaves behind.
#[derive(Clone, Debug)]
pub(super) struct Ended {
    pub(super) uuid: String,
    pub(super) list: Option<RankList>,
}

/// Whether ClusterD drives an operation now.
#[derive(Clone, Debug)]
pub(super) enum Flow {
    /// It drives none.
    Idle(Past),
    /// It drives this one.
    Driving(Driven),
}

impl Default for Flow {
    fn default() -> Flow {
        Flow::Idle(Past::default())
    }
}

impl Flow {
    /// The operation ClusterD drives, if it drives one.
    pub(super) fn driven(&self) -> Option<&Driven> {
        match self {
            Flow::Driving(d) => Some(d),
            Flow::Idle(_) => None,
        }
    }

    /// The operation ClusterD drove is over: what it leaves behind is the past, and it is
    /// returned (with its owed reports) to settle.
    pub(super) fn end(&mut self) -> Option<Driven> {
        let Flow::Driving(d) = self else {
            return None;
        };
        let past = Past {
            last: Some(Ended {
                uuid: d.uuid.clone(),
                list: d.stage.list().cloned(),
            }),
            orphan: None,
        };
        match std::mem::replace(self, Flow::Idle(past)) {
            Flow::Driving(d) => Some(d),
            Flow::Idle(_) => None,
        }
    }
}

/// A request ClusterD names by uuid, as the sequencer remembers it: the same kind and uuid
/// again is the same message delivered again. (`killMaster` is not remembered: taking it twice
/// stops nothing twice.)
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Request {
    Pause(String),
    StopTrain(String),
    Continue(String),
}

impl Request {
    /// The request `signal` is, if it is one the sequencer remembers.
    pub(super) fn of(signal: &Signal) -> Option<Request> {
        match signal {
            Signal::Pause { uuid } => Some(Request::Pause(uuid.clone())),
            Signal::StopTrain { uuid } => Some(Request::StopTrain(uuid.clone())),
            Signal::Continue { uuid } => Some(Request::Continue(uuid.clone())),
            Signal::KeepAlive | Signal::KillMaster { .. } | Signal::Other { .. } => None,
        }
    }
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (kind, uuid) = match self {
            Request::Pause(u) => ("pause_train", u),
            Request::StopTrain(u) => ("stop_train", u),
            Request::Continue(u) => ("continue", u),
        };
        write!(f, "{kind} {uuid}")
    }
}

/// How many requests the sequencer remembers. ClusterD delivers again only its last message
/// (and a flow has three or four), so this is generous.
const HEARD: usize = 64;

/// The requests taken (acted on, answered, or refused), newest last, at most [`HEARD`].
#[derive(Clone, Debug, Default)]
pub(super) struct Heard(VecDeque<Request>);

impl Heard {
    /// Whether `r` was taken.
    pub(super) fn contains(&self, r: &Request) -> bool {
        self.0.contains(r)
    }

    /// `r` is taken; the oldest is forgotten beyond [`HEARD`].
    pub(super) fn insert(&mut self, r: Request) {
        if self.0.len() == HEARD {
            self.0.pop_front();
        }
        self.0.push_back(r);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(r: &[&str]) -> RankList {
        let ranks: Vec<String> = r.iter().map(|s| s.to_string()).collect();
        RankList::new(&ranks, &vec![true; r.len()])
    }

    #[test]
    fn a_stage_keeps_its_rank_list_and_a_stop_wins_over_continue() {
        let mut s = Stage::Paused;
        assert!(!s.told_to_end() && s.list().is_none());
        s.take_list(list(&["1"]));
        assert_eq!(s, Stage::Switching(list(&["1"])));
        s.resume();
        assert_eq!(s, Stage::Continued(Some(list(&["1"]))));
        assert!(s.told_to_end());
        s.stop("first".into());
        s.stop("second".into());
        assert_eq!(
            s,
            Stage::Stopping {
                reason: "first".into(),
                list: Some(list(&["1"]))
            }
        );
        s.resume();
        assert!(matches!(s, Stage::Stopping { .. }), "{s:?}");
        // A rank list after continue is still the pause's one (the ledger refuses it).
        let mut s = Stage::Paused;
        s.resume();
        s.take_list(list(&["2"]));
        assert_eq!(s, Stage::Continued(Some(list(&["2"]))));
    }

    #[test]
    fn requests_are_known_by_kind_and_uuid_and_the_oldest_are_forgotten() {
        let mut h = Heard::default();
        h.insert(Request::Pause("u".into()));
        assert!(h.contains(&Request::Pause("u".into())));
        assert!(!h.contains(&Request::StopTrain("u".into())));
        assert!(!h.contains(&Request::Continue("u".into())));
        for i in 0..HEARD {
            h.insert(Request::Continue(i.to_string()));
        }
        assert!(!h.contains(&Request::Pause("u".into())));
        assert!(h.contains(&Request::Continue("0".into())));
        assert_eq!(Request::StopTrain("s1".into()).to_string(), "stop_train s1");
        assert_eq!(Request::of(&Signal::KillMaster { uuid: "k".into() }), None);
    }
}
