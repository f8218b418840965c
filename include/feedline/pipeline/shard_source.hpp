// feedline/pipeline/shard_source.hpp: token shards (Megatron .bin/.idx, llm.c, raw) as a pipeline source.
// Each worker reads its samples' token ranges through its own reader and converts them into the slot
// in place. llm.c shards in windows mode are sampled as one token stream per shard (windows cross
// documents anyway), so opening them never scans the tokens for document delimiters; packed mode needs
// the documents and builds llm.c's document index when the sampler asks for them.
// Fed by format/dataset.hpp; feeds the pipeline's workers (pipeline/pipeline.hpp).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <feedline/detail/prefetch.hpp>
#include <feedline/format/dataset.hpp>
#include <feedline/pipeline/defaults.hpp>
#include <feedline/pipeline/source.hpp>
#include <feedline/storage/reader.hpp>

namespace feedline {

class shard_source final : public batch_source {
public:
    explicit shard_source(std::shared_ptr<const token_dataset> data) : data_(std::move(data)) {
        if (!data_) throw config_error("dataset", "no token dataset given");
    }
    // A Megatron prefix, an llm.c shard pattern, raw token files, a directory or a glob
    // (detail::resolve_dataset_spec).
    explicit shard_source(const std::string& spec) : shard_source(std::make_shared<const token_dataset>(spec)) {}

    // A source over the dataset `specs` name, in one allocation with it (what the registry opens): a
    // mixture opens a source per domain, and a dataset and a source apart cost a chunk and a control
    // block more, 32 bytes a domain. The source's own pointer to the dataset owns nothing; the block
    // lives as long as the returned pointer and its copies.
    static std::shared_ptr<shard_source> open(const std::vector<std::string>& specs) {
        struct together {
            token_dataset data;
            shard_source source;
            explicit together(const std::vector<std::string>& s) : data(s), source(std::shared_ptr<const token_dataset>(std::shared_ptr<void>(), &data)) {}
        };
        auto both = std::make_shared<together>(specs);
        return std::shared_ptr<shard_source>(both, &both->source);
    }

    const token_dataset& dataset() const noexcept { return *data_; }

    source_kind kind() const noexcept override { return source_kind::tokens; }
    std::string describe() const override {
        return std::to_string(data_->total_tokens()) + " tokens in " + std::to_string(data_->shard_count()) + " " +
               std::string(to_string(data_->format())) + " shard(s) (" + std::string(to_string(data_->dtype())) + ")";
    }

    sampler_dataset sampling(const source_context& c) const override {
        const token_dataset* d = data_.get();
        if (streams_are_shards(c))  // a shard is one "document": the sampler cuts windows across llm.c's documents
            return {.documents = d->shard_count(), .length = [d](std::uint64_t i) { return d->shard(i).tokens; }, .block_starts = {}};
        return {.documents = d->document_count(),
                .length = [d](std::uint64_t i) { return d->document_length(i); },
                .block_starts = d->shard_document_starts()};
    }
    std::uint64_t index_bytes(const source_context& c) const override {
        // llm.c's document index, built for packed mode (Megatron's .idx is mapped, not copied).
        return is_token_stream(data_->format()) && !streams_are_shards(c) ? data_->document_count() * sizeof(std::uint64_t) : 0;
    }
    // Every shard source's workers on a thread share that thread's reader and buffers (thread_io).
    const void* worker_scratch_group() const noexcept override { return scratch_group(); }
    std::uint64_t worker_bytes(const source_context& c) const override {
        return c.batch_size * (c.seq_len + 1) * dtype_size(data_->dtype()) + defaults::shard_scratch_extra_bytes;
    }
    std::string prepare(const source_context& c) override {
        auto probe = make_reader(reader_for(c));
        chosen_.store(static_cast<int>(probe.backend()), std::memory_order_relaxed);  // the workers' readers: no choice per worker
        std::string how = std::string(probe.name()) + (probe.reason().empty() ? "" : " (" + probe.reason() + ")");
        if (!data_->all_local())  // the backend reads the local shards; the rest go through their scheme
            how += "; shards in remote storage: each batch's ranges requested at once through their storage scheme";
        return how;
    }
    std::unique_ptr<source_worker> make_worker(const source_context& c, source_counters& counters) override {
        return std::make_unique<worker>(*this, c, counters);
    }

    bool reads_remote_ranges() const override { return !data_->all_local(); }
    void remote_ranges(const source_context& c, const batch_plan& plan, std::span<const std::uint32_t> rows,
                       std::vector<read_request>& out) const override {
        const bool streams = streams_are_shards(c);
        thread_local std::vector<std::byte> row;  // a destination the requests point into; never written
        row.resize((c.seq_len + 1) * dtype_size(data_->dtype()));
        const std::size_t first = out.size();
        for (const std::uint32_t r : rows) append_sample_requests(*data_, streams, plan.samples[r], row.data(), out);
        out.erase(std::remove_if(out.begin() + static_cast<std::ptrdiff_t>(first), out.end(),
                                 [](const read_request& q) { return q.source->local_file() != nullptr; }),
                  out.end());
    }

private:
    static const void* scratch_group() noexcept {
        static const char group = 0;
        return &group;
    }

    // The read requests of one sample's tokens, into `dest` on (the file's dtype), appended to `out`:
    // what a worker reads, and what the pipeline fetches ahead for it. Returns the bytes.
    // `located`, when given, holds the segments' documents, located already (token_dataset::locate).
    static std::uint64_t append_sample_requests(const token_dataset& data, bool streams_are_shards, const sample_plan& sp, std::byte* dest,
                                                std::vector<read_request>& out, const document_span* located = nullptr) {
        const std::size_t item = dtype_size(data.dtype());
        std::uint64_t bytes = 0;
        for (const segment& s : sp.segments) {
            if (streams_are_shards)
                data.append_stream_requests(static_cast<std::uint32_t>(s.document), s.offset, s.length, dest, out);
            else
                data.append_requests(located != nullptr ? *located++ : data.document(s.document), s.offset, s.length, dest, out);
            dest += s.length * item;
            bytes += s.length * item;
        }
        return bytes;
    }

    void prefetch_for_write(unsigned stage, const sample_plan& first) const noexcept override {
        if (stage == 1) {
            detail::prefetch(data_.get());  // what bind() and the write read first
        } else if (stage == 2) {
            prefetch_first_shard(*data_, first);
        }
    }
    // Where a write's first window's bytes are mapped: the entry of the shard it starts in, which the
    // write reads first. A token stream's window names its shard (a packed row's segment names a
    // document: a wasted hint at worst); a Megatron segment, a document, its shard a search away: the
    // first shard's entry, right for one shard.
    static void prefetch_first_shard(const token_dataset& data, const sample_plan& first) noexcept {
        const bool names_shard = is_token_stream(data.format()) && !first.segments.empty();
        data.prefetch_shard(names_shard ? first.segments.front().document : 0);
    }

    // Windows over llm.c or raw shards are cut from each shard as one token stream.
    static bool streams_are_shards(const token_dataset& data, sample_mode mode) noexcept {
        return is_token_stream(data.format()) && mode == sample_mode::windows;
    }
    bool streams_are_shards(const source_context& c) const noexcept { return streams_are_shards(*data_, c.mode); }
    reader_options reader_for(const source_context& c) const {
        return {.backend = c.shards.backend, .dataset_bytes = data_->total_tokens() * dtype_size(data_->dtype())};
    }

    // A contiguous run of one window's tokens in a mapping: row `row`, from its token `first`.
    struct mapped_piece {
        std::span<const std::byte> bytes;
        const byte_source* source = nullptr;  // its file and offset, for the error if the file shrinks
        std::uint64_t offset = 0;
        std::uint32_t row = 0;
        token_dtype dtype = token_dtype::uint16;  // its file's (a mixture's sources may differ)
        std::uint64_t first = 0;
    };

    // A worker thread's reader and scratch buffers, shared by every shard source the thread writes
    // for (it writes for one at a time): a mixture of 10,000 domains has one reader per worker, not
    // 10,000 (each an io_uring ring and its descriptor), and one set of buffers. (A thread has one
    // writer per backend for all shard sources, but a pipeline's worker may outlive another's.)
    struct thread_io {
        explicit thread_io(io_backend backend) : reader(make_reader({.backend = backend})), mapped(reader.get_if<mmap_reader>()) {}
        any_reader reader;
        mmap_reader* mapped;  // zero-copy: convert straight from the mapping
        std::vector<std::byte> raw;
        std::vector<read_request> requests;
        std::vector<mapped_piece> pieces;
        // write_mapped: the batch's windows gathered across every shard source of this thread, converted
        // by the first finish(), with the step they are for and their bytes.
        std::vector<mapped_piece> deferred;
        std::uint64_t deferred_step = ~std::uint64_t{0};
        std::uint64_t deferred_bytes = 0;
        // The batch's windows of files refused a mapping (detail/mapping_budget.hpp), read with pread
        // and converted from here with the others. Never grows past its reserve within a batch: the
        // deferred pieces point into it.
        std::vector<std::byte> unmapped;
        // write_sources: the runs of one source each, and the dataset each writes from.
        struct source_run {
            std::uint32_t first, rows, dataset;
            const token_dataset* data;
        };
        std::vector<source_run> runs;
        std::vector<std::size_t> row_first;             // write_viewed: each row's first request
        std::vector<std::span<const std::byte>> views;  // write_viewed: each request's bytes in the cache
        std::vector<std::uint8_t> read_row;             // write_viewed: 1 = read into raw, 2 = to read
        std::vector<read_request> to_read;
        // The documents of the batch's segments, in order, located at once (locate_rows), and the next
        // one a sample's requests take.
        std::vector<std::uint64_t> documents;
        std::vector<document_span> located;
        std::size_t next_located = 0;
    };
    // The backend a worker reads with: the one named, or what prepare() resolved `auto` to.
    io_backend backend_for(const source_context& c) const {
        if (c.shards.backend != io_backend::automatic) return c.shards.backend;
        const int chosen = chosen_.load(std::memory_order_relaxed);
        return chosen >= 0 ? static_cast<io_backend>(chosen) : make_reader(reader_for(c)).backend();
    }

    // This thread's thread_io for `backend`, made on first use and kept while a worker holds it.
    static std::shared_ptr<thread_io> io_of_this_thread(io_backend backend) {
        thread_local std::vector<std::pair<io_backend, std::weak_ptr<thread_io>>> made;
        for (auto& [b, weak] : made)
            if (b == backend)
                if (auto io = weak.lock()) return io;
        auto io = std::make_shared<thread_io>(backend);
        std::erase_if(made, [&](const auto& m) { return m.first == backend || m.second.expired(); });
        made.emplace_back(backend, io);
        return io;
    }

    // Writes for any shard source that reads with the same backend: it keeps nothing of a source's
    // own (each shard's mapping is found in the dataset's shard table), so a worker thread has one
    // writer for a mixture's thousands of domains, bound to each before its rows (source_worker::bind).
    class worker final : public source_worker {
    public:
        worker(const shard_source& s, const source_context& c, source_counters& counters)
                : run_(c), windows_(c.mode == sample_mode::windows), backend_(s.backend_for(c)), io_(io_of_this_thread(backend_)) {
            bind(s, counters);
        }

        bool accepts(const batch_source& other) const override {
            const auto* s = dynamic_cast<const shard_source*>(&other);  // once per source and thread
            return s != nullptr && s->backend_for(run_) == backend_;
        }
        void bind(const batch_source& other, source_counters& counters) override {
            counters_ = &counters;
            bind_dataset(static_cast<const shard_source&>(other).data_.get());
        }

        // A mixture's token shard domains in one pass, each run of a domain's rows written as after a
        // bind(), without the call per domain: the chain each run's write follows (the source, its
        // dataset, the entry of the shard its first window starts in: a miss each at 10,000 domains)
        // is requested a link per pass over the batch's runs, so a batch's misses overlap instead of
        // following one another.
        void write_sources(const batch_plan& plan, std::span<const std::uint32_t> rows, std::span<const weighted_source> sources,
                           source_counters& counters, const slot_view& slot) override {
            auto& runs = io_->runs;
            runs.clear();
            for (std::size_t first = 0, last = 0; first < rows.size(); first = last) {
                const std::uint32_t d = plan.samples[rows[first]].dataset;
                while (last < rows.size() && plan.samples[rows[last]].dataset == d) ++last;
                runs.push_back({static_cast<std::uint32_t>(first), static_cast<std::uint32_t>(last - first), d, nullptr});
                detail::prefetch(&sources[d]);
            }
            for (const auto& r : runs) detail::prefetch(sources[r.dataset].source.get());
            for (auto& r : runs) {
                r.data = static_cast<const shard_source&>(*sources[r.dataset].source).data_.get();  // accepts(): a shard_source
                detail::prefetch(r.data);
            }
            for (const auto& r : runs) prefetch_first_shard(*r.data, plan.samples[rows[r.first]]);
            // A domain of a Megatron pair: on along the chain to its first document's .idx entries.
            if (!runs.empty() && !streams_are_shards(*runs.front().data, run_.mode))
                for (int stage = 1; stage <= 2; ++stage)
                    for (const auto& r : runs)
                        if (const auto& first = plan.samples[rows[r.first]]; !first.segments.empty())
                            r.data->prefetch_document(first.segments.front().document, stage);
            counters_ = &counters;
            for (const auto& r : runs) {
                bind_dataset(r.data);
                write(plan, rows.subspan(r.first, r.rows), slot);
            }
        }

        void write(const batch_plan& plan, std::span<const std::uint32_t> rows, const slot_view& slot) override {
            if (mapped_ != nullptr && windows_) {  // timed and counted by finish(), once per batch
                write_mapped(plan, rows, slot);
                return;
            }
            const auto t0 = std::chrono::steady_clock::now();
            if (!data_->all_local() && windows_) {
                write_viewed(plan, rows, slot);
                counters_->read_ns.fetch_add(detail::elapsed_ns(t0), std::memory_order_relaxed);
                return;
            }
            read_rows(plan, rows, slot.seq_len);
            const auto t1 = std::chrono::steady_clock::now();
            counters_->read_ns.fetch_add(detail::elapsed_ns(t0, t1), std::memory_order_relaxed);
            convert_rows(plan, rows, slot);
            counters_->assemble_ns.fetch_add(detail::elapsed_ns(t1), std::memory_order_relaxed);
        }

        // The windows write_mapped() gathered this batch, for every shard source this thread wrote for
        // (one writer per thread and backend, bound to each in turn; a finish() that finds none left
        // returns). Their bytes and the time of the conversion go to the counters bound last (the
        // worker's; stats() sums them over workers): one clock and one count per batch instead of per
        // source written. The views' look-up before it is not timed (a few loads per window).
        void finish(const slot_view& slot) override {
            if (io_->deferred.empty()) return;
            const auto t0 = std::chrono::steady_clock::now();
            std::size_t at = 0;
            const bool whole = convert_pieces(io_->deferred, slot, at);
            const mapped_piece failed = io_->deferred[whole ? 0 : at];
            io_->deferred.clear();
            io_->unmapped.clear();
            io_->deferred_step = ~std::uint64_t{0};
            const std::uint64_t bytes = std::exchange(io_->deferred_bytes, 0);
            // A shard truncated under the job is a format_error, not a SIGBUS.
            if (!whole) throw detail::file_shrank_error(failed.source->name(), failed.offset);
            counters_->read_ns.fetch_add(detail::elapsed_ns(t0), std::memory_order_relaxed);
            counters_->bytes_read.fetch_add(bytes, std::memory_order_relaxed);
        }

    private:
        void bind_dataset(const token_dataset* data) {
            data_ = data;
            streams_are_shards_ = shard_source::streams_are_shards(*data, run_.mode);
            mapped_ = data->all_local() ? io_->mapped : nullptr;
        }

        // Locates the documents of the segments of `rows`' samples in one pass, for the sample_requests()
        // that follow in the same order (a token stream's windows name shards: nothing to locate).
        void locate_rows(const batch_plan& plan, std::span<const std::uint32_t> rows) {
            io_->documents.clear();
            io_->next_located = 0;
            if (streams_are_shards_) return;
            for (const std::uint32_t r : rows)
                for (const segment& s : plan.samples[r].segments) io_->documents.push_back(s.document);
            io_->located.resize(io_->documents.size());
            data_->locate(io_->documents, io_->located);
        }
        // Appends the read requests of one sample's segments (dest: consecutive from `dest`); samples in
        // the order locate_rows() saw them.
        std::uint64_t sample_requests(const sample_plan& sp, std::byte* dest) {
            const document_span* located = streams_are_shards_ ? nullptr : io_->located.data() + io_->next_located;
            if (!streams_are_shards_) io_->next_located += sp.segments.size();
            return append_sample_requests(*data_, streams_are_shards_, sp, dest, io_->requests, located);
        }

        // Windows through an mmap reader: tokens go from the page cache straight into the slot (one
        // pass, as a hand-written gather loop would), no staging buffer. The batch's plan is known up
        // front, which a gather loop does not use: the views of all windows are resolved first, and
        // while one window is converted the cache lines of the next ones are requested, so the DRAM
        // (and page-walk) latency of a random window overlaps the conversion instead of stalling it
        // (bench_end_to_end: one worker went from 0.7x to ~1.0x of the gather loop). The views are
        // only gathered here, into this thread's list, and converted by finish(): a mixture's batch
        // holds a window or two of each of dozens of sources, whose misses overlap only in one pass.
        // (A mapping is its file's one mapping and lives as long as the file: a view gathered here is
        // still good then.)
        void write_mapped(const batch_plan& plan, std::span<const std::uint32_t> rows, const slot_view& slot) {
            const std::size_t item = dtype_size(data_->dtype());
            std::uint64_t bytes = 0;
            if (io_->deferred_step != plan.step) {  // left by a batch that failed before its finish()
                io_->deferred.clear();
                io_->unmapped.clear();
                io_->deferred_bytes = 0;
                io_->deferred_step = plan.step;
            }
            if (streams_are_shards_) {
                bytes = stream_pieces(plan, rows, slot.seq_len);
            } else if (data_->format() == dataset_format::megatron) {
                bytes = megatron_pieces(plan, rows, slot.seq_len);
            } else {
                io_->raw.resize((slot.seq_len + 1) * item);  // requests need a destination; this path reads through view() instead
                io_->requests.clear();
                locate_rows(plan, rows);
                for (const std::uint32_t r : rows) {
                    const std::size_t first = io_->requests.size();
                    bytes += sample_requests(plan.samples[r], io_->raw.data());
                    std::uint64_t k = 0;  // the piece's first token within window r
                    for (std::size_t i = first; i < io_->requests.size(); ++i) {
                        const read_request& q = io_->requests[i];
                        const file& f = *q.source->local_file();
                        const auto view = mapped_->view_if_mapped(f, q.offset, q.length);
                        io_->deferred.push_back({view ? *view : read_unmapped(f, q.offset, q.length, plan, slot.seq_len), q.source, q.offset, r,
                                                 data_->dtype(), k});
                        k += q.length / item;
                    }
                }
            }
            io_->deferred_bytes += bytes;
        }

        // Converts `pieces` straight out of their mappings into the slot, guarded (one recovery point for
        // the batch; storage/guarded_copy.hpp). False when a mapping's file turned out shorter (SIGBUS),
        // with `at` the piece. Requested ahead: the lines of the piece being converted (one burst of
        // misses instead of one at a time) and of the pieces after it, up to prefetch_bytes of pieces
        // ahead, each piece's first prefetch_bytes at most. Pieces may be other sources'.
        bool convert_pieces(const std::vector<mapped_piece>& pieces, const slot_view& slot, std::size_t& failed_at) {
            volatile std::size_t at = 0;  // the piece being read (kept in memory across the jump)
            const bool whole = detail::guarded_reads([&](detail::sigbus_guard& guard) noexcept {
                std::size_t next = 0;     // the first piece not requested yet
                std::uint64_t ahead = 0;  // bytes requested in pieces after the one being converted
                for (std::size_t p = 0; p < pieces.size(); ++p) {
                    if (next == p)
                        prefetch_lines(pieces[next++].bytes);
                    else
                        ahead -= pieces[p].bytes.size();
                    while (next < pieces.size() && ahead < defaults::prefetch_bytes) {
                        prefetch_lines(pieces[next].bytes);
                        ahead += pieces[next++].bytes.size();
                    }
                    const mapped_piece& piece = pieces[p];
                    at = p;
                    guard.covering(piece.bytes.data(), piece.bytes.size());
                    slot.put_window_tokens(piece.row, piece.first, piece.bytes.data(), piece.dtype,
                                           piece.bytes.size() / dtype_size(piece.dtype));
                }
            });
            failed_at = at;
            return whole;
        }

        // Windows of data in remote storage: rows whose bytes sit in the local block cache are converted
        // straight from its mapped blocks, as local shards are from theirs (no staging copy); the other
        // rows are read (from the fetch ahead, the cache or the store) into io_->raw and converted from
        // there. A cache block cut short under the job (by hand) has its rows read again.
        void write_viewed(const batch_plan& plan, std::span<const std::uint32_t> rows, const slot_view& slot) {
            const std::size_t item = dtype_size(data_->dtype());
            const std::uint64_t row_bytes = (slot.seq_len + 1) * item;
            io_->raw.resize(rows.size() * row_bytes);
            io_->requests.clear();
            io_->row_first.clear();
            locate_rows(plan, rows);
            std::uint64_t bytes = 0;
            for (std::size_t i = 0; i < rows.size(); ++i) {
                io_->row_first.push_back(io_->requests.size());
                bytes += sample_requests(plan.samples[rows[i]], io_->raw.data() + i * row_bytes);
            }
            io_->row_first.push_back(io_->requests.size());
            io_->views.resize(io_->requests.size());
            io_->read_row.assign(rows.size(), 0);
            // Until every row is in view or read: a read may drop this thread's earlier views (the cache
            // keeps a bounded table of them), so views are taken again after one, and read last.
            for (bool reads = true; reads;) {
                detail::cached_views(io_->requests, io_->views);
                io_->to_read.clear();
                for (std::size_t i = 0; i < rows.size(); ++i) {
                    if (io_->read_row[i] == 1) continue;  // read already
                    for (std::size_t j = io_->row_first[i]; j < io_->row_first[i + 1]; ++j)
                        if (io_->views[j].size() != io_->requests[j].length) {
                            io_->read_row[i] = 2;
                            break;
                        }
                    if (io_->read_row[i] == 2) {
                        io_->to_read.insert(io_->to_read.end(), io_->requests.begin() + static_cast<std::ptrdiff_t>(io_->row_first[i]),
                                            io_->requests.begin() + static_cast<std::ptrdiff_t>(io_->row_first[i + 1]));
                        io_->read_row[i] = 1;
                    }
                }
                reads = !io_->to_read.empty();
                if (reads) io_->reader.read(io_->to_read);
            }
            io_->pieces.clear();
            for (std::size_t i = 0; i < rows.size(); ++i) {
                if (io_->read_row[i] == 1) continue;
                std::uint64_t k = 0;  // the piece's first token within the window
                for (std::size_t j = io_->row_first[i]; j < io_->row_first[i + 1]; ++j) {
                    io_->pieces.push_back({io_->views[j], io_->requests[j].source, io_->requests[j].offset, rows[i], data_->dtype(), k});
                    k += io_->requests[j].length / item;
                }
            }
            std::size_t at = 0;
            if (!convert_pieces(io_->pieces, slot, at)) {  // a cached block's file was cut short: read every row instead
                io_->reader.read(io_->requests);
                std::fill(io_->read_row.begin(), io_->read_row.end(), 1);
            }
            for (std::size_t i = 0; i < rows.size(); ++i)
                if (io_->read_row[i] == 1)
                    slot.put_window_tokens(rows[i], 0, io_->raw.data() + i * row_bytes, data_->dtype(), slot.seq_len + 1);
            counters_->bytes_read.fetch_add(bytes, std::memory_order_relaxed);
        }

        // Windows over shards read as one stream: a segment is (shard, first token, count), so its
        // bytes sit at a fixed place in the shard's mapping and the pieces come straight from the plan,
        // with no read requests, bounds checks or mapping look-ups per window (~15% of a worker's time
        // with 256 x 128 windows before). A shard's token range is checked against its file once, when
        // first mapped; a file that shrinks since is caught by the guard. Returns the bytes.
        std::uint64_t stream_pieces(const batch_plan& plan, std::span<const std::uint32_t> rows, std::uint64_t seq_len) {
            const std::size_t item = dtype_size(data_->dtype());
            std::uint64_t bytes = 0;
            for (const std::uint32_t r : rows) {
                std::uint64_t k = 0;  // the piece's first token within window r
                for (const segment& s : plan.samples[r].segments) {
                    auto shard = static_cast<std::uint32_t>(s.document);
                    std::uint64_t first = s.offset, count = s.length;
                    while (count > 0) {  // as append_stream_requests: a run past a shard's end goes on in the next
                        if (shard >= data_->shard_count()) throw std::out_of_range("token range runs past the last shard");
                        const auto& sh = data_->shard(shard);
                        if (first >= sh.tokens) {
                            first -= sh.tokens;
                            ++shard;
                            continue;
                        }
                        const std::uint64_t n = std::min(count, sh.tokens - first), offset = data_->token_byte_offset(first);
                        const std::byte* base = sh.mapped_bytes.get();
                        if (base == nullptr) {  // the view checks all its tokens are in the file
                            const file& f = *sh.bin->local_file();
                            if (const auto view = mapped_->view_if_mapped(f, 0, data_->token_byte_offset(sh.tokens))) {
                                base = view->data();
                                sh.mapped_bytes.set(base);
                            }
                        }
                        const std::span<const std::byte> bytes_of =
                            base != nullptr ? std::span<const std::byte>(base + offset, n * item)
                                            : read_unmapped(*sh.bin->local_file(), offset, n * item, plan, seq_len);
                        io_->deferred.push_back({bytes_of, sh.bin, offset, r, data_->dtype(), k});
                        k += n;
                        count -= n;
                        first += n;
                        bytes += n * item;
                    }
                }
            }
            return bytes;
        }

        // Windows over Megatron pairs: with each segment's document located (locate_rows), its bytes
        // sit at a fixed place in its .bin's mapping, whose base the shard's entry keeps once mapped (as
        // in stream_pieces): no read requests, and no look-up through the .bin's byte source and file
        // per window, each a miss at 10,000 domains (perf: ~8% of a worker's time there). Each window
        // is checked against the end of the .bin the index was validated to cover at open, so an .idx
        // rewritten in place under the job cannot point a view outside the mapping. Returns the bytes.
        std::uint64_t megatron_pieces(const batch_plan& plan, std::span<const std::uint32_t> rows, std::uint64_t seq_len) {
            locate_rows(plan, rows);
            const std::size_t item = dtype_size(data_->dtype());
            std::uint64_t bytes = 0;
            const document_span* doc = io_->located.data();
            for (const std::uint32_t r : rows) {
                std::uint64_t k = 0;  // the piece's first token within window r
                for (const segment& s : plan.samples[r].segments) {
                    const document_span& d = *doc++;
                    if (s.offset > d.length || s.length > d.length - s.offset)
                        throw std::out_of_range("tokens [" + std::to_string(s.offset) + ", " + std::to_string(s.offset + s.length) +
                                                ") outside a document of " + std::to_string(d.length));
                    const auto& sh = data_->shard(d.shard);
                    const std::uint64_t offset = data_->token_byte_offset(d.first_token + s.offset), n = s.length * item,
                                        end = data_->megatron_bin_end(d.shard);
                    if (offset > end || n > end - offset)
                        throw format_error(sh.bin->name(), offset,
                                           "a window's bytes [" + std::to_string(offset) + ", " + std::to_string(offset + n) +
                                               ") lie past the " + std::to_string(end) +
                                               " its index was opened with: the .idx was rewritten in place under a running job");
                    const std::byte* base = sh.mapped_bytes.get();
                    if (base == nullptr) {
                        if (const auto view = mapped_->view_if_mapped(*sh.bin->local_file(), 0, end)) {
                            base = view->data();
                            if (base != nullptr) sh.mapped_bytes.set(base);
                        }
                    }
                    const std::span<const std::byte> bytes_of = base != nullptr ? std::span<const std::byte>(base + offset, n)
                                                                                : read_unmapped(*sh.bin->local_file(), offset, n, plan, seq_len);
                    io_->deferred.push_back({bytes_of, sh.bin, offset, r, data_->dtype(), k});
                    k += s.length;
                    bytes += n;
                }
            }
            return bytes;
        }

        // [offset, offset + length) of a file refused a mapping, read with pread into this thread's
        // batch buffer (reserved for a whole batch of windows at once: pieces point into it).
        std::span<const std::byte> read_unmapped(const file& f, std::uint64_t offset, std::uint64_t length, const batch_plan& plan,
                                                 std::uint64_t seq_len) {
            std::vector<std::byte>& buffer = io_->unmapped;
            const std::uint64_t most = plan.samples.size() * (seq_len + 1) * sizeof(std::uint32_t);  // every window, the widest dtype
            if (buffer.capacity() < most) {
                if (!buffer.empty()) throw std::logic_error("read_unmapped: the batch buffer would move under its pieces");
                buffer.reserve(most);
            }
            if (buffer.size() + length > buffer.capacity()) throw std::logic_error("read_unmapped: more than a batch of windows");
            const std::size_t at = buffer.size();
            buffer.resize(at + length);
            f.read_at(buffer.data() + at, length, offset);
            return {buffer.data() + at, length};
        }

        // Software prefetch of the cache lines of `bytes`, at most the first prefetch_bytes of them:
        // past that the hardware's stream prefetcher has seen the sequential run and takes over.
        static void prefetch_lines(std::span<const std::byte> bytes) noexcept {
            constexpr std::size_t line = defaults::cache_line;
            if (bytes.empty()) return;
            const auto first = reinterpret_cast<std::uintptr_t>(bytes.data()) & ~std::uintptr_t(line - 1);
            const auto last =
                reinterpret_cast<std::uintptr_t>(bytes.data() + std::min<std::size_t>(bytes.size(), defaults::prefetch_bytes) - 1);
            for (std::uintptr_t a = first; a <= last; a += line) detail::prefetch(reinterpret_cast<const void*>(a));
        }

        // Every segment of the rows' samples into io_->raw (the file's dtype), with one batched read: row
        // i of `rows` at i x (T + 1) tokens (windows) or i x T (packed).
        void read_rows(const batch_plan& plan, std::span<const std::uint32_t> rows, std::uint64_t T) {
            const std::size_t item = dtype_size(data_->dtype());
            const std::uint64_t row = windows_ ? T + 1 : T;
            io_->raw.resize(rows.size() * row * item);
            io_->requests.clear();
            locate_rows(plan, rows);
            std::uint64_t bytes = 0;
            for (std::size_t i = 0; i < rows.size(); ++i) bytes += sample_requests(plan.samples[rows[i]], io_->raw.data() + i * row * item);
            io_->reader.read(io_->requests);
            counters_->bytes_read.fetch_add(bytes, std::memory_order_relaxed);
        }

        void convert_rows(const batch_plan& plan, std::span<const std::uint32_t> rows, const slot_view& slot) {
            const std::size_t item = dtype_size(data_->dtype());
            const std::uint64_t T = slot.seq_len;
            for (std::size_t i = 0; i < rows.size(); ++i) {
                const std::uint32_t r = rows[i];
                if (windows_) {
                    slot.put_window_tokens(r, 0, io_->raw.data() + i * (T + 1) * item, data_->dtype(), T + 1);
                } else {
                    std::uint64_t used = 0;
                    for (const segment& s : plan.samples[r].segments) used += s.length;
                    detail::convert_tokens(io_->raw.data() + i * T * item, data_->dtype(), used, slot.input_row(r));
                }
            }
        }

        const source_context run_;
        const bool windows_;
        const io_backend backend_;
        std::shared_ptr<thread_io> io_;  // this thread's reader and buffers
        // The source bound last (bind()):
        const token_dataset* data_ = nullptr;
        source_counters* counters_ = nullptr;
        bool streams_are_shards_ = false;
        mmap_reader* mapped_ = nullptr;  // zero-copy: convert straight from the mapping (local shards)
    };

    std::shared_ptr<const token_dataset> data_;
    // `auto` resolved by the last prepare() (-1: none yet). Atomic: a source shared by two pipelines
    // is prepared by one while the other's workers read it.
    std::atomic<int> chosen_{-1};
};

namespace detail {

// Registered as token shards: a spec that names a Megatron prefix, any .idx or .bin, or headerless
// token files ("raw:uint16:..."), and what no kind claims, so the token dataset's error names what is
// missing.
inline const bool shard_source_registered =
    source_registry::add({.kind = source_kind::tokens,
                          .claims =
                              [](const std::string& spec, const std::vector<std::string>& files) {
                                  if (parse_raw_spec(spec) || scheme_for(spec).exists(spec + ".idx")) return true;
                                  return std::any_of(files.begin(), files.end(), [](const std::string& f) {
                                      return detail::ends_with(f, ".idx") || detail::ends_with(f, ".bin");
                                  });
                              },
                          .open = [](const std::string& spec, const pipeline_config&) -> std::shared_ptr<batch_source> {
                              return shard_source::open({spec});
                          },
                          .fallback = true,
                          .open_list = [](const std::vector<std::string>& specs, const pipeline_config&) -> std::shared_ptr<batch_source> {
                              return shard_source::open(specs);
                          }});

}  // namespace detail

}  // namespace feedline
