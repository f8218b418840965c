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
import warnings
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Literal, Optional, Sequence, Tuple, TypedDict, Union, Unpack

from . import _feedline
from ._feedline import ConfigError, CudaError, Error, FormatError, IoError

if TYPE_CHECKING:
    import torch

__all__ = ["Pipeline", "Batch", "Tokenizer", "Writer", "write", "pack", "Error", "FormatError", "IoError", "ConfigError", "CudaError", "__version__"]
__version__ = _feedline.version()
# The options' defaults and docs, from their C++ declarations.
_OPTIONS = _feedline.options()
_OPTION_DEFAULTS: Dict[str, str] = {o["name"]: o["default"] for o in _OPTIONS}

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


def _check(name: str, value: Any, kinds: Any, what: str) -> None:
    """A TypeError naming the argument, instead of the extension's whole signature."""
    if not isinstance(value, kinds) or (kinds is int and isinstance(value, bool)):
        raise TypeError(f"{name} must be {what}, not {type(value).__name__} {value!r}")


class Tokenizer(_feedline.Tokenizer):
    """Text to token ids with the encoders feedline's pipelines use.

    model: a sentencepiece .model or a byte-level BPE tokenizer.json (str or os.PathLike).
    kind: "auto" (the kind that recognizes the model; for a .model feedline's own encoder where it
        reproduces the library, `chosen_because` says why not), "feedline", "sentencepiece" (the library)
        or "byte-level-bpe" (a tokenizer.json, the tokenizers package's ids).
    add_bos, add_eos: put the model's beginning / end of sentence id around every text.

    encode(text) -> ids; encode_batch(texts, threads=0) -> ids per text, on `threads` threads (0: one per
    CPU) with the GIL released. An argument of the wrong type is a TypeError naming it.
    """

    def __init__(self, model: Union[str, "os.PathLike[str]"], kind: str = "auto", add_bos: bool = False,
                 add_eos: bool = False) -> None:
        _check("model", model, (str, os.PathLike), "a path (str or os.PathLike)")
        _check("kind", kind, str, 'a string ("auto", "feedline", "sentencepiece", "byte-level-bpe")')
        _check("add_bos", add_bos, bool, "True or False")
        _check("add_eos", add_eos, bool, "True or False")
        super().__init__(model, kind, add_bos, add_eos)

    def encode(self, text: str) -> List[int]:
        _check("text", text, str, "a str")
        return super().encode(text)

    def encode_batch(self, texts: Sequence[str], threads: int = 0) -> List[List[int]]:
        _check("threads", threads, int, "a whole number >= 0 (0: one per CPU)")
        if threads < 0:
            raise ValueError(f"threads must be >= 0 (0: one per CPU), not {threads}")
        texts = list(texts)
        for i, t in enumerate(texts):
            _check(f"texts[{i}]", t, str, "a str")
        return super().encode_batch(texts, threads)


_FIELDS = ("inputs", "targets", "positions", "cu_seqlens", "datasets")


class Batch:
    """One step's batch. Its tensors share the batch's slot (no copy): the slot is returned when this
    object and every tensor taken from it are gone, or at release(). The ring holds a few slots (see
    stats()["slots"]), so a batch held across later steps must be kept: keep() copies it into memory
    torch owns and frees its slot at once (Pipeline(copy=True) does that for every batch)."""

    __slots__ = ("_b", "_cache", "_step", "_epoch")

    def __init__(self, b: "_feedline.Batch") -> None:
        self._b: Optional["_feedline.Batch"] = b
        self._cache: Dict[str, Any] = {}
        self._step: int = b.step
        self._epoch: int = b.epoch

    def _tensor(self, which: str):
        if which in self._cache:
            return self._cache[which]
        if self._b is None:
            raise RuntimeError("this batch was released: its slot belongs to a later batch now")
        t = self._b.tensor(which)
        self._cache[which] = t
        return t

    @property
    def step(self) -> int:
        """The batch's position in the run (0, 1, ...; continues after a resume)."""
        return self._step

    @property
    def epoch(self) -> int:
        """The pass over the data the batch belongs to (0, 1, ...; a blend: the first dataset's epoch,
        each dataset's is in stats()["epochs"]). With tail="pad" or "mask", an epoch's last batch is
        completed from its own start and still belongs to it."""
        return self._epoch

    @property
    def kept(self) -> bool:
        """True once keep() has copied the batch out of its slot."""
        return self._b is None and bool(self._cache)

    def keep(self) -> "Batch":
        """Copies the batch into tensors torch owns (on the batch's device, ordered on torch's current
        stream as the batch is) and returns its slot to the ring now, so it can be held for as long as
        wanted: a list of micro-batches, list(pipeline), a tensor kept for a few steps. Tensors taken
        before keep() still share the slot: take them after. Returns self; a no-op when already kept."""
        if self._b is None:
            if not self._cache:
                raise RuntimeError("this batch was released before keep(): its slot belongs to a later batch now")
            return self
        self._clone()
        b, self._b = self._b, None
        b.release()
        return self

    def _clone(self) -> "Batch":
        """Its tensors copied into memory torch owns; the slot is still held (keep() and copy=True release it)."""
        owned = {}
        for which in _FIELDS:
            t = self._tensor(which)
            owned[which] = None if t is None else t.clone()
        self._cache = owned
        return self

    @property
    def inputs(self) -> "torch.Tensor":
        """[batch_size, seq_len] int32 token ids."""
        return self._tensor("inputs")

    @property
    def targets(self) -> "torch.Tensor":
        """[batch_size, seq_len] int32 next-token ids; ignore_index (-100 unless given) where nothing is to be
        predicted (packed mode: a piece's last token, padding), as torch's cross_entropy ignores it."""
        return self._tensor("targets")

    @property
    def positions(self) -> Optional["torch.Tensor"]:
        """Packed mode: [batch_size, seq_len] int32 position of each token in its document; else None."""
        return self._tensor("positions")

    @property
    def cu_seqlens(self) -> Optional["torch.Tensor"]:
        """Packed mode: [batch_size, seq_len + 1] int32 cumulative document lengths per row; else None."""
        return self._tensor("cu_seqlens")

    @property
    def datasets(self) -> "torch.Tensor":
        """[batch_size] int32: each row's dataset, as its position in the blend (host memory)."""
        return self._tensor("datasets")

    def release(self) -> None:
        """Returns the slot now. Tensors taken from this batch then see later batches' data. A kept batch
        drops its copies."""
        self._cache.clear()
        if self._b is not None:
            self._b.release()
            self._b = None


# BEGIN PipelineOptions: generated by `feedline-options --python` from feedline/pipeline/options.hpp; a test checks it is current.
class PipelineOptions(TypedDict, total=False):
    """Pipeline's keyword arguments: the C++ pipeline_config's options (docs/options.md). None: the default."""

    batch_size: Optional[int]
    """samples per step on this rank (the global batch is batch_size x world size) (default 8)"""
    seq_len: Optional[int]
    """tokens per sample: inputs and targets are [batch_size, seq_len] (default 1024)"""
    seed: Optional[int]
    """seed of the document and sample order (default 1234)"""
    mode: Optional[Literal["windows", "packed"]]
    """windows: GPT windows across documents; packed: whole documents packed into rows (default "windows")"""
    shuffle: Optional[Literal["none", "global", "shard_blocks"]]
    """global: one permutation of all documents; shard_blocks: shards in a shuffled order; none: documents and windows in order (default "global")"""
    tail: Optional[Literal["drop", "pad", "mask"]]
    """an epoch's last incomplete global batch (one dataset): dropped; padded from the epoch's start; or mask: padded so, with ignore_index targets in the padding rows (every sample counted once: evaluation) (default "drop")"""
    workers: Optional[int]
    """worker threads filling batches; 0: from the machine, autotuned while running (default 0)"""
    max_workers: Optional[int]
    """with workers 0: the most the autotuner may run (0: from the machine) (default 0)"""
    prefetch: Optional[int]
    """batches staged ahead of the trainer; 0: 2 per worker to start, autotuned within the memory budget (default 0)"""
    memory_budget: Optional[int]
    """bytes for slots, scratch and indexes; 0: a quarter of the memory available (default 0)"""
    device: Optional[str]
    """where batches go: auto (the GPU when there is one), cpu, cuda or cuda:N (default "auto")"""
    rank: Optional[int]
    """this process's rank; -1: from torchrun's or Open MPI's environment (default -1)"""
    world_size: Optional[int]
    """ranks in the job; -1: from the environment (default -1)"""
    ignore_index: Optional[int]
    """the target where there is no next token (packed mode: a piece's end and the padding); feedline.Pipeline from Python uses -100, what PyTorch's cross_entropy ignores (default -1)"""
    max_steps: Optional[int]
    """end the iteration after this many steps; 0: run on through epochs (default 0)"""
    epochs: Optional[int]
    """one dataset: end the iteration after this many passes over the data (with max_steps: whichever comes first); 0: no end (default 0)"""
    stats_jsonl: Optional[str]
    """append a stats snapshot to this file as a JSON line every stats_every batches and at the end (default "")"""
    stats_every: Optional[int]
    """batches between stats lines (default 100)"""
    avoid_trainer_cpu: Optional[bool]
    """keep the threads filling batches off a busy trainer's CPU when there is one to spare (default True)"""
    io_backend: Optional[Literal["auto", "io_uring", "mmap", "pread"]]
    """how shards are read: auto, io_uring, mmap or pread (default "auto")"""
    fetch_ahead: Optional[int]
    """shards in remote storage (s3://): steps whose ranges are fetched ahead of the workers from the sampler's plan; -1: as many as the measured latency and the trainer's rate call for, within the memory budget; 0: none (default -1)"""
    tokenizer: Optional[str]
    """the tokenizer model for JSONL/text (a sentencepiece .model or a byte-level BPE tokenizer.json; its kind is recognized) (default "")"""
    tokenizer_kind: Optional[str]
    """which encoder reads the model: feedline (feedline's own, Unigram and BPE models, the library's ids), sentencepiece (the library), byte-level-bpe (a tokenizer.json, the tokenizers package's ids) or auto (the kind that recognizes the model; for a .model feedline's where it reproduces it, else the library's) (default "auto")"""
    add_bos: Optional[bool]
    """the model's BOS before every document (default False)"""
    add_eos: Optional[bool]
    """the model's EOS after every document (default True)"""
    field: Optional[str]
    """the JSONL field that holds a document's text (default "text")"""
    skip_invalid: Optional[bool]
    """count and skip JSONL lines that are invalid, lack the field or are too long, instead of failing (default False)"""
    text_split: Optional[Literal["file", "blank", "line"]]
    """plain text: a document per file, per blank-line-separated block, or per line (default "file")"""
    max_line_bytes: Optional[int]
    """the longest line or document read, in bytes (0: no limit) (default 67108864)"""
    cache_dir: Optional[str]
    """where a corpus's token counts are kept between runs ("": $FEEDLINE_CACHE_DIR, else $XDG_CACHE_HOME/feedline, else ~/.cache/feedline; none: memory only) (default "")"""
# END PipelineOptions


def _kept(b: "_feedline.Batch") -> Batch:
    return Batch(b)._clone()  # the engine releases the slot once this has returned (no signal can come between)


class Pipeline:
    """Batches from token shards (Megatron .bin/.idx, llm.c, headerless files such as nanoGPT's train.bin
    as "raw:uint16:train.bin") or JSONL/text tokenized on the fly, or a weighted blend of them.

    data: a path (str or os.PathLike), glob, directory, Megatron's "0.7 a 0.3 b" string, or
        [(weight, spec), ...].
    copy: False (the default): a batch's tensors share its slot in the ring, with no copy; hold at most
        a few batches at once, or keep() the ones held longer. True: every batch is kept (copied into
        memory torch owns) as it arrives, so any number may be held, for one copy of each batch.
    options: the C++ pipeline_config's options by name (PipelineOptions, docs/options.md), each parsed
        as the command-line tools parse their flags; an unknown name or a bad value is a ConfigError
        naming it. An option for data the pipeline does not have (tokenizer for shards) is refused.
    device: "auto" and "cuda" take torch's current device where torch has set up CUDA
        (torch.cuda.set_device), else the current CUDA device of the thread that takes the first batch.
    """

    def __init__(self, data: DataSpec, *, copy: bool = False, **options: Unpack[PipelineOptions]) -> None:
        # Paths (tokenizer, cache_dir, ...) may be pathlib.Path, as `data` may.
        settings: Dict[str, Any] = {k: os.fspath(v) if isinstance(v, os.PathLike) else v for k, v in options.items() if v is not None}
        settings["device"] = _torch_device(str(settings.get("device", _OPTION_DEFAULTS["device"])))
        settings.setdefault("ignore_index", -100)  # torch.nn.functional.cross_entropy's default
        self._engine = _feedline.Engine(_blend(data), settings)
        self.batch_size = int(settings.get("batch_size", _OPTION_DEFAULTS["batch_size"]))
        self.seq_len = int(settings.get("seq_len", _OPTION_DEFAULTS["seq_len"]))
        if not isinstance(copy, bool):
            raise TypeError(f"copy must be True or False, not {copy!r}")
        # Batches are handed over by the engine itself (its __next__), so that Ctrl-C between taking a
        # batch and the loop getting it cannot lose one; and a Pipeline made before fork() refuses, in
        # the child (which has none of the parent's worker threads), saying why.
        self._engine.set_delivery(_current_stream, _kept if copy else Batch, copy)
        self._repr = f"Pipeline({os.fspath(data) if isinstance(data, (str, os.PathLike)) else list(data)!r}, " + ", ".join(
            f"{k}={v!r}" for k, v in settings.items()) + (", copy=True" if copy else "") + ")"

    def __len__(self) -> int:
        """The number of batches of the run: max_steps, or the steps of `epochs` passes over one dataset,
        whichever ends first. Without either the run goes on through epochs and has no length."""
        end = self._engine.end_step
        if not end:
            raise TypeError("this Pipeline runs on through epochs (no max_steps or epochs), so it has no len(); give max_steps=N or epochs=N")
        return end

    def __repr__(self) -> str:
        return self._repr

    def __iter__(self) -> Iterator[Batch]:
        return self._engine  # its __next__ is the C++ deliver(): no Python code between a batch and the loop

    def __next__(self) -> Batch:
        return next(self._engine)

    def state_dict(self) -> Dict[str, Any]:
        """Where the run is: load_state_dict() of it continues with the batch after the last one
        returned. JSON-serialisable, equal to the C++ to_json(state())."""
        return json.loads(self._engine.state_json())

    def load_state_dict(self, state: Dict[str, Any], global_batch_change: str = "refuse", mixture_change: str = "refuse") -> None:
        """Continues from a state_dict() (before the first batch). Raises ConfigError when it does not belong here.

        global_batch_change: what a state saved with another global batch (batch_size x world size)
        does. "refuse" (the default) raises ConfigError naming both; "from_same_sample" goes on from
        the sample the saved run would have drawn next, with a warning: steps keep their numbers, and
        the batches from there match neither a run with the old batch nor one with the new.

        mixture_change: for a Pipeline over a mixture file, what a state saved with another schedule
        (an edited file, or fixed weights) does. "refuse" (the default) raises ConfigError; "from_step"
        goes on with this Pipeline's schedule from the saved step, each domain's target counted from its
        count there (the schedule's stages keep their step numbers)."""
        _check("global_batch_change", global_batch_change, str, '"refuse" or "from_same_sample"')
        if global_batch_change not in ("refuse", "from_same_sample"):
            raise ValueError(f'global_batch_change must be "refuse" or "from_same_sample", not {global_batch_change!r}')
        _check("mixture_change", mixture_change, str, '"refuse" or "from_step"')
        if mixture_change not in ("refuse", "from_step"):
            raise ValueError(f'mixture_change must be "refuse" or "from_step", not {mixture_change!r}')
        text = json.dumps(state)
        from_same_sample = global_batch_change == "from_same_sample"
        self._engine.restore_json(text, from_same_sample, mixture_change == "from_step")
        saved = int(state.get("global_batch", 0)) if isinstance(state, dict) else 0
        mine = int(self.state_dict()["global_batch"])
        if from_same_sample and saved and saved != mine:
            warnings.warn(f"this state was saved with a global batch of {saved} samples per step; this Pipeline takes {mine}. "
                          f"It goes on from step {state.get('step')} with the next sample; the batches from there match neither "
                          "a run with the old batch nor one with the new", stacklevel=2)

    def set_epoch(self, epoch: int) -> None:
        """Starts the run at the first batch of `epoch` (0-based) of the data, as if the epochs before had
        been read: the same batches, steps and states a run from the start gives from there. Before the
        first batch; one dataset only (in a blend each dataset walks its own epochs). max_steps and epochs
        still end the run at the same step as they would from the start."""
        _check("epoch", epoch, int, "a whole number")
        if epoch < 0:
            raise ValueError(f"epoch must be a whole number >= 0, not {epoch!r}")
        self._engine.set_epoch(epoch)

    def set_mixture_weights(self, weights: Union[Sequence[float], Dict[str, float]], step: Optional[int] = None) -> int:
        """For a Pipeline over a mixture file: new weights from `step` on (e.g. from per-domain losses,
        as DoReMi or online data mixing do), a list in the file's domain order or a dict by domain name
        (domains left out weigh 0). From that step each domain's target grows by its share of these.
        Recorded in state_dict() at once, so a state saved before the step resumes with them. Workers
        plan ahead: `step` must not be planned yet (the current step plus planning_horizon() never is;
        ConfigError names the first free step). Without `step`, the first step not planned yet, which
        depends on timing. Returns the step the weights take effect at. Call it from the thread that
        iterates the Pipeline (between batches), as state_dict()."""
        if isinstance(weights, dict):
            names = list(self._engine.domain_names())
            unknown = [k for k in weights if k not in names]
            if unknown:
                raise ConfigError(f"weights: no domain named {unknown[0]!r} (domains: {', '.join(names)})")
            weights = [float(weights.get(n, 0.0)) for n in names]
        if step is not None:
            _check("step", step, int, "a whole number")
            if step < 0:
                raise ValueError(f"step must be a whole number >= 0, not {step!r}")
        return int(self._engine.set_mixture_weights([float(w) for w in weights], -1 if step is None else step))

    def planning_horizon(self) -> int:
        """How many steps past the current one the workers may have planned already."""
        return int(self._engine.planning_horizon())

    def stats(self) -> Dict[str, Any]:
        """Throughput, stall time, prefetch depth and ready batches, workers, memory: the C++ pipeline_stats
        as a dict; and where the run is in its data: "epochs", each dataset's epoch as of the last batch the
        loop got, and "epoch", the first dataset's (0 before the first batch)."""
        stats = json.loads(self._engine.stats_json())
        epochs = list(self._engine.epochs())
        stats["epochs"] = epochs
        stats["epoch"] = epochs[0] if epochs else 0
        return stats

    def describe(self) -> str:
        return self._engine.describe()

    def close(self) -> None:
        """Stops the workers (when no batch is held; otherwise they stop with the last one)."""
        self._engine.close()

    def __enter__(self) -> "Pipeline":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Writer:
    """Writes documents of token ids (tokenized by you) as a dataset feedline, Megatron-LM or llm.c read,
    through the writer feedline-pack uses: the output is locked while it is written (a second writer is
    refused), and published only by finish(), atomically; an exception inside a `with` block, abort()
    or a killed process leaves no dataset (and never half of one) behind.

        with feedline.Writer("data/web", vocab_size=50257) as w:
            for text in texts:
                w.add(enc.encode(text) + [eot])
        pipe = feedline.Pipeline("data/web", ...)

    output: a Megatron prefix (output.bin + output.idx; numbered pairs with shard_bytes) or, with
        format="llmc", the prefix of llm.c shards output_000000.bin, ...
    format: "megatron" (default) or "llmc".
    dtype: the token type on disk. Default: from vocab_size as feedline-pack chooses (Megatron: uint16
        below 65500 ids, else int32; llm.c: uint16 up to 65536, else uint32), uint16 without it. A token
        that does not fit is a ConfigError naming it and its document.
    delimiter: llm.c only, the token that begins every document (llm.c's convention): default GPT-2's
        <|endoftext|> 50256 for uint16, Llama 3's <|begin_of_text|> 128000 for uint32; with a vocab_size
        that does not hold it, give your tokenizer's end-of-text id.
    shard_bytes: Megatron: start a new numbered pair after this many bytes (0: one pair); llm.c: the
        shard size (0: 100 M tokens a shard).
    """

    def __init__(self, output: Union[str, "os.PathLike[str]"], *, format: Literal["megatron", "llmc"] = "megatron",
                 dtype: Optional[str] = None, vocab_size: Optional[int] = None, delimiter: Optional[int] = None,
                 shard_bytes: int = 0) -> None:
        if format not in ("megatron", "llmc"):
            raise ValueError(f"format must be 'megatron' or 'llmc', not {format!r}")
        if vocab_size is not None and (not isinstance(vocab_size, int) or vocab_size <= 0):
            raise ValueError(f"vocab_size must be a positive whole number, not {vocab_size!r}")
        if not isinstance(shard_bytes, int) or shard_bytes < 0:
            raise ValueError(f"shard_bytes must be a whole number >= 0, not {shard_bytes!r}")
        if dtype is None:  # feedline-pack's own rule
            dtype = "uint16" if vocab_size is None else _feedline.pack_dtype(format, vocab_size)
        if delimiter is None and format == "llmc":
            delimiter = 50256 if dtype == "uint16" else 128000
            if vocab_size is not None and delimiter >= vocab_size:
                raise ValueError(f"llm.c documents begin with a delimiter token, and the default ({delimiter}, GPT-2's or Llama 3's) "
                                 f"is not in a vocabulary of {vocab_size}: give delimiter= (your tokenizer's end-of-text id)")
        delimiter = 0 if delimiter is None else delimiter
        self._w = _feedline.Writer(output, format, dtype, int(delimiter), shard_bytes)
        self.format, self.dtype = format, dtype
        self.paths: List[str] = []

    def add(self, ids: Any) -> None:
        """Appends one document: a sequence of ints, a 1-D integer numpy array or a CPU tensor."""
        import numpy as np
        a = np.asarray(ids)
        if a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
            raise TypeError(f"document {self._w.documents}: expected a 1-D sequence of integer token ids, got "
                            f"{a.ndim}-D {a.dtype} ({type(ids).__name__})")
        self._w.add(np.ascontiguousarray(a, dtype=np.int64))

    @property
    def documents(self) -> int:
        """Documents added so far."""
        return self._w.documents

    def finish(self) -> List[str]:
        """Publishes the dataset; returns what to read it by (Megatron prefixes or llm.c shard paths), also
        kept as `paths`."""
        self.paths = self._w.finish()
        return self.paths

    def abort(self) -> None:
        """Drops what was written: no file of it stays."""
        self._w.abort()

    def __enter__(self) -> "Writer":
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is None:
            self.finish()
        else:
            self.abort()


def write(output: Union[str, "os.PathLike[str]"], documents: Any, **options: Any) -> List[str]:
    """Writes an iterable of documents (each a sequence of token ids) as a dataset: Writer(output,
    **options), add() of each, finish(). Returns what to read it by; on any error nothing is left."""
    with Writer(output, **options) as w:
        for d in documents:
            w.add(d)
    return w.paths


_PACK_TEXT_OPTIONS = ("field", "skip_invalid", "text_split", "max_line_bytes", "tokenizer_kind")


def _print_progress(p: Dict[str, Any]) -> None:
    rate = p["text_bytes"] / 1e6 / max(p["seconds"], 1e-9)
    print(f"\r{p['documents']} documents  {p['tokens']} tokens  {rate:.1f} MB/s   ", end="", file=sys.stderr, flush=True)


def pack(inputs: Union[str, "os.PathLike[str]", Sequence[Union[str, "os.PathLike[str]"]]], output: Union[str, "os.PathLike[str]"],
         tokenizer: Union[str, "os.PathLike[str]"], *, format: Literal["megatron", "llmc"] = "megatron", dtype: str = "auto",
         append_eos: bool = False, shard_bytes: int = 0, threads: int = 0, progress: Any = None, **text: Any) -> Dict[str, Any]:
    """Tokenizes JSONL/text files into a dataset, as `feedline-pack` does (the same C++ code): documents
    read in order, encoded on `threads` threads (0: one per CPU) with the GIL released, written in input
    order, published only when all are written (Ctrl-C or an error leaves no output).

    inputs: JSONL (.jsonl/.json/.ndjson) or text files, directories or globs (one or a list).
    output: the dataset's prefix (output.bin/.idx, or output_000000.bin, ... for llm.c).
    tokenizer: a sentencepiece .model or a tokenizer.json (the kinds Tokenizer takes).
    format: "megatron" or "llmc". dtype: "auto" (the narrowest that holds the vocabulary), "uint16",
        "int32" or "uint32". append_eos: the model's end-of-sentence id after every document.
    shard_bytes: start a new shard after this many bytes (0: one Megatron pair; llm.c 10^8 tokens).
    progress: None (a line on stderr when it is a terminal), False (quiet), or a callable given a dict
        (documents, tokens, text_bytes, skipped, seconds) about every 100 ms.
    text: field="text", skip_invalid=False, text_split="whole_file" (plain text: "blank_lines",
        "lines"), max_line_bytes, tokenizer_kind: as the Pipeline's options of those names.
    Returns the totals and `written` (what to read the dataset by), `dtype` and `tokenizer`.
    """
    unknown = sorted(set(text) - set(_PACK_TEXT_OPTIONS))
    if unknown:
        raise TypeError(f"pack() got unknown option(s) {', '.join(unknown)}; the text options are {', '.join(_PACK_TEXT_OPTIONS)}")
    if format not in ("megatron", "llmc"):
        raise ValueError(f"format must be 'megatron' or 'llmc', not {format!r}")
    _check("threads", threads, int, "a whole number >= 0 (0: one per CPU)")
    _check("shard_bytes", shard_bytes, int, "a whole number >= 0")
    _check("append_eos", append_eos, bool, "True or False")
    if threads < 0 or shard_bytes < 0:
        raise ValueError(f"threads and shard_bytes must be >= 0, not {threads} and {shard_bytes}")
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    files = [os.fspath(i) for i in inputs]
    show = progress is None and sys.stderr.isatty()
    callback = _print_progress if show else (progress or None)
    result = _feedline.pack(files, output, tokenizer, format, dtype, append_eos, shard_bytes, threads or (os.cpu_count() or 1), text,
                            callback)
    if show:
        print(file=sys.stderr)
    return result
