//! Bounded fuzzing of frame decoding (`taskd_actors::net::testing::{decode_up, decode_down}`), on
//! stable, inside `cargo test`: arbitrary bytes, arbitrary protobuf messages of the frame types
//! and corrupted valid frames must be decoded or refused, never panic; and what decodes must
//! survive a round trip through its protobuf form unchanged.

use proptest::prelude::*;
use prost::Message as _;
use taskd_actors::net::pb;
use taskd_actors::net::testing::{self as wire, decode_down, decode_up, UpMessage};

const MAX: usize = 4 << 20;

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("2d5c5f6e-7a3b-4c1d-9e8f-0a1b2c3d4e5f".to_string()),
        "[0-9a-f-]{0,40}",
        any::<String>(),
    ]
}

/// An operation id: mostly a valid UUID, so that decoding gets past it.
fn op() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => any::<u128>().prop_map(|n| uuid::Uuid::from_u128(n).to_string()),
        1 => text(),
    ]
}

fn phase() -> impl Strategy<Value = i32> {
    prop_oneof![4 => 1..=6i32, 1 => any::<i32>()]
}

fn caps() -> BoxedStrategy<Option<pb::Capabilities>> {
    let missing = (text(), text()).prop_map(|(by, what)| pb::Missing { by, what });
    prop::option::of(
        (
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            prop::collection::vec(missing, 0..3),
        )
            .prop_map(|(tsp, l2_retry, rdma, missing)| pb::Capabilities {
                tsp,
                l2_retry,
                rdma,
                missing,
            }),
    )
    .boxed()
}

/// One side's state, past the known ones and the missing 0 included.
fn side() -> BoxedStrategy<Option<pb::SideState>> {
    prop::option::of((-1i32..6, text()).prop_map(|(state, why)| pb::SideState { state, why }))
        .boxed()
}

fn hello() -> BoxedStrategy<pb::WorkerHello> {
    (
        text(),
        text(),
        any::<u32>(),
        caps(),
        any::<u64>(),
        any::<u32>(),
    )
        .prop_map(
            |(job, node, rank, capabilities, instance, generation)| pb::WorkerHello {
                job,
                node,
                rank,
                capabilities,
                instance,
                generation,
            },
        )
        .boxed()
}

fn rank_reply_body() -> impl Strategy<Value = Option<pb::rank_reply::Body>> {
    use pb::rank_reply::Body;
    let call = (text(), any::<u32>(), any::<u64>()).prop_map(|(group, group_size, digest)| {
        pb::AppliedCall {
            group,
            group_size,
            digest,
        }
    });
    let failed = (prop::option::of(text()), any::<bool>(), text()).prop_map(|(g, hal, m)| {
        Body::Failed(pb::RankError {
            group: g,
            hal: hal.then(Default::default),
            message: m,
        })
    });
    prop::option::weighted(
        0.9,
        prop_oneof![
            any::<u64>().prop_map(Body::SampledInStep),
            any::<u64>().prop_map(Body::SampledInFlight),
            any::<u64>().prop_map(Body::PausedStep),
            prop::collection::vec(call, 0..4)
                .prop_map(|calls| Body::Applied(pb::AppliedCalls { calls })),
            any::<u64>().prop_map(Body::ResumedStallNanos),
            failed,
        ],
    )
}

fn rank_reply() -> BoxedStrategy<pb::RankReply> {
    (any::<u32>(), op(), phase(), rank_reply_body())
        .prop_map(|(rank, op, phase, body)| pb::RankReply {
            rank,
            op,
            phase,
            body,
        })
        .boxed()
}

fn node_reply() -> BoxedStrategy<pb::NodeReply> {
    let health = (
        any::<u32>(),
        any::<bool>(),
        any::<bool>(),
        text(),
        side(),
        side(),
    )
        .prop_map(|(d, p, b, why, primary_side, backup_side)| pb::LinkHealth {
            device: d,
            primary_up: p,
            backup_up: b,
            primary_unknown: String::new(),
            backup_unknown: why,
            primary_side,
            backup_side,
        })
        .boxed();
    (
        text(),
        op(),
        phase(),
        prop::collection::vec(rank_reply(), 0..4),
        prop::collection::vec(health, 0..3),
    )
        .prop_map(|(node, op, phase, replies, health)| pb::NodeReply {
            node,
            op,
            phase,
            replies,
            health,
        })
        .boxed()
}

/// Boxed, as the strategies it is made of: the whole frame's strategy stays within a test
/// thread's stack.
fn up() -> BoxedStrategy<pb::Up> {
    use pb::proxy_message::Kind as P;
    use pb::worker_message::Kind as W;
    let worker = prop::option::weighted(
        0.9,
        prop_oneof![hello().prop_map(W::Hello), rank_reply().prop_map(W::Reply)],
    )
    .prop_map(|kind| pb::up::Body::Worker(pb::WorkerMessage { kind }));
    let proxy = prop::option::weighted(
        0.9,
        prop_oneof![
            hello().prop_map(P::WorkerUp),
            // Gone values past the known ones (a newer peer's) included.
            (any::<u32>(), text(), -1i32..4, any::<u64>(), any::<u32>()).prop_map(
                |(rank, reason, how, instance, generation)| P::WorkerLost(pb::WorkerLost {
                    rank,
                    reason,
                    how,
                    instance,
                    generation,
                })
            ),
            node_reply().prop_map(P::Reply),
            // Link states past the known ones (a newer peer's) and the missing 0 included.
            (
                text(),
                any::<u32>(),
                -1i32..6,
                -1i32..6,
                side(),
                side(),
                any::<bool>()
            )
                .prop_map(
                    |(node, device, primary, backup, primary_side, backup_side, from_kernel)| {
                        P::Links(pb::LinkReport {
                            node,
                            device,
                            primary,
                            backup,
                            primary_side,
                            backup_side,
                            from_kernel,
                        })
                    }
                )
                .boxed(),
        ],
    )
    .prop_map(|kind| pb::up::Body::Proxy(pb::ProxyMessage { kind }));
    let other = prop_oneof![
        Just(pb::up::Body::Heartbeat(pb::Heartbeat {})),
        Just(pb::up::Body::Register(Default::default())),
    ];
    (
        any::<u64>(),
        any::<u64>(),
        prop::option::weighted(0.95, prop_oneof![4 => worker, 4 => proxy, 1 => other]),
    )
        .prop_map(|(seq, ack, body)| pb::Up { seq, ack, body })
        .boxed()
}

fn directive() -> impl Strategy<Value = pb::Directive> {
    use pb::directive::Kind;
    let target = (text(), any::<u32>(), any::<u32>(), any::<bool>()).prop_map(
        |(node, device, rank, use_backup)| pb::RankTarget {
            node,
            device,
            rank,
            use_backup,
        },
    );
    let flag_list = || {
        prop::collection::vec(
            (any::<u32>(), any::<bool>())
                .prop_map(|(rank, use_backup)| pb::RankFlag { rank, use_backup }),
            0..4,
        )
    };
    let flags =
        (flag_list(), flag_list(), any::<u64>()).prop_map(|(targets, restate, call_timeout_ms)| {
            pb::NicTargets {
                targets,
                restate,
                call_timeout_ms,
            }
        });
    let kind = prop::option::weighted(
        0.9,
        prop_oneof![
            prop::collection::vec(target, 0..4)
                .prop_map(|targets| Kind::Sample(pb::SampleStep { targets })),
            any::<u64>().prop_map(|step| Kind::PauseAt(pb::PauseAt { step })),
            flags.clone().prop_map(Kind::SwitchNics),
            flags.prop_map(Kind::Rollback),
            Just(Kind::Resume(pb::ResumeTraining {})),
            (
                any::<String>(),
                -1i32..4,
                any::<u32>(),
                prop::collection::vec(any::<u64>(), 0..3)
            )
                .prop_map(|(reason, then, restart, only)| Kind::StopTraining(
                    pb::StopTraining {
                        reason,
                        then,
                        restart,
                        only
                    }
                )),
        ],
    );
    (op(), kind).prop_map(|(op, kind)| pb::Directive { op, kind })
}

fn down() -> BoxedStrategy<pb::Down> {
    let body = prop::option::weighted(
        0.95,
        prop_oneof![
            8 => directive().prop_map(pb::down::Body::Directive),
            1 => Just(pb::down::Body::Heartbeat(pb::Heartbeat {})),
            1 => Just(pb::down::Body::Registered(Default::default())),
        ],
    );
    (any::<u64>(), any::<u64>(), body)
        .prop_map(|(seq, ack, body)| pb::Down { seq, ack, body })
        .boxed()
}

/// Encodes a decoded message again, as its sender would.
fn reencode_up(m: UpMessage) -> Vec<u8> {
    let body = match m {
        UpMessage::Worker(w) => pb::up::Body::Worker(wire::worker_msg_to_pb(w)),
        UpMessage::Proxy(p) => pb::up::Body::Proxy(wire::proxy_msg_to_pb(p)),
    };
    pb::Up {
        seq: 1,
        ack: 0,
        body: Some(body),
    }
    .encode_to_vec()
}

/// Flips, truncates and extends valid frames.
fn corrupt(mut bytes: Vec<u8>, edits: &[(usize, u8)], cut: usize) -> Vec<u8> {
    for (at, b) in edits {
        if !bytes.is_empty() {
            let i = at % bytes.len();
            bytes[i] ^= b;
        }
    }
    bytes.truncate(bytes.len().saturating_sub(cut % 4));
    bytes
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = decode_up(&bytes, MAX);
        let _ = decode_down(&bytes, MAX);
        prop_assert!(decode_up(&bytes, bytes.len().saturating_sub(1)).is_err() || bytes.is_empty());
    }

    #[test]
    fn arbitrary_up_frames_decode_or_are_refused_and_round_trip(f in up()) {
        let bytes = f.encode_to_vec();
        if let Ok(Some(m)) = decode_up(&bytes, MAX) {
            let again = decode_up(&reencode_up(m.clone()), MAX);
            prop_assert_eq!(again.ok().flatten(), Some(m));
        }
    }

    #[test]
    fn arbitrary_down_frames_decode_or_are_refused_and_round_trip(f in down()) {
        let bytes = f.encode_to_vec();
        if let Ok(Some(d)) = decode_down(&bytes, MAX) {
            let frame = pb::Down {
                seq: 1,
                ack: 0,
                body: Some(pb::down::Body::Directive(wire::directive_to_pb(d.clone()))),
            };
            let again = decode_down(&frame.encode_to_vec(), MAX);
            prop_assert_eq!(again.ok().flatten(), Some(d));
        }
    }

    #[test]
    fn corrupted_frames_never_panic(
        u in up(),
        d in down(),
        edits in prop::collection::vec((any::<usize>(), 1..=255u8), 1..4),
        cut in any::<usize>(),
    ) {
        let _ = decode_up(&corrupt(u.encode_to_vec(), &edits, cut), MAX);
        let _ = decode_down(&corrupt(d.encode_to_vec(), &edits, cut), MAX);
        // A frame of the other direction is refused or read as something, never a panic.
        let _ = decode_up(&d.encode_to_vec(), MAX);
        let _ = decode_down(&u.encode_to_vec(), MAX);
    }
}

#[test]
fn a_valid_frame_decodes_and_an_oversized_one_is_refused() {
    let frame = pb::Down {
        seq: 3,
        ack: 2,
        body: Some(pb::down::Body::Directive(pb::Directive {
            op: "2d5c5f6e-7a3b-4c1d-9e8f-0a1b2c3d4e5f".into(),
            kind: Some(pb::directive::Kind::PauseAt(pb::PauseAt { step: 7 })),
        })),
    };
    let bytes = frame.encode_to_vec();
    let d = decode_down(&bytes, MAX).unwrap().unwrap();
    assert_eq!(
        d.kind,
        taskd_core::protocol::DirectiveKind::PauseAt { step: 7 }
    );
    let e = decode_down(&bytes, bytes.len() - 1).unwrap_err();
    assert!(e.to_string().contains("larger than the limit"), "{e}");
    let e = decode_down(&[0xff, 0xff, 0xff], MAX).unwrap_err();
    assert!(e.to_string().starts_with("undecodable frame"), "{e}");
}
