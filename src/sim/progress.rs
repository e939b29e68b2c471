//! Readable progress: renders the manager's [`ProgressEvent`]s as they happen and the final
//! table of operations.
//!
//! On a terminal the phase waiting for answers is one line redrawn in place with a bar
//! (`[#########-----------]  40/64 ranks`); anywhere else (a pipe, a file, CI) every line is
//! printed once and never rewritten, so logs stay clean. `taskd sim` and `taskd switch --wait`
//! render through this module.

use super::report::OperationSummary;
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::io::{self, IsTerminal, Write};
use std::time::Duration;
use taskd_actors::progress::{ProgressEvent, ProgressKind};
use taskd_core::operation::{OperationReport, Outcome};
use taskd_core::protocol::Phase;
use taskd_core::OperationId;

/// Width of the in-place bar, in characters.
const BAR: usize = 24;
/// Targets named in an operation's heading before the rest are counted.
const TARGETS_SHOWN: usize = 8;

/// Prints progress events as lines.
pub struct ProgressPrinter<W: Write> {
    out: W,
    /// Terminal: redraw the waiting phase in place.
    live: bool,
    /// Operations seen, to number their headings.
    operations: usize,
    /// The phase running and how many ranks it waited for at its start.
    phase: Option<(Phase, usize)>,
    /// An in-place line is on screen and must be cleared before the next line.
    line_open: bool,
    /// Operations the automatic failover started (their decisions come first).
    auto_ops: BTreeSet<OperationId>,
}

impl ProgressPrinter<io::Stdout> {
    /// Prints to stdout; in place only when stdout is a terminal.
    pub fn stdout() -> Self {
        let live = io::stdout().is_terminal();
        ProgressPrinter::new(io::stdout(), live)
    }
}

impl<W: Write> ProgressPrinter<W> {
    /// `live`: redraw the waiting phase in place (only for a terminal).
    pub fn new(out: W, live: bool) -> Self {
        ProgressPrinter {
            out,
            live,
            operations: 0,
            phase: None,
            line_open: false,
            auto_ops: BTreeSet::new(),
        }
    }

    /// The writer back, with everything printed so far (a test reads a `Vec<u8>`'s text).
    pub fn into_inner(self) -> W {
        self.out
    }

    /// Prints a line of the caller's between events (clearing an in-place line first).
    pub fn line(&mut self, text: &str) -> io::Result<()> {
        self.clear()?;
        writeln!(self.out, "{text}")?;
        self.out.flush()
    }

    fn clear(&mut self) -> io::Result<()> {
        if self.line_open {
            self.line_open = false;
            write!(self.out, "\r\x1b[2K")?;
        }
        Ok(())
    }

    /// Renders one event. Write errors (a closed pipe) are returned for the caller to ignore
    /// or not.
    pub fn event(&mut self, ev: &ProgressEvent) -> io::Result<()> {
        let at = fmt_duration(ev.at);
        match &ev.kind {
            ProgressKind::Started {
                job,
                direction,
                targets,
                ranks,
            } => {
                self.operations += 1;
                let mut names: Vec<String> = targets
                    .iter()
                    .take(TARGETS_SHOWN)
                    .map(|t| format!("{}:{} (rank {})", t.node, t.device, t.rank))
                    .collect();
                if targets.len() > TARGETS_SHOWN {
                    names.push(format!("... (+{})", targets.len() - TARGETS_SHOWN));
                }
                let auto = if self.auto_ops.contains(&ev.op) {
                    ", automatic"
                } else {
                    ""
                };
                self.line("")?;
                self.line(&format!(
                    "operation {} {} {direction}{auto} (job {job}, {ranks} ranks)",
                    self.operations, ev.op
                ))?;
                self.line(&format!("  targets   {}", names.join(", ")))
            }
            ProgressKind::PhaseStarted {
                phase,
                waiting,
                pause_step,
            } => {
                self.phase = Some((*phase, *waiting));
                let what = match (phase, pause_step) {
                    (Phase::Pause, Some(t)) => {
                        format!("every rank finishes step {t} and holds; waiting for {waiting}")
                    }
                    _ => format!("waiting for {waiting} ranks"),
                };
                self.line(&format!("  {at:>10}  {:<8}  {what}", phase.as_str()))?;
                self.bar(*phase, *waiting, ev.at)
            }
            ProgressKind::Waiting { phase, waiting } => self.bar(*phase, *waiting, ev.at),
            ProgressKind::PhaseFinished { phase, took } => {
                self.phase = None;
                self.line(&format!(
                    "  {at:>10}  {:<8}  done in {}",
                    phase.as_str(),
                    fmt_duration(*took)
                ))
            }
            ProgressKind::Finished(r) => self.finished(&at, r),
            ProgressKind::Links { report, at } => self.line(&format!(
                "  {:>10}  link      {}:{} {}",
                fmt_duration(*at),
                report.node,
                report.device,
                report.links
            )),
            ProgressKind::Decision(d) => {
                if let Some(op) = d.operation.filter(|_| d.is_move()) {
                    self.auto_ops.insert(op);
                }
                self.line(&format!("  {:>10}  auto      {d}", fmt_duration(d.at)))
            }
        }
    }

    /// The final result of an operation.
    fn finished(&mut self, at: &str, r: &OperationReport) -> io::Result<()> {
        self.phase = None;
        let mut text = format!(
            "  {at:>10}  result    {}",
            r.outcome.as_str().to_uppercase()
        );
        if r.outcome == Outcome::Failed {
            let _ = write!(
                text,
                " (rolled back: {}, job {})",
                if r.rolled_back { "yes" } else { "NO" },
                r.job_state.as_str()
            );
        }
        self.line(&text)?;
        if let Some(e) = &r.error {
            self.line(&format!("              reason    {e}"))?;
        }
        Ok(())
    }

    /// The in-place line of the phase running (terminal only).
    fn bar(&mut self, phase: Phase, waiting: usize, at: Duration) -> io::Result<()> {
        let Some((current, total)) = self.phase.filter(|(p, _)| *p == phase) else {
            return Ok(());
        };
        if !self.live || total == 0 {
            return Ok(());
        }
        let done = total.saturating_sub(waiting);
        let filled = done * BAR / total;
        write!(
            self.out,
            "\r\x1b[2K  {:>10}  {:<8}  [{}{}] {done:>w$}/{total} ranks",
            fmt_duration(at),
            current.as_str(),
            "#".repeat(filled),
            "-".repeat(BAR - filled),
            w = total.to_string().len(),
        )?;
        self.line_open = true;
        self.out.flush()
    }

    /// Clears an in-place line left on screen.
    pub fn finish(&mut self) -> io::Result<()> {
        self.clear()?;
        self.out.flush()
    }
}

/// `0.42 ms`, `12.3 ms`, `4.56 s`, `2m05s`.
pub fn fmt_duration(d: Duration) -> String {
    fmt_ms(d.as_secs_f64() * 1e3)
}

/// [`fmt_duration`] of a number of milliseconds.
pub fn fmt_ms(ms: f64) -> String {
    if ms < 10.0 {
        format!("{ms:.2} ms")
    } else if ms < 1000.0 {
        format!("{ms:.1} ms")
    } else if ms < 60_000.0 {
        format!("{:.2} s", ms / 1e3)
    } else {
        let s = (ms / 1e3).round() as u64;
        format!("{}m{:02}s", s / 60, s % 60)
    }
}

/// Operation `n`'s row of the final table.
fn row(n: usize, op: &OperationSummary) -> Vec<String> {
    let dur = |v: Option<f64>| v.map(fmt_ms).unwrap_or_else(|| "-".into());
    let ran = op.result != Outcome::Rejected.as_str() || op.phases_ms.total > 0.0;
    vec![
        n.to_string(),
        op.uuid.chars().take(8).collect(),
        // An automatic operation says so; an operator's table reads as before.
        if op.is_auto() {
            format!("{} (auto)", op.direction)
        } else {
            op.direction.clone()
        },
        op.targets.len().to_string(),
        op.result.clone(),
        op.pause_step
            .map(|s| s.to_string())
            .unwrap_or_else(|| "-".into()),
        dur(op.phases_ms.pause),
        dur(op.phases_ms.switch),
        dur(op.phases_ms.rollback),
        dur(op.phases_ms.resume),
        dur(ran.then_some(op.phases_ms.total)),
        dur(op.stall_ms),
    ]
}

/// The final table: one row per operation, then the reason of each that did not succeed.
pub fn table(ops: &[OperationSummary]) -> String {
    let header = [
        "#",
        "operation",
        "direction",
        "targets",
        "result",
        "pause step",
        "pause",
        "switch",
        "rollback",
        "resume",
        "total",
        "stall",
    ];
    let rows: Vec<Vec<String>> = ops
        .iter()
        .enumerate()
        .map(|(i, op)| row(i + 1, op))
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    // Numbers right-aligned, words left-aligned.
    let right = [
        true, false, false, true, false, true, true, true, true, true, true, true,
    ];
    let mut s = String::new();
    let mut put = |cells: &[String]| {
        let line: Vec<String> = cells
            .iter()
            .zip(&widths)
            .zip(right)
            .map(|((c, w), r)| {
                if r {
                    format!("{c:>w$}")
                } else {
                    format!("{c:<w$}")
                }
            })
            .collect();
        let _ = writeln!(s, "  {}", line.join("  ").trim_end());
    };
    put(&header.map(String::from));
    for row in &rows {
        put(row);
    }
    for (i, op) in ops.iter().enumerate() {
        if let Some(e) = &op.error {
            let _ = writeln!(s, "  {}: {e}", i + 1);
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::report::{PhasesMs, TargetSummary};
    use taskd_core::command::{Direction, RankTarget};
    use taskd_core::operation::OperationReport;
    use taskd_core::operation::Trigger;
    use taskd_core::{DeviceId, GlobalRank, JobId, NodeName, OperationId};

    fn id() -> OperationId {
        OperationId(uuid::Uuid::from_u128(
            0x2b1c_4d5e_0000_4000_8000_0000_0000_0001,
        ))
    }

    fn ev(ms: u64, kind: ProgressKind) -> ProgressEvent {
        ProgressEvent {
            op: id(),
            at: Duration::from_millis(ms),
            kind,
        }
    }

    fn events() -> Vec<ProgressEvent> {
        let target = RankTarget {
            node: NodeName("node-1".into()),
            device: DeviceId(0),
            rank: GlobalRank(4),
            use_backup: true,
        };
        let report = OperationReport {
            applied: true,
            pause_step: Some(7),
            ..OperationReport::new(
                id(),
                Direction::ToBackup,
                vec![target.clone()],
                Outcome::Succeeded,
            )
        };
        vec![
            ev(
                0,
                ProgressKind::Started {
                    job: JobId("j".into()),
                    direction: Direction::ToBackup,
                    targets: vec![target],
                    ranks: 8,
                },
            ),
            ev(
                0,
                ProgressKind::PhaseStarted {
                    phase: Phase::Sample,
                    waiting: 8,
                    pause_step: None,
                },
            ),
            ev(
                1,
                ProgressKind::Waiting {
                    phase: Phase::Sample,
                    waiting: 4,
                },
            ),
            ev(
                2,
                ProgressKind::PhaseFinished {
                    phase: Phase::Sample,
                    took: Duration::from_millis(2),
                },
            ),
            ev(
                2,
                ProgressKind::PhaseStarted {
                    phase: Phase::Pause,
                    waiting: 8,
                    pause_step: Some(7),
                },
            ),
            ev(1500, ProgressKind::Finished(Box::new(report))),
        ]
    }

    #[test]
    fn plain_output_is_one_line_per_step_and_never_rewritten() {
        let mut p = ProgressPrinter::new(Vec::new(), false);
        for e in events() {
            p.event(&e).unwrap();
        }
        p.finish().unwrap();
        let text = String::from_utf8(p.into_inner()).unwrap();
        assert!(!text.contains('\r') && !text.contains('\x1b'), "{text:?}");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [
                "",
                "operation 1 2b1c4d5e-0000-4000-8000-000000000001 to_backup (job j, 8 ranks)",
                "  targets   node-1:0 (rank 4)",
                "     0.00 ms  sample    waiting for 8 ranks",
                "     2.00 ms  sample    done in 2.00 ms",
                "     2.00 ms  pause     every rank finishes step 7 and holds; waiting for 8",
                "      1.50 s  result    SUCCEEDED",
            ]
        );
    }

    #[test]
    fn automatic_failover_says_what_it_saw_and_decided_before_its_operation() {
        use taskd_core::auto::{AutoAction, AutoDecision, AutoReason, Links};
        use taskd_core::protocol::LinkReport;
        let links = Links::known(false, true);
        let report = LinkReport {
            node: NodeName("node-1".into()),
            device: DeviceId(0),
            links: links.clone(),
            from_kernel: false,
        };
        let decision = AutoDecision {
            node: NodeName("node-1".into()),
            device: DeviceId(0),
            action: AutoAction::ToBackup,
            reason: AutoReason::PrimaryDown,
            links,
            at: Duration::from_millis(1250),
            operation: Some(id()),
        };
        let mut all = vec![
            ev(
                0,
                ProgressKind::Links {
                    report,
                    at: Duration::from_millis(1200),
                },
            ),
            ev(0, ProgressKind::Decision(decision)),
        ];
        all.extend(events().into_iter().take(1));
        let mut p = ProgressPrinter::new(Vec::new(), false);
        for e in &all {
            p.event(e).unwrap();
        }
        let text = String::from_utf8(p.into_inner()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[..4],
            [
                "      1.20 s  link      node-1:0 primary down, backup up",
                "      1.25 s  auto      node-1:0 to_backup: its primary link is not up (primary down, backup up)",
                "",
                "operation 1 2b1c4d5e-0000-4000-8000-000000000001 to_backup, automatic (job j, 8 ranks)",
            ]
        );
    }

    #[test]
    fn a_terminal_gets_a_bar_redrawn_in_place() {
        let mut p = ProgressPrinter::new(Vec::new(), true);
        for e in &events()[..3] {
            p.event(e).unwrap();
        }
        let text = String::from_utf8(p.into_inner()).unwrap();
        let last = text.rsplit('\r').next().unwrap();
        assert!(
            last.contains("[############------------] 4/8 ranks"),
            "{text:?}"
        );
        // The next line clears the bar first.
        let mut p = ProgressPrinter::new(Vec::new(), true);
        for e in &events()[..4] {
            p.event(e).unwrap();
        }
        let text = String::from_utf8(p.into_inner()).unwrap();
        assert!(text.ends_with("\r\x1b[2K     2.00 ms  sample    done in 2.00 ms\n"));
    }

    #[test]
    fn durations_read_well_from_microseconds_to_minutes() {
        assert_eq!(fmt_ms(0.4213), "0.42 ms");
        assert_eq!(fmt_ms(12.345), "12.3 ms");
        assert_eq!(fmt_ms(4560.0), "4.56 s");
        assert_eq!(fmt_ms(125_000.0), "2m05s");
    }

    #[test]
    fn the_table_aligns_columns_and_lists_reasons() {
        let op = |uuid: &str, result: &str, error: Option<&str>| OperationSummary {
            journal_error: None,
            hold: None,
            uuid: uuid.into(),
            direction: "to_backup".into(),
            targets: vec![TargetSummary {
                node: "node-1".into(),
                device: 0,
                rank: 4,
                use_backup: true,
            }],
            result: result.into(),
            error: error.map(String::from),
            rolled_back: result == "failed",
            pause_step: Some(12),
            phases_ms: PhasesMs {
                pause: Some(3.25),
                switch: Some(1.5),
                resume: Some(0.25),
                rollback: (result == "failed").then_some(2.0),
                total: 7.0,
            },
            stall_ms: Some(5.0),
            job_state: "running".into(),
            applied: result == "succeeded",
            rank_errors: Vec::new(),
            lost_ranks: Vec::new(),
            trigger: Trigger::Operator,
        };
        let t = table(&[
            op("aaaaaaaa-1", "succeeded", None),
            op("bbbbbbbb-2", "failed", Some("rank 3 failed in switch")),
        ]);
        let auto = OperationSummary {
            journal_error: None,
            hold: None,
            trigger: Trigger::Auto,
            ..op("cccccccc-3", "succeeded", None)
        };
        assert!(table(&[auto]).contains("  1  cccccccc   to_backup (auto)  "));
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 4, "{t}");
        assert!(
            lines[0].starts_with("  #  operation  direction  targets  result"),
            "{t}"
        );
        assert!(
            lines[1].starts_with("  1  aaaaaaaa   to_backup        1  succeeded"),
            "{t}"
        );
        assert!(
            lines[2].contains("failed") && lines[2].contains("2.00 ms"),
            "{t}"
        );
        assert!(lines[1].contains("  -  "), "no rollback: {t}");
        assert_eq!(lines[3], "  2: rank 3 failed in switch");
        // Every row is as wide as the header's columns.
        let end = lines[0].find("total").unwrap() + "total".len();
        assert_eq!(&lines[1][end - 7..end], "7.00 ms");
    }
}
