//! The active probe of one plane: a train of ICMP echo requests to each of the job's peers on
//! that plane, sent from the plane's interface (`SO_BINDTODEVICE` on a raw ICMP socket), and
//! what came back: how many answers were lost and how late the slowest came.
//!
//! The requests of a train leave back to back, so on a link that is up but starved the last
//! ones wait behind the first: the slowest answer measures the train's time through the link
//! (for `count` requests of `size` bytes, at least `count x size / rate`), which a lone ping
//! on an idle link does not show.
//!
//! A plane is degraded when more than half of its peers answer past a threshold: a path
//! through one starved peer's link is that peer's problem, not this node's (with one peer, the
//! two cannot be told apart and both ends see it).

use crate::config::ProbeConfig;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::collections::HashMap;
use std::io::Read;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

/// The probe could not run.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// No raw ICMP socket: the process lacks `CAP_NET_RAW`.
    #[error("cannot open a raw ICMP socket (the proxy needs CAP_NET_RAW): {0}")]
    Socket(std::io::Error),
    /// The socket cannot be bound to the interface.
    #[error("cannot send from interface {iface}: {source}")]
    Bind {
        /// The interface.
        iface: String,
        /// Why.
        source: std::io::Error,
    },
    /// A request could not be sent.
    #[error("cannot send an echo request to {peer} from {iface}: {source}")]
    Send {
        /// The peer.
        peer: Ipv4Addr,
        /// The interface.
        iface: String,
        /// Why.
        source: std::io::Error,
    },
}

/// What one train to every peer saw, peer by peer.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct ProbeStats {
    /// Each peer's train.
    pub peers: Vec<(Ipv4Addr, PeerStats)>,
}

impl ProbeStats {
    /// `None` when the plane is healthy (at most half of its peers past a threshold);
    /// otherwise why it is degraded.
    pub fn verdict(&self, cfg: &ProbeConfig) -> Option<String> {
        let bad: Vec<String> = self
            .peers
            .iter()
            .filter_map(|(peer, s)| s.verdict(cfg).map(|why| format!("{peer}: {why}")))
            .collect();
        if bad.is_empty() || bad.len() * 2 <= self.peers.len() {
            return None;
        }
        Some(format!(
            "{}/{} peers: {}",
            bad.len(),
            self.peers.len(),
            bad.join("; ")
        ))
    }
}

/// What one peer's train saw.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct PeerStats {
    /// Requests sent.
    pub sent: u32,
    /// Answers received in time.
    pub received: u32,
    /// The slowest answer's round-trip time (zero when none came).
    pub max_rtt: Duration,
}

impl PeerStats {
    /// The share of requests not answered in time.
    pub fn loss(&self) -> f64 {
        if self.sent == 0 {
            return 0.0;
        }
        f64::from(self.sent - self.received) / f64::from(self.sent)
    }

    /// `None` when the answers are within the thresholds; otherwise why not.
    pub fn verdict(&self, cfg: &ProbeConfig) -> Option<String> {
        let loss = self.loss();
        let rtt_ms = self.max_rtt.as_secs_f64() * 1000.0;
        if loss > cfg.max_loss {
            return Some(format!(
                "probe lost {}/{} echoes ({:.0}% > {:.0}%)",
                self.sent - self.received,
                self.sent,
                loss * 100.0,
                cfg.max_loss * 100.0
            ));
        }
        if rtt_ms > cfg.max_rtt_ms {
            return Some(format!(
                "probe's slowest echo took {rtt_ms:.1} ms (> {} ms)",
                cfg.max_rtt_ms
            ));
        }
        None
    }
}

/// The Internet checksum (RFC 1071) of `data`.
pub fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for pair in data.chunks(2) {
        let word = u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)]);
        sum += u32::from(word);
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// An ICMP echo request with `size` bytes of payload.
pub fn echo_request(id: u16, seq: u16, size: u16) -> Vec<u8> {
    let mut p = vec![8, 0, 0, 0];
    p.extend_from_slice(&id.to_be_bytes());
    p.extend_from_slice(&seq.to_be_bytes());
    p.extend((0..size).map(|i| (i % 251) as u8));
    let c = checksum(&p);
    p[2..4].copy_from_slice(&c.to_be_bytes());
    p
}

/// The source and sequence number of an echo reply to `id` in a raw IPv4 packet.
pub fn parse_reply(packet: &[u8], id: u16) -> Option<(Ipv4Addr, u16)> {
    let ihl = usize::from(*packet.first()? & 0x0f) * 4;
    if packet.len() < ihl + 8 || ihl < 20 || packet[9] != 1 {
        return None;
    }
    let src = Ipv4Addr::new(packet[12], packet[13], packet[14], packet[15]);
    let icmp = &packet[ihl..];
    let (kind, code) = (icmp[0], icmp[1]);
    let got_id = u16::from_be_bytes([icmp[4], icmp[5]]);
    if kind != 0 || code != 0 || got_id != id {
        return None;
    }
    Some((src, u16::from_be_bytes([icmp[6], icmp[7]])))
}

static NEXT_ID: AtomicU16 = AtomicU16::new(0);

/// Sends a train of `cfg.count` requests to each peer from `iface` and collects the answers
/// for up to `cfg.timeout_ms`.
pub fn probe(iface: &str, peers: &[Ipv4Addr], cfg: &ProbeConfig) -> Result<ProbeStats, ProbeError> {
    let sock =
        Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::ICMPV4)).map_err(ProbeError::Socket)?;
    sock.bind_device(Some(iface.as_bytes()))
        .map_err(|source| ProbeError::Bind {
            iface: iface.to_owned(),
            source,
        })?;
    let id = (std::process::id() as u16) ^ NEXT_ID.fetch_add(0x9e37, Ordering::Relaxed);
    let mut sent_at: HashMap<(Ipv4Addr, u16), Instant> = HashMap::new();
    for (p, peer) in peers.iter().enumerate() {
        let to = SockAddr::from(SocketAddrV4::new(*peer, 0));
        for i in 0..cfg.count {
            let seq = (p as u16).wrapping_mul(cfg.count).wrapping_add(i);
            sock.send_to(&echo_request(id, seq, cfg.size), &to)
                .map_err(|source| ProbeError::Send {
                    peer: *peer,
                    iface: iface.to_owned(),
                    source,
                })?;
            sent_at.insert((*peer, seq), Instant::now());
        }
    }
    let mut stats: HashMap<Ipv4Addr, PeerStats> = HashMap::new();
    for (peer, _) in sent_at.keys() {
        stats.entry(*peer).or_default().sent += 1;
    }
    collect(
        &sock,
        id,
        sent_at,
        Duration::from_millis(cfg.timeout_ms),
        &mut stats,
    );
    Ok(ProbeStats {
        peers: peers
            .iter()
            .map(|p| (*p, stats.get(p).cloned().unwrap_or_default()))
            .collect(),
    })
}

/// Reads answers until every request was answered or `timeout` passed.
fn collect(
    sock: &Socket,
    id: u16,
    mut waiting: HashMap<(Ipv4Addr, u16), Instant>,
    timeout: Duration,
    stats: &mut HashMap<Ipv4Addr, PeerStats>,
) {
    let end = Instant::now() + timeout;
    let mut buf = vec![0u8; 65_536];
    let mut reader = sock;
    while !waiting.is_empty() {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() || reader.set_read_timeout(Some(left)).is_err() {
            break;
        }
        let Ok(n) = reader.read(&mut buf) else { break };
        if let Some(key) = parse_reply(&buf[..n], id) {
            if let Some(at) = waiting.remove(&key) {
                let s = stats.entry(key.0).or_default();
                s.received += 1;
                s.max_rtt = s.max_rtt.max(at.elapsed());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> ProbeConfig {
        ProbeConfig {
            primary_peers: vec![],
            backup_peers: vec![],
            count: 8,
            size: 1400,
            timeout_ms: 100,
            max_loss: 0.25,
            max_rtt_ms: 20.0,
        }
    }

    #[test]
    fn a_request_checks_out_and_a_reply_is_read_back() {
        let req = echo_request(0x1234, 7, 33);
        assert_eq!(req.len(), 8 + 33);
        assert_eq!(checksum(&req), 0, "a packet with its checksum sums to zero");
        // The same packet as a reply inside an IPv4 header from 10.0.0.2.
        let mut reply = vec![
            0x45, 0, 0, 0, 0, 0, 0, 0, 64, 1, 0, 0, 10, 0, 0, 2, 10, 0, 0, 1,
        ];
        let mut icmp = req.clone();
        icmp[0] = 0;
        reply.extend_from_slice(&icmp);
        assert_eq!(
            parse_reply(&reply, 0x1234),
            Some((Ipv4Addr::new(10, 0, 0, 2), 7))
        );
        assert_eq!(parse_reply(&reply, 0x1235), None, "another prober's reply");
        reply[20] = 8;
        assert_eq!(parse_reply(&reply, 0x1234), None, "a request is no reply");
        assert_eq!(parse_reply(&reply[..22], 0x1234), None, "cut short");
    }

    #[test]
    fn loss_and_the_slowest_answer_make_the_verdict() {
        let stats = |received, ms| PeerStats {
            sent: 8,
            received,
            max_rtt: Duration::from_millis(ms),
        };
        assert_eq!(stats(8, 3).verdict(&cfg()), None);
        assert_eq!(
            stats(6, 3).verdict(&cfg()),
            None,
            "25% is not more than 25%"
        );
        let lost = stats(5, 3).verdict(&cfg()).unwrap();
        assert_eq!(lost, "probe lost 3/8 echoes (38% > 25%)");
        let slow = stats(8, 45).verdict(&cfg()).unwrap();
        assert_eq!(slow, "probe's slowest echo took 45.0 ms (> 20 ms)");
        assert_eq!(stats(0, 0).loss(), 1.0);
    }

    #[test]
    fn a_plane_is_degraded_when_most_of_its_peers_are() {
        let peer = |n, ms| {
            let s = PeerStats {
                sent: 8,
                received: 8,
                max_rtt: Duration::from_millis(ms),
            };
            (Ipv4Addr::new(10, 0, 0, n), s)
        };
        let plane = |peers| ProbeStats { peers };
        assert_eq!(
            plane(vec![peer(2, 1), peer(3, 90)]).verdict(&cfg()),
            None,
            "one of two"
        );
        let two = plane(vec![peer(2, 1), peer(3, 90), peer(4, 60)])
            .verdict(&cfg())
            .unwrap();
        assert!(
            two.starts_with("2/3 peers: 10.0.0.3: probe's slowest echo took 90.0 ms"),
            "{two}"
        );
        let one = plane(vec![peer(3, 90)]).verdict(&cfg()).unwrap();
        assert!(one.starts_with("1/1 peers"), "{one}");
        assert_eq!(plane(vec![]).verdict(&cfg()), None);
    }
}
