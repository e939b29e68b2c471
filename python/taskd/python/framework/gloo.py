"""taskd's own NIC switch for plain PyTorch process groups on Gloo (no torch_npu).

Gloo cannot change the interface of a group it built: a switch builds a new group on the
target interface (``ProcessGroupGloo.create_device(interface=...)``), swaps it in where the old
one was used, and destroys the old one off the training thread's path. The worker calls
:func:`switch_nic` at the step boundary, every rank with the same whole target list.

**Configuration** (environment of every training process):

- ``TASKD_GLOO_PRIMARY_IFNAME`` / ``TASKD_GLOO_BACKUP_IFNAME``: this rank's two interfaces. The
  job starts on the primary (``init_process_group`` under ``GLOO_SOCKET_IFNAME`` = the primary).
- ``TASKD_GLOO_SWITCH_TIMEOUT_MS`` (default 30000): the rebuild's deadline when the worker does
  not pass one; shorter than the manager's switch phase (300 s by default), so a rollback has
  time left.
- ``TASKD_GLOO_ROUTE_CMD`` (optional): a command the node's first local rank runs with
  ``backup`` or ``primary`` when its node's ranks move while other nodes stay. Gloo binds only
  its listening socket; a connection goes out of whatever interface the node's routes pick for
  the peer's address. Without the command only the whole job moves (a subset is refused: its
  traffic to the ranks left on the primary plane would stay on its primary interface); with
  it, the command must make the node reach the primary plane's addresses over its backup
  interface (``primary`` undoes it).
- ``LOCAL_WORLD_SIZE`` and ``LOCAL_RANK`` (torchrun's): which ranks share a node (``rank //
  LOCAL_WORLD_SIZE``). A node's ranks share its routes, so they move together.

**What moves:** the default group, the DDP modules given to :func:`register_ddp`, and the groups
made with :func:`new_group` (read them back with :meth:`Group.current` after a switch). A group
on another backend is refused: NCCL reads its NIC settings once per process.

**Failure:** every rank votes in the default group's store before anything is built and again
once its groups are built, so a rank that fails its part fails every rank within the deadline,
not at a store timeout. The store must not ride on a plane being switched away from.

**torch's private internals.** Swapping a group in place needs what torch does not export;
verified with torch 2.15.0 (the version the tests and the network rig ran; no other version
was tried): ``distributed_c10d._world`` (its ``pg_group_ranks``, ``pg_backend_config``,
``pg_names``, ``pg_map``, ``pg_to_tag``, ``tags_to_pg``), ``distributed_c10d``'s
``_get_default_store``, ``_get_default_group``, ``_get_process_group_name``,
``_register_process_group``, ``_unregister_process_group`` and ``_update_default_pg``;
``ProcessGroup._set_group_name``, ``_set_default_backend``, ``_register_backend`` and
``BackendType.GLOO``; ``ProcessGroupGloo._Options`` (``_timeout``, ``_devices``) and
``create_device``; ``DistributedDataParallel``'s ``reducer._update_process_group``. :data:`TORCH_INTERNALS`
lists them; at import (where torch is importable) :func:`missing_internals` checks which this
torch has, logs the ones it lacks, and :func:`switch_nic` refuses with their names instead of
failing halfway through a swap.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import importlib
import os
import queue
import shlex
import subprocess
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from taskd.python.utils.log import get_logger

NAME = "taskd.python.framework.gloo.switch_nic"
ENV_PRIMARY = "TASKD_GLOO_PRIMARY_IFNAME"
ENV_BACKUP = "TASKD_GLOO_BACKUP_IFNAME"
ENV_TIMEOUT = "TASKD_GLOO_SWITCH_TIMEOUT_MS"
ENV_ROUTE_CMD = "TASKD_GLOO_ROUTE_CMD"
DEFAULT_TIMEOUT_MS = 30000
STORE_PREFIX = "taskd-gloo"


class GlooSwitchError(Exception):
    """This rank's part of a switch failed or was refused; the text says why."""


#: torch's private names the switch uses: (module, attribute path), checked at import
TORCH_INTERNALS: Tuple[Tuple[str, str], ...] = tuple(
    ("torch.distributed.distributed_c10d", a) for a in (
        "_world.pg_group_ranks", "_world.pg_backend_config", "_world.pg_names", "_world.pg_map",
        "_world.pg_to_tag", "_world.tags_to_pg", "_get_default_store", "_get_default_group",
        "_get_process_group_name", "_register_process_group", "_unregister_process_group",
        "_update_default_pg")
) + tuple(("torch.distributed", a) for a in (
    "ProcessGroup._set_group_name", "ProcessGroup._set_default_backend",
    "ProcessGroup._register_backend", "ProcessGroup.BackendType.GLOO",
    "ProcessGroupGloo._Options", "ProcessGroupGloo.create_device",
)) + (("torch.distributed", "Reducer._update_process_group"),)


def missing_internals() -> Optional[List[str]]:
    """Which of :data:`TORCH_INTERNALS` this process's torch lacks (``[]``: none), or ``None``
    when torch.distributed is not importable here."""
    missing = []
    for module, path in TORCH_INTERNALS:
        try:
            obj = importlib.import_module(module)
        except ImportError:
            return None
        for part in path.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                missing.append("%s.%s" % (module, path))
                break
    return missing


def _check_torch_at_import() -> Optional[List[str]]:
    missing = missing_internals()
    if missing:
        import torch

        get_logger().warning(
            "taskd's Gloo switch cannot run on torch %s, which lacks %s (it was verified with "
            "torch 2.15.0)", getattr(torch, "__version__", "?"), ", ".join(missing))
    return missing


#: what :func:`missing_internals` said at import (``None``: torch was not importable then)
MISSING_AT_IMPORT = _check_torch_at_import()


class VoteKind(enum.Enum):
    OK = "ok"  # this rank's part is done (or, before the build, planned)
    NOOP = "noop"  # nothing to do on this rank
    FAIL = "fail"  # this rank's part failed: ``reason`` says why


@dataclasses.dataclass(frozen=True)
class Vote:
    """One rank's vote in the store, as the store holds it: ``ok``, ``noop``, ``fail: REASON``."""

    kind: VoteKind
    reason: str = ""

    def encode(self) -> str:
        return "fail: %s" % self.reason if self.kind is VoteKind.FAIL else self.kind.value

    @staticmethod
    def decode(text: str) -> "Vote":
        if text.startswith("fail: "):
            return Vote(VoteKind.FAIL, text[len("fail: "):])
        try:
            return Vote(VoteKind(text))
        except ValueError:
            return Vote(VoteKind.FAIL, "an unreadable vote %r" % text)


def timeout_from_env(environ: Optional[Dict[str, str]] = None) -> int:
    """``$TASKD_GLOO_SWITCH_TIMEOUT_MS`` (a positive integer), else the default."""
    env = os.environ if environ is None else environ
    raw = env.get(ENV_TIMEOUT, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT_MS
    try:
        value = int(raw)
    except ValueError:
        raise GlooSwitchError("$%s=%r is not an integer" % (ENV_TIMEOUT, raw))
    if value <= 0:
        raise GlooSwitchError("$%s=%d is not positive" % (ENV_TIMEOUT, value))
    return value


class Deadline:
    """The time a switch has left."""

    def __init__(self, ms: int, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._end = clock() + ms / 1000.0

    def left_s(self) -> float:
        return max(0.0, self._end - self._clock())

    def left(self) -> datetime.timedelta:
        return datetime.timedelta(seconds=max(self.left_s(), 0.001))


# ---- the plan: pure, the same on every rank ------------------------------------------------


class Plan:
    """What one call asks of the job: the new side of every rank, which nodes' routes change."""

    def __init__(self, sides: List[bool], route: Dict[int, bool], noop: bool):
        self.sides = sides  # global rank -> on backup
        self.route = route  # node -> its route to the primary plane goes over backup
        self.noop = noop


def node_of(rank: int, local_world: int) -> int:
    return rank // local_world


def plan(
    sides: Sequence[bool],
    routes: Dict[int, bool],
    ranks: Sequence[int],
    use_backup: Sequence[bool],
    local_world: int,
    route_cmd: bool,
) -> Plan:
    """The job after ``ranks[i]`` move to backup when ``use_backup[i]``; refuses what Gloo
    cannot move (``GlooSwitchError``, the same text on every rank)."""
    world = len(sides)
    if len(ranks) != len(use_backup):
        raise GlooSwitchError("%d ranks but %d flags" % (len(ranks), len(use_backup)))
    new = list(sides)
    for r, b in zip(ranks, use_backup):
        if not 0 <= r < world:
            raise GlooSwitchError("rank %d is not in this job of %d ranks" % (r, world))
        new[r] = bool(b)
    nodes = (world + local_world - 1) // local_world
    per_node = {}
    for k in range(nodes):
        members = range(k * local_world, min(world, (k + 1) * local_world))
        got = {new[r] for r in members}
        if len(got) > 1:
            raise GlooSwitchError(
                "ranks %d-%d share node %d's routes and move together; this switch moves "
                "only some of them" % (members[0], members[-1], k)
            )
        per_node[k] = got.pop()
    whole = len(set(per_node.values())) == 1
    if not whole and not route_cmd:
        raise GlooSwitchError(
            "taskd's Gloo switch moves the whole job at once unless $%s is set: a part of the "
            "job on its backup interface would still reach the ranks left on the primary "
            "plane over its primary interface (Gloo's connections follow the node's routes). "
            "Switch all %d ranks, or give the route command" % (ENV_ROUTE_CMD, world)
        )
    # A node's route matters only while the job is split: on the backup plane everyone is
    # reached there anyway (stale routes are harmless), on the primary plane none may remain.
    everyone_on_backup = whole and per_node.get(0, False)
    route = {} if not route_cmd or everyone_on_backup else dict(per_node)
    noop = new == list(sides) and all(routes.get(k, False) == v for k, v in route.items())
    return Plan(new, route, noop)


# ---- the process's groups -------------------------------------------------------------------


class Group:
    """A group made through taskd: :meth:`current` is the process group to use now."""

    def __init__(self, pg):
        self._pg = pg

    def current(self):
        return self._pg


class _Reaper:
    """Destroys replaced groups on a thread of its own: a Gloo group's destructor joins its
    threads and closes its sockets (tens of ms), which the training thread must not wait for."""

    def __init__(self):
        self._q: "queue.Queue" = queue.Queue()
        self._thread: Optional[threading.Thread] = None
        self.destroyed = 0

    def put(self, pgs: list) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="taskd-gloo-reaper", daemon=True)
            self._thread.start()
        self._q.put(pgs)

    def _run(self) -> None:
        while True:
            pgs = self._q.get()
            for pg in pgs:
                _shutdown(pg)
            del pgs
            self.destroyed += 1
            self._q.task_done()

    def drain(self) -> None:
        """Until every group handed over so far is destroyed (tests, exit)."""
        self._q.join()


def _shutdown(pg) -> None:
    try:
        pg.shutdown()
    except Exception as e:  # a group that cannot shut down is dropped all the same
        get_logger().warning("taskd's Gloo switch: a replaced process group did not shut down "
                             "(%s: %s); it is dropped", type(e).__name__, e)


class _Registry:
    def __init__(self):
        self.lock = threading.Lock()
        self.ddp: list = []
        self.groups: List[Group] = []
        self.sides: Optional[List[bool]] = None
        self.routes: Dict[int, bool] = {}
        self.generation = 0
        self.reaper = _Reaper()
        self.history: List[Dict[str, float]] = []  # every call's timings (ms), for rigs and logs


_reg = _Registry()


def register_ddp(module) -> None:
    """Moves ``module`` (a ``DistributedDataParallel``) with every switch: one call after it
    is built."""
    if not hasattr(module, "_update_process_group"):
        raise TypeError("register_ddp takes a DistributedDataParallel, got %s" % type(module).__name__)
    with _reg.lock:
        _reg.ddp.append(module)
    _install_ddp_hooks(module)


def new_group(ranks: Optional[Sequence[int]] = None) -> Group:
    """``torch.distributed.new_group`` on Gloo on this rank's interface now; switches move it.
    Every rank calls it (as ``new_group``)."""
    import torch.distributed as dist

    pg = dist.new_group(ranks=list(ranks) if ranks is not None else None, backend="gloo")
    g = Group(pg)
    with _reg.lock:
        _reg.groups.append(g)
    return g


def interfaces(environ: Optional[Dict[str, str]] = None) -> Dict[bool, str]:
    """``{False: primary, True: backup}`` from the environment; refuses what is missing."""
    env = os.environ if environ is None else environ
    out = {}
    for backup, var in ((False, ENV_PRIMARY), (True, ENV_BACKUP)):
        name = env.get(var, "").strip()
        if not name:
            raise GlooSwitchError("$%s is not set: taskd's Gloo switch needs this rank's interfaces" % var)
        out[backup] = name
    return out


def _check_interface(name: str) -> None:
    if not os.path.exists(os.path.join("/sys/class/net", name)):
        raise GlooSwitchError("interface %s does not exist in this network namespace" % name)


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    return int(raw) if raw else default


def switch_nic(ranks: Sequence[int], use_backup: Sequence[bool], timeout_ms: Optional[int] = None) -> bool:
    """Moves this process's groups so that ``ranks[i]`` use their backup interface when
    ``use_backup[i]``; ``True`` when every rank's groups are rebuilt and swapped in.
    Raises ``GlooSwitchError`` with the reason otherwise (the old groups stay in use)."""
    missing = MISSING_AT_IMPORT if MISSING_AT_IMPORT is not None else missing_internals()
    if missing:
        raise GlooSwitchError("this torch lacks what taskd's Gloo switch uses: %s" % ", ".join(missing))
    import torch.distributed as dist

    deadline = Deadline(timeout_ms if timeout_ms is not None else timeout_from_env())
    if not dist.is_initialized():
        raise GlooSwitchError("torch.distributed is not initialised in this process")
    with _reg.lock:
        _reg.generation += 1
        gen = _reg.generation
        return _Switch(dist, gen, deadline).run(list(ranks), [bool(b) for b in use_backup])


class _Switch:
    """One call: vote, build, vote, swap."""

    def __init__(self, dist, gen: int, deadline: Deadline, in_flight: Optional[Dict[str, int]] = None):
        self.dist = dist
        self.gen = gen
        self.deadline = deadline
        # An in-flight move's redo points: the groups are rebuilt even where nothing moves
        # (their connections on the old plane are shut down), DDP's swap waits for its next
        # forward, and the sequences are issued again from these points.
        self.in_flight = in_flight
        self.figures: Dict[str, float] = {}
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.store = dist.distributed_c10d._get_default_store()

    def run(self, ranks: List[int], flags: List[bool]) -> bool:
        t0 = time.perf_counter()
        if _reg.sides is None:
            _reg.sides = [False] * self.world
        local_world = _env_int("LOCAL_WORLD_SIZE", self.world)
        route_cmd = os.environ.get(ENV_ROUTE_CMD, "").strip()
        try:
            p = plan(_reg.sides, _reg.routes, ranks, flags, local_world, bool(route_cmd))
            names = interfaces()
            targets = self._targets()
            _check_interface(names[p.sides[self.rank]])
            self._route(p, route_cmd, local_world)
            mine = Vote(VoteKind.NOOP if p.noop else VoteKind.OK)
        except GlooSwitchError as e:
            self._vote("plan", Vote(VoteKind.FAIL, str(e)))
            raise
        votes = self._vote("plan", mine)
        if self.in_flight is None and all(v.kind is VoteKind.NOOP for v in votes.values()):
            self._record(rebuild_ms=0.0, total_ms=(time.perf_counter() - t0) * 1000)
            return True
        t1 = time.perf_counter()
        try:
            built = self._build(targets, names[p.sides[self.rank]])
            mine = Vote(VoteKind.OK)
        except Exception as e:  # noqa: B902 - Gloo raises RuntimeError and friends
            built, mine = {}, Vote(VoteKind.FAIL, "building the groups on %s: %s" % (
                names[p.sides[self.rank]], e))
        try:
            self._vote("built", mine)
        except GlooSwitchError:
            _reg.reaper.put(list(built.values()))
            raise
        t2 = time.perf_counter()
        if self.in_flight is None:
            self._swap(built)
        else:
            self.figures["redone"] = self._swap_in_flight(built)
        _reg.sides = p.sides
        self._record(rebuild_ms=(t2 - t1) * 1000, swap_ms=(time.perf_counter() - t2) * 1000,
                     total_ms=(time.perf_counter() - t0) * 1000)
        self.figures.update(rebuild_ms=(t2 - t1) * 1000, swap_ms=(time.perf_counter() - t2) * 1000,
                            switch_ms=(time.perf_counter() - t0) * 1000)
        if self.in_flight is not None and _seq.moves:
            m = _seq.moves[-1]
            m.update(self.figures)
            m["t_switched"] = time.time()
            if _seq._parked_at is not None:
                m["waited_ms"] = (time.perf_counter() - _seq._parked_at) * 1000
        return True

    def _swap_in_flight(self, built: Dict[int, object]) -> int:
        """:meth:`_swap` while the training thread waits mid-step: torch's tables and taskd's
        groups now, DDP's own swap at its next forward (its reducer resets), the sequences on
        the new groups and issued again from the redo points, all under the sequencer's lock
        (no collective is issued between)."""
        c10d = self.dist.distributed_c10d
        default = c10d._get_default_group()
        old = []
        with _seq.lock:
            names = {}
            for key, new in built.items():
                pg = _find(key, default, _reg.ddp, _reg.groups)
                names[c10d._get_process_group_name(pg)] = new
                _adopt(c10d, pg, new, is_default=pg is default)
                old.append(pg)
            for m in _reg.ddp:
                new = built.get(id(m.process_group))
                if new is not None:
                    _seq.deferred_ddp[id(m)] = new
            for g in _reg.groups:
                new = built.get(id(g.current()))
                if new is not None:
                    g._pg = new
            n = _seq.redo(self.in_flight or {}, names)
            if _seq.deferred_ddp:
                _seq.deferred_reap.extend(old)
                old = []
        if old:
            _reg.reaper.put(old)
        return n

    def _record(self, **ms: float) -> None:
        ms["generation"] = self.gen
        _reg.history.append(ms)

    def _targets(self) -> Dict[int, object]:
        """Every distinct group to move, by identity: the default group, the DDP modules',
        taskd's own. A group on another backend is refused."""
        dist = self.dist
        out = {}
        pgs = [dist.distributed_c10d._get_default_group()]
        pgs += [m.process_group for m in _reg.ddp] + [g.current() for g in _reg.groups]
        for pg in pgs:
            if pg is None or pg == dist.GroupMember.NON_GROUP_MEMBER:
                continue  # a group this rank is not in: its members move it
            backend = str(dist.get_backend(pg)).lower()
            if backend != "gloo":
                raise GlooSwitchError(
                    "a process group on %s cannot move: NCCL reads NCCL_SOCKET_IFNAME and "
                    "NCCL_IB_HCA once per process, and taskd's switch rebuilds Gloo groups only"
                    % backend
                )
            out[id(pg)] = pg
        return out

    def _route(self, p: Plan, cmd: str, local_world: int) -> None:
        """The node's first local rank changes its node's route when the plan says so (before
        it votes: no rank of the node builds a group before that)."""
        node = node_of(self.rank, local_world)
        want = p.route.get(node)
        if want is None or _reg.routes.get(node, False) == want:
            return
        if _env_int("LOCAL_RANK", self.rank % local_world) == 0:
            side = "backup" if want else "primary"
            argv = shlex.split(cmd) + [side]
            try:
                subprocess.run(argv, check=True, timeout=self.deadline.left_s(),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            except subprocess.CalledProcessError as e:
                out = e.stdout.decode(errors="replace").strip()
                raise GlooSwitchError("%s failed (%s): %s" % (" ".join(argv), e.returncode, out))
            except (OSError, subprocess.TimeoutExpired) as e:
                raise GlooSwitchError("%s: %s" % (" ".join(argv), e))
        _reg.routes[node] = want

    def _key(self, phase: str, rank: int) -> str:
        return "%s/%d/%s/%d" % (STORE_PREFIX, self.gen, phase, rank)

    def _vote(self, phase: str, mine: Vote) -> Dict[int, Vote]:
        """Writes this rank's vote, waits for every rank's within the deadline; a failed vote
        anywhere (or a missing one) is this rank's failure too."""
        self.store.set(self._key(phase, self.rank), mine.encode())
        keys = [self._key(phase, r) for r in range(self.world)]
        try:
            self.store.wait(keys, self.deadline.left())
        except Exception as e:  # noqa: B902 - the store raises its own errors for a timeout
            missing = [r for r, k in enumerate(keys) if not self.store.check([k])]
            get_logger().warning("taskd's Gloo switch: the %s vote's wait ended with %s: %s",
                                 phase, type(e).__name__, e)
            raise GlooSwitchError(
                "ranks %s did not answer the %s vote within the switch deadline (%s)"
                % (missing, phase, type(e).__name__)
            )
        votes = {r: Vote.decode(self.store.get(k).decode()) for r, k in enumerate(keys)}
        failed: Dict[str, List[int]] = {}
        for r, v in votes.items():
            if v.kind is VoteKind.FAIL:
                failed.setdefault(v.reason, []).append(r)
        if failed:
            raise GlooSwitchError("; ".join("%s %s: %s" % (
                "rank" if len(rs) == 1 else "ranks", ",".join(map(str, rs)), why)
                for why, rs in failed.items()))
        return votes

    def _build(self, targets: Dict[int, object], ifname: str) -> Dict[int, object]:
        """A new group on ``ifname`` for every group to move, in the order of their names
        (the same on every member: two ranks building two groups in opposite orders would wait
        for each other)."""
        c10d = self.dist.distributed_c10d
        built = {}
        for key, pg in sorted(targets.items(), key=lambda kv: c10d._get_process_group_name(kv[1])):
            members = self.dist.get_process_group_ranks(pg)
            prefix = "%s/%d/pg/%s/" % (STORE_PREFIX, self.gen, c10d._get_process_group_name(pg))
            built[key] = build_group(self.store, prefix, members, self.rank, ifname, self.deadline.left())
        return built

    def _swap(self, built: Dict[int, object]) -> None:
        """Puts the new groups where the old ones were; the old ones go to the reaper."""
        c10d = self.dist.distributed_c10d
        default = c10d._get_default_group()
        old = []
        for key, new in built.items():
            pg = _find(key, default, _reg.ddp, _reg.groups)
            _adopt(c10d, pg, new, is_default=pg is default)
            old.append(pg)
        for m in _reg.ddp:
            new = built.get(id(m.process_group))
            if new is not None:
                _move_ddp(m, new)
        for g in _reg.groups:
            new = built.get(id(g.current()))
            if new is not None:
                g._pg = new
        _seq.moved({c10d._get_process_group_name(new): new for new in built.values()})
        _reg.reaper.put(old)


def _move_ddp(module, new) -> None:
    """DDP ``module`` onto ``new``, the same ranks on other NICs, between iterations. Its
    reducer keeps its buckets: DDP's own ``_update_process_group`` resets them, and the rebuild
    that follows broadcasts the bucket order at the second forward after, a collective outside
    taskd's sequencer that an in-flight move coming then would cut (the rank's forward raised,
    and the job restarted). The ranks and their order are the same, so the buckets stay right."""
    module.process_group = new
    module.reducer._update_process_group(new)


def _find(key: int, default, ddps, groups):
    for pg in [default] + [m.process_group for m in ddps] + [g.current() for g in groups]:
        if id(pg) == key:
            return pg
    raise GlooSwitchError("a group to move disappeared during the switch")


def _adopt(c10d, old, new, is_default: bool) -> None:
    """Registers ``new`` in torch.distributed's tables in ``old``'s place (group ranks, name,
    backend), and as the default group when ``old`` was."""
    world = c10d._world
    world.pg_group_ranks[new] = world.pg_group_ranks.pop(old)
    world.pg_backend_config[new] = world.pg_backend_config.pop(old, "gloo")
    name = world.pg_names.pop(old)
    world.pg_names[new] = name
    world.pg_map[new] = world.pg_map.pop(old)
    tag = world.pg_to_tag.pop(old, None)
    if tag is not None:
        world.pg_to_tag[new] = tag
        world.tags_to_pg[tag] = [new if p is old else p for p in world.tags_to_pg.get(tag, [])]
    new._set_group_name(name)
    c10d._unregister_process_group(name)
    c10d._register_process_group(name, new)
    if is_default:
        c10d._update_default_pg(new)


def build_group(store, prefix: str, members: List[int], rank: int, ifname: str, timeout: datetime.timedelta):
    """A Gloo process group of ``members`` (global ranks, group-rank order) on ``ifname``,
    rendezvousing under ``prefix`` in ``store``."""
    import torch
    from torch.distributed import PrefixStore, ProcessGroup, ProcessGroupGloo

    group_rank, size = members.index(rank), len(members)
    ps = PrefixStore(prefix, store)
    pg = ProcessGroup(ps, group_rank, size)
    pg._set_default_backend(ProcessGroup.BackendType.GLOO)
    opts = ProcessGroupGloo._Options()
    opts._timeout = timeout
    opts._devices = [ProcessGroupGloo.create_device(interface=ifname)]
    backend = ProcessGroupGloo(PrefixStore("cpu/", ps), group_rank, size, opts)
    pg._register_backend(torch.device("cpu"), ProcessGroup.BackendType.GLOO, backend)
    return pg


def history() -> List[Dict[str, float]]:
    """Every switch that succeeded on this rank: its rebuild / swap / total time in ms (a
    rebuild of 0: nothing to do)."""
    return [dict(h) for h in _reg.history]


def sides() -> Optional[List[bool]]:
    """Which ranks this process believes on their backup interface (``None``: never switched)."""
    return None if _reg.sides is None else list(_reg.sides)


# ---- an in-flight move: abort the collectives in flight, finish the step on the backup -----
#
# Every collective that an in-flight move can finish goes through the sequencer: DDP's
# gradient buckets (the comm hook :func:`register_ddp` installs) and :func:`all_reduce`. Each
# gets the next number of its group's sequence and keeps a copy of its input; when the manager
# aborts the collectives in flight (``in_flight_request({"op": "abort"})``, on a thread of
# taskd's), the process's sockets on the plane being left are shut down, the blocked calls fail
# at once, and their callers wait (the training thread mid-step) until the switch rebuilt the
# groups and issued them again from the point every rank agreed on (``taskd_core::inflight``).

ENV_IN_FLIGHT = "TASKD_GLOO_IN_FLIGHT"
ENV_ABORT_TIMEOUT = "TASKD_GLOO_ABORT_TIMEOUT_MS"
ENV_KEEP = "TASKD_GLOO_KEEP_COLLECTIVES"
DEFAULT_ABORT_TIMEOUT_MS = 60000
DEFAULT_KEEP = 16


class _Entry:
    """One collective of a sequence: the caller's tensor (the result goes there), the input
    kept for a redo, the future its caller waits on."""

    __slots__ = ("seq", "tensor", "kept", "op", "fut", "settled", "gen", "error", "launched",
                 "old_running", "pending")

    def __init__(self, seq: int, tensor, op, fut):
        self.seq, self.tensor, self.op, self.fut = seq, tensor, op, fut
        self.kept = tensor.detach().clone()
        self.settled = False  # its caller has its result (or its error)
        self.gen = -1  # the group generation it was last launched on
        self.error = None  # the failure that parked it
        self.launched = False
        self.old_running = False  # a launch on a replaced group has not ended yet
        self.pending = None  # a redo's result waiting for that launch to end


class _Sequence:
    """One group's collectives through taskd, numbered in issue order (the same on every
    member)."""

    def __init__(self, name: str, pg, size: int):
        self.name, self.pg, self.size = name, pg, size
        self.issued = 0
        self.completed = 0  # the completed prefix
        self.done: set = set()  # completed past the prefix
        self.entries: Dict[int, _Entry] = {}
        self.generation = 0

    def mark(self, seq: int, keep: int) -> None:
        self.done.add(seq)
        while self.completed in self.done:
            self.done.remove(self.completed)
            self.completed += 1
        for old in [s for s in self.entries if s < self.completed - keep]:
            del self.entries[old]

    def position(self) -> Dict[str, object]:
        return {"group": self.name, "size": self.size, "completed": self.completed,
                "issued": self.issued}


class InFlightError(GlooSwitchError):
    """An in-flight move cannot finish here; the text says why."""


class _Sequencer:
    def __init__(self):
        self.lock = threading.RLock()
        self.groups: Dict[str, _Sequence] = {}
        self.aborting = False
        self.abort_gen = 0
        self.keep = DEFAULT_KEEP
        self.deferred_ddp: Dict[int, object] = {}  # id(ddp) -> its new group, for its next forward
        self.deferred_reap: list = []
        self.moves: List[Dict[str, float]] = []  # every in-flight move's figures
        self._t_abort = 0.0
        self._parked_at: Optional[float] = None

    # -- issuing -----------------------------------------------------------------------------

    def sequence(self, pg) -> _Sequence:
        """The sequence of ``pg`` (a group registered in torch's tables now; ``None``: the
        default group), by its name, which a switch keeps."""
        import torch.distributed as dist

        c10d = dist.distributed_c10d
        pg = pg if pg is not None else c10d._get_default_group()
        return self.named(c10d._get_process_group_name(pg), pg)

    def named(self, name: str, pg) -> _Sequence:
        with self.lock:
            s = self.groups.get(name)
            if s is None:
                s = self.groups[name] = _Sequence(name, pg, pg.size())
            return s

    def moved(self, names: Dict[str, object]) -> None:
        """A switch at a step boundary rebuilt these groups: their sequences go on there."""
        with self.lock:
            for name, new in names.items():
                s = self.groups.get(name)
                if s is not None:
                    s.pg, s.generation = new, s.generation + 1

    def all_reduce(self, s: _Sequence, tensor, op=None):
        """Issues an all-reduce of ``tensor`` (in place) as ``s``'s next collective; the
        future is its result (``tensor``)."""
        import torch

        fut = torch.futures.Future()
        with self.lock:
            e = _Entry(s.issued, tensor, op, fut)
            s.issued += 1
            s.entries[e.seq] = e
            if not self.aborting:
                self._launch(s, e, redo=False)
            elif self._parked_at is None:
                self._parked_at = time.perf_counter()
        return fut

    def _launch(self, s: _Sequence, e: _Entry, redo: bool) -> None:
        import torch.distributed as dist

        if e.launched and e.gen != s.generation and not e.settled and e.error is None:
            e.old_running = True
        e.gen, e.launched, e.error = s.generation, True, None
        t = e.kept.clone() if redo else e.tensor
        opts = dist.AllreduceOptions()
        opts.reduceOp = e.op if e.op is not None else dist.ReduceOp.SUM
        work = s.pg.allreduce([t], opts)
        gen = s.generation
        work.get_future().add_done_callback(lambda f: self._done(s, e, gen, t, f))

    def _done(self, s: _Sequence, e: _Entry, gen: int, t, f) -> None:
        try:
            f.value()
            err = None
        except Exception as ex:  # noqa: B902 - Gloo's errors are RuntimeErrors and friends
            err = ex
        settle = None
        with self.lock:
            if gen != e.gen:
                # A launch on a replaced group ended: a redo's result may wait for it.
                e.old_running = False
                if e.pending is not None and not e.settled:
                    settle = self._settle(s, e, e.pending)
            elif e.settled:
                return  # a redo of a collective completed here: its result is dropped
            elif err is None:
                if e.old_running:
                    e.pending = t  # the replaced launch may still write into e.tensor
                    return
                settle = self._settle(s, e, t)
            elif self.aborting:
                e.error = err  # waits for the redo on the rebuilt group, or the give-up
                if self._parked_at is None:
                    self._parked_at = time.perf_counter()
                return
            else:
                e.settled = True
                settle = (e.fut, None, err)
        if settle is not None:
            fut, value, error = settle
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(value)

    def _settle(self, s: _Sequence, e: _Entry, t):
        if t is not e.tensor:
            e.tensor.copy_(t)
        e.settled = True
        s.mark(e.seq, self.keep)
        return (e.fut, e.tensor, None)

    # -- the move ------------------------------------------------------------------------------

    def abort(self) -> List[Dict[str, object]]:
        with self.lock:
            self.aborting = True
            self.abort_gen += 1
            self._t_abort = time.perf_counter()
            self._parked_at = None
            return [s.position() for s in sorted(self.groups.values(), key=lambda s: s.name)]

    def redo(self, points: Dict[str, int], swapped: Dict[str, object]) -> int:
        """Under the lock: every sequence on its new group, every collective from its redo
        point issued again; callers go on. Returns how many were issued again."""
        n = 0
        for name, s in sorted(self.groups.items()):
            new = swapped.get(name)
            if new is None:
                raise InFlightError("group %s was not rebuilt" % name)
            s.pg, s.generation = new, s.generation + 1
            start = points.get(name, s.completed)
            missing = [q for q in range(start, s.issued) if q not in s.entries]
            if missing:
                raise InFlightError(
                    "group %s: collectives %s are needed again but their inputs are no longer "
                    "kept ($%s=%d)" % (name, missing[:4], ENV_KEEP, self.keep))
        self.aborting = False
        for name, s in sorted(self.groups.items()):
            for q in range(points.get(name, s.completed), s.issued):
                self._launch(s, s.entries[q], redo=True)
                n += 1
        return n

    def give_up(self, reason: str) -> int:
        """The move failed: every waiting collective fails its caller."""
        out = []
        with self.lock:
            if not self.aborting:
                return 0
            self.aborting = False
            for s in self.groups.values():
                for e in s.entries.values():
                    if not e.settled and (e.error is not None or not e.launched):
                        e.settled = True
                        out.append((e.fut, e.error or InFlightError(reason)))
        for fut, err in out:
            fut.set_exception(err)
        return len(out)


_seq = _Sequencer()


def in_flight_enabled(environ: Optional[Dict[str, str]] = None) -> bool:
    """Whether :func:`register_ddp` installs the comm hook (``$TASKD_GLOO_IN_FLIGHT`` not off)."""
    env = os.environ if environ is None else environ
    return env.get(ENV_IN_FLIGHT, "").strip().lower() not in ("0", "off", "false", "no")


def all_reduce(tensor, op=None, group=None) -> None:
    """``torch.distributed.all_reduce(tensor, op, group)`` through taskd's sequencer: an
    in-flight move finishes it on the rebuilt group instead of failing it. Blocks like the
    synchronous call; raises what the collective raised otherwise."""
    g = group.current() if isinstance(group, Group) else group
    _seq.all_reduce(_seq.sequence(g), tensor, op).wait()


class _HookState:
    """The DDP module's group, by the name a switch keeps."""

    def __init__(self, module):
        import torch.distributed as dist

        c10d = dist.distributed_c10d
        self.name = c10d._get_process_group_name(module.process_group)
        self.pg = module.process_group


def _ddp_comm_hook(state: _HookState, bucket):
    """DDP's default all-reduce hook (divide by the group's size, all-reduce), through the
    sequencer."""
    s = _seq.named(state.name, state.pg)
    t = bucket.buffer()
    t.div_(s.size)
    return _seq.all_reduce(s, t)


def _ddp_pre_forward(module, _args):
    """DDP's group is swapped between iterations (its reducer resets): at the forward after an
    in-flight move."""
    with _seq.lock:
        new = _seq.deferred_ddp.pop(id(module), None)
        reap = _seq.deferred_reap if not _seq.deferred_ddp else []
        if reap:
            _seq.deferred_reap = []
    if new is not None:
        _move_ddp(module, new)
    if reap:
        _reg.reaper.put(reap)


def _install_ddp_hooks(module) -> None:
    if not in_flight_enabled():
        return
    try:
        module.register_comm_hook(_HookState(module), _ddp_comm_hook)
    except (RuntimeError, AssertionError) as e:
        get_logger().warning(
            "taskd's Gloo switch: this DDP module has a comm hook already (%s); its buckets "
            "cannot be finished by an in-flight move", e)
        return
    module.register_forward_pre_hook(_ddp_pre_forward)


# ---- the sockets of the plane being left -----------------------------------------------------

_LISTEN = "0A"


def _proc_addr_hex(family: int, packed: bytes) -> str:
    """An address as /proc/net/tcp{,6} prints it (32-bit words in host order, as hex)."""
    import struct

    words = struct.unpack("<%dI" % (len(packed) // 4), packed)
    return "".join("%08X" % w for w in words)


def interface_addresses(ifname: str) -> set:
    """The addresses of ``ifname`` as /proc/net/tcp{,6} print them."""
    import fcntl
    import socket
    import struct

    out = set()
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            req = struct.pack("256s", ifname.encode()[:15])
            raw = fcntl.ioctl(s.fileno(), 0x8915, req)  # SIOCGIFADDR
            out.add(_proc_addr_hex(socket.AF_INET, raw[20:24]))
    except OSError:
        pass
    try:
        with open("/proc/net/if_inet6") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 6 and parts[5] == ifname:
                    out.add(_proc_addr_hex(socket.AF_INET6, bytes.fromhex(parts[0])))
    except OSError:
        pass
    return out


def _tcp_table() -> Dict[str, Tuple[str, str, str]]:
    """inode -> (local, remote, state) of every TCP socket of this network namespace."""
    out = {}
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as f:
                next(f, None)
                for line in f:
                    p = line.split()
                    if len(p) > 9:
                        out[p[9]] = (p[1], p[2], p[3])
        except OSError:
            pass
    return out


def shut_down_sockets(ifname: str, keep_port: Optional[int] = None) -> int:
    """Shuts down (``SHUT_RDWR``) every connected TCP socket of this process whose local
    address is one of ``ifname``'s: a Gloo call blocked on one of them fails at once. A socket
    to or from ``keep_port`` (the store's) is kept. Returns how many were shut down."""
    import socket

    addrs = interface_addresses(ifname)
    if not addrs:
        return 0
    table = _tcp_table()
    keep = None if keep_port is None else "%04X" % keep_port
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink("/proc/self/fd/" + fd)
        except OSError:
            continue
        if not link.startswith("socket:["):
            continue
        inode = link[len("socket:["):-1]
        entry = table.get(inode)
        if entry is None or entry[2] == _LISTEN:
            continue
        local, remote, _state = entry
        addr, _, port = local.partition(":")
        if addr not in addrs or keep in (port, remote.partition(":")[2]):
            continue
        try:
            dup = os.dup(int(fd))
        except OSError:
            continue
        try:
            if str(os.fstat(dup).st_ino) != inode:
                os.close(dup)
                continue
            s = socket.socket(fileno=dup)
        except OSError:
            os.close(dup)
            continue
        try:
            s.shutdown(socket.SHUT_RDWR)
            n += 1
        except OSError:
            pass
        finally:
            s.close()
    return n


# ---- the worker's requests -------------------------------------------------------------------


def _store_port() -> Optional[int]:
    raw = os.environ.get("MASTER_PORT", "").strip()
    return int(raw) if raw.isdigit() else None


def _current_interface() -> str:
    import torch.distributed as dist

    names = interfaces()
    sides = _reg.sides
    return names[bool(sides[dist.get_rank()])] if sides else names[False]


def abort_in_flight(ranks: Sequence[int], use_backup: Sequence[bool]) -> List[Dict[str, object]]:
    """Ends the collectives in flight on the plane this rank uses now and says where each of
    its sequences stands; from now on a failed collective waits for :func:`switch_in_flight`.
    A process that gets no switch within ``$TASKD_GLOO_ABORT_TIMEOUT_MS`` gives its waiting
    collectives up by itself."""
    import torch.distributed as dist

    if not dist.is_initialized():
        raise InFlightError("torch.distributed is not initialised in this process")
    t0 = time.perf_counter()
    _seq.keep = max(1, _env_int(ENV_KEEP, DEFAULT_KEEP))
    positions = _seq.abort()
    ifname = _current_interface()
    shut = shut_down_sockets(ifname, _store_port())
    gen = _seq.abort_gen
    timeout = _env_int(ENV_ABORT_TIMEOUT, DEFAULT_ABORT_TIMEOUT_MS) / 1000.0
    timer = threading.Timer(timeout, _abort_expired, args=(gen, timeout))
    timer.daemon = True
    timer.start()
    _seq.moves.append({"abort_ms": (time.perf_counter() - t0) * 1000, "sockets_shut": shut,
                       "t_abort": time.time()})
    get_logger().warning("taskd's Gloo switch: aborted the collectives in flight on %s (%d "
                         "sockets shut down); positions %s", ifname, shut, positions)
    return positions


def _abort_expired(gen: int, timeout: float) -> None:
    if _seq.abort_gen == gen and _seq.aborting:
        n = _seq.give_up("no in-flight switch came within %.0f s of the abort ($%s)" % (
            timeout, ENV_ABORT_TIMEOUT))
        get_logger().error("taskd's Gloo switch: no switch came after the abort; %d collectives "
                           "given up", n)


def switch_in_flight(ranks: Sequence[int], use_backup: Sequence[bool], timeout_ms: int,
                     redo: Dict[str, int]) -> Dict[str, float]:
    """Rebuilds every group with the move applied (off the training thread, which waits
    mid-step), then issues each sequence's collectives again from ``redo[group]``."""
    missing = MISSING_AT_IMPORT if MISSING_AT_IMPORT is not None else missing_internals()
    if missing:
        raise GlooSwitchError("this torch lacks what taskd's Gloo switch uses: %s" % ", ".join(missing))
    import torch.distributed as dist

    deadline = Deadline(timeout_ms)
    with _reg.lock:
        _reg.generation += 1
        sw = _Switch(dist, _reg.generation, deadline, in_flight=redo)
        sw.run(list(ranks), [bool(b) for b in use_backup])
    return sw.figures


def give_up_in_flight(reason: str) -> int:
    n = _seq.give_up(reason)
    if n:
        get_logger().error("taskd's Gloo switch: the in-flight move failed (%s); %d waiting "
                           "collectives fail their callers", reason, n)
    return n


def in_flight_request(request: Dict[str, object]) -> Dict[str, object]:
    """The worker's requests (``taskd_worker_set_in_flight``): ``abort``, ``switch``,
    ``give_up``; the answer as a dict."""
    op = request.get("op")
    if op == "abort":
        return {"collectives": abort_in_flight(request["ranks"], request["use_backup"])}
    if op == "switch":
        redo = {str(p["group"]): int(p["from"]) for p in request.get("redo", [])}
        return switch_in_flight(request["ranks"], request["use_backup"],
                                int(request.get("timeout_ms") or timeout_from_env()), redo)
    if op == "give_up":
        return {"given_up": give_up_in_flight(str(request.get("reason", "")))}
    raise InFlightError("unknown in-flight request %r" % (op,))


def moves() -> List[Dict[str, float]]:
    """Every in-flight move of this process: its abort, rebuild and redo figures."""
    return [dict(m) for m in _seq.moves]
