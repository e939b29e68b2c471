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

    def test_every_model_train_call_holds_at_the_gate_after_each_step(self):
        from mindspore.train import Callback, Model

        original = Model.train
        self.start()
        steps = support.record_gate(self)
        order = []

        class Mine(Callback):
            def step_end(self, run_context):
                # How many steps the gate had seen when the user's callback ran.
                order.append(("mine", run_context.original_args().cur_step_num, len(steps)))

        Model(lambda _: order.append("compute")).train(2, range(3), callbacks=[Mine()])
        self.assertEqual(steps, [1, 2, 3, 4, 5, 6])
        self.assertEqual(
            order[:4], ["compute", ("mine", 1, 0), "compute", ("mine", 2, 1)],
            "the user's callbacks first, then the gate",
        )
        Model(lambda _: None).train(1, range(2))  # no callbacks
        Model(lambda _: None).train(1, range(1), Mine())  # one callback, positional
        self.assertEqual(steps, [1, 2, 3, 4, 5, 6, 1, 2, 1])
        gate_cls = Model.train.taskd_step_callback
        Model(lambda _: None).train(1, range(2), callbacks=[gate_cls()])
        self.assertEqual(steps[-2:], [1, 2], "a list already holding the gate is left alone")
        self.assertEqual(len(steps), 11)
        self.assertTrue(api.destroy_taskd_worker())
        self.assertIs(Model.train, original, "destroy puts Model.train back")

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
        self.assertEqual(taskd_worker_api._state.config, (3, 5000, "pt", 1))
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
