"""Benchmark: DeepSpeed's pipeline schedule against the 1F1B the simulator replays.

The simulator replays every pipeline (Megatron-LM and DeepSpeed's PipelineEngine alike) as
1F1B with non-blocking sends: a stage sends as soon as its pass ends and never waits for
its neighbour. DeepSpeed runs it differently (deepspeed/runtime/pipe/schedule.py
`TrainSchedule`, pipe/engine.py, pipe/p2p.py):

- 2 (m + p - 1) steps; in each, even stages run a forward and odd stages a backward, or
  the other way round (`_step_to_micro_batch`); a step whose micro-batch is out of range
  does nothing.
- A pass's output leaves one step later: a forward step runs RecvActivation, then
  SendGrad of the previous (backward) step's gradient; a backward step runs
  SendActivation of the previous (forward) step's output, then RecvGrad.
- Sends and receives are blocking (`dist.send` / `dist.recv`): the compute stream waits
  until the pair has met and the transfer has ended.

This script plays both schedules on an idealised pipeline (forward F = 1, backward with
full recompute B = 3, every transfer c, no other cost) for the layouts of the DeepSpeed
PipelineEngine rows in docs/fidelity.md and prints DeepSpeed's time over 1F1B's. It is an
estimate of what the simulator leaves out, not a simulation: the DES does not replay
DeepSpeed's instruction order yet (docs/cost-models.md, approximations).

Run: python bench/deepspeed_pipe_schedule.py   (a second)
"""

from __future__ import annotations

from collections.abc import Iterator

FORWARD, BACKWARD = 1.0, 3.0          # a stage's passes, with full activation recompute

# (row, pp, micro-batches per pipeline), from docs/fidelity.md: global / (micro x dp)
LAYOUTS = [("VP461", 12, 128), ("VP462", 6, 49), ("VP465", 12, 98), ("VP468", 12, 256), ("VP471", 4, 42),
           ("VP477", 6, 32), ("VP483", 24, 128), ("VP486", 12, 128), ("VP489", 12, 64), ("VP494", 35, 240)]


def deepspeed_instructions(stages: int, micro: int, stage: int) -> Iterator[tuple[str, str, int]]:
    """(instruction, what, micro-batch) in the order DeepSpeed's TrainSchedule issues them on
    `stage`: recv/send of 'act' or 'grad', or a 'pass' of 'F' / 'B'."""
    def step_micro_batch(step: int) -> tuple[int, bool]:
        if step % 2 == stage % 2:                    # this stage's forward steps
            return (step - stage % 2) // 2 - stage // 2, True
        if step % 2 == 0:                            # odd stage, even step: backward
            return step // 2 - stages + (stage + 1) // 2, False
        return (step - 1) // 2 - stages + 1 + stage // 2, False

    valid = range(micro)
    previous = -1
    for step in range(2 * (micro + stages - 1)):
        mb, forward = step_micro_batch(step)
        if forward and stage > 0:
            if mb in valid:
                yield "recv", "act", mb
            if previous in valid:
                yield "send", "grad", previous
        if not forward and stage < stages - 1:
            if previous in valid:
                yield "send", "act", previous
            if mb in valid:
                yield "recv", "grad", mb
        if mb in valid:
            yield "pass", "F" if forward else "B", mb
        previous = mb


def deepspeed_time(stages: int, micro: int, transfer: float) -> float:
    """Makespan with blocking pairs: a send and its receive both occupy their stages from
    the later of the two arrivals until the transfer ends."""
    programs = [list(deepspeed_instructions(stages, micro, s)) for s in range(stages)]
    at = [0] * stages
    clock = [0.0] * stages
    moved = True
    while moved:
        moved = False
        for s in range(stages):
            while at[s] < len(programs[s]):
                kind, what, mb = programs[s][at[s]]
                if kind == "pass":
                    clock[s] += FORWARD if what == "F" else BACKWARD
                    at[s] += 1
                    moved = True
                    continue
                peer = s + 1 if (kind == "send") == (what == "act") else s - 1
                partner = ("recv" if kind == "send" else "send", what, mb)
                if at[peer] >= len(programs[peer]) or programs[peer][at[peer]] != partner:
                    break
                clock[s] = clock[peer] = max(clock[s], clock[peer]) + transfer
                at[s] += 1
                at[peer] += 1
                moved = True
    if any(at[s] < len(programs[s]) for s in range(stages)):
        raise RuntimeError("deadlock: the instruction streams do not pair up")
    return max(clock)


def one_f_one_b_time(stages: int, micro: int, transfer: float) -> float:
    """Makespan of 1F1B with non-blocking sends: a pass waits for its input to arrive
    (`transfer` after the neighbour's pass ends), a sender never waits."""
    order = []
    for s in range(stages):
        warmup = min(stages - s - 1, micro)
        steady = [p for i in range(micro - warmup) for p in (("F", warmup + i), ("B", i))]
        order.append([("F", i) for i in range(warmup)] + steady + [("B", i) for i in range(micro - warmup, micro)])
    ended: dict[tuple[int, str, int], float] = {}
    at = [0] * stages
    clock = [0.0] * stages
    moved = True
    while moved:
        moved = False
        for s in range(stages):
            while at[s] < len(order[s]):
                part, mb = order[s][at[s]]
                source = (s - 1, "F", mb) if part == "F" and s > 0 else (s + 1, "B", mb) if part == "B" and s < stages - 1 else None
                if source is not None and source not in ended:
                    break
                ready = ended[source] + transfer if source is not None else 0.0
                clock[s] = max(clock[s], ready) + (FORWARD if part == "F" else BACKWARD)
                ended[(s, part, mb)] = clock[s]
                at[s] += 1
                moved = True
    return max(clock)


def main() -> None:
    print("| row | pp | micro-batches | DeepSpeed / 1F1B, c = 0.03 F | c = 0.1 F |")
    print("| --- | --- | --- | --- | --- |")
    for row, pp, micro in LAYOUTS:
        ratios = [deepspeed_time(pp, micro, c) / one_f_one_b_time(pp, micro, c) for c in (0.03, 0.1)]
        print(f"| {row} | {pp} | {micro} | {ratios[0]:.3f} | {ratios[1]:.3f} |")


if __name__ == "__main__":
    main()
