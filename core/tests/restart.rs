//! The ledger's rules for stops of training, job-wide restarts and holds (`ledger/stop.rs`,
//! `ledger/hold.rs`): scripted cases, then a property over random interleavings of processes
//! that register, die, become unreachable and come back, stops and restarts.
//!
//! The job is 2 nodes x 2 devices (ranks 0..4); every process has an [`Instance`] of its own.

mod common;

use common::*;
use proptest::prelude::*;
use std::collections::BTreeSet;
use std::time::Duration;
use taskd_core::ledger::{
    HoldNews, HoldPolicy, LastWords, LostRank, ProcessRecovery, Registered, StopBy, StopPhase,
};
use taskd_core::protocol::{AfterStop, DirectiveKind, GateReport, Phase, ReplyBody, WorkerHello};
use taskd_core::{Action, GlobalRank, Instance, JobLedger, JobState, SwitchCapabilities};

const WORLD: u32 = 4;

/// A job whose ledger sees processes come and go, and plays their answers.
struct Job {
    layout: Layout,
    l: JobLedger,
    /// The process each rank has now (registered or not), if it has one.
    alive: Vec<Option<Instance>>,
    next: u64,
    now: Duration,
    /// The job restart the processes it starts now were started for.
    generation: u32,
}

impl Job {
    /// Every rank registered with a process of its own and verified: running.
    fn running() -> Job {
        let layout = Layout::new(2, 2);
        let l = JobLedger::new(job(), layout.table.clone(), DEADLINES);
        let mut j = Job {
            layout,
            l,
            alive: vec![None; WORLD as usize],
            next: 1,
            now: secs(0),
            generation: 0,
        };
        for r in 0..WORLD {
            j.start(r);
        }
        j.verify();
        assert_eq!(j.l.state(), JobState::Running);
        j
    }

    /// A new process of rank `r` registers, started (as taskd's agent starts them) for the
    /// job's latest restart.
    fn start(&mut self, r: u32) -> Registered {
        let i = Instance(self.next);
        self.next += 1;
        self.alive[r as usize] = Some(i);
        self.generation = self.generation.max(self.l.restarts().done);
        self.register(r, i)
    }

    /// Rank `r`'s process `instance`, of the generation the last [`Job::start`] used.
    fn register(&mut self, r: u32, instance: Instance) -> Registered {
        let hello = WorkerHello {
            job: job(),
            node: self.layout.node_of(GlobalRank(r)),
            rank: GlobalRank(r),
            capabilities: SwitchCapabilities::ALL,
            instance,
            generation: self.generation,
        };
        self.l.register(hello).expect("a valid registration")
    }

    /// Rank `r`'s process went (`how` as the manager learns it).
    fn lose(&mut self, r: u32, lost: LostRank) -> Vec<Action> {
        let i = self.alive[r as usize].unwrap_or(Instance::UNKNOWN);
        if lost.how != taskd_core::protocol::Gone::Unreachable {
            self.alive[r as usize] = None;
        }
        self.tick();
        self.l.worker_lost(GlobalRank(r), lost.of(i), self.now)
    }

    /// The ranks `rs` answer the stop under way.
    fn stopped(&mut self, rs: &[u32], at_step: u64) {
        let id = self.l.training_stop().expect("a stop").id;
        for nr in self.layout.verified(id, |_| Default::default()) {
            let mut nr = nr;
            nr.phase = Phase::Stop;
            nr.replies.retain(|r| rs.contains(&r.rank.0));
            for r in &mut nr.replies {
                r.phase = Phase::Stop;
                r.body = ReplyBody::Stopped {
                    at_step: Some(at_step),
                };
            }
            self.tick();
            self.l.handle(taskd_core::Event::Replies(nr), self.now);
        }
    }

    /// A verification round every registered rank answers (every rank on primary).
    fn verify(&mut self) {
        assert!(self.l.verify_due(), "a round is due");
        let a = self.l.start_verification(op_id(0xfeed), self.now);
        let d = broadcasts(&a)[0].clone();
        let none = BTreeSet::new();
        for nr in self.layout.verified(d.op, |r| {
            self.layout.report(r, &none, GateReport::default())
        }) {
            self.l.handle(taskd_core::Event::Replies(nr), self.now);
        }
    }

    fn tick(&mut self) {
        self.now += millis(10);
    }
}

fn died(why: &str) -> LostRank {
    LostRank::died(why)
}

fn unreachable() -> LostRank {
    LostRank::unreachable("proxy of node-1: connection lost")
}

/// The stop's directive in `actions`: its `then` and `only`.
fn stop_directive(actions: &[Action]) -> (AfterStop, Vec<Instance>) {
    match &broadcasts(actions)[0].kind {
        DirectiveKind::StopTraining { then, only, .. } => (*then, only.clone()),
        other => panic!("not a stop: {other:?}"),
    }
}

#[test]
fn an_old_process_that_registers_after_a_stop_is_stopped_again_and_never_counts() {
    let mut j = Job::running();
    // Node 1's proxy is cut off: ranks 2, 3 unreachable; nothing held them.
    for r in [2, 3] {
        j.lose(r, unreachable());
    }
    assert_eq!(j.l.state(), JobState::Degraded);
    assert!(!j.l.is_held());
    assert_eq!(j.l.follow_hold(j.now), None, "degraded is no hold");
    assert_eq!(j.l.hold_deadline(), None);

    let a =
        j.l.stop_training(op_id(1), StopBy::Operator, "maintenance".into(), j.now)
            .unwrap();
    assert_eq!(stop_directive(&a), (AfterStop::Launcher, vec![]));
    let s = j.l.training_stop().unwrap().clone();
    assert_eq!(s.stopping, ranks(&[0, 1, 2, 3]).into_iter().collect());
    assert_eq!(s.unreachable, ranks(&[2, 3]).into_iter().collect());
    assert!(
        s.waiting_for().contains("ranks 2, 3 are unreachable"),
        "{}",
        s.waiting_for()
    );

    // Node 0 stops; its launcher starts new processes.
    j.stopped(&[0, 1], 10);
    for r in [0, 1] {
        j.lose(r, died("exited with status 1"));
        assert_eq!(j.start(r), Registered::Counted);
    }
    assert_eq!(
        j.l.training_stop().unwrap().not_back,
        ranks(&[2, 3]).into_iter().collect()
    );

    // The cut heals: node 1's OLD processes come back. Not counted; stopped again, alone.
    let olds: Vec<Instance> = [2, 3].iter().map(|r| j.alive[*r].unwrap()).collect();
    for (r, old) in [2u32, 3].into_iter().zip(&olds) {
        let Registered::Retired(a) = j.register(r, *old) else {
            panic!("an old process counted as back");
        };
        assert_eq!(stop_directive(&a), (AfterStop::Launcher, vec![*old]));
    }
    assert_eq!(
        j.l.registered(),
        2,
        "old processes are not the ranks' processes"
    );
    let s = j.l.training_stop().unwrap();
    assert_eq!(s.phase(), StopPhase::Stopping);
    assert_eq!(s.old_back, ranks(&[2, 3]).into_iter().collect());
    assert!(s.unreachable.is_empty());
    assert!(!j.l.verify_due());

    // They stop; their new processes register: the stop is done, the round makes it run.
    j.stopped(&[2, 3], 12);
    for r in [2, 3] {
        j.lose(r, died("exited with status 1"));
        assert_eq!(j.start(r), Registered::Counted);
    }
    assert_eq!(j.l.training_stop().unwrap().phase(), StopPhase::Restarted);
    j.verify();
    assert_eq!(j.l.state(), JobState::Running);
    let last = j.l.last_training_stop().unwrap();
    assert_eq!(last.trained_to, Some(12));
    assert!(j.l.training_stop().is_none());
}

#[test]
fn a_lost_process_restarts_the_whole_job_once_within_the_budget() {
    let mut j = Job::running();
    j.l.set_process_recovery(Some(ProcessRecovery { max_restarts: 2 }));
    for restart in 1..=2u32 {
        j.lose(1, died("killed by SIGKILL"));
        assert!(!j.l.is_held(), "a restart is owed, not a hold");
        assert_eq!(j.l.restart_owed(), Some("rank 1 lost: killed by SIGKILL"));
        assert!(j.l.restart_due());
        let a = j.l.restart_job(op_id(u128::from(restart)), j.now).unwrap();
        assert_eq!(
            stop_directive(&a),
            (AfterStop::Restart { number: restart }, vec![])
        );
        assert_eq!(j.l.restarts().done, restart);
        // The other processes end because of the stop: no second restart for them.
        j.stopped(&[0, 2, 3], 7);
        for r in [0, 2, 3] {
            j.lose(r, died("exited with status 1"));
        }
        assert!(!j.l.restart_due(), "one fault, one restart");
        // The launcher's report of the first death, after the restart began, is the same.
        j.l.worker_lost(
            GlobalRank(1),
            LostRank {
                generation: restart - 1,
                ..died("status -9")
            },
            j.now,
        );
        assert!(!j.l.restart_due());
        for r in 0..WORLD {
            j.start(r);
        }
        j.verify();
        assert_eq!(j.l.state(), JobState::Running, "restart {restart}");
    }
    // The budget is spent: the next fault ends the job.
    j.lose(2, died("killed by SIGKILL"));
    let a = j.l.restart_job(op_id(9), j.now).unwrap();
    assert_eq!(stop_directive(&a), (AfterStop::End, vec![]));
    assert!(j
        .l
        .training_stop()
        .unwrap()
        .reason
        .contains("no restart left (2 done)"));
}

#[test]
fn a_process_of_an_earlier_start_that_first_registers_during_the_restart_is_stopped_again() {
    // Node 0's processes start slowly and have not registered when a process of node 1 dies:
    // the job's restart 1 goes out without them. When they register, for the job's first
    // start (generation 0), they are old processes: stopped again, alone, never counted.
    let layout = Layout::new(2, 2);
    let mut j = Job {
        l: JobLedger::new(job(), layout.table.clone(), DEADLINES),
        layout,
        alive: vec![None; WORLD as usize],
        next: 1,
        now: secs(0),
        generation: 0,
    };
    j.l.set_process_recovery(Some(ProcessRecovery { max_restarts: 3 }));
    for r in [2, 3] {
        j.start(r);
    }
    j.lose(2, died("exited with status 3"));
    let a = j.l.restart_job(op_id(1), j.now).unwrap();
    assert_eq!(
        stop_directive(&a),
        (AfterStop::Restart { number: 1 }, vec![])
    );
    j.stopped(&[3], 4);
    j.lose(3, died("exited with status 1"));
    let late: Vec<Instance> = (10..12).map(Instance).collect();
    for (r, old) in [0u32, 1].into_iter().zip(&late) {
        let Registered::Retired(a) = j.register(r, *old) else {
            panic!("a process of the job's first start counted as back during restart 1");
        };
        assert_eq!(
            stop_directive(&a),
            (AfterStop::Restart { number: 1 }, vec![*old])
        );
    }
    assert_eq!(j.l.registered(), 0);
    assert!(!j.l.verify_due());
    // Every node's processes of restart 1 register: the stop is done, the round makes it run.
    for r in 0..WORLD {
        assert_eq!(j.start(r), Registered::Counted);
    }
    assert_eq!(j.l.training_stop().unwrap().phase(), StopPhase::Restarted);
    j.verify();
    assert_eq!(j.l.state(), JobState::Running);
}

#[test]
fn a_new_process_that_dies_during_the_restart_starts_the_next_one() {
    let mut j = Job::running();
    j.l.set_process_recovery(Some(ProcessRecovery { max_restarts: 3 }));
    j.lose(0, died("killed"));
    j.l.restart_job(op_id(1), j.now).unwrap();
    j.stopped(&[1, 2, 3], 5);
    for r in [1, 2, 3] {
        j.lose(r, died("stopped"));
    }
    j.start(0);
    j.start(1);
    // The new rank 0 dies before the others are back: restart 2 supersedes restart 1.
    j.lose(0, died("segfault at start"));
    assert!(j.l.restart_due());
    let a = j.l.restart_job(op_id(2), j.now).unwrap();
    assert_eq!(stop_directive(&a).0, AfterStop::Restart { number: 2 });
    // A process of restart 1 that never registered dies: it is of the restart under way? No:
    // restart 2 began, so generation 1 is old.
    j.l.worker_lost(
        GlobalRank(2),
        LostRank {
            generation: 1,
            ..died("crash")
        },
        j.now,
    );
    assert!(!j.l.restart_due());
    // A process of restart 2 that never registered dies: that is a new fault.
    j.l.worker_lost(
        GlobalRank(3),
        LostRank {
            generation: 2,
            ..died("crash")
        },
        j.now,
    );
    assert!(j.l.restart_due());
}

#[test]
fn an_unreachable_rank_known_dead_later_starts_the_hold_bound() {
    let mut j = Job::running();
    j.l.set_hold_policy(HoldPolicy::StopAfter(secs(300)));
    j.lose(3, unreachable());
    assert_eq!(j.l.state(), JobState::Degraded);
    assert_eq!(j.l.follow_hold(j.now), None);
    // Its launcher reports the process dead: the job needs it back, and is held meanwhile.
    j.l.worker_lost(GlobalRank(3), died("exited with status 1"), j.now);
    assert_eq!(j.l.state(), JobState::NeedsRecovery);
    let since = j.now;
    assert_eq!(
        j.l.follow_hold(since),
        Some(HoldNews::Began {
            left: Some(secs(300))
        })
    );
    assert_eq!(j.l.hold_deadline(), Some(since + secs(300)));
    assert_eq!(j.l.hold_expired(since + secs(299)), None);
    let why =
        j.l.hold_expired(since + secs(300))
            .expect("the bound passed");
    assert!(why.contains("for 300s"), "{why}");
    // With process recovery the same death is a restart, not a hold.
    let mut j = Job::running();
    j.l.set_process_recovery(Some(ProcessRecovery { max_restarts: 1 }));
    j.lose(3, unreachable());
    j.l.worker_lost(GlobalRank(3), died("exited with status 1"), j.now);
    assert!(!j.l.is_held());
    assert!(j.l.restart_due());
}

#[test]
fn a_stop_past_its_bound_is_overdue_says_why_and_may_be_replaced() {
    let mut j = Job::running();
    j.l.set_stop_bound(secs(10));
    j.lose(3, unreachable());
    j.l.stop_training(op_id(1), StopBy::Policy, "held".into(), j.now)
        .unwrap();
    let at = j.now;
    assert_eq!(j.l.stop_deadline(), Some(at + secs(10)));
    assert_eq!(j.l.stop_overdue(at + secs(9)), None);
    let why = j.l.stop_overdue(at + secs(10)).expect("overdue");
    assert!(why.contains("ranks 3 are unreachable"), "{why}");
    assert!(why.contains("ranks 0, 1, 2 have not stopped yet"), "{why}");
    assert!(j.l.training_stop().unwrap().overdue);
    assert_eq!(j.l.stop_deadline(), None, "said once");
    // An operator may stop again; the new stop replaces it.
    let a =
        j.l.stop_training(op_id(2), StopBy::Operator, "again".into(), at + secs(11))
            .unwrap();
    assert_eq!(broadcasts(&a).len(), 1);
    assert_eq!(j.l.training_stop().unwrap().id, op_id(2));
}

#[test]
fn with_a_last_words_host_the_stop_goes_out_after_its_checkpoint() {
    let mut j = Job::running();
    j.l.set_last_words_host(true);
    j.l.set_process_recovery(Some(ProcessRecovery { max_restarts: 1 }));
    j.lose(2, died("killed"));
    let a = j.l.restart_job(op_id(1), j.now).unwrap();
    assert!(a.is_empty(), "held back until the checkpoint: {a:?}");
    let s = j.l.training_stop().unwrap();
    assert_eq!(s.phase(), StopPhase::LastWords);
    assert_eq!(s.dead, ranks(&[2]).into_iter().collect());
    assert!(s.waiting_for().contains("last-words checkpoint"));
    let a = j.l.last_words_taken(LastWords {
        taken: true,
        detail: "do dump success".into(),
    });
    assert_eq!(stop_directive(&a).0, AfterStop::Restart { number: 1 });
    assert!(j
        .l
        .last_words_taken(LastWords {
            taken: true,
            detail: "again".into()
        })
        .is_empty());
    j.stopped(&[0, 1, 3], 271);
    let note = j.l.training_stop().unwrap().resume_note().unwrap();
    assert!(
        note.contains("after step 271") && note.contains("no step lost"),
        "{note}"
    );
}

#[test]
fn a_new_manager_counts_restarts_on_from_the_processes_generation() {
    let mut j = Job::running();
    // The job's processes were started for its second restart: a manager started now (its
    // count lost) learns it from them, and the budget counts on from there.
    let layout = Layout::new(2, 2);
    let mut fresh = JobLedger::new(job(), layout.table.clone(), DEADLINES);
    fresh.set_process_recovery(Some(ProcessRecovery { max_restarts: 3 }));
    std::mem::swap(&mut j.l, &mut fresh);
    j.generation = 2;
    for r in 0..WORLD {
        j.start(r);
    }
    assert_eq!(j.l.restarts().done, 2);
    j.verify();
    j.lose(0, died("killed"));
    let a = j.l.restart_job(op_id(1), j.now).unwrap();
    assert_eq!(stop_directive(&a).0, AfterStop::Restart { number: 3 });
}

#[test]
fn processes_that_end_cleanly_hold_nothing_and_end_the_job() {
    let mut j = Job::running();
    j.l.set_process_recovery(Some(ProcessRecovery { max_restarts: 1 }));
    for r in 0..WORLD {
        assert!(!j.l.all_ended());
        j.lose(r, LostRank::ended("its process ended (succeeded)"));
        assert_eq!(j.l.state(), JobState::Running);
        assert!(!j.l.is_held() && !j.l.restart_due());
    }
    assert!(j.l.all_ended());
}

#[test]
fn a_report_about_an_older_process_of_the_rank_changes_nothing() {
    let mut j = Job::running();
    let old = j.alive[1].unwrap();
    j.lose(1, died("exited"));
    j.start(1);
    j.verify();
    // The launcher's late word about the old process.
    let a =
        j.l.worker_lost(GlobalRank(1), died("status 1").of(old), j.now);
    assert!(a.is_empty());
    assert!(j.l.is_registered(GlobalRank(1)));
    assert_eq!(j.l.state(), JobState::Running);
}

/// What happens to the job, in the property below.
#[derive(Clone, Debug)]
enum Ev {
    /// The rank's process dies (its proxy or launcher says so).
    Die(u32),
    /// The rank's node's proxy is cut off.
    Cut(u32),
    /// The rank's process (the same one) registers again: a healed cut, or an old process.
    Again(u32),
    /// The rank's launcher starts a new process.
    New(u32),
    /// The ranks answer the stop under way.
    Stopped,
    /// An operator stops training.
    Stop,
    /// The manager starts the restart it owes, or the round it owes.
    Manager,
}

fn ev() -> impl Strategy<Value = Ev> {
    prop_oneof![
        (0..WORLD).prop_map(Ev::Die),
        (0..WORLD).prop_map(Ev::Cut),
        (0..WORLD).prop_map(Ev::Again),
        (0..WORLD).prop_map(Ev::New),
        Just(Ev::Stopped),
        Just(Ev::Stop),
        Just(Ev::Manager),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Whatever the interleaving: a process some stop ended never counts as its rank's again;
    /// the job is never held for unreachable ranks alone; there are never more restarts than
    /// faults; a finished stop left only new processes registered.
    #[test]
    fn stops_and_restarts_keep_their_rules(recovery in any::<bool>(), evs in prop::collection::vec(ev(), 1..40)) {
        let mut j = Job::running();
        if recovery {
            j.l.set_process_recovery(Some(ProcessRecovery { max_restarts: 100 }));
        }
        // Every instance a stop ended; the faults that may each owe a restart.
        let mut retired: BTreeSet<Instance> = BTreeSet::new();
        let mut faults = 0u32;
        // Whether a process died or training was stopped since the job last ran: before
        // that, only cuts happened, and nothing may be held.
        let mut trouble = false;
        let mut n = 0u128;
        for e in evs {
            if j.l.state() == JobState::Running {
                trouble = false;
            }
            trouble |= matches!(e, Ev::Die(_) | Ev::Stop);
            n += 1;
            match e {
                Ev::Die(r) => {
                    if let Some(i) = j.alive[r as usize] {
                        if !retired.contains(&i) {
                            faults += 1;
                        }
                        j.lose(r, died("died"));
                    }
                }
                Ev::Cut(r) => {
                    if j.l.is_registered(GlobalRank(r)) {
                        j.lose(r, unreachable());
                    }
                }
                Ev::Again(r) => {
                    if let Some(i) = j.alive[r as usize] {
                        let res = j.register(r, i);
                        prop_assert_eq!(
                            matches!(res, Registered::Retired(_)),
                            retired.contains(&i),
                            "a retired process is refused, and only it"
                        );
                    }
                }
                Ev::New(r) => {
                    // A launcher starts a new process only once the old one is gone.
                    if j.alive[r as usize].is_none() {
                        j.start(r);
                    }
                }
                Ev::Stopped => {
                    // The old processes still alive answer the stop (a new one never got it).
                    let old: Vec<u32> = (0..WORLD)
                        .filter(|r| j.alive[*r as usize].is_some_and(|i| retired.contains(&i)))
                        .collect();
                    if j.l.training_stop().is_some() {
                        j.stopped(&old, 1);
                    }
                }
                Ev::Stop | Ev::Manager => {
                    let before = j.l.training_stop().map(|s| s.id);
                    let res = if matches!(e, Ev::Stop) {
                        faults += 1;
                        j.l.stop_training(op_id(n), StopBy::Operator, "stop".into(), j.now).map(drop)
                    } else if j.l.restart_due() {
                        j.l.restart_job(op_id(n), j.now).map(drop)
                    } else {
                        if j.l.verify_due() {
                            j.verify();
                        }
                        Ok(())
                    };
                    let after = j.l.training_stop().map(|s| s.id);
                    if res.is_ok() && after.is_some() && after != before {
                        retired.extend(j.alive.iter().flatten().copied());
                    }
                }
            }
            j.l.follow_hold(j.now);
            // Never held for unreachable ranks alone.
            if j.l.state() == JobState::Degraded || !trouble {
                prop_assert!(!j.l.is_held(), "held ({}) with only cuts since the job ran", j.l.state());
            }
            if j.l.is_held() {
                prop_assert!(matches!(j.l.state(), JobState::Paused | JobState::NeedsRecovery));
            }
            prop_assert!(j.l.restarts().done <= faults, "{} restarts for {} faults", j.l.restarts().done, faults);
            // A stop that is over, or that counts every rank back, counts no retired process.
            let done = j.l.training_stop().map_or(true, |s| s.phase() == StopPhase::Restarted);
            if done {
                for r in 0..WORLD {
                    if j.l.is_registered(GlobalRank(r)) {
                        let i = j.alive[r as usize].unwrap();
                        prop_assert!(!retired.contains(&i) || j.l.last_training_stop().is_none() && j.l.training_stop().is_none(),
                            "rank {} counted with the retired process {}", r, i);
                    }
                }
            }
        }
    }
}
