"""Rank placement on TP x PP x DP axes, process groups, and the links a group crosses.

Megatron-LM's order (megatron/core/parallel_state.py): tensor-parallel ranks are
adjacent (inside a node), then data-parallel, then pipeline stages:
rank = pp_i * (dp * tp) + dp_i * tp + tp_i; node = rank // gpus_per_node.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from sim.core.enums import Axis


@dataclass(frozen=True, slots=True)
class Coords:
    dp: int
    pp: int
    tp: int


@dataclass(frozen=True)
class Layout:
    """Where every rank sits and which ranks form each group."""

    tp: int
    pp: int
    dp: int
    gpus_per_node: int
    shard: int = 0      # HSDP: data-parallel ranks per shard group (0: all of them)
    post: int = 0       # FSDP2 int reshard_after_forward: ranks per post-forward group (0: the shard group)

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def nodes(self) -> int:
        return -(-self.world_size // self.gpus_per_node)

    def rank(self, c: Coords) -> int:
        return c.pp * self.dp * self.tp + c.dp * self.tp + c.tp

    def coords(self, rank: int) -> Coords:
        return Coords(dp=rank // self.tp % self.dp, pp=rank // (self.dp * self.tp), tp=rank % self.tp)

    def node(self, rank: int) -> int:
        return rank // self.gpus_per_node

    @cached_property
    def _groups(self) -> dict[tuple[Axis, int], tuple[tuple[int, ...], tuple[int, int]]]:
        return {}

    def group(self, axis: Axis, rank: int) -> tuple[int, ...]:
        """The ranks of `rank`'s group along `axis`, in axis order (built once per rank and
        axis: a data-parallel group can hold a million ranks)."""
        return self._group_and_span(axis, rank)[0]

    def group_span(self, axis: Axis, rank: int) -> tuple[int, int]:
        """`span` of `rank`'s group along `axis`, computed once."""
        return self._group_and_span(axis, rank)[1]

    def _group_and_span(self, axis: Axis, rank: int) -> tuple[tuple[int, ...], tuple[int, int]]:
        key = (axis, rank)
        if key not in self._groups:
            members = self._build_group(axis, rank)
            self._groups[key] = (members, self.span(members))
        return self._groups[key]

    def _build_group(self, axis: Axis, rank: int) -> tuple[int, ...]:
        c = self.coords(rank)
        if axis is Axis.TP:
            return tuple(self.rank(Coords(c.dp, c.pp, t)) for t in range(self.tp))
        if axis is Axis.DP:
            return tuple(self.rank(Coords(d, c.pp, c.tp)) for d in range(self.dp))
        if axis in (Axis.DP_NODE, Axis.DP_ACROSS):
            return self._dp_split(axis, rank)
        if axis in (Axis.DP_SHARD, Axis.DP_REPLICATE, Axis.DP_POST):
            return self._dp_mesh(axis, c)
        return tuple(self.rank(Coords(c.dp, p, c.tp)) for p in range(self.pp))

    def _dp_mesh(self, axis: Axis, c: Coords) -> tuple[int, ...]:
        """FSDP2's 2D data-parallel mesh (replicate, shard), shard fastest as
        `init_device_mesh` lays it out: the shard group is `shard` consecutive data-parallel
        ranks, the replicate group the ranks at the same place of every shard group; the
        post-forward group `post` consecutive ranks of the shard group."""
        size = self.shard or self.dp
        if axis is Axis.DP_REPLICATE:
            places = range(c.dp % size, self.dp, size)
        else:
            width = (self.post or size) if axis is Axis.DP_POST else size
            start = c.dp // width * width
            places = range(start, start + width)
        return tuple(self.rank(Coords(d, c.pp, c.tp)) for d in places)

    def _dp_split(self, axis: Axis, rank: int) -> tuple[int, ...]:
        """The data-parallel group cut by node: the members on `rank`'s node (DP_NODE), or the
        members that sit at `rank`'s place among their node's members (DP_ACROSS)."""
        members = self._build_group(Axis.DP, rank)
        by_node: dict[int, list[int]] = {}
        for r in members:
            by_node.setdefault(self.node(r), []).append(r)
        if axis is Axis.DP_NODE:
            return tuple(by_node[self.node(rank)])
        place = by_node[self.node(rank)].index(rank)
        return tuple(group[place] for _, group in sorted(by_node.items()) if place < len(group))

    def groups(self, axis: Axis) -> list[tuple[int, ...]]:
        """Every group along `axis`, each once, ordered by its first rank."""
        seen: dict[int, tuple[int, ...]] = {}
        for r in range(self.world_size):
            g = self._build_group(axis, r)
            seen.setdefault(g[0], g)
        return [seen[k] for k in sorted(seen)]

    def span(self, members: tuple[int, ...]) -> tuple[int, int]:
        """(nodes the group touches, most members on one node)."""
        per_node: dict[int, int] = {}
        for r in members:
            per_node[self.node(r)] = per_node.get(self.node(r), 0) + 1
        return len(per_node), max(per_node.values())

    @cached_property
    def representatives(self) -> tuple[int, ...]:
        """One rank per equivalence class: TP and DP peers are symmetric, pipeline stages are
        not, so the class of a rank is its pipeline stage; the representative is the rank
        with dp = tp = 0 of each stage."""
        return tuple(self.rank(Coords(0, p, 0)) for p in range(self.pp))

    def class_of(self, rank: int) -> int:
        """Equivalence class (= pipeline stage) of a rank."""
        return self.coords(rank).pp
