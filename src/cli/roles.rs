//! `taskd manager` and `taskd proxy`: each role run until a signal, with the lines scripts
//! wait for. Their options and configuration are `taskd_roles`' (shared with the embedded
//! roles of `taskd-capi`); starting and stopping them is `taskd_actors`'.

use super::error::CliError;
use super::{rank_span, say};
use std::process::ExitCode;
use taskd_actors::manager::SubscribeProgress;
use taskd_actors::net::ProxyNode;
use taskd_actors::process::{ManagerProcess, ShutdownSignals};
use taskd_core::operation::Trigger;
use taskd_core::GlobalRank;
use taskd_roles::proxy::devices_differ;
use taskd_roles::{ManagerArgs, ProxyArgs};

/// Prints one line on stdout for every automatic operation's result, as it comes (the
/// decisions themselves are in the log).
async fn say_automatic_results(manager: &ManagerProcess) {
    use tokio::sync::broadcast::error::RecvError;
    let Ok(mut rx) = manager.node().manager().send(SubscribeProgress).await else {
        return;
    };
    actix_rt::spawn(async move {
        loop {
            match rx.recv().await {
                Ok(ev) => {
                    if let Some(r) = ev.report().filter(|r| r.trigger == Trigger::Auto) {
                        say(format!("taskd manager: automatic {r}"));
                    }
                }
                Err(RecvError::Lagged(_)) => continue,
                Err(RecvError::Closed) => return,
            }
        }
    });
}

/// Runs the manager until SIGINT, SIGTERM or SIGHUP.
pub fn manager(a: ManagerArgs) -> Result<ExitCode, CliError> {
    let _metrics = a.serve_metrics()?;
    let cfg = a.config()?;
    let (job, nodes, ranks, auto) = (
        cfg.node.job.clone(),
        cfg.node.table.nodes().len(),
        cfg.node.table.world_size(),
        cfg.auto,
    );
    actix_rt::System::new().block_on(async move {
        let mut signals = ShutdownSignals::install()?;
        let manager = ManagerProcess::start(cfg).await?;
        say(format!(
            "taskd manager listening on {} (job {job}, {nodes} nodes, {ranks} ranks)",
            manager.local_addr()
        ));
        if let Some(addr) = manager.control_addr() {
            say(format!("taskd manager control API on {addr}"));
        }
        if let Some(addr) = manager.clusterd_addr() {
            say(format!("taskd manager is ClusterD's client at {addr}"));
        }
        if let Some(a) = auto {
            say(format!(
                "taskd manager: automatic failover on (links probed every {} ms)",
                a.link_probe.as_millis()
            ));
            say_automatic_results(&manager).await;
        }
        let sig = signals.recv().await;
        eprintln!("taskd manager: {sig}: shutting down");
        // Never leave ranks held: the operation in flight ends safely first (a second signal
        // stops at once; the next manager then adopts what is left).
        match signals.or_signal(manager.drain(sig)).await {
            Ok(Some(report)) => eprintln!("taskd manager: ended before stopping: {report}"),
            Ok(None) => {}
            Err(again) => eprintln!(
                "taskd manager: {again} again: stopping now; held ranks stay held until the next manager verifies them"
            ),
        }
        manager.shutdown().await;
        Ok(ExitCode::SUCCESS)
    })
}

/// Runs the proxy until SIGINT, SIGTERM or SIGHUP (exit 0), or until the manager refuses the
/// node for good (exit 2).
pub fn proxy(a: ProxyArgs) -> Result<ExitCode, CliError> {
    let _metrics = a.serve_metrics()?;
    let cfg = a.config()?;
    let table = a.rank_table()?;
    let manager = cfg.manager.clone();
    actix_rt::System::new().block_on(async move {
        let mut signals = ShutdownSignals::install()?;
        let proxy = ProxyNode::spawn(cfg)
            .await
            .map_err(|e| CliError::Start(e.into()))?;
        say(format!(
            "taskd proxy listening on {} (manager {manager})",
            proxy.local_addr()
        ));
        let sig = match signals.or_signal(proxy.assigned()).await {
            Ok(Ok(n)) => {
                if let Some(why) = table.as_ref().and_then(|t| devices_differ(t, &n)) {
                    proxy
                        .shutdown("its rank table differs from the manager's")
                        .await;
                    return Err(CliError::Refused(why));
                }
                let ranks: Vec<GlobalRank> = n.ranks.keys().copied().collect();
                say(format!(
                    "taskd proxy registered as {} (ranks {})",
                    n.node,
                    rank_span(&ranks)
                ));
                signals.recv().await
            }
            Ok(Err(e)) => {
                proxy.shutdown("refused by the manager").await;
                return Err(CliError::Refused(e.to_string()));
            }
            Err(sig) => sig,
        };
        eprintln!("taskd proxy: {sig}: shutting down");
        let reason = format!("the proxy process stopped ({sig})");
        proxy.shutdown(&reason).await;
        Ok(ExitCode::SUCCESS)
    })
}
