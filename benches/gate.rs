//! What the step gate costs the training loop: nanoseconds per `step_completed` with no
//! operation pending (the path every training step takes), measured over many calls.
//!
//! `cargo bench --bench gate`. Not part of `cargo test`.

use std::hint::black_box;
use std::time::Instant;
use taskd_actors::StepGate;

fn main() {
    let gate = StepGate::new();
    let calls: u64 = std::env::args()
        .skip_while(|a| a != "--calls")
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(50_000_000);
    // Warm up, then take the best of five runs (the least disturbed by other work).
    for step in 1..=1_000_000 {
        let _ = black_box(gate.step_completed(black_box(step)));
    }
    let mut best = f64::MAX;
    let mut next = 1_000_001u64;
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..calls {
            let _ = black_box(gate.step_completed(black_box(next)));
            next += 1;
        }
        let ns = t.elapsed().as_secs_f64() * 1e9 / calls as f64;
        best = best.min(ns);
    }
    // An empty loop of the same shape, to subtract the loop itself.
    let mut sink = 0u64;
    let t = Instant::now();
    for i in 0..calls {
        sink = sink.wrapping_add(black_box(i));
    }
    let empty = t.elapsed().as_secs_f64() * 1e9 / calls as f64;
    black_box(sink);
    println!(
        "step gate, no operation pending: {best:.2} ns per step ({:.2} ns over an empty loop), {calls} calls, best of 5",
        best - empty
    );
}
