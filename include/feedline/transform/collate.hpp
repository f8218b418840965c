// feedline/transform/collate.hpp: tokens into a batch's slot, the same for every source. A slot holds
// [B, T] int32 inputs and targets (targets[i] = the token after inputs[i]; ignore_index, -1 by default,
// where there is none: padding, or the end of a piece of a split document in packed mode). Packed mode adds, per row,
// position ids that restart at every document piece, cu_seqlens (FlashAttention varlen style, T + 1
// entries, the last used one repeated) and the number of pieces. Regions start on 256-byte boundaries
// so device kernels read them aligned.
// A window row is T + 1 consecutive tokens: token k goes to inputs[k] (k < T) and to targets[k - 1]
// (k >= 1), so a source writes each token where it belongs as it converts it, in pieces, without a
// staging row. A packed row is written as its segments' tokens from column 0; finish_packed_rows then
// adds what follows from the plan alone (padding, targets, positions, cu_seqlens, piece counts).
// Every slot ends with each row's dataset number (its position in a blend), so a trainer can log loss
// per dataset. Fed by the sources' workers (pipeline/shard_source.hpp, pipeline/text_source.hpp); read by the trainer
// through pipeline/batch.hpp.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include <feedline/error.hpp>
#include <feedline/format/dtype.hpp>
#include <feedline/sampling/sampler.hpp>
#include <feedline/sampling/windows.hpp>

namespace feedline {

struct batch_layout {
    std::uint64_t batch = 0, seq_len = 0;
    bool packed = false;
    std::size_t inputs = 0, targets = 0, position_ids = 0, cu_seqlens = 0, pieces = 0, datasets = 0;  // byte offsets
    std::size_t bytes = 0;                                                                            // slot size

    // Throws config_error("batch_size") when the slot's size does not fit in memory's address range
    // (batch x seq_len is multiplied by up to 4 x 4 bytes below; seq_len itself is bounded by the
    // pipeline's checks).
    static batch_layout make(std::uint64_t batch, std::uint64_t seq_len, bool packed) {
        constexpr std::uint64_t limit = std::uint64_t(1) << 48;  // 256 TiB: past any machine, far from wrapping
        if (batch == 0 || seq_len == 0 || seq_len > limit || batch > limit / 16 / (seq_len + 1))
            throw config_error("batch_size", std::to_string(batch) + " x " + std::to_string(seq_len) +
                                                 " tokens per batch: a slot of that size cannot be allocated");
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
        l.datasets = align(end);
        l.bytes = align(l.datasets + batch * sizeof(std::int32_t));
        return l;
    }
};

// A slot's regions as typed pointers, for the workers filling it.
struct slot_view {
    std::int32_t* inputs = nullptr;
    std::int32_t* targets = nullptr;
    std::int32_t* positions = nullptr;   // packed only
    std::int32_t* cu_seqlens = nullptr;  // packed only
    std::int32_t* pieces = nullptr;      // packed only
    std::int32_t* datasets = nullptr;    // [B]: which blended dataset each row came from (0 for one dataset)
    std::uint64_t seq_len = 0;

    slot_view(std::byte* slot, const batch_layout& l) : seq_len(l.seq_len) {
        inputs = reinterpret_cast<std::int32_t*>(slot + l.inputs);
        targets = reinterpret_cast<std::int32_t*>(slot + l.targets);
        datasets = reinterpret_cast<std::int32_t*>(slot + l.datasets);
        if (l.packed) {
            positions = reinterpret_cast<std::int32_t*>(slot + l.position_ids);
            cu_seqlens = reinterpret_cast<std::int32_t*>(slot + l.cu_seqlens);
            pieces = reinterpret_cast<std::int32_t*>(slot + l.pieces);
        }
    }
    std::int32_t* input_row(std::uint64_t r) const noexcept { return inputs + r * seq_len; }
    std::int32_t* target_row(std::uint64_t r) const noexcept { return targets + r * seq_len; }

    // Window row r, tokens [k, k + n) of its T + 1, from `src` in the file's dtype (converted as they go).
    void put_window_tokens(std::uint64_t r, std::uint64_t k, const std::byte* src, token_dtype dtype, std::uint64_t n) const noexcept {
        const std::uint64_t T = seq_len;
        const std::size_t item = dtype_size(dtype);
        const std::uint64_t in_n = k < T ? std::min(n, T - k) : 0;
        if (in_n) detail::convert_tokens(src, dtype, in_n, input_row(r) + k);
        const std::uint64_t skip = k == 0 ? 1 : 0;  // token 0 is nobody's target
        if (n > skip) detail::convert_tokens(src + skip * item, dtype, n - skip, target_row(r) + k + skip - 1);
    }
    // The same from int32 tokens (a tokenizer's output).
    void put_window_tokens(std::uint64_t r, std::uint64_t k, const std::int32_t* src, std::uint64_t n) const noexcept {
        const std::uint64_t T = seq_len;
        const std::uint64_t in_n = k < T ? std::min(n, T - k) : 0;
        if (in_n) std::memcpy(input_row(r) + k, src, in_n * sizeof(std::int32_t));
        const std::uint64_t skip = k == 0 ? 1 : 0;
        if (n > skip) std::memcpy(target_row(r) + k + skip - 1, src + skip, (n - skip) * sizeof(std::int32_t));
    }
};

namespace detail {

// A packed row's bookkeeping, once its first T - padding inputs are written from `bounds`' pieces:
// zero inputs on the padding, targets (the next token of the same piece; `ignore` at a piece's end and
// on padding), position ids, cu_seqlens (T + 1 entries, the last used one repeated). Returns the
// number of pieces.
inline std::int32_t finish_packed_row(const row_boundaries& bounds, std::uint64_t T, std::int32_t* in, std::int32_t* tg,
                                      std::int32_t* positions, std::int32_t* cu, std::int32_t ignore = -1) {
    const std::uint64_t used = T - bounds.padding;
    std::fill(in + used, in + T, 0);
    for (std::uint64_t j = 0; j + 1 < used; ++j) tg[j] = in[j + 1];
    std::fill(tg + (used ? used - 1 : 0), tg + T, ignore);
    for (std::size_t k = 1; k + 1 < bounds.cu_seqlens.size(); ++k) tg[bounds.cu_seqlens[k] - 1] = ignore;
    std::copy(bounds.position_ids.begin(), bounds.position_ids.end(), positions);
    std::copy(bounds.cu_seqlens.begin(), bounds.cu_seqlens.end(), cu);
    std::fill(cu + bounds.cu_seqlens.size(), cu + T + 1, bounds.cu_seqlens.back());
    return static_cast<std::int32_t>(bounds.cu_seqlens.size() - 1);
}

// Every packed row of the plan, once the sources wrote its segments' tokens. Returns the padding
// tokens of the batch. `bounds` is scratch (reused: no allocation once warm). `ignore`: the target
// where there is no next token (pipeline_config::ignore_index).
inline std::uint64_t finish_packed_rows(const batch_plan& plan, const slot_view& slot, row_boundaries& bounds, std::int32_t ignore = -1) {
    const std::uint64_t T = slot.seq_len;
    std::uint64_t padding = 0;
    for (std::size_t r = 0; r < plan.samples.size(); ++r) {
        boundaries_of(plan.samples[r].segments, T, bounds);
        slot.pieces[r] = finish_packed_row(bounds, T, slot.input_row(r), slot.target_row(r), slot.positions + r * T,
                                           slot.cu_seqlens + r * (T + 1), ignore);
        padding += bounds.padding;
    }
    return padding;
}

}  // namespace detail

}  // namespace feedline
