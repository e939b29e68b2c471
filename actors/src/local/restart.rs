//! A local job's way out of a hold: stop training, then restart every rank's process as a new
//! incarnation, as a launcher does (MindCluster's process-level recovery, torchrun's
//! `--max-restarts`, taskd's agent under msrun).

use super::{
    rank_specs, start_worker, Incarnation, IntoRankSpec, LocalJob, LocalJobError, Process, Uplink,
};
use crate::gate::StepGate;
use crate::manager::{HoldPolicy, SetHoldPolicy, StopTraining};
use crate::worker::StopWorker;
use std::sync::Arc;
use std::time::Duration;
use taskd_core::ledger::StopBy;
use taskd_core::{GlobalRank, OperationId};

impl LocalJob {
    /// What a job that does not run leads to, for this manager and every later one (default:
    /// stop training after [`crate::manager::DEFAULT_HOLD_BOUND`]).
    pub fn set_hold_policy(&self, policy: HoldPolicy) -> Result<(), LocalJobError> {
        *self.hold.lock() = policy;
        self.client
            .block_on(self.manager().send(SetHoldPolicy(policy)))
            .map_err(|_| LocalJobError::SystemGone)
    }

    /// Stops training on every rank, as an operator does (the manager's [`StopTraining`]).
    pub fn stop_training(&self, reason: &str) -> Result<OperationId, LocalJobError> {
        let stop = StopTraining {
            reason: reason.to_owned(),
            by: StopBy::Operator,
        };
        let res = self
            .client
            .block_on(self.manager().send(stop))
            .map_err(|_| LocalJobError::SystemGone)?;
        Ok(res?)
    }

    /// Ends every rank's process, as a launcher ordered to end the job does once training
    /// stopped: each worker stops (its proxy sees it leave, and the manager loses the rank, a
    /// process the stop ended); nothing starts again.
    pub fn end_processes(&self) {
        for w in &self.ranks.lock().workers {
            w.do_send(StopWorker);
        }
    }

    /// Restarts every rank's process as a new incarnation, as a launcher does once training
    /// stopped: each old worker stops (its proxy sees it leave, and the manager loses the
    /// rank), then, once the manager has no rank registered, a new worker per rank with a new
    /// gate and `ranks[r]`'s HAL registers on its default NIC. Waits at most `timeout` for
    /// the old ones to be gone. Hand the training loops the new gates ([`LocalJob::gate`]).
    pub fn restart_ranks<R: IntoRankSpec>(
        &self,
        ranks: Vec<R>,
        timeout: Duration,
    ) -> Result<(), LocalJobError> {
        let ranks = rank_specs(ranks)?;
        let table = self.config.1.clone();
        if ranks.len() != table.world_size() {
            return Err(LocalJobError::Mismatch {
                what: "rank HALs",
                expected: table.world_size(),
                got: ranks.len(),
            });
        }
        for w in &self.ranks.lock().workers {
            w.do_send(StopWorker);
        }
        self.wait_registered_count(Some(0), timeout)?;
        let gates: Vec<Arc<StepGate>> = (0..ranks.len())
            .map(|_| Arc::new(StepGate::new()))
            .collect();
        let uplinks: Vec<Arc<Uplink>> = (0..ranks.len()).map(|_| Arc::default()).collect();
        let (job, proxies) = (self.config.0.clone(), self.proxies.clone());
        let (worker_gates, worker_uplinks) = (gates.clone(), uplinks.clone());
        let generation = self.ranks.lock().generation + 1;
        let hang_timeout = self.hang_timeout;
        let (tx, rx) = std::sync::mpsc::channel();
        self.system.arbiter().spawn(async move {
            let workers: Vec<_> = ranks
                .into_iter()
                .enumerate()
                .map(|(r, parts)| {
                    let link = (worker_gates[r].clone(), worker_uplinks[r].clone());
                    let process = Process {
                        rank: GlobalRank(r as u32),
                        generation,
                        hang_timeout,
                    };
                    start_worker(&job, &table, process, parts, &proxies, link)
                })
                .collect();
            let _ = tx.send(workers);
        });
        let workers = rx.recv().map_err(|_| LocalJobError::SystemGone)?;
        *self.ranks.lock() = Incarnation {
            generation,
            workers,
            uplinks,
            gates,
        };
        Ok(())
    }
}
