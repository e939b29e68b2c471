"""taskd's Gloo switch: the plan every rank computes (no torch needed), the dispatch of "pt"
without torch_npu, and real Gloo jobs on the loopback interface (skipped without a real torch:
give its interpreter in $TASKD_TORCH_PYTHON, e.g. the virtual environment of the rig)."""

import json
import os
import socket
import subprocess
import sys
import unittest

import support  # noqa: F401 - the fakes on the path
from taskd.python.framework import gloo, switch
from taskd.python.framework.frameworks.pytorch import FRAMEWORK as PYTORCH

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.dirname(HERE)
TORCH_PYTHON = os.environ.get("TASKD_TORCH_PYTHON", sys.executable)


def plan(sides, ranks, flags, local=2, route=False, routes=None):
    return gloo.plan(sides, routes or {}, ranks, flags, local, route)


class Plan(unittest.TestCase):
    def test_the_whole_job_moves_and_back(self):
        p = plan([False] * 4, [3, 2, 1, 0], [True] * 4)
        self.assertEqual((p.sides, p.route, p.noop), ([True] * 4, {}, False))
        back = plan(p.sides, [0, 1, 2, 3], [False] * 4)
        self.assertEqual(back.sides, [False] * 4)
        self.assertTrue(plan(back.sides, [0], [False]).noop)

    def test_a_subset_is_refused_without_the_route_command_saying_what_moves(self):
        with self.assertRaises(gloo.GlooSwitchError) as e:
            plan([False] * 4, [2, 3], [True, True])
        self.assertIn("moves the whole job at once unless $TASKD_GLOO_ROUTE_CMD", str(e.exception))
        self.assertIn("Switch all 4 ranks", str(e.exception))

    def test_a_node_moves_alone_with_the_route_command(self):
        p = plan([False] * 4, [3, 2], [True, True], route=True)
        self.assertEqual((p.sides, p.route), ([False, False, True, True], {0: False, 1: True}))
        self.assertFalse(p.noop)
        # The same state with the routes already set is nothing to do; routes not set are.
        self.assertTrue(plan(p.sides, [2], [True], route=True, routes={1: True}).noop)
        self.assertFalse(plan(p.sides, [2], [True], route=True).noop)

    def test_routes_change_only_while_the_job_is_split(self):
        # The whole job to backup: no route command (the backup plane reaches everyone).
        p = plan([False] * 4, [0, 1, 2, 3], [True] * 4, route=True)
        self.assertEqual(p.route, {})
        # Back to primary from a split: every node's route to the primary plane is its own.
        back = plan([False, False, True, True], [2, 3], [False, False], route=True, routes={1: True})
        self.assertEqual(back.route, {0: False, 1: False})
        self.assertFalse(back.noop)

    def test_a_part_of_a_node_is_refused(self):
        with self.assertRaises(gloo.GlooSwitchError) as e:
            plan([False] * 4, [2], [True], route=True)
        self.assertIn("ranks 2-3 share node 1's routes", str(e.exception))

    def test_bad_arguments_are_refused(self):
        with self.assertRaises(gloo.GlooSwitchError):
            plan([False] * 2, [2], [True])
        with self.assertRaises(gloo.GlooSwitchError):
            plan([False] * 2, [0, 1], [True])


class Configuration(unittest.TestCase):
    def test_interfaces_and_timeout_come_from_the_environment(self):
        env = {gloo.ENV_PRIMARY: "pri", gloo.ENV_BACKUP: "bak"}
        self.assertEqual(gloo.interfaces(env), {False: "pri", True: "bak"})
        with self.assertRaises(gloo.GlooSwitchError) as e:
            gloo.interfaces({gloo.ENV_PRIMARY: "pri"})
        self.assertIn(gloo.ENV_BACKUP, str(e.exception))
        self.assertEqual(gloo.timeout_from_env({}), gloo.DEFAULT_TIMEOUT_MS)
        self.assertEqual(gloo.timeout_from_env({gloo.ENV_TIMEOUT: "1500"}), 1500)
        for bad in ("soon", "0", "-3"):
            with self.assertRaises(gloo.GlooSwitchError):
                gloo.timeout_from_env({gloo.ENV_TIMEOUT: bad})

    def test_deadline_counts_down(self):
        now = [10.0]
        d = gloo.Deadline(2500, clock=lambda: now[0])
        self.assertAlmostEqual(d.left_s(), 2.5)
        now[0] = 20.0
        self.assertEqual(d.left_s(), 0.0)
        self.assertGreater(d.left().total_seconds(), 0)


class Votes(unittest.TestCase):
    def test_votes_are_typed_and_stored_as_text(self):
        for vote, text in ((gloo.Vote(gloo.VoteKind.OK), "ok"), (gloo.Vote(gloo.VoteKind.NOOP), "noop"),
                           (gloo.Vote(gloo.VoteKind.FAIL, "rank 1: no: such"), "fail: rank 1: no: such")):
            self.assertEqual(vote.encode(), text)
            self.assertEqual(gloo.Vote.decode(text), vote)
        self.assertEqual(gloo.Vote.decode("maybe").kind, gloo.VoteKind.FAIL, "an unreadable vote fails")


class TorchInternals(unittest.TestCase):
    def test_a_torch_without_what_the_switch_uses_is_refused_naming_it(self):
        self.assertIsNone(gloo.missing_internals(), "the fakes' torch has no torch.distributed")
        saved = gloo.MISSING_AT_IMPORT
        gloo.MISSING_AT_IMPORT = ["torch.nn.parallel.DistributedDataParallel._update_process_group"]
        try:
            with self.assertRaisesRegex(gloo.GlooSwitchError, "lacks .*_update_process_group"):
                gloo.switch_nic([0], [True], 1000)
        finally:
            gloo.MISSING_AT_IMPORT = saved


class Dispatch(unittest.TestCase):
    def test_pt_with_torch_npu_uses_it(self):
        # The fakes provide torch_npu.
        self.assertEqual(switch.resolve(PYTORCH).name, "torch_npu.npu._comm_switch_nic")

    def test_pt_without_torch_npu_uses_the_gloo_switch(self):
        code = ("import sys; sys.path.insert(0, %r); from taskd.python.framework import switch; "
                "from taskd.python.framework.frameworks import pytorch; "
                "print(switch.resolve(pytorch.FRAMEWORK).name)" % PACKAGE)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        out = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                             check=True, timeout=60)
        self.assertEqual(out.stdout.decode().strip(), gloo.NAME)


def _real_torch():
    code = "import torch.distributed as d; assert d.is_gloo_available()"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    try:
        return subprocess.run([TORCH_PYTHON, "-c", code], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(case, world, backup=lambda r: "lo", script="job.py"):
    """Runs tests/gloo/``script`` (``job.py``) as ``world`` ranks; their JSON lines, by rank."""
    port = str(_free_port())
    procs = []
    for r in range(world):
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.update(PYTHONPATH=PACKAGE, RANK=str(r), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE="1",
                   LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                   GLOO_SOCKET_IFNAME="lo", TASKD_GLOO_PRIMARY_IFNAME="lo",
                   TASKD_GLOO_BACKUP_IFNAME=backup(r))
        procs.append(subprocess.Popen([TORCH_PYTHON, os.path.join(HERE, "gloo", script), case],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=180)
        if p.returncode != 0:
            raise AssertionError("a rank exited %d:\n%s" % (p.returncode, stderr.decode()))
        out.append(json.loads(stdout.decode().strip().splitlines()[-1]))
    return out


@unittest.skipUnless(_real_torch(), "needs a real torch with Gloo: set TASKD_TORCH_PYTHON to its python")
class RealGloo(unittest.TestCase):
    def test_every_group_is_rebuilt_swapped_and_training_agrees(self):
        for world in (2, 4):
            ranks = run_job("whole", world)
            for r in ranks:
                self.assertEqual([a["ok"] for a in r["attempts"]], [True, True, True], r)
                self.assertEqual(r["replaced"], [True, True, True])
                self.assertTrue(r["ddp_is_world"] and r["agree_world"] and r["agree_own"], r)
                self.assertEqual(r["sides"], [False] * world)
                self.assertEqual(r["timings"]["rebuild_ms"], 0.0)  # the last one had nothing to do
                self.assertEqual(r["reaped"], 2)

    def test_this_torch_has_every_internal_the_switch_uses(self):
        code = "from taskd.python.framework import gloo; print(gloo.MISSING_AT_IMPORT)"
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["PYTHONPATH"] = PACKAGE
        out = subprocess.run([TORCH_PYTHON, "-c", code], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, check=True, timeout=120)
        self.assertEqual(out.stdout.decode().strip().splitlines()[-1], "[]")

    def test_a_moved_ddp_keeps_its_buckets_so_no_broadcast_outside_the_sequencer_follows(self):
        # DDP's own _update_process_group resets the reducer, whose rebuild then broadcasts the
        # bucket order at the second forward after: an in-flight move coming then cut it and
        # the rank's forward raised (the rig's link-dies at 2 x 2: a second move 1.4 s later).
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.update(PYTHONPATH=PACKAGE, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
                   GLOO_SOCKET_IFNAME="lo")
        out = subprocess.run([TORCH_PYTHON, os.path.join(HERE, "gloo", "ddp_move.py")], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=180)
        self.assertEqual(out.returncode, 0, out.stderr.decode())
        r = json.loads(out.stdout.decode().strip().splitlines()[-1])
        self.assertEqual(r, {"rebuilt_before": True, "rebuilt_after_taskds_move": True,
                             "rebuilds_after_taskds_move": False,
                             "rebuilds_after_ddps_own_update": True})

    def test_one_rank_failing_fails_every_rank_at_once_and_nothing_moves(self):
        ranks = run_job("one-fails", 2, backup=lambda r: "lo" if r == 0 else "taskdnosuch0")
        for r in ranks:
            a = r["attempts"][0]
            self.assertFalse(a["ok"])
            self.assertEqual(a["why"], "rank 1: interface taskdnosuch0 does not exist in this network namespace")
            self.assertEqual(r["replaced"], [False, False, False])
            self.assertTrue(r["agree_world"])

    def test_a_subset_is_refused_on_every_rank_before_anything_moves(self):
        for r in run_job("subset", 2):
            self.assertFalse(r["attempts"][0]["ok"])
            self.assertIn("moves the whole job at once", r["attempts"][0]["why"])
            self.assertEqual(r["replaced"], [False, False, False])


def run_in_flight(case, world):
    """Runs tests/gloo/in_flight_job.py as ``world`` ranks; their JSON lines, by rank."""
    return run_job(case, world, script="in_flight_job.py")


@unittest.skipUnless(_real_torch(), "needs a real torch with Gloo: set TASKD_TORCH_PYTHON to its python")
class RealGlooInFlight(unittest.TestCase):
    def test_a_collective_stuck_mid_step_is_aborted_redone_and_the_step_finished_exactly(self):
        for world in (2, 3):
            ranks = run_in_flight("move", world)
            redo = {json.dumps(r["redo"]) for r in ranks}
            self.assertEqual(len(redo), 1, ranks)
            for r in ranks:
                self.assertIsNone(r["error"], r)
                self.assertTrue(r["ranks_agree"], r)
                self.assertLessEqual(r["replay_max_diff"], 1e-6, r)
                self.assertEqual(r["sides"], [True] * world)
                self.assertEqual(len(r["moves"]), 1)
            # The ranks blocked in the all-reduce issued it again; the late one, not yet.
            self.assertEqual(sorted(r["moves"][0]["redone"] for r in ranks), [0] + [1] * (world - 1))
            late = ranks[-1]
            self.assertLess(late["backward_ms"], 500, late)

    def test_a_move_given_up_raises_the_collectives_error_in_the_training_thread(self):
        for r in run_in_flight("give_up", 2):
            self.assertIn("Connection closed", r["error"] or "", r)

    def test_the_steady_state_goes_through_the_hook_unchanged(self):
        for r in run_in_flight("none", 2):
            self.assertIsNone(r["error"], r)
            self.assertLessEqual(r["replay_max_diff"], 1e-6, r)
            self.assertEqual(r["moves"], [])


class InFlightPieces(unittest.TestCase):
    def test_addresses_are_written_as_proc_net_tcp_writes_them(self):
        import socket as s

        self.assertEqual(gloo._proc_addr_hex(s.AF_INET, s.inet_aton("127.0.0.1")), "0100007F")
        self.assertEqual(gloo._proc_addr_hex(s.AF_INET, s.inet_aton("10.251.1.3")), "0301FB0A")
        v6 = s.inet_pton(s.AF_INET6, "::1")
        self.assertEqual(gloo._proc_addr_hex(s.AF_INET6, v6), "0" * 24 + "01000000")

    def test_loopback_has_its_address_and_a_missing_interface_none(self):
        self.assertIn("0100007F", gloo.interface_addresses("lo"))
        self.assertEqual(gloo.interface_addresses("taskdnosuch0"), set())
        self.assertEqual(gloo.shut_down_sockets("taskdnosuch0"), 0)

    def test_the_switch_off_and_an_unknown_request(self):
        self.assertTrue(gloo.in_flight_enabled({}))
        self.assertFalse(gloo.in_flight_enabled({gloo.ENV_IN_FLIGHT: "off"}))
        with self.assertRaises(gloo.InFlightError):
            gloo.in_flight_request({"op": "rewind"})

    def test_a_connected_socket_on_the_interface_is_shut_down_and_the_stores_is_kept(self):
        import socket as s

        srv = s.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen(4)
        kept = s.create_connection(srv.getsockname())
        store_port = srv.getsockname()[1]
        other = s.socket()
        other.bind(("127.0.0.1", 0))
        other.listen(1)
        gone = s.create_connection(other.getsockname())
        try:
            n = gloo.shut_down_sockets("lo", keep_port=store_port)
            self.assertGreaterEqual(n, 1)
            self.assertEqual(gone.recv(1), b"")  # shut down: EOF at once
            kept.settimeout(0.05)
            with self.assertRaises(s.timeout):
                kept.recv(1)  # the store's connection still waits for data
        finally:
            for x in (srv, kept, other, gone):
                x.close()


if __name__ == "__main__":
    unittest.main()
