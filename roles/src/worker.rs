//! The worker's options: one training process's rank, where its node's proxy is, and TLS.
//! `taskd worker --sim` adds the simulated rank's own flags to these; the embedded worker of
//! `taskd-capi` takes exactly these keys.

use crate::error::ConfigError;
use crate::flags;
use crate::net::{NetArgs, TlsArgs};
use clap::Args;
use std::path::PathBuf;
use taskd_actors::net::{RemoteWorkerConfig, DEFAULT_PROXY_PORT};
use taskd_actors::process::rank_table;
use taskd_actors::telemetry::MetricsServer;
use taskd_core::env::{self, process_env};
use taskd_core::{GlobalRank, JobId};

/// The options of a worker: the job and rank, where the node's proxy is, TLS and transport.
#[derive(Args, Debug)]
pub struct WorkerArgs {
    /// The job (default: $MINDX_TASK_ID).
    #[arg(long, value_name = "JOB", env = env::MINDX_TASK_ID, value_parser = flags::non_empty)]
    pub job_id: String,
    /// This process's global rank (default: $RANK).
    #[arg(long, value_name = "R")]
    pub rank: Option<u32>,
    /// This node's proxy, HOST:PORT, IPv6 in brackets (default: $TASKD_PROXY, else
    /// 127.0.0.1:9602).
    #[arg(long, value_name = "HOST:PORT", env = env::TASKD_PROXY,
          default_value_t = format!("127.0.0.1:{DEFAULT_PROXY_PORT}"), value_parser = flags::host_port)]
    pub proxy: String,
    /// This process's node rank as its launcher sets it (logged; the proxy places the rank).
    #[arg(long, value_name = "K")]
    pub node_rank: Option<u32>,
    /// The HCCL rank table: the node this rank must be on (the proxy checks it).
    #[arg(long, value_name = "FILE")]
    pub rank_table: Option<PathBuf>,
    /// Whether this rank runs with TSP:1 (default: from $MS_ENABLE_TFT; simulated ranks:
    /// true). A rank without it makes every switch of the job be refused.
    #[arg(long)]
    pub tsp: Option<bool>,
    #[command(flatten)]
    tls: TlsArgs,
    #[command(flatten)]
    net: NetArgs,
}

impl WorkerArgs {
    /// Starts the metrics endpoint when `--metrics-addr` was given (keep it while the role runs).
    pub fn serve_metrics(&self) -> Result<Option<MetricsServer>, ConfigError> {
        self.net.serve_metrics("worker")
    }

    /// The worker's configuration, or why these options and this environment cannot run.
    pub fn config(&self) -> Result<RemoteWorkerConfig, ConfigError> {
        let rank = match self.rank {
            Some(r) => r,
            None => env::rank(&process_env)?
                .ok_or_else(|| ConfigError::usage("which rank? give --rank or set RANK"))?,
        };
        let rank = GlobalRank(rank);
        let node = match &self.rank_table {
            None => None,
            Some(path) => match rank_table::load(path)?.slot(rank) {
                Some(s) => Some(s.node.clone()),
                None => {
                    return Err(ConfigError::usage(format!(
                        "rank {rank} is not in the rank table {}",
                        path.display()
                    )))
                }
            },
        };
        let tft = env::get(&process_env, env::MS_ENABLE_TFT);
        let tsp = self.tsp.unwrap_or_else(|| env::tsp_enabled(tft.as_deref()));
        Ok(RemoteWorkerConfig {
            job: JobId(self.job_id.clone()),
            rank,
            proxy: self.proxy.clone(),
            node,
            tsp,
            generation: env::restart_count(&process_env),
            hang_timeout: env::hang_timeout(&process_env, tsp)?,
            tls: self.tls.load()?,
            net: self.net.checked()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        worker: WorkerArgs,
    }

    #[test]
    fn the_rank_the_proxy_and_tsp_come_from_the_flags() {
        let cli = Cli::try_parse_from([
            "t",
            "--job-id",
            "j",
            "--rank",
            "3",
            "--proxy",
            "[fd00::2]:9602",
            "--tsp",
            "true",
        ])
        .unwrap();
        let c = cli.worker.config().unwrap();
        assert_eq!(
            (c.rank, c.proxy.as_str(), c.tsp),
            (GlobalRank(3), "[fd00::2]:9602", true)
        );
        assert!(Cli::try_parse_from(["t", "--job-id", "j", "--proxy", "nowhere"]).is_err());
        assert!(Cli::try_parse_from(["t", "--job-id", " "]).is_err());
    }
}
