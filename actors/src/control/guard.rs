//! Who may use the control API: an optional bearer token and a per-client rate limit, checked by
//! one tonic [`Interceptor`] in front of every operator service (`Recover` and `Control`), so no
//! method can forget it. (Mutual TLS is configured on the server itself, see
//! [`super::ControlConfig::tls`].)
//!
//! Each client address has two buckets: one for the calls that carry the token, one for those
//! that do not (no token, a wrong one). Guesses are rate-limited as any call, but a client
//! without the token on the operator's address (the same host, a NAT, a sidecar) drains only
//! the bucket of failures: the operator's calls, an emergency `recover` among them, still
//! pass.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tonic::service::Interceptor;
use tonic::{Request, Status};

/// A token bucket per client address: `burst` requests at once, refilled at `per_second`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RateLimit {
    /// Requests a client may send at once.
    pub burst: u32,
    /// Requests per second a client may send after its burst.
    pub per_second: f64,
}

/// The slowest refill a [`RateLimit`] may have: one request per 10,000 seconds. Slower is a
/// typo (`1e-300`) that would lock a client out for ever after its burst.
pub const MIN_PER_SECOND: f64 = 0.0001;

impl RateLimit {
    /// `Err` naming the value when the limit would refuse every request (a burst of 0, a
    /// refill slower than [`MIN_PER_SECOND`]) or is not a number.
    pub fn check(&self) -> Result<(), String> {
        if self.burst == 0 {
            return Err("the rate limit's burst is 0: every request would be refused".into());
        }
        if !(self.per_second.is_finite() && self.per_second >= MIN_PER_SECOND) {
            return Err(format!(
                "the rate limit's refill of {} requests per second must be a number of at least {MIN_PER_SECOND}",
                self.per_second
            ));
        }
        Ok(())
    }
}

impl Default for RateLimit {
    /// Generous for a person or a platform, tight enough that a script in a loop cannot
    /// flood the manager.
    fn default() -> Self {
        RateLimit {
            burst: 20,
            per_second: 5.0,
        }
    }
}

/// What [`Guard`] checks.
#[derive(Clone, Debug, Default)]
pub struct GuardConfig {
    /// When set, every request must carry `authorization: Bearer <token>`.
    pub token: Option<String>,
    /// Each client address's token bucket.
    pub rate: RateLimit,
}

struct Bucket {
    tokens: f64,
    at: Instant,
}

/// The most client addresses a guard keeps buckets for (per kind of call); past it, the
/// buckets that are full again are forgotten (a forgotten bucket is a full one).
const MAX_CLIENTS: usize = 4096;

/// Every client's buckets, by kind of call and address (`None`: a call with no address).
type Buckets = HashMap<(Kind, Option<IpAddr>), Bucket>;

/// Which of a client's buckets a call is charged to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Kind {
    /// A call that carries the token (every call when none is configured).
    Authenticated,
    /// A call without the token, or with a wrong one.
    Failed,
}

/// Checks every request before it reaches the manager: the interceptor of every operator
/// service. Clones share one set of buckets.
#[derive(Clone)]
pub struct Guard {
    cfg: Arc<GuardConfig>,
    buckets: Arc<Mutex<Buckets>>,
    /// The port's connections: one whose call passes is past its first request.
    connections: Option<Arc<crate::net::limits::Connections>>,
}

impl Interceptor for Guard {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        self.check(&req)?;
        Ok(req)
    }
}

impl Guard {
    /// A guard with its own buckets.
    pub fn new(cfg: GuardConfig) -> Self {
        Guard {
            cfg: Arc::new(cfg),
            buckets: Arc::new(Mutex::new(HashMap::new())),
            connections: None,
        }
    }

    /// Marks the connection of every call it lets through as past its first request in
    /// `connections` (so it is no longer closed at its deadline).
    pub(crate) fn with_connections(
        mut self,
        connections: Arc<crate::net::limits::Connections>,
    ) -> Self {
        self.connections = Some(connections);
        self
    }

    /// `Err` with `resource_exhausted` or `unauthenticated` when the request may not pass.
    /// Every request is charged to one of its client's buckets: the one of authenticated
    /// calls when it carries the token, the one of failures otherwise, so wrong-token guesses
    /// are rate-limited without locking out the client that has the token.
    fn check<T>(&self, req: &Request<T>) -> Result<(), Status> {
        let client = req.remote_addr().map(|a| a.ip());
        match self.authenticate(req) {
            Ok(()) => {
                if let (Some(c), Some(peer)) = (&self.connections, req.remote_addr()) {
                    c.served(peer);
                }
                self.take(Kind::Authenticated, client, Instant::now())
            }
            Err(refused) => {
                self.take(Kind::Failed, client, Instant::now())?;
                Err(refused)
            }
        }
    }

    /// `Err` with `unauthenticated` when a token is configured and `req` does not carry it.
    fn authenticate<T>(&self, req: &Request<T>) -> Result<(), Status> {
        let Some(want) = &self.cfg.token else {
            return Ok(());
        };
        let got = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        match got {
            None => Err(Status::unauthenticated(
                "this control port requires a bearer token (authorization: Bearer <token>)",
            )),
            Some(t) if !constant_time_eq(t.as_bytes(), want.as_bytes()) => {
                Err(Status::unauthenticated("the bearer token is not valid"))
            }
            Some(_) => Ok(()),
        }
    }

    fn take(&self, kind: Kind, client: Option<IpAddr>, now: Instant) -> Result<(), Status> {
        let rate = self.cfg.rate;
        let mut buckets = self.buckets.lock();
        if buckets.len() >= MAX_CLIENTS && !buckets.contains_key(&(kind, client)) {
            buckets.retain(|_, b| {
                let refill = now.saturating_duration_since(b.at).as_secs_f64() * rate.per_second;
                b.tokens + refill < f64::from(rate.burst)
            });
        }
        let b = buckets.entry((kind, client)).or_insert(Bucket {
            tokens: f64::from(rate.burst),
            at: now,
        });
        let refill = now.saturating_duration_since(b.at).as_secs_f64() * rate.per_second;
        b.tokens = (b.tokens + refill).min(f64::from(rate.burst));
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            Ok(())
        } else {
            let wait = if rate.per_second > 0.0 {
                Duration::from_secs_f64((1.0 - b.tokens) / rate.per_second)
            } else {
                Duration::MAX
            };
            Err(Status::resource_exhausted(format!(
                "rate limit: at most {} requests at once and {}/s per client; retry in {:.1}s",
                rate.burst,
                rate.per_second,
                wait.as_secs_f64().min(3600.0)
            )))
        }
    }
}

/// Compares without an early exit, so the time taken does not tell how much of a guess matched.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bucket_refills_with_time() {
        let g = Guard::new(GuardConfig {
            token: None,
            rate: RateLimit {
                burst: 2,
                per_second: 1.0,
            },
        });
        let t0 = Instant::now();
        let ip = Some(IpAddr::from([127, 0, 0, 1]));
        let take = |ip, t| g.take(Kind::Authenticated, ip, t);
        assert!(take(ip, t0).is_ok());
        assert!(take(ip, t0).is_ok());
        let e = take(ip, t0).unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        // Another client has its own bucket.
        assert!(take(Some(IpAddr::from([10, 0, 0, 1])), t0).is_ok());
        assert!(take(ip, t0 + Duration::from_millis(1100)).is_ok());
        assert!(take(ip, t0 + Duration::from_millis(1100)).is_err());
    }

    #[test]
    fn the_interceptor_wants_the_token() {
        let mut g = Guard::new(GuardConfig {
            token: Some("s3cret".into()),
            rate: RateLimit::default(),
        });
        let with = |auth: Option<&str>| {
            let mut r = Request::new(());
            if let Some(a) = auth {
                r.metadata_mut().insert("authorization", a.parse().unwrap());
            }
            r
        };
        let e = g.call(with(None)).unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
        assert!(e.message().contains("Bearer"), "{}", e.message());
        let e = g.call(with(Some("Bearer nope"))).unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
        assert!(g.call(with(Some("Bearer s3cret"))).is_ok());
    }

    #[test]
    fn wrong_token_guesses_are_charged_to_the_bucket() {
        let mut g = Guard::new(GuardConfig {
            token: Some("s3cret".into()),
            rate: RateLimit {
                burst: 3,
                per_second: MIN_PER_SECOND,
            },
        });
        let guess = |n: u32| {
            let mut r = Request::new(());
            let v = format!("Bearer guess{n}").parse().unwrap();
            r.metadata_mut().insert("authorization", v);
            r
        };
        let codes: Vec<_> = (0..5)
            .map(|n| g.call(guess(n)).unwrap_err().code())
            .collect();
        use tonic::Code::{ResourceExhausted, Unauthenticated};
        assert_eq!(
            codes,
            [
                Unauthenticated,
                Unauthenticated,
                Unauthenticated,
                ResourceExhausted,
                ResourceExhausted
            ]
        );
    }

    /// A client without the token on the operator's address drains the bucket of failures
    /// only: the operator's calls still pass, and have a bucket of their own.
    #[test]
    fn failed_authentications_do_not_lock_out_the_client_with_the_token() {
        let mut g = Guard::new(GuardConfig {
            token: Some("s3cret".into()),
            rate: RateLimit {
                burst: 3,
                per_second: MIN_PER_SECOND,
            },
        });
        let with = |token: &str| {
            let mut r = Request::new(());
            let v = format!("Bearer {token}").parse().unwrap();
            r.metadata_mut().insert("authorization", v);
            r
        };
        for _ in 0..10 {
            let _ = g.call(with("guess"));
            let _ = g.call(Request::new(()));
        }
        let e = g.call(with("guess")).unwrap_err();
        assert_eq!(
            e.code(),
            tonic::Code::ResourceExhausted,
            "guesses are limited"
        );
        for n in 0..3 {
            assert!(g.call(with("s3cret")).is_ok(), "the operator's call {n}");
        }
        let e = g.call(with("s3cret")).unwrap_err();
        assert_eq!(
            e.code(),
            tonic::Code::ResourceExhausted,
            "and rate-limited too"
        );
    }

    /// The buckets of many addresses are forgotten once full again: a spray of addresses
    /// cannot grow the guard without bound.
    #[test]
    fn the_buckets_of_many_clients_stay_bounded() {
        let g = Guard::new(GuardConfig {
            token: None,
            rate: RateLimit {
                burst: 1,
                per_second: 1.0,
            },
        });
        let t0 = Instant::now();
        for n in 0..(3 * MAX_CLIENTS as u32) {
            let ip = Some(IpAddr::from(n.to_be_bytes()));
            let t = t0 + Duration::from_secs(u64::from(n));
            assert!(g.take(Kind::Authenticated, ip, t).is_ok());
        }
        assert!(g.buckets.lock().len() <= MAX_CLIENTS);
    }

    #[test]
    fn limits_that_refuse_everything_are_named() {
        assert!(RateLimit::default().check().is_ok());
        let zero = RateLimit {
            burst: 0,
            per_second: 1.0,
        };
        assert!(zero.check().unwrap_err().contains("burst is 0"));
        for bad in [
            0.0,
            -1.0,
            f64::NAN,
            f64::INFINITY,
            1e-300,
            MIN_PER_SECOND / 2.0,
        ] {
            let r = RateLimit {
                burst: 1,
                per_second: bad,
            };
            assert!(r.check().is_err(), "{bad}");
        }
    }

    #[test]
    fn tokens_compare_exactly() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }
}
