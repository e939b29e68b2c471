//! The rig's rank threads: each sets up its device and communicators, then trains an
//! all-reduce loop and checks every sum, calling its step gate after each step.

use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use taskd_actors::StepGate;
use taskd_core::{
    DeviceId, GlobalRank, GroupInfo, GroupRank, HalError, HcclSetup, RankHal, StepBoundary,
    StepOutcome, SwitchCapabilities,
};
use taskd_hal_ascend::result;
use taskd_hal_ascend::sys::acl::{AclLib, MemMallocPolicy};
use taskd_hal_ascend::sys::hccl::{HcclDataType, HcclLib, HcclReduceOp};
use taskd_hal_ascend::{AscendRankHal, Comm, DeviceBuffer, RootInfo, Stream};

/// The rank HAL the worker gets: the rank's [`AscendRankHal`], shared with its training loop.
pub(super) struct SharedRankHal(pub(super) Arc<Mutex<AscendRankHal>>);

pub(super) fn lock(m: &Mutex<AscendRankHal>) -> MutexGuard<'_, AscendRankHal> {
    // A panic elsewhere does not make the communicators unusable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl RankHal for SharedRankHal {
    fn groups(&mut self) -> Result<Vec<GroupInfo>, HalError> {
        lock(&self.0).groups()
    }

    fn set_working_nic(
        &mut self,
        group: &str,
        ranks: &[GroupRank],
        use_backup: &[bool],
    ) -> Result<(), HalError> {
        lock(&self.0).set_working_nic(group, ranks, use_backup)
    }

    fn capabilities(&mut self) -> SwitchCapabilities {
        lock(&self.0).capabilities()
    }
}

// ---------------------------------------------------------------------------------------------
// Training state shared by the rank threads and the rig

pub(super) struct TrainState {
    pub(super) completed: Vec<u64>,
    pub(super) started: Vec<u64>,
    /// Per rank, the timed collectives of step `i + 1`.
    pub(super) latency: Vec<Vec<Duration>>,
    pub(super) stop_after: Option<u64>,
    /// Per rank, whether its thread left (or never entered) its training loop.
    pub(super) exited: Vec<bool>,
    pub(super) errors: Vec<String>,
    pub(super) wrong_results: u64,
}

pub(super) struct Shared {
    pub(super) state: Mutex<TrainState>,
    pub(super) cv: Condvar,
}

impl Shared {
    pub(super) fn new(n: usize) -> Self {
        Shared {
            state: Mutex::new(TrainState {
                completed: vec![0; n],
                started: vec![0; n],
                latency: vec![Vec::new(); n],
                stop_after: None,
                exited: vec![false; n],
                errors: Vec::new(),
                wrong_results: 0,
            }),
            cv: Condvar::new(),
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, TrainState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn min_steps(&self) -> u64 {
        self.lock().completed.iter().copied().min().unwrap_or(0)
    }

    pub(super) fn max_steps(&self) -> u64 {
        self.lock().completed.iter().copied().max().unwrap_or(0)
    }

    /// Waits until every rank completed `n` steps; false on timeout or when a rank stopped
    /// training short of it.
    pub(super) fn wait_min_steps(&self, n: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut st = self.lock();
        loop {
            if st.completed.iter().all(|c| *c >= n) {
                return true;
            }
            if st
                .exited
                .iter()
                .zip(&st.completed)
                .any(|(e, c)| *e && *c < n)
            {
                return false;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            st = self
                .cv
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Every rank stops after `step`, or after the latest step any rank started.
    pub(super) fn stop_after(&self, step: u64) -> u64 {
        let mut st = self.lock();
        let started = st.started.iter().copied().max().unwrap_or(0);
        let stop = step.max(started);
        let stop = st.stop_after.map_or(stop, |s| s.min(stop));
        st.stop_after = Some(stop);
        self.cv.notify_all();
        stop
    }

    /// Waits (up to `timeout`) until no rank is in its training loop.
    pub(super) fn wait_loops_ended(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let mut st = self.lock();
        while !st.exited.iter().all(|e| *e) {
            let now = Instant::now();
            if now >= deadline {
                return;
            }
            st = self
                .cv
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// Marks a rank's training loop as left, even by panic.
pub(super) struct LoopGuard(Arc<Shared>, usize);

impl Drop for LoopGuard {
    fn drop(&mut self) {
        self.0.lock().exited[self.1] = true;
        self.0.cv.notify_all();
    }
}

// ---------------------------------------------------------------------------------------------
// One rank

/// What a rank thread needs.
pub(super) struct RankSetup {
    pub(super) rank: u32,
    pub(super) device: DeviceId,
    pub(super) hccl: Arc<HcclLib>,
    pub(super) acl: Arc<AclLib>,
    /// The groups this rank is in: (root info, members), world first.
    pub(super) groups: Vec<(RootInfo, Vec<GlobalRank>)>,
    pub(super) caps: HcclSetup,
    pub(super) elements: usize,
    pub(super) compute: Duration,
    /// Every this many steps an evaluation all-reduce on the world communicator (0: never).
    pub(super) eval_every: u64,
    pub(super) timeout: Duration,
}

/// The device resources of a rank, made and released on its thread.
pub(super) struct RankDevice {
    pub(super) stream: Stream,
    pub(super) send: DeviceBuffer,
    pub(super) recv: DeviceBuffer,
}

/// A rank's HAL and its groups as HCCL names them, or why the rank could not start.
pub(super) type Ready = Result<(Arc<Mutex<AscendRankHal>>, Vec<GroupInfo>), String>;

pub(super) fn rank_init(
    s: &RankSetup,
) -> Result<(RankDevice, AscendRankHal, Vec<GroupInfo>), String> {
    let bytes = s.elements * std::mem::size_of::<f32>();
    result::acl::set_device(&s.acl, s.device.0 as i32).map_err(|e| e.to_string())?;
    let stream = Stream::new(&s.acl).map_err(|e| e.to_string())?;
    let mut send = DeviceBuffer::alloc(&s.acl, bytes, MemMallocPolicy::HugeFirst)
        .map_err(|e| e.to_string())?;
    let recv = DeviceBuffer::alloc(&s.acl, bytes, MemMallocPolicy::HugeFirst)
        .map_err(|e| e.to_string())?;
    let mine = (s.rank as f32 + 1.0).to_le_bytes();
    let host: Vec<u8> = std::iter::repeat(mine).take(s.elements).flatten().collect();
    send.copy_from_host(&host).map_err(|e| e.to_string())?;
    let mut comms = Vec::new();
    for (root, members) in &s.groups {
        let group_rank = members
            .iter()
            .position(|m| m.0 == s.rank)
            .expect("only groups with this rank") as u32;
        let comm = Comm::init_root_info(&s.hccl, members.len() as u32, root, group_rank)
            .map_err(|e| e.to_string())?;
        comms.push((
            comm,
            GroupInfo {
                // HCCL's own name (identical on every member) is filled in by the HAL.
                name: String::new(),
                members: members.clone(),
            },
        ));
    }
    let mut hal = AscendRankHal::with_capabilities(comms, s.caps);
    // HCCL's names, and a check that HCCL's sizes match the members.
    let groups = hal.groups().map_err(|e| e.to_string())?;
    Ok((RankDevice { stream, send, recv }, hal, groups))
}

pub(super) fn rank_thread(
    s: RankSetup,
    ready: mpsc::Sender<(u32, Ready)>,
    gate: mpsc::Receiver<Option<Arc<StepGate>>>,
    shared: Arc<Shared>,
) {
    let r = s.rank as usize;
    let (mut dev, hal, groups) = match rank_init(&s) {
        Ok(x) => x,
        Err(e) => {
            let _ = ready.send((s.rank, Err(e)));
            drop(LoopGuard(shared, r));
            return;
        }
    };
    let hal = Arc::new(Mutex::new(hal));
    let _ = ready.send((s.rank, Ok((Arc::clone(&hal), groups))));
    let expected: Vec<f32> = s
        .groups
        .iter()
        .map(|(_, m)| m.iter().map(|g| g.0 as f32 + 1.0).sum())
        .collect();
    if let Ok(Some(gate)) = gate.recv() {
        train(&s, &mut dev, &hal, &expected, gate.as_ref(), &shared);
    } else {
        drop(LoopGuard(Arc::clone(&shared), r));
    }
    // Release on this thread (its device is current), after every rank left its loop so no
    // peer is still inside a collective on these communicators.
    shared.wait_loops_ended(s.timeout);
    let comms = {
        let mut h = lock(&hal);
        std::mem::replace(
            &mut *h,
            AscendRankHal::with_capabilities(Vec::new(), s.caps),
        )
        .into_comms()
    };
    for (comm, _) in comms {
        if let Err(e) = comm.destroy() {
            shared.lock().errors.push(format!("rank {r}: {e}"));
        }
    }
    drop(dev);
}

pub(super) fn train(
    s: &RankSetup,
    dev: &mut RankDevice,
    hal: &Mutex<AscendRankHal>,
    expected: &[f32],
    gate: &dyn StepBoundary,
    shared: &Arc<Shared>,
) {
    let r = s.rank as usize;
    let _looping = LoopGuard(Arc::clone(shared), r);
    let mut host = vec![0u8; s.elements * std::mem::size_of::<f32>()];
    let mut step = 0u64;
    loop {
        let next = step + 1;
        {
            let mut st = shared.lock();
            if st.stop_after.is_some_and(|stop| next > stop) {
                return;
            }
            st.started[r] = next;
        }
        if !s.compute.is_zero() {
            // Simulated compute: time passes, nothing is waited for.
            std::thread::sleep(s.compute);
        }
        let done = {
            let h = lock(hal);
            collectives(s, dev, &h, expected, &mut host, next)
        };
        let (took, wrong) = match done {
            Ok(x) => x,
            Err(e) => {
                shared
                    .lock()
                    .errors
                    .push(format!("rank {r} step {next}, {e}"));
                return;
            }
        };
        {
            let mut st = shared.lock();
            st.latency[r].push(took);
            st.wrong_results += wrong;
            st.completed[r] = next;
        }
        shared.cv.notify_all();
        step = next;
        if let StepOutcome::Stop(why) = gate.step_completed(step) {
            let stopped = format!("rank {r} after step {step}: training stopped: {why}");
            shared.lock().errors.push(stopped);
            return;
        }
    }
}

/// One step's collectives: the training all-reduce of every communicator (timed), then, on an
/// evaluation step, the evaluation's. Returns the time the training all-reduces took and how
/// many results were wrong.
pub(super) fn collectives(
    s: &RankSetup,
    dev: &mut RankDevice,
    h: &AscendRankHal,
    expected: &[f32],
    host: &mut [u8],
    step: u64,
) -> Result<(Duration, u64), String> {
    let mut took = Duration::ZERO;
    let mut wrong = 0u64;
    for ((comm, info), want) in h.comms().zip(expected) {
        let t = Instant::now();
        let res = all_reduce(comm, dev, s.elements as u64);
        took += t.elapsed();
        wrong += u64::from(!check_sum(res, dev, host, *want, info)?);
    }
    if let Some(count) = evaluation_count(s.eval_every, s.elements, step) {
        let (world, info) = h.comms().next().expect("every rank is in the world group");
        let res = all_reduce(world, dev, count);
        let n = count as usize * std::mem::size_of::<f32>();
        wrong += u64::from(!check_sum(res, dev, &mut host[..n], expected[0], info)?);
    }
    Ok((took, wrong))
}

/// `count` f32 of the send buffer all-reduced (sum) into the receive buffer, waited for.
pub(super) fn all_reduce(comm: &Comm, dev: &mut RankDevice, count: u64) -> Result<(), HalError> {
    comm.all_reduce(
        &dev.send,
        &mut dev.recv,
        count,
        HcclDataType::Fp32,
        HcclReduceOp::Sum,
        &dev.stream,
    )?;
    dev.stream.synchronize().map_err(HalError::from)
}

/// Whether the first `host.len()` bytes received are all `want`; an error (naming the group)
/// when the all-reduce or the copy failed.
pub(super) fn check_sum(
    res: Result<(), HalError>,
    dev: &RankDevice,
    host: &mut [u8],
    want: f32,
    info: &GroupInfo,
) -> Result<bool, String> {
    let res = res.and_then(|()| dev.recv.copy_to_host(host).map_err(Into::into));
    res.map_err(|e| {
        let members: Vec<u32> = info.members.iter().map(|m| m.0).collect();
        format!("group of {members:?}: {e}")
    })?;
    Ok(host
        .chunks_exact(4)
        .all(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")) == want))
}

/// The element count of the evaluation at `step`, if `step` is an evaluation step: the `n`-th
/// evaluation all-reduces `elements - 1 - (n - 1) % (elements - 1)` values, a count training
/// never uses and no recent evaluation used, so HCCL sees an operator it has not issued before
/// (it repeats after `elements - 1` evaluations). None without evaluations or with one element.
pub(super) fn evaluation_count(eval_every: u64, elements: usize, step: u64) -> Option<u64> {
    let sizes = (elements as u64).checked_sub(1).filter(|s| *s > 0)?;
    if eval_every == 0 || step % eval_every != 0 {
        return None;
    }
    let n = step / eval_every;
    Some(sizes - (n - 1) % sizes)
}
