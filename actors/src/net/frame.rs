//! What a connection sends and how it ends, the same in both directions: the [`Frame`] of each
//! direction (`Up`, `Down`) and the [`End`] of a connection. Both the session and the stream
//! that writes its frames ([`outbound`](super::outbound)) use them.

use super::pb;
use std::time::Duration;

/// A frame type of one direction (`Up` or `Down`).
pub(crate) trait Frame: Send + 'static {
    type Body: Clone + Send + Sync + 'static;
    fn make(seq: u64, ack: u64, body: Self::Body) -> Self;
    fn split(self) -> (u64, u64, Option<Self::Body>);
    fn heartbeat() -> Self::Body;
    fn is_heartbeat(b: &Self::Body) -> bool;
    /// The reason, if this body is a goodbye.
    fn goodbye(b: &Self::Body) -> Option<String>;
}

/// The two directions' frames are alike but for their types: one implementation for both.
macro_rules! frame {
    ($frame:ident, $module:ident) => {
        impl Frame for pb::$frame {
            type Body = pb::$module::Body;
            fn make(seq: u64, ack: u64, body: Self::Body) -> Self {
                pb::$frame {
                    seq,
                    ack,
                    body: Some(body),
                }
            }
            fn split(self) -> (u64, u64, Option<Self::Body>) {
                (self.seq, self.ack, self.body)
            }
            fn heartbeat() -> Self::Body {
                pb::$module::Body::Heartbeat(pb::Heartbeat {})
            }
            fn is_heartbeat(b: &Self::Body) -> bool {
                matches!(b, pb::$module::Body::Heartbeat(_))
            }
            fn goodbye(b: &Self::Body) -> Option<String> {
                match b {
                    pb::$module::Body::Goodbye(g) => Some(g.reason.clone()),
                    _ => None,
                }
            }
        }
    };
}

frame!(Up, up);
frame!(Down, down);

/// Why a connection ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum End {
    /// The peer said goodbye: it stops for good.
    Goodbye(String),
    /// The connection closed or failed; the peer may come back.
    Closed(String),
    /// The peer missed its heartbeats.
    Silent(Duration),
    /// Our queue to the peer overflowed: it is not keeping up.
    Overflowed,
    /// The peer sent something that is not the protocol.
    Protocol(String),
    /// We were told to stop (shutdown, or a newer connection took over).
    Stopped,
    /// The peer was declared lost elsewhere.
    PeerGone(String),
}

impl End {
    pub(crate) fn describe(&self, loss_after: Duration) -> String {
        match self {
            End::Goodbye(r) => format!("it stopped: {r}"),
            End::Closed(r) => {
                format!("connection closed ({r}) and not re-established within {loss_after:?}")
            }
            End::Silent(d) => format!("no heartbeat for {d:?} (limit {loss_after:?})"),
            End::Overflowed => "it is not keeping up: its send queue is full".into(),
            End::Protocol(r) => format!("protocol error: {r}"),
            End::Stopped => "stopped".into(),
            End::PeerGone(r) => r.clone(),
        }
    }
}
