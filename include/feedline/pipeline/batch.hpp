// feedline/pipeline/batch.hpp: what a batch looks like in a ring slot, and the trainer's view of it.
// A slot holds [B, T] int32 inputs and targets (targets[i] = the token after inputs[i]; -1 where there
// is none: padding, or the end of a piece of a split document in packed mode). Packed mode adds, per
// row, position ids that restart at every document piece, cu_seqlens (FlashAttention varlen style,
// T + 1 entries, the last used one repeated) and the number of pieces. Regions start on 256-byte
// boundaries so device kernels read them aligned. Fed by the pipeline's workers; read by the trainer.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <optional>
#include <span>

#include <feedline/device/staging_ring.hpp>
#include <feedline/sampling/windows.hpp>

namespace feedline {

struct batch_layout {
    std::uint64_t batch = 0, seq_len = 0;
    bool packed = false;
    std::size_t inputs = 0, targets = 0, position_ids = 0, cu_seqlens = 0, pieces = 0;  // byte offsets
    std::size_t bytes = 0;                                                               // slot size

    static batch_layout make(std::uint64_t batch, std::uint64_t seq_len, bool packed) {
        auto align = [](std::size_t x) { return (x + 255) & ~std::size_t(255); };
        batch_layout l;
        l.batch = batch;
        l.seq_len = seq_len;
        l.packed = packed;
        const std::size_t tokens = batch * seq_len * sizeof(std::int32_t);
        l.inputs = 0;
        l.targets = align(tokens);
        std::size_t end = l.targets + tokens;
        if (packed) {
            l.position_ids = align(end);
            l.cu_seqlens = align(l.position_ids + tokens);
            l.pieces = align(l.cu_seqlens + batch * (seq_len + 1) * sizeof(std::int32_t));
            end = l.pieces + batch * sizeof(std::int32_t);
        }
        l.bytes = align(end);
        return l;
    }
};

// One step's batch for this rank. Move-only; returns its slot when released or destroyed.
class batch {
public:
    batch(batch_handle h, const batch_layout* layout) : handle_(std::move(h)), layout_(layout) {}

    std::uint64_t step() const noexcept { return handle_.sequence(); }
    std::uint64_t size() const noexcept { return layout_->batch; }
    std::uint64_t seq_len() const noexcept { return layout_->seq_len; }
    bool packed() const noexcept { return layout_->packed; }
    const batch_layout& layout() const noexcept { return *layout_; }

    // Where compute reads: GPU memory with the pinned ring, host memory with the host ring. [B, T].
    const std::int32_t* inputs() const noexcept { return at(layout_->inputs); }
    const std::int32_t* targets() const noexcept { return at(layout_->targets); }
    // Packed mode only (null otherwise): [B, T] positions, [B, T + 1] cu_seqlens, [B] piece counts.
    const std::int32_t* position_ids() const noexcept { return layout_->packed ? at(layout_->position_ids) : nullptr; }
    const std::int32_t* cu_seqlens() const noexcept { return layout_->packed ? at(layout_->cu_seqlens) : nullptr; }
    const std::int32_t* pieces() const noexcept { return layout_->packed ? at(layout_->pieces) : nullptr; }

    // The same in host memory (always readable on the CPU).
    std::span<const std::int32_t> host_inputs() const noexcept { return host(layout_->inputs, tokens()); }
    std::span<const std::int32_t> host_targets() const noexcept { return host(layout_->targets, tokens()); }
    std::span<const std::int32_t> host_position_ids() const noexcept { return layout_->packed ? host(layout_->position_ids, tokens()) : std::span<const std::int32_t>{}; }
    std::span<const std::int32_t> host_cu_seqlens() const noexcept {
        return layout_->packed ? host(layout_->cu_seqlens, layout_->batch * (layout_->seq_len + 1)) : std::span<const std::int32_t>{};
    }
    std::span<const std::int32_t> host_pieces() const noexcept { return layout_->packed ? host(layout_->pieces, layout_->batch) : std::span<const std::int32_t>{}; }

    bool on_device() const noexcept { return handle_.data() != static_cast<const void*>(handle_.host()); }
    // GPU: make `stream` (a cudaStream_t) wait for the copy, without a host sync. CPU: nothing.
    void wait_on(void* stream) { handle_.wait_on(stream); }
    // Return the slot now (GPU: after the work queued on `stream`). Otherwise at destruction.
    void release(void* stream = nullptr) noexcept { handle_.release(stream); }
    batch_handle& handle() noexcept { return handle_; }

private:
    std::uint64_t tokens() const noexcept { return layout_->batch * layout_->seq_len; }
    const std::int32_t* at(std::size_t offset) const noexcept {
        return reinterpret_cast<const std::int32_t*>(static_cast<const std::byte*>(handle_.data()) + offset);
    }
    std::span<const std::int32_t> host(std::size_t offset, std::size_t n) const noexcept {
        return {reinterpret_cast<const std::int32_t*>(handle_.host() + offset), n};
    }

    batch_handle handle_;
    const batch_layout* layout_;
};

// A packed row's bookkeeping, once its first T - padding inputs are written from `bounds`' pieces:
// zero inputs on the padding, targets (the next token of the same piece; -1 at a piece's end and on
// padding), position ids, cu_seqlens (T + 1 entries, the last used one repeated). Returns the number
// of pieces. Shared by every pipeline that packs, so their slots agree to the token.
inline std::int32_t finish_packed_row(const row_boundaries& bounds, std::uint64_t T, std::int32_t* in, std::int32_t* tg, std::int32_t* positions,
                                      std::int32_t* cu) {
    const std::uint64_t used = T - bounds.padding;
    std::fill(in + used, in + T, 0);
    for (std::uint64_t j = 0; j + 1 < used; ++j) tg[j] = in[j + 1];
    std::fill(tg + (used ? used - 1 : 0), tg + T, -1);
    for (std::size_t k = 1; k + 1 < bounds.cu_seqlens.size(); ++k) tg[bounds.cu_seqlens[k] - 1] = -1;
    std::copy(bounds.position_ids.begin(), bounds.position_ids.end(), positions);
    std::copy(bounds.cu_seqlens.begin(), bounds.cu_seqlens.end(), cu);
    std::fill(cu + bounds.cu_seqlens.size(), cu + T + 1, bounds.cu_seqlens.back());
    return static_cast<std::int32_t>(bounds.cu_seqlens.size() - 1);
}

// Range-for over anything with `std::optional<batch> next()`: for (auto& b : pipeline) { ... }. Ends
// when next() is empty (after max_steps, or never). Each step releases the previous batch's slot
// before waiting for the next one.
template <class Source>
class batch_iterator {
public:
    using value_type = batch;
    using difference_type = std::ptrdiff_t;
    batch_iterator() = default;
    explicit batch_iterator(Source* s) : s_(s) { ++*this; }
    batch& operator*() { return *current_; }
    batch_iterator& operator++() {
        current_.reset();
        current_ = s_->next();
        if (!current_) s_ = nullptr;
        return *this;
    }
    void operator++(int) { ++*this; }
    friend bool operator==(const batch_iterator& a, std::default_sentinel_t) { return a.s_ == nullptr; }

private:
    Source* s_ = nullptr;
    std::optional<batch> current_;
};

}  // namespace feedline
