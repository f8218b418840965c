// _feedline: the Python face of feedline::pipeline (nanobind). The engine is the C++ one, unchanged:
// this file only converts arguments, hands each batch's slot to Python as a Batch that owns it, and
// exports the slot's arrays as torch tensors without a copy (DLPack: host memory with the host ring,
// device memory with the pinned ring). A Batch holds its slot until it and every tensor made from it
// are gone (or release() is called); it also holds the Pipeline, so the engine outlives its batches.
// next() releases the GIL while it waits; the engine's threads never take it.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <feedline/output/dataset_writer.hpp>
#include <feedline/output/pack_text.hpp>
#include <feedline/pipeline.hpp>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace nb = nanobind;
using namespace nb::literals;

namespace {

// Python exception types, created at import (feedline.Error and its subclasses).
PyObject* error_type = nullptr;
PyObject* format_error_type = nullptr;
PyObject* io_error_type = nullptr;
PyObject* config_error_type = nullptr;
PyObject* cuda_error_type = nullptr;

// Raises `type(message)` with extra attributes (file, offset, field, errno) set on the instance.
void raise(PyObject* type, const char* message, std::initializer_list<std::pair<const char*, nb::object>> attrs) {
    nb::object instance = nb::steal(PyObject_CallOneArg(type, nb::str(message).ptr()));
    if (!instance.is_valid()) return;  // the call failed and set its own error
    for (const auto& [name, value] : attrs) nb::setattr(instance, name, value);
    PyErr_SetObject(type, instance.ptr());
}

void translate(const std::exception_ptr& p, void*) {
    try {
        std::rethrow_exception(p);
    } catch (const feedline::format_error& e) {
        raise(format_error_type, e.what(), {{"file", nb::str(e.file().c_str())}, {"offset", nb::int_(e.offset())}});
    } catch (const feedline::io_error& e) {
        raise(io_error_type, e.what(), {{"file", nb::str(e.file().c_str())}, {"errno", nb::int_(e.error_code())}});
    } catch (const feedline::config_error& e) {
        raise(config_error_type, e.what(), {{"field", nb::str(e.field().c_str())}});
    } catch (const feedline::cuda_error& e) {
        raise(cuda_error_type, e.what(), {});
    } catch (const feedline::error& e) {
        raise(error_type, e.what(), {});
    }
}

class py_pipeline;

// Keyword arguments through the options' one declaration (feedline/pipeline/options.hpp): parsed as a
// command line's flag is, marked as set by the user, and refused by name. None: the default.
void set_options(feedline::pipeline_config& c, const nb::dict& options) {
    for (auto [key, value] : options) {
        const std::string name = nb::cast<std::string>(key);
        if (value.is_none()) continue;
        std::string text;
        if (nb::isinstance<nb::bool_>(value))
            text = nb::cast<bool>(value) ? "true" : "false";
        else if (nb::isinstance<nb::int_>(value))
            text = nb::str(value).c_str();
        else if (nb::isinstance<nb::str>(value))
            text = nb::cast<std::string>(value);
        else
            throw feedline::config_error(name, std::string("expected a whole number, a string or True/False, got ") +
                                                   nb::inst_name(value).c_str() + " " + nb::repr(value).c_str());
        feedline::set_option(c, name, text);
    }
}

// One step's batch: owns its slot until released.
class py_batch {
public:
    py_batch(feedline::batch b, nb::object pipeline, py_pipeline* owner, std::uintptr_t stream)
            : batch_(std::move(b)), pipeline_(std::move(pipeline)), owner_(owner), stream_(stream), step_(batch_->step()) {}
    // Moves leave the source empty, so only one of the two returns the slot.
    py_batch(py_batch&& o) noexcept
            : batch_(std::exchange(o.batch_, std::nullopt)),
              pipeline_(std::move(o.pipeline_)),
              owner_(o.owner_),
              stream_(o.stream_),
              step_(o.step_),
              epoch_(o.epoch_),
              device_index_(o.device_index_) {}
    py_batch& operator=(py_batch&&) = delete;
    ~py_batch() { release(); }

    std::uint64_t step() const noexcept { return step_; }
    std::uint64_t epoch() const noexcept { return epoch_; }
    void set_epoch(std::uint64_t e) noexcept { epoch_ = e; }
    bool released() const noexcept { return !batch_.has_value(); }
    void release();
    // Takes the batch back (its slot stays held): for a delivery that did not complete.
    std::optional<feedline::batch> detach() noexcept { return std::exchange(batch_, std::nullopt); }

    // [B, T] int32 (cu_seqlens: [B, T + 1], pieces and datasets: [B]) as a tensor over the slot.
    nb::object tensor(const char* which) {
        if (!batch_) throw std::runtime_error("this batch was released: its slot belongs to a later batch now");
        const feedline::batch& b = *batch_;
        const auto& l = b.layout();
        std::size_t offset = 0, rows = l.batch, cols = l.seq_len;
        const std::string w = which;
        if (w == "inputs")
            offset = l.inputs;
        else if (w == "targets")
            offset = l.targets;
        else if (w == "positions")
            offset = l.position_ids;
        else if (w == "cu_seqlens")
            offset = l.cu_seqlens, cols = l.seq_len + 1;
        else if (w == "pieces")
            offset = l.pieces, cols = 0;
        else if (w == "datasets")
            offset = l.datasets, cols = 0;
        const bool packed_only = w == "positions" || w == "cu_seqlens" || w == "pieces";
        if (packed_only && !l.packed) return nb::none();
        // The datasets row ids are in host memory only; everything else where compute reads it.
        const bool device = b.on_device() && w != "datasets";
        const std::byte* base = device ? static_cast<const std::byte*>(static_cast<const void*>(b.inputs())) - l.inputs
                                       : reinterpret_cast<const std::byte*>(b.host_inputs().data()) - l.inputs;
        void* data = const_cast<std::byte*>(base + offset);
        const nb::handle self = nb::find(this);
        const int device_type = device ? nb::device::cuda::value : nb::device::cpu::value;
        if (cols == 0) {
            const std::size_t shape[1] = {rows};
            return nb::cast(nb::ndarray<nb::pytorch, std::int32_t>(data, 1, shape, self, nullptr, nb::dtype<std::int32_t>(), device_type,
                                                                   device_index_));
        }
        const std::size_t shape[2] = {rows, cols};
        return nb::cast(
            nb::ndarray<nb::pytorch, std::int32_t>(data, 2, shape, self, nullptr, nb::dtype<std::int32_t>(), device_type, device_index_));
    }

    void set_device_index(int i) noexcept { device_index_ = i; }

private:
    std::optional<feedline::batch> batch_;
    nb::object pipeline_;  // keeps the engine alive while this batch (or a tensor of it) lives
    py_pipeline* owner_;
    std::uintptr_t stream_;  // the CUDA stream the tensors were ordered on (0: none / host)
    std::uint64_t step_;
    std::uint64_t epoch_ = 0;  // the pass over the data it belongs to (a blend: the first dataset's)
    int device_index_ = 0;
};

// [(weight, spec), ...] as the engine takes it. One spec alone may be Megatron's weighted form
// ("0.7 data/web 0.3 code/*.jsonl"), parsed as the command-line tools parse it.
std::vector<feedline::weighted_spec> to_blend(const std::vector<std::pair<double, std::string>>& data) {
    if (data.size() == 1 && data[0].first == 1.0) return feedline::parse_data_spec(data[0].second);
    std::vector<feedline::weighted_spec> blend;
    for (const auto& [w, spec] : data) blend.push_back({w, spec});
    return blend;
}

class py_pipeline {
public:
    py_pipeline(const std::vector<std::pair<double, std::string>>& data, const feedline::pipeline_config& config) : pid_(::getpid()) {
        const std::vector<feedline::weighted_spec> blend = to_blend(data);
        nb::gil_scoped_release unlocked;  // opening may count a corpus's tokens on every core
        engine_ = std::make_unique<feedline::pipeline>(blend, config);
        end_step_ = engine_->end_step();
        device_index_ = std::max(0, engine_->config().device.index);  // "auto"/"cuda": resolved at the first batch (next())
        // A wait for late data must not make Ctrl-C wait with it: every 100 ms of waiting, Python's
        // signal handlers run (on the main thread; elsewhere this is a no-op), and a handler that
        // raises (KeyboardInterrupt) ends the wait with that exception. The pipeline runs on.
        engine_->set_wait_check([] {
            nb::gil_scoped_acquire locked;
            return PyErr_CheckSignals() != 0;
        });
    }

    // The next batch, or None at the end. For a batch on a GPU, `stream_of(device_index)` gives the
    // consumer's CUDA stream (torch's current one), which is made to wait for the batch's copy: the
    // tensors are ordered after it without a host sync.
    // Takes the next batch into pending_; false at the end. The state before it is kept in before_:
    // until the batch reaches the loop, state_json() is that state.
    bool take() {
        if (!engine_) throw std::runtime_error("the pipeline is closed");
        before_ = engine_->state();  // copy-assigned: no allocation once it has held a state
        // The workers run at most `depth` batches past the oldest one still held, and batch `seq` fills
        // the slot of seq - slots: holding that many (or that one) would wait forever, so say so.
        const std::uint64_t seq = before_.step;
        const std::size_t depth = engine_->prefetch_depth();
        const auto slot_holder =
            slots_ == 0 ? held_.end() : std::find_if(held_.begin(), held_.end(), [&](std::uint64_t h) { return (seq - h) % slots_ == 0; });
        if (held_.size() >= depth || slot_holder != held_.end()) {
            const feedline::memory_plan& memory = engine_->memory();
            const std::string why = held_.size() >= depth
                                        ? std::to_string(held_.size()) + " batches are still held (the oldest is batch " +
                                              std::to_string(*held_.begin()) + ") and the workers prepare at most " +
                                              std::to_string(depth) + " ahead of the oldest held one"
                                        : "batch " + std::to_string(*slot_holder) + " is still held and batch " + std::to_string(seq) +
                                              " goes into its slot (the ring has " + std::to_string(slots_) + ")";
            throw std::runtime_error(
                why + ", so batch " + std::to_string(seq) +
                " could never be prepared. A batch's tensors share its slot (no copy) until the Batch and every tensor taken from "
                "it are gone. To hold batches across steps (a list of micro-batches, list(pipeline), a tensor kept for later), "
                "call batch.keep() before taking its tensors, or make the Pipeline with copy=True: either copies into memory torch "
                "owns and frees the slot. Otherwise drop or release() older batches, or raise prefetch (each slot takes " +
                std::to_string(memory.slot_bytes) + " bytes of memory_budget " + std::to_string(memory.budget) + ")");
        }
        std::optional<feedline::batch> b;
        try {
            nb::gil_scoped_release unlocked;
            b = engine_->next();
        } catch (const feedline::wait_interrupted&) {
            throw nb::python_error();  // what the signal handler raised, KeyboardInterrupt for Ctrl-C
        }
        if (!b) return false;
        // The state after a batch holds each dataset's epoch as of its last sample, which is the batch's
        // own (an epoch rolls over when the next step is planned).
        const std::vector<std::uint64_t>& epochs = engine_->state().epoch;
        pending_epoch_ = epochs.empty() ? 0 : epochs[0];
        if (slots_ == 0) slots_ = engine_->stats().slots;
        device_index_ = std::max(0, engine_->device().index);
        held_.insert(b->step());
        pending_ = std::move(b);
        pending_stream_ = 0;
        pending_ordered_ = false;
        return true;
    }

    // What `for b in pipeline` calls: the next batch as `wrap` (the Python Batch class) makes it, or
    // StopIteration at the end. A batch taken always reaches the loop: Ctrl-C raises KeyboardInterrupt
    // in whatever Python code runs next (torch's stream lookup, `wrap`), and the batch then stays in
    // pending_ for the next call, with state_json() saying the state before it. From here to the loop
    // variable no Python code runs (CPython checks for signals when Python code is entered or a call
    // returns to it, not between FOR_ITER and the store). Copy mode: `wrap` clones, and the slot is
    // released here, in C++, once it has returned.
    nb::object deliver(nb::handle self) {
        if (::getpid() != pid_)
            throw feedline::error(
                "this Pipeline was made before fork(): its worker threads are in the parent process, not in this child; make the "
                "Pipeline in the process that iterates it (torch DataLoader workers: num_workers=0)");
        if (!pending_ && !take()) throw nb::stop_iteration();
        if (!pending_ordered_) {  // on a GPU: torch's current stream waits for the batch's copy (once)
            if (pending_->on_device() && !stream_of_.is_none()) {
                const auto stream = nb::cast<std::uintptr_t>(stream_of_(device_index_));
                pending_->wait_on(reinterpret_cast<void*>(stream));
                pending_stream_ = stream;
            }
            pending_ordered_ = true;
        }
        py_batch taken(std::move(*pending_), nb::borrow(self), this, pending_stream_);
        pending_.reset();
        taken.set_device_index(device_index_);
        taken.set_epoch(pending_epoch_);
        nb::object raw = nb::cast(std::move(taken));
        if (!wrap_.is_valid()) return raw;
        nb::object out;
        try {
            out = wrap_(raw);
        } catch (nb::python_error&) {
            pending_ = nb::cast<py_batch&>(raw).detach();  // the slot stays held; the next call delivers it
            throw;
        }
        if (copy_) {
            nb::cast<py_batch&>(raw).release();
            nb::setattr(out, "_b", nb::none());  // a slot store: no Python code runs
        }
        return out;
    }

    // How deliver() hands batches over: `stream_of(device_index)` gives the consumer's CUDA stream,
    // `wrap(raw_batch)` the object the loop gets; `copy`: it cloned the tensors, release the slot.
    // Neither callable may hold the pipeline (no cycle).
    void set_delivery(nb::object stream_of, nb::object wrap, bool copy) {
        stream_of_ = std::move(stream_of);
        wrap_ = std::move(wrap);
        copy_ = copy;
    }

    void forget(std::uint64_t step) noexcept { held_.erase(step); }
    std::string state_json() const { return feedline::to_json(pending_ ? before_ : engine().state()); }
    // Each dataset's epoch as of the last batch the loop got (0 before the first).
    std::vector<std::uint64_t> epochs() const { return (pending_ ? before_ : engine().state()).epoch; }
    void restore_json(const std::string& text, bool from_same_sample, bool mixture_from_step) {
        engine().restore(feedline::pipeline_state_from_json(text),
                         from_same_sample ? feedline::global_batch_change::from_same_sample : feedline::global_batch_change::refuse,
                         mixture_from_step ? feedline::mixture_change::from_step : feedline::mixture_change::refuse);
        end_step_ = engine().end_step();  // `epochs` after another global batch ends elsewhere
    }
    // step < 0: the first step not planned yet (returned).
    std::uint64_t set_mixture_weights(const std::vector<double>& weights, std::int64_t step) {
        std::uint64_t at;
        if (step < 0) {
            at = engine().set_mixture_weights(weights);
        } else {
            at = static_cast<std::uint64_t>(step);
            engine().set_mixture_weights(weights, at);
        }
        if (pending_) before_.add_weights_change({at, weights});  // state_json() says the state before the batch kept back
        return at;
    }
    std::uint64_t planning_horizon() const { return engine().planning_horizon(); }
    std::vector<std::string> domain_names() const { return engine().domain_names(); }
    void set_epoch(std::uint64_t epoch, bool only_that_epoch) {
        engine().set_epoch(epoch, only_that_epoch);
        end_step_ = engine().end_step();
    }
    std::string stats_json() const { return engine().stats().to_json(); }
    std::string describe() const { return engine().describe(); }
    std::uint64_t end_step() const noexcept { return end_step_; }
    int device_index() const noexcept { return device_index_; }
    std::size_t held() const noexcept { return held_.size(); }
    // Stops the workers now (batches still held stay readable until dropped).
    void close() {
        if (pending_) {  // a batch an interrupt kept from the loop: nobody can get it after close()
            held_.erase(pending_->step());
            pending_.reset();
        }
        if (!held_.empty()) return;  // the slots still in use live until their batches go; the engine ends with the last
        nb::gil_scoped_release unlocked;
        engine_.reset();
    }

private:
    const feedline::pipeline& engine() const {
        if (!engine_) throw std::runtime_error("the pipeline is closed");
        return *engine_;
    }
    feedline::pipeline& engine() {
        if (!engine_) throw std::runtime_error("the pipeline is closed");
        return *engine_;
    }
    std::unique_ptr<feedline::pipeline> engine_;
    std::optional<feedline::batch> pending_;  // after engine_: destroyed first. Taken, not yet delivered (deliver())
    std::uintptr_t pending_stream_ = 0;
    bool pending_ordered_ = false;  // its wait_on(stream) was made
    std::uint64_t pending_epoch_ = 0;
    feedline::pipeline_state before_;  // the state before the batch taken last
    nb::object stream_of_ = nb::none(), wrap_;
    bool copy_ = false;
    std::uint64_t end_step_ = 0;  // kept: len() works after close()
    pid_t pid_;
    std::set<std::uint64_t> held_;
    std::size_t slots_ = 0;
    int device_index_ = 0;
};

// feedline.Writer: documents the user tokenized, written as a dataset by the writer feedline-pack uses
// (output/dataset_writer.hpp): the prefix locked while it writes, published only by finish(), nothing
// left behind by abort() or an exception.
class py_writer {
public:
    py_writer(const std::filesystem::path& output, const std::string& format, const std::string& dtype, std::int64_t delimiter,
              std::uint64_t shard_bytes) {
        feedline::dataset_writer_options o{.format = format, .dtype = feedline::parse_dtype(dtype), .shard_bytes = shard_bytes};
        if (delimiter < 0 || delimiter > std::int64_t{UINT32_MAX})
            throw feedline::config_error("delimiter", "a token id in [0, 2^32), got " + std::to_string(delimiter));
        o.delimiter = static_cast<std::uint32_t>(delimiter);
        writer_ = std::make_unique<feedline::dataset_writer>(output.string(), o);
    }
    // One document: int64 ids (the Python side converts lists, numpy arrays and tensors).
    void add(nb::ndarray<const std::int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> ids) {
        live().add(std::span<const std::int64_t>(ids.data(), ids.shape(0)));
    }
    std::uint64_t documents() const { return writer_ ? writer_->documents() : documents_; }
    std::vector<std::string> finish() {
        auto out = live().finish();
        documents_ = writer_->documents();
        writer_.reset();
        return out;
    }
    void abort() noexcept { writer_.reset(); }  // removes its temporary files and the lock

private:
    feedline::dataset_writer& live() {
        if (!writer_) throw std::runtime_error("this Writer is finished (or aborted): make a new one");
        return *writer_;
    }
    std::unique_ptr<feedline::dataset_writer> writer_;
    std::uint64_t documents_ = 0;
};

// feedline.pack: JSONL/text tokenized into shards by feedline-pack's own code (output/pack_text.hpp),
// the GIL released. `progress(dict)` is called about every 100 ms while documents are written and once
// at the end; Ctrl-C (or an exception from `progress`) stops every thread within about a second and is
// raised here, with nothing written. `text`: the text options by name (field, text_split, ...).
nb::dict pack(const std::vector<std::string>& inputs, const std::filesystem::path& output, const std::filesystem::path& tokenizer,
              const std::string& format, const std::string& dtype, bool append_eos, std::uint64_t shard_bytes, unsigned threads,
              const nb::dict& text, const nb::object& progress) {
    feedline::pipeline_config c;
    set_options(c, text);
    const feedline::pack_options o{.inputs = inputs,
                                   .tokenizer = {.model = tokenizer.string(), .kind = c.text.tokenizer_kind, .add_eos = append_eos},
                                   .documents = c.text.documents,
                                   .format = format,
                                   .dtype = dtype,
                                   .shard_bytes = shard_bytes,
                                   .threads = threads};
    const auto as_dict = [](const feedline::pack_progress& p) {
        nb::dict d;
        d["documents"] = p.documents;
        d["tokens"] = p.tokens;
        d["text_bytes"] = p.text_bytes;
        d["skipped"] = p.skipped;
        d["seconds"] = p.seconds;
        return d;
    };
    std::atomic<bool> stop{false};
    std::optional<nb::python_error> raised;  // what a signal handler or `progress` raised
    const auto on_progress = [&](const feedline::pack_progress& p) {
        nb::gil_scoped_acquire locked;
        if (raised) return;
        try {
            if (PyErr_CheckSignals() != 0) throw nb::python_error();
            if (!progress.is_none()) progress(as_dict(p));
        } catch (nb::python_error& e) {
            raised.emplace(std::move(e));
            stop = true;
        }
    };
    feedline::pack_result r;
    try {
        nb::gil_scoped_release unlocked;
        r = feedline::pack_text(output.string(), o, nullptr, on_progress, &stop, std::chrono::milliseconds(100));
    } catch (const feedline::error&) {
        if (!raised) throw;
        raised->restore();
        throw nb::python_error();
    }
    if (raised) {  // raised in a progress call after the last check (none is made after the final one)
        raised->restore();
        throw nb::python_error();
    }
    nb::dict out = as_dict(r.totals);
    out["written"] = r.written;
    out["dtype"] = std::string(feedline::to_string(r.dtype));
    out["tokenizer"] = r.tokenizer;
    return out;
}

// feedline.Tokenizer: make_tokenizer's encoders from Python. encode_batch spreads documents over
// threads, a tokenizer each (encoders are not thread-safe), with the GIL released.
class py_tokenizer {
public:
    py_tokenizer(const std::filesystem::path& model, std::string kind, bool add_bos, bool add_eos)  // str or os.PathLike
            : options_{.model = model.string(), .kind = std::move(kind), .add_bos = add_bos, .add_eos = add_eos},
              first_(feedline::make_tokenizer(options_, "model")) {}

    std::vector<std::int32_t> encode(const std::string& text) {
        std::vector<std::int32_t> ids;
        std::string problem;
        {
            nb::gil_scoped_release unlocked;
            std::lock_guard hold(first_lock_);
            problem = first_->encode(text, ids);
        }
        if (!problem.empty()) throw nb::value_error(problem.c_str());
        return ids;
    }

    std::vector<std::vector<std::int32_t>> encode_batch(const std::vector<std::string>& texts, unsigned threads) {
        std::vector<std::vector<std::int32_t>> out(texts.size());
        if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
        threads = static_cast<unsigned>(std::min<std::size_t>(threads, std::max<std::size_t>(texts.size(), 1)));
        std::string problem;
        {
            nb::gil_scoped_release unlocked;
            std::atomic<std::size_t> next{0};
            std::mutex problem_lock;
            auto work = [&](feedline::tokenizer& tok) {
                for (std::size_t i; (i = next.fetch_add(1)) < texts.size();)
                    if (std::string p = tok.encode(texts[i], out[i]); !p.empty()) {
                        std::lock_guard hold(problem_lock);
                        if (problem.empty()) problem = "document " + std::to_string(i) + ": " + p;
                        next = texts.size();
                    }
            };
            std::vector<std::thread> pool;
            std::vector<std::string> failures(threads);
            for (unsigned t = 1; t < threads; ++t)
                pool.emplace_back([&, t] {
                    try {
                        auto tok = feedline::make_tokenizer(options_, "model");
                        work(*tok);
                    } catch (const std::exception& e) {
                        failures[t] = e.what();
                        next = texts.size();
                    }
                });
            {
                std::lock_guard hold(first_lock_);
                work(*first_);
            }
            for (auto& th : pool) th.join();
            for (const auto& f : failures)
                if (problem.empty() && !f.empty()) problem = f;
        }
        if (!problem.empty()) throw nb::value_error(problem.c_str());
        return out;
    }

    std::string kind() const { return std::string(first_->kind()); }
    std::string describe() const { return first_->describe(); }
    std::string chosen_because() const { return first_->chosen_because(); }
    std::string identity() const { return first_->identity(); }
    int vocab_size() const { return first_->vocab_size(); }
    int bos_id() const { return first_->bos_id(); }
    int eos_id() const { return first_->eos_id(); }

private:
    feedline::tokenizer_options options_;
    std::unique_ptr<feedline::tokenizer> first_;
    std::mutex first_lock_;  // encode() from several Python threads: one encoder, one at a time
};

void py_batch::release() {
    if (!batch_) return;
    batch_->release(reinterpret_cast<void*>(stream_));
    batch_.reset();
    owner_->forget(step_);
}

}  // namespace

NB_MODULE(_feedline, m) {
    m.doc() = "feedline's engine (use the feedline package, not this module)";
    error_type = PyErr_NewExceptionWithDoc("feedline.Error", "Base of every feedline error.", PyExc_RuntimeError, nullptr);
    format_error_type = PyErr_NewExceptionWithDoc("feedline.FormatError",
                                                  "On-disk data does not have the expected layout (.file, .offset).", error_type, nullptr);
    io_error_type = PyErr_NewExceptionWithDoc("feedline.IoError", "A system call on a file failed (.file, .errno).", error_type, nullptr);
    config_error_type =
        PyErr_NewExceptionWithDoc("feedline.ConfigError", "A configuration value is invalid (.field).", error_type, nullptr);
    cuda_error_type = PyErr_NewExceptionWithDoc("feedline.CudaError", "A CUDA call failed.", error_type, nullptr);
    m.attr("Error") = nb::handle(error_type);
    m.attr("FormatError") = nb::handle(format_error_type);
    m.attr("IoError") = nb::handle(io_error_type);
    m.attr("ConfigError") = nb::handle(config_error_type);
    m.attr("CudaError") = nb::handle(cuda_error_type);
    nb::register_exception_translator(&translate);

    m.def("cuda_devices", [] { return feedline::gpu_probe().devices; });  // 0 without a GPU or without CUDA in this build
    m.def("version", [] { return std::to_string(FEEDLINE_VERSION_MAJOR) + "." + std::to_string(FEEDLINE_VERSION_MINOR); });
    // The dtype feedline-pack picks for a vocabulary in a format (output/pack_text.hpp): Writer's default.
    m.def(
        "pack_dtype",
        [](const std::string& format, std::uint64_t vocab_size) {
            return std::string(to_string(feedline::pack_dtype("auto", format, vocab_size)));
        },
        "format"_a, "vocab_size"_a);
    // The pipeline's options as their declarations say: for Pipeline's docstring and keyword checks.
    m.def("options", [] {
        nb::list out;
        const feedline::pipeline_config defaults{};
        feedline::for_each_option([&](const auto& o) {
            nb::dict d;
            d["name"] = std::string(o.name);
            d["doc"] = std::string(o.doc);
            d["default"] = feedline::option_text(o.value(defaults));
            d["data"] = std::string(feedline::name_of(o.scope));
            out.append(d);
        });
        return out;
    });

    nb::class_<py_batch>(m, "Batch")
        .def_prop_ro("step", &py_batch::step)
        .def_prop_ro("epoch", &py_batch::epoch)
        .def_prop_ro("released", &py_batch::released)
        .def("tensor", &py_batch::tensor, "which"_a)
        .def("release", &py_batch::release);

    nb::class_<py_pipeline>(m, "Engine")
        .def(
            "__init__",
            [](py_pipeline* self, const std::vector<std::pair<double, std::string>>& data, const nb::dict& options) {
                feedline::pipeline_config c;
                set_options(c, options);
                new (self) py_pipeline(data, c);
            },
            "data"_a, "options"_a)
        .def("__iter__", [](nb::handle self) { return nb::borrow(self); })
        .def("__next__", [](nb::handle self) { return nb::cast<py_pipeline&>(self).deliver(self); })
        .def("set_delivery", &py_pipeline::set_delivery, "stream_of"_a, "wrap"_a, "copy"_a)
        .def("state_json", &py_pipeline::state_json)
        .def("restore_json", &py_pipeline::restore_json, "state"_a, "from_same_sample"_a = false, "mixture_from_step"_a = false)
        .def("set_epoch", &py_pipeline::set_epoch, "epoch"_a, "only_that_epoch"_a = false)
        .def("set_mixture_weights", &py_pipeline::set_mixture_weights, "weights"_a, "step"_a)
        .def("planning_horizon", &py_pipeline::planning_horizon)
        .def("domain_names", &py_pipeline::domain_names)
        .def("stats_json", &py_pipeline::stats_json)
        .def("epochs", &py_pipeline::epochs)
        .def("describe", &py_pipeline::describe)
        .def_prop_ro("end_step", &py_pipeline::end_step)
        .def_prop_ro("device_index", &py_pipeline::device_index)
        .def_prop_ro("held", &py_pipeline::held)
        .def("close", &py_pipeline::close);

    m.def("pack", &pack, "inputs"_a, "output"_a, "tokenizer"_a, "format"_a, "dtype"_a, "append_eos"_a, "shard_bytes"_a, "threads"_a,
          "text"_a, "progress"_a.none());

    nb::class_<py_writer>(m, "Writer")
        .def(nb::init<const std::filesystem::path&, const std::string&, const std::string&, std::int64_t, std::uint64_t>(), "output"_a,
             "format"_a, "dtype"_a, "delimiter"_a, "shard_bytes"_a)
        .def("add", &py_writer::add, "ids"_a)
        .def_prop_ro("documents", &py_writer::documents)
        .def("finish", &py_writer::finish)
        .def("abort", &py_writer::abort);

    nb::class_<py_tokenizer>(
        m, "Tokenizer",
        "Text to token ids with the encoders feedline's pipelines use: Tokenizer(model, kind='auto', add_bos=False, "
        "add_eos=False). model: a sentencepiece .model or a byte-level BPE tokenizer.json. kind: 'feedline' (feedline's own "
        "encoder for Unigram and BPE .model files, the library's ids), 'sentencepiece' (the library), 'byte-level-bpe' "
        "(a tokenizer.json, the tokenizers package's ids) or 'auto' (the kind that recognizes the model; for a .model "
        "feedline's where it reproduces it, `chosen_because` says why not). encode(text) -> ids; encode_batch(texts, threads=0) -> ids per "
        "text, on `threads` threads "
        "(0: one per CPU) with the GIL released.")
        .def(nb::init<const std::filesystem::path&, std::string, bool, bool>(), "model"_a, "kind"_a = "auto", "add_bos"_a = false,
             "add_eos"_a = false)
        .def("encode", &py_tokenizer::encode, "text"_a)
        .def("encode_batch", &py_tokenizer::encode_batch, "texts"_a, "threads"_a = 0)
        .def_prop_ro("kind", &py_tokenizer::kind)
        .def_prop_ro("description", &py_tokenizer::describe)
        .def_prop_ro("chosen_because", &py_tokenizer::chosen_because)
        .def_prop_ro("identity", &py_tokenizer::identity)
        .def_prop_ro("vocab_size", &py_tokenizer::vocab_size)
        .def_prop_ro("bos_id", &py_tokenizer::bos_id)
        .def_prop_ro("eos_id", &py_tokenizer::eos_id);
}
