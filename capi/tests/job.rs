//! A whole job in this process through the embedded roles (`EmbeddedManager`, two
//! `EmbeddedProxy`, four `EmbeddedWorker` whose framework switch function records its calls):
//! every rank's framework gets the whole target list once per operation, on its training
//! thread while that thread is held; a framework that answers false fails the operation naming its rank, and the
//! rollback calls every framework again. One test in this file: it sets the environment the
//! workers read before any other thread runs.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use taskd::actors::control::ControlClient;
use taskd::core::command::Target;
use taskd::core::{DeviceId, JobId, NodeName, SwitchCommand};
use taskd_capi::{EmbeddedManager, EmbeddedProxy, EmbeddedWorker};

/// One call of a framework's switch function: ranks, flags, and whether it was misplaced
/// (made during a training step, or on another thread than the training thread).
type Call = (Vec<u32>, Vec<bool>, bool);

/// What one rank's framework was told: every call, and whether a training step ran then.
#[derive(Default)]
struct Framework {
    calls: Mutex<Vec<Call>>,
    in_step: AtomicBool,
    fail: AtomicBool,
    /// The training thread.
    trainer: OnceLock<std::thread::ThreadId>,
}

struct Rank {
    framework: Arc<Framework>,
    worker: Arc<EmbeddedWorker>,
    steps: Arc<AtomicU64>,
    training: std::thread::JoinHandle<()>,
}

fn start_rank(job: &str, rank: u32, proxy: &str, stop: Arc<AtomicBool>) -> Rank {
    let framework = Arc::new(Framework::default());
    let fw = framework.clone();
    let switch = move |ranks: &[u32], flags: &[bool], timeout: Duration| {
        let in_step = fw.in_step.load(Ordering::SeqCst);
        let elsewhere = fw.trainer.get() != Some(&std::thread::current().id());
        // The manager's default switch phase: three quarters of it for the call.
        assert_eq!(timeout, Duration::from_secs(225));
        fw.calls
            .lock()
            .unwrap()
            .push((ranks.to_vec(), flags.to_vec(), in_step || elsewhere));
        if fw.fail.swap(false, Ordering::SeqCst) {
            Err("_comm_switch_nic returned False".to_owned())
        } else {
            Ok(())
        }
    };
    let cfg = format!(
        r#"{{"job_id": "{job}", "rank": {rank}, "proxy": "{proxy}", "tsp": true, "heartbeat_ms": 100}}"#
    );
    let worker = Arc::new(EmbeddedWorker::start(&cfg, Box::new(switch)).unwrap());
    let steps = Arc::new(AtomicU64::new(0));
    let (w, fw, n) = (worker.clone(), framework.clone(), steps.clone());
    let training = std::thread::spawn(move || {
        fw.trainer.set(std::thread::current().id()).unwrap();
        let mut step = 0;
        while !stop.load(Ordering::SeqCst) {
            fw.in_step.store(true, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(1)); // the step's compute
            fw.in_step.store(false, Ordering::SeqCst);
            step += 1;
            n.store(step, Ordering::SeqCst);
            assert!(!w.step_completed(step).is_stop());
        }
    });
    Rank {
        framework,
        worker,
        steps,
        training,
    }
}

fn command(job: &str, devices: &[u32], use_backup: bool) -> SwitchCommand {
    SwitchCommand {
        job: JobId(job.into()),
        id: None,
        targets: devices
            .iter()
            .map(|d| Target {
                node: NodeName("node-1".into()),
                device: DeviceId(*d),
                use_backup,
            })
            .collect(),
    }
}

#[test]
fn an_embedded_job_switches_through_the_frameworks_function() {
    // The workers' capabilities: HCCL's L2 retry (read from the environment, as on a node).
    std::env::set_var("HCCL_OP_RETRY_ENABLE", "L0:0, L1:1, L2:1");
    let job = "embedded";
    let manager = EmbeddedManager::start(
        &format!(r#"{{"job_id": "{job}", "node_nums": 2, "proc_per_node": 2, "listen": "127.0.0.1:0", "control_addr": "127.0.0.1:0", "heartbeat_ms": 100}}"#),
        false,
    )
    .unwrap();
    let proxies: Vec<EmbeddedProxy> = (0..2)
        .map(|k| {
            let cfg = format!(r#"{{"job_id": "{job}", "UpstreamAddr": "127.0.0.1", "UpstreamPort": "{}", "ListenAddr": "127.0.0.1", "ListenPort": "0", "ServerRank": "{k}", "sim": true}}"#, manager.info().listen.port());
            EmbeddedProxy::start(&cfg).unwrap()
        })
        .collect();
    for (k, p) in proxies.iter().enumerate() {
        let a = p.wait_registered(Some(Duration::from_secs(30))).unwrap();
        assert_eq!(a.node, format!("node-{k}"));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let ranks: Vec<Rank> = (0..4)
        .map(|r| {
            start_rank(
                job,
                r,
                &proxies[r as usize / 2].local_addr().to_string(),
                stop.clone(),
            )
        })
        .collect();
    for r in &ranks {
        let reg = r
            .worker
            .wait_registered(Some(Duration::from_secs(30)))
            .unwrap();
        assert_eq!(reg.world_size, 4);
    }
    // Every rank registered: the manager's first verification round reaches each of them.
    for r in &ranks {
        r.worker
            .wait_job_whole(Some(Duration::from_secs(60)))
            .unwrap();
    }
    manager.wait_ready(Some(Duration::from_secs(30))).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let control = manager
        .info()
        .control
        .expect("the control API is served")
        .to_string();
    let mut admin = rt.block_on(ControlClient::connect(&control, None)).unwrap();

    // To the backup NIC and back: one call per operation on every rank, the whole list.
    for (use_backup, flags) in [(true, vec![true, true]), (false, vec![false, false])] {
        let before: Vec<u64> = ranks
            .iter()
            .map(|r| r.steps.load(Ordering::SeqCst))
            .collect();
        let report = rt
            .block_on(admin.run(&command(job, &[1, 0], use_backup)))
            .unwrap();
        assert_eq!(report.result, "succeeded", "{report:?}");
        for (i, r) in ranks.iter().enumerate() {
            let calls = r.framework.calls.lock().unwrap();
            assert_eq!(
                calls.last().unwrap(),
                &(vec![3, 2], flags.clone(), false),
                "rank {i}"
            );
            assert!(r.steps.load(Ordering::SeqCst) >= before[i], "rank {i}");
        }
    }
    assert!(ranks
        .iter()
        .all(|r| r.framework.calls.lock().unwrap().len() == 2));

    // Rank 1's framework answers False: the operation fails naming rank 1 and rolls back,
    // which calls every framework again with the previous state.
    ranks[1].framework.fail.store(true, Ordering::SeqCst);
    let report = rt.block_on(admin.run(&command(job, &[0], true))).unwrap();
    assert_eq!(report.result, "failed");
    assert!(report.rolled_back, "{report:?}");
    let err = &report.rank_errors[0];
    assert_eq!(err.rank, 1);
    assert!(
        err.message.contains("_comm_switch_nic returned False"),
        "{err:?}"
    );
    for r in &ranks {
        let calls = r.framework.calls.lock().unwrap();
        assert_eq!(calls.len(), 4);
        assert_eq!(calls[2], (vec![2], vec![true], false));
        assert_eq!(calls[3], (vec![2], vec![false], false));
    }

    // Training went on after each operation.
    let after: Vec<u64> = ranks
        .iter()
        .map(|r| r.steps.load(Ordering::SeqCst))
        .collect();
    let wanted: Vec<u64> = after.iter().map(|s| s + 3).collect();
    for (r, want) in ranks.iter().zip(&wanted) {
        while r.steps.load(Ordering::SeqCst) < *want {
            std::thread::yield_now();
        }
    }
    stop.store(true, Ordering::SeqCst);
    // Every communication group agrees on its NIC configuration: each rank's framework was
    // last told the same thing (here: nothing on backup).
    let last: Vec<_> = ranks
        .iter()
        .map(|r| r.framework.calls.lock().unwrap().last().cloned().unwrap())
        .collect();
    assert!(last.windows(2).all(|w| w[0] == w[1]), "{last:?}");
    drop(admin);
    for r in ranks {
        r.training.join().unwrap();
        r.worker.stop("test over");
    }
    for p in &proxies {
        p.stop("test over");
    }
    manager.stop("test over");
    assert_eq!(
        manager.wait(Some(Duration::from_secs(30))).unwrap(),
        "test over"
    );
}

/// A worker whose job never becomes whole (no proxy answers) says so as a timeout, and as a
/// stop once stopped.
#[test]
fn waiting_for_a_job_that_never_becomes_whole_ends_in_a_timeout_or_a_stop() {
    let stop = Arc::new(AtomicBool::new(true));
    let r = start_rank("alone", 0, "127.0.0.1:1", stop);
    r.training.join().unwrap();
    let e = r.worker.wait_job_whole(Some(Duration::ZERO)).unwrap_err();
    assert!(
        e.to_string().contains("every rank of the job to register"),
        "{e}"
    );
    r.worker.stop("test over");
    let e = r.worker.wait_job_whole(None).unwrap_err();
    assert!(matches!(e, taskd_capi::CapiError::Stopped(_)), "{e}");
}
