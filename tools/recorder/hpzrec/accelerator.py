"""A DeepSpeed accelerator for the CPU whose streams and events log what DeepSpeed does.

Tensors live on the CPU, but DeepSpeed must take its CUDA code paths: separate streams, events,
record_stream, the host throttles. Those paths are chosen by three questions DeepSpeed asks the
accelerator (accelerator/abstract_accelerator.py): is_synchronized_device,
resolves_data_dependency and handles_memory_backpressure. The CPU accelerator answers True to
all three, which skips every stream; the CUDA accelerator answers False (accelerator/
cuda_accelerator.py), and so does this one. It is handed to DeepSpeed with set_accelerator, the
supported way (accelerator/real_accelerator.py).
"""
from __future__ import annotations

import contextlib
import sys
from typing import Optional

from . import recording


class RecordingStream:
    """A stream: operations issued while it is current run on it, in issue order."""

    def __init__(self, device=None, priority: int = 0, index: Optional[int] = None,
                 **_kwargs) -> None:
        rec = recording.current()
        self.index = index if index is not None else rec.new_stream(_stream_name())

    def wait_stream(self, other: "RecordingStream") -> None:
        """CUDA's wait_stream: an event on `other`, waited for on this stream."""
        recording.current().wait_stream(self.index, other.index)

    def wait_event(self, event: "RecordingEvent") -> None:
        event.wait(self)

    def record_event(self, event: Optional["RecordingEvent"] = None) -> "RecordingEvent":
        event = event or RecordingEvent()
        event.record(self)
        return event

    def synchronize(self) -> None:
        """The host waits for everything issued on this stream."""
        recording.current().push("host_stream_sync", self.index)

    def query(self) -> bool:
        return False  # see RecordingEvent.query

    def __eq__(self, other) -> bool:
        return isinstance(other, RecordingStream) and other.index == self.index

    def __hash__(self) -> int:
        return hash(self.index)

    def __repr__(self) -> str:
        return f"<stream {recording.current().streams[self.index]}>"


class RecordingEvent:
    """An event: record captures a stream's work so far; wait and synchronize order on it."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False) -> None:
        self.id: Optional[int] = None

    def record(self, stream: Optional[RecordingStream] = None) -> None:
        rec = recording.current()
        self.id = rec.record_event(stream.index if stream is not None else rec.current_stream)

    def wait(self, stream: Optional[RecordingStream] = None) -> None:
        rec = recording.current()
        if self.id is None:
            return  # waiting for an event never recorded is a no-op in CUDA
        rec.wait_event(stream.index if stream is not None else rec.current_stream, self.id)

    def synchronize(self) -> None:
        """The host waits for the work the event captured."""
        if self.id is not None:
            recording.current().push("host_event_sync", -1, event=self.id)

    def query(self) -> bool:
        """On a GPU the answer depends on timing. The recording answers "not done yet": the
        host ran ahead of the GPU, the regime in which hpZ's race opens. DeepSpeed then takes
        its throttling path (partitioned_param_coordinator.py 303-307: synchronize the oldest
        fetch event beyond __max_ongoing_fetch_events), which the IR keeps as a host event
        sync; where the GPU had in fact caught up, that sync costs nothing in the timing
        engine, so the other answer would give the same timeline."""
        return False

    def elapsed_time(self, other: "RecordingEvent") -> float:
        return 0.0  # no clock on the CPU: durations come from hpzlab's cost model


def _stream_name() -> str:
    """Names a new stream after the DeepSpeed code that creates it (parameter_offload.py
    makes the all-gather stream, stage3.py the reduce-and-partition stream)."""
    frame = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename
        if path.endswith("parameter_offload.py"):
            return "S_ag"
        if path.endswith("stage3.py"):
            return "S_rs"
        if path.endswith("stage_1_and_2.py"):  # ZeRO-1/2's reduction_stream (overlap_comm)
            return "S_reduction"
        if "deepspeed" in path:
            return "S_" + frame.f_code.co_name
        frame = frame.f_back
    return "S_user"


def make_accelerator(devices_per_node: int):
    """The recording accelerator: DeepSpeed's own CPU accelerator with CUDA's answers."""
    from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

    class RecordingAccelerator(CPU_Accelerator):
        """DeepSpeed's CPU accelerator, with streams and events that log."""

        def __init__(self) -> None:
            super().__init__()
            self._communication_backend_name = "hpzlab-recorder"  # no DeepSpeed backend: it
            # wraps the torch.distributed we initialized (comm/comm.py init_distributed)
            self._default = RecordingStream(index=0)

        def is_synchronized_device(self) -> bool:
            return False

        def resolves_data_dependency(self) -> bool:
            return False

        def handles_memory_backpressure(self) -> bool:
            return False

        def use_host_timers(self) -> bool:
            return False

        def communication_backend_name(self) -> str:
            return self._communication_backend_name

        def device_count(self) -> int:
            return devices_per_node

        def current_device(self) -> int:
            return 0

        def synchronize(self, device_index=None) -> None:
            recording.current().push("host_device_sync", -1)

        def empty_cache(self) -> None:
            """torch.cuda.empty_cache() returns cached blocks with cudaFree, which waits for
            the whole device (CUDA runtime API: cudaFree synchronizes implicitly)."""
            recording.current().push("host_device_sync", -1)

        @property
        def Stream(self):
            return RecordingStream

        @property
        def Event(self):
            return RecordingEvent

        def stream(self, stream: Optional[RecordingStream]):
            if stream is None:
                return contextlib.nullcontext()
            return _current_stream(stream.index)

        def current_stream(self, device_index=None) -> RecordingStream:
            return RecordingStream(index=recording.current().current_stream)

        def default_stream(self, device_index=None) -> RecordingStream:
            return self._default

        def create_op_builder(self, class_name):
            """As the CUDA accelerator: it has no CPU shared-memory all-reduce op, which
            DeepSpeed 0.14 and later would otherwise compile when comm starts
            (comm/torch.py build_shm_op)."""
            if class_name == "ShareMemCommBuilder":
                return None
            return super().create_op_builder(class_name)

        def memory_stats(self, device_index=None):
            """A dict, as CUDA's torch.cuda.memory_stats() is. DeepSpeed 0.10.0's CPU
            accelerator answers an int (the RSS, accelerator/cpu_accelerator.py:139-140 at
            v0.10.0), which its own stage-3 step subscripts after every step
            (runtime/zero/stage3.py:1894-1895 at v0.10.0, `memory_stats["num_alloc_retries"]`:
            TypeError); from 0.10.1 the CPU accelerator answers a dict and the step reads it
            with .get (stage3.py:1880 at v0.10.1). Where the CPU accelerator answers an int,
            the answer is a GPU's without allocator cache flushes; a dict is passed on as it
            is. Nothing is issued either way (a host-side read)."""
            stats = super().memory_stats(device_index)
            return stats if isinstance(stats, dict) else {"num_alloc_retries": 0}

        def is_bf16_supported(self) -> bool:
            return True

        def is_fp16_supported(self) -> bool:
            return True

    return RecordingAccelerator()


@contextlib.contextmanager
def _current_stream(index: int):
    """`with stream(s)`: s is current inside."""
    rec = recording.current()
    saved = rec.current_stream
    rec.current_stream = index
    try:
        yield
    finally:
        rec.current_stream = saved
