"""The torchrun job (``e2e/torchrun_job.py``: real torch, real torchrun, a stand-in torch_npu),
where torch is importable; skipped with a message otherwise. The ``taskd`` command is
``$TASKD_CLI``, else the repository's ``target/debug/taskd``."""

import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
CLI = os.environ.get("TASKD_CLI") or os.path.join(REPO, "target", "debug", "taskd")
#: whether real torch is importable here (asked in a process of its own: the unit tests put a
#: fake torch on their own path)
NO_TORCH = subprocess.run([sys.executable, "-c", "import torch.distributed"], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, timeout=300).returncode != 0


@unittest.skipIf(NO_TORCH, "torch is not importable by %s: the torchrun job runs where it is "
                 "(python -m unittest test_torchrun with a Python that has torch)" % sys.executable)
class Torchrun(unittest.TestCase):
    def run_job(self, scenario):
        if not os.path.exists(CLI):
            self.skipTest("no taskd command at %s (cargo build --bin taskd, or set $TASKD_CLI)" % CLI)
        out = subprocess.run([sys.executable, os.path.join(HERE, "e2e", "torchrun_job.py"),
                              "--taskd", CLI, "--python", sys.executable, scenario],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=900)
        self.assertEqual(out.returncode, 0, out.stdout.decode()[-6000:])
        self.assertIn("torchrun job (%s): every check holds" % scenario, out.stdout.decode())

    def test_switches_under_torchrun(self):
        self.run_job("switch")

    def test_a_stopped_job_is_restarted_by_torchrun_and_runs_again(self):
        self.run_job("stop")

    def test_under_taskds_agent_a_killed_worker_is_restarted_by_it(self):
        self.run_job("agent")
