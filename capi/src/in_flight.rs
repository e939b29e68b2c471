//! A training process's in-flight side over one callback of its framework (taskd's Gloo switch
//! registers it through `taskd_worker_set_in_flight`): each request and its answer are one
//! JSON object, so the C ABI has one function for the three calls of
//! [`InFlightFramework`], and a framework can add fields without a new symbol.
//!
//! | request `op` | fields | answer |
//! |---|---|---|
//! | `abort` | `ranks`, `use_backup` | `{"collectives": [{"group", "size", "completed", "issued"}]}` |
//! | `switch` | `ranks`, `use_backup`, `timeout_ms`, `redo: [{"group", "from"}]` | `{}` |
//! | `give_up` | `reason` | `{}` |
//!
//! Calls come on a thread of taskd's, never the training thread (which waits mid-step).

use parking_lot::Mutex;
use std::time::Duration;
use taskd_core::inflight::{CollectivePosition, InFlightFramework, RedoPoint};
use taskd_core::{GlobalRank, NicSide};

/// The framework's callback: a JSON request in, its JSON answer or the reason it failed out.
pub type InFlightCall = Box<dyn Fn(&str) -> Result<String, String> + Send + Sync>;

/// [`InFlightFramework`] over an [`InFlightCall`].
pub struct CallbackInFlight {
    call: InFlightCall,
    /// The redo points of the in-flight switch the worker makes next.
    armed: Mutex<Option<Vec<RedoPoint>>>,
}

impl CallbackInFlight {
    /// Over `call`.
    pub fn new(call: InFlightCall) -> Self {
        CallbackInFlight {
            call,
            armed: Mutex::new(None),
        }
    }

    fn ask(&self, request: serde_json::Value) -> Result<String, String> {
        (self.call)(&request.to_string())
    }
}

impl InFlightFramework for CallbackInFlight {
    fn abort(&self, targets: &[(GlobalRank, NicSide)]) -> Result<Vec<CollectivePosition>, String> {
        let ranks: Vec<u32> = targets.iter().map(|(r, _)| r.0).collect();
        let flags: Vec<bool> = targets.iter().map(|(_, s)| s.use_backup()).collect();
        let answer = self.ask(serde_json::json!({
            "op": "abort", "ranks": ranks, "use_backup": flags,
        }))?;
        let unreadable =
            |e: serde_json::Error| format!("the framework's abort answered {answer:?}: {e}");
        let v: serde_json::Value = serde_json::from_str(&answer).map_err(unreadable)?;
        let mut collectives: Vec<CollectivePosition> =
            serde_json::from_value(v["collectives"].clone()).map_err(unreadable)?;
        collectives.sort();
        Ok(collectives)
    }

    fn arm_switch(&self, redo: Vec<RedoPoint>) {
        *self.armed.lock() = Some(redo);
    }

    fn take_switch(&self) -> Option<Vec<RedoPoint>> {
        self.armed.lock().take()
    }

    fn switch(
        &self,
        ranks: &[u32],
        use_backup: &[bool],
        redo: &[RedoPoint],
        timeout: Duration,
    ) -> Result<(), String> {
        let timeout_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        self.ask(serde_json::json!({
            "op": "switch", "ranks": ranks, "use_backup": use_backup,
            "timeout_ms": timeout_ms, "redo": redo,
        }))
        .map(drop)
    }

    fn give_up(&self, reason: &str) {
        self.armed.lock().take();
        if let Err(e) = self.ask(serde_json::json!({"op": "give_up", "reason": reason})) {
            tracing::warn!(error = %e, "the framework did not give its collectives in flight up");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn requests_and_answers_are_json_and_the_switch_is_armed_once() {
        let seen = Arc::new(Mutex::new(Vec::<serde_json::Value>::new()));
        let log = seen.clone();
        let f = CallbackInFlight::new(Box::new(move |req| {
            let v: serde_json::Value = serde_json::from_str(req).unwrap();
            log.lock().push(v.clone());
            match v["op"].as_str() {
                Some("abort") => Ok(
                    r#"{"collectives":[{"group":"1","size":2,"completed":3,"issued":4},{"group":"0","size":2,"completed":7,"issued":7}]}"#
                        .into(),
                ),
                Some("switch") => Ok("{}".into()),
                _ => Err("no".into()),
            }
        }));
        let got = f.abort(&[(GlobalRank(1), NicSide::Backup)]).unwrap();
        assert_eq!(got[0].group, "0");
        assert_eq!((got[1].completed, got[1].issued), (3, 4));
        assert_eq!(f.take_switch(), None);
        let redo = vec![RedoPoint {
            group: "0".into(),
            from: 7,
        }];
        f.arm_switch(redo.clone());
        assert_eq!(f.take_switch(), Some(redo.clone()));
        assert_eq!(f.take_switch(), None);
        f.switch(&[1], &[true], &redo, Duration::from_millis(1500))
            .unwrap();
        f.give_up("the move failed");
        let seen = seen.lock();
        assert_eq!(seen[0]["use_backup"], serde_json::json!([true]));
        assert_eq!(seen[1]["redo"][0]["from"], 7);
        assert_eq!(seen[1]["timeout_ms"], 1500);
        assert_eq!(seen[2]["op"], "give_up");
    }
}
