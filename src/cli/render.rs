//! How the operator's commands show control-API messages: readable text and JSON.

use serde_json::{json, Value};
use std::fmt::Write as _;
use std::time::Duration;
use taskd_actors::control::proto::{self, switch_event::Event};
use taskd_actors::progress::{ProgressEvent, ProgressKind};
use taskd_core::operation::Trigger;
use taskd_core::protocol::Phase;
use taskd_core::{OperationId, OperationSummary};

/// A result as JSON: the fields of `taskd sim --json`'s operations.
fn result_json(r: &proto::OperationResult) -> Value {
    serde_json::to_value(OperationSummary::from(r)).expect("a summary serializes")
}

/// One line of `taskd switch --json`. Phase events say what happened in `kind`: `started`
/// (with the ranks `waiting` and, for the pause, its `pause_step`), `waiting` (the count went
/// down) or `finished` (with `took_ms`).
pub fn event_json(ev: &Event) -> Value {
    match ev {
        Event::Accepted(a) => {
            json!({"event": "accepted", "uuid": a.uuid, "known": a.known, "in_flight": a.in_flight})
        }
        Event::Refused(r) => json!({
            "event": "refused", "code": r.code,
            "name": taskd_actors::control::codes::name(r.code), "reason": r.reason,
            "kind": r.kind().as_str_name().trim_start_matches("REFUSAL_KIND_").to_lowercase(),
        }),
        Event::Phase(p) => {
            let mut v = json!({
                "event": "phase", "kind": p.kind, "uuid": p.uuid, "phase": p.phase,
                "at_ms": p.at_ms,
            });
            match p.kind.as_str() {
                "started" => {
                    v["waiting"] = json!(p.waiting);
                    if let Some(step) = p.pause_step {
                        v["pause_step"] = json!(step);
                    }
                }
                "waiting" => v["waiting"] = json!(p.waiting),
                "finished" => v["took_ms"] = json!(p.took_ms),
                _ => {}
            }
            v
        }
        Event::Result(r) => json!({"event": "result", "result": result_json(r)}),
    }
}

/// A phase event of the control API as the manager's progress event, for the shared
/// progress printer. `None` for an event this client does not know.
pub fn progress_event(p: &proto::PhaseEvent) -> Option<ProgressEvent> {
    let op = p.uuid.parse::<OperationId>().ok()?;
    let phase = [
        Phase::Sample,
        Phase::Pause,
        Phase::Switch,
        Phase::Rollback,
        Phase::Resume,
    ]
    .into_iter()
    .find(|ph| ph.as_str() == p.phase)?;
    let waiting = p.waiting as usize;
    let kind = match p.kind.as_str() {
        "started" => ProgressKind::PhaseStarted {
            phase,
            waiting,
            pause_step: p.pause_step,
        },
        "waiting" => ProgressKind::Waiting { phase, waiting },
        "finished" => ProgressKind::PhaseFinished {
            phase,
            took: Duration::from_secs_f64(p.took_ms.unwrap_or_default().max(0.0) / 1e3),
        },
        _ => return None,
    };
    Some(ProgressEvent {
        op,
        at: Duration::from_secs_f64(p.at_ms.max(0.0) / 1e3),
        kind,
    })
}

/// A result as `taskd switch --wait` prints it.
pub fn result_text(r: &OperationSummary) -> String {
    let mut s = String::new();
    let p = r.phases_ms;
    for (name, v) in [
        ("pause", p.pause),
        ("switch", p.switch),
        ("rollback", p.rollback),
        ("resume", p.resume),
        ("total", Some(p.total)),
        ("stall", r.stall_ms),
    ] {
        if let Some(v) = v {
            let _ = writeln!(s, "  {name:<9} {v:>10.3} ms");
        }
    }
    if let Some(step) = r.pause_step {
        let _ = writeln!(s, "  every rank held after step {step}");
    }
    let _ = write!(s, "  result    {}", r.result.to_uppercase());
    if r.result == "failed" {
        let _ = write!(
            s,
            " (rolled back: {}, job {})",
            if r.rolled_back { "yes" } else { "NO" },
            r.job_state
        );
    }
    s.push('\n');
    if let Some(e) = &r.error {
        let _ = writeln!(s, "  reason    {e}");
    }
    if let Some(e) = &r.journal_error {
        let _ = writeln!(
            s,
            "  journal   NOT RECORDED: a restarted manager would not know this result ({e})"
        );
    }
    if let Some(h) = &r.hold {
        let _ = writeln!(s, "  then      the job does not run: {h}");
    }
    for e in &r.rank_errors {
        let _ = writeln!(s, "  rank {:>5} {:<8} {}", e.rank, e.phase, e.message);
    }
    if !r.lost_ranks.is_empty() {
        let _ = writeln!(
            s,
            "  lost ranks {:?}: the job needs process-level recovery",
            r.lost_ranks
        );
    }
    s
}

/// `taskd status --json`: one object.
pub fn status_json(s: &proto::JobStatus) -> Value {
    json!({
        "job": s.job_id,
        "state": s.state,
        "workers_registered": s.workers_registered,
        "workers_expected": s.workers_expected,
        "nodes_connected": s.nodes_connected,
        "ranks_on_backup": s.ranks_on_backup,
        "in_flight": s.in_flight.as_ref().map(|f| json!({
            "uuid": f.uuid, "phase": f.phase, "pending_ranks": f.pending_ranks,
        })),
        "recent": s.recent.iter().map(result_json).collect::<Vec<_>>(),
        "lost_ranks": s.lost_ranks.iter().map(|l| json!({
            "rank": l.rank, "reason": l.reason, "how": l.how,
        })).collect::<Vec<_>>(),
        "verified": s.verified,
        "last_verification": s.last_verification.as_ref().map(|v| json!({
            "uuid": v.uuid,
            "summary": v.summary,
            "disagreements": v.disagreements.iter().map(|d| json!({
                "group": d.group, "ranks": d.ranks, "detail": d.detail,
            })).collect::<Vec<_>>(),
            "released": v.released,
            "missing": v.missing,
            "held": v.held,
        })),
        "clusterd": s.clusterd.as_ref().map(|c| json!({
            "addr": c.addr,
            "connected": c.connected,
            "detail": c.detail,
            "driving": (!c.driving.is_empty()).then_some(&c.driving),
        })),
        "in_calls": s.in_calls.as_ref().map(|c| json!({
            "uuid": c.uuid, "ranks": c.ranks,
        })),
        "training_stop": s.training_stop.as_ref().map(training_stop_json),
        "last_training_stop": s.last_training_stop.as_ref().map(training_stop_json),
        "journal_error": (!s.journal_error.is_empty()).then_some(&s.journal_error),
        "hold": s.hold.as_ref().map(|h| json!({
            "held_ms": h.held_ms, "stops_in_ms": h.stops_in_ms,
        })),
        "stalled_ranks": s.stalled_ranks.iter().map(|h| json!({
            "rank": h.rank, "last_step": h.last_step, "stalled_for_ms": h.stalled_for_ms,
        })).collect::<Vec<_>>(),
        "restarts": s.restarts.as_ref().map(|r| json!({
            "done": r.done,
            "max": r.max,
            "cause": (!r.cause.is_empty()).then_some(&r.cause),
            "owed": (!r.owed.is_empty()).then_some(&r.owed),
        })),
    })
}

/// A stop of training as JSON (`status --json`, `recover --stop-training --json`).
pub fn training_stop_json(t: &proto::TrainingStop) -> serde_json::Value {
    json!({
        "uuid": t.uuid,
        "by": t.by,
        "reason": t.reason,
        "phase": t.phase,
        "stopping": t.stopping,
        "not_back": t.not_back,
        "waiting_for": t.waiting_for,
        "then": t.then,
        "restart": (t.then == "restart").then_some(t.restart),
        "unreachable": t.unreachable,
        "old_back": t.old_back,
        "overdue": t.overdue,
        "trained_to": t.trained_to,
        "last_words": t.last_words.as_ref().map(|l| json!({
            "taken": l.taken, "detail": l.detail,
        })),
        "resume": (!t.resume.is_empty()).then_some(&t.resume),
    })
}

/// The `restart` line of `taskd status`: how many of the budget, whether one is under way or
/// owed, and its cause.
fn restarts_text(r: &proto::Restarts, stop: Option<&proto::TrainingStop>) -> String {
    let of = r.max.map_or(String::new(), |m| format!(" of {m}"));
    if !r.owed.is_empty() {
        return format!(
            "{}{of} done; one owed, starting once the operation in flight ends ({})",
            r.done, r.owed
        );
    }
    let under_way = stop.is_some_and(|t| t.then == "restart" && t.restart == r.done);
    match (under_way, r.cause.is_empty()) {
        (true, _) => format!("{}{of}, under way ({})", r.done, r.cause),
        (false, false) => format!("{}{of} done; the last for: {}", r.done, r.cause),
        (false, true) => format!("{}{of} done", r.done),
    }
}

/// The `clusterd` line of `taskd status`: connected or not, and the pause it drives.
fn clusterd_text(c: &proto::ClusterdLink) -> String {
    let mut t = if c.connected {
        format!("connected to {}", c.addr)
    } else {
        format!("NOT connected to {} ({})", c.addr, c.detail)
    };
    if !c.driving.is_empty() {
        let _ = write!(t, "; driving pause {}", c.driving);
    }
    t
}

/// The recent results of a status, one row each; a `trigger` column when the automatic
/// failover started any of them.
fn recent_text(out: &mut String, recent: &[proto::OperationResult]) {
    if recent.is_empty() {
        return;
    }
    let auto = recent.iter().any(|r| r.trigger == Trigger::Auto.as_str());
    let trigger = |t: &str| {
        if auto {
            format!("{t:<8}  ")
        } else {
            String::new()
        }
    };
    let _ = writeln!(
        out,
        "\n{:<36}  {:<10}  {}{:<9}  {:>10}  {:<8}  error",
        "uuid",
        "direction",
        trigger("trigger"),
        "result",
        "total ms",
        "rolled"
    );
    for r in recent {
        let total = r.phases.as_ref().map(|p| p.total_ms).unwrap_or_default();
        let who = if r.trigger.is_empty() {
            Trigger::Operator.as_str()
        } else {
            &r.trigger
        };
        let _ = writeln!(
            out,
            "{:<36}  {:<10}  {}{:<9}  {:>10.3}  {:<8}  {}",
            r.uuid,
            r.direction,
            trigger(who),
            r.result,
            total,
            if r.rolled_back { "yes" } else { "no" },
            r.error
        );
    }
}

/// `taskd status` for people.
pub fn status_text(s: &proto::JobStatus) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "job        {}", s.job_id);
    // While training is stopped the job's state is the stop's: what it waits for is next.
    match &s.training_stop {
        Some(t) => {
            let overdue = if t.overdue { ", OVERDUE" } else { "" };
            let _ = writeln!(
                out,
                "state      {} (training stopped by {}{overdue})",
                t.phase, t.by
            );
            let _ = writeln!(out, "stop       {}; {}", t.reason, t.waiting_for);
            if !t.resume.is_empty() {
                let _ = writeln!(out, "resume     {}", t.resume);
            }
        }
        None => {
            let _ = writeln!(out, "state      {}", s.state);
        }
    }
    let _ = writeln!(
        out,
        "workers    {}/{} registered, {} nodes connected",
        s.workers_registered, s.workers_expected, s.nodes_connected
    );
    let backup: Vec<String> = s.ranks_on_backup.iter().map(|r| r.to_string()).collect();
    let backup = if backup.is_empty() {
        "none".to_string()
    } else {
        backup.join(", ")
    };
    // Once the old processes are gone, the table is the old one's: the new ones start on
    // their default NIC, and the verification round rebuilds it from them.
    match &s.training_stop {
        Some(t) if t.phase == "restarting" || t.phase == "restarted" => {
            let _ = writeln!(
                out,
                "on backup  none in the new processes (they start on their default NIC; before the stop: {backup})"
            );
        }
        _ => {
            let _ = writeln!(out, "on backup  {backup}");
        }
    }
    match &s.in_flight {
        Some(f) => {
            let _ = writeln!(
                out,
                "in flight  {} in {} (waiting for {} ranks)",
                f.uuid,
                f.phase,
                f.pending_ranks.len()
            );
        }
        None => {
            let _ = writeln!(out, "in flight  none");
        }
    }
    let verified = if s.verified {
        "yes"
    } else {
        "no (switches wait for every rank's report)"
    };
    let _ = writeln!(out, "verified   {verified}");
    if let Some(r) = &s.restarts {
        let _ = writeln!(
            out,
            "restart    {}",
            restarts_text(r, s.training_stop.as_ref())
        );
    }
    if let Some(h) = &s.hold {
        let held = std::time::Duration::from_millis(h.held_ms);
        let _ = match h.stops_in_ms {
            Some(ms) => writeln!(
                out,
                "held       for {held:.1?}; training stops by itself in {:.1?} (the hold policy) unless an operator recovers the job",
                std::time::Duration::from_millis(ms)
            ),
            None => writeln!(
                out,
                "held       for {held:.1?}; waiting for an operator (or for the recovery in flight)"
            ),
        };
    }
    troubles_text(&mut out, s);
    recent_text(&mut out, &s.recent);
    out
}

/// The lines of `taskd status` that only a job in some trouble has: a journal that cannot be
/// written, ClusterD's link, a verification that found disagreements, ranks inside their calls,
/// lost ranks.
fn troubles_text(out: &mut String, s: &proto::JobStatus) {
    if !s.journal_error.is_empty() {
        let _ = writeln!(
            out,
            "journal    CANNOT BE WRITTEN, no operation starts until it can: {}",
            s.journal_error
        );
    }
    // Only a manager that is ClusterD's client has the line.
    if let Some(c) = &s.clusterd {
        let _ = writeln!(out, "clusterd   {}", clusterd_text(c));
    }
    if let Some(v) = s
        .last_verification
        .as_ref()
        .filter(|v| !v.disagreements.is_empty() || !v.missing.is_empty())
    {
        let _ = writeln!(out, "verify     {}", v.summary);
    }
    if let Some(c) = &s.in_calls {
        let _ = writeln!(
            out,
            "in calls   {} not answered the NIC-set calls of {} (recover waits for them)",
            taskd_core::display::ranks_with(
                &taskd_core::display::short_list(&c.ranks),
                "has",
                "have"
            ),
            c.uuid
        );
    }
    // Ranks whose process or connection is gone, until they register again.
    for (i, l) in s.lost_ranks.iter().enumerate() {
        let label = if i == 0 { "lost" } else { "" };
        let how = match l.how.as_str() {
            "unreachable" => " (unreachable: it may be training on)",
            "ended" => " (ended)",
            _ => "",
        };
        let _ = writeln!(out, "{label:<10} rank {}{how}: {}", l.rank, l.reason);
    }
    for (i, h) in s.stalled_ranks.iter().enumerate() {
        let label = if i == 0 { "hung" } else { "" };
        let _ = writeln!(
            out,
            "{label:<10} rank {}: no step finished for {:.1} s after step {}",
            h.rank,
            h.stalled_for_ms as f64 / 1000.0,
            h.last_step
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_inside_calls_are_named_in_text_and_json() {
        let mut s = proto::JobStatus {
            job_id: "j".into(),
            state: "paused".into(),
            ..proto::JobStatus::default()
        };
        assert!(!status_text(&s).contains("in calls"));
        assert!(status_json(&s)["in_calls"].is_null());
        s.in_calls = Some(proto::InCalls {
            uuid: "u-1".into(),
            ranks: vec![1, 3],
        });
        assert!(
            status_text(&s)
                .contains("in calls   ranks 1, 3 have not answered the NIC-set calls of u-1"),
            "{}",
            status_text(&s)
        );
        assert_eq!(status_json(&s)["in_calls"]["ranks"], json!([1, 3]));
    }

    #[test]
    fn hung_ranks_are_named_with_their_last_step_in_text_and_json() {
        let s = proto::JobStatus {
            job_id: "j".into(),
            state: "running".into(),
            stalled_ranks: vec![proto::StalledRank {
                rank: 3,
                last_step: 41,
                stalled_for_ms: 1_836_500,
            }],
            ..proto::JobStatus::default()
        };
        let text = status_text(&s);
        assert!(
            text.contains("hung       rank 3: no step finished for 1836.5 s after step 41"),
            "{text}"
        );
        assert_eq!(status_json(&s)["stalled_ranks"][0]["last_step"], json!(41));
    }

    #[test]
    fn a_stop_of_training_says_what_it_waits_for() {
        let mut s = proto::JobStatus {
            job_id: "j".into(),
            state: "needs_recovery".into(),
            ..proto::JobStatus::default()
        };
        s.training_stop = Some(proto::TrainingStop {
            uuid: "u-2".into(),
            by: "policy".into(),
            reason: "the job was paused for 300s".into(),
            phase: "restarting".into(),
            stopping: vec![],
            not_back: vec![2, 5],
            waiting_for: "ranks 2, 5 are not back yet".into(),
            then: "restart".into(),
            restart: 1,
            ..proto::TrainingStop::default()
        });
        s.restarts = Some(proto::Restarts {
            done: 1,
            max: Some(3),
            cause: "rank 5 lost: its process ended (killed by SIGKILL)".into(),
            owed: String::new(),
        });
        let text = status_text(&s);
        assert!(
            text.contains("state      restarting (training stopped by policy)\n"),
            "{text}"
        );
        assert!(
            text.contains("stop       the job was paused for 300s; ranks 2, 5 are not back yet"),
            "{text}"
        );
        assert!(
            text.contains(
                "restart    1 of 3, under way (rank 5 lost: its process ended (killed by SIGKILL))"
            ),
            "{text}"
        );
        let j = status_json(&s);
        assert_eq!(j["training_stop"]["not_back"], json!([2, 5]));
        assert_eq!(j["training_stop"]["phase"], "restarting");
        assert!(j["last_training_stop"].is_null());
    }

    #[test]
    fn the_clusterd_line_shows_only_on_a_clusterd_client() {
        let mut s = proto::JobStatus {
            job_id: "j".into(),
            state: "running".into(),
            ..proto::JobStatus::default()
        };
        assert!(!status_text(&s).contains("clusterd"));
        assert!(status_json(&s)["clusterd"].is_null());
        s.clusterd = Some(proto::ClusterdLink {
            addr: "10.96.0.7:8899".into(),
            connected: true,
            detail: "session up".into(),
            driving: "U".into(),
        });
        assert!(
            status_text(&s).contains("clusterd   connected to 10.96.0.7:8899; driving pause U\n"),
            "{}",
            status_text(&s)
        );
        assert_eq!(status_json(&s)["clusterd"]["driving"], "U");
        s.clusterd = Some(proto::ClusterdLink {
            addr: "10.96.0.7:8899".into(),
            connected: false,
            detail: "cannot connect".into(),
            driving: String::new(),
        });
        assert!(status_text(&s).contains("NOT connected to 10.96.0.7:8899 (cannot connect)"));
        assert!(status_json(&s)["clusterd"]["driving"].is_null());
        assert_eq!(status_json(&s)["clusterd"]["connected"], false);
    }

    fn result(uuid: &str, trigger: &str) -> proto::OperationResult {
        proto::OperationResult {
            uuid: uuid.into(),
            direction: "to_backup".into(),
            result: "succeeded".into(),
            trigger: trigger.into(),
            ..Default::default()
        }
    }

    #[test]
    fn the_trigger_column_appears_once_an_automatic_result_is_listed() {
        let mut out = String::new();
        recent_text(&mut out, &[result("a", "operator"), result("b", "")]);
        assert!(!out.contains("trigger"), "{out}");
        let mut out = String::new();
        recent_text(&mut out, &[result("a", ""), result("b", "auto")]);
        let lines: Vec<&str> = out.lines().skip(1).collect();
        assert!(lines[0].contains("direction   trigger   result"), "{out}");
        // An older manager's result, which does not say, is an operator's.
        assert!(
            lines[1].contains("to_backup   operator  succeeded"),
            "{out}"
        );
        assert!(
            lines[2].contains("to_backup   auto      succeeded"),
            "{out}"
        );
    }
}
