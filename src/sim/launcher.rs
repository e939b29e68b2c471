//! The simulated job's launchers: what taskd's agent does on every node of a job with process
//! recovery, reduced to what the simulation can do.
//!
//! Every proxy hands its node's launcher the manager's order once per stop of training
//! ([`LauncherOrder`]): restart every worker of the node as restart `n` of the job, or end the
//! job. [`SimLaunchers`] records each order by node, as the agents would receive them, keeping
//! only the first order of a restart number for a node (the agent ignores a restart it already
//! made: an old process that came back is sent the same stop again).
//!
//! The simulation can only restart every process at once (a new fabric: old and new processes
//! cannot run collectives together, and a real job cannot either), so a restart is *due* once
//! the launcher of every node has its order: a node cut off from the manager during the stop
//! keeps its old processes until its proxy is back and the manager told them to stop again,
//! exactly as its agent would. [`crate::sim::Simulation::follow_orders`] carries a due order
//! out, once the old training loops ended.

use parking_lot::{Condvar, Mutex};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use taskd_actors::proxy::LauncherOrder;

/// What the simulated launchers were told, node by node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Orders {
    /// Every order handed, in the order the proxies handed them: `(node index, order)`.
    pub handed: Vec<(usize, LauncherOrder)>,
    /// Per node: the restart numbers ordered.
    pub restarts: Vec<BTreeSet<u32>>,
    /// Per node: whether it was ordered to end the job.
    pub end: Vec<bool>,
}

impl Orders {
    /// The smallest restart number above `after` that every node was ordered.
    pub fn restart_due(&self, after: u32) -> Option<u32> {
        let (first, rest) = self.restarts.split_first()?;
        first
            .range(after + 1..)
            .copied()
            .find(|n| rest.iter().all(|r| r.contains(n)))
    }

    /// Whether every node was ordered to end the job.
    pub fn end_due(&self) -> bool {
        !self.end.is_empty() && self.end.iter().all(|e| *e)
    }

    /// Whether `node` was ordered restart `number`.
    pub fn ordered(&self, node: usize, number: u32) -> bool {
        self.restarts.get(node).is_some_and(|r| r.contains(&number))
    }

    /// Whether `node` was ordered to end the job.
    pub fn ordered_end(&self, node: usize) -> bool {
        self.end.get(node).copied().unwrap_or(false)
    }

    /// The highest restart number any node was ordered (0: none).
    pub fn highest(&self) -> u32 {
        self.restarts
            .iter()
            .filter_map(|r| r.last().copied())
            .max()
            .unwrap_or(0)
    }
}

/// The launchers of a simulated job's nodes: the orders their proxies handed them.
pub struct SimLaunchers {
    orders: Mutex<Orders>,
    changed: Condvar,
}

impl SimLaunchers {
    /// The launchers of `nodes` nodes, with no order yet.
    pub fn new(nodes: usize) -> SimLaunchers {
        SimLaunchers {
            orders: Mutex::new(Orders {
                handed: Vec::new(),
                restarts: vec![BTreeSet::new(); nodes],
                end: vec![false; nodes],
            }),
            changed: Condvar::new(),
        }
    }

    /// The proxy of node `node` handed its launcher `order` (on the proxy's thread).
    pub fn take(&self, node: usize, order: LauncherOrder) {
        let mut o = self.orders.lock();
        tracing::info!(
            node,
            ?order,
            "sim: the node's launcher got the manager's order"
        );
        match &order {
            LauncherOrder::Restart { number, .. } => {
                if let Some(r) = o.restarts.get_mut(node) {
                    r.insert(*number);
                }
            }
            LauncherOrder::End { .. } => {
                if let Some(e) = o.end.get_mut(node) {
                    *e = true;
                }
            }
        }
        o.handed.push((node, order));
        self.changed.notify_all();
    }

    /// What the launchers were told so far.
    pub fn orders(&self) -> Orders {
        self.orders.lock().clone()
    }

    /// Waits at most `timeout` until `until` holds of the orders; whether it does.
    pub fn wait(&self, timeout: Duration, until: impl Fn(&Orders) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        let mut o = self.orders.lock();
        while !until(&o) {
            if self.changed.wait_until(&mut o, deadline).timed_out() {
                return until(&o);
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn restart(number: u32) -> LauncherOrder {
        LauncherOrder::Restart {
            number,
            reason: "test".into(),
        }
    }

    #[test]
    fn a_restart_is_due_once_every_node_has_its_order() {
        let l = SimLaunchers::new(2);
        l.take(0, restart(1));
        assert_eq!(l.orders().restart_due(0), None);
        // The same order again (an old process of the node came back) changes nothing.
        l.take(0, restart(1));
        assert_eq!(l.orders().restart_due(0), None);
        l.take(1, restart(1));
        assert_eq!(l.orders().restart_due(0), Some(1));
        // Once carried out, restart 1 is not due again.
        assert_eq!(l.orders().restart_due(1), None);
        assert_eq!(l.orders().highest(), 1);
        assert!(l.orders().ordered(1, 1) && !l.orders().ordered(1, 2));
        assert_eq!(l.orders().handed.len(), 3);
        l.take(1, LauncherOrder::End { reason: "x".into() });
        assert!(!l.orders().end_due());
        l.take(0, LauncherOrder::End { reason: "x".into() });
        assert!(l.orders().end_due());
        assert!(l.wait(Duration::ZERO, Orders::end_due));
        assert!(!l.wait(Duration::from_millis(1), |o| o.restart_due(1).is_some()));
    }
}
