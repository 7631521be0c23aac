"""The device kernels a transformer's modules launch, per training pass, as each
implementation runs them.

A module's forward is one GEMM (a Linear), one attention kernel or a few memory-bound
kernels (norms, activations, residual adds, dropout, rotary, softmax, the loss); its
backward is the input-gradient GEMM and the weight-gradient GEMM (plus a bias-gradient
reduction), or the memory-bound kernels' backward. What is fused depends on the code
(`KernelStyle`):

- `megatron`: Megatron-LM / Transformer Engine fusions (megatron/core/fusions):
  LayerNorm / RMSNorm in one kernel, bias + GeLU (`fused_bias_gelu`) or SwiGLU
  (`fused_bias_swiglu`) in one, bias + dropout + residual add (`fused_bias_dropout`) in
  one, fused rotary (`apply_rotary_pos_emb`), vocab-parallel cross-entropy.
- `torch`: torchtitan-style eager PyTorch with fused norms: one kernel per norm, SiLU and
  the gating multiply apart, residual adds apart, no dropout.
- `torch-compile`: the same modules under `torch.compile` (torchtitan's `compile` option):
  Inductor fuses each pointwise chain into one kernel, so SiLU and the gating multiply run
  as one kernel each way (as Megatron's fused SwiGLU), and the fp32 loss is one pass forward.
- `hf`: Hugging Face transformers eager modules: RMSNorm as its Python arithmetic
  (modeling_llama.py `LlamaRMSNorm`: cast, pow, mean, rsqrt, two multiplies), GPT-2's
  tanh GeLU as its formula (`NewGELUActivation`, about seven elementwise kernels),
  `rotate_half` rotary, dropout and residual add as separate kernels.

Attention (`AttentionImpl`): `flash` is one fused kernel per pass (FlashAttention-2 /
SDPA; causal: half the score FLOPs; backward 2.5x the forward FLOPs: it recomputes the
scores, Dao 2023 Sec. 3.1); `unfused` is Megatron's pre-2022 core attention, two batched
GEMMs around a fused scale-mask-softmax, computing the full s x s scores even when causal
(Korthikanti et al. 2022 Sec. 5 counts them). Byte counts are reads plus writes of
2-byte values (or `value_bytes`) and 4-byte fp32 where the code upcasts; they are
estimates from the code paths named, to be scaled by a fitted HBM efficiency.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from sim.core.enums import AttentionImpl, KernelStyle

__all__ = ["AttentionImpl", "Kernel", "KernelKind", "KernelStyle", "Passes"]


class KernelKind(StrEnum):
    GEMM = "gemm"
    ATTENTION = "attention"
    MEMORY = "memory"


@dataclass(frozen=True, slots=True)
class Kernel:
    """One device kernel. GEMM: `batch` products of (m x k) by (k x n); attention: one
    kernel over `seq` x `seq` scores (`backward` for the gradient pass); memory: `bytes`
    of HBM traffic at streaming speed."""

    name: str
    kind: KernelKind
    flops: float = 0.0
    bytes: float = 0.0
    m: int = 0
    n: int = 0
    k: int = 0
    batch: int = 1
    seq: int = 0
    backward: bool = False
    fp8: bool = False      # a GEMM on fp8 operands (at the GPU's fp8 peak)


def gemm(name: str, m: int, n: int, k: int, batch: int = 1, value_bytes: int = 2) -> Kernel:
    """2 m n k FLOPs per product; reads A and B, writes C once."""
    return Kernel(name, KernelKind.GEMM, 2.0 * m * n * k * batch, float(value_bytes * batch * (m * k + k * n + m * n)),
                  m=m, n=n, k=k, batch=batch)


def memory(name: str, nbytes: float) -> Kernel:
    return Kernel(name, KernelKind.MEMORY, 0.0, float(nbytes))


@dataclass(frozen=True, slots=True)
class Passes:
    """A module's kernels: forward, input gradient, weight gradient (the last is empty for
    modules without weights to learn in a GEMM)."""

    forward: tuple[Kernel, ...] = ()
    backward_input: tuple[Kernel, ...] = ()
    backward_weight: tuple[Kernel, ...] = ()

    def __add__(self, other: Passes) -> Passes:
        return Passes(self.forward + other.forward, self.backward_input + other.backward_input,
                      self.backward_weight + other.backward_weight)


def linear(name: str, tokens: int, n: int, k: int, *, bias: bool, value_bytes: int, float8: bool = False,
           cast_input: bool = True, input_share: float = 1.0, grad_share: float = 1.0) -> Passes:
    """Y = X W^T (+ b): forward GEMM (tokens x n x k), input gradient dX = dY W
    (tokens x k x n), weight gradient dW = dY^T X (n x k x tokens), and the bias gradient,
    a reduction of dY over the tokens. The forward bias rides in the GEMM's epilogue.
    `float8`: torchao's Float8Linear (`float8_linear`) runs the three GEMMs on fp8
    operands, after casting each operand (`cast_input` False: another Linear's cast of the
    same input is reused; `input_share`, `grad_share`: the share of X and of dY the rank
    casts itself, as under float8 tensor parallelism, which casts a sequence shard and
    all-gathers the fp8 values)."""
    if tokens <= 0 or n <= 0 or k <= 0:
        return Passes()
    if float8:
        return float8_linear(name, tokens, n, k, bias=bias, value_bytes=value_bytes, cast_input=cast_input,
                             input_share=input_share, grad_share=grad_share)
    weight: tuple[Kernel, ...] = (gemm(f"{name} dW", n, k, tokens, value_bytes=value_bytes),)
    if bias:
        weight += (memory(f"{name} db", value_bytes * tokens * n),)
    return Passes((gemm(name, tokens, n, k, value_bytes=value_bytes),),
                  (gemm(f"{name} dX", tokens, k, n, value_bytes=value_bytes),), weight)


def fp8_gemm(name: str, m: int, n: int, k: int, out_bytes: int) -> Kernel:
    """A GEMM of 1-byte operands writing `out_bytes` values (torch._scaled_mm)."""
    return Kernel(name, KernelKind.GEMM, 2.0 * m * n * k, float(m * k + k * n + out_bytes * m * n),
                  m=m, n=n, k=k, fp8=True)


def float8_linear(name: str, tokens: int, n: int, k: int, *, bias: bool, value_bytes: int,
                  cast_input: bool = True, input_share: float = 1.0, grad_share: float = 1.0) -> Passes:
    """torchao Float8Linear with dynamic tensorwise scaling (torchao/float8/float8_linear.py,
    the recipe torchtitan's `float8` option enables): each GEMM operand is scaled by its
    absolute maximum and cast to fp8 first, an amax reduction (read the tensor) and a cast
    (read it, write 1-byte values, and a second 1-byte copy in the transposed layout where
    the backward GEMM needs it: Hopper fp8 GEMMs take only the TN layout). Forward: X and W;
    input gradient: dY (both layouts) and W transposed; weight gradient: X transposed. The
    GEMMs write `value_bytes` outputs (dW too: the gradient is kept in the weight's dtype).
    Linears that read the same input under torch.compile (q, k, v; gate and up) share its
    casts: Inductor eliminates the identical subexpressions (`cast_input` False)."""
    v = value_bytes

    def cast(what: str, elements: float, layouts: int = 1) -> Kernel:
        return memory(f"{name} {what} to fp8", (2 * v + layouts) * elements)
    forward: tuple[Kernel, ...] = (cast("X", input_share * tokens * k),) if cast_input else ()
    forward += (cast("W", n * k), fp8_gemm(name, tokens, n, k, v))
    backward_input = (cast("dY", grad_share * tokens * n, 2), cast("W^T", n * k),
                      fp8_gemm(f"{name} dX", tokens, k, n, v))
    backward_weight: tuple[Kernel, ...] = (cast("X^T", tokens * k),) if cast_input else ()
    backward_weight += (fp8_gemm(f"{name} dW", n, k, tokens, v),)
    if bias:
        backward_weight += (memory(f"{name} db", v * tokens * n),)
    return Passes(forward, backward_input, backward_weight)


def norm(name: str, elements: int, style: KernelStyle, rms: bool, value_bytes: int) -> Passes:
    """LayerNorm / RMSNorm over `elements` values: fused, read x and write y forward; read
    dy and x, write dx, plus the weight-gradient partial sums, backward. HF's RMSNorm runs
    its arithmetic as separate fp32 kernels (cast, pow, mean, rsqrt, multiply, cast and
    multiply: about 32 bytes per value forward, twice that backward)."""
    v = value_bytes
    if rms and style is KernelStyle.HF:
        fwd = tuple(memory(f"{name} {op}", nbytes * elements)
                    for op, nbytes in (("cast", v + 4), ("pow", 8), ("mean", 4), ("mul", 12), ("mul weight", 4 + 2 * v)))
        return Passes(fwd, tuple(memory(f"{k.name} dX", 2 * k.bytes) for k in fwd))
    return Passes((memory(name, 2 * v * elements),),
                  (memory(f"{name} dX", 3 * v * elements), memory(f"{name} dW", 2 * v * elements)))


def activation(name: str, elements: int, style: KernelStyle, gated: bool, gelu: bool, value_bytes: int) -> Passes:
    """The MLP's nonlinearity over `elements` outputs of its input projection: SwiGLU
    (silu(gate) * up) or GeLU. Megatron fuses it (with the bias) into one kernel each way;
    torch runs SiLU and the multiply apart; HF's GPT-2 GeLU is its tanh formula."""
    v = value_bytes
    if gated:
        if style in (KernelStyle.MEGATRON, KernelStyle.TORCH_COMPILE):
            return Passes((memory(f"{name} swiglu", 3 * v * elements),), (memory(f"{name} swiglu dX", 5 * v * elements),))
        return Passes((memory(f"{name} silu", 2 * v * elements), memory(f"{name} mul", 3 * v * elements)),
                      (memory(f"{name} mul dX", 4 * v * elements), memory(f"{name} silu dX", 3 * v * elements)))
    if gelu and style is KernelStyle.HF:
        steps = ("pow", "mul", "add", "mul", "tanh", "add", "mul")
        fwd = tuple(memory(f"{name} gelu {s}", 3 * v * elements) for s in steps)
        return Passes(fwd, tuple(memory(f"{name} gelu {s} dX", 4 * v * elements) for s in steps))
    return Passes((memory(f"{name} gelu", 2 * v * elements),), (memory(f"{name} gelu dX", 3 * v * elements),))


def residual(name: str, elements: int, style: KernelStyle, dropout: bool, value_bytes: int) -> Passes:
    """The branch output added to the residual stream (after dropout where the model uses
    it: GPT-style training): Megatron's fused bias-dropout-add is one kernel (read branch
    and residual, write the sum and a 1-byte mask); the others run dropout and the add
    apart. Backward: the mask applied to the gradient, and the two gradients summed."""
    v = value_bytes
    if style is KernelStyle.MEGATRON:
        mask = 1 if dropout else 0
        return Passes((memory(f"{name} bias-dropout-add", (3 * v + mask) * elements),),
                      (memory(f"{name} bias-dropout-add dX", (3 * v + mask) * elements),))
    fwd: tuple[Kernel, ...] = (memory(f"{name} add", 3 * v * elements),)
    bwd: tuple[Kernel, ...] = (memory(f"{name} add dX", 3 * v * elements),)
    if dropout:
        fwd = (memory(f"{name} dropout", (2 * v + 1) * elements),) + fwd
        bwd += (memory(f"{name} dropout dX", (2 * v + 1) * elements),)
    return Passes(fwd, bwd)


def rotary(name: str, elements: int, style: KernelStyle, value_bytes: int) -> Passes:
    """Rotary embedding of q and k (`elements` values): one fused kernel (Megatron / TE,
    torchtitan's complex multiply) or HF's rotate_half arithmetic (slice, negate,
    concatenate, two multiplies and an add: about six passes)."""
    v = value_bytes
    passes = 6 if style is KernelStyle.HF else 1
    fwd = tuple(memory(f"{name} rotary {i}", 2 * v * elements) for i in range(passes))
    return Passes(fwd, tuple(memory(f"{name} rotary dX {i}", 2 * v * elements) for i in range(passes)))


def attention(name: str, batch_heads: int, kv_heads: int, seq: int, head_dim: int, impl: AttentionImpl,
              style: KernelStyle, dropout: bool, value_bytes: int) -> Passes:
    """The attention core for `batch_heads` (micro-batch x heads per TP rank) heads of
    length `seq` (causal). Flash: one kernel each way. Unfused: QK^T and PV batched GEMMs
    around the softmax (Megatron: one fused scale-mask-softmax kernel; HF eager: scale,
    mask, fp32 softmax and casts apart), plus attention dropout where used."""
    v, s, d = value_bytes, seq, head_dim
    if impl is AttentionImpl.FLASH:
        fwd_flops = 0.5 * 4.0 * batch_heads * s * s * d
        io = v * s * d * (2 * batch_heads + 2 * kv_heads)
        return Passes((Kernel(name, KernelKind.ATTENTION, fwd_flops, io, seq=s),),
                      (Kernel(f"{name} backward", KernelKind.ATTENTION, 2.5 * fwd_flops, 2 * io, seq=s, backward=True),))
    scores = batch_heads * s * s
    softmax = (("scale-mask-softmax", 2 * v),) if style is KernelStyle.MEGATRON else \
        (("scale", 2 * v), ("mask", 2 * v), ("softmax fp32", v + 4 + 4), ("cast", 4 + v))
    drop = (("dropout", 2 * v + 1),) if dropout else ()
    fwd = (gemm(f"{name} QK^T", s, s, d, batch_heads, v),
           *(memory(f"{name} {op}", b * scores) for op, b in softmax + drop),
           gemm(f"{name} PV", s, d, s, batch_heads, v))
    bwd = (gemm(f"{name} dV", s, d, s, batch_heads, v), gemm(f"{name} dP", s, s, d, batch_heads, v),
           *(memory(f"{name} {op} dX", 3 * v * scores) for op, _ in drop + softmax),
           gemm(f"{name} dQ", s, d, s, batch_heads, v), gemm(f"{name} dK", s, d, s, batch_heads, v))
    return Passes(fwd, bwd)


def cross_entropy(name: str, tokens: int, vocab_shard: int, style: KernelStyle, value_bytes: int,
                  fused: bool = False) -> Passes:
    """The loss over the (vocab-parallel) logits in fp32: max, subtract, exp, sum, log and
    the target gather forward (about three fp32 passes and the upcast); softmax minus the
    one-hot target backward. HF upcasts the logits first (one more pass each way); Inductor
    fuses the forward into one pass over the logits (an online log-sum-exp). `fused`:
    flash-attn's Triton cross-entropy (flash_attn/losses/cross_entropy.py), one kernel each
    way over the 16-bit logits: the forward reads them and keeps the log-sum-exp per token,
    the backward reads them again and writes their gradient in their own type."""
    elements = tokens * vocab_shard
    if fused:
        return Passes((memory(f"{name} fused", value_bytes * elements),),
                      (memory(f"{name} fused dX", 2 * value_bytes * elements),))
    if style is KernelStyle.TORCH_COMPILE:
        fwd: tuple[Kernel, ...] = (memory(f"{name} fused", (value_bytes + 4) * elements),)
        return Passes(fwd, (memory(f"{name} softmax dX", (value_bytes + 4 + value_bytes) * elements),))
    passes = 4 if style is KernelStyle.HF else 3
    fwd = (memory(f"{name} upcast", (value_bytes + 4) * elements),
           *(memory(f"{name} softmax {i}", 8 * elements) for i in range(passes - 1)))
    return Passes(fwd, (memory(f"{name} softmax dX", 8 * elements), memory(f"{name} cast dX", (4 + value_bytes) * elements)))


def embedding(name: str, tokens: int, hidden: int, table_rows: int, value_bytes: int) -> Passes:
    """Gather forward (read and write the token rows); backward zero the table's gradient
    and scatter-add the rows into it."""
    rows = value_bytes * tokens * hidden
    return Passes((memory(name, 2 * rows),),
                  (memory(f"{name} dW zero", value_bytes * table_rows * hidden), memory(f"{name} dW scatter", 3 * rows)))
