"""The step gate inside each framework: MindSpore's ``Model.train`` gets a step-end callback,
PyTorch's optimizer steps are counted by a global hook until the loop calls the gate itself."""

import os

import support
import fake_framework
import taskd.api as api
from taskd.api import taskd_worker_api


class MindSpore(support.TaskdTestCase):
    def start(self):
        os.environ["MS_NODE_RANK"] = "0"
        self.assertTrue(api.init_taskd_worker(0, 5000, "ms"))
        self.assertTrue(api.start_taskd_worker())

    def test_every_train_and_fit_call_holds_at_the_gate_with_one_count_per_process(self):
        from mindspore import train as ms_train
        from mindspore.train import Callback, Model

        original = (Model.train, Model.fit)
        ms_train.warnings.clear()
        self.start()
        steps = support.record_gate(self)
        order = []

        class Mine(Callback):
            def on_train_step_end(self, run_context):
                # How many steps the gate had seen when the user's callback ran.
                order.append(("mine", run_context.original_args().cur_step_num, len(steps)))

        Model(lambda _: order.append("compute")).train(2, range(3), callbacks=[Mine()])
        self.assertEqual(steps, [1, 2, 3, 4, 5, 6])
        self.assertEqual(
            order[:4], ["compute", ("mine", 1, 0), "compute", ("mine", 2, 1)],
            "the user's callbacks first, then the gate",
        )
        model = Model(lambda _: None)
        for _ in range(2):  # a per-epoch loop: cur_step_num starts again at every call
            model.train(1, range(2))
        model.train(1, range(1), Mine())  # one callback, positional
        self.assertEqual(steps, list(range(1, 12)), "one count across every call")
        model.fit(1, range(2), None, 1, [Mine()])  # positional callbacks
        model.fit(1, range(1), callbacks=Mine())
        self.assertEqual(steps, list(range(1, 15)), "fit is gated too")
        gate_cls = Model.train.taskd_step_callback
        model.train(1, range(2), callbacks=[gate_cls()])
        self.assertEqual(steps[-2:], [15, 16], "a list already holding the gate is left alone")
        self.assertEqual(ms_train.warnings, [], "MindSpore warns about no callback of taskd's")
        self.assertTrue(api.destroy_taskd_worker())
        self.assertEqual((Model.train, Model.fit), original, "destroy puts both methods back")

    def test_sink_mode_gates_once_per_sink_with_the_same_count(self):
        from mindspore.train import Callback, Model

        self.start()
        steps = support.record_gate(self)
        seen = []

        class CurStep(Callback):
            def on_train_step_end(self, run_context):
                seen.append(run_context.original_args().cur_step_num)

        Model(lambda _: None).train(2, range(8), callbacks=[CurStep()], dataset_sink_mode=True,
                                    sink_size=4)
        self.assertEqual(seen, [4, 8, 12, 16], "MindSpore's step rises by sink_size")
        self.assertEqual(steps, [1, 2, 3, 4], "the gate's by one per sink boundary")

    def test_the_callback_can_be_turned_off(self):
        from mindspore.train import Model

        os.environ["TASKD_MS_STEP_CALLBACK"] = "off"
        original = Model.train
        self.start()
        self.assertIs(Model.train, original)
        steps = support.record_gate(self)
        Model(lambda _: None).train(1, range(3))
        self.assertEqual(steps, [])
        for s in (1, 2):
            self.assertTrue(api.step_completed(s))
        self.assertEqual(steps, [1, 2])

    def test_the_first_training_call_waits_for_the_whole_job_within_its_bound(self):
        from mindspore.train import Model

        os.environ["TASKD_START_WAIT_MS"] = "50"
        self.start()
        steps = support.record_gate(self)
        with self.assertLogs("taskd", "INFO") as logs:
            Model(lambda _: None).train(1, range(2))
        text = "\n".join(logs.output)
        self.assertIn("waiting up to 50 ms for every rank of the job to register", text)
        self.assertIn("every rank of the job to register; training starts without it", text)
        self.assertEqual(steps, [1, 2], "training ran after the bound")
        with self.assertNoLogs("taskd", "INFO"):
            Model(lambda _: None).fit(1, range(2))
        self.assertEqual(steps, [1, 2, 3, 4], "only the process's first call waits")

    def test_a_bad_start_wait_is_refused_at_init(self):
        os.environ["MS_NODE_RANK"] = "0"
        for bad in ("-1", "soon"):
            os.environ["TASKD_START_WAIT_MS"] = bad
            with self.assertLogs("taskd", "ERROR") as logs:
                self.assertFalse(api.init_taskd_worker(0, 5000, "ms"))
            self.assertIn("$TASKD_START_WAIT_MS=%r is not a number" % bad, "\n".join(logs.output))

    def test_start_fails_without_the_frameworks_switch_function(self):
        import mindspore.communication.management as m

        real = m._comm_switch_nic
        del m._comm_switch_nic
        try:
            os.environ["MS_NODE_RANK"] = "0"
            self.assertTrue(api.init_taskd_worker(0, 5000, "ms"))
            with self.assertLogs("taskd", "ERROR") as logs:
                self.assertFalse(api.start_taskd_worker())
            self.assertIn("_comm_switch_nic does not exist", "\n".join(logs.output))
        finally:
            m._comm_switch_nic = real


class PyTorch(support.TaskdTestCase):
    def start(self):
        os.environ.update(RANK="3", LOCAL_WORLD_SIZE="2")
        self.assertTrue(api.init_taskd_worker(3))  # "pt" is the default
        config = taskd_worker_api._state.config
        self.assertEqual((config.rank, config.quota_mb, config.framework.code, config.node_rank),
                         (3, 5000, "pt", 1))
        self.assertTrue(api.start_taskd_worker())

    def test_optimizer_steps_are_gated_until_the_loop_calls_the_gate(self):
        import torch

        self.start()
        steps = support.record_gate(self)
        opt = torch.optim.SGD()
        for _ in range(3):
            with fake_framework.training_step():
                pass
            opt.step()
        self.assertEqual(steps, [1, 2, 3])
        self.assertTrue(api.step_completed(4))
        opt.step()
        self.assertTrue(api.step_completed(5))
        self.assertEqual(steps, [1, 2, 3, 4, 5], "the explicit calls turned the hook off")
        self.assertTrue(api.destroy_taskd_worker())
        opt.step()
        self.assertFalse(api.step_completed(6), "no worker: nothing gated")

    def test_the_hook_can_be_turned_off(self):
        import torch

        os.environ["TASKD_PT_OPTIMIZER_HOOK"] = "off"
        self.start()
        steps = support.record_gate(self)
        torch.optim.SGD().step()
        self.assertEqual(steps, [])


class TrainingStops(support.TaskdTestCase):
    """The library's gate answers TASKD_STOP_TRAINING (a fake native gate here; the real stop
    runs in the end-to-end jobs): whatever calls the gate raises taskd.TrainingStopped."""

    def stop_after(self, steps):
        """Replaces the running worker's native gate by one that stops after ``steps``."""
        seen = []

        def native(handle, step):
            self.assertEqual(handle, "the handle")
            seen.append(step)
            return taskd_worker_api.TASKD_STOP_TRAINING if len(seen) > steps else 0

        taskd_worker_api._state.stop_logged = False
        reason = lambda: "rank 1's switch failed and could not be undone"  # noqa: E731
        taskd_worker_api._state.gate = taskd_worker_api.checked_gate(native, "the handle", reason)
        return seen

    def test_the_exception_is_one_class_exported_twice(self):
        import taskd

        self.assertIs(api.TrainingStopped, taskd.TrainingStopped)
        self.assertTrue(issubclass(taskd.TrainingStopped, RuntimeError))
        self.assertIn("TrainingStopped", api.__all__)

    def test_model_train_raises_it_with_the_reason_logged_once(self):
        from mindspore.train import Model

        os.environ["MS_NODE_RANK"] = "0"
        self.assertTrue(api.init_taskd_worker(0, 5000, "ms"))
        self.assertTrue(api.start_taskd_worker())
        seen = self.stop_after(3)
        with self.assertLogs("taskd", "ERROR") as logs:
            with self.assertRaisesRegex(api.TrainingStopped, "could not be undone"):
                Model(lambda _: None).train(10, range(5))
            with self.assertRaises(api.TrainingStopped):
                api.step_completed(99)
        self.assertEqual(seen, [1, 2, 3, 4, 99])
        self.assertEqual(len(logs.output), 1, logs.output)
        self.assertIn("training stopped at step 4: rank 1's switch failed", logs.output[0])

    def test_the_optimizer_hook_and_the_loops_call_raise_it(self):
        import torch

        os.environ.update(RANK="0", LOCAL_WORLD_SIZE="1")
        self.assertTrue(api.init_taskd_worker(0))
        self.assertTrue(api.start_taskd_worker())
        self.stop_after(1)
        opt = torch.optim.SGD()
        opt.step()
        with self.assertLogs("taskd", "ERROR"):
            with self.assertRaises(api.TrainingStopped):
                opt.step()
        with self.assertRaises(api.TrainingStopped):
            api.step_completed(3)
