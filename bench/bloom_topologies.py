"""Benchmark: BigScience's BLOOM topology table of 2022-02-25, simulated with the shipped
hardware files, nothing fitted to the rows it adds.

The chronicles (bigscience-workshop/bigscience, train/tr11-176B-ml/chronicles-prequel.md,
"GBS Variations" and "some more configs with lower PP") timed the 181B candidate
(NLAYERS 72, NHIDDEN 14336, NHEADS 64) on 48 Jean Zay nodes (8 x A100 80 GB, 4 x 100 Gb/s
Omni-Path) at TP 8 with Megatron-DeepSpeed's PipelineEngine and ZeRO-1, in fp16, at
several DP x PP splits, micro-batches and global batches: one snapshot of the second
iteration each. Four of those rows are in the shared calibration table (VP462, VP465,
VP468, VP471); this script builds all ten from VP465's cells with the table's split,
micro-batch, global batch and seconds per iteration, so the rows can be read against each
other: the same layout at two global batches, or two micro-batches at one global batch.

Run: python bench/bloom_topologies.py [CSV]. Needs ../shared/validation; about 20 seconds.
"""

from __future__ import annotations

from published_baseline import calibration_table, template_rows

from sim.core.errors import InputError
from sim.simulate import simulate
from sim.studies.published import row_from_fields

TEMPLATE = "VP465"   # the table's DP4 TP8 PP12 MBS4 GBS1568 row: model, cluster, engine, precision
# (dp, pp, micro-batch, global batch, seconds per iteration, id in the shared table or "")
TABLE = [(8, 6, 4, 1568, 113.01, "VP462"), (8, 6, 4, 2048, 114.11, ""), (8, 6, 6, 2016, 123.57, ""),
         (4, 12, 4, 1568, 92.75, "VP465"), (4, 12, 4, 2048, 117.07, ""), (4, 12, 2, 1568, 99.93, ""),
         (4, 12, 2, 2048, 128.82, "VP468"), (6, 8, 4, 2016, 113.16, ""), (12, 4, 2, 2016, 125.52, ""),
         (12, 4, 4, 2016, 114.81, "VP471")]


def fields(base: dict[str, str], dp: int, pp: int, micro: int, batch: int, seconds: float) -> dict[str, str]:
    return {**base, "dp": str(dp), "pp": str(pp), "micro_batch": str(micro), "global_batch": str(batch),
            "value": str(seconds), "derived": ""}


def main() -> None:
    base = template_rows(calibration_table(__doc__), {TEMPLATE})[TEMPLATE]
    print("| DP | PP | micro | batch | pipeline slots | published s | simulated s | error | row |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for dp, pp, micro, batch, seconds, row_id in TABLE:
        row = row_from_fields(fields(base, dp, pp, micro, batch, seconds))
        slots = batch // (dp * micro) + pp - 1
        if row.scenario is None or row.measured_step_s is None:
            print(f"| {dp} | {pp} | {micro} | {batch} | {slots} | {seconds} | {row.reason[:80]} | | {row_id} |")
            continue
        try:
            step = simulate(row.scenario).step_time_s
        except InputError as e:
            print(f"| {dp} | {pp} | {micro} | {batch} | {slots} | {seconds} | refused ({e.problem[:60]}) | | {row_id} |")
            continue
        print(f"| {dp} | {pp} | {micro} | {batch} | {slots} | {seconds} | {step:.1f} "
              f"| {100 * (step / seconds - 1):+.1f}% | {row_id} |", flush=True)


if __name__ == "__main__":
    main()
