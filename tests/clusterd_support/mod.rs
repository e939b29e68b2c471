//! A fake ClusterD for the tests: the part of ClusterD's `Recover` service a job's manager calls
//! (tonic, in-process, on port 0 or a given address), keeping the rules of the real one:
//!
//! - It serves its streams as grpc-go does ([`Headers::WithFirstMessage`], the default): a
//!   subscription's response headers go out only with the stream's first message, or as a
//!   trailers-only response when the stream ends before one. The other mode,
//!   [`Headers::AtOnce`], sends them at once (as some servers and proxies do); the scenarios run
//!   against both.
//! - `Init` answers 0 for the job; `Register` answers 408 before `Init`; the subscriptions fail
//!   with "not registed" before `Register`.
//! - Every `SubscribeProcessManageSignal` resets the job's flow, as ClusterD's does: both
//!   streams opened before it end, the report slots are made anew (a report still in one was
//!   never read: a violation), and a test waiting for a report of the old flow fails.
//! - A report naming another job is answered 400 "not registed" and kept apart.
//! - A keep-alive on the signal stream every few milliseconds.
//! - Each report goes into a one-slot buffer; a report that arrives while its slot is full is a
//!   violation (the real ClusterD would hand it to the next switch as that switch's answer),
//!   and so is a report found in its slot when ClusterD sends the request it answers.
//! - The whole switch as ClusterD runs it: `pause_train` with a new uuid, the `SwitchRankList`,
//!   `continue` with the pause's uuid, then both streams end (the job's reset); the manager
//!   must subscribe again from `Init`. It ends with the one answer ClusterD gives the platform
//!   (`switch nic finish`, or the failure).
//!
//! Tests wait on its events (subscriptions, reports) with a bound, never by sleeping.

#![allow(dead_code)]

use parking_lot::{Condvar, Mutex};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};
use taskd::actors::clusterd::proto::recover_server::{Recover, RecoverServer};
use taskd::actors::clusterd::proto::{
    ClientInfo, ProcessManageSignal, RecoverStatusRequest, Status, StopCompleteRequest,
    SwitchRankList, SwitchResult,
};
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_stream::StreamExt;
use tonic::{Request, Response};

/// How long a test waits for an event of the fake before it fails.
pub(crate) const WAIT: Duration = Duration::from_secs(30);
/// How often the fake sends a keep-alive.
const KEEP_ALIVE: Duration = Duration::from_millis(25);

type Sender<T> = UnboundedSender<Result<T, tonic::Status>>;

/// When the fake sends a server stream's response headers.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Headers {
    /// With the stream's first message, or trailers-only if it ends first (grpc-go, ClusterD).
    WithFirstMessage,
    /// As soon as the subscription is taken.
    AtOnce,
}

/// ClusterD's answers to the platform for one switch (`SubscribeSwitchNicSignal`'s message).
pub(crate) const SWITCH_FINISHED: &str = "switch nic finish";
/// After a `ReportStopComplete` of 499.
pub(crate) const PAUSE_FAILED: &str = "om failed, pause train failed";
/// After `ReplySwitchNicResult{false}`.
pub(crate) const SWITCH_FAILED: &str = "switch nic failed, switch nic failed";
/// After a `ReportRecoverStatus` of 499.
pub(crate) const CONTINUE_FAILED: &str = "switch nic failed, continue train failed";

/// One report as the fake received it: `(code, info)`, or the switch result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Got {
    /// `ReportStopComplete` / `ReportRecoverStatus`.
    Status(i32, String),
    /// `ReplySwitchNicResult`.
    Switch(bool),
}

#[derive(Default)]
struct State {
    inited: bool,
    registered: bool,
    /// Completed subscriptions of each stream, since the start.
    signal_subs: usize,
    switch_subs: usize,
    signals: Option<Sender<ProcessManageSignal>>,
    switches: Option<Sender<SwitchRankList>>,
    /// The one-slot buffers.
    stop_complete: Option<Got>,
    switch_result: Option<Got>,
    recover_status: Option<Got>,
    /// Resets of the job's flow so far (one per `SubscribeProcessManageSignal`, one per
    /// [`FakeClusterd::reset_streams`]).
    resets: u64,
    /// The reset count when the flow under way started (its pause was sent).
    flow: Option<u64>,
    /// Reports that named another job.
    foreign: Vec<(String, Got)>,
    /// ClusterD's answers to the platform, one per switch.
    answers: Vec<String>,
    violations: Vec<String>,
    roles: Vec<String>,
    /// No keep-alives (a ClusterD that does not answer on its signal stream).
    mute: bool,
}

impl State {
    /// ClusterD's reset of the job's flow: both streams end, the report slots are new.
    fn reset(&mut self, why: &str) {
        self.resets += 1;
        self.signals = None;
        self.switches = None;
        for (name, slot) in [
            ("ReportStopComplete", self.stop_complete.take()),
            ("ReplySwitchNicResult", self.switch_result.take()),
            ("ReportRecoverStatus", self.recover_status.take()),
        ] {
            if let Some(got) = slot {
                let v = format!("{name} {got:?} was never read: the flow was reset ({why})");
                self.violations.push(v);
            }
        }
    }
}

struct Shared {
    job: String,
    headers: Headers,
    /// `ReportRecoverStatus`, the flow's last report, is answered only once the job's flow
    /// was reset: the manager sees its signal stream end while the report is in flight.
    answer_last_after_reset: bool,
    state: Mutex<State>,
    changed: Condvar,
}

impl Shared {
    fn update<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let r = f(&mut self.state.lock());
        self.changed.notify_all();
        r
    }

    /// Waits until `ready` holds, at most [`WAIT`].
    fn wait_until<R>(&self, what: &str, mut ready: impl FnMut(&mut State) -> Option<R>) -> R {
        let deadline = Instant::now() + WAIT;
        let mut s = self.state.lock();
        loop {
            if let Some(r) = ready(&mut s) {
                return r;
            }
            if self.changed.wait_until(&mut s, deadline).timed_out() {
                panic!(
                    "the fake ClusterD waited {WAIT:?} for {what}; violations: {:?}",
                    s.violations
                );
            }
        }
    }

    /// Puts a report for `job` into its slot; a full slot is a violation. A report for
    /// another job is answered as ClusterD answers it (400) and kept apart.
    fn report(
        &self,
        job: &str,
        slot: fn(&mut State) -> &mut Option<Got>,
        name: &str,
        got: Got,
    ) -> Result<Response<Status>, tonic::Status> {
        if job != self.job {
            self.update(|s| s.foreign.push((job.to_owned(), got)));
            return Ok(Response::new(Status {
                code: 400,
                info: format!("jobId={job} not registed"),
            }));
        }
        self.update(|s| {
            let place = slot(s);
            if let Some(old) = place {
                let v = format!("a second {name} ({got:?}) while the slot holds {old:?}");
                s.violations.push(v);
            } else {
                *place = Some(got);
            }
        });
        ok(&format!("receive {name}"))
    }
}

struct Svc(Arc<Shared>);

impl Svc {
    /// A subscription: refused with ClusterD's "not registed" before `Register`, else the
    /// new stream replaces the old one (`keep` records its sender). Served as the fake's
    /// [`Headers`] mode says.
    async fn subscribe<T: Send + 'static>(
        &self,
        r: Request<ClientInfo>,
        keep: impl FnOnce(&mut State, Sender<T>),
    ) -> Result<Response<Stream<T>>, tonic::Status> {
        let job = r.into_inner().job_id;
        let (tx, mut rx) = unbounded_channel();
        let registered = self.0.update(|s| {
            if s.registered {
                keep(s, tx);
            }
            s.registered
        });
        if !registered {
            return Err(tonic::Status::unknown(format!("jobId={job} not registed")));
        }
        if self.0.headers == Headers::AtOnce {
            return Ok(Response::new(Box::pin(UnboundedReceiverStream::new(rx))));
        }
        match rx.recv().await {
            Some(first) => {
                let rest = UnboundedReceiverStream::new(rx);
                Ok(Response::new(Box::pin(
                    tokio_stream::once(first).chain(rest),
                )))
            }
            // The stream ended before its first message: a trailers-only response, status OK.
            None => Err(tonic::Status::new(tonic::Code::Ok, "")),
        }
    }
}

fn ok(info: &str) -> Result<Response<Status>, tonic::Status> {
    Ok(Response::new(Status {
        code: 0,
        info: info.into(),
    }))
}

fn status_got(s: Option<Status>) -> Got {
    let s = s.unwrap_or_default();
    Got::Status(s.code, s.info)
}

type Stream<T> = Pin<Box<dyn tokio_stream::Stream<Item = Result<T, tonic::Status>> + Send>>;

#[tonic::async_trait]
impl Recover for Svc {
    async fn init(&self, r: Request<ClientInfo>) -> Result<Response<Status>, tonic::Status> {
        let r = r.into_inner();
        if r.job_id != self.0.job {
            return Ok(Response::new(Status {
                code: 402,
                info: format!("job {} not exist", r.job_id),
            }));
        }
        self.0.update(|s| {
            s.inited = true;
            s.roles.push(r.role);
        });
        ok("job init success")
    }

    async fn register(&self, r: Request<ClientInfo>) -> Result<Response<Status>, tonic::Status> {
        let job = r.into_inner().job_id;
        let inited = self.0.update(|s| {
            s.registered |= s.inited;
            s.inited
        });
        if !inited {
            return Ok(Response::new(Status {
                code: 408,
                info: format!("jobId={job} not inited"),
            }));
        }
        ok("register success")
    }

    async fn subscribe_process_manage_signal(
        &self,
        r: Request<ClientInfo>,
    ) -> Result<Response<Stream<ProcessManageSignal>>, tonic::Status> {
        self.subscribe(r, |s, tx| {
            s.reset("a new SubscribeProcessManageSignal");
            s.signals = Some(tx);
            s.signal_subs += 1;
        })
        .await
    }

    async fn subscribe_notify_switch(
        &self,
        r: Request<ClientInfo>,
    ) -> Result<Response<Stream<SwitchRankList>>, tonic::Status> {
        self.subscribe(r, |s, tx| {
            s.switches = Some(tx);
            s.switch_subs += 1;
        })
        .await
    }

    async fn report_stop_complete(
        &self,
        r: Request<StopCompleteRequest>,
    ) -> Result<Response<Status>, tonic::Status> {
        let r = r.into_inner();
        let got = status_got(r.status);
        self.0.report(
            &r.job_id,
            |s| &mut s.stop_complete,
            "ReportStopComplete",
            got,
        )
    }

    async fn reply_switch_nic_result(
        &self,
        r: Request<SwitchResult>,
    ) -> Result<Response<Status>, tonic::Status> {
        let r = r.into_inner();
        let got = Got::Switch(r.result);
        self.0.report(
            &r.job_id,
            |s| &mut s.switch_result,
            "ReplySwitchNicResult",
            got,
        )
    }

    async fn report_recover_status(
        &self,
        r: Request<RecoverStatusRequest>,
    ) -> Result<Response<Status>, tonic::Status> {
        let r = r.into_inner();
        if r.strategy != "continue" {
            self.0
                .update(|s| s.violations.push(format!("strategy {:?}", r.strategy)));
        }
        let got = status_got(r.status);
        let resets = self.0.state.lock().resets;
        let answer = self.0.report(
            &r.job_id,
            |s| &mut s.recover_status,
            "ReportRecoverStatus",
            got,
        );
        if self.0.answer_last_after_reset {
            let shared = self.0.clone();
            let reset =
                move || shared.wait_until("the job's reset", |s| (s.resets > resets).then_some(()));
            tokio::task::spawn_blocking(reset)
                .await
                .expect("the wait ends");
        }
        answer
    }
}

/// A running fake ClusterD. Dropping it kills it (every connection closes at once).
pub(crate) struct FakeClusterd {
    addr: SocketAddr,
    shared: Arc<Shared>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl FakeClusterd {
    /// A fake ClusterD for `job` on a free port of 127.0.0.1, serving streams as grpc-go.
    pub(crate) fn start(job: &str) -> FakeClusterd {
        FakeClusterd::start_with(job, Headers::WithFirstMessage)
    }

    /// A fake ClusterD for `job` on a free port of 127.0.0.1 sending headers as `headers` says.
    pub(crate) fn start_with(job: &str, headers: Headers) -> FakeClusterd {
        FakeClusterd::start_at(job, "127.0.0.1:0".parse().unwrap(), headers)
    }

    /// A fake ClusterD for `job` at `addr` (a restart on the port of one that was killed).
    pub(crate) fn start_at(job: &str, addr: SocketAddr, headers: Headers) -> FakeClusterd {
        FakeClusterd::start_as(job, addr, headers, false)
    }

    /// A fake ClusterD for `job` that answers a flow's `ReportRecoverStatus` only after it
    /// reset the flow (its answer and the end of the signal stream may come in either order).
    pub(crate) fn start_answering_last_after_reset(job: &str) -> FakeClusterd {
        let addr = "127.0.0.1:0".parse().unwrap();
        FakeClusterd::start_as(job, addr, Headers::WithFirstMessage, true)
    }

    fn start_as(
        job: &str,
        addr: SocketAddr,
        headers: Headers,
        answer_last_after_reset: bool,
    ) -> FakeClusterd {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime");
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind(addr))
            .expect("the fake ClusterD's port");
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            job: job.to_owned(),
            headers,
            answer_last_after_reset,
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
        });
        let svc = RecoverServer::new(Svc(shared.clone()));
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        runtime.spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming(incoming)
                .await;
        });
        runtime.spawn(keep_alive(shared.clone()));
        FakeClusterd {
            addr,
            shared,
            runtime: Some(runtime),
        }
    }

    /// Where it listens.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Waits until both streams have been subscribed `n` times in all (one per session).
    pub(crate) fn wait_sessions(&self, n: usize) {
        self.shared.wait_until(&format!("session {n}"), |s| {
            (s.signal_subs >= n && s.switch_subs >= n).then_some(())
        });
    }

    /// Sessions so far (both streams subscribed).
    pub(crate) fn sessions(&self) -> usize {
        let s = self.shared.state.lock();
        s.signal_subs.min(s.switch_subs)
    }

    /// Sends a `ProcessManageSignal` for the job on the current signal stream.
    pub(crate) fn signal(&self, signal_type: &str, actions: &[&str], strategy: &str, uuid: &str) {
        self.signal_for(&self.shared.job, signal_type, actions, strategy, uuid);
    }

    /// Sends a `ProcessManageSignal` naming job `job` on the current signal stream.
    pub(crate) fn signal_for(
        &self,
        job: &str,
        signal_type: &str,
        actions: &[&str],
        strategy: &str,
        uuid: &str,
    ) {
        let m = ProcessManageSignal {
            uuid: uuid.into(),
            job_id: job.into(),
            signal_type: signal_type.into(),
            actions: actions.iter().map(|a| a.to_string()).collect(),
            change_strategy: strategy.into(),
            ..ProcessManageSignal::default()
        };
        let s = self.shared.state.lock();
        let tx = s.signals.as_ref().expect("a signal stream is subscribed");
        tx.send(Ok(m)).expect("the signal stream is open");
    }

    /// Sends `pause_train` with a new uuid (after checking no stale StopComplete waits in its
    /// slot), starting a flow; returns the uuid.
    pub(crate) fn pause(&self) -> String {
        // Random, as ClusterD's own event ids: a restarted ClusterD never repeats one.
        let uuid = uuid::Uuid::new_v4().simple().to_string();
        self.expect_empty("stop_complete", |s| &mut s.stop_complete);
        self.shared.update(|s| s.flow = Some(s.resets));
        self.signal("stopTrain", &["pause_train"], "", &uuid);
        uuid
    }

    /// Sends `stop_train` with uuid `uuid`.
    pub(crate) fn stop_train(&self, uuid: &str) {
        self.expect_empty("stop_complete", |s| &mut s.stop_complete);
        self.signal("stopTrain", &["stop_train"], "", uuid);
    }

    /// Sends `killMaster`.
    pub(crate) fn kill_master(&self, uuid: &str) {
        self.signal("killMaster", &[], "", uuid);
    }

    /// Sends `continue` for the pause `uuid`.
    pub(crate) fn resume(&self, uuid: &str) {
        self.expect_empty("recover_status", |s| &mut s.recover_status);
        self.signal("changeStrategy", &["change_strategy"], "continue", uuid);
    }

    /// Sends a `SwitchRankList` on the current switch stream.
    pub(crate) fn switch(&self, ranks: &[u32], ops: &[bool]) {
        self.expect_empty("switch_result", |s| &mut s.switch_result);
        self.send_switch(ranks, ops);
    }

    /// Sends a `SwitchRankList` without looking at the slot (a duplicate delivery).
    pub(crate) fn send_switch(&self, ranks: &[u32], ops: &[bool]) {
        let m = SwitchRankList {
            rank_id: ranks.iter().map(u32::to_string).collect(),
            op: ops.to_vec(),
            job_id: self.shared.job.clone(),
        };
        let s = self.shared.state.lock();
        let tx = s.switches.as_ref().expect("a switch stream is subscribed");
        tx.send(Ok(m)).expect("the switch stream is open");
    }

    /// Waits for the StopComplete and takes it out of its slot.
    pub(crate) fn stop_complete(&self) -> (i32, String) {
        match self.take("ReportStopComplete", |s| &mut s.stop_complete) {
            Got::Status(c, i) => (c, i),
            other => panic!("{other:?}"),
        }
    }

    /// Waits for the switch result and takes it out of its slot.
    pub(crate) fn switch_result(&self) -> bool {
        match self.take("ReplySwitchNicResult", |s| &mut s.switch_result) {
            Got::Switch(ok) => ok,
            other => panic!("{other:?}"),
        }
    }

    /// Waits for the RecoverStatus and takes it out of its slot.
    pub(crate) fn recover_status(&self) -> (i32, String) {
        match self.take("ReportRecoverStatus", |s| &mut s.recover_status) {
            Got::Status(c, i) => (c, i),
            other => panic!("{other:?}"),
        }
    }

    /// The job's reset, as ClusterD's after every switch: both streams end, the flow is over.
    pub(crate) fn reset_streams(&self) {
        self.shared.update(|s| {
            s.reset("the job's reset");
            s.flow = None;
        });
    }

    /// Ends the switch stream only (ClusterD ends it only with a reset; a proxy between it
    /// and the manager may cut it alone).
    pub(crate) fn cut_switch_stream(&self) {
        self.shared.update(|s| s.switches = None);
    }

    /// Ends the signal stream only, as a proxy or a network cut would: the manager's next
    /// subscription resets the job's flow.
    pub(crate) fn cut_signal_stream(&self) {
        self.shared.update(|s| s.signals = None);
    }

    /// Stops (`true`) or starts again the keep-alives on the signal stream.
    pub(crate) fn mute_keep_alives(&self, mute: bool) {
        self.shared.update(|s| s.mute = mute);
    }

    /// Waits until the signal stream has been subscribed `n` times in all.
    pub(crate) fn wait_signal_subscriptions(&self, n: usize) {
        self.shared
            .wait_until(&format!("signal subscription {n}"), |s| {
                (s.signal_subs >= n).then_some(())
            });
    }

    /// Subscriptions so far: `(signal streams, switch streams)`.
    pub(crate) fn subscriptions(&self) -> (usize, usize) {
        let s = self.shared.state.lock();
        (s.signal_subs, s.switch_subs)
    }

    /// Waits until the switch stream has been subscribed `n` times in all.
    pub(crate) fn wait_switch_subscriptions(&self, n: usize) {
        self.shared
            .wait_until(&format!("switch subscription {n}"), |s| {
                (s.switch_subs >= n).then_some(())
            });
    }

    /// Waits until `n` reports naming another job have come; returns them in order.
    pub(crate) fn wait_foreign_reports(&self, n: usize) -> Vec<(String, Got)> {
        self.shared
            .wait_until(&format!("{n} reports for another job"), |s| {
                (s.foreign.len() >= n).then(|| s.foreign.clone())
            })
    }

    /// The reports that named another job, in order.
    pub(crate) fn foreign_reports(&self) -> Vec<(String, Got)> {
        self.shared.state.lock().foreign.clone()
    }

    /// ClusterD's answers to the platform so far, one per [`FakeClusterd::switch_nic`].
    pub(crate) fn answers(&self) -> Vec<String> {
        self.shared.state.lock().answers.clone()
    }

    /// One switch as ClusterD runs it (`SwitchNicTrack`): pause, the rank list, continue (if
    /// the switch worked; else `stop_train`), then the job's reset; a pause or continue that
    /// failed ends in `killMaster` and the reset. Returns the one answer the platform gets.
    pub(crate) fn switch_nic(&self, ranks: &[u32], ops: &[bool]) -> String {
        let answer = self.run_switch(ranks, ops);
        self.reset_streams();
        self.shared.update(|s| s.answers.push(answer.clone()));
        answer
    }

    fn run_switch(&self, ranks: &[u32], ops: &[bool]) -> String {
        let uuid = self.pause();
        if self.stop_complete().0 != 0 {
            self.kill_master(&uuid);
            return PAUSE_FAILED.into();
        }
        self.switch(ranks, ops);
        if !self.switch_result() {
            self.stop_train(&format!("{uuid}-stop"));
            let (code, info) = self.stop_complete();
            assert_eq!(code, 0, "stop_train: {info}");
            return SWITCH_FAILED.into();
        }
        self.resume(&uuid);
        if self.recover_status().0 != 0 {
            self.kill_master(&uuid);
            return CONTINUE_FAILED.into();
        }
        SWITCH_FINISHED.into()
    }

    /// Every rule broken so far, and whether a report still sits in a slot nobody will read.
    pub(crate) fn assert_clean(&self) {
        let s = self.shared.state.lock();
        assert!(s.violations.is_empty(), "{:?}", s.violations);
        let stale = [&s.stop_complete, &s.switch_result, &s.recover_status];
        assert!(
            stale.iter().all(|x| x.is_none()),
            "a report nobody asked for waits in its slot: {stale:?}"
        );
        assert!(s.roles.iter().all(|r| r == "taskd"), "{:?}", s.roles);
    }

    /// Waits for a report of the flow under way; fails if the flow was reset meanwhile (the
    /// real ClusterD would never read it).
    fn take(&self, what: &str, slot: fn(&mut State) -> &mut Option<Got>) -> Got {
        let got = self.shared.wait_until(what, |s| {
            if s.flow.is_some_and(|f| f != s.resets) {
                return Some(Err(s.violations.clone()));
            }
            slot(s).take().map(Ok)
        });
        got.unwrap_or_else(|v| {
            panic!("the job's flow was reset while ClusterD waited for {what}; violations: {v:?}")
        })
    }

    fn expect_empty(&self, what: &str, slot: fn(&mut State) -> &mut Option<Got>) {
        let mut s = self.shared.state.lock();
        if let Some(stale) = slot(&mut s).clone() {
            s.violations.push(format!(
                "{what}: {stale:?} waited in its slot before the request"
            ));
        }
    }

    /// Kills it: every connection closes at once, as when ClusterD's pod dies.
    pub(crate) fn kill(mut self) -> SocketAddr {
        if let Some(rt) = self.runtime.take() {
            // Drops every task (the listener, the connections) before returning, so the port
            // can be bound again.
            rt.shutdown_timeout(Duration::from_secs(5));
        }
        self.addr
    }
}

impl Drop for FakeClusterd {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

async fn keep_alive(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(KEEP_ALIVE);
    loop {
        tick.tick().await;
        let s = shared.state.lock();
        if let Some(tx) = s.signals.as_ref().filter(|_| !s.mute) {
            let m = ProcessManageSignal {
                job_id: shared.job.clone(),
                signal_type: "keep-alive".into(),
                ..ProcessManageSignal::default()
            };
            let _ = tx.send(Ok(m));
        }
    }
}
