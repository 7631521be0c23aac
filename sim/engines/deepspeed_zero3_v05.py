"""DeepSpeed ZeRO-3 as it ran from v0.3.13 to v0.5.4 (2021; `[zero] deepspeed_version =
"0.5"`): the engine of the SC21 Megatron paper's ZeRO-3 baseline and of the ZeRO-Infinity
paper. Read at tag v0.5.4 (the path is the same at v0.3.13, v0.3.16 and v0.4.0):

- `stage3.py fetch_sub_module` gathers a module's partitioned parameters one by one:
  `partition_parameters.py _allgather_param` allocates the full tensor, calls
  `torch.cuda.synchronize()` (the host waits for every stream), builds a list of dp
  `narrow` views in Python and calls `torch.distributed.all_gather` with that list, which
  gathers into a flat buffer and copies each of the dp chunks out (dp copy kernels);
  `_synchronize_communication` then waits for the handle, the communication stream and the
  device. Nothing of a gather overlaps compute, and every gather pays a device drain. The
  coordinator's prefetch launches its gathers through the same path (each one draining the
  device first), so it hides nothing and is not modelled.
- Gradients fill the IPG bucket as in later versions, but each bucket's reduction
  (`average_tensor` -> `_reduce_scatter_gradients`) is one `reduce_scatter` per parameter
  with an input list of dp slices (a Python loop over the ranks, then dp copy kernels into
  a flat buffer); the next module's gather drains the device, so a flushed bucket's
  reductions end before backward goes on.
- Coalesced, overlapped gathers (`AllGatherCoalescedHandle`) arrived in v0.6.0 (PR #1453);
  PR #1188 (v0.5.5) notes that the "async" gather of this version synchronizes the device.

The rest (persistence threshold, release, the step) is modelled as in sim.engines.deepspeed_zero3.
"""

from __future__ import annotations

from sim.analytic import kernels as kn
from sim.analytic.comm import tensor_padded
from sim.core.enums import Coll, ScheduleMode, ZeroStage
from sim.engines.deepspeed_zero3 import Fetch, Zero3Planner
from sim.engines.deepspeed_zero12 import deepspeed_dp_volume, no_partitioned_gradients_with_pipelines
from sim.engines.layout import Layout
from sim.engines.model import EngineModel
from sim.engines.schedule import Alloc, Mem, OpRef, Phase, Stream
from sim.engines.uses import C, F, Use
from sim.engines.zero3_memory import zero3_resident
from sim.inputs.scenario import Scenario
from sim.inputs.zero_config import LEGACY_VERSION


class Zero3LegacyPlanner(Zero3Planner):
    name = "deepspeed-zero3-v0.5"

    def __init__(self, s: Scenario, layout: Layout, stage: int = 0) -> None:
        super().__init__(s, layout, stage)
        # each fetch unit's partitioned tensors, one gather each (module order)
        self.fetch_tensors: dict[str, list[int]] = {}
        for key in self.fetch.values():
            own = self.granules[self._owner_index(key.owner)]
            self.fetch_tensors[key.owner] = [n for j, n in enumerate(own.tensors) if (key.owner, j) not in self.persistent]

    def micro_step(self, ms: int) -> None:
        trace = self.with_containers(self.trace(ms))
        keys = [self.fetch.get(u.index) if u.what is not C else None for u in trace]
        passes = self.passes_of(trace)
        available: set[str] = set()
        for pos, use in enumerate(trace):
            key = keys[pos]
            self._in_backward = passes[pos] is not F
            self.hook_time = self.b.last(Stream.COMPUTE)
            if key and key.owner not in available:
                for numel in self.fetch_tensors[key.owner]:
                    self._gather_one(key.owner, numel, ms, use)
                available.add(key.owner)
            op = self._emit_use(use)
            if key and self._release(keys, pos, {}):
                available.discard(key.owner)
                self._free_after(op, key)
        for owner in sorted(available):   # release_and_reset_all at the end of backward
            self._free_after(self.b.last(Stream.COMPUTE), self._key_of(owner))
        self.end_of_backward(ms)

    def _drain(self) -> None:
        """torch.cuda.synchronize(): the host waits for every stream's last op."""
        for stream in (Stream.COMPUTE, Stream.ALLGATHER, Stream.REDUCE):
            self.b.host_sync(self.b.last(stream))

    def _gather_one(self, owner: str, numel: int, ms: int, use: Use) -> OpRef:
        """`_allgather_param`: drain, all-gather into a list of dp chunks, copy them out,
        wait for it all (`_synchronize_communication`)."""
        padded = tensor_padded(numel, self.dp)
        phase, layer = self._phase(use), self.granules[use.index].block
        self._drain()
        ag = self.collective(Stream.ALLGATHER, Coll.ALL_GATHER, self.h * padded, f"all-gather {owner} (one parameter)",
                             phase, ms, deps=[self.hook_time], layer=layer, purpose="fetch",
                             alloc=(Alloc(Mem.PARAMS, f"gathered {owner} ({numel:,})", self.h * padded),))
        self.b.stream_wait(Stream.COMPUTE, ag)
        chunk = kn.memory("copy a gathered chunk out of the flat buffer", 2.0 * self.h * padded / self.dp)
        copies = self.compute("all_gather list output: dp chunk copies", phase, ms, (chunk,) * self.dp,
                              layer if use.what is not C else None, pieces=self.dp)
        self.b.host_sync(copies)
        return copies

    def _free_after(self, op: OpRef | None, key: Fetch) -> None:
        self.b.attach(op, free=tuple(Alloc(Mem.PARAMS, f"gathered {key.owner} ({n:,})", self.h * tensor_padded(n, self.dp))
                                     for n in self.fetch_tensors[key.owner]))
        self.released.add(key.owner)

    def _reduce_scatter(self, ms: int, producer: OpRef | None, layer: int | None) -> None:
        """`reduce_ipg_grads`: the previous bucket's reductions end first (the host waits for
        the reduction stream), then one reduce_scatter per gradient, each after dp copies of
        its Python-built input list into a flat buffer."""
        shapes = self.bucket_shapes
        self.bucket_padded = self.bucket_tensors = 0
        self.bucket_shapes = []
        self.b.host_sync(self.last_reduction)
        for numel, _dims in shapes:
            padded = tensor_padded(numel, self.dp)
            chunk = kn.memory("copy a gradient slice into the flat buffer", 2.0 * self.h * padded / self.dp)
            flat = self.compute("reduce_scatter list input: dp slice copies", Phase.BWD, ms, (chunk,) * self.dp,
                                layer, deps=[producer], pieces=self.dp)
            self.last_reduction = self.collective(Stream.REDUCE, Coll.REDUCE_SCATTER, self.h * padded,
                                                  "reduce_scatter one gradient", Phase.BWD, ms, deps=[flat],
                                                  layer=layer, purpose="grad bucket")

    def notes(self) -> list[str]:
        return [f"ZeRO-3 as DeepSpeed v0.3.13-v0.5.4 ran it: {sum(map(len, self.fetch_tensors.values()))} "
                f"parameter gathers per pass of the model, each after a device synchronize, none overlapped; "
                f"{len(self.persistent)} persistent tensors"]


def runs_v05(s: Scenario) -> bool:
    return (s.schedule_mode is ScheduleMode.IMPLEMENTED and s.zero is not None
            and s.zero.stage == ZeroStage.PARAMETERS and s.zero.deepspeed_version == LEGACY_VERSION)


DEEPSPEED_ZERO3_V05 = EngineModel(
    name="deepspeed-zero3-v0.5", summary="DeepSpeed ZeRO-3 as of v0.3.13-v0.5.4 (per-parameter, synchronous gathers)",
    applies=runs_v05, planner=Zero3LegacyPlanner, resident=zero3_resident, volume=deepspeed_dp_volume,
    check=no_partitioned_gradients_with_pipelines)
