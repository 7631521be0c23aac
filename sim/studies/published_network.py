"""The inter-node network of a published row: the one it states, simulated; or, where its
network cell states nothing, whether that unknown decides the step.

- Stated (`stated_network`): "8x200 Gb/s", "4 x 100 Gbps Omni-Path per node", "2 Tb/s
  RoCE", "400 Gb/s per GPU", "100 Gbps per node" give NICs x Gb/s per node. When that
  differs from the catalog cluster's by more than 10%, the row is simulated on the
  catalog's node with the stated NICs (`with_network`: the NIC count and rate replaced,
  the cluster's fitted efficiency and latency kept: one value per cluster file). BLOOM's
  Jean Zay (4 x 100 Gb/s Omni-Path) is a quarter of a DGX A100's 8 x 200 Gb/s HDR.
- A cell that states a figure as a presumption ("not stated (DGX A100: 8x200 Gb/s HDR IB
  nominal)") is read the same way: the table's own presumption.
- Unknown (`network_unknown`): the cell is blank or says only that it is not stated, and
  the row spans nodes. `network_bracket` simulates such a row twice, on one NIC per node of
  the catalog's kind (the ZeRO++ paper's low-bandwidth runs: 1 of a DGX-2's 8 IB links) and
  on the catalog's full complement; when the slower is more than `DECIDES` times the faster,
  the unknown alone moves the prediction by more than the fidelity target's 25%, and the
  row cannot judge the clock: it is reported with its bracket, outside the error statistics
  and the fit. The test never looks at the published value.
"""

from __future__ import annotations

import re
from dataclasses import replace

from sim.core.specs import ClusterSpec
from sim.des.engine import Mode
from sim.inputs.scenario import Scenario
from sim.simulate import simulate
from sim.studies.published_cells import quote, states_nothing

DECIDES = 1.25          # slower / faster prediction beyond which the unknown network decides the step
TOLERANCE = 0.10        # a stated network within 10% of the catalog's is the catalog's


def stated_network(text: str, gpus_per_node: int) -> tuple[int, float] | None:
    """(NICs per node, Gb/s per NIC) a cell states, or None when it gives no figure.
    A per-node total without a NIC count keeps the NIC count unknown (0)."""
    t = " ".join(text.split())
    if m := re.search(r"(\d+)\s*x\s*([\d.]+)\s*Gb(?:/s|ps)", t):
        return int(m.group(1)), float(m.group(2))
    if m := re.search(r"([\d.]+)\s*Tb(?:/s|ps)", t):
        return 0, float(m.group(1)) * 1000
    if m := re.search(r"([\d.]+)\s*Gb(?:/s|ps)\)?\s*per\s*GPU", t, re.I):
        return gpus_per_node, float(m.group(1))
    if m := re.search(r"([\d.]+)\s*Gb(?:/s|ps)\)?\s*per\s*node", t, re.I):
        return 0, float(m.group(1))
    return None


def node_gbps(cluster: ClusterSpec) -> float:
    """The catalog cluster's NICs x line rate per node, Gb/s."""
    return cluster.node.nics_per_node * cluster.inter_node.bandwidth * 8 / 1e9


def with_network(s: Scenario, nics: int, gbps: float) -> Scenario:
    """`s` on its cluster's node with `nics` NICs of `gbps` each (`nics` 0: the catalog's
    NIC count sharing `gbps` per node)."""
    c = s.cluster
    count = nics or c.node.nics_per_node
    per_nic = gbps if nics else gbps / count
    cluster = replace(c, node=replace(c.node, nics_per_node=count),
                      inter_node=replace(c.inter_node, bandwidth=per_nic * 1e9 / 8))
    return replace(s, cluster=cluster)


def apply_stated(text: str, s: Scenario, notes: list[str]) -> Scenario:
    """`s` with the row's stated network when it differs from the catalog's by more than
    `TOLERANCE` (noted); else `s`."""
    stated = stated_network(text, s.gpus_per_node)
    if stated is None or s.nodes <= 1:
        return s
    nics, gbps = stated
    row = (nics or 1) * gbps
    ours = node_gbps(s.cluster)
    if abs(row / ours - 1) <= TOLERANCE:
        return s
    notes.append(f"inter-node network {quote(text, 50)}: {row:g} Gb/s per node simulated "
                 f"(the catalog {s.cluster.name} has {ours:g})")
    return with_network(s, nics, gbps)


def network_unknown(text: str, s: Scenario) -> bool:
    """The row spans nodes and its network cell gives no figure at all."""
    return s.nodes > 1 and states_nothing(text) and stated_network(text, s.gpus_per_node) is None


def network_bracket(s: Scenario) -> tuple[float, float]:
    """(step on one NIC per node, step on the catalog's NICs), seconds (representative
    DES, one step)."""
    low = with_network(s, 1, s.cluster.inter_node.bandwidth * 8 / 1e9)
    return (simulate(low, steps=1, mode=Mode.REPRESENTATIVE).step_time_s,
            simulate(s, steps=1, mode=Mode.REPRESENTATIVE).step_time_s)


def undetermined_reason(s: Scenario, measured: float | None) -> str | None:
    """The reason a row with an unknown network cannot judge the clock, with its bracket,
    or None when the network does not decide its step (or the row cannot be simulated)."""
    try:
        slow, fast = network_bracket(s)
    except Exception:      # the row's own simulation reports it later
        return None
    if slow <= DECIDES * fast:
        return None
    inside = "" if measured is None else \
        f"; published {measured:.4g} s, {'inside' if fast <= measured <= slow else 'outside'} that range"
    return (f"inter-node network not stated, and it decides the step: {fast:.4g} s on the catalog's "
            f"{s.cluster.node.nics_per_node} NICs per node, {slow:.4g} s on one{inside}")
