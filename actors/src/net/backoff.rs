//! How long a client waits before its next connection attempt: exponential, capped, jittered,
//! so a thousand workers whose proxy restarted do not knock on its door in the same instant.

use std::time::Duration;

pub(crate) struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
    /// xorshift state for the jitter.
    seed: u64,
}

impl Backoff {
    pub(crate) fn new(initial: Duration, max: Duration) -> Self {
        let seed = uuid::Uuid::new_v4().as_u64_pair().0 | 1;
        Backoff {
            initial,
            max: max.max(initial),
            next: initial,
            seed,
        }
    }

    /// The wait before the next attempt: the current step with +-25% jitter; the step doubles
    /// up to the maximum.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let base = self.next;
        self.next = (self.next * 2).min(self.max);
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        let jitter = (self.seed % 501) as f64 / 1000.0 - 0.25; // -0.25 ..= 0.25
        base.mul_f64(1.0 + jitter)
    }

    /// A connection succeeded: start from the initial wait next time.
    pub(crate) fn reset(&mut self) {
        self.next = self.initial;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap_with_bounded_jitter_and_resets() {
        let ms = Duration::from_millis;
        let mut b = Backoff::new(ms(100), ms(1000));
        let mut steps = Vec::new();
        for _ in 0..6 {
            steps.push(b.next_delay());
        }
        let nominal = [100, 200, 400, 800, 1000, 1000];
        for (d, n) in steps.iter().zip(nominal) {
            assert!(*d >= ms(n * 3 / 4) && *d <= ms(n * 5 / 4), "{d:?} vs {n}");
        }
        b.reset();
        assert!(b.next_delay() <= ms(125));
    }
}
