//! The framework HAL: a rank HAL for training frameworks that move every communicator of the
//! process themselves.
//!
//! MindSpore (`mindspore.communication.management._comm_switch_nic(global_ranks, use_backup)`)
//! and torch_npu (`torch_npu.npu._comm_switch_nic(ranks, useBackup)`) take the **whole** target
//! list in global ranks, once, and map it onto each of their HCCL groups themselves. taskd does
//! not see those groups, so this HAL describes the process as one group, [`FRAMEWORK_GROUP`],
//! whose members are every rank of the job in rank order (group rank = global rank). The worker's
//! planner then makes exactly one call per operation, with every target in the operator's order,
//! and that call reaches the framework's function unchanged.
//!
//! What the manager's checks mean then (docs/python.md): the digest a
//! worker reports is the digest of that one call, so "every member agrees" means every rank
//! handed its framework the same list; a verification round compares what each rank's
//! framework was told, rank by rank. Agreement inside each HCCL group is the framework's part:
//! it returns `False` (a failed call, and a rollback) unless every group succeeded.
//!
//! Where the call runs: on the training thread, the one that owns the device context and the
//! streams, while it is held at the step gate ([`on_training_thread`]): the worker's HAL
//! thread hands the call over and waits for its answer. The function is told how long it has
//! (the directive's call timeout, shorter than the phase); the worker waits a quarter longer,
//! then reports the call as timed out.

use parking_lot::Mutex;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use taskd_actors::StepGate;
use taskd_core::inflight::InFlightFramework;
use taskd_core::{
    GlobalRank, GroupInfo, GroupRank, HalError, HalErrorKind, LibraryName, RankHal,
    SwitchCapabilities,
};

/// The one group a framework HAL reports: every rank of the job, group rank = global rank.
pub const FRAMEWORK_GROUP: &str = "framework";

/// The time a framework call gets before the first directive says otherwise: the call
/// timeout of the default switch phase.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(225);

/// A framework's switch function.
pub trait FrameworkSwitch: Send {
    /// Moves every communicator of this process so that `ranks[i]` (global ranks) uses its
    /// backup NIC when `use_backup[i]`, within `timeout` (a function that cannot finish in
    /// time gives up and fails). `Err` carries the framework's reason (a `False` answer, an
    /// exception's message).
    fn switch_nic(
        &mut self,
        ranks: &[u32],
        use_backup: &[bool],
        timeout: Duration,
    ) -> Result<(), String>;
}

impl<F> FrameworkSwitch for F
where
    F: FnMut(&[u32], &[bool], Duration) -> Result<(), String> + Send,
{
    fn switch_nic(
        &mut self,
        ranks: &[u32],
        use_backup: &[bool],
        timeout: Duration,
    ) -> Result<(), String> {
        self(ranks, use_backup, timeout)
    }
}

/// One call of the framework's function, ready to run where it must.
pub type SwitchCall = Box<dyn FnOnce() -> Result<(), String> + Send>;

/// Runs a [`SwitchCall`] where the framework's function must run, waiting at most the given
/// time for its answer; `Err` says why it could not run or did not answer.
pub type RunCall = Box<dyn FnMut(Duration, SwitchCall) -> Result<(), String> + Send>;

/// Runs each call on the training thread held at the worker's step gate (set once the worker
/// started). Refused while the training thread is not held: the framework is never called
/// while it trains.
pub fn on_training_thread(gate: Arc<OnceLock<Arc<StepGate>>>) -> RunCall {
    Box::new(move |wait, call| {
        let gate = gate
            .get()
            .ok_or("the worker has not started: there is no step gate")?;
        gate.call_on_training_thread(wait, call)
            .map_err(|e| e.to_string())?
    })
}

/// How a framework HAL learns the job's size: from the registration, which the proxy answers
/// before it hands the worker any directive. `None`: not registered.
pub type WorldSize = Box<dyn FnMut() -> Option<u32> + Send>;

/// A rank HAL whose switch is one call of the framework's function.
pub struct FrameworkHal {
    /// The process's in-flight side, when it has one: an in-flight move's switch goes there
    /// (off the training thread) instead of to the switch function.
    in_flight: Option<InFlightSource>,
    switch: Arc<Mutex<Box<dyn FrameworkSwitch>>>,
    run: RunCall,
    call_timeout: Duration,
    world: WorldSize,
    capabilities: SwitchCapabilities,
}

impl FrameworkHal {
    /// A HAL calling `switch` through `run` (the training thread: [`on_training_thread`]),
    /// for a job of `world` ranks, whose backend lacks `capabilities` (for HCCL, L2 retry and
    /// RDMA from the environment, as for `AscendRankHal`; see `crate::worker::SwitchBackend`).
    pub fn new(
        switch: Box<dyn FrameworkSwitch>,
        run: RunCall,
        world: WorldSize,
        capabilities: SwitchCapabilities,
    ) -> Self {
        FrameworkHal {
            in_flight: None,
            switch: Arc::new(Mutex::new(switch)),
            run,
            call_timeout: DEFAULT_CALL_TIMEOUT,
            world,
            capabilities,
        }
    }
}

/// Where a framework HAL finds the process's in-flight side (registered after the worker
/// started, so asked at each call).
pub type InFlightSource = Box<dyn Fn() -> Option<Arc<dyn InFlightFramework>> + Send>;

impl FrameworkHal {
    /// Makes an in-flight move's switch (armed by the worker, see
    /// [`InFlightFramework::arm_switch`]) go to the in-flight side `source` finds, on the
    /// HAL's thread: the training thread waits mid-step and cannot take the call.
    pub fn with_in_flight(mut self, source: InFlightSource) -> Self {
        self.in_flight = Some(source);
        self
    }
}

impl RankHal for FrameworkHal {
    fn groups(&mut self) -> Result<Vec<GroupInfo>, HalError> {
        let n = (self.world)().ok_or_else(|| {
            HalError::uncoded(
                "groups",
                LibraryName::FRAMEWORK,
                HalErrorKind::Unavailable,
                "the job's size is not known before the worker registered",
            )
        })?;
        Ok(vec![GroupInfo {
            name: FRAMEWORK_GROUP.to_owned(),
            members: (0..n).map(GlobalRank).collect(),
        }])
    }

    fn set_working_nic(
        &mut self,
        group: &str,
        ranks: &[GroupRank],
        use_backup: &[bool],
    ) -> Result<(), HalError> {
        if group != FRAMEWORK_GROUP {
            return Err(HalError::uncoded(
                "_comm_switch_nic",
                LibraryName::FRAMEWORK,
                HalErrorKind::InvalidArgument,
                format!("the framework HAL has one group, {FRAMEWORK_GROUP}, not {group}"),
            ));
        }
        // Group rank = global rank in the framework group.
        let global: Vec<u32> = ranks.iter().map(|r| r.0).collect();
        let flags = use_backup.to_vec();
        let armed = self
            .in_flight
            .as_ref()
            .and_then(|source| source())
            .and_then(|f| {
                let redo = f.take_switch()?;
                Some((f, redo))
            });
        if let Some((f, redo)) = armed {
            return f
                .switch(&global, &flags, &redo, self.call_timeout)
                .map_err(|reason| {
                    HalError::uncoded(
                        "switch_in_flight",
                        LibraryName::FRAMEWORK,
                        HalErrorKind::Other,
                        reason,
                    )
                });
        }
        let (switch, timeout) = (self.switch.clone(), self.call_timeout);
        let call: SwitchCall = Box::new(move || switch.lock().switch_nic(&global, &flags, timeout));
        // The function is told `timeout`; one that does not keep to it is reported late.
        (self.run)(timeout + timeout / 4, call).map_err(|reason| {
            HalError::uncoded(
                "_comm_switch_nic",
                LibraryName::FRAMEWORK,
                HalErrorKind::Other,
                reason,
            )
        })
    }

    fn capabilities(&mut self) -> SwitchCapabilities {
        self.capabilities.clone()
    }

    fn set_call_timeout(&mut self, timeout: Duration) {
        // A directive from a sender that predates the call timeout says zero: keep the last.
        if !timeout.is_zero() {
            self.call_timeout = timeout;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use taskd_core::{plan_calls, NicSide};

    type Calls = Arc<Mutex<Vec<(Vec<u32>, Vec<bool>, Duration)>>>;

    /// Runs each call at once on the calling thread.
    fn inline() -> RunCall {
        Box::new(|_, call| call())
    }

    fn hal(world: Option<u32>, fail: bool) -> (FrameworkHal, Calls) {
        let calls: Calls = Arc::default();
        let seen = calls.clone();
        let switch = move |r: &[u32], b: &[bool], t: Duration| {
            seen.lock().unwrap().push((r.to_vec(), b.to_vec(), t));
            if fail {
                Err("_comm_switch_nic returned False".to_owned())
            } else {
                Ok(())
            }
        };
        let hal = FrameworkHal::new(
            Box::new(switch),
            inline(),
            Box::new(move || world),
            SwitchCapabilities::ALL,
        );
        (hal, calls)
    }

    #[test]
    fn one_call_per_operation_with_the_whole_list() {
        let (mut h, calls) = hal(Some(8), false);
        let groups = h.groups().unwrap();
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0].members.len(), 8);
        // Targets on other nodes, in the operator's order: the plan is one call, unchanged.
        let targets = [
            (GlobalRank(6), NicSide::Backup),
            (GlobalRank(2), NicSide::Backup),
            (GlobalRank(3), NicSide::Primary),
        ];
        let plan = plan_calls(&groups, &targets);
        assert_eq!(plan.len(), 1);
        for call in &plan {
            h.set_working_nic(&call.group, &call.ranks, &call.use_backup())
                .unwrap();
        }
        assert_eq!(
            *calls.lock().unwrap(),
            vec![(vec![6, 2, 3], vec![true, true, false], DEFAULT_CALL_TIMEOUT)]
        );
        // The directive's call timeout reaches the function; a zero one (an old sender) not.
        h.set_call_timeout(Duration::from_millis(750));
        h.set_call_timeout(Duration::ZERO);
        h.set_working_nic(FRAMEWORK_GROUP, &[GroupRank(1)], &[true])
            .unwrap();
        assert_eq!(calls.lock().unwrap()[1].2, Duration::from_millis(750));
    }

    #[test]
    fn the_switch_runs_on_the_held_training_thread_and_never_while_it_trains() {
        use taskd_core::OperationId;
        let gate = Arc::new(StepGate::new());
        let slot = Arc::new(OnceLock::new());
        let mut unstarted = on_training_thread(slot.clone());
        let e = unstarted(Duration::from_secs(1), Box::new(|| Ok(()))).unwrap_err();
        assert!(e.contains("has not started"), "{e}");
        slot.set(gate.clone()).ok().unwrap();
        let threads: Arc<Mutex<Vec<std::thread::ThreadId>>> = Arc::default();
        let seen = threads.clone();
        let switch = move |_: &[u32], _: &[bool], _: Duration| {
            seen.lock().unwrap().push(std::thread::current().id());
            Ok(())
        };
        let mut h = FrameworkHal::new(
            Box::new(switch),
            on_training_thread(slot),
            Box::new(|| Some(2)),
            SwitchCapabilities::ALL,
        );
        // Training, not held: refused, and the function is not called.
        let e = h
            .set_working_nic(FRAMEWORK_GROUP, &[GroupRank(0)], &[true])
            .unwrap_err();
        assert!(e.to_string().contains("not held"), "{e}");
        assert!(threads.lock().unwrap().is_empty());
        // Held: the call runs on the training thread.
        let op: OperationId = "00000000-0000-0000-0000-000000000001".parse().unwrap();
        let _ = gate.step_completed(1);
        assert_eq!(gate.sample(op), Ok(Some(2)));
        gate.pause_at(op, 2).unwrap();
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        gate.set_notify(move |_| {
            let _ = held_tx.send(());
        });
        let trainer = {
            let gate = gate.clone();
            std::thread::spawn(move || (std::thread::current().id(), gate.step_completed(2)))
        };
        held_rx.recv().unwrap();
        h.set_working_nic(FRAMEWORK_GROUP, &[GroupRank(0)], &[true])
            .unwrap();
        gate.resume(op);
        let (trainer_id, outcome) = trainer.join().unwrap();
        assert_eq!(outcome, taskd_core::StepOutcome::Go);
        assert_eq!(*threads.lock().unwrap(), vec![trainer_id]);
    }

    #[test]
    fn the_frameworks_refusal_is_the_calls_error() {
        let (mut h, _) = hal(Some(4), true);
        let e = h
            .set_working_nic(FRAMEWORK_GROUP, &[GroupRank(1)], &[true])
            .unwrap_err();
        assert_eq!(e.kind, HalErrorKind::Other);
        assert_eq!(
            e.to_string(),
            "_comm_switch_nic failed (other): _comm_switch_nic returned False"
        );
        let e = h
            .set_working_nic("tp-0", &[GroupRank(1)], &[true])
            .unwrap_err();
        assert_eq!(e.kind, HalErrorKind::InvalidArgument);
        let (mut unregistered, _) = hal(None, false);
        assert_eq!(
            unregistered.groups().unwrap_err().kind,
            HalErrorKind::Unavailable
        );
        assert_eq!(h.capabilities(), SwitchCapabilities::ALL);
    }
}
