"""How the Adam step runs: fused (one pass, 30 B/param), torch's foreach and single-tensor
loop (seven passes, 72 B/param, launches per tensor list or per tensor)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from sim.analytic.opcost import adam_launches, gpu_adam_time
from sim.core.enums import OptimizerImpl
from sim.core.errors import InputError
from sim.engines.schedule import GpuOptimizer
from sim.inputs.load import scenario_from_table
from sim.simulate import simulate
from tests.crosscheck.scenarios import TINY_MODEL, tiny


def test_unfused_adam_moves_72_bytes_per_parameter_and_pays_its_launches():
    s = tiny("fsdp2")
    c, params = s.cluster, 1e9
    fused = gpu_adam_time(params, c)
    foreach = gpu_adam_time(params, c, "foreach", 360)
    loop = gpu_adam_time(params, c, "for-loop", 360)
    assert foreach - 10 * 7 * c.gpu.kernel_overhead == pytest.approx(fused * 72 / 30)
    assert loop - foreach == pytest.approx((7 * 360 - 70) * c.gpu.kernel_overhead)
    assert (adam_launches("fused", 360), adam_launches("foreach", 360), adam_launches("for-loop", 360)) == (1, 70, 2520)


def table(**training) -> dict:
    return {"model": TINY_MODEL, "cluster": "dgx-a100-80g", "nodes": 1, "fsdp": {},
            "training": {"seq_len": 512, "micro_batch": 2, "grad_accum": 1, "precision": "bf16", **training}}


def test_gpu_default_is_torchs_foreach_for_torch_engines_fused_for_deepspeed_and_the_key_overrides():
    gpu = scenario_from_table(table(), Path("s.toml"), "s")
    assert gpu.training.optimizer is OptimizerImpl.FOREACH        # torch.optim on CUDA: foreach
    ds_table = {k: v for k, v in table().items() if k != "fsdp"} | {"zero": {"stage": 2}}
    assert scenario_from_table(ds_table, Path("s.toml"), "s").training.optimizer is OptimizerImpl.FUSED
    cpu_table = {**table(), "cluster": "local-cpu", "gpus_per_node": 2}
    assert scenario_from_table(cpu_table, Path("s.toml"), "s").training.optimizer is OptimizerImpl.FOR_LOOP
    given = scenario_from_table(table(optimizer_implementation="foreach"), Path("s.toml"), "s")
    assert given.training.optimizer is OptimizerImpl.FOREACH
    with pytest.raises(InputError, match="training.optimizer_implementation.*fused, foreach, for-loop"):
        scenario_from_table(table(optimizer_implementation="apex"), Path("s.toml"), "s")


def test_deepspeed_torch_adam_is_torchs_foreach_on_a_gpu(tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": True},
                              "optimizer": {"type": "Adam", "params": {"torch_adam": True}},
                              "zero_optimization": {"stage": 2}}))
    t = {"model": TINY_MODEL, "cluster": "dgx-a100-80g", "nodes": 1, "deepspeed": str(ds),
         "training": {"seq_len": 512}}
    assert scenario_from_table(t, tmp_path / "s.toml", "s").training.optimizer is OptimizerImpl.FOREACH


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2", "ds-zero2", "ds-zero3"])
def test_the_step_is_slower_unfused_and_slowest_tensor_by_tensor(strategy):
    s = tiny(strategy, nodes=1)
    times = []
    for impl in OptimizerImpl:
        r = simulate(replace(s, training=replace(s.training, optimizer=impl)))
        (op,) = [o for o in r.schedule.ops(0) if isinstance(o, GpuOptimizer)]
        assert op.implementation == impl.value
        times.append(r.step_time_s)
    assert times[0] < times[1] <= times[2]


def test_ddp_copies_each_gradient_into_its_bucket_and_back_at_the_sync_step():
    r = simulate(tiny("ddp", grad_accum=2))
    copies = [op for op in r.schedule.ops(0) if op.name.startswith("DDP copy")]
    moved = sum(k.bytes for op in copies for k in op.kernels)
    planner_psi = sum(op.params for op in r.schedule.ops(0) if isinstance(op, GpuOptimizer))
    assert moved == pytest.approx(2 * 2 * 4 * planner_psi)         # in and back, read + write, fp32
    assert all(op.micro_step == 1 for op in copies)                 # only the sync (last) micro-step
