//! The kernel's link events: a `NETLINK_ROUTE` socket subscribed to `RTMGRP_LINK`, so a carrier
//! that goes (or comes back) is known when the kernel knows it, not at the next probe round.
//!
//! [`watch`] runs a thread that reads `RTM_NEWLINK` / `RTM_DELLINK` messages and calls back with
//! the name of each watched interface they concern. What the callback then reads (`operstate`,
//! `carrier`) is the same sysfs as a probe round's: the event only says *when* to look. The
//! probe stays for what the kernel cannot see (a starved or lossy link).

use std::collections::BTreeSet;
use std::io;

/// `RTMGRP_LINK`: the multicast group of link changes.
const RTMGRP_LINK: u32 = 1;
const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
const IFLA_IFNAME: u16 = 3;
/// `struct nlmsghdr`.
const NLMSG_HDR: usize = 16;
/// `struct ifinfomsg`.
const IFINFO: usize = 16;
/// `IFF_LOWER_UP` of `ifi_flags`: the carrier.
pub const IFF_LOWER_UP: u32 = 1 << 16;
/// `IFF_UP` of `ifi_flags`.
pub const IFF_UP: u32 = 1;

/// One link message: the interface's name, its flags, whether it was removed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkEvent {
    /// `IFLA_IFNAME`.
    pub ifname: String,
    /// `ifi_flags` (`IFF_UP`, `IFF_LOWER_UP`, ...).
    pub flags: u32,
    /// `RTM_DELLINK`: the interface is gone.
    pub removed: bool,
}

impl LinkEvent {
    /// Whether the interface is up with a carrier.
    pub fn has_carrier(&self) -> bool {
        !self.removed && self.flags & IFF_UP != 0 && self.flags & IFF_LOWER_UP != 0
    }
}

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// The link events of one datagram of a `NETLINK_ROUTE` socket; anything else, and anything
/// cut short, is skipped.
pub fn parse(buf: &[u8]) -> Vec<LinkEvent> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + NLMSG_HDR <= buf.len() {
        let (Some(len), Some(kind)) = (u32_at(buf, at), u16_at(buf, at + 4)) else {
            break;
        };
        let len = len as usize;
        if len < NLMSG_HDR || at + len > buf.len() {
            break;
        }
        let msg = &buf[at..at + len];
        if kind == RTM_NEWLINK || kind == RTM_DELLINK {
            if let Some(e) = link_message(msg, kind == RTM_DELLINK) {
                out.push(e);
            }
        }
        at += align4(len);
    }
    out
}

fn link_message(msg: &[u8], removed: bool) -> Option<LinkEvent> {
    let flags = u32_at(msg, NLMSG_HDR + 8)?;
    let mut at = NLMSG_HDR + IFINFO;
    while at + 4 <= msg.len() {
        let len = u16_at(msg, at)? as usize;
        let kind = u16_at(msg, at + 2)? & 0x3fff;
        if len < 4 || at + len > msg.len() {
            return None;
        }
        if kind == IFLA_IFNAME {
            let raw = &msg[at + 4..at + len];
            let end = raw.iter().position(|b| *b == 0).unwrap_or(raw.len());
            let ifname = String::from_utf8_lossy(&raw[..end]).into_owned();
            return Some(LinkEvent {
                ifname,
                flags,
                removed,
            });
        }
        at += align4(len);
    }
    None
}

/// Watches the kernel's link messages on a thread of its own (`taskd-netlink`) and calls
/// `on_event` for each one that concerns an interface of `ifaces`, for as long as the process
/// lives. Fails only when the socket cannot be opened or bound (no netlink here).
pub fn watch(
    ifaces: BTreeSet<String>,
    on_event: Box<dyn Fn(&LinkEvent) + Send>,
) -> io::Result<std::thread::JoinHandle<()>> {
    use rustix::net::netlink::SocketAddrNetlink;
    use rustix::net::{bind, recv, socket, AddressFamily, RecvFlags, SocketType};

    // Protocol 0 of the netlink family is NETLINK_ROUTE.
    let fd = socket(AddressFamily::NETLINK, SocketType::RAW, None)?;
    bind(&fd, &SocketAddrNetlink::new(0, RTMGRP_LINK))?;
    std::thread::Builder::new()
        .name("taskd-netlink".into())
        .spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                match recv(&fd, &mut buf[..], RecvFlags::empty()) {
                    Ok((n, _)) => {
                        for e in parse(&buf[..n]) {
                            if ifaces.contains(&e.ifname) {
                                on_event(&e);
                            }
                        }
                    }
                    Err(rustix::io::Errno::INTR) => continue,
                    // ENOBUFS: the kernel dropped messages; the next probe round reads the
                    // state anyway.
                    Err(rustix::io::Errno::NOBUFS) => {
                        on_event(&LinkEvent {
                            ifname: String::new(),
                            flags: 0,
                            removed: false,
                        });
                        continue;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "the kernel's link events stopped; link changes are seen at the probe rounds");
                        return;
                    }
                }
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(kind: u16, flags: u32, name: &str) -> Vec<u8> {
        let mut attr = Vec::new();
        let alen = 4 + name.len() + 1;
        attr.extend_from_slice(&(alen as u16).to_ne_bytes());
        attr.extend_from_slice(&IFLA_IFNAME.to_ne_bytes());
        attr.extend_from_slice(name.as_bytes());
        attr.push(0);
        while attr.len() % 4 != 0 {
            attr.push(0);
        }
        // An attribute before the name (IFLA_MTU = 4), as the kernel sends them.
        let mut mtu = Vec::new();
        mtu.extend_from_slice(&8u16.to_ne_bytes());
        mtu.extend_from_slice(&4u16.to_ne_bytes());
        mtu.extend_from_slice(&1500u32.to_ne_bytes());
        let len = NLMSG_HDR + IFINFO + mtu.len() + attr.len();
        let mut m = Vec::new();
        m.extend_from_slice(&(len as u32).to_ne_bytes());
        m.extend_from_slice(&kind.to_ne_bytes());
        m.extend_from_slice(&[0u8; 10]);
        m.extend_from_slice(&[0u8; 8]); // family, pad, type, index
        m.extend_from_slice(&flags.to_ne_bytes());
        m.extend_from_slice(&0u32.to_ne_bytes());
        m.extend_from_slice(&mtu);
        m.extend_from_slice(&attr);
        m
    }

    #[test]
    fn link_messages_are_read_and_the_rest_skipped() {
        let mut buf = message(RTM_NEWLINK, IFF_UP | IFF_LOWER_UP, "pri");
        buf.extend(message(20, 0, "addr")); // RTM_NEWADDR: not a link message
        buf.extend(message(RTM_NEWLINK, IFF_UP, "bak"));
        buf.extend(message(RTM_DELLINK, 0, "old0"));
        let got = parse(&buf);
        assert_eq!(got.len(), 3);
        assert_eq!(
            (got[0].ifname.as_str(), got[0].has_carrier()),
            ("pri", true)
        );
        assert_eq!(
            (got[1].ifname.as_str(), got[1].has_carrier()),
            ("bak", false)
        );
        assert!(got[2].removed && !got[2].has_carrier());
        // A datagram cut short yields what came before the cut.
        let cut = &buf[..buf.len() - 3];
        assert_eq!(parse(cut).len(), 2);
    }
}
