//! A role on a thread of its own: an actix system that starts the role, tells the caller it
//! is up (or why it is not), runs until asked to stop (or, for a manager, until a signal), and
//! hands back why it stopped.

use crate::error::CapiError;
use std::future::Future;
use taskd_actors::background::Background;
use taskd_actors::process::ShutdownSignals;
use tokio::sync::oneshot;

/// What a role's thread gets: where the stop request arrives, and where it says it started.
pub struct RoleStart<I> {
    /// The stop request, with its reason (an error: the handle was freed).
    pub stop: oneshot::Receiver<String>,
    /// Where the role reports its start: what callers need to know, or why it failed.
    pub started: std::sync::mpsc::Sender<Result<I, CapiError>>,
}

/// The thread of a running role. Dropping it stops the role and waits for the thread.
pub struct RoleThread {
    thread: Background<String>,
}

impl RoleThread {
    /// Runs `run` on a thread `taskd-ROLE`, inside a new actix system, and returns once it
    /// reported its start. `stopped` gets the reason `run` returns when the role has stopped.
    pub fn spawn<I, F, Fut>(
        role: &'static str,
        run: F,
        stopped: impl FnOnce(String) + Send + 'static,
    ) -> Result<(RoleThread, I), CapiError>
    where
        I: Send + 'static,
        F: FnOnce(RoleStart<I>) -> Fut + Send + 'static,
        Fut: Future<Output = String> + 'static,
    {
        let start_error = |message: String| CapiError::Start { role, message };
        let (started, started_rx) = std::sync::mpsc::channel();
        let thread = Background::spawn_actix(&format!("taskd-{role}"), move |stop| async move {
            stopped(run(RoleStart { stop, started }).await);
        })
        .map_err(|e| start_error(e.to_string()))?;
        match started_rx.recv() {
            Ok(Ok(info)) => Ok((RoleThread { thread }, info)),
            // Dropping the thread's handle waits for it.
            Ok(Err(e)) => Err(e),
            Err(_) => Err(start_error(match thread.join() {
                Err(panic) => format!("its thread panicked before it started: {}", panic.message),
                Ok(()) => "its thread ended before it started".into(),
            })),
        }
    }

    /// Asks the role to stop; returns at once. Only the first request is heard.
    pub fn request_stop(&self, reason: &str) {
        self.thread.request_stop(reason.to_owned());
    }
}

/// Waits until the role is told to stop (a request, or a signal when `signals` are watched)
/// and says why.
pub async fn stop_requested(
    stop: &mut oneshot::Receiver<String>,
    signals: Option<&mut ShutdownSignals>,
) -> String {
    let signal = async {
        match signals {
            Some(s) => s.recv().await.to_owned(),
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        r = stop => r.unwrap_or_else(|_| "its handle was freed".to_owned()),
        s = signal => s,
    }
}
