// feedline/format/dataset.hpp: many token shards -> one dataset with global document numbering.
// Accepts a directory, a glob, a Megatron prefix (or a list of them), an llm.c shard pattern or
// headerless token files ("raw:uint16:train.bin", format/raw_tokens.hpp), opens
// every shard up front (a missing or corrupt shard fails here, not mid-epoch) in O(shards) time, and
// turns "tokens [a, b) of document d" into read requests for a storage backend. Fed by format/megatron.hpp
// format/llmc.hpp and format/raw_tokens.hpp; feeds pipeline/shard_source.hpp (the sampler's lengths, the workers' reads).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <feedline/detail/descriptor_limit.hpp>
#include <feedline/detail/fixed_array.hpp>
#include <feedline/detail/one_in_place.hpp>
#include <feedline/detail/paths.hpp>
#include <feedline/detail/prefetch.hpp>
#include <feedline/detail/published.hpp>
#include <feedline/detail/spin_lock.hpp>
#include <feedline/format/dtype.hpp>
#include <feedline/format/llmc.hpp>
#include <feedline/format/megatron.hpp>
#include <feedline/format/raw_tokens.hpp>
#include <feedline/storage/guarded_copy.hpp>
#include <feedline/storage/read_request.hpp>
#include <feedline/storage/storage_scheme.hpp>

namespace feedline {

enum class dataset_format { megatron, llmc, raw };

inline std::string_view to_string(dataset_format f) noexcept {
    return f == dataset_format::megatron ? "megatron" : f == dataset_format::llmc ? "llmc" : "raw";
}

// llm.c shards and raw files are one stream of tokens with delimiters between documents (no index on
// disk: the document index is built by a scan when packed mode needs it).
inline constexpr bool is_token_stream(dataset_format f) noexcept { return f != dataset_format::megatron; }

// Where a document's tokens live. For llm.c the tokens may run on into the following shards.
struct document_span {
    std::uint32_t shard = 0;
    std::uint64_t first_token = 0;  // index of the document's first token within `shard`
    std::uint64_t length = 0;       // tokens
};

namespace detail {

// Resolves a dataset spec into shard paths: Megatron prefixes (without extension) or llm.c files.
struct resolved_spec {
    dataset_format format = dataset_format::megatron;
    std::vector<std::string> shards;
    token_dtype raw_dtype = token_dtype::uint16;  // raw: the dtype the spec names
    std::optional<std::uint32_t> raw_delimiter;   // raw: the spec's eot=, if given
};

// Resolves one or more specs. Each is a Megatron prefix, a .idx/.bin path, an llm.c .bin, a directory
// or a glob, or "raw:<dtype>:" before a file, glob, directory (its .bin files) or URL. In a directory
// or a glob, every .idx is a Megatron prefix (its .bin beside it), and every
// .bin without an .idx beside it is an llm.c shard, validated when opened: no shard is ever left out
// because of what it holds (a damaged shard is a format_error naming it, not less data). Other files
// are not shards and are passed over. Throws io_error when nothing matches, and config_error naming the
// files when the specs mix formats (a .bin without its .idx among Megatron pairs included).
inline resolved_spec resolve_dataset_spec(const std::vector<std::string>& specs) {
    resolved_spec out;
    bool have_format = false;
    auto add = [&](dataset_format f, std::string shard, const std::string& spec) {
        if (have_format && f != out.format)
            throw config_error("dataset", "'" + spec + "' holds " +
                                              (f == dataset_format::llmc  ? shard + ", an llm.c shard (a .bin without an .idx),"
                                               : f == dataset_format::raw ? shard + ", a headerless token file,"
                                                                          : shard + ", a Megatron prefix,") +
                                              " but earlier shards are " + std::string(to_string(out.format)) +
                                              "; one dataset holds one format (a Megatron .bin that lost its .idx looks like this too)");
        out.format = f;
        have_format = true;
        out.shards.push_back(std::move(shard));
    };
    auto add_files = [&](const storage_scheme& scheme, const std::vector<std::string>& files, const std::string& spec) {
        std::vector<std::string> prefixes, lone_bins;
        for (const auto& p : files) {
            if (detail::ends_with(p, ".idx"))
                prefixes.push_back(detail::strip_suffix(p, ".idx"));
            else if (detail::ends_with(p, ".bin") && !scheme.exists(detail::strip_suffix(p, ".bin") + ".idx"))
                lone_bins.push_back(p);
            else if (detail::ends_with(p, ".bin"))
                prefixes.push_back(detail::strip_suffix(p, ".bin"));
        }
        std::sort(prefixes.begin(), prefixes.end());
        prefixes.erase(std::unique(prefixes.begin(), prefixes.end()), prefixes.end());
        if (!prefixes.empty() && !lone_bins.empty()) {
            std::string names;
            for (std::size_t i = 0; i < lone_bins.size() && i < 5; ++i) names += (i ? ", " : "") + lone_bins[i];
            if (lone_bins.size() > 5) names += " and " + std::to_string(lone_bins.size() - 5) + " more";
            throw config_error("dataset", "'" + spec + "' holds Megatron pairs and " + std::to_string(lone_bins.size()) +
                                              " .bin file(s) without an .idx beside them (" + names +
                                              "): a Megatron .bin whose index is missing, or llm.c shards among Megatron data; "
                                              "remove or restore them, or name the shards you mean");
        }
        for (const auto& p : prefixes) add(dataset_format::megatron, p, spec);
        for (const auto& p : lone_bins) add(dataset_format::llmc, p, spec);
        if (prefixes.empty() && lone_bins.empty()) throw io_error(spec, ENOENT, "no Megatron .idx/.bin or llm.c .bin shards found");
    };
    auto add_raw = [&](const raw_spec& raw, const std::string& spec) {
        if (!out.shards.empty() && out.format == dataset_format::raw && raw.dtype != out.raw_dtype)
            throw config_error("dataset", "'" + spec + "' names " + std::string(to_string(raw.dtype)) + " tokens but earlier files are " +
                                              std::string(to_string(out.raw_dtype)) + "; one dataset holds one dtype");
        if (!out.shards.empty() && out.format == dataset_format::raw && raw.delimiter != out.raw_delimiter)
            throw config_error("dataset", "'" + spec + "' ends documents with another eot= than the files before it; one dataset has one");
        const storage_scheme& scheme = scheme_for(raw.location);
        const expanded_location where = expand_location(raw.location);
        std::vector<std::string> files;
        if (where.kind == expanded_location::form::directory) {
            for (const auto& f : where.entries)
                if (detail::ends_with(f, ".bin")) files.push_back(f);
            if (files.empty()) throw io_error(raw.location, ENOENT, "no .bin files in this directory");
        } else if (where.kind == expanded_location::form::glob) {
            files = where.entries;
        } else if (!scheme.exists(raw.location)) {
            throw io_error(raw.location, ENOENT, "no such file (named by '" + spec + "')");
        } else {
            files = where.entries;
        }
        for (auto& f : files) add(dataset_format::raw, std::move(f), spec);
        out.raw_dtype = raw.dtype;
        out.raw_delimiter = raw.delimiter;
    };
    for (const auto& spec : specs) {
        if (auto raw = parse_raw_spec(spec)) {
            add_raw(*raw, spec);
            continue;
        }
        const storage_scheme& scheme = scheme_for(spec);
        const expanded_location where = expand_location(spec);
        if (where.kind != expanded_location::form::single) {
            add_files(scheme, where.entries, spec);
        } else if (scheme.exists(spec + ".idx")) {
            add(dataset_format::megatron, spec, spec);
        } else if (detail::ends_with(spec, ".idx")) {
            add(dataset_format::megatron, detail::strip_suffix(spec, ".idx"), spec);
        } else if (detail::ends_with(spec, ".bin") && scheme.exists(detail::strip_suffix(spec, ".bin") + ".idx")) {
            add(dataset_format::megatron, detail::strip_suffix(spec, ".bin"), spec);
        } else if (scheme.exists(spec)) {
            add(dataset_format::llmc, spec, spec);  // validated (magic, size) when opened
        } else if (scheme.exists(spec + ".bin") || scheme.exists(spec + ".lock")) {
            throw io_error(spec + ".idx", ENOENT,
                           scheme.exists(spec + ".lock") ? "missing: a pack is writing this prefix (" + spec + ".lock)"
                                                         : "missing: " + spec + ".bin has no index beside it");
        } else {
            throw io_error(spec, ENOENT,
                           "no such dataset (expected a Megatron prefix with .idx/.bin, an llm.c .bin, a directory or a glob)");
        }
    }
    if (out.shards.empty()) throw config_error("dataset", "no dataset given");
    return out;
}

}  // namespace detail

// A read-only token dataset over one or more shards of one format and dtype. Thread-safe after
// construction (llm.c's document index is built once, on first use, under a lock).
class token_dataset {
public:
    // A shard's path is its data file's name (shard_path): a mixture holds a dataset per domain, and a
    // second copy of every path cost ~80 bytes a domain.
    struct shard_info {
        const byte_source* bin = nullptr;
        std::uint64_t tokens = 0;
        // The data file's bytes in its one mapping (storage/file.hpp), once a reader of the whole shard as
        // a token stream has mapped and range-checked it; null before. Next to `tokens` (the first 24
        // bytes are all a window's read takes), so a mixture's workers find a window's bytes with no
        // look-up of their own per shard and thread, in one or two cache lines.
        detail::published<const std::byte*> mapped_bytes;
        std::uint64_t documents = 0;  // Megatron: sequences in the shard; llm.c: known after indexing
        // Its token 0 in the shards' concatenated stream. Here rather than in a vector of its own: one
        // allocation a dataset fewer, and a mixture holds a dataset per domain.
        std::uint64_t first_token = 0;
        // What holds it open. Here rather than in a vector per format: one allocation a shard fewer.
        std::variant<std::unique_ptr<megatron_shard>, llmc_shard, std::unique_ptr<raw_token_file>> opened;
    };

    // Opens and validates every shard (headers and, for Megatron, the .idx arrays; never the tokens),
    // with one file descriptor per shard while it is used (the soft RLIMIT_NOFILE is raised toward the
    // hard one when that takes more; past the hard one, the descriptor pool closes idle descriptors and
    // opens them again on use). Throws io_error for missing files, format_error for corrupt ones,
    // config_error for mixed dtypes.
    explicit token_dataset(const std::vector<std::string>& specs) : token_dataset(detail::resolve_dataset_spec(specs)) {}
    explicit token_dataset(const std::string& spec) : token_dataset(std::vector<std::string>{spec}) {}
    explicit token_dataset(detail::resolved_spec spec)
            : format_(spec.format), data_offset_(spec.format == dataset_format::llmc ? std::uint32_t{llmc_layout::header_bytes} : 0) {
        // A spec resolved by hand may hold none (the resolvers refuse that): a dataset always has a shard.
        if (spec.shards.empty()) throw config_error("dataset", "no dataset given (no shards)");
        // One descriptor per shard while it is used (+1 while a Megatron .idx is mapped); the pool
        // closes idle ones past the limit (detail/descriptor_pool.hpp).
        detail::raise_descriptor_limit(spec.shards.size());
        // llm.c headers are read together (remote shards: one round trip, not one per shard).
        std::vector<llmc_shard> opened = format_ == dataset_format::llmc ? llmc_shard::open_all(spec.shards) : std::vector<llmc_shard>{};
        shards_.reserve(spec.shards.size());
        for (const auto& s : spec.shards) {
            shard_info info;
            if (format_ == dataset_format::megatron) {
                auto& m = *info.opened.emplace<0>(std::make_unique<megatron_shard>(s));
                info.bin = &m.bin();
                info.tokens = m.index().total_tokens();
                info.documents = m.index().sequence_count();
                check_dtype(m.dtype(), s);
            } else if (format_ == dataset_format::llmc) {
                // Its byte source is on the heap (llmc_shard::bin), so `bin` survives the moves.
                auto& l = info.opened.emplace<1>(std::move(opened[shards_.size()]));
                info.bin = &l.bin();
                info.tokens = l.tokens();
                check_dtype(l.header().dtype, s);
                if (shards_.empty()) delimiter_ = l.header().delimiter;
            } else {
                auto& r = *info.opened.emplace<2>(std::make_unique<raw_token_file>(s, spec.raw_dtype));
                info.bin = &r.bin();
                info.tokens = r.tokens();
                check_dtype(r.dtype(), s);
                delimiter_ = spec.raw_delimiter.value_or(raw_layout::default_delimiter(r.dtype()));
            }
            info.first_token = total_tokens_;
            total_tokens_ += info.tokens;
            shards_.push_back(std::move(info));
        }
        all_local_ = std::all_of(shards_.begin(), shards_.end(), [](const shard_info& s) { return s.bin->local_file() != nullptr; });
        // A pair alone needs no table: its documents are its shard's (a mixture's domain, 32 bytes on the heap).
        if (format_ == dataset_format::megatron && shards_.size() > 1) {
            std::vector<std::uint64_t> starts;
            starts.reserve(shards_.size() + 1);
            starts.push_back(0);
            for (auto& s : shards_) starts.push_back(starts.back() + s.documents);
            document_starts_ = starts;
        }
    }

    dataset_format format() const noexcept { return format_; }
    token_dtype dtype() const noexcept { return dtype_; }
    std::size_t shard_count() const noexcept { return shards_.size(); }
    // Requests shard i's entry, its first 24 bytes (what a window starting in it reads first; the table
    // is 16-byte aligned, so they may straddle two cache lines). Nothing for a shard it does not hold.
    void prefetch_shard(std::uint64_t i) const noexcept {
        if (i >= shards_.size()) return;
        detail::prefetch(&shards_[i].bin);
        detail::prefetch(&shards_[i].mapped_bytes);
    }
    // Requests, a stage a call, what locate() reads of Megatron document d in a dataset of one pair
    // (a mixture's domain; after prefetch_shard(0), whose entry leads on): stage 1 the pair's index
    // view, stage 2, once that is in, d's two entries. A mixture's batch writes a row or two of each of
    // dozens of cold domains, and locating one followed that chain a miss at a time (perf: an eighth
    // of a worker's time at 10,000 domains of Megatron pairs). Nothing for other datasets.
    void prefetch_document(std::uint64_t d, int stage) const noexcept {
        if (shards_.size() != 1) return;
        const auto* opened = std::get_if<0>(&shards_[0].opened);
        if (opened == nullptr) return;
        const megatron_index_view& index = (*opened)->index();
        if (stage == 1)
            index.prefetch_self();
        else if (d < index.sequence_count())
            index.prefetch_sequence(d);
    }
    const shard_info& shard(std::size_t i) const { return shards_.at(i); }
    // Megatron shard i's .bin size when opened, which its index covers exactly (validated then).
    std::uint64_t megatron_bin_end(std::size_t i) const { return std::get<0>(shards_.at(i).opened)->index().data_end(); }
    // Shard i's Megatron prefix or llm.c (raw) file, as given.
    std::string shard_path(std::size_t i) const {
        const std::string& bin = shards_.at(i).bin->name();
        return format_ == dataset_format::megatron ? detail::strip_suffix(bin, ".bin") : bin;
    }
    std::uint64_t total_tokens() const noexcept { return total_tokens_; }
    // Whether every shard is a local file (readers' zero-copy paths map them). Kept from the open: a
    // mixture's shard writer asks once per domain in each batch.
    bool all_local() const noexcept { return all_local_; }
    // The llm.c document delimiter (from the first shard's header, or llm.c's default for its magic);
    // for raw files the token that ends a document (raw_layout::default_delimiter unless set).
    std::uint32_t delimiter() const noexcept { return delimiter_; }
    // Replaces the llm.c delimiter before the document index is built. Throws config_error afterwards.
    void set_delimiter(std::uint32_t d) {
        std::lock_guard lock(index_mutex_);
        if (llmc_indexed_.load()) throw config_error("delimiter", "set it before the document index is built");
        delimiter_ = d;
    }

    // Documents in the dataset. Megatron: O(1). llm.c and raw: builds the document index on first call by
    // scanning the tokens for the delimiter (O(tokens) once; 8 bytes per document).
    std::uint64_t document_count() const {
        if (is_token_stream(format_)) ensure_llmc_index();
        return is_token_stream(format_) ? document_starts_.size() : megatron_documents();
    }
    // Bytes held by llm.c's document index (0 for Megatron, whose .idx is mapped, or before it is built).
    std::uint64_t index_bytes() const noexcept {
        return llmc_indexed_.load(std::memory_order_acquire) ? document_starts_.size() * sizeof(std::uint64_t) : 0;
    }

    // Tokens in document `d` (the sampler's view of a dataset). Megatron: its length entry alone.
    std::uint64_t document_length(std::uint64_t d) const {
        if (is_token_stream(format_)) return document(d).length;
        const auto [shard, local] = megatron_sequence(d);
        return std::get<0>(shards_[shard].opened)->index().length(local);
    }

    // The first document of every shard, ascending, starting with 0 (the sampler's shard blocks).
    std::vector<std::uint64_t> shard_document_starts() const {
        std::vector<std::uint64_t> out;
        std::uint64_t n = document_count();
        if (format_ == dataset_format::megatron) {
            if (shards_.size() == 1)
                out.push_back(0);
            else
                out.assign(document_starts_.begin(), document_starts_.end() - 1);
        } else {
            // The first document starting in each shard that has one (a document may run on into
            // the next shards).
            for (std::size_t s = 0; s < shards_.size(); ++s) {
                const auto d = static_cast<std::uint64_t>(
                    std::lower_bound(document_starts_.begin(), document_starts_.end(), shards_[s].first_token) - document_starts_.begin());
                if (d < n && document_starts_[d] < shards_[s].first_token + shards_[s].tokens) out.push_back(d);
            }
        }
        if (out.empty()) out.push_back(0);
        return out;
    }

    // Where document `d` lives. Megatron: O(log shards). Throws std::out_of_range for a bad index.
    document_span document(std::uint64_t d) const {
        if (is_token_stream(format_)) {
            ensure_llmc_index();
            if (d >= document_starts_.size())
                throw std::out_of_range("document " + std::to_string(d) + " of " + std::to_string(document_starts_.size()));
            const std::uint64_t start = document_starts_[d],
                                end = d + 1 < document_starts_.size() ? document_starts_[d + 1] : total_tokens_;
            // The last shard starting at or before `start` (an empty shard starts where the next one does).
            const auto shard = static_cast<std::uint32_t>(
                std::partition_point(shards_.begin(), shards_.end(), [start](const shard_info& s) { return s.first_token <= start; }) -
                shards_.begin() - 1);
            return {shard, start - shards_[shard].first_token, end - start};
        }
        const auto [shard, local] = megatron_sequence(d);
        const auto e = std::get<0>(shards_[shard].opened)->index().sequence(local);
        return {shard, e.pointer / dtype_size(dtype_), e.length};
    }

    // document(docs[k]) for every k, into out[k] (out.size() >= docs.size()): a batch's documents at
    // once. Megatron reads all their .idx entries under one guard, requested into the cache first so
    // that their misses overlap (per document: two guarded copies and the misses one after another,
    // 28% of a worker's time in a blend of two Megatron pairs before). Throws as document() does.
    void locate(std::span<const std::uint64_t> docs, std::span<document_span> out) const {
        if (is_token_stream(format_)) {
            for (std::size_t k = 0; k < docs.size(); ++k) out[k] = document(docs[k]);
            return;
        }
        for (std::size_t k = 0; k < docs.size(); ++k) {
            const auto [shard, local] = megatron_sequence(docs[k]);
            out[k] = {shard, local, 0};
            std::get<0>(shards_[shard].opened)->index().prefetch_sequence(local);
        }
        volatile std::size_t at = 0;  // the entry being read (kept in memory across the jump)
        const std::uint64_t item = dtype_size(dtype_);
        const bool whole = detail::guarded_reads([&](detail::sigbus_guard& guard) noexcept {
            for (std::size_t k = 0; k < docs.size(); ++k) {
                at = k;
                document_span& o = out[k];
                const auto e = (*std::get_if<0>(&shards_[o.shard].opened))->index().sequence_in(guard, o.first_token);
                o = {o.shard, e.pointer / item, e.length};
            }
        });
        if (!whole) throw std::get<0>(shards_[out[at].shard].opened)->index().shrank_under(out[at].first_token);
    }

    // Appends the read requests that copy tokens [first, first + count) of `doc`, in the file's dtype,
    // to `dest` (count * dtype_size bytes). llm.c documents that run on into the next shard give one
    // request per shard. Throws std::out_of_range when the range is outside the document.
    void append_requests(const document_span& doc, std::uint64_t first, std::uint64_t count, std::byte* dest,
                         std::vector<read_request>& out) const {
        if (first > doc.length || count > doc.length - first)
            throw std::out_of_range("tokens [" + std::to_string(first) + ", " + std::to_string(first + count) + ") outside a document of " +
                                    std::to_string(doc.length));
        append_stream_requests(doc.shard, doc.first_token + first, count, dest, out);
    }

    // As append_requests, for `count` tokens starting at token `first` of `shard`, running on into the
    // following shards (the concatenated token stream, as llm.c reads it).
    void append_stream_requests(std::uint32_t shard, std::uint64_t first, std::uint64_t count, std::byte* dest,
                                std::vector<read_request>& out) const {
        const std::size_t item = dtype_size(dtype_);
        while (count > 0) {
            if (shard >= shards_.size()) throw std::out_of_range("token range runs past the last shard");
            const auto& s = shards_[shard];
            if (first >= s.tokens && is_token_stream(format_)) {
                first -= s.tokens;
                ++shard;
                continue;
            }
            std::uint64_t n = is_token_stream(format_) ? std::min(count, s.tokens - first) : count;
            out.push_back(read_request{s.bin, token_byte_offset(first), n * item, dest});
            dest += n * item;
            count -= n;
            first += n;
        }
    }

    // Byte offset of token `i` within a shard file (after llm.c's header; raw files and Megatron's .bin have none).
    std::uint64_t token_byte_offset(std::uint64_t i) const noexcept { return data_offset_ + i * dtype_size(dtype_); }

    // Reads tokens [first, first + count) of `doc` through `r`, converted to T. Convenience for tools
    // and tests; workers batch append_requests() calls into one read instead.
    template <class T, class Reader>
    void read_tokens(Reader& r, const document_span& doc, std::uint64_t first, std::uint64_t count, T* out) const {
        std::vector<std::byte> raw(count * dtype_size(dtype_));
        std::vector<read_request> reqs;
        append_requests(doc, first, count, raw.data(), reqs);
        r.read(reqs);
        detail::convert_tokens(raw.data(), dtype_, count, out);
    }

private:
    // Megatron document d's shard and its sequence there. Throws std::out_of_range for a bad index.
    std::pair<std::uint32_t, std::uint64_t> megatron_sequence(std::uint64_t d) const {
        if (d >= megatron_documents())
            throw std::out_of_range("document " + std::to_string(d) + " of " + std::to_string(megatron_documents()));
        if (shards_.size() == 1) return {0, d};
        const auto it = std::upper_bound(document_starts_.begin(), document_starts_.end(), d);
        const auto shard = static_cast<std::uint32_t>(it - document_starts_.begin() - 1);
        return {shard, d - document_starts_[shard]};
    }

    std::uint64_t megatron_documents() const noexcept {
        if (shards_.size() == 1) return shards_[0].documents;
        return document_starts_.empty() ? 0 : document_starts_.back();
    }

    void check_dtype(token_dtype t, const std::string& path) {
        if (shards_.empty()) {
            dtype_ = t;
            return;
        }
        if (t != dtype_)
            throw config_error("dataset", path + " holds " + std::string(to_string(t)) + " tokens but earlier shards hold " +
                                              std::string(to_string(dtype_)));
    }

    // llm.c has no document index: find each delimiter. Documents begin with the delimiter; tokens
    // before the first delimiter of the first shard form a document of their own. In raw files the
    // delimiter ends a document (nanoGPT's), so the token after it starts the next. Only where each
    // document starts in the shards' concatenated stream is kept (8 bytes per document): its shard and
    // length follow from its neighbours and the shards' sizes. Built once; later calls take no lock.
    void ensure_llmc_index() const {
        if (llmc_indexed_.load(std::memory_order_acquire)) return;
        std::lock_guard lock(index_mutex_);
        if (llmc_indexed_.load(std::memory_order_relaxed)) return;
        std::vector<std::uint64_t> starts;
        std::vector<std::uint64_t> counts(shards_.size(), 0);
        // Read in chunks through the byte source (pread for a local file) rather than mapped: a shard
        // truncated meanwhile is a format_error, not a SIGBUS, and the chunk stays in cache for the scan.
        const std::size_t item = dtype_size(dtype_);
        const std::uint64_t chunk_tokens = (std::uint64_t(1) << 20) / item;
        std::vector<std::byte> chunk(chunk_tokens * item);
        const bool delimiter_ends = format_ == dataset_format::raw;
        bool after_delimiter = true;  // raw: the first token starts a document
        for (std::uint32_t s = 0; s < shards_.size(); ++s) {
            const byte_source& bin = *shards_[s].bin;
            for (std::uint64_t first = 0; first < shards_[s].tokens; first += chunk_tokens) {
                const std::uint64_t n = std::min(chunk_tokens, shards_[s].tokens - first);
                bin.read_at(chunk.data(), n * item, token_byte_offset(first));
                for (std::uint64_t k = 0; k < n; ++k) {
                    const bool is_delimiter = detail::load_token<std::uint32_t>(chunk.data(), dtype_, k) == delimiter_;
                    if (delimiter_ends ? after_delimiter : is_delimiter || starts.empty()) {
                        starts.push_back(shards_[s].first_token + first + k);
                        ++counts[s];
                    }
                    after_delimiter = is_delimiter;
                }
            }
        }
        starts.shrink_to_fit();  // growth by doubling would leave up to half again unused
        document_starts_ = starts;  // exactly its size
        for (std::size_t s = 0; s < shards_.size(); ++s) shards_[s].documents = counts[s];
        llmc_indexed_.store(true, std::memory_order_release);
    }

    // The small fields first, packed: a mixture holds a dataset per domain (72 bytes).
    dataset_format format_;
    std::uint32_t delimiter_ = llmc_layout::gpt2_eot;
    token_dtype dtype_ = token_dtype::uint16;
    bool all_local_ = true;
    // Held while llm.c's index is built (once, O(tokens)) or the delimiter set. One byte, not a
    // std::mutex's 40 (detail/spin_lock.hpp).
    mutable detail::spin_lock index_mutex_;
    mutable std::atomic<bool> llmc_indexed_{false};
    std::uint32_t data_offset_ = 0;  // bytes before token 0 in every shard file (llm.c's header)
    std::uint64_t total_tokens_ = 0;
    mutable detail::one_in_place<shard_info> shards_;  // a one-shard dataset's entry in place (a mixture's domain)
    // Megatron: the first global document of each shard, then the total (set at open; empty for one
    // shard). llm.c and raw:
    // where each document starts in the shards' concatenated stream (ensure_llmc_index). One array
    // for either, of exactly its entries (no vector's capacity): a mixture holds a dataset per domain.
    mutable detail::fixed_array<std::uint64_t> document_starts_;
};

}  // namespace feedline
