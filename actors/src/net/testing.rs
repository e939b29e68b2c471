//! What the transport's fuzz and slow-peer tests drive directly, with the `testing` feature
//! (off by default; not an API): decoding whole frames from their bytes as a server and a
//! client do, and the conversions between `taskd-core`'s messages and their protobuf form
//! ([`pb`]).

pub use super::wire::{
    directive_from_pb, directive_to_pb, proxy_msg_to_pb, worker_msg_to_pb, WireError,
};

use super::pb;
use super::wire::{proxy_msg_from_pb, worker_msg_from_pb};
use taskd_core::protocol::{Directive, ProxyToManager, WorkerToProxy};

/// Why the bytes of a frame do not make a protocol message.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// Larger than the receiver accepts.
    #[error("a frame of {len} bytes is larger than the limit of {max}")]
    TooLarge {
        /// The frame's size.
        len: usize,
        /// The limit (`NetConfig::max_message_bytes`).
        max: usize,
    },
    /// Not protobuf of the frame's type.
    #[error("undecodable frame: {0}")]
    Decode(#[from] prost::DecodeError),
    /// Protobuf, but not a valid protocol message.
    #[error(transparent)]
    Wire(#[from] WireError),
}

/// The protocol message an upward frame carries.
#[derive(Clone, Debug, PartialEq)]
pub enum UpMessage {
    /// From a worker to its proxy.
    Worker(WorkerToProxy),
    /// From a proxy to the manager.
    Proxy(ProxyToManager),
}

fn check_len(bytes: &[u8], max: usize) -> Result<(), FrameError> {
    if bytes.len() > max {
        return Err(FrameError::TooLarge {
            len: bytes.len(),
            max,
        });
    }
    Ok(())
}

/// Decodes the bytes of a frame a client sends (`Up`) as its server does: the size limit, the
/// protobuf, then the protocol message of a worker or proxy body (`None` for a frame of the
/// session itself: registration, heartbeat, ping, goodbye). Whatever the bytes, it returns.
pub fn decode_up(bytes: &[u8], max: usize) -> Result<Option<UpMessage>, FrameError> {
    use prost::Message as _;
    check_len(bytes, max)?;
    Ok(match pb::Up::decode(bytes)?.body {
        Some(pb::up::Body::Worker(m)) => Some(UpMessage::Worker(worker_msg_from_pb(m)?)),
        Some(pb::up::Body::Proxy(m)) => Some(UpMessage::Proxy(proxy_msg_from_pb(m)?)),
        _ => None,
    })
}

/// Decodes the bytes of a frame a server sends (`Down`) as its client does: the size limit,
/// the protobuf, then the directive it carries (`None` for a frame of the session itself).
/// Whatever the bytes, it returns.
pub fn decode_down(bytes: &[u8], max: usize) -> Result<Option<Directive>, FrameError> {
    use prost::Message as _;
    check_len(bytes, max)?;
    Ok(match pb::Down::decode(bytes)?.body {
        Some(pb::down::Body::Directive(d)) => Some(directive_from_pb(d)?),
        _ => None,
    })
}
