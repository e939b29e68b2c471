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
//!   unary calls), in order; a call that fails is retried while the session lasts. The
//!   session's [`Outbox`] is the one place they pass: it takes them from the manager's
//!   channel, drops one owed to an earlier session, and sends the others one at a time.
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
use std::fmt;
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
    Failed(SessionError),
}

/// Why a session failed. Its text is the link's detail (`taskd status`) and the log's.
#[derive(Debug, thiserror::Error)]
enum SessionError {
    /// `cfg.addr` makes no URI.
    #[error("bad ClusterD address {addr:?}: {error}")]
    Address {
        addr: String,
        error: tonic::transport::Error,
    },
    /// No connection.
    #[error("cannot connect to ClusterD at {addr}: {}", error_chain(.error))]
    Connect {
        addr: String,
        error: tonic::transport::Error,
    },
    /// `Init` or `Register` answered a code other than 0.
    #[error("{rpc} answered {code}: {info}")]
    Refused {
        rpc: &'static str,
        code: i32,
        info: String,
    },
    /// `Init` or `Register` failed as a call.
    #[error("{rpc}: {status}")]
    Call {
        rpc: &'static str,
        status: tonic::Status,
    },
    /// The signal stream failed (its end is not a failure: [`End::Reset`]).
    #[error("signal stream: {0}")]
    SignalStream(tonic::Status),
    /// The manager's end of the reports' channel is gone: the manager stopped.
    #[error("the manager is gone")]
    ManagerGone,
    /// Nothing came for this long, not even a keep-alive.
    #[error("nothing from ClusterD for {0:?} (it sends a keep-alive every 5 s)")]
    Silent(Duration),
}

/// Why a report did not go through: it is sent again while its session lasts.
#[derive(Debug, thiserror::Error)]
enum ReportError {
    /// The call failed.
    #[error("{0}")]
    Call(tonic::Status),
    /// The call was still out when the session ended.
    #[error("no answer within {0:?}")]
    NoAnswer(Duration),
}

/// ClusterD's answer to a unary call (its `Status`). To a report, any code means ClusterD took
/// it: it is not sent again; to `Init` and `Register`, a code other than 0 is a refusal.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Answer {
    /// Code 0.
    Ok,
    /// Another code, with ClusterD's words.
    Code { code: i32, info: String },
}

impl From<proto::Status> for Answer {
    fn from(s: proto::Status) -> Answer {
        if s.code == CODE_OK {
            Answer::Ok
        } else {
            Answer::Code {
                code: s.code,
                info: s.info,
            }
        }
    }
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
                outbox: Outbox::new(&mut reports, id),
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
                    link.down(why.to_string());
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
    /// The reports owed to this session.
    outbox: Outbox<'a>,
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
                    Event::Failed(s) => return End::Failed(SessionError::SignalStream(s)),
                },
                ev = next_of(&mut switches, || switch_call(&client, &me)) => match ev {
                    Event::Message(m) => self.switch(m),
                    Event::Ended => self.switch_again(&mut switches, "ended"),
                    Event::Failed(s) => self.switch_again(&mut switches, s),
                },
                out = self.outbox.next(&client) => match out {
                    Outboxed::Answered(r, answer) => {
                        self.outbox.settle(&r, answer, self.cfg);
                        continue;
                    }
                    Outboxed::ManagerGone => return End::Failed(SessionError::ManagerGone),
                },
                _ = tokio::time::sleep_until(quiet_until) => {
                    return End::Failed(SessionError::Silent(self.cfg.silence));
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
    async fn open(&mut self) -> Result<RecoverClient<Channel>, SessionError> {
        let channel = connect(self.cfg).await?;
        let mut client = RecoverClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE);
        let me = self.me();
        accepted("Init", client.init(me.clone()).await)?;
        accepted("Register", client.register(me).await)?;
        Ok(client)
    }

    /// ClusterD ended the signal stream, which it does when it resets the job's flow, often
    /// right after it took the flow's last report: the answer to the report in flight, if one
    /// is, is waited for (at most the connect timeout), so that a report ClusterD took counts
    /// as taken and only the others are dropped.
    async fn finish_in_flight(&mut self) {
        let bound = self.cfg.connect_timeout;
        if let Some((r, Ok(answer))) = self.outbox.finish_sending(bound).await {
            self.outbox.settle(&r, Ok(answer), self.cfg);
        }
    }

    /// The session ended: the reports still owed to it are dropped, and the manager ends the
    /// flow it drove.
    fn close(&mut self) {
        self.outbox.drop_owed();
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
    fn switch_again(
        &mut self,
        sub: &mut Option<Sub<proto::SwitchRankList>>,
        why: impl fmt::Display,
    ) {
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

/// The reports owed to ClusterD in one session, the one way they go: taken from the manager's
/// channel as they come (one owed to an earlier session is dropped), kept in order, sent one at
/// a time; a call that fails is retried after a pause while the session lasts.
struct Outbox<'a> {
    /// The manager's reports, for every session (the channel outlives them).
    from_manager: &'a mut UnboundedReceiver<Outgoing>,
    /// This session.
    session: u64,
    /// The reports owed to it, in order; the first is being sent (or waits to be retried).
    queue: VecDeque<Outgoing>,
    /// The call sending the first.
    sending: Option<Reply>,
    retry_at: Option<Instant>,
    failures: u32,
}

/// What the outbox has come to.
enum Outboxed {
    /// ClusterD answered the first report, or the call failed.
    Answered(Outgoing, Result<Answer, ReportError>),
    /// The manager is gone: no report will come any more.
    ManagerGone,
}

impl<'a> Outbox<'a> {
    fn new(from_manager: &'a mut UnboundedReceiver<Outgoing>, session: u64) -> Outbox<'a> {
        Outbox {
            from_manager,
            session,
            queue: VecDeque::new(),
            sending: None,
            retry_at: None,
            failures: 0,
        }
    }

    /// The answer to the first report (taking the manager's reports meanwhile), or the
    /// manager's end. Its state lives in the outbox: dropping the future loses nothing.
    async fn next(&mut self, client: &RecoverClient<Channel>) -> Outboxed {
        loop {
            tokio::select! {
                r = self.from_manager.recv() => match r {
                    Some(r) => self.push(r),
                    None => return Outboxed::ManagerGone,
                },
                (r, answer) = first_answer(&self.queue, &mut self.sending, &mut self.retry_at, client) => {
                    return Outboxed::Answered(r, answer);
                }
            }
        }
    }

    /// Queues a report owed to this session; one owed to another is dropped.
    fn push(&mut self, r: Outgoing) {
        if r.session == self.session {
            self.queue.push_back(r);
        } else {
            dropped(&r, "the session that asked for it ended");
        }
    }

    /// The answer to the report being sent, if one is, waited for at most `bound`.
    async fn finish_sending(
        &mut self,
        bound: Duration,
    ) -> Option<(Outgoing, Result<Answer, ReportError>)> {
        let mut sending = self.sending.take()?;
        let front = self.queue.front().cloned()?;
        let answer = match tokio::time::timeout(bound, sending.as_mut()).await {
            Ok(answer) => answer.map(Answer::from).map_err(ReportError::Call),
            Err(_) => Err(ReportError::NoAnswer(bound)),
        };
        Some((front, answer))
    }

    /// Counts and logs the answer to `r`: a report ClusterD answered (whatever its code) is
    /// done, a failed call is retried after a pause.
    fn settle(&mut self, r: &Outgoing, answer: Result<Answer, ReportError>, cfg: &ClusterdConfig) {
        let (kind, ok) = (r.report.kind(), r.report.ok());
        let result = match (&answer, ok) {
            (Err(_), _) => "error",
            (Ok(_), true) => "ok",
            (Ok(_), false) => "failed",
        };
        metrics::counter!(telemetry::CLUSTERD_REPORTS_TOTAL, "report" => kind, "result" => result)
            .increment(1);
        match answer {
            Ok(answer) => {
                match answer {
                    Answer::Ok => tracing::info!(report = kind, ok, "reported to ClusterD"),
                    Answer::Code { code, info } => {
                        tracing::warn!(report = kind, ok, code, info = %info, job = %r.job, "ClusterD took the report with an error code")
                    }
                }
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

    /// The session ended: the reports still owed to it are dropped.
    fn drop_owed(&mut self) {
        self.sending = None;
        for r in self.queue.drain(..) {
            dropped(&r, "its session ended before ClusterD took it");
        }
    }
}

/// ClusterD's answer to the first of `queue` (never ready while there is none), sent by the
/// call in `sending` (made here if there is none) once `retry_at` has passed.
async fn first_answer(
    queue: &VecDeque<Outgoing>,
    sending: &mut Option<Reply>,
    retry_at: &mut Option<Instant>,
    client: &RecoverClient<Channel>,
) -> (Outgoing, Result<Answer, ReportError>) {
    if let Some(at) = *retry_at {
        tokio::time::sleep_until(at).await;
        *retry_at = None;
    }
    let Some(front) = queue.front().cloned() else {
        return std::future::pending().await;
    };
    let call = sending.get_or_insert_with(|| deliver(client.clone(), front.clone()));
    let answer = call.as_mut().await;
    *sending = None;
    (front, answer.map(Answer::from).map_err(ReportError::Call))
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

/// A connection to ClusterD at `cfg.addr`.
async fn connect(cfg: &ClusterdConfig) -> Result<Channel, SessionError> {
    let addr = &cfg.addr;
    Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|error| SessionError::Address {
            addr: addr.clone(),
            error,
        })?
        .connect_timeout(cfg.connect_timeout)
        .tcp_nodelay(true)
        .connect()
        .await
        .map_err(|error| SessionError::Connect {
            addr: addr.clone(),
            error,
        })
}

/// `Init` or `Register` went through: the call answered, with code 0.
fn accepted(
    rpc: &'static str,
    res: Result<tonic::Response<proto::Status>, tonic::Status>,
) -> Result<(), SessionError> {
    match res.map(|a| Answer::from(a.into_inner())) {
        Ok(Answer::Ok) => Ok(()),
        Ok(Answer::Code { code, info }) => Err(SessionError::Refused { rpc, code, info }),
        Err(status) => Err(SessionError::Call { rpc, status }),
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

#[cfg(test)]
mod tests {
    use super::*;
    use taskd_core::JobId;
    use tokio::sync::mpsc::unbounded_channel;

    fn cfg(addr: &str) -> ClusterdConfig {
        ClusterdConfig::new(addr, JobId("job".into()))
    }

    fn report(session: u64, ok: bool) -> Outgoing {
        Outgoing {
            session,
            job: "job".into(),
            report: Report::SwitchResult { ok },
        }
    }

    fn status(code: i32, info: &str) -> proto::Status {
        proto::Status {
            code,
            info: info.into(),
        }
    }

    /// A client that would connect only when first used (these tests never use it).
    fn idle_client() -> RecoverClient<Channel> {
        RecoverClient::new(Endpoint::from_static("http://127.0.0.1:1").connect_lazy())
    }

    #[test]
    fn code_zero_is_ok_and_another_keeps_clusterds_words() {
        assert_eq!(Answer::from(status(CODE_OK, "")), Answer::Ok);
        assert_eq!(
            Answer::from(status(3, "no such job")),
            Answer::Code {
                code: 3,
                info: "no such job".into()
            }
        );
    }

    #[test]
    fn init_answered_with_another_code_is_a_refusal_naming_the_call() {
        let ok = accepted("Init", Ok(tonic::Response::new(status(CODE_OK, ""))));
        assert!(ok.is_ok(), "{ok:?}");
        let err = accepted("Init", Ok(tonic::Response::new(status(3, "no such job")))).unwrap_err();
        assert!(
            matches!(&err, SessionError::Refused { rpc: "Init", code: 3, info } if info == "no such job"),
            "{err:?}"
        );
        assert_eq!(err.to_string(), "Init answered 3: no such job");
    }

    #[test]
    fn register_failed_as_a_call_keeps_its_status() {
        let err = accepted("Register", Err(tonic::Status::unavailable("going away"))).unwrap_err();
        match &err {
            SessionError::Call {
                rpc: "Register",
                status,
            } => assert_eq!(status.code(), tonic::Code::Unavailable),
            other => panic!("{other:?}"),
        }
        let text = err.to_string();
        assert!(text.starts_with("Register: "), "{text}");
        assert!(text.contains("going away"), "{text}");
    }

    #[tokio::test]
    async fn a_bad_address_is_named() {
        let err = connect(&cfg("no such host:x y")).await.unwrap_err();
        assert!(
            matches!(&err, SessionError::Address { addr, .. } if addr == "no such host:x y"),
            "{err:?}"
        );
        let text = err.to_string();
        assert!(
            text.starts_with("bad ClusterD address \"no such host:x y\": "),
            "{text}"
        );
    }

    #[tokio::test]
    async fn no_connection_names_the_address_and_the_cause() {
        let closed = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().to_string()
        };
        let err = connect(&cfg(&closed)).await.unwrap_err();
        assert!(
            matches!(&err, SessionError::Connect { addr, .. } if *addr == closed),
            "{err:?}"
        );
        let text = err.to_string();
        let head = format!("cannot connect to ClusterD at {closed}: ");
        assert!(text.starts_with(&head) && text.len() > head.len(), "{text}");
    }

    #[test]
    fn the_link_reads_the_session_errors_as_before() {
        assert_eq!(
            SessionError::Silent(Duration::from_secs(30)).to_string(),
            "nothing from ClusterD for 30s (it sends a keep-alive every 5 s)"
        );
        assert_eq!(SessionError::ManagerGone.to_string(), "the manager is gone");
        let stream = SessionError::SignalStream(tonic::Status::internal("reset"));
        assert!(
            stream.to_string().starts_with("signal stream: "),
            "{stream}"
        );
    }

    #[test]
    fn a_report_owed_to_an_earlier_session_is_dropped() {
        let (_tx, mut rx) = unbounded_channel();
        let mut outbox = Outbox::new(&mut rx, 2);
        outbox.push(report(1, true));
        outbox.push(report(2, true));
        assert_eq!(outbox.queue, [report(2, true)]);
    }

    #[tokio::test]
    async fn the_managers_end_ends_the_outbox() {
        let (tx, mut rx) = unbounded_channel::<Outgoing>();
        drop(tx);
        let mut outbox = Outbox::new(&mut rx, 1);
        assert!(matches!(
            outbox.next(&idle_client()).await,
            Outboxed::ManagerGone
        ));
    }

    #[test]
    fn a_report_clusterd_answered_with_another_code_is_done() {
        let (_tx, mut rx) = unbounded_channel();
        let mut outbox = Outbox::new(&mut rx, 1);
        outbox.push(report(1, true));
        outbox.push(report(1, false));
        let answer = Answer::Code {
            code: 1,
            info: "no flow".into(),
        };
        outbox.settle(&report(1, true), Ok(answer), &cfg("127.0.0.1:1"));
        assert_eq!(outbox.queue, [report(1, false)]);
        assert_eq!(outbox.failures, 0);
        assert!(outbox.retry_at.is_none());
    }

    #[test]
    fn a_failed_call_keeps_the_report_for_a_retry() {
        let (_tx, mut rx) = unbounded_channel();
        let mut outbox = Outbox::new(&mut rx, 1);
        outbox.push(report(1, true));
        let failed = ReportError::Call(tonic::Status::unavailable("down"));
        outbox.settle(&report(1, true), Err(failed), &cfg("127.0.0.1:1"));
        assert_eq!(outbox.queue, [report(1, true)]);
        assert_eq!(outbox.failures, 1);
        assert!(outbox.retry_at.is_some());
    }

    #[tokio::test]
    async fn a_call_still_out_when_the_session_ends_has_no_answer() {
        let (_tx, mut rx) = unbounded_channel();
        let mut outbox = Outbox::new(&mut rx, 1);
        assert!(outbox.finish_sending(Duration::ZERO).await.is_none());
        outbox.push(report(1, true));
        outbox.sending = Some(Box::pin(std::future::pending()));
        let (r, answer) = outbox.finish_sending(Duration::ZERO).await.unwrap();
        assert_eq!(r, report(1, true));
        let err = answer.unwrap_err();
        assert!(
            matches!(err, ReportError::NoAnswer(d) if d == Duration::ZERO),
            "{err:?}"
        );
        assert_eq!(err.to_string(), "no answer within 0ns");
    }

    #[tokio::test]
    async fn a_call_that_failed_as_the_session_ends_keeps_its_status() {
        let (_tx, mut rx) = unbounded_channel();
        let mut outbox = Outbox::new(&mut rx, 1);
        outbox.push(report(1, true));
        outbox.sending = Some(Box::pin(async { Err(tonic::Status::unavailable("down")) }));
        let (_, answer) = outbox
            .finish_sending(Duration::from_secs(60))
            .await
            .unwrap();
        match answer {
            Err(ReportError::Call(s)) => assert_eq!(s.code(), tonic::Code::Unavailable),
            other => panic!("{other:?}"),
        }
    }
}
