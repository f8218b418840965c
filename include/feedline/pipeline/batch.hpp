// feedline/pipeline/batch.hpp: the trainer's view of one step's batch in its ring slot (the slot's
// layout is transform/collate.hpp's batch_layout): [B, T] int32 inputs and targets and, in packed
// mode, position ids, cu_seqlens and piece counts, on the device with the pinned ring and always in
// host memory too. Fed by the pipeline's workers; read by the trainer.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <optional>
#include <span>

#include <feedline/device/staging_ring.hpp>
#include <feedline/transform/collate.hpp>

namespace feedline {

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
    std::span<const std::int32_t> host_position_ids() const noexcept {
        return layout_->packed ? host(layout_->position_ids, tokens()) : std::span<const std::int32_t>{};
    }
    std::span<const std::int32_t> host_cu_seqlens() const noexcept {
        return layout_->packed ? host(layout_->cu_seqlens, layout_->batch * (layout_->seq_len + 1)) : std::span<const std::int32_t>{};
    }
    std::span<const std::int32_t> host_pieces() const noexcept {
        return layout_->packed ? host(layout_->pieces, layout_->batch) : std::span<const std::int32_t>{};
    }
    // [B]: the dataset each row came from, as its position in the pipeline's blend (all 0 for one dataset).
    std::span<const std::int32_t> host_datasets() const noexcept { return host(layout_->datasets, layout_->batch); }

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
