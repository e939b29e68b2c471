//! The tracing spans of one operation, as a log aggregator would line them up: the manager's
//! operation span with its phases nested under it, and on every proxy and worker a span with
//! the same uuid and a child per phase.
//!
//! The subscriber is process-global (the actors run on a thread of their own), so this file
//! has a binary of its own.

mod common;

use common::small;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use taskd::core::operation::Outcome;
use taskd::core::{DeviceId, NodeName};
use taskd::sim::{SimConfig, Simulation};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::Subscriber;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

#[derive(Clone, Debug)]
struct SpanRec {
    name: &'static str,
    /// Index of the parent span's record.
    parent: Option<usize>,
    fields: BTreeMap<String, String>,
}

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<SpanRec>>>);

/// A span's index in the capture, kept in its extensions (span ids are reused; these are not).
struct Index(usize);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let parent = if attrs.is_root() {
            None
        } else if let Some(p) = attrs.parent() {
            Some(p.clone())
        } else {
            ctx.current_span().id().cloned()
        };
        let parent = parent.and_then(|p| {
            ctx.span(&p)
                .and_then(|s| s.extensions().get::<Index>().map(|i| i.0))
        });
        let mut fields = BTreeMap::new();
        attrs.record(&mut Fields(&mut fields));
        let mut spans = self.0.lock().unwrap();
        spans.push(SpanRec {
            name: attrs.metadata().name(),
            parent,
            fields,
        });
        let index = spans.len() - 1;
        drop(spans);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(Index(index));
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(index) = ctx
            .span(id)
            .and_then(|s| s.extensions().get::<Index>().map(|i| i.0))
        else {
            return;
        };
        let mut spans = self.0.lock().unwrap();
        values.record(&mut Fields(&mut spans[index].fields));
    }
}

#[test]
fn an_operation_is_one_span_tree_per_role_with_its_uuid_and_phases() {
    let capture = Capture::default();
    let subscriber = tracing_subscriber::registry()
        .with(capture.clone())
        .with(tracing_subscriber::filter::LevelFilter::DEBUG);
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");

    let cfg = SimConfig {
        devices_per_node: 2,
        steps_between: 1,
        ..small()
    };
    let sim = Simulation::start(&cfg).unwrap();
    let cmd = sim.command(&[(NodeName("node-1".into()), vec![DeviceId(0)])], true);
    let report = sim.job().run(cmd).unwrap();
    assert_eq!(report.outcome, Outcome::Succeeded, "{report}");
    let uuid = report.id.to_string();
    let spans = capture.0.lock().unwrap().clone();
    sim.finish();

    let of = |role: &str, name: &str| -> Vec<(usize, &SpanRec)> {
        spans
            .iter()
            .enumerate()
            .filter(|(_, s)| {
                s.name == name
                    && s.fields.get("role").map(String::as_str) == Some(role)
                    && s.fields.get("uuid") == Some(&uuid)
            })
            .collect()
    };
    let phases_under = |parent: usize| -> Vec<String> {
        spans
            .iter()
            .filter(|s| s.name == "phase" && s.parent == Some(parent))
            .map(|s| {
                assert_eq!(s.fields["uuid"], uuid, "{s:?}");
                s.fields["phase"].clone()
            })
            .collect()
    };
    let all_phases = ["sample", "pause", "switch", "resume"];

    // The manager: one operation span with the command's facts, its phases under it.
    let manager = of("manager", "operation");
    assert_eq!(manager.len(), 1, "{spans:#?}");
    let (op, rec) = manager[0];
    assert_eq!(rec.parent, None);
    assert_eq!(rec.fields["job"], "sim");
    assert_eq!(rec.fields["targets"], "1");
    assert_eq!(rec.fields["direction"], "to_backup");
    assert_eq!(phases_under(op), all_phases);
    assert!(of("manager", "phase")
        .iter()
        .all(|(_, s)| s.parent == Some(op)));

    // Every proxy: its own root span for the operation (it may be on another machine), with
    // the same uuid and a child per phase.
    let proxies = of("proxy", "operation");
    let nodes: Vec<&str> = proxies
        .iter()
        .map(|(_, s)| s.fields["node"].as_str())
        .collect();
    assert_eq!(nodes, ["node-0", "node-1"]);
    for (i, s) in &proxies {
        assert_eq!(s.parent, None);
        assert_eq!(s.fields["targets"], "1");
        assert_eq!(phases_under(*i), all_phases, "{s:?}");
    }

    // Every worker likewise, and its HAL calls run inside its switch phase span, on the HAL
    // thread.
    let workers = of("worker", "operation");
    let mut ranks: Vec<&str> = workers
        .iter()
        .map(|(_, s)| s.fields["rank"].as_str())
        .collect();
    ranks.sort();
    assert_eq!(ranks, ["0", "1", "2", "3"]);
    for (i, s) in &workers {
        assert_eq!(s.parent, None);
        assert_eq!(phases_under(*i), all_phases, "{s:?}");
        let switch = spans
            .iter()
            .position(|p| {
                p.name == "phase" && p.parent == Some(*i) && p.fields["phase"] == "switch"
            })
            .unwrap();
        let hal_calls: Vec<&SpanRec> = spans
            .iter()
            .filter(|h| h.name == "hal_call" && h.parent == Some(switch))
            .collect();
        assert!(
            !hal_calls.is_empty(),
            "rank {}: {spans:#?}",
            s.fields["rank"]
        );
        assert!(hal_calls
            .iter()
            .all(|h| h.fields["op"] == "set_working_nic" && h.fields.contains_key("group")));
    }
}
