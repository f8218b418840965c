"""feedline: batches of token windows for training, from shards or JSONL on the fly, without a copy.

    import feedline
    pipe = feedline.Pipeline("data/web_*.bin", batch_size=32, seq_len=1024, seed=1)
    for batch in pipe:
        loss = model(batch.inputs, batch.targets)   # torch tensors over the batch's slot

The engine is feedline's C++ pipeline (one sampler, a worker pool, a ring of slots): the same batches,
state and errors as the C++ API and the feedline-* tools for the same data, config and seed.
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from . import _feedline
from ._feedline import ConfigError, CudaError, Error, FormatError, IoError

__all__ = ["Pipeline", "Batch", "Error", "FormatError", "IoError", "ConfigError", "CudaError", "__version__"]
__version__ = _feedline.version()

DataSpec = Union[str, Sequence[Tuple[float, str]]]


def _blend(data: DataSpec) -> List[Tuple[float, str]]:
    """A spec string or path (a file, glob, directory or Megatron's "0.7 a 0.3 b") or [(weight, spec), ...]."""
    if isinstance(data, (str, os.PathLike)):
        return [(1.0, os.fspath(data))]  # the engine parses Megatron's weighted form inside one string too
    out = []
    for item in data:
        if isinstance(item, (str, os.PathLike)):
            out.append((1.0, os.fspath(item)))
        else:
            weight, spec = item
            out.append((float(weight), os.fspath(spec)))
    return out


def _torch_device(device: str) -> str:
    """"auto" and "cuda" as torch means them: its current device. torch may keep that without calling
    cudaSetDevice (its device guards skip devices that have no context yet), so it is asked, but only
    where torch has set up CUDA already: otherwise nothing has chosen a device, and feedline takes the
    CUDA runtime's current one."""
    torch = sys.modules.get("torch")
    if device not in ("auto", "cuda") or torch is None or not torch.cuda.is_initialized():
        return device
    if device == "auto" and _feedline.cuda_devices() == 0:
        return device  # this build or machine gives feedline no GPU: auto stays on the host
    return f"cuda:{torch.cuda.current_device()}"


def _current_stream(device_index: int) -> int:
    """torch's current CUDA stream on that GPU: a batch there is ordered before it (called only for GPU batches)."""
    import torch
    return torch.cuda.current_stream(device_index).cuda_stream


class Batch:
    """One step's batch. Its tensors share the batch's slot (no copy): the slot is returned when this
    object and every tensor taken from it are gone, or at release()."""

    __slots__ = ("_b", "_cache")

    def __init__(self, b: "_feedline.Batch") -> None:
        self._b = b
        self._cache: Dict[str, Any] = {}

    def _tensor(self, which: str):
        t = self._cache.get(which)
        if t is None:
            t = self._b.tensor(which)
            self._cache[which] = t
        return t

    @property
    def step(self) -> int:
        """The batch's position in the run (0, 1, ...; continues after a resume)."""
        return self._b.step

    @property
    def inputs(self):
        """[batch_size, seq_len] int32 token ids (torch.Tensor)."""
        return self._tensor("inputs")

    @property
    def targets(self):
        """[batch_size, seq_len] int32 next-token ids; -1 where nothing is to be predicted (padding)."""
        return self._tensor("targets")

    @property
    def positions(self):
        """Packed mode: [batch_size, seq_len] int32 position of each token in its document; else None."""
        return self._tensor("positions")

    @property
    def cu_seqlens(self):
        """Packed mode: [batch_size, seq_len + 1] int32 cumulative document lengths per row; else None."""
        return self._tensor("cu_seqlens")

    @property
    def datasets(self):
        """[batch_size] int32: each row's dataset, as its position in the blend (host memory)."""
        return self._tensor("datasets")

    def release(self) -> None:
        """Returns the slot now. Tensors taken from this batch then see later batches' data."""
        self._cache.clear()
        self._b.release()


class Pipeline:
    """Batches from token shards (Megatron .bin/.idx, llm.c) or JSONL/text tokenized on the fly, or a
    weighted blend of them. Names and defaults are those of the C++ pipeline_config.

    data: a path, glob, directory, Megatron's "0.7 a 0.3 b" string, or [(weight, spec), ...].
    device: "auto" (the GPU when there is one), "cpu", "cuda" or "cuda:N". "auto" and "cuda" take
        torch's current device where torch has set up CUDA (torch.cuda.set_device), else the
        current CUDA device of the thread that takes the first batch.
    workers / prefetch: 0 = from the machine, autotuned while running.
    rank / world_size: -1 = from torchrun's or Open MPI's environment.
    max_steps: end the iteration after this many steps (None: run on through epochs).
    tokenizer: the sentencepiece model for JSONL/text data.
    """

    def __init__(self, data: DataSpec, batch_size: int = 8, seq_len: int = 1024, seed: int = 1234, mode: str = "windows",
                 shuffle: str = "global", tail: str = "drop", workers: int = 0, max_workers: int = 0, prefetch: int = 0,
                 memory_budget: int = 0, device: str = "auto", rank: int = -1, world_size: int = -1,
                 max_steps: Optional[int] = None, stats_jsonl: str = "", stats_every: int = 100, io_backend: str = "auto",
                 tokenizer: Optional[str] = None, add_bos: bool = False, add_eos: bool = True, field: str = "text",
                 skip_invalid: bool = False, max_line_bytes: int = 64 << 20, cache_dir: str = "") -> None:
        self._engine = _feedline.Engine(_blend(data), batch_size, seq_len, seed, mode, shuffle, tail, workers, max_workers, prefetch,
                                        memory_budget, _torch_device(device), rank, world_size, max_steps or 0, stats_jsonl, stats_every, io_backend,
                                        tokenizer or "", add_bos, add_eos, field, skip_invalid, max_line_bytes, cache_dir)
        self.batch_size, self.seq_len = batch_size, seq_len

    def __iter__(self) -> Iterator[Batch]:
        return self

    def __next__(self) -> Batch:
        b = self._engine.next(_current_stream)
        if b is None:
            raise StopIteration
        return Batch(b)

    def state_dict(self) -> Dict[str, Any]:
        """Where the run is: load_state_dict() of it continues with the batch after the last one
        returned. JSON-serialisable, equal to the C++ to_json(state())."""
        return json.loads(self._engine.state_json())

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continues from a state_dict() (before the first batch). Raises ConfigError when it does not belong here."""
        self._engine.restore_json(json.dumps(state))

    def stats(self) -> Dict[str, Any]:
        """Throughput, stall time, queue depth, workers, memory: the C++ pipeline_stats as a dict."""
        return json.loads(self._engine.stats_json())

    def describe(self) -> str:
        return self._engine.describe()

    def close(self) -> None:
        """Stops the workers (when no batch is held; otherwise they stop with the last one)."""
        self._engine.close()

    def __enter__(self) -> "Pipeline":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
