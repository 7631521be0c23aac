"""What DeepSpeed ZeRO-3 keeps resident per rank (stage3.py, partition_parameters.py): the
16-bit parameter partition (each tensor padded to a multiple of dp), the persistent
parameters in full, the gradient partition and fp32 master + Adam states, or, with
offload, the host-side (pinned or pageable) and NVMe-side copies and swap buffers
(ZeRO-Offload, ZeRO-Infinity); LoRA's frozen base without gradient or optimizer state; the
IPG bucket; ZeRO++ hpZ's secondary partition (sim.engines.resident has the other engines')."""

from __future__ import annotations

from dataclasses import replace

from sim.analytic.comm import tensor_padded
from sim.analytic.placement import TensorGroup, trainable
from sim.core.enums import OffloadDevice
from sim.engines.offload import cpu_share, sub_groups
from sim.engines.resident import Resident, half_bytes, resident
from sim.engines.schedule import Alloc, Mem
from sim.engines.zeropp import ZeroPlusPlus
from sim.inputs.scenario import Scenario


def zero3_resident(s: Scenario, census: list[TensorGroup]) -> Resident:
    z, h, dp = s.zero, half_bytes(s), s.parallel.dp
    assert z is not None
    every = sum(tensor_padded(g.numel, dp) * g.count for g in census) / dp
    shard = sum(tensor_padded(g.numel, dp) * g.count for g in trainable(census)) / dp   # the optimizer's
    frozen = every - shard      # LoRA's frozen base: partitioned and gathered, no gradient or optimizer state
    device: list[Alloc] = []
    host: list[Alloc] = []
    params = [Alloc(Mem.PARAMS, "16-bit parameter partition", h * shard),
              Alloc(Mem.PARAMS, "frozen base partition (LoRA)", h * frozen)]
    par = z.offload_param
    if par.device is OffloadDevice.NVME:     # ZeRO-Infinity: on NVMe, through pinned swap buffers
        host += [replace(a, category=Mem.NVME, label=f"{a.label} (NVMe)") for a in params]
        host.append(Alloc(Mem.PARAMS, "pinned parameter swap buffers", par.buffer_count * par.buffer_size * h))
    elif par.enabled:
        host += [replace(a, label=f"{a.label} ({'pinned' if par.pin_memory else 'pageable'})") for a in params]
    else:
        device += params
    device.append(Alloc(Mem.PARAMS, "persistent parameters", h * persistent_numel(s, census)))
    if z.offload_optimizer.enabled:
        opt = z.offload_optimizer
        on_cpu = cpu_share(shard, z.sub_group_size, opt.ratio) * shard
        pinned = "pinned" if opt.pin_memory else "pageable"
        if opt.device is OffloadDevice.NVME:   # swapped per sub-group through buffer_count pinned buffers
            host += [Alloc(Mem.NVME, "fp32 master, Adam m and v, fp32 gradients (NVMe)", 16.0 * on_cpu),
                     Alloc(Mem.OPTIMIZER, "pinned optimizer swap buffers",      # buffer_count fp32 buffers of the
                           opt.buffer_count * 4.0 * max(sub_groups(on_cpu, z.sub_group_size)))]   # largest sub-group
        else:
            host.append(Alloc(Mem.OPTIMIZER, f"fp32 master, Adam m and v, fp32 gradients ({pinned})", 16.0 * on_cpu))
        # stage3.py: with the optimizer offloaded `self.device` is the CPU, so the 16-bit
        # gradient partitions (grad_partitions_flat_buffer) live there, whatever the ratio
        host.append(Alloc(Mem.GRADS, f"16-bit gradient partition buffer ({pinned})", h * shard))
        if s.training.delayed_parameter_update:
            host.append(Alloc(Mem.GRADS, "second fp32 gradient partition (delayed update)", 4.0 * on_cpu))
        device += [Alloc(Mem.OPTIMIZER, "fp32 master, Adam m and v, fp32 gradients of the GPU sub-groups",
                         16.0 * (shard - on_cpu))]
    else:
        device += [Alloc(Mem.GRADS, "16-bit gradient partition", h * shard),
                   Alloc(Mem.OPTIMIZER, "fp32 master parameters", 4.0 * shard),
                   Alloc(Mem.OPTIMIZER, "Adam m and v", 8.0 * shard)]
    device.append(Alloc(Mem.BUFFERS, "IPG bucket", h * z.reduce_bucket_size))
    if z.zero_hpz_partition_size > 1:     # ZeRO++ hpZ: every partitioned parameter's secondary partition
        partitioned = every * dp - persistent_numel(s, census)
        device.append(Alloc(Mem.PARAMS, "hpZ secondary partition", ZeroPlusPlus.of(z, h).secondary_bytes(
            partitioned, z.zero_hpz_partition_size)))
    return resident(s, device, host)


def persistent_numel(s: Scenario, census: list[TensorGroup]) -> int:
    """ZeRO-3's persistent tensors (`ds_persist`): numel <= param_persistence_threshold,
    in forward order while the running total stays <= model_persistence_threshold (when
    that cap binds, a loop over the blocks, over their small tensors only)."""
    z = s.zero
    assert z is not None
    small = [g for g in census if g.numel <= z.param_persistence_threshold]
    everything = sum(g.numel * g.count for g in small)
    if everything <= z.model_persistence_threshold:
        return everything
    inside = [i for i, g in enumerate(census) if g.in_block]
    first, last = (inside[0], inside[-1]) if inside else (len(census), len(census) - 1)
    block = [g.numel for g in census[first:last + 1] if g in small]
    order = ([g.numel for g in census[:first] if g in small]
             + block * (census[first].count if inside else 0)
             + [g.numel for g in census[last + 1:] if g in small])
    total = 0
    for numel in order:
        if total + numel <= z.model_persistence_threshold:
            total += numel
    return total
