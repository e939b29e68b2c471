//! taskd-hal-ascend against stub vendor libraries compiled from `tests/stub/*.c`.
//!
//! Every test loads its own copy of each stub, so call logs never mix; libraries are found
//! through explicit paths or an environment map, never through the process environment.

mod support;

use std::path::Path;
use std::sync::Arc;
use support::{env, fresh, fresh_dir, install, Stub, StubControl};
use taskd_core::{
    plan_calls, DeviceId, GlobalRank, GroupInfo, GroupRank, HalError, HalErrorKind, HcclCode,
    HcclSetup, LinkHealth, NicSide, NodeHal, RankHal, SideState,
};
use taskd_hal_ascend::result::{self, AclError};
use taskd_hal_ascend::search::{self, LibrarySpec, LoadError, Origin};
use taskd_hal_ascend::sys::acl::{AclLib, MemMallocPolicy};
use taskd_hal_ascend::sys::dcmi::DcmiLib;
use taskd_hal_ascend::sys::hccl::{CommHandle, HcclDataType, HcclLib, HcclReduceOp};
use taskd_hal_ascend::{AscendNodeHal, AscendRankHal, Comm, DeviceBuffer, RootInfo, Stream};

fn hccl(test: &str) -> (Arc<HcclLib>, StubControl) {
    let path = fresh(Stub::Hccl, test);
    let lib = Arc::new(HcclLib::open_path(&path).expect("load hccl stub"));
    (lib, StubControl::attach(&path))
}

fn acl(test: &str) -> (Arc<AclLib>, StubControl) {
    let path = fresh(Stub::Acl, test);
    let lib = Arc::new(AclLib::open_path(&path).expect("load acl stub"));
    (lib, StubControl::attach(&path))
}

/// A framework-made communicator, borrowed.
fn framework_comm(
    lib: &Arc<HcclLib>,
    stub: &StubControl,
    name: &str,
    size: u32,
    rank: u32,
) -> Comm {
    // SAFETY: the stub just created it through the same loaded library, and never frees it.
    let h = unsafe { CommHandle::from_raw(stub.new_comm(name, size, rank)) }.expect("non-null");
    Comm::borrow(lib, h)
}

fn ranks(v: &[u32]) -> Vec<GlobalRank> {
    v.iter().copied().map(GlobalRank).collect()
}

mod loading {
    use super::*;

    type Opener =
        fn(&dyn Fn(&str) -> Option<std::ffi::OsString>) -> Result<std::path::PathBuf, LoadError>;

    /// Each library's own `open`, reporting which file it loaded.
    fn openers() -> [(Stub, &'static str, Opener); 3] {
        [
            (Stub::Hccl, "TASKD_HCCL_LIBRARY", |e| {
                HcclLib::open(e).map(|l| l.path().to_owned())
            }),
            (Stub::Acl, "TASKD_ACL_LIBRARY", |e| {
                AclLib::open(e).map(|l| l.path().to_owned())
            }),
            (Stub::Dcmi, "TASKD_DCMI_LIBRARY", |e| {
                DcmiLib::open(e).map(|l| l.path().to_owned())
            }),
        ]
    }

    #[test]
    fn ascend_home_path_wins_over_toolkit_home() {
        for (stub, _, open) in openers() {
            let root = fresh_dir("home_first");
            let home = install(stub, &root.join("home/lib64"));
            install(stub, &root.join("toolkit/lib64"));
            let e = env(&[
                ("ASCEND_HOME_PATH", &root.join("home")),
                ("ASCEND_TOOLKIT_HOME", &root.join("toolkit")),
            ]);
            assert_eq!(open(&e).unwrap(), home, "{stub:?}");
        }
    }

    #[test]
    fn toolkit_home_is_next_when_home_lacks_the_file() {
        for (stub, _, open) in openers() {
            let root = fresh_dir("toolkit_next");
            std::fs::create_dir_all(root.join("home/lib64")).unwrap();
            let toolkit = install(stub, &root.join("toolkit/lib64"));
            let e = env(&[
                ("ASCEND_HOME_PATH", &root.join("home")),
                ("ASCEND_TOOLKIT_HOME", &root.join("toolkit")),
            ]);
            assert_eq!(open(&e).unwrap(), toolkit, "{stub:?}");
        }
    }

    #[test]
    fn each_override_wins_over_the_search() {
        for (stub, var, open) in openers() {
            let root = fresh_dir("override");
            install(stub, &root.join("home/lib64"));
            let explicit = install(stub, &root.join("pinned"));
            let e = env(&[("ASCEND_HOME_PATH", &root.join("home")), (var, &explicit)]);
            assert_eq!(open(&e).unwrap(), explicit, "{stub:?}");
        }
    }

    #[test]
    fn an_override_that_does_not_load_is_not_silently_replaced() {
        for (stub, var, open) in openers() {
            let root = fresh_dir("bad_override");
            install(stub, &root.join("home/lib64"));
            let missing = root.join("typo/libnothing.so");
            let e = env(&[("ASCEND_HOME_PATH", &root.join("home")), (var, &missing)]);
            match open(&e).unwrap_err() {
                LoadError::NotFound { attempts, .. } => {
                    assert_eq!(attempts.len(), 1, "{stub:?}");
                    assert_eq!(attempts[0].candidate.path, missing);
                    assert_eq!(attempts[0].candidate.origin, Origin::Override(var));
                    assert!(
                        attempts[0].error.contains("No such file"),
                        "{}",
                        attempts[0].error
                    );
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn a_missing_library_lists_every_candidate_with_the_loader_message() {
        let spec = LibrarySpec {
            file_name: "libtaskd_absent_for_test.so",
            override_var: "TASKD_ABSENT_LIBRARY",
            well_known: &["/nonexistent/taskd/libtaskd_absent_for_test.so"],
        };
        let root = fresh_dir("absent");
        let e = env(&[
            ("ASCEND_HOME_PATH", &root.join("home")),
            ("ASCEND_TOOLKIT_HOME", &root.join("toolkit")),
        ]);
        let err = taskd_hal_ascend::sys::probe(&spec, &e).unwrap_err();
        let LoadError::NotFound {
            file_name,
            attempts,
        } = &err
        else {
            panic!("{err:?}")
        };
        assert_eq!(*file_name, "libtaskd_absent_for_test.so");
        let tried: Vec<_> = attempts
            .iter()
            .map(|a| (a.candidate.path.clone(), a.candidate.origin.clone()))
            .collect();
        assert_eq!(
            tried,
            vec![
                (
                    root.join("home/lib64/libtaskd_absent_for_test.so"),
                    Origin::AscendHomePath
                ),
                (
                    root.join("toolkit/lib64/libtaskd_absent_for_test.so"),
                    Origin::AscendToolkitHome
                ),
                ("libtaskd_absent_for_test.so".into(), Origin::LoaderDefault),
                (
                    "/nonexistent/taskd/libtaskd_absent_for_test.so".into(),
                    Origin::WellKnown
                ),
            ]
        );
        let text = err.to_string();
        for a in attempts {
            assert!(!a.error.is_empty());
            assert!(
                text.contains(&a.candidate.path.display().to_string()),
                "{text}"
            );
            assert!(text.contains(&a.error), "{text}");
        }
    }

    #[test]
    fn probe_reports_the_file_the_search_would_use() {
        let root = fresh_dir("probe");
        let toolkit = install(Stub::Hccl, &root.join("toolkit/lib64"));
        let e = env(&[("ASCEND_TOOLKIT_HOME", &root.join("toolkit"))]);
        assert_eq!(
            taskd_hal_ascend::sys::probe(&search::HCCL, &e).unwrap(),
            toolkit
        );
    }

    #[test]
    fn a_missing_symbol_names_the_symbol_and_the_file() {
        // The DCMI stub has none of HCCL's functions: the first required one is named.
        let path = fresh(Stub::Dcmi, "no_hccl_symbols");
        let err = HcclLib::open_path(&path).err().expect("must fail");
        let LoadError::MissingSymbol {
            symbol,
            path: file,
            message,
        } = &err
        else {
            panic!("{err:?}")
        };
        assert_eq!(*symbol, "HcclCommWorkingDevNicSet");
        assert_eq!(file, &path);
        assert!(message.contains("HcclCommWorkingDevNicSet"), "{message}");
        let text = err.to_string();
        assert!(
            text.contains("`HcclCommWorkingDevNicSet`")
                && text.contains(&path.display().to_string()),
            "{text}"
        );
    }

    #[test]
    fn hccl_without_the_reserved_resume_loads_and_answers_not_supported() {
        let path = fresh(Stub::HcclWithoutResume, "no_resume");
        let lib = Arc::new(HcclLib::open_path(&path).expect("HcclCommResume is optional"));
        let stub = StubControl::attach(&path);
        let comm = framework_comm(&lib, &stub, "g", 1, 0);
        let e = comm.resume().unwrap_err();
        assert_eq!(
            (
                e.op.as_str(),
                e.kind,
                e.vendor.library.as_str(),
                e.vendor.code
            ),
            ("HcclCommResume", HalErrorKind::NotSupported, "hccl", None)
        );
        assert!(e.detail.contains("has no HcclCommResume"), "{e}");
        // Everything else works.
        assert_eq!(comm.name().unwrap(), "g");
        assert!(stub.calls("HcclCommResume").is_empty());
    }

    #[test]
    fn the_wrong_library_is_a_missing_symbol_not_a_crash() {
        let path = fresh(Stub::Acl, "wrong_kind");
        match HcclLib::open_path(&path).err().expect("must fail") {
            LoadError::MissingSymbol { symbol, .. } => {
                assert_eq!(symbol, "HcclCommWorkingDevNicSet")
            }
            other => panic!("{other:?}"),
        }
        match DcmiLib::open_path(&path).err().expect("must fail") {
            LoadError::MissingSymbol { symbol, .. } => assert_eq!(symbol, "dcmi_init"),
            other => panic!("{other:?}"),
        }
    }
}

mod hccl {
    use super::*;

    #[test]
    fn nic_set_passes_ranks_flags_and_count_unchanged() {
        let (lib, stub) = hccl("nic_set_args");
        let comm = framework_comm(&lib, &stub, "world", 8, 0);
        comm.set_working_nic(&[7, 0, 3, 4_000_000_000], &[true, false, true, false])
            .unwrap();
        comm.set_working_nic(&[], &[]).unwrap();
        assert_eq!(
            stub.calls("HcclCommWorkingDevNicSet"),
            vec![
                "HcclCommWorkingDevNicSet comm=#1 nRanks=4 ranks=[7,0,3,4000000000] useBackup=[1,0,1,0]",
                "HcclCommWorkingDevNicSet comm=#1 nRanks=0 ranks=[] useBackup=[]",
            ]
        );
    }

    #[test]
    fn nic_set_with_mismatched_lengths_is_refused_before_hccl() {
        let (lib, stub) = hccl("nic_set_mismatch");
        let comm = framework_comm(&lib, &stub, "world", 8, 0);
        let err = comm.set_working_nic(&[1, 2], &[true]).unwrap_err();
        assert_eq!(
            (err.op.as_str(), err.hccl()),
            ("HcclCommWorkingDevNicSet", Some(HcclCode::Para))
        );
        assert!(err.detail.contains("not called"), "{err}");
        assert!(stub.calls("HcclCommWorkingDevNicSet").is_empty());
    }

    /// Every wrapper, told to return each code 0..=24 and some unknown ones, reports exactly
    /// that code under its C name.
    #[test]
    fn every_wrapper_maps_every_hccl_result() {
        let (lib, stub) = hccl("codes");
        let (acl, _acl_stub) = acl("codes_acl");
        let stream = Stream::new(&acl).unwrap();
        let send = DeviceBuffer::alloc(&acl, 16, MemMallocPolicy::HugeFirst).unwrap();
        let mut recv = DeviceBuffer::alloc(&acl, 16, MemMallocPolicy::HugeFirst).unwrap();
        let root = RootInfo::from_bytes(&[0u8; 4108]).unwrap();
        let comm = framework_comm(&lib, &stub, "g", 2, 1);
        let h = comm.handle();

        type Call<'a> = Box<dyn FnMut() -> Result<(), HalError> + 'a>;
        let mut calls: Vec<(&str, Call)> = vec![
            (
                "HcclCommWorkingDevNicSet",
                Box::new(|| result::hccl::comm_working_dev_nic_set(&lib, h, &[0], &[true])),
            ),
            (
                "HcclGetRootInfo",
                Box::new(|| result::hccl::get_root_info(&lib).map(drop)),
            ),
            (
                "HcclCommInitRootInfo",
                Box::new(|| result::hccl::comm_init_root_info(&lib, 2, root.raw(), 0).map(drop)),
            ),
            (
                "HcclGetRankId",
                Box::new(|| result::hccl::get_rank_id(&lib, h).map(drop)),
            ),
            (
                "HcclGetRankSize",
                Box::new(|| result::hccl::get_rank_size(&lib, h).map(drop)),
            ),
            (
                "HcclAllReduce",
                Box::new(|| {
                    comm.all_reduce(
                        &send,
                        &mut recv,
                        4,
                        HcclDataType::Fp32,
                        HcclReduceOp::Sum,
                        &stream,
                    )
                }),
            ),
            (
                "HcclCommResume",
                Box::new(|| result::hccl::comm_resume(&lib, h)),
            ),
            (
                "HcclCommDestroy",
                Box::new(|| {
                    let fresh = framework_comm(&lib, &stub, "victim", 1, 0);
                    // Take the handle out of the borrowed Comm and destroy it directly.
                    // SAFETY: the stub created it and nothing else uses it.
                    let raw = unsafe { CommHandle::from_raw(fresh.handle().as_raw()) }.unwrap();
                    drop(fresh);
                    result::hccl::comm_destroy(&lib, raw)
                }),
            ),
            (
                "HcclGetCommName",
                Box::new(|| result::hccl::get_comm_name(&lib, h).map(drop)),
            ),
        ];
        let codes: Vec<i32> = (0..=24).chain([25, 99, 1041, 1_000_000, -1]).collect();
        for (name, call) in calls.iter_mut() {
            for &code in &codes {
                stub.set_result(name, code);
                match call() {
                    Ok(()) => assert_eq!(code, 0, "{name} hid code {code}"),
                    Err(e) => {
                        assert_ne!(code, 0, "{name} failed on success: {e}");
                        assert_eq!(e.op, *name);
                        assert_eq!(e.hccl(), Some(HcclCode::from_raw(code)));
                        assert_eq!(e.vendor.code, Some(code));
                        assert_eq!(e.kind, HcclCode::from_raw(code).kind());
                        let named = (0..=24).contains(&code) || code == 1041;
                        assert_eq!(e.vendor.name.is_none(), !named, "{code}");
                    }
                }
            }
            stub.set_result(name, 0);
        }
        // Spot checks of the names HCCL's logs use.
        stub.set_result("HcclCommResume", 22);
        let e = comm.resume().unwrap_err();
        assert_eq!(e.hccl(), Some(HcclCode::Suspending));
        assert_eq!(
            e.to_string(),
            "HcclCommResume failed with HCCL_E_SUSPENDING (22): "
        );
        stub.set_result("HcclCommResume", 1041);
        let e = comm.resume().unwrap_err();
        assert_eq!(e.hccl(), Some(HcclCode::InStatus));
        assert_eq!(e.vendor.name.as_deref(), Some("HCCL_E_IN_STATUS"));
    }

    #[test]
    fn root_info_reaches_comm_init_byte_for_byte() {
        let (lib, stub) = hccl("root_info");
        let generated = RootInfo::generate(&lib).unwrap();
        assert_eq!(generated.as_bytes().len(), 4108);
        assert!(generated
            .as_bytes()
            .iter()
            .enumerate()
            .all(|(i, b)| *b == ((i * 7 + 3) & 0xff) as u8));
        let mut bytes = generated.as_bytes().to_vec();
        bytes[4107] = 0xAB;
        let received = RootInfo::from_bytes(&bytes).unwrap();
        assert!(RootInfo::from_bytes(&bytes[..4107]).is_none());
        assert!(RootInfo::from_bytes(&[0; 4109]).is_none());
        let hash = |b: &[u8]| {
            b.iter()
                .fold(0u32, |h, x| h.wrapping_mul(31).wrapping_add(u32::from(*x)))
        };
        assert_ne!(
            RootInfo::generate(&lib).unwrap().as_bytes(),
            generated.as_bytes(),
            "each root info names a new rendezvous"
        );
        let comm = Comm::init_root_info(&lib, 16, &received, 9).unwrap();
        assert_eq!(comm.rank_id().unwrap(), 9);
        assert_eq!(comm.rank_size().unwrap(), 16);
        assert_eq!(
            stub.calls("HcclCommInitRootInfo"),
            vec![format!(
                "HcclCommInitRootInfo nRanks=16 rank=9 root_hash={} -> comm=#1",
                hash(&bytes)
            )]
        );
    }

    #[test]
    fn comm_queries_return_what_hccl_says() {
        let (lib, stub) = hccl("queries");
        let comm = framework_comm(&lib, &stub, "dp_0", 4, 2);
        assert_eq!(comm.name().unwrap(), "dp_0");
        assert_eq!(comm.rank_id().unwrap(), 2);
        assert_eq!(comm.rank_size().unwrap(), 4);
        // SAFETY: created by the stub through this library, never freed.
        let h = unsafe { CommHandle::from_raw(stub.new_comm_full_name(b'x', 1, 0)) }.unwrap();
        assert_eq!(Comm::borrow(&lib, h).name().unwrap(), "x".repeat(128));
        assert_eq!(
            stub.log(),
            vec![
                "HcclGetCommName comm=#1",
                "HcclGetRankId comm=#1",
                "HcclGetRankSize comm=#1",
                "HcclGetCommName comm=#2",
            ]
        );
    }

    #[test]
    fn owned_comms_are_destroyed_on_drop_borrowed_ones_are_not() {
        let (lib, stub) = hccl("comm_drop");
        let root = RootInfo::generate(&lib).unwrap();
        let owned = Comm::init_root_info(&lib, 1, &root, 0).unwrap();
        assert!(owned.is_owned());
        let borrowed = framework_comm(&lib, &stub, "framework", 1, 0);
        assert!(!borrowed.is_owned());
        // SAFETY: created by the stub through this library; ownership moves to `adopted`.
        let adopted = Comm::adopt(
            &lib,
            unsafe { CommHandle::from_raw(stub.new_comm("adopted", 1, 0)) }.unwrap(),
        );
        drop(borrowed);
        assert!(stub.calls("HcclCommDestroy").is_empty());
        drop(owned);
        drop(adopted);
        assert_eq!(
            stub.calls("HcclCommDestroy"),
            vec!["HcclCommDestroy comm=#1", "HcclCommDestroy comm=#3"]
        );

        // An explicit destroy reports HCCL's answer.
        let again = Comm::init_root_info(&lib, 1, &root, 0).unwrap();
        stub.set_result("HcclCommDestroy", 4);
        let e = again.destroy().unwrap_err();
        assert_eq!(
            (e.op.as_str(), e.hccl()),
            ("HcclCommDestroy", Some(HcclCode::Internal))
        );
        assert_eq!(
            stub.calls("HcclCommDestroy").len(),
            3,
            "destroyed exactly once"
        );
        assert!(
            stub.calls("BAD_COMM").is_empty(),
            "no call on a destroyed comm"
        );
    }

    /// What a hardware rig does: set the device, make buffers and a stream, join a
    /// communicator, run the first collective (HCCL requires one before a NIC switch).
    #[test]
    fn all_reduce_reaches_hccl_with_its_buffers_stream_and_types() {
        let (lib, stub) = hccl("all_reduce");
        let (acl, acl_stub) = acl("all_reduce_acl");
        result::acl::set_device(&acl, 3).unwrap();
        let stream = Stream::new(&acl).unwrap();
        let mut send = DeviceBuffer::alloc(&acl, 16, MemMallocPolicy::HugeFirst).unwrap();
        let mut recv = DeviceBuffer::alloc(&acl, 16, MemMallocPolicy::NormalOnly).unwrap();
        let data: Vec<u8> = [1.0f32, 2.0, 3.0, 4.5]
            .iter()
            .flat_map(|f| f.to_le_bytes())
            .collect();
        send.copy_from_host(&data).unwrap();
        let comm = Comm::init_root_info(&lib, 1, &RootInfo::generate(&lib).unwrap(), 0).unwrap();
        comm.all_reduce(
            &send,
            &mut recv,
            4,
            HcclDataType::Fp32,
            HcclReduceOp::Max,
            &stream,
        )
        .unwrap();
        stream.synchronize().unwrap();
        let mut back = vec![0u8; 16];
        recv.copy_to_host(&mut back).unwrap();
        assert_eq!(back, data, "the stub's one-rank all-reduce is the identity");
        assert_eq!(
            stub.calls("HcclAllReduce"),
            vec!["HcclAllReduce send=buf#1 recv=buf#2 count=4 dataType=4 op=2 comm=#1 stream=#1"]
        );
        assert_eq!(
            acl_stub.log(),
            vec![
                "aclrtSetDevice deviceId=3",
                "aclrtCreateStream -> stream#1",
                "aclrtMalloc size=16 policy=0 -> buf#1",
                "aclrtMalloc size=16 policy=2 -> buf#2",
                "aclrtMemcpy dst=buf#1 destMax=16 src=buf#0 count=16 kind=1",
                "aclrtSynchronizeStream stream#1",
                "aclrtMemcpy dst=buf#0 destMax=16 src=buf#2 count=16 kind=2",
            ]
        );
    }

    #[test]
    fn all_reduce_beyond_a_buffer_is_refused_before_hccl() {
        let (lib, stub) = hccl("all_reduce_oob");
        let (acl, _acl_stub) = acl("all_reduce_oob_acl");
        let stream = Stream::new(&acl).unwrap();
        let send = DeviceBuffer::alloc(&acl, 16, MemMallocPolicy::HugeFirst).unwrap();
        let mut recv = DeviceBuffer::alloc(&acl, 8, MemMallocPolicy::HugeFirst).unwrap();
        let comm = framework_comm(&lib, &stub, "g", 1, 0);
        let e = comm
            .all_reduce(
                &send,
                &mut recv,
                4,
                HcclDataType::Fp32,
                HcclReduceOp::Sum,
                &stream,
            )
            .unwrap_err();
        assert_eq!(
            (e.op.as_str(), e.hccl()),
            ("HcclAllReduce", Some(HcclCode::Para))
        );
        let e = comm
            .all_reduce(
                &send,
                &mut recv,
                u64::MAX,
                HcclDataType::Int8,
                HcclReduceOp::Sum,
                &stream,
            )
            .unwrap_err();
        assert_eq!(e.hccl(), Some(HcclCode::Para));
        assert!(stub.calls("HcclAllReduce").is_empty());
    }
}

mod acl {
    use super::*;

    #[test]
    fn buffers_are_freed_and_streams_destroyed_on_drop() {
        let (acl, stub) = acl("acl_drop");
        let a = DeviceBuffer::alloc(&acl, 64, MemMallocPolicy::HugeOnly).unwrap();
        let b = DeviceBuffer::alloc(&acl, 1, MemMallocPolicy::HugeFirst).unwrap();
        let s = Stream::new(&acl).unwrap();
        assert_eq!((a.len(), b.len()), (64, 1));
        drop(b);
        drop(s);
        drop(a);
        assert_eq!(
            stub.log(),
            vec![
                "aclrtMalloc size=64 policy=1 -> buf#1",
                "aclrtMalloc size=1 policy=0 -> buf#2",
                "aclrtCreateStream -> stream#1",
                "aclrtFree buf#2",
                "aclrtDestroyStream stream#1",
                "aclrtFree buf#1",
            ]
        );
    }

    #[test]
    fn acl_failures_keep_their_code() {
        let (acl, stub) = acl("acl_codes");
        stub.set_result("aclrtMalloc", 207_001);
        let e = DeviceBuffer::alloc(&acl, 8, MemMallocPolicy::HugeFirst).unwrap_err();
        assert_eq!(
            e,
            AclError {
                op: "aclrtMalloc",
                code: 207_001,
                detail: String::new()
            }
        );
        let h: HalError = e.into();
        assert_eq!(
            (h.op.as_str(), h.vendor.library.as_str(), h.vendor.code),
            ("aclrtMalloc", "acl", Some(207_001))
        );
        assert_eq!(
            h.vendor.name.as_deref(),
            Some("ACL_ERROR_RT_MEMORY_ALLOCATION")
        );
        assert_eq!(h.hccl_code(), None, "an aclError is not an HcclResult");
        stub.set_result("aclrtMalloc", 0);

        stub.set_result("aclrtSetDevice", 107_001);
        assert_eq!(result::acl::set_device(&acl, 99).unwrap_err().code, 107_001);
        stub.set_result("aclrtFree", 507_899);
        let buf = DeviceBuffer::alloc(&acl, 8, MemMallocPolicy::HugeFirst).unwrap();
        assert_eq!(buf.free().unwrap_err().code, 507_899);

        let mut small = DeviceBuffer::alloc(&acl, 4, MemMallocPolicy::HugeFirst).unwrap();
        let e = small.copy_from_host(&[0; 5]).unwrap_err();
        assert_eq!(e.code, result::acl::ACL_ERROR_INVALID_PARAM);
        let e = small.copy_to_host(&mut [0; 5]).unwrap_err();
        assert_eq!(e.code, result::acl::ACL_ERROR_INVALID_PARAM);
        assert!(
            stub.calls("aclrtMemcpy").is_empty(),
            "refused before the call"
        );
        assert_eq!(
            stub.calls("aclrtSetDevice"),
            vec!["aclrtSetDevice deviceId=99"]
        );
    }
}

mod acl_init {
    use super::*;
    use taskd_hal_ascend::result::acl::AclInit;

    #[test]
    fn a_reference_counted_runtime_is_released_with_its_own_reference_only() {
        let (acl, stub) = acl("acl_init_counted");
        // A framework initialised the runtime first; taskd takes a reference of its own.
        assert_eq!(result::acl::init(&acl).unwrap(), AclInit::Counted);
        let ours = result::acl::init(&acl).unwrap();
        assert_eq!(ours, AclInit::Counted);
        assert_eq!(stub.acl_refs(), 2);
        // Releasing ours leaves the framework's: the runtime stays initialised.
        assert_eq!(result::acl::release(&acl, ours).unwrap(), Some(1));
        assert_eq!(stub.acl_refs(), 1);
        assert_eq!(
            stub.log(),
            vec![
                "aclInit configPath=NULL",
                "aclInit configPath=NULL",
                "aclFinalizeReference",
            ]
        );
        assert!(stub.calls("aclFinalize").iter().all(|l| l != "aclFinalize"));
        stub.set_result("aclInit", 100_003);
        assert_eq!(result::acl::init(&acl).unwrap_err().code, 100_003);
        assert_eq!(stub.acl_refs(), 1);
    }

    #[test]
    fn an_older_runtime_is_finalized_only_by_whoever_initialised_it() {
        let path = fresh(Stub::AclLegacy, "acl_init_legacy");
        let acl = AclLib::open_path(&path).unwrap();
        let stub = StubControl::attach(&path);
        assert!(!acl.has_finalize_reference());
        let first = result::acl::init(&acl).unwrap();
        assert_eq!(first, AclInit::Owned);
        // A second caller (taskd after a framework) borrows it and leaves it alone.
        let second = result::acl::init(&acl).unwrap();
        assert_eq!(second, AclInit::Borrowed);
        assert_eq!(result::acl::release(&acl, second).unwrap(), None);
        assert_eq!(stub.acl_refs(), 1, "still initialised");
        assert_eq!(result::acl::release(&acl, first).unwrap(), None);
        assert_eq!(stub.acl_refs(), 0);
        assert_eq!(
            stub.log(),
            vec![
                "aclInit configPath=NULL",
                "aclInit configPath=NULL",
                "aclFinalize"
            ]
        );
        // A counted release on a runtime without the function is refused, not attempted.
        let e = result::acl::release(&acl, AclInit::Counted).unwrap_err();
        assert_eq!(e.op, "aclFinalizeReference");
    }
}

mod rank_hal {
    use super::*;

    /// Global rank 5 of a job with tp=4 (tp_1 = 4..8), dp groups strided by 4 (dp_1 = {1, 5}),
    /// and world = 0..8; handed in out of name order, one with its name left empty.
    fn rank5(test: &str) -> (AscendRankHal, StubControl) {
        let (lib, stub) = hccl(test);
        let world = framework_comm(&lib, &stub, "world", 8, 5); // comm #1
        let tp = framework_comm(&lib, &stub, "tp_1", 4, 1); // comm #2
        let dp = framework_comm(&lib, &stub, "dp_1", 2, 1); // comm #3
        let hal = AscendRankHal::with_capabilities(
            vec![
                (
                    world,
                    GroupInfo {
                        name: "world".into(),
                        members: ranks(&[0, 1, 2, 3, 4, 5, 6, 7]),
                    },
                ),
                (
                    tp,
                    GroupInfo {
                        name: String::new(),
                        members: ranks(&[4, 5, 6, 7]),
                    },
                ),
                (
                    dp,
                    GroupInfo {
                        name: "dp_1".into(),
                        members: ranks(&[1, 5]),
                    },
                ),
            ],
            HcclSetup::ALL,
        );
        (hal, stub)
    }

    #[test]
    fn executes_the_planner_output_in_the_planners_order() {
        let (mut hal, stub) = rank5("plan");
        let groups = hal.groups().unwrap();
        assert_eq!(
            groups.iter().map(|g| g.name.as_str()).collect::<Vec<_>>(),
            vec!["world", "tp_1", "dp_1"]
        );
        let targets = [
            (GlobalRank(5), NicSide::Backup),
            (GlobalRank(1), NicSide::Primary),
            (GlobalRank(6), NicSide::Backup),
        ];
        let plan = plan_calls(&groups, &targets);
        for call in &plan {
            hal.set_working_nic(&call.group, &call.ranks, &call.use_backup())
                .unwrap();
        }
        assert_eq!(
            stub.calls("HcclCommWorkingDevNicSet"),
            vec![
                "HcclCommWorkingDevNicSet comm=#3 nRanks=2 ranks=[1,0] useBackup=[1,0]",
                "HcclCommWorkingDevNicSet comm=#2 nRanks=2 ranks=[1,2] useBackup=[1,1]",
                "HcclCommWorkingDevNicSet comm=#1 nRanks=3 ranks=[5,1,6] useBackup=[1,0,1]",
            ]
        );
        // Names were asked once; sizes once per groups() call.
        assert_eq!(stub.calls("HcclGetCommName").len(), 3);
        assert_eq!(stub.calls("HcclGetRankSize").len(), 3);
    }

    #[test]
    fn set_working_nic_before_groups_resolves_names_itself() {
        let (mut hal, stub) = rank5("no_groups_first");
        hal.set_working_nic("tp_1", &[GroupRank(3)], &[false])
            .unwrap();
        assert_eq!(
            stub.calls("HcclCommWorkingDevNicSet"),
            vec!["HcclCommWorkingDevNicSet comm=#2 nRanks=1 ranks=[3] useBackup=[0]"]
        );
    }

    #[test]
    fn rank_size_must_match_the_launchers_members() {
        let (lib, stub) = hccl("size_mismatch");
        let c = framework_comm(&lib, &stub, "world", 8, 0);
        let mut hal = AscendRankHal::with_capabilities(
            vec![(
                c,
                GroupInfo {
                    name: String::new(),
                    members: ranks(&[0, 1, 2]),
                },
            )],
            HcclSetup::ALL,
        );
        let e = hal.groups().unwrap_err();
        assert_eq!(
            (e.op.as_str(), e.hccl()),
            ("HcclGetRankSize", Some(HcclCode::Para))
        );
        assert!(
            e.detail.contains("8 ranks") && e.detail.contains("3 members"),
            "{e}"
        );
    }

    #[test]
    fn a_launcher_name_that_differs_from_hccls_is_refused() {
        let (lib, stub) = hccl("name_mismatch");
        let c = framework_comm(&lib, &stub, "tp_0", 2, 0);
        let mut hal = AscendRankHal::with_capabilities(
            vec![(
                c,
                GroupInfo {
                    name: "dp_0".into(),
                    members: ranks(&[0, 1]),
                },
            )],
            HcclSetup::ALL,
        );
        let e = hal.groups().unwrap_err();
        assert_eq!(
            (e.op.as_str(), e.hccl()),
            ("HcclGetCommName", Some(HcclCode::Para))
        );
        assert!(
            e.detail.contains("\"dp_0\"") && e.detail.contains("\"tp_0\""),
            "{e}"
        );
    }

    #[test]
    fn two_communicators_with_one_name_are_refused() {
        let (lib, stub) = hccl("dup_names");
        let a = framework_comm(&lib, &stub, "world", 2, 0);
        let b = framework_comm(&lib, &stub, "world", 2, 0);
        let info = GroupInfo {
            name: String::new(),
            members: ranks(&[0, 1]),
        };
        let mut hal =
            AscendRankHal::with_capabilities(vec![(a, info.clone()), (b, info)], HcclSetup::ALL);
        assert!(hal
            .groups()
            .unwrap_err()
            .detail
            .contains("two communicators"));
    }

    #[test]
    fn an_unknown_group_is_not_found_and_nothing_is_called() {
        let (mut hal, stub) = rank5("unknown_group");
        let e = hal
            .set_working_nic("pp_0", &[GroupRank(0)], &[true])
            .unwrap_err();
        assert_eq!(
            (e.op.as_str(), e.hccl()),
            ("HcclCommWorkingDevNicSet", Some(HcclCode::NotFound))
        );
        assert_eq!(e.kind, HalErrorKind::InvalidArgument);
        assert!(stub.calls("HcclCommWorkingDevNicSet").is_empty());
    }

    #[test]
    fn an_hccl_failure_reaches_the_caller_with_its_code() {
        let (mut hal, stub) = rank5("nic_set_fails");
        stub.set_result("HcclCommWorkingDevNicSet", 19);
        let e = hal
            .set_working_nic("world", &[GroupRank(2), GroupRank(6)], &[true, false])
            .unwrap_err();
        assert_eq!(
            (e.op.as_str(), e.hccl()),
            ("HcclCommWorkingDevNicSet", Some(HcclCode::Network))
        );
        assert!(e.detail.contains("ranks=[2, 6]"), "{e}");
        let (mut fresh_hal, fresh_stub) = rank5("name_fails");
        fresh_stub.set_result("HcclGetCommName", 7);
        assert_eq!(
            fresh_hal.groups().unwrap_err().hccl(),
            Some(HcclCode::Unavail)
        );
    }

    #[test]
    fn capabilities_come_from_the_environment_it_was_given() {
        let (lib, stub) = hccl("caps");
        let c = framework_comm(&lib, &stub, "world", 1, 0);
        let retry = Path::new("L0:0, L1:1, L2:1");
        let hal_env = env(&[
            ("HCCL_OP_RETRY_ENABLE", retry),
            ("TASKD_HCCL_RDMA", Path::new("off")),
        ]);
        let mut hal = AscendRankHal::new(
            vec![(
                c,
                GroupInfo {
                    name: String::new(),
                    members: ranks(&[0]),
                },
            )],
            &hal_env,
        );
        assert_eq!(
            hal.capabilities(),
            HcclSetup {
                l2_retry: true,
                rdma: false
            }
            .capabilities()
        );
    }

    #[test]
    fn dropping_the_hal_destroys_owned_comms_only() {
        let (lib, stub) = hccl("hal_drop");
        let owned = Comm::init_root_info(&lib, 1, &RootInfo::generate(&lib).unwrap(), 0).unwrap();
        let borrowed = framework_comm(&lib, &stub, "framework", 1, 0);
        let one = GroupInfo {
            name: String::new(),
            members: ranks(&[0]),
        };
        let hal = AscendRankHal::with_capabilities(
            vec![(owned, one.clone()), (borrowed, one)],
            HcclSetup::ALL,
        );
        drop(hal);
        assert_eq!(
            stub.calls("HcclCommDestroy"),
            vec!["HcclCommDestroy comm=#1"]
        );
    }
}

mod node_hal {
    use super::*;
    use std::time::{Duration, Instant};
    use taskd_core::NicSide;
    use taskd_hal_ascend::node::{DcmiLocation, ProbeError, VisibleDie};

    fn node(test: &str, cards: i32, dies: i32, card_base: i32) -> (AscendNodeHal, StubControl) {
        node_with(test, cards, dies, card_base, &[], Duration::from_secs(5))
    }

    /// A node whose DCMI sees `visible` (physical ids, in logical order; empty: every die).
    fn node_with(
        test: &str,
        cards: i32,
        dies: i32,
        card_base: i32,
        visible: &[u32],
        timeout: Duration,
    ) -> (AscendNodeHal, StubControl) {
        let path = fresh(Stub::Dcmi, test);
        let stub = StubControl::attach(&path);
        stub.dcmi_topology(cards, dies, card_base);
        if !visible.is_empty() {
            stub.dcmi_visible(visible);
        }
        let hal = AscendNodeHal::with_timeout(DcmiLib::open_path(&path).unwrap(), timeout).unwrap();
        (hal, stub)
    }

    /// Device `d`'s health with its primary up and its backup's probe answering
    /// `DCMI_RDFX_DETECT_UNREACH`.
    fn unreachable_backup(d: u32) -> LinkHealth {
        LinkHealth::new(DeviceId(d), true, true).with(
            NicSide::Backup,
            SideState::Down("DCMI network health Unreach (3)".into()),
        )
    }

    /// The health probes in the log, sorted (own and partner run at once).
    fn health_calls(stub: &StubControl) -> Vec<String> {
        let mut v = stub.calls("dcmi_get_device_network_health");
        v.sort();
        v
    }

    #[test]
    fn device_count_sums_chips_over_the_cards_dcmi_lists() {
        let (hal, stub) = node("count", 3, 2, 10);
        assert_eq!(hal.device_count().unwrap(), 6);
        assert_eq!(
            stub.log(),
            vec![
                "dcmi_init",
                "dcmi_get_card_list list_len=64",
                "dcmi_get_device_num_in_card card_id=10",
                "dcmi_get_device_num_in_card card_id=11",
                "dcmi_get_device_num_in_card card_id=12",
            ]
        );
    }

    #[test]
    fn link_health_resolves_the_physical_id_then_probes_the_die_and_its_partner() {
        let (mut hal, stub) = node("health", 2, 2, 10);
        stub.dcmi_health(10, 1, 3); // DCMI_RDFX_DETECT_UNREACH
        stub.clear_log();
        let h0 = hal.link_health(DeviceId(0)).unwrap();
        assert_eq!(h0, unreachable_backup(0));
        assert_eq!(
            stub.log()[0],
            "dcmi_get_card_id_device_id_from_phyid device_phy_id=0"
        );
        assert_eq!(
            health_calls(&stub),
            vec![
                "dcmi_get_device_network_health card_id=10 device_id=0",
                "dcmi_get_device_network_health card_id=10 device_id=1",
            ]
        );
        assert!(stub
            .calls("dcmi_get_card_id_device_id_from_logicid")
            .is_empty());
        let h1 = hal.link_health(DeviceId(1)).unwrap();
        assert_eq!(
            (h1.is_up(NicSide::Primary), h1.is_up(NicSide::Backup)),
            (false, true)
        );
        assert_eq!(
            h1.unknown(NicSide::Primary),
            None,
            "down is known, not unknown"
        );
    }

    #[test]
    fn detect_ok_and_detect_init_count_as_up_and_nothing_else() {
        let (mut hal, stub) = node("detect_values", 1, 2, 0);
        for v in (0..=8).chain([0xFF, 42]) {
            stub.dcmi_health(0, 0, v);
            stub.dcmi_health(0, 1, v);
            let h = hal.link_health(DeviceId(0)).unwrap();
            let up = v == 0 || v == 6; // DCMI_RDFX_DETECT_OK, DCMI_RDFX_DETECT_INIT
            assert_eq!(
                (h.is_up(NicSide::Primary), h.is_up(NicSide::Backup)),
                (up, up),
                "result {v}"
            );
            if !up {
                assert!(
                    h.primary.reason().unwrap().contains(&format!("({v})")),
                    "{h:?}"
                );
            }
        }
    }

    #[test]
    fn physical_ids_resolve_through_dcmi_when_the_container_renumbers_its_dies() {
        // Four dies; this container lists them as logical 0..3 = physical 2, 3, 0, 1.
        let (mut hal, stub) = node_with(
            "renumbered",
            2,
            2,
            10,
            &[2, 3, 0, 1],
            Duration::from_secs(5),
        );
        stub.dcmi_health(10, 1, 3); // physical 1 (card 10, chip 1): unreachable
        stub.clear_log();
        // Physical 0 is card 10 chip 0: its backup NIC (physical 1) is down. Read through its
        // logical id 0, it would have been card 11's dies, both up.
        let h = hal.link_health(DeviceId(0)).unwrap();
        assert_eq!(h, unreachable_backup(0));
        assert_eq!(
            health_calls(&stub),
            vec![
                "dcmi_get_device_network_health card_id=10 device_id=0",
                "dcmi_get_device_network_health card_id=10 device_id=1",
            ]
        );
        let at = |c, d| DcmiLocation {
            card_id: c,
            device_id: d,
        };
        assert_eq!(hal.locate_physical(DeviceId(3)).unwrap(), at(11, 1));
        assert_eq!(hal.locate_logical(0).unwrap(), at(11, 0));
        assert_eq!(hal.physical_of_logical(2).unwrap(), DeviceId(0));
        let dies = hal.visible_dies().unwrap();
        assert_eq!(
            dies.iter()
                .map(|d| (d.logical, d.physical.0))
                .collect::<Vec<_>>(),
            vec![(0, 2), (1, 3), (2, 0), (3, 1)]
        );
        assert_eq!(
            dies[2],
            VisibleDie {
                logical: 2,
                physical: DeviceId(0),
                location: at(10, 0)
            }
        );
    }

    #[test]
    fn a_partner_die_this_node_cannot_see_is_an_unknown_backup() {
        // Physical 7 (card 13, chip 1) is not in this container.
        let (mut hal, _stub) = node_with("invisible", 4, 2, 10, &[6, 2, 3], Duration::from_secs(5));
        let h = hal.link_health(DeviceId(6)).unwrap();
        assert!(h.is_up(NicSide::Primary) && !h.is_up(NicSide::Backup));
        let why = h.unknown(NicSide::Backup).expect("unknown, not down");
        assert!(
            why.contains("card 13 chip 1")
                && why.contains("DCMI_ERR_CODE_DEVICE_NOT_EXIST (-8008)")
                && why.contains("not visible here"),
            "{why}"
        );
        // The invisible die itself is not on this node at all.
        let e = hal.link_health(DeviceId(7)).unwrap_err();
        assert_eq!(
            (e.vendor.code, e.vendor.name.as_deref(), e.kind),
            (
                Some(-8008),
                Some("DCMI_ERR_CODE_DEVICE_NOT_EXIST"),
                HalErrorKind::InvalidArgument
            )
        );
        assert!(e.detail.contains("device_phy_id=7"), "{e}");
    }

    #[test]
    fn a_die_without_a_partner_chip_has_an_unknown_backup() {
        // One die per card (not an A3): the partner chip does not exist.
        let (mut hal, stub) = node("one_die_per_card", 4, 1, 0);
        let h = hal.link_health(DeviceId(2)).unwrap();
        assert!(h.is_up(NicSide::Primary) && !h.is_up(NicSide::Backup));
        let why = h.unknown(NicSide::Backup).unwrap();
        assert!(
            why.contains("card 2 chip 1") && why.contains("DCMI_ERR_CODE_INVALID_DEVICE_ID"),
            "{why}"
        );
        assert_eq!(
            health_calls(&stub),
            vec![
                "dcmi_get_device_network_health card_id=2 device_id=0",
                "dcmi_get_device_network_health card_id=2 device_id=1",
            ]
        );
    }

    #[test]
    fn a_probe_that_blocks_is_unknown_after_the_timeout_and_is_not_started_twice() {
        // Long enough for every call that does not hang, on a loaded machine.
        let timeout = Duration::from_secs(2);
        let (mut hal, stub) = node_with("blocking", 2, 2, 10, &[], timeout);
        assert_eq!(hal.probe_timeout(), timeout);
        stub.dcmi_block_health(10, 1); // device 0's backup NIC: its partner's probe hangs
        let t = Instant::now();
        let h = hal.link_health(DeviceId(0)).unwrap();
        let took = t.elapsed();
        assert!(
            stub.dcmi_wait_blocked(1, Duration::from_secs(5)),
            "the probe is stuck in DCMI"
        );
        assert!(
            took >= timeout && took < Duration::from_secs(20),
            "{took:?}"
        );
        assert!(h.is_up(NicSide::Primary) && !h.is_up(NicSide::Backup));
        let why = h.unknown(NicSide::Backup).unwrap();
        assert!(
            why.contains(
                "dcmi_get_device_network_health(card_id=10, device_id=1) did not answer within 2s"
            ),
            "{why}"
        );
        // Asked again while it hangs: unknown at once, and DCMI is not called a second time.
        let t = Instant::now();
        let h = hal.link_health(DeviceId(0)).unwrap();
        assert!(t.elapsed() < timeout, "{:?}", t.elapsed());
        assert!(h
            .unknown(NicSide::Backup)
            .unwrap()
            .contains("has not returned since"));
        let stuck = "dcmi_get_device_network_health card_id=10 device_id=1";
        assert_eq!(stub.calls(stuck).len(), 1);
        assert_eq!(hal.probes_in_flight().len(), 1);
        // Nothing is held while it hangs: another die answers normally.
        assert_eq!(
            hal.link_health(DeviceId(2)).unwrap(),
            LinkHealth::new(DeviceId(2), true, true)
        );
        // Once DCMI returns, the die is probed again and reads up.
        stub.dcmi_release();
        assert!(hal.wait_probes_returned(Duration::from_secs(5)));
        assert_eq!(
            hal.link_health(DeviceId(0)).unwrap(),
            LinkHealth::new(DeviceId(0), true, true)
        );
        assert_eq!(stub.calls(stuck).len(), 2);
    }

    #[test]
    fn dcmi_failures_keep_their_code_and_call() {
        let (mut hal, stub) = node("dcmi_codes", 2, 2, 10);
        // A probe that answers with an error: both sides unknown, with DCMI's code named.
        stub.set_result("dcmi_get_device_network_health", -8023);
        let h = hal.link_health(DeviceId(2)).unwrap();
        assert!(!h.is_up(NicSide::Primary) && !h.is_up(NicSide::Backup));
        let why = h.unknown(NicSide::Primary).unwrap();
        assert!(
            why.contains("card 11 chip 0")
                && why.contains("DCMI_ERR_CODE_CONFIG_INFO_NOT_EXIST (-8023)"),
            "{why}"
        );
        match hal.network_health(DcmiLocation {
            card_id: 11,
            device_id: 0,
        }) {
            Err(ProbeError::Dcmi(e)) => assert_eq!(
                e.to_string(),
                "dcmi_get_device_network_health(card_id=11, device_id=0) failed with \
                 DCMI_ERR_CODE_CONFIG_INFO_NOT_EXIST (-8023)"
            ),
            other => panic!("{other:?}"),
        }
        stub.set_result("dcmi_get_device_network_health", 0);

        let e = hal.link_health(DeviceId(4)).unwrap_err(); // no such physical id
        assert_eq!(
            (
                e.op.as_str(),
                e.vendor.code,
                e.vendor.name.as_deref(),
                e.kind
            ),
            (
                "dcmi_get_card_id_device_id_from_phyid",
                Some(-8007),
                Some("DCMI_ERR_CODE_INVALID_DEVICE_ID"),
                HalErrorKind::InvalidArgument
            )
        );
        assert!(e.detail.contains("device_phy_id=4"), "{e}");

        stub.set_result("dcmi_get_card_list", -8013);
        match hal.device_count().unwrap_err() {
            ProbeError::Dcmi(e) => assert_eq!((e.op, e.code), ("dcmi_get_card_list", -8013)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_failing_dcmi_init_is_reported() {
        let path = fresh(Stub::Dcmi, "init_fails");
        let stub = StubControl::attach(&path);
        stub.set_result("dcmi_init", -8002);
        let e = AscendNodeHal::new(DcmiLib::open_path(&path).unwrap())
            .err()
            .unwrap();
        assert_eq!(
            e.to_string(),
            "dcmi_init() failed with DCMI_ERR_CODE_OPER_NOT_PERMITTED (-8002)"
        );
        assert!(
            matches!(e, ProbeError::Dcmi(ref d) if d.code == -8002),
            "{e:?}"
        );
    }
}

mod preflight_probe {
    use super::*;
    use taskd_hal_ascend::sys::{self, acl as sys_acl, dcmi as sys_dcmi, hccl as sys_hccl};

    #[test]
    fn a_complete_library_has_no_missing_symbols_and_says_where_it_came_from() {
        for (stub, spec, symbols, optional) in [
            (
                Stub::Hccl,
                search::HCCL,
                sys_hccl::SYMBOLS,
                sys_hccl::OPTIONAL_SYMBOLS,
            ),
            (
                Stub::Acl,
                search::ACL,
                sys_acl::SYMBOLS,
                sys_acl::OPTIONAL_SYMBOLS,
            ),
            (Stub::Dcmi, search::DCMI, sys_dcmi::SYMBOLS, &[][..]),
        ] {
            let root = fresh_dir("probe_complete");
            std::fs::create_dir_all(root.join("home/lib64")).unwrap();
            let toolkit = install(stub, &root.join("toolkit/lib64"));
            let e = env(&[
                ("ASCEND_HOME_PATH", &root.join("home")),
                ("ASCEND_TOOLKIT_HOME", &root.join("toolkit")),
            ]);
            let p = sys::probe_symbols(&spec, symbols, optional, &e).unwrap();
            assert_eq!(p.loaded.path, toolkit, "{stub:?}");
            assert_eq!(p.loaded.origin, Origin::AscendToolkitHome);
            assert!(p.missing.is_empty(), "{stub:?}: {:?}", p.missing);
            assert!(
                p.optional_missing.is_empty(),
                "{stub:?}: {:?}",
                p.optional_missing
            );
            assert_eq!(p.skipped.len(), 1, "ASCEND_HOME_PATH had no file");
            assert_eq!(p.skipped[0].candidate.origin, Origin::AscendHomePath);
        }
    }

    #[test]
    fn every_missing_symbol_is_listed() {
        let path = fresh(Stub::HcclWithoutResume, "probe_no_resume");
        let e = env(&[("TASKD_HCCL_LIBRARY", &path)]);
        let optional = sys_hccl::OPTIONAL_SYMBOLS;
        let p = sys::probe_symbols(&search::HCCL, sys_hccl::SYMBOLS, optional, &e).unwrap();
        assert!(p.missing.is_empty(), "{:?}", p.missing);
        assert_eq!(p.optional_missing, vec!["HcclCommResume"]);
        assert_eq!(p.loaded.origin, Origin::Override("TASKD_HCCL_LIBRARY"));
        let legacy = fresh(Stub::AclLegacy, "probe_acl_legacy");
        let e = env(&[("TASKD_ACL_LIBRARY", &legacy)]);
        let p = sys::probe_symbols(
            &search::ACL,
            sys_acl::SYMBOLS,
            sys_acl::OPTIONAL_SYMBOLS,
            &e,
        )
        .unwrap();
        assert_eq!(
            (p.missing.len(), p.optional_missing),
            (0, vec!["aclFinalizeReference"])
        );

        // The wrong library lacks all of them.
        let acl = fresh(Stub::Acl, "probe_wrong");
        let e = env(&[("TASKD_HCCL_LIBRARY", &acl)]);
        let p = sys::probe_symbols(&search::HCCL, sys_hccl::SYMBOLS, optional, &e).unwrap();
        assert_eq!(p.missing, sys_hccl::SYMBOLS.to_vec());
        assert_eq!(p.optional_missing, optional.to_vec());
    }

    #[test]
    fn a_library_that_does_not_load_is_the_search_error() {
        let root = fresh_dir("probe_absent");
        let e = env(&[("TASKD_DCMI_LIBRARY", &root.join("nope/libdcmi.so"))]);
        match sys::probe_symbols(&search::DCMI, sys_dcmi::SYMBOLS, &[], &e).unwrap_err() {
            LoadError::NotFound { attempts, .. } => assert_eq!(attempts.len(), 1),
            other => panic!("{other:?}"),
        }
    }
}

/// The HCCL stub's groups: ranks as threads of this process, joined from one root info.
mod stub_groups {
    use super::*;
    use std::time::Duration;
    use taskd_hal_ascend::testing::NicSetRecord;

    struct Member {
        comm: Comm,
        stream: Stream,
        send: DeviceBuffer,
        recv: DeviceBuffer,
    }

    /// `n` members of one group, each made on its own thread like a rig does.
    fn group(test: &str, n: u32) -> (Arc<HcclLib>, StubControl, Vec<Member>) {
        let (lib, stub) = hccl(test);
        let (acl, _acl_stub) = acl(&format!("{test}_acl"));
        let root = RootInfo::generate(&lib).unwrap();
        let members = std::thread::scope(|s| {
            let handles: Vec<_> = (0..n)
                .map(|r| {
                    let (lib, acl, root) = (&lib, &acl, &root);
                    s.spawn(move || {
                        result::acl::set_device(acl, r as i32).unwrap();
                        Member {
                            comm: Comm::init_root_info(lib, n, root, r).unwrap(),
                            stream: Stream::new(acl).unwrap(),
                            send: DeviceBuffer::alloc(acl, 8, MemMallocPolicy::HugeFirst).unwrap(),
                            recv: DeviceBuffer::alloc(acl, 8, MemMallocPolicy::HugeFirst).unwrap(),
                        }
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap())
                .collect::<Vec<_>>()
        });
        (lib, stub, members)
    }

    fn all_reduce(
        m: &mut Member,
        values: [f32; 2],
        op: HcclReduceOp,
    ) -> Result<[f32; 2], HalError> {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        m.send.copy_from_host(&bytes).unwrap();
        m.comm
            .all_reduce(&m.send, &mut m.recv, 2, HcclDataType::Fp32, op, &m.stream)?;
        m.stream.synchronize().unwrap();
        let mut out = [0u8; 8];
        m.recv.copy_to_host(&mut out).unwrap();
        Ok([
            f32::from_le_bytes(out[..4].try_into().unwrap()),
            f32::from_le_bytes(out[4..].try_into().unwrap()),
        ])
    }

    #[test]
    fn members_share_one_name_and_all_reduce_for_real() {
        let (_lib, _stub, mut members) = group("group_sum", 3);
        let names: Vec<String> = members.iter().map(|m| m.comm.name().unwrap()).collect();
        assert_eq!(names, vec![names[0].clone(); 3]);
        assert_eq!(names[0], "stubcomm_1");
        for (r, m) in members.iter().enumerate() {
            assert_eq!(m.comm.rank_id().unwrap(), r as u32);
            assert_eq!(m.comm.rank_size().unwrap(), 3);
        }
        for (op, want) in [
            (HcclReduceOp::Sum, [6.0, 0.5 + 1.5 + 2.5]),
            (HcclReduceOp::Max, [3.0, 2.5]),
            (HcclReduceOp::Min, [1.0, 0.5]),
        ] {
            let got = std::thread::scope(|s| {
                let handles: Vec<_> = members
                    .iter_mut()
                    .enumerate()
                    .map(|(r, m)| {
                        s.spawn(move || all_reduce(m, [r as f32 + 1.0, r as f32 + 0.5], op))
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().unwrap().unwrap())
                    .collect::<Vec<_>>()
            });
            assert_eq!(got, vec![want; 3], "{op:?}");
        }
    }

    #[test]
    fn nic_set_follows_hccls_rules_within_a_group() {
        let (_lib, stub, mut members) = group("group_nic_set", 2);
        // Before any collective: refused.
        let e = members[0].comm.set_working_nic(&[1], &[true]).unwrap_err();
        assert_eq!(e.hccl(), Some(HcclCode::Internal));
        assert_eq!(
            stub.calls("NICSET_BEFORE_COLLECTIVE"),
            vec!["NICSET_BEFORE_COLLECTIVE group=stubcomm_1 rank=0"]
        );
        std::thread::scope(|s| {
            for m in members.iter_mut() {
                s.spawn(move || all_reduce(m, [1.0, 1.0], HcclReduceOp::Sum).unwrap());
            }
        });
        // The first member to make its k-th call sets what every other k-th call must be.
        members[1]
            .comm
            .set_working_nic(&[1, 0], &[true, false])
            .unwrap();
        members[0]
            .comm
            .set_working_nic(&[1, 0], &[true, false])
            .unwrap();
        members[0].comm.set_working_nic(&[1], &[true]).unwrap();
        let e = members[1].comm.set_working_nic(&[1], &[false]).unwrap_err();
        assert_eq!(e.hccl(), Some(HcclCode::Para));
        assert_eq!(
            stub.calls("NICSET_MISMATCH"),
            vec![
                "NICSET_MISMATCH group=stubcomm_1 rank=1 call=1 expected=nRanks=1 ranks=[1] \
                 useBackup=[1] got=nRanks=1 ranks=[1] useBackup=[0]"
            ]
        );
        let records: Vec<NicSetRecord> = stub
            .log()
            .iter()
            .filter_map(|l| NicSetRecord::parse(l))
            .collect();
        assert_eq!(
            records
                .iter()
                .map(|r| (r.rank, r.group.as_str(), r.args.as_str()))
                .collect::<Vec<_>>(),
            vec![
                (0, "stubcomm_1", "nRanks=1 ranks=[1] useBackup=[1]"),
                (1, "stubcomm_1", "nRanks=2 ranks=[1,0] useBackup=[1,0]"),
                (0, "stubcomm_1", "nRanks=2 ranks=[1,0] useBackup=[1,0]"),
                (0, "stubcomm_1", "nRanks=1 ranks=[1] useBackup=[1]"),
                (1, "stubcomm_1", "nRanks=1 ranks=[1] useBackup=[0]"),
            ]
        );
    }

    /// Every member all-reduces `count` (1 or 2) elements at once; each member's result.
    fn all_reduce_all(members: &mut [Member], count: u64) -> Vec<Result<(), HalError>> {
        std::thread::scope(|s| {
            let handles: Vec<_> = members
                .iter_mut()
                .map(|m| {
                    s.spawn(move || {
                        m.comm.all_reduce(
                            &m.send,
                            &mut m.recv,
                            count,
                            HcclDataType::Fp32,
                            HcclReduceOp::Sum,
                            &m.stream,
                        )
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn a_nic_set_reaches_only_the_operators_issued_before_it() {
        let (_lib, stub, mut members) = group("group_per_operator", 2);
        assert!(all_reduce_all(&mut members, 2).iter().all(Result::is_ok));
        for m in &members {
            m.comm.set_working_nic(&[1], &[true]).unwrap();
        }
        // The operator issued before the call keeps it.
        assert!(all_reduce_all(&mut members, 2).iter().all(Result::is_ok));
        assert_eq!(stub.hccl_collectives_on_default_nic(), 0);
        // A new operator (another count) starts on the default NIC, on every member alike.
        assert!(all_reduce_all(&mut members, 1).iter().all(Result::is_ok));
        assert_eq!(stub.hccl_collectives_on_default_nic(), 1);
        assert_eq!(
            stub.calls("HcclAllReduce DEFAULT_NIC"),
            vec!["HcclAllReduce DEFAULT_NIC group=stubcomm_1 count=1"]
        );
        // A later call reaches it too.
        for m in &members {
            m.comm.set_working_nic(&[0], &[false]).unwrap();
        }
        assert!(all_reduce_all(&mut members, 1).iter().all(Result::is_ok));
        assert_eq!(
            stub.hccl_collectives_on_default_nic(),
            2,
            "rank 1 is still switched"
        );
        for m in &members {
            m.comm.set_working_nic(&[1], &[false]).unwrap();
        }
        assert!(all_reduce_all(&mut members, 1).iter().all(Result::is_ok));
        assert_eq!(
            stub.hccl_collectives_on_default_nic(),
            2,
            "nothing switched any more"
        );
        assert!(stub.calls("HcclAllReduce NIC_DISAGREE").is_empty());
    }

    #[test]
    fn members_holding_different_configurations_of_an_operator_fail_its_collective() {
        let (_lib, stub, mut members) = group("group_disagree", 2);
        assert!(all_reduce_all(&mut members, 2).iter().all(Result::is_ok));
        // Only member 0 switches: the control plane broke HCCL's rule.
        members[0].comm.set_working_nic(&[1], &[true]).unwrap();
        for r in all_reduce_all(&mut members, 2) {
            assert_eq!(r.unwrap_err().hccl(), Some(HcclCode::Internal));
        }
        assert_eq!(stub.calls("HcclAllReduce NIC_DISAGREE").len(), 1);
    }

    #[test]
    fn a_missing_peer_times_out_and_breaks_the_group() {
        let (_lib, stub, mut members) = group("group_timeout", 2);
        stub.hccl_collective_timeout(Duration::from_millis(50));
        let e = all_reduce(&mut members[0], [1.0, 1.0], HcclReduceOp::Sum).unwrap_err();
        assert_eq!(e.hccl(), Some(HcclCode::Timeout));
        let e = all_reduce(&mut members[1], [1.0, 1.0], HcclReduceOp::Sum).unwrap_err();
        assert_eq!(e.hccl(), Some(HcclCode::Remote));
        assert_eq!(stub.calls("HcclAllReduce TIMEOUT").len(), 1);
    }

    #[test]
    fn destroying_a_member_breaks_the_group() {
        let (_lib, _stub, mut members) = group("group_destroy", 2);
        let gone = members.remove(1);
        gone.comm.destroy().unwrap();
        let e = all_reduce(&mut members[0], [1.0, 1.0], HcclReduceOp::Sum).unwrap_err();
        assert_eq!(e.hccl(), Some(HcclCode::Remote));
    }
}
