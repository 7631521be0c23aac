"""torchtitan's per-op selective checkpointing and full recomputation on CPU torch, against
the simulator's counts (sim.analytic.op_sac, sim.analytic.activations): the bytes a block
keeps from forward to backward and the matmul FLOPs its backward runs again."""

from __future__ import annotations

import pytest
import torch

from sim.analytic import op_sac
from sim.analytic.activations import layer_activation_bytes
from sim.core.enums import Recompute
from sim.inputs.models import model_from_table
from sim.validate.checkpoint_memory import backward_matmul_flops, block_kept_bytes, per_op_policy

SHAPES = {   # GQA with a gated MLP; and one with as many KV heads as heads and a wider MLP
    "gqa": {"layers": 2, "hidden": 128, "heads": 4, "kv_heads": 2, "ffn_hidden": 384, "vocab": 2048},
    "mha": {"layers": 2, "hidden": 96, "heads": 6, "kv_heads": 6, "ffn_hidden": 512, "vocab": 2048},
}
TOKENS = (2, 48)    # batch, sequence


@pytest.fixture(params=list(SHAPES), scope="module")
def spec(request):
    return model_from_table(SHAPES[request.param], "test", "model.")


def test_a_block_under_the_per_op_policy_keeps_what_op_sac_counts(spec):
    measured = block_kept_bytes(spec, TOKENS, "selective-op")
    b, s = TOKENS
    assert measured == layer_activation_bytes(spec, s, b, recompute=Recompute.SELECTIVE_OP, value_bytes=4)
    # it keeps more than full recomputation (the block input alone) and less than no checkpointing
    assert block_kept_bytes(spec, TOKENS, "full") == layer_activation_bytes(spec, s, b, recompute=Recompute.FULL,
                                                                             value_bytes=4) < measured
    assert measured < block_kept_bytes(spec, TOKENS, "none")


def test_its_backward_runs_again_every_second_matmul(spec):
    plain, grad = backward_matmul_flops(spec, TOKENS, "none")
    per_op, per_op_grad = backward_matmul_flops(spec, TOKENS, "selective-op")
    full, _ = backward_matmul_flops(spec, TOKENS, "full")
    tokens = TOKENS[0] * TOKENS[1]
    assert per_op - plain == op_sac.recomputed_flops_per_token(spec) * tokens
    assert 0 < per_op - plain < full - plain          # k, o and up of q, k, v, o, gate, up, down
    assert torch.allclose(per_op_grad, grad)          # the recomputation reproduced the forward


def test_the_policy_saves_odd_matmuls_and_the_attention_op():
    policy = per_op_policy()
    mm, other = torch.ops.aten.mm.default, torch.ops.aten.add.Tensor
    decisions = [policy(None, mm).name for _ in range(4)] + [policy(None, other).name]
    assert decisions == ["MUST_SAVE", "PREFER_RECOMPUTE", "MUST_SAVE", "PREFER_RECOMPUTE", "PREFER_RECOMPUTE"]
    names = [mm.name for mm in op_sac.block_matmuls(model_from_table(SHAPES["gqa"], "test", "model."))
             if mm.saved]
    assert names == ["self_attn.q_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.down_proj"]
