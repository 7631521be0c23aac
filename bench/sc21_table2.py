"""Benchmark: SC21's ZeRO-3 against PTD-P (Narayanan et al., arXiv 2104.04473, Table 2),
simulated with the shipped hardware files, nothing fitted to it.

Table 2 measured DeepSpeed ZeRO-3 (no model parallelism) and Megatron's PTD-P on Selene
(DGX A100 80 GB, 8 x 200 Gb/s HDR per node) at a fixed global batch while the GPU count
doubles; ZeRO-3's TFLOP/s per GPU fell from 144 to 88 to 44 (175B) while PTD-P's stayed
near 150. Two of its rows are in the shared calibration table (VP011 ZeRO-3 at 384 GPUs,
VP014 at 640; VP017 and VP020 for PTD-P); this script builds all twelve from those rows'
cells with the GPU count, micro-batch, batch and TFLOP/s of Table 2, and simulates ZeRO-3
both as current DeepSpeed runs it and as the 2021 release the paper used ran it
(`[zero] deepspeed_version = "0.5"`: sim.engines.deepspeed_zero3_v05).

Run: python bench/sc21_table2.py [CSV]. Needs ../shared/validation; about a minute.
"""

from __future__ import annotations

from dataclasses import replace

from published_baseline import calibration_table, template_rows

from sim.core.errors import InputError
from sim.inputs.zero_config import CURRENT_VERSION, LEGACY_VERSION
from sim.simulate import simulate
from sim.studies.published import row_from_fields

# (scheme, template row, GPUs, micro-batch, global batch, TFLOP/s per GPU): SC21 Table 2
TABLE2 = [("ZeRO-3", "VP011", 384, 4, 1536, 144), ("ZeRO-3", "VP011", 768, 2, 1536, 88),
          ("ZeRO-3", "VP011", 1536, 1, 1536, 44), ("ZeRO-3", "VP014", 640, 4, 2560, 138),
          ("ZeRO-3", "VP014", 1120, 2, 2240, 98), ("ZeRO-3", "VP014", 2240, 1, 2240, 48),
          ("PTD-P", "VP017", 384, 1, 1536, 153), ("PTD-P", "VP017", 768, 1, 1536, 149),
          ("PTD-P", "VP017", 1536, 1, 1536, 141), ("PTD-P", "VP020", 560, 1, 2240, 171),
          ("PTD-P", "VP020", 1120, 1, 2240, 167), ("PTD-P", "VP020", 2240, 1, 2240, 159)]


def fields(base: dict[str, str], gpus: int, micro: int, batch: int, tflops: float) -> dict[str, str]:
    tp, pp = int(base["tp"] or 1), int(base["pp"] or 1)
    return {**base, "total_gpus": str(gpus), "nodes": str(gpus // 8), "dp": str(gpus // (tp * pp)),
            "micro_batch": str(micro), "global_batch": str(batch), "value": str(tflops), "derived": ""}


def simulated(scenario, legacy: bool) -> str:
    """The step as DeepSpeed v0.5 (`legacy`) or the current release runs it (the harness
    maps 2021 rows to v0.5: both are set here)."""
    if scenario.zero is not None:
        version = LEGACY_VERSION if legacy else CURRENT_VERSION
        scenario = replace(scenario, zero=replace(scenario.zero, deepspeed_version=version))
    try:
        return f"{simulate(scenario).step_time_s:.1f}"
    except InputError as e:
        return f"refused ({e.problem[:60]})"


def main() -> None:
    base = template_rows(calibration_table(__doc__), {t[1] for t in TABLE2})
    print("| scheme | model | GPUs | micro | batch | published TFLOP/s | published s | current DeepSpeed s "
          "| DeepSpeed 0.5 s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for scheme, template, gpus, micro, batch, tflops in TABLE2:
        row = row_from_fields(fields(base[template], gpus, micro, batch, tflops))
        if row.scenario is None or row.measured_step_s is None:
            print(f"| {scheme} | {row.model} | {gpus} | {micro} | {batch} | {tflops} | - | {row.reason[:80]} | |")
            continue
        now = simulated(row.scenario, legacy=False)
        old = simulated(row.scenario, legacy=True) if scheme == "ZeRO-3" else ""
        print(f"| {scheme} | {row.model} | {gpus} | {micro} | {batch} | {tflops} | {row.measured_step_s:.1f} "
              f"| {now} | {old} |")


if __name__ == "__main__":
    main()
