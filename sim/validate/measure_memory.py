"""The achieved rate of a model's own memory-bound kernels on this machine, as the
simulator counts their bytes (run on every rank of a `spawn`ed group by `zerosim calibrate`).

calibrate's elementwise rate is a bare `torch.mul` of two fresh tensors; the kernels a
training step runs are slower per byte: HF's RMSNorm arithmetic (pow, mean, rsqrt), SiLU
and its gating multiply, `rotate_half` rotary (slices, a negation, a concatenation), the
residual add, the fp32 cross-entropy over the vocabulary, each with its autograd backward,
and torch's single-tensor Adam. Timing each forward + backward on the model's shapes and
dividing the bytes that sim.analytic.kernels counts for the same kernels (less their
per-kernel overhead) by the elementwise rate gives `memory_bandwidth_efficiency`: the
fraction of that rate the simulator's memory-bound kernels reach. On this 2-core machine it
is about 0.6 (one process, 2026-12-01: norm 0.52, SiLU x up 0.38, residual 0.47, rotary
0.71, loss 0.72, Adam 0.62).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from sim.analytic import kernels as kn
from sim.analytic.opcost import UNFUSED_ADAM_BYTES_PER_PARAM, adam_launches
from sim.core.enums import KernelStyle
from sim.validate.torch_models import RMSNorm, apply_rotary

VALUE_BYTES = 4   # the validation runs train in fp32


def _forward_backward(make: Callable[..., Any], *shapes: tuple[int, ...]) -> Callable[[], None]:
    """A call that runs `make` (one output or a tuple) on fresh-gradient leaves of `shapes`
    and its backward."""
    leaves = [torch.randn(*shape, requires_grad=True) for shape in shapes]

    def run() -> None:
        for leaf in leaves:
            leaf.grad = None
        out = make(*leaves)
        outs = out if isinstance(out, tuple) else (out,)
        torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
    return run


def kernel_cases(model: dict[str, Any], tokens: int, seq: int) -> list[tuple[str, Callable[[], None], kn.Passes]]:
    """(name, forward + backward call, the simulator's kernels for it) for one block's
    memory-bound modules and the loss, on `tokens` tokens in sequences of `seq`."""
    h, f, vocab = model["hidden"], model["ffn_hidden"], model["vocab"]
    heads, kv_heads = model["heads"], model["kv_heads"]
    head_dim, batch = h // heads, max(1, tokens // seq)
    cos, sin = torch.randn(seq, head_dim), torch.randn(seq, head_dim)
    norm = RMSNorm(h)
    target = torch.randint(0, vocab, (tokens,), generator=torch.Generator().manual_seed(0))
    style, v = KernelStyle.HF, VALUE_BYTES
    return [
        ("norm", _forward_backward(norm, (tokens, h)),
         kn.norm("norm", tokens * h, style, True, v)),
        ("activation", _forward_backward(lambda g, u: nn.functional.silu(g) * u, (tokens, f), (tokens, f)),
         kn.activation("mlp", tokens * f, style, True, False, v)),
        ("residual", _forward_backward(lambda x, y: x + y, (tokens, h), (tokens, h)),
         kn.residual("residual", tokens * h, style, False, v)),
        ("rotary", _forward_backward(lambda q, k: (apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)),
                                     (batch, heads, seq, head_dim), (batch, kv_heads, seq, head_dim)),
         kn.rotary("attention", tokens * (heads + kv_heads) * head_dim, style, v)),
        ("loss", _forward_backward(lambda logits: nn.functional.cross_entropy(logits, target), (tokens, vocab)),
         kn.cross_entropy("loss", tokens, vocab, style, v)),
    ]


def adam_case(params: int, tensors: int) -> tuple[Callable[[], None], float, int]:
    """torch's single-tensor Adam (its CPU default) over `params` values in `tensors` tensors:
    (the step, the bytes the simulator counts, its kernels; sim.analytic.opcost.gpu_adam_time)."""
    each = max(1, params // tensors)
    weights = [nn.Parameter(torch.randn(each)) for _ in range(tensors)]
    for w in weights:
        w.grad = torch.randn(each)
    optimizer = torch.optim.Adam(weights, lr=1e-3, foreach=False)
    return optimizer.step, float(UNFUSED_ADAM_BYTES_PER_PARAM * each * tensors), adam_launches("for-loop", tensors)


def memory_kernel_totals(model: dict[str, Any], tokens: int, seq: int, params: int, tensors: int,
                         timer: Callable[[Callable[[], None]], float]) -> dict[str, Any]:
    """Seconds (`timer` of each call), counted bytes and kernels of the model's memory-bound
    kernels and its Adam step, summed, and per case for the report."""
    cases: dict[str, tuple[float, float, int]] = {}
    for name, call, passes in kernel_cases(model, tokens, seq):
        kernels = passes.forward + passes.backward_input + passes.backward_weight
        cases[name] = (timer(call), sum(k.bytes for k in kernels), len(kernels))
    step, nbytes, launches = adam_case(params, tensors)
    cases["adam"] = (timer(step), nbytes, launches)
    return {"seconds": sum(c[0] for c in cases.values()), "bytes": sum(c[1] for c in cases.values()),
            "kernels": sum(c[2] for c in cases.values()), "cases": cases}


def memory_efficiency(totals: dict[str, Any], elementwise_bandwidth: float, kernel_overhead: float) -> float:
    """The fraction of `elementwise_bandwidth` that makes the counted bytes take the measured
    seconds once each kernel's overhead is paid: bytes / rate / (seconds - kernels x overhead),
    within (0.05, 1]."""
    busy = totals["seconds"] - totals["kernels"] * kernel_overhead
    if busy <= 0:
        return 1.0
    return min(1.0, max(0.05, totals["bytes"] / elementwise_bandwidth / busy))
