"""The rig's training problem, shared by the training processes and the serial replay: a small
MLP, deterministic data per (step, rank), plain SGD. With DDP averaging the gradients, step
``s`` of the job equals one SGD step on the mean of every rank's gradient, which
:func:`replay` computes in one process."""

from __future__ import annotations

from typing import List

WIDTH = 192
BATCH = 16
LR = 0.02
SEED = 7


def make_model():
    import torch

    torch.manual_seed(SEED)
    return torch.nn.Sequential(
        torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh(),
        torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh(),
        torch.nn.Linear(WIDTH, 1),
    )


def batch(step: int, rank: int):
    import torch

    g = torch.Generator().manual_seed(100003 * step + rank)
    x = torch.randn(BATCH, WIDTH, generator=g)
    y = torch.randn(BATCH, 1, generator=g)
    return x, y


def loss_of(model, step: int, rank: int):
    x, y = batch(step, rank)
    return (model(x) - y).pow(2).mean()


def replay(steps: int, world: int) -> List:
    """The parameters after ``steps`` steps of a ``world``-rank job, computed serially."""
    import torch

    model = make_model()
    params = list(model.parameters())
    for step in range(1, steps + 1):
        grads = [torch.zeros_like(p) for p in params]
        for rank in range(world):
            model.zero_grad()
            loss_of(model, step, rank).backward()
            for acc, p in zip(grads, params):
                acc += p.grad
        with torch.no_grad():
            for p, acc in zip(params, grads):
                p -= LR * acc / world
    return [p.detach().clone() for p in params]
