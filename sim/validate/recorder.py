"""Record every c10d collective of a real torch run (the pattern of torch's CommDebugMode,
torch/distributed/tensor/debug/_comm_mode.py, but with bytes, group size and phase).

A TorchDispatchMode sees the c10d ops that Python and C++ callers (DDP's reducer, FSDP2,
ZeroRedundancyOptimizer) issue through the dispatcher. Sizes follow nccl-tests: the
all-gather's output, the reduce-scatter's input, the all-reduce's / broadcast's buffer.
torch is imported lazily: this module is only loaded by validation code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.distributed.distributed_c10d import ProcessGroup
from torch.utils._python_dispatch import TorchDispatchMode

c10d = torch.ops.c10d
# op -> (our collective name, which argument holds the buffer S: 'out' or 'in' or 'buf')
OPS = {
    c10d.allreduce_: ("all_reduce", "buf"), c10d.allreduce_coalesced_: ("all_reduce", "buf"),
    c10d.broadcast_: ("broadcast", "buf"), c10d.reduce_: ("reduce", "buf"),
    c10d._allgather_base_: ("all_gather", "out"), c10d.allgather_: ("all_gather", "out"),
    c10d.allgather_into_tensor_coalesced_: ("all_gather", "out"),
    c10d._reduce_scatter_base_: ("reduce_scatter", "in"), c10d.reduce_scatter_: ("reduce_scatter", "in"),
    c10d.reduce_scatter_tensor_coalesced_: ("reduce_scatter", "in"),
    c10d.alltoall_base_: ("all_to_all", "in"),
}
P2P = {c10d.send: "send", c10d.recv_: "recv"}    # (tensors, group, peer rank, tag): DeepSpeed's pipe/p2p.py


funcol = torch.ops._c10d_functional
# DTensor's functional collectives (tensor parallelism): op -> (name, output elements per input element: the
# group size for an all-gather, 1 for a reduce-scatter's input and an all-reduce's buffer)
FUNCTIONAL = {funcol.all_gather_into_tensor: "all_gather", funcol.reduce_scatter_tensor: "reduce_scatter",
              funcol.all_reduce: "all_reduce", funcol.all_reduce_: "all_reduce"}


def _group_size(name: str) -> int:
    from torch.distributed.distributed_c10d import _resolve_process_group
    return _resolve_process_group(name).size()


def _tensors(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for item in x for t in _tensors(item)]
    return []


def _nbytes(ts: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


@dataclass
class Collective:
    op: str
    nbytes: int
    group_size: int
    phase: str
    order: int
    functional: bool = False    # a DTensor functional collective (tensor parallelism), not a c10d one
    peer: int = -1              # a send's destination or a receive's source (rank in its group)


@dataclass
class CollectiveRecorder(TorchDispatchMode):
    """Use as a context manager around training; set `phase` as the step advances."""

    phase: str = "setup"
    log: list[Collective] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__init__()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        packet = func._overloadpacket
        if packet in FUNCTIONAL:     # (input, [reduce op,] [group size,] group name)
            name, group = FUNCTIONAL[packet], _group_size(args[-1])
            nbytes = _nbytes(_tensors(args[0])) * (group if name == "all_gather" else 1)
            self.log.append(Collective(name, nbytes, group, self.phase, len(self.log), functional=True))
        elif packet in P2P:
            peer = next(a for a in args[1:] if isinstance(a, int))
            self.log.append(Collective(P2P[packet], _nbytes(_tensors(args[0])), 2, self.phase, len(self.log),
                                       peer=peer))
        elif packet in OPS:
            name, where = OPS[packet]
            if where == "out" or (where == "in" and name == "reduce_scatter"):
                nbytes = _nbytes(_tensors(args[0] if where == "out" else args[1]))
            else:
                nbytes = _nbytes(_tensors(args[0]))
            boxed = next((a for a in args if isinstance(a, torch.ScriptObject)), None)
            size = ProcessGroup.unbox(boxed).size() if boxed is not None else 1
            self.log.append(Collective(name, nbytes, size, self.phase, len(self.log)))
        return func(*args, **kwargs)


def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes this rank holds for parameters, gradients and optimizer state (local shards)."""
    def local(t: torch.Tensor) -> torch.Tensor:
        return t.to_local() if hasattr(t, "to_local") else t
    params = [local(p) for p in model.parameters()]
    inner = getattr(optimizer, "optim", optimizer)   # ZeroRedundancyOptimizer's local optimizer
    state = [local(v) for s in inner.state.values() for v in s.values()
             if isinstance(v, torch.Tensor) and v.dim() > 0]
    grads = [local(p.grad) for p in model.parameters() if p.grad is not None]
    return {"params": _nbytes(params), "grads": _nbytes(grads), "optimizer": _nbytes(state)}
