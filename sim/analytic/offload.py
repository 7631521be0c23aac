"""ZeRO-Offload: PCIe traffic, CPU-Adam time, and the work needed to hide them.

ZeRO-Offload (Ren et al., arXiv 2101.06840 Sec. 4): per step each GPU sends its fp16
gradient partition to the host (2 Psi/N bytes), the CPU runs Adam on Psi/N parameters,
and the fp16 parameters come back (2 Psi/N). Both costs grow with Psi, while GPU work
grows with Psi x tokens, so the tokens per GPU per step needed to hide them do not
depend on the model size (reference/000 Sec. 4.4).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class OffloadStep:
    """Seconds per optimizer step of the offload path on one GPU."""

    d2h: float
    cpu_adam: float
    h2d: float

    @property
    def serial(self) -> float:
        """D2H, then CPU-Adam, then H2D, one after the other."""
        return self.d2h + self.cpu_adam + self.h2d


def offload_transfer_bytes(n_params: float, bytes_per_element: int = 2) -> float:
    """PCIe bytes per step: gradients down + parameters up = 2 x Psi x 2 B = 4 Psi.

    7B: 28 GB, 1.12 s at 25 GB/s (reference/000 exercise 9).
    """
    return 2.0 * n_params * bytes_per_element


def offload_step_time(params_per_gpu: float, *, pcie_bandwidth: float,
                      cpu_adam_params_per_s: float, bytes_per_element: int = 2) -> OffloadStep:
    """Times of the three offload phases for one GPU's partition. `cpu_adam_params_per_s`
    is the CPU-Adam rate available to this GPU (the node's rate / GPUs sharing it)."""
    one_way = params_per_gpu * bytes_per_element / pcie_bandwidth
    return OffloadStep(d2h=one_way, cpu_adam=params_per_gpu / cpu_adam_params_per_s, h2d=one_way)


def tokens_to_hide_offload(*, cpu_adam_params_per_s: float, pcie_bandwidth: float,
                           peak_flops: float, mfu: float, bytes_per_element: int = 2) -> float:
    """Tokens per GPU per step whose 6 Psi FLOPs take as long as the offload path.

    offload seconds per parameter = 1/rate + 2 x 2 B / PCIe; GPU seconds per parameter
    per token = 6 / (peak x MFU). 1.5 G params/s, 25 GB/s, A100 312 TFLOPS at 40%:
    about 17K tokens (reference/000 Sec. 4.4).
    """
    offload_per_param = 1.0 / cpu_adam_params_per_s + 2 * bytes_per_element / pcie_bandwidth
    gpu_per_param_token = 6.0 / (peak_flops * mfu)
    return offload_per_param / gpu_per_param_token


def dpu_step_time(gpu_step_s: float, offload: OffloadStep) -> float:
    """One-step delayed parameter update (ZeRO-Offload Sec. 5.2): the CPU update of step
    t overlaps the GPU work of step t+1, so T = max(T_gpu, D2H + CPU-Adam + H2D)."""
    return max(gpu_step_s, offload.serial)
