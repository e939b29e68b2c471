"""The rig's arithmetic, without root or torch: addresses, byte accounting per phase, stall,
what counts as a succeeded operation, rebuild times, the probe's byte budget, the command
line. (The rig itself runs as ``python3 -m taskd_netrig``: see docs/rig.md.)"""

import os
import sys
import unittest

import support  # noqa: F401 - the package on the path

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NETRIG = os.path.join(PYTHON_DIR, "netrig")  # the rig is not in the taskd package
if NETRIG not in sys.path:
    sys.path.insert(0, NETRIG)

from taskd_netrig import __main__ as cli  # noqa: E402
from taskd_netrig import net, rig, scenarios  # noqa: E402

sys.path.insert(0, os.path.join(PYTHON_DIR, "build_backend"))
import taskd_build  # noqa: E402


def sample(t, pri, bak, node=0):
    return (t, {"n%d/pri" % node: {"rx": pri, "tx": pri}, "n%d/bak" % node: {"rx": bak, "tx": bak}})


class Accounting(unittest.TestCase):
    def test_addresses_are_per_plane_and_node(self):
        self.assertEqual(net.addr("mg", 0), "10.251.0.1")
        self.assertEqual(net.addr("bak", 2), "10.251.2.3")
        self.assertEqual(net.ns(3), "tdrig-n3")
        self.assertTrue(net.SWITCH.startswith(net.PREFIX))

    def test_bytes_between_take_the_samples_around_the_window(self):
        samples = [sample(0.0, 0, 0), sample(1.0, 100, 0), sample(2.0, 100, 50), sample(3.0, 400, 50)]
        b = rig.bytes_between(samples, 1.5, 2.5)
        self.assertEqual(b, {"n0/pri": 600, "n0/bak": 100})  # from the 1.0 sample to the 3.0 one
        self.assertEqual(rig.plane_bytes(b, [0], "bak"), 100)
        self.assertEqual(rig.plane_bytes(b, [1], "bak"), 0)

    def test_bytes_within_count_only_what_moved_inside_the_window(self):
        samples = [sample(0.0, 0, 0), sample(1.0, 100, 0), sample(2.0, 100, 50), sample(3.0, 400, 50)]
        self.assertEqual(rig.bytes_within(samples, 0.5, 2.5), {"n0/pri": 0, "n0/bak": 100})
        self.assertEqual(rig.bytes_within(samples, 1.5, 2.5), {"n0/pri": 0, "n0/bak": 0})

    def test_stall_is_the_longest_step_around_the_operation_past_the_median(self):
        series = [{"t": float(t), "ms": 10.0} for t in range(10)] + [{"t": 10.0, "ms": 160.0}]
        self.assertEqual(rig.stall_ms(series, 9.5, 9.9), 150.0)
        self.assertEqual(rig.stall_ms(series, 20.0, 21.0), 0.0)
        self.assertEqual(rig.stall_ms([], 0.0, 1.0), 0.0)


class Reports(unittest.TestCase):
    def test_an_operation_holds_when_its_result_event_says_succeeded(self):
        ok = {"event": "result", "result": {"result": "succeeded"}, "exit_status": 0}
        self.assertTrue(scenarios.op_ok(ok))
        self.assertFalse(scenarios.op_ok(dict(ok, exit_status=1)))
        self.assertFalse(scenarios.op_ok({"result": {"result": "failed"}, "exit_status": 1}))

    def test_rebuild_times_are_the_slowest_ranks_per_switch(self):
        results = [{"switches": [{"rebuild_ms": 2.0}, {"rebuild_ms": 0.0}]},
                   {"switches": [{"rebuild_ms": 3.5}, {"rebuild_ms": 1.0}]}]
        self.assertEqual(scenarios._rebuilds(results), [3.5, 1.0])
        self.assertEqual(scenarios._rebuilds([]), [])

    def test_the_probe_budget_counts_rounds_peers_and_both_directions(self):
        class Job:
            auto = {"link_probe_ms": 500}

        class Sc:
            pass

        sc = Sc()
        sc.rig = rig.Rig(3, 2, "taskd", "python3", 20.0, "/tmp", "linux", None)
        sc.job = Job()
        per_round = 2 * rig.PROBE_COUNT * 4 * (rig.PROBE_SIZE + 42)
        self.assertEqual(scenarios.probe_budget(sc, 1.0), (2 + 2) * per_round)
        sc.job.auto = None
        self.assertEqual(scenarios.probe_budget(sc, 10.0), 2 * per_round)
        sc.rig.hal = "sim"
        self.assertEqual(scenarios.probe_budget(sc, 10.0), 0)


class NotInTheProduct(unittest.TestCase):
    def test_the_wheel_carries_the_taskd_package_and_no_rig(self):
        names = [arc for _, arc in taskd_build._package_files()]
        self.assertIn("taskd/api/taskd_agent_api.py", names)
        self.assertTrue(all(n.startswith("taskd/") for n in names), names)
        self.assertFalse([n for n in names if "rig" in n.split("/")[-2]], names)


class CommandLine(unittest.TestCase):
    def test_defaults_and_choices(self):
        a = cli.parse(["--nodes", "3", "--scenario", "degraded", "--report", "r.json"])
        self.assertEqual((a.nodes, a.ranks_per_node, a.scenario, a.hal), (3, 2, "degraded", "linux"))
        with self.assertRaises(SystemExit):
            cli.parse(["--scenario", "everything"])


if __name__ == "__main__":
    unittest.main()
