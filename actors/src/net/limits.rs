//! The connections a server accepts (the transport's port, the control port): bounded per
//! client address and in all, each given a deadline to complete its TLS handshake and first
//! request, within a budget of file descriptors that leaves some to the process itself, and
//! with accept errors backed off instead of spun on.
//!
//! Without it, idle TCP connections (no TLS bytes, no request: nothing the token or the
//! registration ever sees) were kept for ever: at the descriptor limit the control API
//! answered nobody, the manager spun on `accept` (`EMFILE` is retried at once), and a
//! restarted proxy could not register, its node lost.
//!
//! A connection is *pending* until its first request (a registration on the transport, an
//! authenticated call on the control port, [`Connections::served`]); a pending one that
//! reaches its deadline is closed. When a client address holds its limit of connections, a
//! new one closes that client's oldest pending connection to take its place, or is refused
//! when all of them are past their first request; the total limit works the same way across
//! clients. So a peer whose address is shared with a client that opens connections and sends
//! nothing (the same host, a NAT) still gets in, and registered peers are never closed for a
//! newcomer.
//!
//! The listener feeds tonic's `serve_with_incoming` through [`incoming`]: the accept loop runs
//! in a task of its own, and each connection is a [`Limited`] stream whose reads fail once its
//! deadline passes or it is closed for a newcomer (its task is woken for that).

use crate::telemetry;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::future::Future as _;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// File descriptors a process keeps out of its servers' budget: its journal and lock, its
/// listeners, runtimes, process watches, outgoing connections, metrics.
pub const FD_RESERVE: u64 = 64;

/// How long a new connection has to complete its handshake and first request by default:
/// the transport's registration timeout.
pub const FIRST_REQUEST: Duration = Duration::from_secs(10);

/// The longest an accept loop waits after the system refused it a descriptor (`EMFILE`,
/// `ENFILE`, out of memory) before it tries again; it starts at 10 ms and doubles.
pub(crate) const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// How many connections a server holds and how long a new one may wait for its first
/// request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnLimits {
    /// Connections one client address may hold at once.
    pub per_client: usize,
    /// Connections the server holds at once.
    pub total: usize,
    /// How long a new connection has to complete its TLS handshake and first request.
    pub first_request: Duration,
}

/// The descriptors this process may give its servers' connections: its limit (`RLIMIT_NOFILE`)
/// less [`FD_RESERVE`].
pub fn fd_budget() -> u64 {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(1 << 20);
    limit.saturating_sub(FD_RESERVE).max(16)
}

impl ConnLimits {
    /// A transport port for `peers` peers (a manager's proxies, a proxy's workers): each
    /// address may hold as many connections as there are peers, and a few more (every peer
    /// may share one address); twice as many in all, within three quarters of the
    /// [`fd_budget`] (the rest is the control port's). Warns when the budget leaves less than
    /// one connection a peer.
    pub fn transport(port: &str, peers: usize) -> ConnLimits {
        let budget = (fd_budget() * 3 / 4) as usize;
        if budget < peers {
            tracing::warn!(
                port,
                peers,
                connections = budget,
                "the process's file descriptor limit leaves room for fewer connections than peers: raise it (ulimit -n, LimitNOFILE)"
            );
        }
        ConnLimits {
            per_client: peers + 8,
            total: (2 * peers + 64).min(budget),
            first_request: FIRST_REQUEST,
        }
    }

    /// The control port: 16 connections an address, 256 in all, within a quarter of the
    /// [`fd_budget`].
    pub fn control() -> ConnLimits {
        ConnLimits {
            per_client: 16,
            total: 256.min((fd_budget() / 4) as usize).max(16),
            first_request: FIRST_REQUEST,
        }
    }
}

/// Why a connection was closed or refused, as the metric counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Closed {
    /// Its client address held its limit of connections, none of them pending.
    PerClient,
    /// The server held its limit of connections, none of them pending.
    Total,
    /// It was pending and a newer connection took its place.
    Evicted,
    /// It did not complete its handshake and first request in time.
    Deadline,
}

impl Closed {
    fn as_str(self) -> &'static str {
        match self {
            Closed::PerClient => "per_client",
            Closed::Total => "total",
            Closed::Evicted => "evicted",
            Closed::Deadline => "deadline",
        }
    }
}

/// What a connection and its table share: whether it is past its first request, whether it
/// was closed for a newcomer, and the task to wake when it is.
#[derive(Default)]
struct Shared {
    served: AtomicBool,
    closed: AtomicBool,
    waker: Mutex<Option<Waker>>,
}

impl Shared {
    fn close(&self) {
        self.closed.store(true, Ordering::Release);
        if let Some(w) = self.waker.lock().take() {
            w.wake();
        }
    }
}

struct Entry {
    client: IpAddr,
    peer: SocketAddr,
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Table {
    next: u64,
    /// Every open connection by its id (ids grow: the smallest is the oldest).
    open: HashMap<u64, Entry>,
    by_peer: HashMap<SocketAddr, u64>,
    per_client: HashMap<IpAddr, usize>,
}

impl Table {
    fn remove(&mut self, id: u64) -> Option<Entry> {
        let e = self.open.remove(&id)?;
        self.by_peer.remove(&e.peer);
        if let Some(n) = self.per_client.get_mut(&e.client) {
            *n -= 1;
            if *n == 0 {
                self.per_client.remove(&e.client);
            }
        }
        Some(e)
    }

    /// The oldest pending connection (of `client`, when given).
    fn oldest_pending(&self, client: Option<IpAddr>) -> Option<u64> {
        self.open
            .iter()
            .filter(|(_, e)| client.map_or(true, |c| e.client == c))
            .filter(|(_, e)| !e.shared.served.load(Ordering::Acquire))
            .map(|(id, _)| *id)
            .min()
    }
}

/// The open connections of one server and its limits.
pub(crate) struct Connections {
    port: &'static str,
    limits: ConnLimits,
    table: Mutex<Table>,
}

impl Connections {
    pub(crate) fn new(port: &'static str, limits: ConnLimits) -> Arc<Connections> {
        Arc::new(Connections {
            port,
            limits,
            table: Mutex::new(Table::default()),
        })
    }

    fn count(&self, why: Closed) {
        metrics::counter!(telemetry::CONNECTIONS_CLOSED_TOTAL, "port" => self.port, "why" => why.as_str())
            .increment(1);
    }

    /// Takes `io` from `peer` in, closing an older pending connection to make room when a
    /// limit is reached; `None` (and `io` closed) when there is no room.
    fn admit(self: &Arc<Self>, io: TcpStream, peer: SocketAddr) -> Option<Limited> {
        let client = peer.ip();
        let mut t = self.table.lock();
        let mine = t.per_client.get(&client).copied().unwrap_or(0);
        if mine >= self.limits.per_client {
            let Some(old) = t.oldest_pending(Some(client)) else {
                drop(t);
                self.count(Closed::PerClient);
                tracing::debug!(port = self.port, %peer, "connection refused: its address holds its limit");
                return None;
            };
            self.evict(&mut t, old);
        }
        if t.open.len() >= self.limits.total {
            let Some(old) = t.oldest_pending(None) else {
                drop(t);
                self.count(Closed::Total);
                tracing::warn!(port = self.port, %peer, limit = self.limits.total, "connection refused: the server holds its limit of connections");
                return None;
            };
            self.evict(&mut t, old);
        }
        let id = t.next;
        t.next += 1;
        let shared = Arc::new(Shared::default());
        t.open.insert(
            id,
            Entry {
                client,
                peer,
                shared: shared.clone(),
            },
        );
        t.by_peer.insert(peer, id);
        *t.per_client.entry(client).or_default() += 1;
        let open = t.open.len();
        drop(t);
        metrics::gauge!(telemetry::CONNECTIONS_OPEN, "port" => self.port).set(open as f64);
        Some(Limited {
            io,
            shared,
            deadline: Some(Box::pin(tokio::time::sleep(self.limits.first_request))),
            table: self.clone(),
            id,
        })
    }

    fn evict(&self, t: &mut Table, id: u64) {
        if let Some(e) = t.remove(id) {
            e.shared.close();
            self.count(Closed::Evicted);
            tracing::debug!(port = self.port, peer = %e.peer, "a pending connection closed for a newer one");
        }
    }

    /// The connection from `peer` completed its first request: it is no longer pending (no
    /// deadline, never closed for a newcomer).
    pub(crate) fn served(&self, peer: SocketAddr) {
        let t = self.table.lock();
        if let Some(e) = t.by_peer.get(&peer).and_then(|id| t.open.get(id)) {
            e.shared.served.store(true, Ordering::Release);
        }
    }

    fn release(&self, id: u64) {
        let mut t = self.table.lock();
        t.remove(id);
        let open = t.open.len();
        drop(t);
        metrics::gauge!(telemetry::CONNECTIONS_OPEN, "port" => self.port).set(open as f64);
    }
}

/// One accepted connection within its server's limits (see the module's doc).
pub(crate) struct Limited {
    io: TcpStream,
    shared: Arc<Shared>,
    /// Until its first request.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    table: Arc<Connections>,
    id: u64,
}

impl Limited {
    /// `Err` when the connection was closed for a newcomer or reached its deadline pending;
    /// registers the task to wake for either.
    fn check(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        if self.shared.closed.load(Ordering::Acquire) {
            return Err(io::ErrorKind::ConnectionAborted.into());
        }
        {
            let mut w = self.shared.waker.lock();
            if !w.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *w = Some(cx.waker().clone());
            }
        }
        if self.shared.served.load(Ordering::Acquire) {
            self.deadline = None;
        }
        if let Some(d) = self.deadline.as_mut() {
            if d.as_mut().poll(cx).is_ready() {
                self.deadline = None;
                self.shared.closed.store(true, Ordering::Release);
                self.table.count(Closed::Deadline);
                tracing::debug!(
                    port = self.table.port,
                    peer = ?self.io.peer_addr().ok(),
                    "connection closed: no handshake and first request within {:?}",
                    self.table.limits.first_request
                );
                return Err(io::ErrorKind::TimedOut.into());
            }
        }
        Ok(())
    }
}

impl Drop for Limited {
    fn drop(&mut self) {
        self.table.release(self.id);
    }
}

impl AsyncRead for Limited {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.check(cx)?;
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Limited {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.check(cx)?;
        Pin::new(&mut this.io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

impl Connected for Limited {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.io.connect_info()
    }
}

/// Whether an accept failed because the system has no descriptor or memory to give: trying
/// again at once would spin.
fn out_of_resources(e: &io::Error) -> bool {
    use rustix::io::Errno;
    let Some(raw) = e.raw_os_error() else {
        return false;
    };
    let errno = Errno::from_raw_os_error(raw);
    [Errno::MFILE, Errno::NFILE, Errno::NOBUFS, Errno::NOMEM].contains(&errno)
}

/// How long an accept loop waits after a failed accept: nothing after a connection that
/// went away before it was accepted; after the system refused a descriptor, 10 ms doubling
/// to [`ACCEPT_BACKOFF_MAX`] while it keeps refusing.
#[derive(Debug)]
struct AcceptBackoff {
    next: Duration,
    /// Since when accepts have been refused.
    refused_since: Option<tokio::time::Instant>,
}

impl AcceptBackoff {
    const FIRST: Duration = Duration::from_millis(10);

    fn new() -> Self {
        AcceptBackoff {
            next: Self::FIRST,
            refused_since: None,
        }
    }

    /// The wait after `e` (`None`: try again at once).
    fn failed(&mut self, e: &io::Error) -> Option<Duration> {
        if !out_of_resources(e) {
            return None;
        }
        self.refused_since
            .get_or_insert_with(tokio::time::Instant::now);
        let wait = self.next;
        self.next = (self.next * 2).min(ACCEPT_BACKOFF_MAX);
        Some(wait)
    }

    /// A connection was accepted: how long accepts had been refused before, if they were.
    fn accepted(&mut self) -> Option<Duration> {
        self.next = Self::FIRST;
        self.refused_since.take().map(|t| t.elapsed())
    }
}

/// The connections of `listener` within `table`'s limits, for `serve_with_incoming`: accepted
/// by a task of their own (with `TCP_NODELAY`: a stream of small messages would otherwise wait
/// on delayed acknowledgements), which ends, closing the listener, once the stream is dropped.
pub(crate) fn incoming(
    listener: TcpListener,
    table: Arc<Connections>,
) -> ReceiverStream<io::Result<Limited>> {
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(async move {
        let mut backoff = AcceptBackoff::new();
        loop {
            let accepted = tokio::select! {
                _ = tx.closed() => return,
                a = listener.accept() => a,
            };
            match accepted {
                Ok((io, peer)) => {
                    if let Some(after) = backoff.accepted() {
                        tracing::warn!(port = table.port, ?after, "accepting connections again");
                    }
                    let _ = io.set_nodelay(true);
                    if let Some(conn) = table.admit(io, peer) {
                        if tx.send(Ok(conn)).await.is_err() {
                            return;
                        }
                    }
                }
                Err(e) => match backoff.failed(&e) {
                    Some(wait) => {
                        metrics::counter!(telemetry::ACCEPT_ERRORS_TOTAL, "port" => table.port)
                            .increment(1);
                        if wait == AcceptBackoff::FIRST {
                            tracing::warn!(port = table.port, error = %e, "cannot accept a connection (no descriptor or memory left); retrying with a backoff");
                        }
                        tokio::select! {
                            _ = tx.closed() => return,
                            _ = tokio::time::sleep(wait) => {}
                        }
                    }
                    // The peer gave up before the accept (reset, aborted): the next one.
                    None => tracing::debug!(port = table.port, error = %e, "accept failed"),
                },
            }
        }
    });
    ReceiverStream::new(rx)
}

/// Binds `addr` (port 0 picks a free port): the listener and its address.
pub(crate) async fn bind(addr: SocketAddr) -> io::Result<(TcpListener, SocketAddr)> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    Ok((listener, local))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt as _;
    use tokio_stream::StreamExt as _;

    /// The most a test waits for what its limits make happen within a deadline.
    const PATIENCE: Duration = Duration::from_secs(20);

    fn limits(per_client: usize, total: usize, first_request: Duration) -> ConnLimits {
        ConnLimits {
            per_client,
            total,
            first_request,
        }
    }

    /// A server on a free port of `ip` within `limits`: its address and its connections.
    async fn serve(
        limits: ConnLimits,
    ) -> (
        SocketAddr,
        Arc<Connections>,
        ReceiverStream<io::Result<Limited>>,
    ) {
        let (listener, addr) = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let table = Connections::new("test", limits);
        let conns = incoming(listener, table.clone());
        (addr, table, conns)
    }

    /// A client connection from `from` (any address of the loopback network).
    async fn connect(to: SocketAddr, from: [u8; 4]) -> TcpStream {
        let s = tokio::net::TcpSocket::new_v4().unwrap();
        s.bind(SocketAddr::from((from, 0))).unwrap();
        s.connect(to).await.unwrap()
    }

    /// The next connection the server let in.
    async fn next(conns: &mut ReceiverStream<io::Result<Limited>>) -> Limited {
        tokio::time::timeout(PATIENCE, conns.next())
            .await
            .expect("a connection within the bound")
            .unwrap()
            .unwrap()
    }

    /// What a read on the server's side of `c` ends with (it waits for bytes that never come).
    async fn read_end(mut c: Limited) -> io::ErrorKind {
        let mut b = [0u8; 8];
        let read = tokio::time::timeout(PATIENCE, c.read(&mut b)).await;
        read.expect("the read ended within the bound")
            .unwrap_err()
            .kind()
    }

    /// Whether the server closed the client's connection `c` (its read sees the end).
    async fn closed_by_server(c: &mut TcpStream) -> bool {
        let mut b = [0u8; 8];
        matches!(
            tokio::time::timeout(PATIENCE, c.read(&mut b)).await,
            Ok(Ok(0)) | Ok(Err(_))
        )
    }

    #[tokio::test]
    async fn a_connection_without_a_first_request_is_closed_at_its_deadline() {
        let (addr, table, mut conns) = serve(limits(8, 8, Duration::from_millis(200))).await;
        let mut idle = connect(addr, [127, 0, 0, 1]).await;
        let c = next(&mut conns).await;
        assert_eq!(read_end(c).await, io::ErrorKind::TimedOut);
        assert!(closed_by_server(&mut idle).await);
        assert!(table.table.lock().open.is_empty(), "its slot is free");

        // One past its first request keeps going, deadline or not (here passed at once).
        let (addr, table, mut conns) = serve(limits(8, 8, Duration::ZERO)).await;
        let mut served = connect(addr, [127, 0, 0, 1]).await;
        let mut c = next(&mut conns).await;
        table.served(served.local_addr().unwrap());
        tokio::io::AsyncWriteExt::write_all(&mut served, b"x")
            .await
            .unwrap();
        let mut b = [0u8; 8];
        let read = tokio::time::timeout(PATIENCE, c.read(&mut b)).await;
        assert_eq!(read.expect("within the bound").unwrap(), 1, "not timed out");
        let _pending = connect(addr, [127, 0, 0, 1]).await;
        let c = next(&mut conns).await;
        assert_eq!(read_end(c).await, io::ErrorKind::TimedOut);
    }

    #[tokio::test]
    async fn a_client_at_its_limit_gives_up_its_oldest_pending_connection_for_a_new_one() {
        let (addr, table, mut conns) = serve(limits(2, 100, PATIENCE)).await;
        let _first = connect(addr, [127, 0, 0, 1]).await;
        let first = next(&mut conns).await;
        let second_client = connect(addr, [127, 0, 0, 1]).await;
        let second = next(&mut conns).await;
        table.served(second_client.local_addr().unwrap());
        let _third = connect(addr, [127, 0, 0, 1]).await;
        let third = next(&mut conns).await;
        assert_eq!(read_end(first).await, io::ErrorKind::ConnectionAborted);
        // Both left are the client's limit: the served one stays, the pending one goes.
        let _fourth = connect(addr, [127, 0, 0, 1]).await;
        let fourth = next(&mut conns).await;
        assert_eq!(read_end(third).await, io::ErrorKind::ConnectionAborted);
        // Another address has its own limit.
        let _other = connect(addr, [127, 0, 0, 2]).await;
        let other = next(&mut conns).await;
        // Every connection of the client past its first request: a new one is refused.
        table.table.lock().open.values().for_each(|e| {
            e.shared.served.store(true, Ordering::Release);
        });
        let mut refused = connect(addr, [127, 0, 0, 1]).await;
        assert!(closed_by_server(&mut refused).await, "refused");
        let t = table.table.lock();
        assert_eq!(t.per_client[&IpAddr::from([127, 0, 0, 1])], 2);
        assert_eq!(t.open.len(), 3);
        drop(t);
        drop((second, fourth, other));
    }

    #[tokio::test]
    async fn the_server_at_its_total_gives_up_its_oldest_pending_connection() {
        let (addr, table, mut conns) = serve(limits(10, 2, PATIENCE)).await;
        let a = connect(addr, [127, 0, 0, 1]).await;
        let ca = next(&mut conns).await;
        table.served(a.local_addr().unwrap());
        let _b = connect(addr, [127, 0, 0, 2]).await;
        let cb = next(&mut conns).await;
        let _c = connect(addr, [127, 0, 0, 3]).await;
        let cc = next(&mut conns).await;
        assert_eq!(read_end(cb).await, io::ErrorKind::ConnectionAborted);
        table.served(_c.local_addr().unwrap());
        let mut d = connect(addr, [127, 0, 0, 4]).await;
        assert!(
            closed_by_server(&mut d).await,
            "no pending one left to give up"
        );
        drop((ca, cc));
    }

    #[test]
    fn a_refused_descriptor_is_backed_off_and_a_vanished_peer_is_not() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _guard = rt.enter();
        let mut b = AcceptBackoff::new();
        let aborted = io::Error::from(io::ErrorKind::ConnectionAborted);
        assert_eq!(b.failed(&aborted), None, "the next peer at once");
        let emfile = io::Error::from_raw_os_error(rustix::io::Errno::MFILE.raw_os_error());
        let waits: Vec<Duration> = (0..10).map(|_| b.failed(&emfile).unwrap()).collect();
        assert_eq!(waits[0], Duration::from_millis(10));
        assert_eq!(waits[1], Duration::from_millis(20));
        assert_eq!(*waits.last().unwrap(), ACCEPT_BACKOFF_MAX);
        let enfile = io::Error::from_raw_os_error(rustix::io::Errno::NFILE.raw_os_error());
        assert!(b.failed(&enfile).is_some());
        assert!(b.accepted().is_some(), "says how long it lasted");
        assert_eq!(b.failed(&emfile), Some(Duration::from_millis(10)), "reset");
    }

    #[test]
    fn the_ports_share_the_descriptor_budget() {
        let budget = fd_budget() as usize;
        let t = ConnLimits::transport("test", 4);
        let c = ConnLimits::control();
        assert!(t.total <= budget * 3 / 4 && c.total <= budget / 4 + 16);
        assert_eq!(t.per_client, 12);
        assert_eq!(c.first_request, FIRST_REQUEST);
    }
}
