"""FAKE ``torch.optim.optimizer``: ``register_optimizer_step_post_hook`` and ``Optimizer``."""

_post_hooks = {}
_next_id = [0]


class _Handle:
    def __init__(self, key):
        self._key = key

    def remove(self):
        _post_hooks.pop(self._key, None)


def register_optimizer_step_post_hook(hook):
    _next_id[0] += 1
    _post_hooks[_next_id[0]] = hook
    return _Handle(_next_id[0])


class Optimizer:
    def __init__(self, params=(), defaults=None):
        self.steps = 0

    def step(self, *args, **kwargs):
        self.steps += 1
        for hook in list(_post_hooks.values()):
            hook(self, args, kwargs)


class SGD(Optimizer):
    pass
