"""feedline for code that must hand a dataset to torch.utils.data.DataLoader.

    ds = feedline.torch.IterableDataset("data/*.bin", batch_size=32, seq_len=1024)
    loader = DataLoader(ds, batch_size=None, num_workers=0)   # feedline batches and prefetches itself

Each item is a dict of tensors (inputs, targets, and positions / cu_seqlens in packed mode) sharing the
batch's slot. Where items are held across steps, as DataLoader(batch_size=k) holds k before collating,
pass copy=True: each item is then copied into memory torch owns. state_dict() / load_state_dict() follow
torchdata's Stateful protocol, so torchdata's StatefulDataLoader (num_workers=0) saves and restores the
run's exact position with its own state_dict(), without replaying batches.
"""
from __future__ import annotations

from typing import Any, Dict, Iterator, Optional

import torch.utils.data

from . import Pipeline


class IterableDataset(torch.utils.data.IterableDataset):
    """Takes Pipeline's arguments (copy=True included), and steps_per_epoch. Use with DataLoader(batch_size=None, num_workers=0):
    feedline's own workers do the loading; DataLoader workers would each run a whole pipeline, and the
    run's state would live in a worker where state_dict() cannot see it, so num_workers > 0 is refused.

    Each pass over it (an epoch of the training loop) continues the stream where the last one stopped,
    so every epoch sees new data: steps_per_epoch batches a pass where given (len() is that; passes
    counted from step 0, so a pass resumed from a checkpoint inside it ends where it would have), else
    until max_steps (the whole run's steps, as in Pipeline and in a resume), else without end."""

    def __init__(self, *args: Any, steps_per_epoch: Optional[int] = None, **kwargs: Any) -> None:
        super().__init__()
        if steps_per_epoch is not None and (not isinstance(steps_per_epoch, int) or steps_per_epoch <= 0):
            raise ValueError(f"steps_per_epoch must be a positive whole number, not {steps_per_epoch!r}")
        self._args, self._kwargs = args, kwargs
        self._steps_per_epoch = steps_per_epoch
        self._pipeline: Optional[Pipeline] = None
        self._pending_state: Optional[Dict[str, Any]] = None
        self._length: Optional[int] = None
        self._epoch: Optional[int] = None

    def set_epoch(self, epoch: int) -> None:
        """As DistributedSampler.set_epoch: the next pass over this dataset is epoch `epoch` of the data
        (0-based), from its first batch to its last, whatever passes came before; the same batches a run
        from the start gives in that epoch. One dataset only. Call it before each pass, as with a sampler."""
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            raise ValueError(f"epoch must be a whole number >= 0, not {epoch!r}")
        self._epoch = epoch

    def __len__(self) -> int:
        if self._steps_per_epoch:
            return self._steps_per_epoch
        if self._kwargs.get("epochs"):  # the steps of those passes (and max_steps, whichever ends first): opened once to count
            if self._length is None:
                probe = Pipeline(*self._args, **self._kwargs)
                self._length = len(probe)
                probe.close()
            return self._length
        if self._kwargs.get("max_steps"):
            return int(self._kwargs["max_steps"])
        raise TypeError("this dataset streams without end (no steps_per_epoch, epochs or max_steps), so it has no len()")

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        info = torch.utils.data.get_worker_info()
        if info is not None:
            raise RuntimeError("feedline.torch.IterableDataset runs its own workers and keeps the run's state in this process: "
                               "use DataLoader(num_workers=0)")
        state = self._pending_state
        if state is None and self._pipeline is not None:
            state = self._pipeline.state_dict()  # the last pass's end: this pass goes on from there
        if self._pipeline is not None:
            self._pipeline.close()
        kwargs = dict(self._kwargs)
        if self._steps_per_epoch and self._epoch is None:
            # Passes are counted from step 0: this one ends at the next multiple, so a resume from a
            # checkpoint taken inside a pass finishes that pass, and one taken at its end runs the next.
            end = ((int(state["step"]) if state else 0) // self._steps_per_epoch + 1) * self._steps_per_epoch
            kwargs["max_steps"] = min(end, int(kwargs["max_steps"])) if kwargs.get("max_steps") else end
        self._pipeline = Pipeline(*self._args, **kwargs)
        if self._epoch is not None:  # set_epoch(): this pass is that epoch ...
            self._pipeline._engine.set_epoch(self._epoch, True)
            self._epoch = None
            start = self._pipeline.state_dict()["step"]
            resume = self._pending_state  # ... from where a checkpoint taken inside it left off
            if resume is not None and start <= int(resume["step"]) < self._pipeline._engine.end_step:
                self._pipeline.load_state_dict(resume)
        elif state is not None:
            self._pipeline.load_state_dict(state)
        self._pending_state = None
        while True:
            try:
                b = next(self._pipeline)
            except StopIteration:
                return
            except RuntimeError as e:
                if "could never be prepared" not in str(e) or self._kwargs.get("copy"):
                    raise
                raise RuntimeError(f"{e}. Through feedline.torch.IterableDataset: give it copy=True (DataLoader(batch_size=k) "
                                   "holds k items before collating them), or use DataLoader(batch_size=None)") from None
            item = {"inputs": b.inputs, "targets": b.targets}
            if b.positions is not None:
                item["positions"] = b.positions
                item["cu_seqlens"] = b.cu_seqlens
            yield item

    def state_dict(self) -> Dict[str, Any]:
        if self._pipeline is None:
            return dict(self._pending_state or {})
        return self._pipeline.state_dict()

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self._pending_state = dict(state) if state else None
