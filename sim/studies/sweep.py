"""`zerosim sweep`: simulate the product of scenario-key values and return one tidy table.

Keys are named as in scenario files, dotted (`nodes`, `zero.stage`, `training.micro_batch`,
`parallel.tp`, `comm.busbw_GBps.dp`). Each variant is the scenario's own table with those
keys set, read again by the same loader as a file (`sim.inputs.load.scenario_from_table`),
so a variant that a file could not hold (tp not dividing the heads, batch sizes that do not
add up, a key that is not simulated) is kept as a row with its reason instead of a result,
and a variant that does not fit keeps its numbers with `fits` false. The points run in
parallel with joblib on the local cores (processes), each one a plain function of its
inputs: the table is the same whatever the number of workers and whatever the order they
finish in.
"""

from __future__ import annotations

import copy
import itertools
import os
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from sim.core.errors import InputError, one_line
from sim.inputs.load import scenario_from_table
from sim.inputs.reading import parse_toml, read_text
from sim.inputs.scenario import Scenario
from sim.simulate import simulate
from sim.studies.fit_report import engine_label

# the results-contract fields each row carries, flattened ("time.compute_s" -> "compute_s")
FIELDS = ("step_time_s", "tokens_per_s", "tflops_per_gpu", "hw_tflops_per_gpu", "mfu", "bound", "fits")
TIME_FIELDS = ("compute_s", "exposed_comm_s", "exposed_offload_s", "bubble_s", "optimizer_s", "exposed_host_s")
MEMORY_FIELDS = ("peak_bytes", "params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes",
                 "buffers_bytes", "fits_device", "host_bytes_per_node", "fits_host")
MAX_POINTS = 10_000


def parse_vary(text: str, source: str = "--vary") -> tuple[str, list[Any]]:
    """'KEY=V1,V2,...' -> (KEY, values); each value read as a TOML value (5e8, true, "cpu",
    or a bare word as a string)."""
    key, sep, values = text.partition("=")
    key = key.strip()
    if not sep or not key or not values.strip():
        raise InputError(source, text, "expected KEY=V1,V2,... (e.g. zero.stage=1,2,3)")
    if not all(part.isidentifier() for part in key.split(".")):
        raise InputError(source, key, "a scenario key is dotted names, e.g. training.micro_batch")
    return key, [_value(v.strip(), source, key) for v in values.split(",")]


def _value(text: str, source: str, key: str) -> Any:
    if not text:
        raise InputError(source, key, "an empty value; expected KEY=V1,V2,...")
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text            # a bare word: a string (cpu, fsdp2, dgx-h100)


def variant(raw: Mapping[str, Any], assignment: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of the scenario table with each dotted key set (its tables made as needed)."""
    table = copy.deepcopy(dict(raw))
    for key, value in assignment.items():
        *path, last = key.split(".")
        here = table
        for part in path:
            nxt = here.get(part)
            if not isinstance(nxt, dict):
                nxt = here[part] = {}
            here = nxt
        here[last] = value
    return table


def points(vary: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """The product of the values, in the order the keys and values were given."""
    keys = list(vary)
    product = list(itertools.product(*(vary[k] for k in keys)))
    if len(product) > MAX_POINTS:
        raise InputError("--vary", keys[0], f"{len(product):,} points; allowed: at most {MAX_POINTS:,}")
    return [dict(zip(keys, combo, strict=True)) for combo in product]


def run_point(raw: Mapping[str, Any], source: Path, name: str, assignment: Mapping[str, Any]) -> dict[str, Any]:
    """One row: the varied keys, then the results-contract fields, or the reason it has none."""
    row: dict[str, Any] = dict(assignment)
    try:
        result = simulate(scenario_from_table(variant(raw, assignment), source, name))
    except InputError as error:
        return {**row, "feasible": False, "reason": one_line(str(error))}
    report = result.to_json()
    s = result.scenario
    row.update(describe(s))
    row.update({f: report[f] for f in FIELDS})
    row.update({f: report["time"][f] for f in TIME_FIELDS})
    row.update({f: report["memory"][f] for f in MEMORY_FIELDS})
    reason = "" if result.fits else _not_fitting(report)
    return {**row, "feasible": True, "reason": reason}


def describe(s: Scenario) -> dict[str, Any]:
    """What a point is, whatever was varied: GPUs, engine (and ZeRO stage), tp/pp/dp layout,
    micro-batch and tokens per GPU per optimizer step (the columns the plots group by)."""
    p, t = s.parallel, s.training
    return {"gpus": s.world_size, "strategy": engine_label(s), "layout": f"{p.tp}/{p.pp}/{p.dp}",
            "micro_batch": t.micro_batch, "tokens_per_gpu": t.global_batch * t.seq_len / s.world_size}


def _not_fitting(report: Mapping[str, Any]) -> str:
    mem = report["memory"]
    if not mem["fits_device"]:
        oom = mem["out_of_memory"]
        return f"does not fit: {oom['allocating']} ({oom['bytes'] / 1e9:.2f} GB) with {oom['in_use_bytes'] / 1e9:.2f} GB in use"
    if not mem["fits_host"]:
        return f"does not fit in host memory: {mem['host_bytes_per_node'] / 1e9:.1f} GB per node"
    return "does not fit on NVMe"


BACKENDS = ("joblib", "dask")


def sweep(scenario: str | Path, vary: Mapping[str, Sequence[Any]], *, jobs: int | None = None,
          progress: Callable[[Iterable[Any], int], Iterable[Any]] | None = None, backend: str = "joblib",
          address: str | None = None) -> pd.DataFrame:
    """Simulate every point of the product of `vary` (dotted scenario keys -> values) for the
    scenario file `scenario`; one row per point, in product order. `jobs`: worker processes
    (default: the machine's cores; 1 with joblib runs in this process); `progress`: wraps the
    stream of finished points (e.g. a tqdm bar). `backend`: joblib on the local cores, or
    Dask (`pip install 'zerosim[dask]'`): the scheduler at `address`, or a local cluster of
    `jobs` worker processes. The table is the same whatever the backend."""
    if backend not in BACKENDS:
        raise InputError("--backend", backend, f"not supported yet; allowed: {', '.join(BACKENDS)}")
    path = Path(scenario)
    raw = parse_toml(read_text(path), path)
    todo = points(vary)
    workers = jobs or os.cpu_count() or 1
    calls = [(raw, path, path.stem, p) for p in todo]
    if backend == "dask":
        return pd.DataFrame(_on_dask(calls, workers, address, progress))
    if workers == 1 or len(todo) == 1:
        rows: Iterable[Any] = (run_point(*call) for call in calls)
    else:
        from joblib import Parallel, delayed  # joblib's process pool (loky)
        parallel = Parallel(n_jobs=min(workers, len(todo)), return_as="generator")
        rows = parallel(delayed(run_point)(*call) for call in calls)
    if progress is not None:
        rows = progress(rows, len(todo))
    return pd.DataFrame(list(rows))


def _on_dask(calls: list[tuple[Any, ...]], workers: int, address: str | None,
             progress: Callable[[Iterable[Any], int], Iterable[Any]] | None) -> list[dict[str, Any]]:
    """The points as Dask futures, collected in product order."""
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise InputError("--backend", "dask", "needs dask.distributed; allowed: pip install 'zerosim[dask]', "
                         "or --backend joblib") from None
    cluster = None if address else LocalCluster(n_workers=min(workers, len(calls)), threads_per_worker=1,
                                                processes=True, dashboard_address=None)
    try:
        with Client(address or cluster) as client:
            futures = [client.submit(run_point, *call, pure=False) for call in calls]
            done: Iterable[Any] = (f.result() for f in futures)
            if progress is not None:
                done = progress(done, len(calls))
            return list(done)
    finally:
        if cluster is not None:
            cluster.close()
