"""The switch function as the native worker calls it: lists in, the framework's answer out,
``False`` or an exception turned into this rank's reason; the streams synchronised first where
the framework needs it; the deadline to functions that take one."""

import ctypes
import logging
import sys
import unittest

import support  # noqa: F401 - the fakes on the path
import fake_framework
from taskd.python.framework import switch

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
        name, fn, sync = switch.resolve("ms")
        self.assertEqual(name, "mindspore.communication.management._comm_switch_nic")
        import mindspore.runtime

        self.assertIs(sync, mindspore.runtime.synchronize, "MindSpore's stream sync first")
        sync()
        self.assertTrue(fn([0, 1], [True, False]))
        self.assertEqual(fake_framework.calls[-1]["ranks"], [0, 1])
        self.assertTrue(fake_framework.calls[-1]["synced"])
        self.assertTrue(switch.moves_hccl(name), "MindSpore's switch moves HCCL communicators")
        name, fn, sync = switch.resolve("pt")
        self.assertEqual((name, sync), ("torch_npu.npu._comm_switch_nic", None),
                         "torch_npu's function synchronises itself")
        saved = sys.modules.get("torch_npu")
        sys.modules["torch_npu"] = None
        try:
            # Without torch_npu, "pt" is taskd's own switch for Gloo process groups.
            gloo_name = switch.resolve("pt")[0]
            self.assertEqual(gloo_name, "taskd.python.framework.gloo.switch_nic")
            self.assertFalse(switch.moves_hccl(gloo_name), "Gloo needs nothing of HCCL's")
        finally:
            sys.modules["torch_npu"] = saved
        import mindspore.communication.management as m

        real = m._comm_switch_nic
        del m._comm_switch_nic
        try:
            with self.assertRaisesRegex(switch.FrameworkError, "_comm_switch_nic does not exist"):
                switch.resolve("ms")
        finally:
            m._comm_switch_nic = real
