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
``create_device``; ``DistributedDataParallel._update_process_group``. :data:`TORCH_INTERNALS`
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
)) + (("torch.nn.parallel", "DistributedDataParallel._update_process_group"),)


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

    def __init__(self, dist, gen: int, deadline: Deadline):
        self.dist = dist
        self.gen = gen
        self.deadline = deadline
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
        if all(v.kind is VoteKind.NOOP for v in votes.values()):
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
        self._swap(built)
        _reg.sides = p.sides
        self._record(rebuild_ms=(t2 - t1) * 1000, swap_ms=(time.perf_counter() - t2) * 1000,
                     total_ms=(time.perf_counter() - t0) * 1000)
        return True

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
                m._update_process_group(new)
        for g in _reg.groups:
            new = built.get(id(g.current()))
            if new is not None:
                g._pg = new
        _reg.reaper.put(old)


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
