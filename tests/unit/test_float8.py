"""Float8 linears and torch.compile kernels (issue 9: torchtitan's published runs ran both):
fp8 GEMMs at the fp8 peak, the casts torchao adds, where the choice is refused, and how the
published-row harness reads it."""

from __future__ import annotations

import pytest

from sim.analytic.kernel_time import kernel_time
from sim.analytic.kernels import KernelKind, KernelStyle, activation, cross_entropy, linear
from sim.core.enums import Float8Recipe
from sim.core.errors import InputError
from sim.inputs.catalog import catalog_dir
from sim.inputs.hardware import load_gpu
from sim.inputs.load import load_scenario
from sim.simulate import simulate

H100 = load_gpu(catalog_dir("hardware") / "gpus" / "h100-sxm5-80g.toml")

SCENARIO = """
model = "llama3-8b"
cluster = "{cluster}"
nodes = 1
[training]
seq_len = 4096
micro_batch = 1
global_batch = 8
precision = "{precision}"
[fsdp]
[compute]
kernels = "{kernels}"
float8 = "{float8}"
"""


def scenario(write_scenario, cluster="dgx-h100", precision="bf16", kernels="torch-compile", float8="tensorwise",
             engine="fsdp"):
    text = SCENARIO.format(cluster=cluster, precision=precision, kernels=kernels, float8=float8)
    if engine == "megatron":
        text = text.replace("[fsdp]", "[megatron]")
    return load_scenario(write_scenario(text))


def seconds(passes, gpu=H100) -> float:
    return sum(kernel_time(k, gpu, "bf16") for k in passes.forward + passes.backward_input + passes.backward_weight)


def test_fp8_gemms_run_at_the_fp8_peak_and_the_casts_are_memory_bound():
    bf16, fp8 = linear("w", 16384, 4096, 4096, bias=False, value_bytes=2), \
        linear("w", 16384, 4096, 4096, bias=False, value_bytes=2, float8=True)
    gemms = [k for k in fp8.forward + fp8.backward_input + fp8.backward_weight if k.kind is KernelKind.GEMM]
    casts = [k for k in fp8.forward + fp8.backward_input + fp8.backward_weight if k.kind is KernelKind.MEMORY]
    assert len(gemms) == 3 and all(k.fp8 for k in gemms)
    assert sum(k.flops for k in gemms) == sum(k.flops for k in bf16.forward + bf16.backward_input
                                              + bf16.backward_weight)
    # X, W forward; dY (two layouts) and W^T for dX; X^T for dW
    assert [k.name.split(" ", 1)[1] for k in casts] == ["X to fp8", "W to fp8", "dY to fp8", "W^T to fp8",
                                                         "X^T to fp8"]
    gemm_bf16 = kernel_time(bf16.forward[0], H100, "bf16")
    gemm_fp8 = kernel_time(gemms[0], H100, "bf16")
    assert gemm_fp8 == pytest.approx(gemm_bf16 * H100.bf16_flops / H100.fp8_flops, rel=0.05)
    assert seconds(fp8) < seconds(bf16)                 # a large Linear gains despite its casts
    small_fp8 = linear("w", 256, 1024, 1024, bias=False, value_bytes=2, float8=True)
    small_bf16 = linear("w", 256, 1024, 1024, bias=False, value_bytes=2)
    assert seconds(small_fp8) > seconds(small_bf16)     # a small one loses: five casts, five launches


def test_shared_inputs_skip_their_casts():
    alone = linear("k", 4096, 1024, 4096, bias=False, value_bytes=2, float8=True)
    shared = linear("k", 4096, 1024, 4096, bias=False, value_bytes=2, float8=True, cast_input=False)
    names = [k.name for k in shared.forward + shared.backward_weight]
    assert not any("X" in n for n in names) and seconds(shared) < seconds(alone)


def test_torch_compile_fuses_swiglu_and_the_loss():
    eager = activation("mlp", 1 << 24, KernelStyle.TORCH, True, False, 2)
    compiled = activation("mlp", 1 << 24, KernelStyle.TORCH_COMPILE, True, False, 2)
    assert len(compiled.forward) == 1 < len(eager.forward) and seconds(compiled) < seconds(eager)
    loss_eager = cross_entropy("loss", 8192, 128256, KernelStyle.TORCH, 2)
    loss_compiled = cross_entropy("loss", 8192, 128256, KernelStyle.TORCH_COMPILE, 2)
    assert seconds(loss_compiled) < 0.6 * seconds(loss_eager)


def test_float8_makes_a_llama_step_faster_and_compile_does_too(write_scenario):
    f8 = simulate(scenario(write_scenario)).step_time_s
    compiled = simulate(scenario(write_scenario, float8="none")).step_time_s
    eager = simulate(scenario(write_scenario, kernels="torch", float8="none")).step_time_s
    assert f8 < compiled < eager
    assert scenario(write_scenario).compute.float8 is Float8Recipe.TENSORWISE


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"cluster": "dgx-a100-80g"}, "no fp8 tensor cores"),
    ({"precision": "fp16"}, "not simulated yet"),
    ({"kernels": "megatron"}, "Transformer Engine"),
    ({"float8": "rowwise"}, "allowed"),
    ({"engine": "megatron"}, "engine megatron"),
])
def test_float8_is_refused_where_it_cannot_run_or_is_not_modelled(write_scenario, kwargs, says):
    with pytest.raises(InputError, match="compute.float8") as e:
        scenario(write_scenario, **kwargs)
    assert says in str(e.value)


def test_float8_tensor_parallelism_gathers_fp8_and_casts_the_sequence_shard(write_scenario):
    """torchao's float8 TP styles (Float8ColwiseParallel, Float8RowwiseParallel,
    PrepareFloat8ModuleInput): a block's TP all-gathers carry 1 byte per element, its
    reduce-scatters stay bf16; the column-parallel input and the row-parallel output
    gradient are cast on their 1/tp sequence shard."""
    from sim.engines.schedule import Collective
    from sim.engines.workload import float8_tp
    tp_text = "[parallel]\ntp = 2\nsequence_parallel = true\n"

    def block_bytes(float8: str) -> dict[str, set[float]]:
        s = load_scenario(write_scenario(SCENARIO.format(cluster="dgx-h100", precision="bf16",
                                                         kernels="torch-compile", float8=float8) + tp_text))
        ops = [op for op in simulate(s).schedule.ops(0) if isinstance(op, Collective)
               and op.purpose == "tensor parallel" and op.layer == 3]
        return {c: {op.nbytes for op in ops if op.coll.value == c} for c in ("all_gather", "reduce_scatter")}
    f8, bf16 = block_bytes("tensorwise"), block_bytes("none")
    assert f8["reduce_scatter"] == bf16["reduce_scatter"] and len(bf16["all_gather"]) == 1
    assert f8["all_gather"] == {next(iter(bf16["all_gather"])) / 2}
    full, shard = (linear("w", 8192, 2048, 4096, bias=False, value_bytes=2, float8=True, input_share=share,
                          grad_share=share) for share in (1.0, 0.5))
    cast = {k.name: k.bytes for k in full.forward + full.backward_input}
    cast_shard = {k.name: k.bytes for k in shard.forward + shard.backward_input}
    assert cast_shard["w X to fp8"] == cast["w X to fp8"] / 2 and cast_shard["w dY to fp8"] == cast["w dY to fp8"] / 2
    assert cast_shard["w W to fp8"] == cast["w W to fp8"]
    assert not float8_tp(scenario(write_scenario))          # no TP: nothing to gather
