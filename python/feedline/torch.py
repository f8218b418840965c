"""feedline for code that must hand a dataset to torch.utils.data.DataLoader.

    ds = feedline.torch.IterableDataset("data/*.bin", batch_size=32, seq_len=1024)
    loader = DataLoader(ds, batch_size=None, num_workers=0)   # feedline batches and prefetches itself

Each item is a dict of tensors (inputs, targets, and positions / cu_seqlens in packed mode) sharing the
batch's slot. state_dict() / load_state_dict() follow torchdata's Stateful protocol.
"""
from __future__ import annotations

from typing import Any, Dict, Iterator, Optional

import torch.utils.data

from . import Pipeline


class IterableDataset(torch.utils.data.IterableDataset):
    """Takes Pipeline's arguments. Use with DataLoader(batch_size=None, num_workers=0): feedline's own
    workers do the loading; DataLoader workers would each run a whole pipeline."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        self._args, self._kwargs = args, kwargs
        self._pipeline: Optional[Pipeline] = None
        self._pending_state: Optional[Dict[str, Any]] = None

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        info = torch.utils.data.get_worker_info()
        if info is not None and info.num_workers > 1:
            raise RuntimeError("feedline.torch.IterableDataset runs its own workers: use DataLoader(num_workers=0)")
        self._pipeline = Pipeline(*self._args, **self._kwargs)
        if self._pending_state is not None:
            self._pipeline.load_state_dict(self._pending_state)
            self._pending_state = None
        for b in self._pipeline:
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
