//! The transport abstraction: a [`Link`] delivers messages of one type to one peer.
//!
//! Actors hold links, never addresses, so the same actor runs over any transport. The
//! in-process transport ([`actor_link`]) wraps an actix address; a network transport
//! implements [`Sender`] over its connection. Connection events (a peer appeared, a peer is
//! gone) are delivered to actors as their own messages by whichever transport saw them.

use actix::dev::SendError;
use actix::prelude::*;
use std::sync::Arc;

/// A message handed over by a transport.
#[derive(Debug)]
pub struct Deliver<M>(pub M);

impl<M: 'static> Message for Deliver<M> {
    type Result = ();
}

/// Why a message could not be handed to the transport.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransportError {
    /// The peer is gone for good (its actor stopped, its connection was declared lost):
    /// the caller treats the peer as lost, retrying is pointless.
    #[error("the peer is gone (connection closed)")]
    Closed,
    /// The peer has `capacity` messages not yet acknowledged: it is not keeping up, and the
    /// transport resets its connection rather than buffer without bound.
    #[error("the peer's queue is full ({capacity} messages); it is not keeping up")]
    Full {
        /// The queue's bound (`NetConfig::queue_capacity` on the network transport).
        capacity: usize,
    },
}

/// Sends messages of type `M` to one peer, without blocking: the sending half of a [`Link`],
/// the end an actor holds, whatever carries the message.
///
/// The network transport implements it by pushing into the peer's sequenced, acknowledged
/// queue, which survives reconnects (see [`crate::net`]); the in-process transport
/// ([`actor_link`]) by posting into an actor's mailbox.
pub trait Sender<M>: Send + Sync {
    /// Hands `msg` to the transport and returns at once. `Ok` means queued, not delivered:
    /// the protocol's replies and deadlines say whether it arrived.
    fn send(&self, msg: M) -> Result<(), TransportError>;
}

/// A shared handle to a [`Sender`].
pub type Link<M> = Arc<dyn Sender<M>>;

/// In-process transport: delivers straight into an actor's mailbox.
struct ActorSender<M: Send + 'static> {
    recipient: Recipient<Deliver<M>>,
}

impl<M: Send + 'static> Sender<M> for ActorSender<M> {
    fn send(&self, msg: M) -> Result<(), TransportError> {
        if !self.recipient.connected() {
            return Err(TransportError::Closed);
        }
        self.recipient.do_send(Deliver(msg));
        Ok(())
    }
}

/// Hands a message to an actor's mailbox for a transport's reader: at once when the mailbox has
/// room, otherwise once it has, so a slow actor slows its peer down (the reader stops reading)
/// instead of queueing without bound. Resolves once the message is in the mailbox, behind
/// those handed over before it; `Err` when the actor has stopped. Waiting for the actor to
/// have handled each message instead costs a round trip between the two tasks per message.
pub async fn hand_over<A, M>(addr: Addr<A>, msg: M) -> Result<(), &'static str>
where
    A: Actor<Context = Context<A>> + Handler<Deliver<M>>,
    M: Send + 'static,
{
    match addr.try_send(Deliver(msg)) {
        Ok(()) => Ok(()),
        Err(SendError::Full(m)) => addr.send(m).await.map_err(|_| "the actor stopped"),
        Err(SendError::Closed(_)) => Err("the actor stopped"),
    }
}

/// A link into a local actor.
pub fn actor_link<A, M>(addr: &Addr<A>) -> Link<M>
where
    A: Actor<Context = Context<A>> + Handler<Deliver<M>>,
    M: Send + 'static,
{
    Arc::new(ActorSender {
        recipient: addr.clone().recipient(),
    })
}
