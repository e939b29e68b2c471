//! A fake ClusterD for the tests: the part of ClusterD's `Recover` service a job's manager calls
//! (tonic, in-process, on port 0 or a given address), keeping the rules of the real one:
//!
//! - `Init` answers 0 for the job; `Register` answers 408 before `Init`; the subscriptions fail
//!   with "not registed" before `Register`.
//! - A keep-alive on the signal stream every few milliseconds.
//! - Each report goes into a one-slot buffer; a report that arrives while its slot is full is a
//!   violation (the real ClusterD would hand it to the next switch as that switch's answer),
//!   and so is a report found in its slot when ClusterD sends the request it answers.
//! - The whole switch as ClusterD runs it: `pause_train` with a new uuid, the `SwitchRankList`,
//!   `continue` with the pause's uuid, then both streams end (the job's reset); the manager
//!   must subscribe again from `Init`.
//!
//! Tests wait on its events (subscriptions, reports) with a bound, never by sleeping.

#![allow(dead_code)]

use parking_lot::{Condvar, Mutex};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use taskd::actors::clusterd::proto::recover_server::{Recover, RecoverServer};
use taskd::actors::clusterd::proto::{
    ClientInfo, ProcessManageSignal, RecoverStatusRequest, Status, StopCompleteRequest,
    SwitchRankList, SwitchResult,
};
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Request, Response};

/// How long a test waits for an event of the fake before it fails.
pub(crate) const WAIT: Duration = Duration::from_secs(30);
/// How often the fake sends a keep-alive.
const KEEP_ALIVE: Duration = Duration::from_millis(25);

type Sender<T> = UnboundedSender<Result<T, tonic::Status>>;

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
    violations: Vec<String>,
    roles: Vec<String>,
}

struct Shared {
    job: String,
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

    /// Puts a report into its slot; a full slot is a violation.
    fn report(&self, slot: fn(&mut State) -> &mut Option<Got>, name: &str, got: Got) {
        self.update(|s| {
            let place = slot(s);
            if let Some(old) = place {
                let v = format!("a second {name} ({got:?}) while the slot holds {old:?}");
                s.violations.push(v);
            } else {
                *place = Some(got);
            }
        });
    }
}

struct Svc(Arc<Shared>);

impl Svc {
    /// A subscription: refused with ClusterD's "not registed" before `Register`, else the
    /// new stream replaces the old one (`keep` records its sender).
    fn subscribe<T>(
        &self,
        r: Request<ClientInfo>,
        keep: impl FnOnce(&mut State, Sender<T>),
    ) -> Result<Response<Stream<T>>, tonic::Status> {
        let job = r.into_inner().job_id;
        let (tx, rx) = unbounded_channel();
        let registered = self.0.update(|s| {
            if s.registered {
                keep(s, tx);
            }
            s.registered
        });
        if !registered {
            return Err(tonic::Status::unknown(format!("jobId={job} not registed")));
        }
        Ok(Response::new(UnboundedReceiverStream::new(rx)))
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

type Stream<T> = UnboundedReceiverStream<Result<T, tonic::Status>>;

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

    type SubscribeProcessManageSignalStream = Stream<ProcessManageSignal>;

    async fn subscribe_process_manage_signal(
        &self,
        r: Request<ClientInfo>,
    ) -> Result<Response<Self::SubscribeProcessManageSignalStream>, tonic::Status> {
        self.subscribe(r, |s, tx| {
            s.signals = Some(tx);
            s.signal_subs += 1;
        })
    }

    type SubscribeNotifySwitchStream = Stream<SwitchRankList>;

    async fn subscribe_notify_switch(
        &self,
        r: Request<ClientInfo>,
    ) -> Result<Response<Self::SubscribeNotifySwitchStream>, tonic::Status> {
        self.subscribe(r, |s, tx| {
            s.switches = Some(tx);
            s.switch_subs += 1;
        })
    }

    async fn report_stop_complete(
        &self,
        r: Request<StopCompleteRequest>,
    ) -> Result<Response<Status>, tonic::Status> {
        let got = status_got(r.into_inner().status);
        self.0
            .report(|s| &mut s.stop_complete, "ReportStopComplete", got);
        ok("receive ReportStopComplete")
    }

    async fn reply_switch_nic_result(
        &self,
        r: Request<SwitchResult>,
    ) -> Result<Response<Status>, tonic::Status> {
        let got = Got::Switch(r.into_inner().result);
        self.0
            .report(|s| &mut s.switch_result, "ReplySwitchNicResult", got);
        ok("reply success")
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
        self.0
            .report(|s| &mut s.recover_status, "ReportRecoverStatus", got);
        ok("receive ReportRecoverStatus")
    }
}

/// A running fake ClusterD. Dropping it kills it (every connection closes at once).
pub(crate) struct FakeClusterd {
    addr: SocketAddr,
    shared: Arc<Shared>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl FakeClusterd {
    /// A fake ClusterD for `job` on a free port of 127.0.0.1.
    pub(crate) fn start(job: &str) -> FakeClusterd {
        FakeClusterd::start_at(job, "127.0.0.1:0".parse().unwrap())
    }

    /// A fake ClusterD for `job` at `addr` (a restart on the port of one that was killed).
    pub(crate) fn start_at(job: &str, addr: SocketAddr) -> FakeClusterd {
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

    /// Sends a `ProcessManageSignal` on the current signal stream.
    pub(crate) fn signal(&self, signal_type: &str, actions: &[&str], strategy: &str, uuid: &str) {
        let m = ProcessManageSignal {
            uuid: uuid.into(),
            job_id: self.shared.job.clone(),
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
    /// slot); returns the uuid.
    pub(crate) fn pause(&self) -> String {
        // Random, as ClusterD's own event ids: a restarted ClusterD never repeats one.
        let uuid = uuid::Uuid::new_v4().simple().to_string();
        self.expect_empty("stop_complete", |s| &mut s.stop_complete);
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

    /// Ends both streams, as ClusterD does after every switch (the job's reset).
    pub(crate) fn reset_streams(&self) {
        self.shared.update(|s| {
            s.signals = None;
            s.switches = None;
        });
    }

    /// Ends the switch stream only.
    pub(crate) fn cut_switch_stream(&self) {
        self.shared.update(|s| s.switches = None);
    }

    /// One switch as ClusterD runs it: pause, the rank list, continue (if the switch worked;
    /// else `stop_train`), then the job's reset. Returns the switch result.
    pub(crate) fn switch_nic(&self, ranks: &[u32], ops: &[bool]) -> bool {
        let uuid = self.pause();
        let (code, info) = self.stop_complete();
        assert_eq!(code, 0, "the pause failed: {info}");
        self.switch(ranks, ops);
        let ok = self.switch_result();
        if ok {
            self.resume(&uuid);
            let (code, info) = self.recover_status();
            assert_eq!(code, 0, "continue failed: {info}");
        } else {
            self.stop_train(&format!("{uuid}-stop"));
            let (code, info) = self.stop_complete();
            assert_eq!(code, 0, "stop_train: {info}");
        }
        self.reset_streams();
        ok
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

    fn take(&self, what: &str, slot: fn(&mut State) -> &mut Option<Got>) -> Got {
        self.shared.wait_until(what, |s| slot(s).take())
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
        if let Some(tx) = &s.signals {
            let m = ProcessManageSignal {
                signal_type: "keep-alive".into(),
                ..ProcessManageSignal::default()
            };
            let _ = tx.send(Ok(m));
        }
    }
}
