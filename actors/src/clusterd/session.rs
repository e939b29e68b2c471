//! The client's life: sessions with ClusterD, one after another, forever.
//!
//! A session is one signal stream. It starts with `Init` and `Register` (unary, answered at
//! once), then calls `SubscribeProcessManageSignal`. ClusterD is a grpc-go server, which sends a
//! server stream's response headers only with the stream's first message (or as a
//! trailers-only response when the stream ends first): no call of a session ever waits for a
//! subscription's headers. Every subscription is one call, created once and polled in the
//! session's one loop next to the other stream, the reports and the silence timer:
//!
//! - The signal stream's first message (a keep-alive within 5 s, or a signal) must come within
//!   [`ClusterdConfig::silence`]. It also proves that ClusterD has reset the job's flow, which
//!   every `SubscribeProcessManageSignal` does and which ends any switch stream opened before
//!   it; so only then is `SubscribeNotifySwitch` called, and the session is up (Init and
//!   Register answered, the first message in, the switch subscription sent).
//! - `SubscribeNotifySwitch` waits for headers until ClusterD has a `SwitchRankList`, which it
//!   produces only after the pause is reported: that wait is the normal idle state. The end of
//!   that stream, or its refusal, subscribes it again, alone, after
//!   [`ClusterdConfig::retry_min`]: a new signal stream would reset ClusterD's flow.
//! - Reports are sent as soon as they are owed, whatever state either stream is in (they are
//!   unary calls), in order; a call that fails is retried while the session lasts.
//! - Signals are read in order from one stream, so a `killMaster` that ClusterD sends before
//!   it resets the job (which ends both streams) is handled before the session ends.
//!
//! The end of the signal stream ends the session: ClusterD has reset the job's flow (it ends
//! the stream after every switch, and resets whenever a client's stream goes away). A report
//! owed to an ended session is dropped and logged, never sent in a later one (it would sit in
//! ClusterD's new one-slot buffer and answer the next switch), and the manager is told, so it
//! ends the flow that session drove. The next session starts after
//! [`ClusterdConfig::retry_min`]; one that failed (ClusterD unreachable, an answer other than
//! code 0, silence) after a jittered backoff.

use super::proto::recover_client::RecoverClient;
use super::proto::{self, ClientInfo};
use super::ClusterdConfig;
use crate::manager::{
    ClusterdLinkChanged, ClusterdSessionEnded, ClusterdSignal, ClusterdSwitch, Manager,
};
use crate::net::backoff::Backoff;
use crate::net::client::error_chain;
use crate::telemetry;
use actix::Addr;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;
use taskd_core::clusterd::{Origin, Outgoing, Report, Signal, CODE_OK, CONTINUE_STRATEGY, ROLE};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};
use tonic::Streaming;
use tracing::Instrument;

/// The largest message ClusterD's server accepts (and so the most it sends).
const MAX_MESSAGE: usize = 4 << 20;

/// Why a session ended.
enum End {
    /// ClusterD ended the signal stream: normal, start again.
    Reset,
    /// Something failed: start again after a backoff.
    Failed(String),
}

/// The client's whole life, until `stop`.
pub(super) async fn run(
    manager: Addr<Manager>,
    cfg: ClusterdConfig,
    mut reports: UnboundedReceiver<Outgoing>,
    mut stop: oneshot::Receiver<()>,
) {
    let span = tracing::info_span!("clusterd", addr = %cfg.addr, job = %cfg.job, role = "manager");
    let mut link = Link::new(manager.clone());
    let mut backoff = Backoff::new(cfg.retry_min, cfg.retry_max);
    async move {
        tracing::info!("ClusterD client started");
        let mut id = 0;
        loop {
            id += 1;
            let mut s = Session {
                id,
                cfg: &cfg,
                manager: &manager,
                reports: &mut reports,
                outbox: Outbox::default(),
                link: &mut link,
            };
            let end = tokio::select! {
                _ = &mut stop => None,
                end = s.run() => Some(end),
            };
            s.close();
            let wait = match end {
                None => break,
                Some(End::Reset) => {
                    link.down("ClusterD ended the signal stream; subscribing again".into());
                    backoff.reset();
                    cfg.retry_min
                }
                Some(End::Failed(why)) => {
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

/// One session: one signal stream and what belongs to it.
struct Session<'a> {
    /// The session's number (the reports it is owed carry it).
    id: u64,
    cfg: &'a ClusterdConfig,
    manager: &'a Addr<Manager>,
    reports: &'a mut UnboundedReceiver<Outgoing>,
    outbox: Outbox,
    link: &'a mut Link,
}

impl Session<'_> {
    async fn run(&mut self) -> End {
        let client = match self.open().await {
            Ok(c) => c,
            Err(why) => return End::Failed(why),
        };
        let me = self.me();
        let mut signals = Sub::Calling(signal_call(&client, &me));
        let mut switches: Option<Sub<proto::SwitchRankList>> = None;
        let mut quiet_until = Instant::now() + self.cfg.silence;
        loop {
            tokio::select! {
                ev = signals.next(|| signal_call(&client, &me)) => match ev {
                    Event::Message(m) => {
                        self.signal(m);
                        if switches.is_none() {
                            switches = Some(Sub::Calling(switch_call(&client, &me)));
                            self.link.up();
                        }
                    }
                    Event::Ended => {
                        self.finish_in_flight().await;
                        return End::Reset;
                    }
                    Event::Failed(s) => return End::Failed(format!("signal stream: {s}")),
                },
                ev = next_of(&mut switches, || switch_call(&client, &me)) => match ev {
                    Event::Message(m) => self.switch(m),
                    Event::Ended => self.switch_again(&mut switches, "ended".into()),
                    Event::Failed(s) => self.switch_again(&mut switches, s.to_string()),
                },
                r = self.reports.recv() => match r {
                    Some(r) => {
                        self.outbox.push(r, self.id);
                        continue;
                    }
                    None => return End::Failed("the manager is gone".into()),
                },
                (r, sent) = self.outbox.next(&client) => {
                    self.outbox.answered(&r, sent, self.cfg);
                    continue;
                }
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

    fn me(&self) -> ClientInfo {
        ClientInfo {
            job_id: self.cfg.job.0.clone(),
            role: ROLE.into(),
        }
    }

    /// Connects, `Init`, `Register`.
    async fn open(&mut self) -> Result<RecoverClient<Channel>, String> {
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
        let me = self.me();
        answered("Init", client.init(me.clone()).await)?;
        answered("Register", client.register(me).await)?;
        Ok(client)
    }

    /// ClusterD ended the signal stream, which it does when it resets the job's flow, often
    /// right after it took the flow's last report: the answer to the report in flight, if one
    /// is, is waited for (at most the connect timeout), so that a report ClusterD took counts
    /// as taken and only the others are dropped.
    async fn finish_in_flight(&mut self) {
        if let Some((r, Ok(()))) = self.outbox.finish_sending(self.cfg.connect_timeout).await {
            self.outbox.answered(&r, Ok(()), self.cfg);
        }
    }

    /// The session ended: the reports still owed to it are dropped, and the manager ends the
    /// flow it drove.
    fn close(&mut self) {
        for r in self.outbox.queue.drain(..) {
            dropped(&r, "its session ended before ClusterD took it");
        }
        self.manager
            .do_send(ClusterdSessionEnded { session: self.id });
    }

    fn origin(&self, job: String) -> Origin {
        Origin::new(self.id, job)
    }

    fn signal(&mut self, m: proto::ProcessManageSignal) {
        let signal = Signal::parse(&m.signal_type, &m.actions, &m.change_strategy, &m.uuid);
        metrics::counter!(telemetry::CLUSTERD_SIGNALS_TOTAL, "type" => signal.kind()).increment(1);
        if signal == Signal::KeepAlive {
            return;
        }
        tracing::info!(signal = signal.kind(), clusterd_uuid = %m.uuid, job = %m.job_id, "ClusterD signal");
        self.manager.do_send(ClusterdSignal {
            signal,
            from: self.origin(m.job_id),
        });
    }

    fn switch(&mut self, m: proto::SwitchRankList) {
        metrics::counter!(telemetry::CLUSTERD_SIGNALS_TOTAL, "type" => "switch").increment(1);
        tracing::info!(ranks = ?m.rank_id, ops = ?m.op, job = %m.job_id, "ClusterD SwitchRankList");
        self.manager.do_send(ClusterdSwitch {
            ranks: m.rank_id,
            ops: m.op,
            from: self.origin(m.job_id),
        });
    }

    /// The switch stream ended or was refused: subscribe it again, alone, a little later.
    fn switch_again(&mut self, sub: &mut Option<Sub<proto::SwitchRankList>>, why: String) {
        tracing::info!(
            "ClusterD's switch stream {why}; subscribing it again in {:?}",
            self.cfg.retry_min
        );
        *sub = Some(Sub::Later(Instant::now() + self.cfg.retry_min));
    }
}

/// A subscription call's future: it resolves with the response headers.
type Call<T> =
    Pin<Box<dyn Future<Output = Result<tonic::Response<Streaming<T>>, tonic::Status>> + Send>>;

fn signal_call(
    client: &RecoverClient<Channel>,
    me: &ClientInfo,
) -> Call<proto::ProcessManageSignal> {
    let (mut client, me) = (client.clone(), me.clone());
    Box::pin(async move { client.subscribe_process_manage_signal(me).await })
}

fn switch_call(client: &RecoverClient<Channel>, me: &ClientInfo) -> Call<proto::SwitchRankList> {
    let (mut client, me) = (client.clone(), me.clone());
    Box::pin(async move { client.subscribe_notify_switch(me).await })
}

/// One server-stream subscription. Its state lives here, not in the future that
/// [`Sub::next`] returns, so dropping that future (another branch of the session's loop was
/// ready first) loses nothing.
enum Sub<T> {
    /// To be subscribed (again) at this instant.
    Later(Instant),
    /// The call is out; its headers have not come.
    Calling(Call<T>),
    /// The stream (boxed: it is much larger than the other states).
    Open(Box<Streaming<T>>),
}

/// What a subscription delivered.
enum Event<T> {
    Message(T),
    /// The stream ended (OK), or the server answered with an empty stream.
    Ended,
    /// The call or the stream failed.
    Failed(tonic::Status),
}

impl<T> Sub<T> {
    /// The next message, end or failure; subscribes with `call` when it is time.
    async fn next(&mut self, call: impl Fn() -> Call<T>) -> Event<T> {
        loop {
            match self {
                Sub::Later(at) => {
                    tokio::time::sleep_until(*at).await;
                    *self = Sub::Calling(call());
                }
                Sub::Calling(pending) => match pending.as_mut().await {
                    Ok(r) => *self = Sub::Open(Box::new(r.into_inner())),
                    Err(s) => return Event::Failed(s),
                },
                Sub::Open(stream) => {
                    return match stream.message().await {
                        Ok(Some(m)) => Event::Message(m),
                        Ok(None) => Event::Ended,
                        Err(s) => Event::Failed(s),
                    }
                }
            }
        }
    }
}

/// [`Sub::next`] of a subscription that may not exist yet (then never ready).
async fn next_of<T>(sub: &mut Option<Sub<T>>, call: impl Fn() -> Call<T>) -> Event<T> {
    match sub {
        Some(s) => s.next(call).await,
        None => std::future::pending().await,
    }
}

type Reply = Pin<Box<dyn Future<Output = Result<proto::Status, tonic::Status>> + Send>>;

/// The reports owed in this session, in order; the first is being sent (or waits to be
/// retried).
#[derive(Default)]
struct Outbox {
    queue: VecDeque<Outgoing>,
    sending: Option<Reply>,
    retry_at: Option<Instant>,
    failures: u32,
}

impl Outbox {
    /// Queues a report owed to `session` (the current one); one owed to another is dropped.
    fn push(&mut self, r: Outgoing, session: u64) {
        if r.session == session {
            self.queue.push_back(r);
        } else {
            dropped(&r, "the session that asked for it ended");
        }
    }

    /// The first report's answer (never ready while there is none).
    async fn next(&mut self, client: &RecoverClient<Channel>) -> (Outgoing, Result<(), String>) {
        if let Some(at) = self.retry_at {
            tokio::time::sleep_until(at).await;
            self.retry_at = None;
        }
        let Some(front) = self.queue.front().cloned() else {
            return std::future::pending().await;
        };
        let sending = self
            .sending
            .get_or_insert_with(|| deliver(client.clone(), front.clone()));
        let res = sending.as_mut().await;
        self.sending = None;
        let res = res.map_err(|s| s.to_string()).and_then(|a| took(&front, a));
        (front, res)
    }

    /// The answer to the report being sent, if one is, waited for at most `bound`.
    async fn finish_sending(&mut self, bound: Duration) -> Option<(Outgoing, Result<(), String>)> {
        let mut sending = self.sending.take()?;
        let front = self.queue.front().cloned()?;
        let res = match tokio::time::timeout(bound, sending.as_mut()).await {
            Ok(answer) => answer
                .map_err(|s| s.to_string())
                .and_then(|a| took(&front, a)),
            Err(_) => Err(format!("no answer within {bound:?}")),
        };
        Some((front, res))
    }

    /// Counts and logs the answer to `r`; a failed call is retried after a pause.
    fn answered(&mut self, r: &Outgoing, sent: Result<(), String>, cfg: &ClusterdConfig) {
        let kind = r.report.kind();
        let result = match (&sent, r.report.ok()) {
            (Err(_), _) => "error",
            (Ok(_), true) => "ok",
            (Ok(_), false) => "failed",
        };
        metrics::counter!(telemetry::CLUSTERD_REPORTS_TOTAL, "report" => kind, "result" => result)
            .increment(1);
        match sent {
            Ok(()) => {
                self.queue.pop_front();
                self.failures = 0;
            }
            Err(why) => {
                self.failures += 1;
                let wait = (cfg.retry_min / 4).saturating_mul(self.failures.min(8));
                tracing::warn!(
                    report = kind,
                    tries = self.failures,
                    "{kind} report not delivered: {why}; trying again in {wait:?}"
                );
                self.retry_at = Some(Instant::now() + wait);
            }
        }
    }
}

/// ClusterD took the report (whatever its code: it answered).
fn took(r: &Outgoing, a: proto::Status) -> Result<(), String> {
    let kind = r.report.kind();
    if a.code == CODE_OK {
        tracing::info!(report = kind, ok = r.report.ok(), "reported to ClusterD");
    } else {
        tracing::warn!(report = kind, ok = r.report.ok(), code = a.code, info = %a.info, job = %r.job, "ClusterD took the report with an error code");
    }
    Ok(())
}

fn dropped(r: &Outgoing, why: &str) {
    tracing::warn!(
        report = r.report.kind(),
        ok = r.report.ok(),
        session = r.session,
        "{} report not sent: {why} (ClusterD has reset that flow and would read it as the next one's answer)",
        r.report.kind()
    );
    metrics::counter!(telemetry::CLUSTERD_REPORTS_TOTAL, "report" => r.report.kind(), "result" => "dropped")
        .increment(1);
}

/// The unary call that sends `r`, under the job it answers for.
fn deliver(mut client: RecoverClient<Channel>, r: Outgoing) -> Reply {
    let status = |code: i32, info: String| Some(proto::Status { code, info });
    Box::pin(async move {
        let sent = match r.report {
            Report::StopComplete { code, info } => {
                let req = proto::StopCompleteRequest {
                    job_id: r.job,
                    status: status(code, info),
                    fault_ranks: vec![],
                };
                client.report_stop_complete(req).await
            }
            Report::SwitchResult { ok } => {
                let req = proto::SwitchResult {
                    job_id: r.job,
                    result: ok,
                };
                client.reply_switch_nic_result(req).await
            }
            Report::RecoverStatus { code, info } => {
                let req = proto::RecoverStatusRequest {
                    job_id: r.job,
                    status: status(code, info),
                    strategy: CONTINUE_STRATEGY.into(),
                    isolate_rank_ids: vec![],
                };
                client.report_recover_status(req).await
            }
        };
        sent.map(tonic::Response::into_inner)
    })
}

/// A unary call's answer: code 0, else why not.
fn answered(
    rpc: &str,
    res: Result<tonic::Response<proto::Status>, tonic::Status>,
) -> Result<(), String> {
    match res {
        Ok(a) if a.get_ref().code == CODE_OK => Ok(()),
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
        tracing::info!(
            "ClusterD session up (Init, Register, the signal stream's first message, SubscribeNotifySwitch sent)"
        );
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
