//! One live connection between a client and a server, the same on both ends: a reader that
//! hands sequenced messages to the local side in order (and drops replayed duplicates), and a
//! writer that sends acknowledgements, heartbeats and unsequenced messages and watches the
//! peer's heartbeats. The outbox's messages do not pass through the writer: the connection's
//! stream takes them from the outbox itself ([`outbound`](super::outbound)).
//!
//! Why a reader task of its own: a message being handed to an actor must not be cut in half by
//! the connection ending (it would be delivered, yet not counted as received, and be delivered
//! again after a reconnect). The reader stops only between messages.
//!
//! Acknowledgements ride on frames going the other way: every frame carries the highest
//! message received. Most messages are answered (a directive by its reply, a reply by the next
//! directive), so a received message waits up to [`ACK_DELAY`] for such a frame before an
//! acknowledgement goes out on its own, and at once when [`Session::ack_every`] are waiting.
//! A connection thus sends one frame per message, not two: at 512 ranks that was a third of
//! the frames of an operation (BENCHMARKS.md). Nor is the writer woken for every message
//! received: only for one that starts to wait while no acknowledgement timer runs.

use super::frame::{End, Frame};
use super::heartbeat::Liveness;
use super::outbound::{OutboundTx, Outgoing, Stamp};
use super::outbox::Outbox;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch, Notify};

/// How long a received message waits for its acknowledgement to ride on a frame going the
/// other way before one is sent on its own.
pub(crate) const ACK_DELAY: Duration = Duration::from_millis(50);

/// Received messages waiting for their acknowledgement, at most, for a peer with a queue of
/// `capacity` unacknowledged messages: half of it (so the peer's queue never fills for want
/// of an acknowledgement), and no more than 32.
pub(crate) fn ack_every(capacity: usize) -> u64 {
    (capacity as u64 / 2).clamp(1, 32)
}

/// A boxed future of a delivery.
pub(crate) type Delivery = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// What the local side does with what arrives.
pub(crate) trait Inbound<B>: Send + Sync + 'static {
    /// A sequenced message, in order. The next one is read only after this resolves, so a slow
    /// local side slows the peer down (HTTP/2 flow control) instead of queueing without bound.
    /// An error ends the connection (the peer broke the protocol).
    fn deliver(&self, body: B) -> Delivery;
    /// An unsequenced message other than a heartbeat (a ping or a pong).
    fn unsequenced(&self, body: B);
}

/// Everything one connection needs.
pub(crate) struct Session<In: Frame, Out: Frame> {
    pub inbound: tonic::Streaming<In>,
    /// The writer's side of the stream the connection writes (made with
    /// [`outbound`](super::outbound::outbound)); it carries the count of messages received
    /// from the peer, which survives reconnects.
    pub outbound: OutboundTx<Out>,
    pub outbox: Arc<Outbox<Out::Body>>,
    /// From [`Outbox::attach`] for this connection.
    pub epoch: u64,
    /// Held while a message is checked against the count received and delivered, so the
    /// reader of a new connection cannot deliver a replayed message again while the reader of
    /// the old one is still delivering it.
    pub deliver_lock: Arc<tokio::sync::Mutex<()>>,
    /// Unsequenced messages to send (pings, pongs).
    pub control: mpsc::Receiver<Box<Out::Body>>,
    pub liveness: Arc<Liveness>,
    /// Changes (or its sender drops) when the connection must end.
    pub stop: watch::Receiver<bool>,
    /// Received messages that may wait for their acknowledgement ([`ack_every`]).
    pub ack_every: u64,
}

/// How a connection's reader tells its writer about acknowledgements owed to the peer.
struct AckSignal {
    notify: Notify,
    /// Set by the reader when it woke the writer for a message waiting alone; cleared by the
    /// writer when its timer has run out. While set, further messages do not wake the writer
    /// (unless [`Session::ack_every`] wait): most are acknowledged by the replies to them.
    waiting: AtomicBool,
}

impl<In: Frame, Out: Frame> Session<In, Out> {
    /// Runs the connection until it ends.
    pub(crate) async fn run(self, inbound_handler: Arc<dyn Inbound<In::Body>>) -> End {
        let Session {
            inbound,
            outbound,
            outbox,
            epoch,
            deliver_lock,
            control,
            liveness,
            stop,
            ack_every,
        } = self;
        liveness.heard();
        let ack = Arc::new(AckSignal {
            notify: Notify::new(),
            waiting: AtomicBool::new(false),
        });
        let (reader_stop_tx, reader_stop_rx) = oneshot::channel::<()>();
        let reader = Reader {
            outbox_of_peer_acks: outbox.clone(),
            deliver_lock,
            liveness: liveness.clone(),
            handler: inbound_handler,
            ack: ack.clone(),
            stamp: outbound.stamp.clone(),
            ack_every,
            stop: reader_stop_rx,
        };
        let reader = tokio::spawn(reader.run::<In>(inbound));
        let mut w = Writer {
            // The stream takes the sequenced frames from the outbox itself.
            pending: Some(Outgoing::Attach(outbox, epoch)),
            outbound,
            ack_every,
            ack_armed: false,
        };
        let end = w.run(reader, control, (liveness, ack), stop).await;
        // Stop the reader between two messages and wait for it (a reader that ended the
        // session is gone already).
        if let Some(reader) = end.1 {
            let _ = reader_stop_tx.send(());
            let _ = reader.await;
        }
        end.0
    }
}

/// The writing half of a session: what the connection writes besides the outbox's messages
/// (control messages, acknowledgements, heartbeats), one item in hand at a time, and the
/// watch over the peer's heartbeats.
struct Writer<Out: Frame> {
    outbound: OutboundTx<Out>,
    /// The item taken and not yet handed to the stream.
    pending: Option<Outgoing<Out>>,
    /// See [`Session::ack_every`].
    ack_every: u64,
    /// Whether the acknowledgement timer runs.
    ack_armed: bool,
}

impl<Out: Frame> Writer<Out> {
    /// Writes until the connection ends; why, and the reader if it is still running.
    async fn run(
        &mut self,
        mut reader: tokio::task::JoinHandle<End>,
        mut control: mpsc::Receiver<Box<Out::Body>>,
        (liveness, ack): (Arc<Liveness>, Arc<AckSignal>),
        mut stop: watch::Receiver<bool>,
    ) -> (End, Option<tokio::task::JoinHandle<End>>) {
        let mut tick = tokio::time::interval(liveness.interval());
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut control_open = true;
        // Armed while a received message waits for its acknowledgement.
        let ack_timer = tokio::time::sleep(ACK_DELAY);
        tokio::pin!(ack_timer);
        // The waits that span many turns of the loop are made once and kept: a wait made
        // afresh each turn registers and unregisters itself each time.
        let stopped = stop.changed();
        tokio::pin!(stopped);
        let mut delivered = Box::pin(ack.notify.notified());
        // The select's waits borrow what they wait on until an arm has run: the stream's
        // sender is borrowed here, not through `self`.
        let outbound = self.outbound.clone();
        let stream_ended = outbound.end.wait();
        tokio::pin!(stream_ended);
        let end = loop {
            if let Err(end) = self.hand_over() {
                break end;
            }
            tokio::select! {
                biased;
                r = &mut reader => {
                    let end = r.unwrap_or_else(|e| End::Closed(format!("reader failed: {e}")));
                    if matches!(end, End::Goodbye(_)) {
                        // Acknowledge the goodbye so the peer can stop without waiting.
                        let f = Outgoing::Frame(self.frame(Out::heartbeat()));
                        let room = tokio::time::timeout(liveness.interval(), outbound.reserve());
                        if let Ok(Some(permit)) = room.await {
                            permit.send(f);
                        }
                    }
                    return (end, None);
                }
                _ = &mut stopped => break End::Stopped,
                end = &mut stream_ended => break end,
                permit = outbound.reserve(), if self.pending.is_some() => match permit {
                    Some(p) => p.send(self.pending.take().expect("checked by the guard")),
                    None => break End::Closed("the connection's stream ended".into()),
                },
                body = control.recv(), if self.pending.is_none() && control_open => match body {
                    Some(b) => self.pending = Some(Outgoing::Frame(self.frame(*b))),
                    None => control_open = false,
                },
                _ = &mut delivered, if self.pending.is_none() => {
                    delivered.set(ack.notify.notified());
                    if self.on_delivered(&ack) {
                        ack_timer.as_mut().reset(tokio::time::Instant::now() + ACK_DELAY);
                    }
                }
                _ = &mut ack_timer, if self.ack_armed && self.pending.is_none() => {
                    self.ack_armed = false;
                    ack.waiting.store(false, Ordering::Release);
                    self.acknowledge_if(self.outbound.stamp.unacked() > 0);
                }
                _ = tick.tick() => {
                    if liveness.is_lost() {
                        break End::Silent(liveness.silent_for());
                    }
                    self.acknowledge_if(self.pending.is_none());
                }
            }
        };
        (end, Some(reader))
    }

    /// `body` as an unsequenced frame, acknowledging everything received so far.
    fn frame(&self, body: Out::Body) -> Box<Out> {
        Box::new(self.outbound.stamp.frame(0, body))
    }

    /// Takes a heartbeat (which carries the acknowledgement) in hand when `due`.
    fn acknowledge_if(&mut self, due: bool) {
        if due {
            self.pending = Some(Outgoing::Frame(self.frame(Out::heartbeat())));
        }
    }

    /// The reader woke us for a message waiting for its acknowledgement: acknowledge at once
    /// when enough wait, else make sure the timer runs. Whether the timer must be (re)started.
    fn on_delivered(&mut self, ack: &AckSignal) -> bool {
        let waiting = self.outbound.stamp.unacked();
        if waiting >= self.ack_every {
            self.acknowledge_if(true);
            false
        } else if waiting == 0 {
            // A frame carried it meanwhile: nothing owed, the next message may wake us again.
            if !self.ack_armed {
                ack.waiting.store(false, Ordering::Release);
            }
            false
        } else if !self.ack_armed {
            self.ack_armed = true;
            true
        } else {
            false
        }
    }

    /// The item in hand goes straight into the stream when it has room.
    fn hand_over(&mut self) -> Result<(), End> {
        if let Some(item) = self.pending.take() {
            match self.outbound.try_send(item) {
                Ok(()) => {}
                Err(Some(item)) => self.pending = Some(item),
                Err(None) => return Err(End::Closed("the connection's stream ended".into())),
            }
        }
        Ok(())
    }
}

/// The reading half of a session: delivers the peer's messages in order, once each.
struct Reader<B> {
    /// Where the acknowledgements the peer carries are applied.
    outbox_of_peer_acks: Arc<dyn AckSink>,
    deliver_lock: Arc<tokio::sync::Mutex<()>>,
    liveness: Arc<Liveness>,
    handler: Arc<dyn Inbound<B>>,
    /// Told when a delivered message should be acknowledged.
    ack: Arc<AckSignal>,
    /// The count of messages received (which it keeps) and what the frames written so far
    /// acknowledged.
    stamp: Arc<Stamp>,
    /// See [`Session::ack_every`].
    ack_every: u64,
    /// Stops the reader between two messages: the session is ending (the writer saw the
    /// session's own stop, or the connection end, and sends it or drops it).
    stop: oneshot::Receiver<()>,
}

impl<B: Send + 'static> Reader<B> {
    async fn run<In: Frame<Body = B>>(mut self, mut inbound: tonic::Streaming<In>) -> End {
        loop {
            // A message already here is read first: the stop is looked at only when there is
            // none, and a message read is delivered before the reader stops, as any message is.
            let msg = tokio::select! {
                biased;
                m = inbound.message() => m,
                _ = &mut self.stop => return End::Stopped,
            };
            let frame = match msg {
                Err(status) => return End::Closed(status.message().to_owned()),
                Ok(None) => return End::Closed("the peer closed the connection".into()),
                Ok(Some(f)) => f,
            };
            self.liveness.heard();
            let (seq, ack, body) = In::split(frame);
            self.outbox_of_peer_acks.ack(ack);
            let Some(body) = body else { continue };
            if seq == 0 {
                if !In::is_heartbeat(&body) {
                    self.handler.unsequenced(body);
                }
                continue;
            }
            let _delivering = self.deliver_lock.lock().await;
            if seq <= self.stamp.received().load(Ordering::Acquire) {
                continue; // replayed after a reconnect: already delivered
            }
            if let Some(reason) = In::goodbye(&body) {
                self.stamp.received().store(seq, Ordering::Release);
                return End::Goodbye(reason);
            }
            self.liveness.set_busy(true);
            let res = self.handler.deliver(body).await;
            self.liveness.set_busy(false);
            self.stamp.received().store(seq, Ordering::Release);
            // The writer has something to do only when a message starts waiting for its
            // acknowledgement and no timer runs (it arms one) and when enough wait (it sends
            // one now): it is not woken for every message.
            let waiting = self.stamp.unacked();
            if waiting >= self.ack_every
                || (waiting > 0 && !self.ack.waiting.swap(true, Ordering::AcqRel))
            {
                self.ack.notify.notify_one();
            }
            if let Err(e) = res {
                return End::Protocol(e);
            }
        }
    }
}

/// Where acknowledgements from the peer go: our outbox to it.
pub(crate) trait AckSink: Send + Sync {
    fn ack(&self, upto: u64);
}

impl<T: Clone + Send + 'static> AckSink for Outbox<T> {
    fn ack(&self, upto: u64) {
        Outbox::ack(self, upto)
    }
}
