// feedline/sampling/windows.hpp: which tokens make up sample i of an epoch.
// An epoch lays documents out in a (shuffled) order and concatenates them. GPT windows cut seq_len + 1
// tokens every seq_len tokens from that stream, crossing document boundaries as Megatron's GPT dataset
// does, so consecutive windows share one token and every token is a target once per epoch. Packed
// rows place whole documents into rows of seq_len tokens (splitting only documents longer than a row)
// and record where each document starts. Both need only O(documents) memory per epoch: prefix sums of
// lengths in epoch order (and, packed, each document's first row), never an O(tokens) or O(samples)
// array. Fed by a dataset's document lengths; feeds sampling/sampler.hpp.
#pragma once

#include <algorithm>
#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <new>  // std::launder
#include <span>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include <feedline/detail/prefetch.hpp>
#include <feedline/error.hpp>
#include <feedline/names.hpp>
#include <feedline/sampling/permutation.hpp>

namespace feedline {

// Anything with documents of known token counts: token_dataset, or a synthetic description.
template <class D>
concept document_lengths = requires(const D& d, std::uint64_t i) {
    { d.document_count() } -> std::convertible_to<std::uint64_t>;
    { d.document_length(i) } -> std::convertible_to<std::uint64_t>;
};

enum class shuffle_mode {
    none,          // documents in dataset order
    global,        // one permutation over all documents
    shard_blocks,  // shards in a shuffled order, documents shuffled within each shard (cold storage
                   // reads one shard at a time)
};
enum class sample_mode { windows, packed };

template <>
struct enum_names<shuffle_mode> {
    static constexpr std::array values{named(shuffle_mode::none, "none"), named(shuffle_mode::global, "global"),
                                       named(shuffle_mode::shard_blocks, "shard_blocks")};
};
template <>
struct enum_names<sample_mode> {
    static constexpr std::array values{named(sample_mode::windows, "windows"), named(sample_mode::packed, "packed")};
};

// Tokens [offset, offset + length) of document `document` (a dataset document number).
struct segment {
    std::uint64_t document = 0;
    std::uint64_t offset = 0;
    std::uint64_t length = 0;
    friend bool operator==(const segment&, const segment&) = default;
};

// Upper/lower bound over a large sorted array through a sampled copy of every 64th entry: the
// coarse search stays in cache (1/64 of the size) and the fine one touches one 512-byte block, so a
// lookup in 10^7 entries costs a few cache misses instead of ~13 for a plain binary search.
class block_search {
public:
    static constexpr std::size_t stride = 64;

    void build(const std::vector<std::uint64_t>& sorted) {
        coarse_.clear();
        coarse_.reserve(sorted.size() / stride + 1);
        for (std::size_t i = 0; i < sorted.size(); i += stride) coarse_.push_back(sorted[i]);
    }
    // Index of the first element > v (std::upper_bound).
    std::size_t upper_bound(const std::vector<std::uint64_t>& sorted, std::uint64_t v) const noexcept {
        return bound(sorted, v, [](std::uint64_t a, std::uint64_t b) { return a <= b; });
    }
    // Index of the first element >= v (std::lower_bound).
    std::size_t lower_bound(const std::vector<std::uint64_t>& sorted, std::uint64_t v) const noexcept {
        return bound(sorted, v, [](std::uint64_t a, std::uint64_t b) { return a < b; });
    }
    std::size_t memory_bytes() const noexcept { return coarse_.capacity() * 8; }

private:
    // `before(x, v)`: x lies before the answer.
    template <class Before>
    std::size_t bound(const std::vector<std::uint64_t>& sorted, std::uint64_t v, Before before) const noexcept {
        // Blocks whose first element lies before the answer: the answer is in the last of them (or
        // just after it).
        auto c = std::partition_point(coarse_.begin(), coarse_.end(), [&](std::uint64_t x) { return before(x, v); });
        std::size_t block = static_cast<std::size_t>(c - coarse_.begin());
        if (block == 0) return 0;
        auto first = sorted.begin() + static_cast<std::ptrdiff_t>((block - 1) * stride);
        auto last = sorted.begin() + static_cast<std::ptrdiff_t>(std::min(sorted.size(), block * stride));
        return static_cast<std::size_t>(std::partition_point(first, last, [&](std::uint64_t x) { return before(x, v); }) - sorted.begin());
    }
    std::vector<std::uint64_t> coarse_;
};

namespace detail {

// The documents of one epoch in order, with prefix sums of their lengths.
class epoch_layout {
    // (Defined before their uses: their return types are deduced.)
    // The prefix sums (prefix_) as the type they are kept in.
    template <class F>
    decltype(auto) with_sums(F&& f) const {
        return narrow_ ? f(static_cast<const std::uint32_t*>(prefix_.narrow)) : f(static_cast<const std::uint64_t*>(prefix_.wide));
    }
    template <class F>
    decltype(auto) with_sums(F&& f) {
        return narrow_ ? f(prefix_.narrow) : f(prefix_.wide);
    }
    std::uint64_t sum_at(std::uint64_t k) const noexcept { return narrow_ ? prefix_.narrow[k] : prefix_.wide[k]; }

public:
    // O(documents) time and memory. `block_starts` (shard_blocks mode) holds the first document of
    // each block in dataset order, ascending, starting with 0.
    template <document_lengths D>
    epoch_layout(const D& data, shuffle_mode mode, std::uint64_t seed, std::uint64_t epoch,
                 std::span<const std::uint64_t> block_starts = {})
            : epoch_layout(data, mode, seed, epoch, block_starts, nullptr) {}

    // The same in one allocation: the layout, then its tables (what a dataset_stream keeps; a mixture
    // keeps one per domain of several documents, where a layout and a block of tables apart cost two
    // chunk headers and a pointer chased, and tables inside a fixed-size layout carried unused room).
    template <document_lengths D>
    static std::unique_ptr<epoch_layout> make(const D& data, shuffle_mode mode, std::uint64_t seed, std::uint64_t epoch,
                                              std::span<const std::uint64_t> block_starts = {}) {
        check_size(data.document_count());
        const bool narrow = narrow_sums(data);
        const std::size_t tables = table_bytes(data.document_count(), mode, narrow);
        void* at = ::operator new(sizeof(epoch_layout) + tables);
        try {
            return std::unique_ptr<epoch_layout>(::new (at) epoch_layout(data, mode, seed, epoch, block_starts,
                                                                         static_cast<std::byte*>(at) + sizeof(epoch_layout), narrow));
        } catch (...) {
            ::operator delete(at);
            throw;
        }
    }
    // For make()'s layouts, whose tables share their allocation (and any other: the global allocator's).
    static void operator delete(void* p) noexcept { ::operator delete(p); }

private:
    // `tables`: table_bytes(documents, mode, narrow) bytes for the tables, or null for a block of their
    // own (`narrow` then found here).
    template <document_lengths D>
    epoch_layout(const D& data, shuffle_mode mode, std::uint64_t seed, std::uint64_t epoch, std::span<const std::uint64_t> block_starts,
                 std::byte* tables, bool narrow = false)
            : documents_(data.document_count()), mode_(mode), narrow_(tables == nullptr ? narrow_sums(data) : narrow) {
        if (mode == shuffle_mode::global) {
            shuffle_ = std::make_unique<shuffle_state>();
            shuffle_->perm = feistel_permutation(documents_, permutation_key(seed, epoch, 1));
        } else if (mode == shuffle_mode::shard_blocks) {
            shuffle_ = std::make_unique<shuffle_state>();
            auto& starts = shuffle_->starts;
            starts.assign(block_starts.begin(), block_starts.end());
            if (starts.empty() || starts.front() != 0) starts.insert(starts.begin(), 0);
            starts.push_back(documents_);
            const std::uint64_t nblocks = starts.size() - 1;
            shuffle_->perm = feistel_permutation(nblocks, permutation_key(seed, epoch, 2));
            // Position of each (shuffled) block's first document in epoch order.
            shuffle_->positions.resize(nblocks + 1, 0);
            for (std::uint64_t b = 0; b < nblocks; ++b) {
                std::uint64_t src = shuffle_->perm(b);
                shuffle_->positions[b + 1] = shuffle_->positions[b] + (starts[src + 1] - starts[src]);
            }
            shuffle_->seed = seed;
            shuffle_->epoch = epoch;
        }
        // The epoch order is kept as a table (4 bytes per document, as long as ids fit), so a window's
        // document costs a load instead of a permutation's ~25 mixing rounds: with 100,000 documents
        // and 256 x 128 windows, planning took ~290 ns per window before, ~165 with the table.
        // A block of their own is freed by this layout's destructor; until the body is done, by `apart`.
        std::unique_ptr<std::byte[]> apart;
        if (tables == nullptr) {
            check_size(documents_);
            apart = std::make_unique_for_overwrite<std::byte[]>(table_bytes(documents_, mode_, narrow_));
            tables = apart.get();
        }
        // Trivial types in a byte array: C++20 creates them implicitly.
        const std::size_t sums_bytes = (documents_ + 1) * (narrow_ ? sizeof(std::uint32_t) : sizeof(std::uint64_t));
        if (narrow_)
            prefix_.narrow = std::launder(reinterpret_cast<std::uint32_t*>(tables));
        else
            prefix_.wide = std::launder(reinterpret_cast<std::uint64_t*>(tables));
        if (ordered(documents_, mode_)) order_ = std::launder(reinterpret_cast<std::uint32_t*>(tables + sums_bytes));
        if (bucketed(documents_))
            bucket_ = std::launder(
                reinterpret_cast<std::uint32_t*>(tables + sums_bytes + (order_ != nullptr ? documents_ * sizeof(std::uint32_t) : 0)));
        with_sums([&](auto* sums) {
            using sum = std::remove_pointer_t<decltype(sums)>;
            sums[0] = 0;
            for (std::uint64_t k = 0; k < documents_; ++k) {
                const std::uint64_t d = permuted_document(k);
                if (order_ != nullptr) order_[k] = static_cast<std::uint32_t>(d);
                sums[k + 1] = static_cast<sum>(sums[k] + data.document_length(d));  // narrow: the total fits (narrow_sums)
            }
        });
        if (order_ != nullptr && mode_ == shuffle_mode::global) shuffle_.reset();  // the table answers from here on
        build_buckets();
        tables_apart_ = apart.release() != nullptr;
    }

public:
    // Its tables may sit right after it.
    epoch_layout(const epoch_layout&) = delete;
    epoch_layout& operator=(const epoch_layout&) = delete;
    ~epoch_layout() {
        if (tables_apart_) delete[] reinterpret_cast<std::byte*>(prefix_.wide);
    }

    // Up to this many documents, their epoch order is a table of 4-byte ids.
    static constexpr std::uint64_t order_table_max = 0xFFFFFFFFull;

    std::uint64_t documents() const noexcept { return documents_; }
    std::uint64_t tokens() const noexcept { return sum_at(documents_); }
    // shuffle_mode::shard_blocks: the first document of each block, as given (with a leading 0); what
    // the next epoch's layout is made from (a stream keeps them nowhere else). Empty in other modes.
    std::span<const std::uint64_t> block_starts() const noexcept {
        if (mode_ != shuffle_mode::shard_blocks || !shuffle_) return {};
        return {shuffle_->starts.data(), shuffle_->starts.size() - 1};
    }

    // The dataset document at epoch position k. O(1) (O(log shards) in shard_blocks mode). Without the
    // order table (past 2^32 documents) a k past the epoch reaches the permutation, which throws
    // std::out_of_range.
    std::uint64_t document_at(std::uint64_t k) const { return order_ == nullptr ? permuted_document(k) : order_[k]; }
    std::uint64_t length_at(std::uint64_t k) const noexcept { return sum_at(k + 1) - sum_at(k); }
    std::uint64_t first_token_at(std::uint64_t k) const noexcept { return sum_at(k); }

    // The epoch position holding stream token p (p < tokens()); empty documents are skipped. The
    // bucket of p names the document holding its first token; p's document is that one or one of the
    // few starting later in the bucket (one or two on average: buckets are about a document long),
    // found by a binary search among those alone. Random windows over many documents cost one or two
    // cache misses here, where a binary search over all the prefix sums cost ~6 dependent ones.
    std::uint64_t position_of_token(std::uint64_t p) const noexcept {
        return with_sums([&](const auto* sums) -> std::uint64_t {
            if (bucket_ == nullptr) return static_cast<std::uint64_t>(std::upper_bound(sums, sums + documents_ + 1, p) - sums) - 1;
            const std::uint64_t b = p >> bucket_shift_;
            const std::uint64_t first = bucket_[b], last = bucket_[b + 1];  // p's document lies in [first, last]
            if (first == last || sums[first + 1] > p) return first;
            return static_cast<std::uint64_t>(std::upper_bound(sums + first + 1, sums + last + 1, p) - sums) - 1;
        });
    }

    // A batch's look-ups in two requests ahead of them: the random windows of a dataset of many
    // documents miss in the bucket table, then in the prefix sums and the order table, each miss
    // after the one before (perf: ~25% of a worker's time in a blend of two Megatron pairs of 40,000
    // documents each). Stage 0 requests token p's bucket; stage 1, once the batch's buckets are in,
    // the entries its search starts at.
    void prefetch_position(std::uint64_t p, int stage) const noexcept {
        if (bucket_ == nullptr) return;
        const std::uint64_t b = p >> bucket_shift_;
        if (stage == 0) {
            detail::prefetch(bucket_ + b);
            return;
        }
        const std::uint64_t first = bucket_[b];
        with_sums([&](const auto* sums) { detail::prefetch(sums + first + 1); });
        if (order_ != nullptr) detail::prefetch(order_ + first);
    }

    // Appends the segments covering stream tokens [begin, begin + count). O(log documents + segments).
    void segments(std::uint64_t begin, std::uint64_t count, std::vector<segment>& out) const {
        if (count == 0) return;
        std::uint64_t k = position_of_token(begin);
        std::uint64_t offset = begin - sum_at(k);
        while (count > 0) {
            std::uint64_t take = std::min(count, length_at(k) - offset);
            if (take > 0) out.push_back({document_at(k), offset, take});
            count -= take;
            offset = 0;
            ++k;
        }
    }

    // What a planner requests of a layout it is about to read (dataset_stream::prefetch_layout), from
    // its address alone: the layout and the first of its tables, all of them up to about ten
    // documents (a mixture's domain of a Megatron pair or a few shards).
    static constexpr std::size_t prefetched_bytes = 192;

    std::size_t memory_bytes() const noexcept {
        return sizeof *this + table_bytes(documents_, mode_, narrow_) +
               (shuffle_ ? sizeof *shuffle_ + (shuffle_->starts.capacity() + shuffle_->positions.capacity()) * 8 : 0);
    }

private:
    std::uint64_t permuted_document(std::uint64_t k) const {
        switch (mode_) {
            case shuffle_mode::none: return k;
            case shuffle_mode::global: return shuffle_->perm(k);
            case shuffle_mode::shard_blocks: {
                const auto& positions = shuffle_->positions;
                auto b = static_cast<std::uint64_t>(std::upper_bound(positions.begin(), positions.end(), k) - positions.begin() - 1);
                std::uint64_t src = shuffle_->perm(b);
                std::uint64_t size = shuffle_->starts[src + 1] - shuffle_->starts[src];
                feistel_permutation within(size, permutation_key(shuffle_->seed, shuffle_->epoch, 3 + src));
                return shuffle_->starts[src] + within(k - positions[b]);
            }
        }
        return k;
    }

    // The epoch's shuffle, kept apart so that a layout is 48 bytes: shuffle_mode::global, the
    // documents' permutation (only while order_ is built, unless ids do not fit it); shard_blocks,
    // the blocks' order and where each lies.
    struct shuffle_state {
        feistel_permutation perm;                      // global: the documents'; shard_blocks: the blocks'
        std::vector<std::uint64_t> starts, positions;  // first document of each block: in the dataset, in the epoch
        std::uint64_t seed = 0, epoch = 0;
    };

    std::uint64_t documents_;
    std::unique_ptr<shuffle_state> shuffle_;
    // The tables, one block (right after the layout, from make(); else their own): prefix sums, then
    // the order, then the buckets.
    // documents_ + 1 prefix sums of the lengths in epoch order: 4 bytes each for a few documents of
    // fewer than 2^32 tokens (narrow_sums: a mixture's domains), else 8.
    union {
        std::uint64_t* wide;
        std::uint32_t* narrow;
    } prefix_{nullptr};
    std::uint32_t* order_ = nullptr;   // document_at's answers (null when ids do not fit 4 bytes, or unshuffled)
    // bucket_[b]: the epoch position holding token b << bucket_shift_ (one past the end: the last
    // position), so bucket b's tokens lie in positions [bucket_[b], bucket_[b + 1]]. Null when
    // positions do not fit 4 bytes, or for a few documents (a plain binary search then).
    std::uint32_t* bucket_ = nullptr;
    shuffle_mode mode_;
    bool narrow_;                // prefix_.narrow
    bool tables_apart_ = false;  // the tables are a block of their own (new[]), not right after the layout
    std::uint8_t bucket_shift_ = 0;  // below 64

    static bool ordered(std::uint64_t documents, shuffle_mode mode) noexcept {
        return mode != shuffle_mode::none && documents <= order_table_max;
    }
    // Up to this many documents, a binary search over the prefix sums (at most three cache lines, all
    // requested with the layout) costs what the buckets would, without their bytes.
    static constexpr std::uint64_t unbucketed_max = 16;
    static bool bucketed(std::uint64_t documents) noexcept { return documents > unbucketed_max && documents <= order_table_max; }
    // The tables' bytes, 8-aligned: documents + 1 prefix sums, the order, and at most documents + 1
    // bucket entries (build_buckets).
    static void check_size(std::uint64_t documents) {
        if (documents > (std::numeric_limits<std::size_t>::max() >> 5)) throw std::length_error("epoch_layout: too many documents");
    }
    static std::size_t table_bytes(std::uint64_t documents, shuffle_mode mode, bool narrow) noexcept {
        const std::size_t n = static_cast<std::size_t>(documents);
        std::size_t bytes = (n + 1) * (narrow ? sizeof(std::uint32_t) : sizeof(std::uint64_t));
        if (ordered(documents, mode)) bytes += n * sizeof(std::uint32_t);
        if (bucketed(documents)) bytes += (n + 1) * sizeof(std::uint32_t);
        return (bytes + 7) & ~std::size_t{7};
    }

    // Up to this many documents, the layout sums their lengths first (a pass over a few cached entries)
    // and keeps 4-byte prefix sums when the total fits: a mixture's domain of a Megatron pair of nine
    // documents saves 40 of its layout's 168 bytes. Larger layouts keep 8-byte sums without the pass.
    static constexpr std::uint64_t narrow_max = 256;
    template <document_lengths D>
    static bool narrow_sums(const D& data) {
        const std::uint64_t n = data.document_count();
        if (n > narrow_max) return false;
        std::uint64_t total = 0;
        for (std::uint64_t d = 0; d < n; ++d)
            if ((total += data.document_length(d)) > std::numeric_limits<std::uint32_t>::max()) return false;
        return true;
    }

    // Buckets of a power-of-two number of tokens at least the mean document length, rounded up: at
    // most one per document (2^shift >= ceil(tokens / documents), so (tokens - 1) >> shift < documents),
    // plus one, 4 bytes each, in the room table_bytes left. One merge-like pass.
    void build_buckets() {
        if (bucket_ == nullptr) return;
        const std::uint64_t tokens = sum_at(documents_), mean = std::max<std::uint64_t>(1, (tokens + documents_ - 1) / documents_);
        bucket_shift_ = static_cast<std::uint8_t>(std::bit_width(mean - 1));
        const std::uint64_t buckets = tokens ? ((tokens - 1) >> bucket_shift_) + 1 : 0;
        std::uint64_t k = 0;
        for (std::uint64_t b = 0; b < buckets; ++b) {
            const std::uint64_t t = b << bucket_shift_;
            while (sum_at(k + 1) <= t) ++k;
            bucket_[b] = static_cast<std::uint32_t>(k);
        }
        bucket_[buckets] = static_cast<std::uint32_t>(documents_ ? documents_ - 1 : 0);
    }
};

// GPT windows over an epoch layout: sample s is stream tokens [s * seq_len, s * seq_len + seq_len + 1).
class gpt_windows {
public:
    gpt_windows(const epoch_layout& layout, std::uint64_t seq_len) : layout_(&layout), seq_len_(seq_len) {
        if (seq_len == 0) throw config_error("seq_len", "must be at least 1");
    }
    // Windows per epoch: every token but the first is a target exactly once; a last partial window is
    // dropped (as Megatron does).
    std::uint64_t count() const noexcept { return layout_->tokens() > seq_len_ ? (layout_->tokens() - 1) / seq_len_ : 0; }
    void segments(std::uint64_t sample, std::vector<segment>& out) const { layout_->segments(sample * seq_len_, seq_len_ + 1, out); }
    // Requests what segments(sample) reads, in two stages (epoch_layout::prefetch_position).
    void prefetch(std::uint64_t sample, int stage) const noexcept { layout_->prefetch_position(sample * seq_len_, stage); }

private:
    const epoch_layout* layout_;
    std::uint64_t seq_len_;
};

// Packed rows: documents placed greedily, in epoch order, into rows of seq_len tokens. A document that
// fits in a row but not in the rest of the current one starts the next row (the rest is padding). A
// document longer than a row is split anyway, so it starts right where the previous one ended and
// fills as many rows as it needs, its tail sharing a row with what follows: padding only ever
// protects a document that could have been whole.
class packed_rows {
public:
    // One pass over the documents: O(documents) time, 8 bytes per document (its first slot,
    // row * seq_len + column, which encodes both).
    packed_rows(const epoch_layout& layout, std::uint64_t seq_len) : layout_(&layout), seq_len_(seq_len) {
        if (seq_len == 0) throw config_error("seq_len", "must be at least 1");
        const std::uint64_t n = layout.documents();
        first_slot_.resize(n);
        std::uint64_t slot = 0;
        for (std::uint64_t k = 0; k < n; ++k) {
            std::uint64_t len = layout.length_at(k), col = slot % seq_len;
            if (len <= seq_len && col > 0 && col + len > seq_len) {  // would be split needlessly: pad
                padding_ += seq_len - col;
                slot += seq_len - col;
            }
            first_slot_[k] = slot;
            slot += len;
        }
        if (slot % seq_len != 0) padding_ += seq_len - slot % seq_len;
        rows_ = (slot + seq_len - 1) / seq_len;
        search_.build(first_slot_);
    }

    std::uint64_t count() const noexcept { return rows_; }
    // Padding tokens in the whole epoch (reported by the sampler's stats).
    std::uint64_t padding() const noexcept { return padding_; }

    // Segments of row r in order; their lengths sum to at most seq_len (the rest is padding).
    // O(log documents + documents in the row).
    void segments(std::uint64_t r, std::vector<segment>& out) const {
        const std::uint64_t row_begin = r * seq_len_, row_end = row_begin + seq_len_;
        const std::size_t end = search_.lower_bound(first_slot_, row_end);
        if (end == 0) return;
        // Documents meeting the row are contiguous and end at the last one starting before row_end;
        // walk back to the first of them.
        std::uint64_t k = end - 1;
        while (k > 0 && first_slot_[k] > row_begin) --k;
        for (; k < first_slot_.size() && first_slot_[k] < row_end; ++k) {
            std::uint64_t begin = first_slot_[k], end = begin + layout_->length_at(k);
            if (end <= row_begin) continue;
            std::uint64_t from = std::max(begin, row_begin), to = std::min(end, row_end);
            out.push_back({layout_->document_at(k), from - begin, to - from});
        }
    }

    std::size_t memory_bytes() const noexcept { return first_slot_.capacity() * 8 + search_.memory_bytes(); }

private:
    const epoch_layout* layout_;
    std::uint64_t seq_len_;
    std::vector<std::uint64_t> first_slot_;
    block_search search_;
    std::uint64_t rows_ = 0, padding_ = 0;
};

// Attention boundaries of one packed row, for kernels that keep attention inside documents
// (FlashAttention's varlen cu_seqlens): cu_seqlens = {0, end of piece 1, ..., tokens used}, and
// position ids restarting at 0 at the start of every piece (a document split across rows restarts
// in the next row too, so positions stay below seq_len). Padding slots get position 0.
struct row_boundaries {
    std::vector<std::int32_t> cu_seqlens;
    std::vector<std::int32_t> position_ids;  // seq_len entries
    std::uint64_t padding = 0;               // slots after the last piece
};

inline void boundaries_of(std::span<const segment> pieces, std::uint64_t seq_len, row_boundaries& out) {
    out.cu_seqlens.assign(1, 0);
    out.position_ids.assign(seq_len, 0);
    std::uint64_t at = 0;
    for (const segment& s : pieces) {
        if (s.length == 0) continue;
        if (at + s.length > seq_len) throw config_error("seq_len", "row pieces hold more than seq_len tokens");
        for (std::uint64_t t = 0; t < s.length; ++t) out.position_ids[at + t] = static_cast<std::int32_t>(t);
        at += s.length;
        out.cu_seqlens.push_back(static_cast<std::int32_t>(at));
    }
    out.padding = seq_len - at;
}

}  // namespace detail

}  // namespace feedline
