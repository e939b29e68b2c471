//! A role on a thread of its own: an actix system that starts the role, tells the caller it
//! is up (or why it is not), runs until asked to stop (or, for a manager, until a signal), and
//! hands back why it stopped.

use crate::error::CapiError;
use std::future::Future;
use std::thread::JoinHandle;
use taskd_actors::process::ShutdownSignals;
use tokio::sync::mpsc;

/// What a role's thread gets: where stop requests arrive, and where it says it started.
pub struct RoleStart<I> {
    /// Stop requests, with their reason.
    pub stop: mpsc::UnboundedReceiver<String>,
    /// Where the role reports its start: what callers need to know, or why it failed.
    pub started: std::sync::mpsc::Sender<Result<I, CapiError>>,
}

/// The thread of a running role. Dropping it stops the role and waits for the thread.
pub struct RoleThread {
    stop: mpsc::UnboundedSender<String>,
    thread: Option<JoinHandle<()>>,
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
        let (stop, stop_rx) = mpsc::unbounded_channel();
        let (started, started_rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(format!("taskd-{role}"))
            .spawn(move || {
                let start = RoleStart {
                    stop: stop_rx,
                    started,
                };
                stopped(actix_rt::System::new().block_on(run(start)));
            })
            .map_err(|e| start_error(e.to_string()))?;
        let outcome = started_rx.recv();
        let role_thread = RoleThread {
            stop,
            thread: Some(thread),
        };
        match outcome {
            Ok(Ok(info)) => Ok((role_thread, info)),
            // Dropping the thread's handle waits for it.
            Ok(Err(e)) => Err(e),
            Err(_) => Err(start_error("its thread ended before it started".into())),
        }
    }

    /// Asks the role to stop; returns at once.
    pub fn request_stop(&self, reason: &str) {
        let _ = self.stop.send(reason.to_owned());
    }
}

impl Drop for RoleThread {
    fn drop(&mut self) {
        self.request_stop("its handle was freed");
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Waits until the role is told to stop (a request, or a signal when `signals` are watched)
/// and says why.
pub async fn stop_requested(
    stop: &mut mpsc::UnboundedReceiver<String>,
    signals: Option<&mut ShutdownSignals>,
) -> String {
    let signal = async {
        match signals {
            Some(s) => s.recv().await.to_owned(),
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        r = stop.recv() => r.unwrap_or_else(|| "its handle was dropped".to_owned()),
        s = signal => s,
    }
}
