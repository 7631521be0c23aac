"""Benchmark: what a gloo all-gather costs inside a training step, against how `zerosim
calibrate` times it (every rank starting the call together after a barrier, into one output
buffer reused call after call: sim.validate.measure.measure_collectives).

Part 1, all-gathers alone: per call (median of 10 after 4 warm-ups, per rank), the
calibration's way; into a freshly allocated output each call (`torch.empty`, as FSDP2's
`foreach_all_gather` and DeepSpeed ZeRO-3's fetch allocate theirs); right after a stretch of
GEMMs with no barrier (the ranks arrive as their compute ends, as in a step), reused and
fresh; with each iteration's time beside (compute + gather; "compute-only" is the stretch
alone). Sizes: 3.2 MB (one block of the timing model, sim.validate.timing.TIMING_MODEL) and
8.4 MB (its root: embedding and head).

Part 2, the timing model's step (4 blocks, micro-batch 4 x 128 tokens, 2 micro-batches)
under DDP, FSDP2 and FSDP2 without resharding: the slowest rank's step (median of steps
3-9), and per rank the seconds per step inside FSDP2's parameter-group methods by training
state (`FSDPParamGroup.unshard`, `wait_for_unshard`, `pre_backward`, `post_backward`, ...,
torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py; nested calls count in both),
forward, backward and the optimizer step.

Run: python bench/gloo_gathers.py [--world 2] [--rounds 3]
Not a test: about a minute per round on 2 cores; docs/validation.md has a run.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import tempfile
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from sim.inputs.models import model_from_table
from sim.validate.timing import TIMING_MODEL, TIMING_RUN
from sim.validate.torch_models import LlamaLike
from sim.validate.torch_runs import _wrap

SIZES = (3_200_000, 8_400_000)     # bytes gathered: one block, the root
WAYS = ("barrier+reused", "barrier+fresh", "compute+reused", "compute+fresh", "compute-only")
STRATEGIES = ("ddp", "fsdp2", "fsdp2-no-reshard")
GROUP_METHODS = ("unshard", "wait_for_unshard", "pre_forward", "post_forward", "pre_backward", "post_backward",
                 "reshard")


def gathers(rank: int, world: int) -> dict[str, Any]:
    a, b = torch.randn(512, 256), torch.randn(256, 688)
    out = {}
    for nbytes in SIZES:
        shard = torch.ones(nbytes // 4 // world)
        reused = torch.empty(shard.numel() * world)
        for way in WAYS:
            calls, iterations = [], []
            for i in range(14):
                begun = time.perf_counter()
                if way.startswith("barrier"):
                    dist.barrier()
                else:
                    for _ in range(25):
                        a @ b
                called = time.perf_counter()
                if way != "compute-only":
                    dist.all_gather_into_tensor(reused if way.endswith("reused") else torch.empty_like(reused), shard)
                ended = time.perf_counter()
                if i >= 4:
                    calls.append(ended - called)
                    iterations.append(ended - begun)
            out[f"{way} {nbytes / 1e6:.1f} MB"] = (statistics.median(calls), statistics.median(iterations))
        dist.barrier()
    return out


def timed_groups(acc: dict[str, float]) -> None:
    """Add each FSDPParamGroup method's seconds to `acc` under "method/STATE"."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group as group
    for name in GROUP_METHODS:
        raw = getattr(group.FSDPParamGroup, name)

        def timed(self: Any, *args: Any, _raw: Any = raw, _name: str = name, **kwargs: Any) -> Any:
            key, begun = f"{_name}/{self._training_state.name}", time.perf_counter()
            try:
                return _raw(self, *args, **kwargs)
            finally:
                acc[key] += time.perf_counter() - begun
        setattr(group.FSDPParamGroup, name, timed)


def steps(rank: int, world: int, strategy: str) -> dict[str, Any]:
    acc: dict[str, float] = collections.defaultdict(float)
    if strategy.startswith("fsdp2"):
        timed_groups(acc)
    spec = model_from_table(TIMING_MODEL, "bench", "model.")
    torch.manual_seed(0)
    model, opt, _ = _wrap(LlamaLike(spec), strategy, torch.float32)
    gen = torch.Generator().manual_seed(1000 + rank)
    accum, step_s, parts = TIMING_RUN["grad_accum"], [], []
    for _ in range(9):
        acc.clear()
        begun = time.perf_counter()
        for _mb in range(accum):
            tokens = torch.randint(0, spec.vocab, (TIMING_RUN["micro_batch"], TIMING_RUN["seq_len"] + 1), generator=gen)
            t0 = time.perf_counter()
            logits = model(tokens[:, :-1])
            loss = nn.functional.cross_entropy(logits.reshape(-1, spec.vocab), tokens[:, 1:].reshape(-1))
            t1 = time.perf_counter()
            (loss / accum).backward()
            acc["forward"] += t1 - t0
            acc["backward"] += time.perf_counter() - t1
        t2 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=False)
        acc["optimizer"] += time.perf_counter() - t2
        step_s.append(time.perf_counter() - begun)
        parts.append(dict(acc))
    return {"step_s": step_s, "parts": parts}


def worker(rank: int, world: int, what: str, folder: str) -> None:
    torch.set_num_threads(1)      # as sim.validate.torch_runs runs every rank
    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=world)
    try:
        result = gathers(rank, world) if what == "gathers" else steps(rank, world, what)
        torch.save(result, os.path.join(folder, f"{rank}.pt"))
    finally:
        dist.destroy_process_group()


def run(world: int, what: str) -> list[Any]:
    with tempfile.TemporaryDirectory(prefix="zerosim-gathers-") as folder:
        mp.start_processes(worker, args=(world, what, folder), nprocs=world, start_method="spawn")
        return [torch.load(os.path.join(folder, f"{r}.pt"), weights_only=False) for r in range(world)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    for r in range(args.rounds):
        ranks = run(args.world, "gathers")
        for key in ranks[0]:
            calls = " ".join(f"{1e3 * x[key][0]:6.2f}" for x in ranks)
            iterations = " ".join(f"{1e3 * x[key][1]:7.2f}" for x in ranks)
            print(f"round {r}  {key:24s} call ms {calls}   iteration ms {iterations}", flush=True)
        for strategy in STRATEGIES:
            ranks = run(args.world, strategy)
            slowest = [max(x["step_s"][i] for x in ranks) for i in range(9)]
            print(f"round {r}  {strategy}: step {statistics.median(slowest[2:]):.4f} s", flush=True)
            for k, x in enumerate(ranks):
                keys = sorted({key for part in x["parts"][2:] for key in part})
                medians = {key: round(statistics.median(p.get(key, 0.0) for p in x["parts"][2:]), 4) for key in keys}
                print(f"   rank {k}: {json.dumps(medians)}", flush=True)


if __name__ == "__main__":
    main()
