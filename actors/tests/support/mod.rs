//! What the network tests share: a rank in its own training loop behind a [`RemoteWorker`].

use std::sync::Arc;
use std::time::Duration;
use taskd_actors::net::{NetConfig, RemoteWorker, RemoteWorkerConfig};
use taskd_actors::StepGate;
use taskd_core::{GlobalRank, JobId, StepBoundary};
use taskd_hal_mock::{SoloLayout, SoloRank, SoloTraining, SoloTrainingOptions};

/// One simulated rank: its HAL's view, its worker and its training loop (2 ms a step, on the
/// job's clock origin).
pub(crate) struct Rank {
    pub(crate) solo: SoloRank,
    pub(crate) worker: RemoteWorker,
    pub(crate) training: SoloTraining,
}

/// Rank `rank` of `job` in `layout`, registered through the proxy at `proxy`, training.
pub(crate) fn start_rank(
    job: &str,
    rank: u32,
    proxy: &str,
    layout: SoloLayout,
    net: NetConfig,
) -> Rank {
    let solo = SoloRank::new(layout, GlobalRank(rank)).unwrap();
    let mut cfg = RemoteWorkerConfig::new(JobId(job.into()), GlobalRank(rank), proxy);
    cfg.tsp = true;
    cfg.net = net;
    let worker = RemoteWorker::start(cfg, Box::new(solo.hal())).unwrap();
    let reg = worker.wait_registered(Duration::from_secs(30)).unwrap();
    let gate: Arc<StepGate> = worker.gate();
    let training = SoloTraining::start(
        solo.clone(),
        gate as Arc<dyn StepBoundary>,
        SoloTrainingOptions {
            step_time: Duration::from_millis(2),
            epoch: Some(std::time::UNIX_EPOCH + Duration::from_millis(reg.job_epoch_unix_ms)),
        },
    );
    Rank {
        solo,
        worker,
        training,
    }
}

impl Rank {
    /// Ends training, then the worker.
    pub(crate) fn stop(self) {
        self.worker.gate().shutdown();
        self.training.stop();
        self.worker.stop();
    }
}
