//! The last-words checkpoint before training stops: a host the manager asks (MindIO's dump,
//! run by the process that hosts the manager). The fault such a host can report (a rank it saw
//! die that taskd had not) is in `faults.rs`.
//!
//! With a host, every stop of training (a restart of the job after a lost process, the hold
//! policy, an operator, ClusterD) first asks it for a checkpoint of the last step the ranks
//! finished, telling it which ranks' processes died; the stop's directive goes out once it
//! answered or its bound passed ([`taskd_core::ledger::StopPhase::LastWords`]). What it came
//! to is in the stop's record: where training resumes and what was lost.

use super::Manager;
use actix::prelude::*;
use std::sync::Arc;
use std::time::Duration;
use taskd_core::ledger::{LastWords, StopPhase};
use taskd_core::GlobalRank;

/// How long a last-words checkpoint may take by default: a large model's replica set is
/// written in this time on a shared file system.
pub const DEFAULT_LAST_WORDS_BOUND: Duration = Duration::from_secs(300);

/// A host of the last-words checkpoint (MindIO's dump, hosted by the manager's process).
pub trait LastWordsHost: Send + Sync + 'static {
    /// Takes the checkpoint from the ranks still alive (`dead`: the ranks whose process died,
    /// empty for a stop without a fault), within `within`. Blocks; called on a thread of its
    /// own, never on the manager's.
    fn last_words(&self, dead: &[GlobalRank], within: Duration) -> LastWords;
}

/// Asks `host` for a last-words checkpoint before every stop of training, each within
/// `within`.
#[derive(Message)]
#[rtype(result = "()")]
pub struct SetLastWords {
    /// The host.
    pub host: Arc<dyn LastWordsHost>,
    /// The bound on each checkpoint.
    pub within: Duration,
}

impl Handler<SetLastWords> for Manager {
    type Result = ();
    fn handle(&mut self, m: SetLastWords, _: &mut Self::Context) {
        tracing::info!(within = ?m.within, "a last-words checkpoint is taken before every stop of training");
        self.ledger.set_last_words_host(true);
        self.last_words = Some((m.host, m.within));
    }
}

impl Manager {
    /// The stop under way waits for its last-words checkpoint: asks the host on a thread of
    /// its own, bounded, then sends the stop.
    pub(super) fn take_last_words(&mut self, ctx: &mut Context<Self>) {
        let Some((host, within)) = self.last_words.clone() else {
            return;
        };
        let Some(stop) = self
            .ledger
            .training_stop()
            .filter(|s| s.phase() == StopPhase::LastWords)
        else {
            return;
        };
        if self.last_words_asked == Some(stop.id) {
            return;
        }
        self.last_words_asked = Some(stop.id);
        let dead: Vec<GlobalRank> = stop.dead.iter().copied().collect();
        tracing::info!(stop = %stop.id, dead = ?dead, ?within, "taking the last-words checkpoint before the stop");
        let call = tokio::task::spawn_blocking(move || host.last_words(&dead, within));
        // The host keeps its own bound; this one outlives it a little, so a host that never
        // answers cannot keep the stop from going out.
        let bounded = tokio::time::timeout(within + Duration::from_secs(5), call);
        ctx.spawn(bounded.into_actor(self).map(|res, act, ctx| {
            let outcome = match res {
                Ok(Ok(lw)) => lw,
                Ok(Err(e)) => LastWords {
                    taken: false,
                    detail: format!("the host failed: {e}"),
                },
                Err(_) => LastWords {
                    taken: false,
                    detail: "the host did not answer within its bound".into(),
                },
            };
            if outcome.taken {
                tracing::info!(detail = %outcome.detail, "last-words checkpoint taken; stopping training");
            } else {
                tracing::warn!(detail = %outcome.detail, "no last-words checkpoint; stopping training");
            }
            let actions = act.ledger.last_words_taken(outcome);
            act.run(actions, ctx);
            act.job_changed();
            act.follow_bounds(ctx);
        }));
    }
}
