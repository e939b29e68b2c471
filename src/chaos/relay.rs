//! A fault relay: simulated network failure between two processes on loopback. A TCP relay
//! (on a runtime of its own) that passes bytes both ways until told to cut the link (every
//! connection dropped, new ones refused), to blackhole it (connections accepted and kept,
//! no byte passed until it heals: a partition TCP would ride out) or to heal.
//!
//! It is not a network: it cannot lose or reorder single packets, only stop the flow.

use std::io;
use std::net::SocketAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the relay does with traffic now.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum LinkMode {
    /// Bytes pass both ways.
    Pass,
    /// Every connection is dropped and new ones are closed at once.
    Cut,
    /// Connections are accepted and kept; bytes are held until the link heals.
    Blackhole,
}

/// A running relay from [`FaultRelay::addr`] to its target; stops when dropped.
pub struct FaultRelay {
    addr: SocketAddr,
    mode: watch::Sender<LinkMode>,
    rt: Option<tokio::runtime::Runtime>,
}

impl FaultRelay {
    /// Listens on a free loopback port and relays every connection to `target`.
    pub fn start(target: SocketAddr) -> io::Result<FaultRelay> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("chaos-relay")
            .enable_all()
            .build()?;
        let listener = rt.block_on(TcpListener::bind("127.0.0.1:0"))?;
        let addr = listener.local_addr()?;
        let (mode, rx) = watch::channel(LinkMode::Pass);
        rt.spawn(accept_loop(listener, target, rx));
        Ok(FaultRelay {
            addr,
            mode,
            rt: Some(rt),
        })
    }

    /// Where to connect instead of the target.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The mode now.
    pub fn mode(&self) -> LinkMode {
        *self.mode.borrow()
    }

    /// Switches the link to `mode`.
    pub fn set(&self, mode: LinkMode) {
        tracing::debug!(relay = %self.addr, ?mode, "fault relay");
        self.mode.send_replace(mode);
    }
}

impl Drop for FaultRelay {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

async fn accept_loop(listener: TcpListener, target: SocketAddr, mode: watch::Receiver<LinkMode>) {
    while let Ok((inbound, _)) = listener.accept().await {
        if *mode.borrow() == LinkMode::Cut {
            drop(inbound);
            continue;
        }
        tokio::spawn(relay(inbound, target, mode.clone()));
    }
}

/// One connection, both ways, until either side closes or the link is cut.
async fn relay(inbound: TcpStream, target: SocketAddr, mode: watch::Receiver<LinkMode>) {
    let Ok(outbound) = TcpStream::connect(target).await else {
        return;
    };
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    let (ir, iw) = inbound.into_split();
    let (or, ow) = outbound.into_split();
    // The first direction to end ends both: dropping the halves closes the sockets.
    tokio::select! {
        _ = pipe(ir, ow, mode.clone()) => {}
        _ = pipe(or, iw, mode) => {}
    }
}

/// Copies `from` to `to`, holding bytes while blackholed; returns on a close, an error or a
/// cut.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut mode: watch::Receiver<LinkMode>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = tokio::select! {
            r = from.read(&mut buf) => match r {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            changed = mode.changed() => {
                if changed.is_err() || *mode.borrow() == LinkMode::Cut {
                    return;
                }
                continue;
            }
        };
        loop {
            match *mode.borrow_and_update() {
                LinkMode::Cut => return,
                LinkMode::Pass => break,
                LinkMode::Blackhole => {}
            }
            if mode.changed().await.is_err() {
                return;
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{ErrorKind, Read, Write};
    use std::time::Duration;

    /// An echo server on loopback; its address.
    fn echo() -> SocketAddr {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { return };
                std::thread::spawn(move || {
                    let mut b = [0u8; 64];
                    while let Ok(n) = s.read(&mut b) {
                        if n == 0 || s.write_all(&b[..n]).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    fn client(r: &FaultRelay) -> std::net::TcpStream {
        let c = std::net::TcpStream::connect(r.addr()).unwrap();
        // A bound on a test that would otherwise hang, not a wait for an event.
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        c
    }

    fn round_trip(c: &mut std::net::TcpStream, msg: &[u8]) -> Vec<u8> {
        c.write_all(msg).unwrap();
        let mut got = vec![0u8; msg.len()];
        c.read_exact(&mut got).unwrap();
        got
    }

    #[test]
    fn passes_bytes_both_ways() {
        let r = FaultRelay::start(echo()).unwrap();
        let mut c = client(&r);
        assert_eq!(round_trip(&mut c, b"hello"), b"hello");
    }

    #[test]
    fn a_cut_drops_connections_and_refuses_new_ones_until_healed() {
        let r = FaultRelay::start(echo()).unwrap();
        let mut c = client(&r);
        assert_eq!(round_trip(&mut c, b"a"), b"a");
        r.set(LinkMode::Cut);
        let mut b = [0u8; 1];
        // The relay closes the connection: a read ends (0 bytes or a reset).
        let closed = match c.read(&mut b) {
            Ok(0) => true,
            Err(e) => e.kind() != ErrorKind::WouldBlock && e.kind() != ErrorKind::TimedOut,
            Ok(_) => false,
        };
        assert!(closed, "the cut connection stays open");
        let mut n = client(&r);
        let _ = n.write_all(b"x");
        assert!(
            matches!(n.read(&mut b), Ok(0) | Err(_)),
            "a new connection passed"
        );
        r.set(LinkMode::Pass);
        let mut c = client(&r);
        assert_eq!(round_trip(&mut c, b"healed"), b"healed");
    }

    #[test]
    fn a_blackhole_holds_bytes_until_healed() {
        let r = FaultRelay::start(echo()).unwrap();
        let mut c = client(&r);
        assert_eq!(round_trip(&mut c, b"1"), b"1");
        r.set(LinkMode::Blackhole);
        c.set_nonblocking(true).unwrap();
        c.write_all(b"held").unwrap();
        let mut b = [0u8; 4];
        // Nothing is readable while blackholed (the echo never saw the bytes).
        assert_eq!(
            c.read(&mut b).map_err(|e| e.kind()),
            Err(ErrorKind::WouldBlock)
        );
        c.set_nonblocking(false).unwrap();
        r.set(LinkMode::Pass);
        c.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"held");
        assert_eq!(r.mode(), LinkMode::Pass);
    }
}
