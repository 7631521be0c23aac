"""DeepSpeed's PipelineEngine as a pipeline stage's planner issues it (a mixin of
sim.engines.skeleton.Planner): TrainSchedule's instructions in their order
(sim.engines.policies.DeepSpeedTrainSchedule), blocking sends and receives (pipe/p2p.py),
1/tp partitions under TP (pipe/engine.py `is_pipe_partitioned`, `is_grad_partitioned`),
and the gradient reduction after the stage's last send (docs/simulator.md)."""

from __future__ import annotations

from sim.core.enums import Axis, Coll
from sim.engines.builder import Builder
from sim.engines.layout import Layout
from sim.engines.policies import DeepSpeedTrainSchedule, Pipe, deepspeed_pipeline, pipe_partitioned
from sim.engines.schedule import Direction, Phase, PipeTag, Stream
from sim.inputs.scenario import Scenario, Training


class DeepSpeedPipe:
    """The DeepSpeed pipeline's part of a planner; the planner provides the state and the
    helpers below."""

    s: Scenario
    t: Training
    b: Builder
    layout: Layout
    stage_index: int
    boundary: int

    @property
    def global_chunk(self) -> int:
        raise NotImplementedError

    def part(self, ms: int, direction: Direction, *, exchange: bool = True, end_hook: bool = True) -> None:
        raise NotImplementedError

    def end_of_backward(self, ms: int) -> None:
        raise NotImplementedError

    def incoming(self, direction: Direction, ms: int) -> PipeTag:
        raise NotImplementedError

    def activation_bytes_between_stages(self) -> float:
        raise NotImplementedError

    @property
    def deepspeed_pipeline(self) -> bool:
        """DeepSpeed's PipelineEngine runs this stage (sim.engines.policies.deepspeed_pipeline)."""
        return deepspeed_pipeline(self.s)

    @property
    def pipe_partitioned(self) -> bool:
        """Its sends carry 1/tp (sim.engines.policies.pipe_partitioned)."""
        return pipe_partitioned(self.s)

    def deepspeed_instructions(self) -> None:
        """DeepSpeed's PipelineEngine (pipe/engine.py `_exec_schedule`): its instructions in
        its order (sim.engines.policies.DeepSpeedTrainSchedule); a pass plans as in 1F1B but
        without its own receive and send, which are instructions of their own."""
        order = DeepSpeedTrainSchedule().instructions(self.t.grad_accum, self.layout.pp, self.stage_index)
        for what, direction, ms in order:
            if what is Pipe.PASS:
                last = ms == self.boundary and direction is Direction.BACKWARD
                self.part(ms, direction, exchange=False, end_hook=not last)
            elif what is Pipe.RECV:
                self.blocking_receive(ms, direction)
            else:
                self.blocking_send(ms, direction)
        # ReduceTiedGrads, ReduceGrads: in the schedule's last step, after this stage's last send
        self.end_of_backward(self.boundary)

    def blocking_receive(self, ms: int, direction: Direction) -> None:
        """RecvActivation / RecvGrad (pipe/p2p.py `recv`: `dist.recv`, blocking). Its NCCL
        kernel starts once this stage's earlier work has ended; the sender's transfer waits for
        that (a zero-byte notice back to it), and this stage's compute stream waits for the
        data (so do its later transfers, which wait for the compute stream)."""
        forward = direction is Direction.FORWARD
        back = -1 if forward else 1
        self.b.send(f"post receive of {'activations' if forward else 'gradients'} from stage "
                    f"{(self.stage_index + back) % self.layout.pp}", Phase.FWD if forward else Phase.BWD, ms,
                    nbytes=0.0, tag=PipeTag(direction, ms, self.global_chunk, ready=True), peer=back,
                    deps=[self.b.last(Stream.COMPUTE)])
        self.b.stream_receive(Stream.COMPUTE, self.incoming(direction, ms))
        phase = Phase.FWD if forward else Phase.BWD
        if not self.pipe_partitioned:   # the compute stream waits (an op of no work that later sends follow)
            self.b.compute(f"wait for the {'activations' if forward else 'gradients'} (blocking recv)", phase, ms)
            return
        whole = self.activation_bytes_between_stages()     # 1/tp came, the pass needs all of it
        if not forward:        # _exec_backward_pass first restores the output it sent in part
            self.b.collective(Stream.COMPUTE, Coll.ALL_GATHER, whole, "all-gather own output (pipe_partitioned)",
                            phase, ms, axis=Axis.TP, purpose="pipeline")
        self.b.collective(Stream.COMPUTE, Coll.ALL_GATHER, whole,
                        f"all-gather received {'activations' if forward else 'gradients'} (PartitionedTensor.full)",
                        phase, ms, axis=Axis.TP, purpose="pipeline")

    def blocking_send(self, ms: int, direction: Direction) -> None:
        """SendActivation / SendGrad (pipe/p2p.py `send`: `dist.send`, blocking): the transfer
        starts when the receiver has posted its receive, and the compute stream waits for it
        to end before the next pass. Under TP each rank sends its 1/tp slice (pipe/engine.py
        `is_pipe_partitioned`, `is_grad_partitioned`: a PartitionedTensor over the TP group),
        which the receiver all-gathers (`blocking_receive`)."""
        forward = direction is Direction.FORWARD
        peer = 1 if forward else -1
        self.b.stream_receive(Stream.P2P, PipeTag(direction, ms, self.global_chunk + peer, ready=True))
        sent = self.b.send(f"send {'activations' if forward else 'gradients'} to stage "
                           f"{(self.stage_index + peer) % self.layout.pp} (blocking)", Phase.FWD if forward else Phase.BWD,
                           ms, nbytes=self.activation_bytes_between_stages() / (self.layout.tp if self.pipe_partitioned else 1),
                           tag=PipeTag(direction, ms, self.global_chunk),
                           peer=peer, deps=[self.b.last(Stream.COMPUTE)])
        self.b.compute("wait for the send (blocking)", Phase.FWD if forward else Phase.BWD, ms, deps=[sent])
