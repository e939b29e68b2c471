"""The switch function as the native worker calls it: lists in, the framework's answer out,
``False`` or an exception turned into this rank's reason; the streams synchronised first where
the framework needs it; the deadline to functions that take one."""

import ctypes
import logging
import sys
import unittest

import support  # noqa: F401 - the fakes on the path
import fake_framework
from taskd.python.framework import frameworks, spec, switch

LOG = logging.getLogger("taskd.test")


def call(cb, ranks, flags, err_len=256, timeout_ms=5000):
    r = (ctypes.c_uint32 * len(ranks))(*ranks)
    b = (ctypes.c_bool * len(flags))(*flags)
    err = ctypes.create_string_buffer(err_len)
    ok = cb(r, b, len(ranks), timeout_ms, None, ctypes.addressof(err), err_len)
    return ok, err.value.decode()


class SwitchCallback(unittest.TestCase):
    def test_the_framework_gets_the_whole_list(self):
        seen = []
        cb = switch.callback("fw", lambda r, b: seen.append((r, b)) or True, LOG)
        self.assertEqual(call(cb, [6, 2, 3], [True, True, False]), (True, ""))
        self.assertEqual(seen, [([6, 2, 3], [True, True, False])])
        self.assertIsInstance(seen[0][1][0], bool)

    def test_a_function_taking_a_third_argument_gets_the_deadline(self):
        seen = []

        def collective(ranks, flags, timeout_ms):
            seen.append(timeout_ms)
            return True

        def flexible(*args):
            seen.append(args[2])
            return True

        self.assertEqual(call(switch.callback("g", collective, LOG), [0], [True], timeout_ms=1234),
                         (True, ""))
        self.assertEqual(call(switch.callback("g", flexible, LOG), [0], [True], timeout_ms=99),
                         (True, ""))
        self.assertEqual(seen, [1234, 99])
        self.assertFalse(switch.takes_deadline(lambda ranks, use_backup: True))
        self.assertFalse(switch.takes_deadline(len), "a builtin without a signature: two arguments")

    def test_the_sync_runs_first_and_its_failure_is_the_ranks(self):
        order = []
        cb = switch.callback("fw", lambda r, b: order.append("switch") or True, LOG,
                             sync=lambda: order.append("sync"))
        self.assertEqual(call(cb, [1], [True]), (True, ""))
        self.assertEqual(order, ["sync", "switch"])

        def no_device():
            raise RuntimeError("device lost")

        ok, err = call(switch.callback("fw", lambda r, b: True, LOG, sync=no_device), [1], [True])
        self.assertEqual((ok, err), (False, "fw([1], [True]) raised RuntimeError: device lost"))

    def test_false_and_exceptions_are_the_ranks_failure_with_their_text(self):
        cb = switch.callback("fw", lambda r, b: False, LOG)
        ok, err = call(cb, [1], [True])
        self.assertFalse(ok)
        self.assertEqual(err, "fw([1], [True]) returned False")

        def raises(r, b):
            raise ValueError("rank 9 >= group size 8")

        ok, err = call(switch.callback("fw", raises, LOG), [9], [False])
        self.assertFalse(ok)
        self.assertEqual(err, "fw([9], [False]) raised ValueError: rank 9 >= group size 8")
        ok, err = call(switch.callback("fw", raises, LOG), [9], [False], err_len=8)
        self.assertEqual(err, "fw([9],")

    def test_each_frameworks_function_is_found_or_named_missing(self):
        ms, pt = frameworks.by_code("ms"), frameworks.by_code("pt")
        chosen = switch.resolve(ms)
        self.assertEqual(chosen.name, "mindspore.communication.management._comm_switch_nic")
        import mindspore.runtime

        self.assertIs(chosen.sync, mindspore.runtime.synchronize, "MindSpore's stream sync first")
        chosen.sync()
        self.assertTrue(chosen.function([0, 1], [True, False]))
        self.assertEqual(fake_framework.calls[-1]["ranks"], [0, 1])
        self.assertTrue(fake_framework.calls[-1]["synced"])
        self.assertTrue(chosen.moves_hccl, "MindSpore's switch moves HCCL communicators")
        self.assertEqual(chosen.backend, "hccl")
        chosen = switch.resolve(pt)
        self.assertEqual((chosen.name, chosen.sync), ("torch_npu.npu._comm_switch_nic", None),
                         "torch_npu's function synchronises itself")
        self.assertTrue(chosen.moves_hccl)
        saved = sys.modules.get("torch_npu")
        sys.modules["torch_npu"] = None
        try:
            # Without torch_npu, "pt" is taskd's own switch for Gloo process groups.
            chosen = switch.resolve(pt)
            self.assertEqual(chosen.name, "taskd.python.framework.gloo.switch_nic")
            self.assertFalse(chosen.moves_hccl, "Gloo needs nothing of HCCL's")
            self.assertEqual(chosen.backend, "gloo", "the worker's backend for it")
        finally:
            sys.modules["torch_npu"] = saved
        import mindspore.communication.management as m

        real = m._comm_switch_nic
        del m._comm_switch_nic
        try:
            with self.assertRaisesRegex(switch.FrameworkError, "_comm_switch_nic does not exist"):
                switch.resolve(ms)
        finally:
            m._comm_switch_nic = real


class Registry(unittest.TestCase):
    """One entry per framework: every spelling names it, a new one is one line."""

    def test_every_spelling_names_one_framework_and_unknown_ones_are_listed(self):
        self.assertEqual(frameworks.codes(), ("pt", "ms"))
        self.assertEqual(frameworks.names(), ("PyTorch", "MindSpore"))
        for f in frameworks.REGISTRY:
            for spelling in f.spellings():
                self.assertIs(frameworks.lookup(spelling), f)
            self.assertIs(frameworks.by_code(f.code), f)
            self.assertIs(frameworks.by_name(f.name), f)
        with self.assertRaisesRegex(ValueError, "framework must be 'pt' or 'ms', got 'tf'"):
            frameworks.by_code("tf")
        with self.assertRaisesRegex(ValueError, "Framework must be PyTorch or MindSpore, got 'ms'"):
            frameworks.by_name("ms")

    def test_each_framework_has_its_node_rank_rule(self):
        ms, pt = frameworks.by_code("ms"), frameworks.by_code("pt")
        self.assertEqual(ms.node_rank({"MS_NODE_RANK": "2"}), 2)
        with self.assertRaisesRegex(ValueError, "MS_NODE_RANK is not set"):
            ms.node_rank({"RANK": "3"})
        self.assertEqual(pt.node_rank({"RANK": "5", "LOCAL_WORLD_SIZE": "2"}), 2)
        self.assertEqual(pt.node_rank({"GROUP_RANK": "4"}), 4)
        with self.assertRaisesRegex(ValueError, r"\$LOCAL_WORLD_SIZE is not set"):
            pt.node_rank({"RANK": "5"})

    def test_each_switch_function_names_the_backend_it_moves(self):
        for f in frameworks.REGISTRY:
            for entry in f.switches:
                self.assertIn(entry.backend, spec.BACKENDS, entry.name)
        gloo = spec.Location("taskd.python.framework.gloo", "switch_nic")
        self.assertEqual(spec.SwitchFunction(gloo).backend, "hccl", "the default")
        self.assertEqual(spec.SwitchFunction(gloo, backend="gloo").backend, "gloo")
        # The deprecated boolean still reads, as the backend it stands for.
        self.assertEqual(spec.SwitchFunction(gloo, moves_hccl=False).backend, "gloo")
        self.assertEqual(spec.SwitchFunction(gloo, moves_hccl=True).backend, "hccl")
        with self.assertRaisesRegex(ValueError, "backend 'nccl' is none of hccl, gloo"):
            spec.SwitchFunction(gloo, backend="nccl")
        with self.assertRaisesRegex(ValueError, "contradicts"):
            spec.SwitchFunction(gloo, backend="gloo", moves_hccl=True)
