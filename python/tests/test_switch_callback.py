"""The switch function as the native worker calls it: lists in, the framework's answer out,
``False`` or an exception turned into this rank's reason."""

import ctypes
import logging
import sys
import unittest

import support  # noqa: F401 - the fakes on the path
import fake_framework
from taskd.python.framework import switch

LOG = logging.getLogger("taskd.test")


def call(cb, ranks, flags, err_len=256):
    r = (ctypes.c_uint32 * len(ranks))(*ranks)
    b = (ctypes.c_bool * len(flags))(*flags)
    err = ctypes.create_string_buffer(err_len)
    ok = cb(r, b, len(ranks), None, ctypes.addressof(err), err_len)
    return ok, err.value.decode()


class SwitchCallback(unittest.TestCase):
    def test_the_framework_gets_the_whole_list(self):
        seen = []
        cb = switch.callback("fw", lambda r, b: seen.append((r, b)) or True, LOG)
        self.assertEqual(call(cb, [6, 2, 3], [True, True, False]), (True, ""))
        self.assertEqual(seen, [([6, 2, 3], [True, True, False])])
        self.assertIsInstance(seen[0][1][0], bool)

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
        name, fn = switch.resolve("ms")
        self.assertEqual(name, "mindspore.communication.management._comm_switch_nic")
        self.assertTrue(fn([0, 1], [True, False]))
        self.assertEqual(fake_framework.calls[-1]["ranks"], [0, 1])
        name, fn = switch.resolve("pt")
        self.assertEqual(name, "torch_npu.npu._comm_switch_nic")
        saved = sys.modules.get("torch_npu")
        sys.modules["torch_npu"] = None
        try:
            # Without torch_npu, "pt" is taskd's own switch for Gloo process groups.
            self.assertEqual(switch.resolve("pt")[0], "taskd.python.framework.gloo.switch_nic")
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
