//! The client's life: sessions with ClusterD, one after another, forever.
//!
//! A session is `Init` -> `Register` -> both subscriptions, then a loop that hands ClusterD's
//! signals to the manager and sends the reports the manager owes. It ends when a stream ends
//! (ClusterD resets the job after every switch: start again at once), or on any failure
//! (start again after a backoff). Reports live in an outbox until ClusterD took them, so a
//! report owed while the link is down is sent on the next session, in order.

use super::proto::recover_client::RecoverClient;
use super::proto::{self, ClientInfo};
use super::ClusterdConfig;
use crate::manager::{ClusterdLinkChanged, ClusterdSignal, ClusterdSwitch, Manager};
use crate::net::backoff::Backoff;
use crate::net::client::error_chain;
use crate::telemetry;
use actix::Addr;
use std::collections::VecDeque;
use taskd_core::external::{self, Report, Signal, CONTINUE_STRATEGY, ROLE};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};
use tonic::Streaming;
use tracing::Instrument;

/// The largest message ClusterD's server accepts (and so the most it sends).
const MAX_MESSAGE: usize = 4 << 20;
/// How many times `SubscribeNotifySwitch` is tried right after `Register` (it answers "not
/// registed" until ClusterD has recorded the registration).
const NOTIFY_TRIES: u32 = 10;

/// Why a session ended.
enum End {
    /// ClusterD ended a stream: normal, start again.
    Reset(&'static str),
    /// Something failed: start again after a backoff.
    Failed(String),
}

/// The client's whole life, until `stop`.
pub(super) async fn run(
    manager: Addr<Manager>,
    cfg: ClusterdConfig,
    mut reports: UnboundedReceiver<Report>,
    mut stop: oneshot::Receiver<()>,
) {
    let span = tracing::info_span!("clusterd", addr = %cfg.addr, job = %cfg.job, role = "manager");
    let mut link = Link::new(manager.clone());
    let mut outbox = VecDeque::new();
    let mut backoff = Backoff::new(cfg.retry_min, cfg.retry_max);
    async move {
        tracing::info!("ClusterD client started");
        loop {
            let mut s = Session {
                cfg: &cfg,
                manager: &manager,
                reports: &mut reports,
                outbox: &mut outbox,
                link: &mut link,
            };
            let end = tokio::select! {
                _ = &mut stop => break,
                end = s.run() => end,
            };
            let wait = match end {
                End::Reset(which) => {
                    link.down(format!(
                        "ClusterD ended the {which} stream; subscribing again"
                    ));
                    backoff.reset();
                    cfg.retry_min
                }
                End::Failed(why) => {
                    link.down(why);
                    backoff.next_delay()
                }
            };
            if !manager.connected() {
                tracing::warn!("the manager stopped: ClusterD client ends");
                break;
            }
            tokio::select! {
                _ = &mut stop => break,
                _ = tokio::time::sleep(wait) => {}
            }
        }
        link.down("stopped".into());
        tracing::info!("ClusterD client stopped");
    }
    .instrument(span)
    .await
}

/// One session.
struct Session<'a> {
    cfg: &'a ClusterdConfig,
    manager: &'a Addr<Manager>,
    reports: &'a mut UnboundedReceiver<Report>,
    outbox: &'a mut VecDeque<Report>,
    link: &'a mut Link,
}

impl Session<'_> {
    async fn run(&mut self) -> End {
        let (mut client, mut signals, mut switches) = match self.open().await {
            Ok(s) => s,
            Err(why) => return End::Failed(why),
        };
        self.link.up();
        let mut quiet_until = Instant::now() + self.cfg.silence;
        loop {
            if let Some(r) = self.outbox.front().cloned() {
                if let Err(why) = self.deliver(&mut client, &r).await {
                    return End::Failed(why);
                }
                self.outbox.pop_front();
                continue;
            }
            tokio::select! {
                m = signals.message() => match m {
                    Ok(Some(m)) => self.signal(m),
                    Ok(None) => return End::Reset("signal"),
                    Err(s) => return End::Failed(format!("signal stream: {s}")),
                },
                m = switches.message() => match m {
                    Ok(Some(m)) => self.switch(m),
                    Ok(None) => return End::Reset("switch"),
                    Err(s) => return End::Failed(format!("switch stream: {s}")),
                },
                r = self.reports.recv() => match r {
                    Some(r) => {
                        self.outbox.push_back(r);
                        continue;
                    }
                    None => return End::Failed("the manager is gone".into()),
                },
                _ = tokio::time::sleep_until(quiet_until) => {
                    return End::Failed(format!(
                        "nothing from ClusterD for {:?} (it sends a keep-alive every 5 s)",
                        self.cfg.silence
                    ));
                }
            }
            quiet_until = Instant::now() + self.cfg.silence;
        }
    }

    /// Connects, `Init`, `Register`, both subscriptions.
    async fn open(
        &mut self,
    ) -> Result<
        (
            RecoverClient<Channel>,
            Streaming<proto::ProcessManageSignal>,
            Streaming<proto::SwitchRankList>,
        ),
        String,
    > {
        let addr = &self.cfg.addr;
        let channel = Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| format!("bad ClusterD address {addr:?}: {e}"))?
            .connect_timeout(self.cfg.connect_timeout)
            .tcp_nodelay(true)
            .connect()
            .await
            .map_err(|e| format!("cannot connect to ClusterD at {addr}: {}", error_chain(&e)))?;
        let mut client = RecoverClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE);
        let me = ClientInfo {
            job_id: self.cfg.job.0.clone(),
            role: ROLE.into(),
        };
        answered("Init", client.init(me.clone()).await)?;
        answered("Register", client.register(me.clone()).await)?;
        let signals = client
            .subscribe_process_manage_signal(me.clone())
            .await
            .map_err(|s| format!("SubscribeProcessManageSignal: {s}"))?
            .into_inner();
        let mut tries = 0;
        let switches = loop {
            match client.subscribe_notify_switch(me.clone()).await {
                Ok(s) => break s.into_inner(),
                Err(s) if tries + 1 < NOTIFY_TRIES => {
                    tries += 1;
                    tracing::debug!(status = %s, tries, "SubscribeNotifySwitch not yet");
                    tokio::time::sleep(self.cfg.retry_min / 4).await;
                }
                Err(s) => return Err(format!("SubscribeNotifySwitch: {s}")),
            }
        };
        Ok((client, signals, switches))
    }

    fn signal(&mut self, m: proto::ProcessManageSignal) {
        let signal = Signal::parse(&m.signal_type, &m.actions, &m.change_strategy, &m.uuid);
        metrics::counter!(telemetry::CLUSTERD_SIGNALS_TOTAL, "type" => signal.kind()).increment(1);
        if signal == Signal::KeepAlive {
            return;
        }
        tracing::info!(signal = signal.kind(), clusterd_uuid = %m.uuid, "ClusterD signal");
        self.manager.do_send(ClusterdSignal(signal));
    }

    fn switch(&mut self, m: proto::SwitchRankList) {
        metrics::counter!(telemetry::CLUSTERD_SIGNALS_TOTAL, "type" => "switch").increment(1);
        tracing::info!(ranks = ?m.rank_id, ops = ?m.op, "ClusterD SwitchRankList");
        self.manager.do_send(ClusterdSwitch {
            ranks: m.rank_id,
            ops: m.op,
        });
    }

    /// Sends one report. ClusterD's answer, whatever its code, means it took it; a failed
    /// call keeps it for the next session.
    async fn deliver(
        &mut self,
        client: &mut RecoverClient<Channel>,
        r: &Report,
    ) -> Result<(), String> {
        let job = self.cfg.job.0.clone();
        let status = |code: &i32, info: &String| {
            Some(proto::Status {
                code: *code,
                info: info.clone(),
            })
        };
        let sent = match r {
            Report::StopComplete { code, info } => {
                let req = proto::StopCompleteRequest {
                    job_id: job,
                    status: status(code, info),
                    fault_ranks: vec![],
                };
                client.report_stop_complete(req).await
            }
            Report::SwitchResult { ok } => {
                let req = proto::SwitchResult {
                    job_id: job,
                    result: *ok,
                };
                client.reply_switch_nic_result(req).await
            }
            Report::RecoverStatus { code, info } => {
                let req = proto::RecoverStatusRequest {
                    job_id: job,
                    status: status(code, info),
                    strategy: CONTINUE_STRATEGY.into(),
                    isolate_rank_ids: vec![],
                };
                client.report_recover_status(req).await
            }
        };
        let kind = r.kind();
        let result = match (&sent, r.ok()) {
            (Err(_), _) => "error",
            (Ok(_), true) => "ok",
            (Ok(_), false) => "failed",
        };
        metrics::counter!(telemetry::CLUSTERD_REPORTS_TOTAL, "report" => kind, "result" => result)
            .increment(1);
        let a = sent
            .map_err(|s| format!("{kind} report not delivered (kept for the next session): {s}"))?
            .into_inner();
        if a.code == external::CODE_OK {
            tracing::info!(report = kind, ok = r.ok(), "reported to ClusterD");
        } else {
            tracing::warn!(report = kind, ok = r.ok(), code = a.code, info = %a.info, "ClusterD took the report with an error code");
        }
        Ok(())
    }
}

/// A unary call's answer: code 0, else why not.
fn answered(
    rpc: &str,
    res: Result<tonic::Response<proto::Status>, tonic::Status>,
) -> Result<(), String> {
    match res {
        Ok(a) if a.get_ref().code == external::CODE_OK => Ok(()),
        Ok(a) => {
            let a = a.into_inner();
            Err(format!("{rpc} answered {}: {}", a.code, a.info))
        }
        Err(s) => Err(format!("{rpc}: {s}")),
    }
}

/// The link's state: each change is logged once, counted in the gauge and told the manager
/// (`taskd status`); the same failure again is not logged again.
struct Link {
    manager: Addr<Manager>,
    up: Option<bool>,
    last: String,
}

impl Link {
    fn new(manager: Addr<Manager>) -> Link {
        Link {
            manager,
            up: None,
            last: String::new(),
        }
    }

    fn up(&mut self) {
        if self.up == Some(true) {
            return;
        }
        tracing::info!("ClusterD session up (Init, Register, both subscriptions)");
        self.set(true, "session up".into());
    }

    fn down(&mut self, why: String) {
        if self.up == Some(false) && self.last == why {
            return;
        }
        if self.up == Some(true) && why.starts_with("ClusterD ended") {
            tracing::info!("{why}");
        } else {
            tracing::warn!("ClusterD unreachable: {why}; retrying with backoff");
        }
        self.set(false, why);
    }

    fn set(&mut self, up: bool, detail: String) {
        self.up = Some(up);
        self.last = detail.clone();
        metrics::gauge!(telemetry::CLUSTERD_CONNECTED).set(if up { 1.0 } else { 0.0 });
        self.manager.do_send(ClusterdLinkChanged {
            connected: up,
            detail,
        });
    }
}
