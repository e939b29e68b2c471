//! The transport abstraction: a [`Link`] delivers messages of one type to one peer.
//!
//! Actors hold links, never addresses, so the same actor runs over any transport. The
//! in-process transport ([`actor_link`]) wraps an actix address; a network transport
//! implements [`Outbox`] over its connection. Connection events (a peer appeared, a peer is
//! gone) are delivered to actors as their own messages by whichever transport saw them.

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
    #[error("the peer is gone (connection closed)")]
    Closed,
    #[error("the peer's queue is full ({capacity} messages); it is not keeping up")]
    Full { capacity: usize },
}

/// Sends messages of type `M` to one peer, without blocking.
pub trait Outbox<M>: Send + Sync {
    fn send(&self, msg: M) -> Result<(), TransportError>;
}

/// A shared handle to an [`Outbox`].
pub type Link<M> = Arc<dyn Outbox<M>>;

/// In-process transport: delivers straight into an actor's mailbox.
struct ActorOutbox<M: Send + 'static> {
    recipient: Recipient<Deliver<M>>,
}

impl<M: Send + 'static> Outbox<M> for ActorOutbox<M> {
    fn send(&self, msg: M) -> Result<(), TransportError> {
        if !self.recipient.connected() {
            return Err(TransportError::Closed);
        }
        self.recipient.do_send(Deliver(msg));
        Ok(())
    }
}

/// A link into a local actor.
pub fn actor_link<A, M>(addr: &Addr<A>) -> Link<M>
where
    A: Actor<Context = Context<A>> + Handler<Deliver<M>>,
    M: Send + 'static,
{
    Arc::new(ActorOutbox {
        recipient: addr.clone().recipient(),
    })
}
