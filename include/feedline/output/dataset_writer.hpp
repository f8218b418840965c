// feedline/output/dataset_writer.hpp: documents of token ids in, a dataset out, in the form chosen:
// one Megatron pair, numbered Megatron pairs of about `shard_bytes` each, or llm.c shards. What
// feedline-pack writes through, and what Python's feedline.write() / feedline.Writer hand their
// documents to. Every form publishes atomically under the prefix's output lock (format/megatron.hpp,
// format/llmc.hpp), so a failed or killed write leaves no dataset behind and never mixes two.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <feedline/error.hpp>
#include <feedline/format/llmc.hpp>
#include <feedline/format/megatron.hpp>
#include <feedline/output/output_lock.hpp>

namespace feedline {

struct dataset_writer_options {
    std::string format = "megatron";  // megatron | llmc
    token_dtype dtype = token_dtype::uint16;
    std::uint32_t delimiter = llmc_layout::gpt2_eot;  // llm.c only: the token that begins every document
    std::uint64_t shard_bytes = 0;                    // 0: one Megatron pair, llm.c shards of 100 M tokens
};

class dataset_writer {
public:
    // Throws config_error for an unknown format or a dtype the format cannot hold, io_error when the
    // output cannot be created or another writer holds it. `held`: a lock the caller already holds on
    // `output` (feedline-pack holds one for the whole run); else the writer takes its own.
    dataset_writer(const std::string& output, const dataset_writer_options& o, const output_lock* held = nullptr) {
        if (o.format != "megatron" && o.format != "llmc") throw config_error("format", "expected megatron or llmc, got '" + o.format + "'");
        if (!held) held = &own_lock_.emplace(output);
        if (o.format == "llmc") {
            const std::uint64_t tokens =
                o.shard_bytes
                    ? std::max<std::uint64_t>(
                          1, (o.shard_bytes - std::min<std::uint64_t>(o.shard_bytes, llmc_layout::header_bytes)) / dtype_size(o.dtype))
                    : 100'000'000;
            llmc_ = std::make_unique<llmc_writer>(output, o.dtype, o.delimiter, std::min(tokens, llmc_layout::max_tokens), held);
        } else if (o.shard_bytes) {
            shards_ = std::make_unique<megatron_shards_writer>(output, o.dtype, o.shard_bytes, held);
        } else {
            one_ = std::make_unique<megatron_writer>(output, o.dtype, held);
        }
    }

    // Appends one document. Throws config_error when a token does not fit the dtype (naming the
    // document), io_error when a write fails.
    template <class T>
    void add(std::span<const T> ids) {
        if (llmc_)
            llmc_->add_document(ids);
        else if (shards_)
            shards_->add_document(ids);
        else
            one_->add_document(ids);
        ++documents_;
    }
    template <class T>
    void add(const std::vector<T>& ids) {
        add(std::span<const T>(ids));
    }
    std::uint64_t documents() const noexcept { return documents_; }

    // Publishes the dataset; returns what to read it by: Megatron prefixes or llm.c shard paths.
    std::vector<std::string> finish() {
        if (llmc_) return llmc_->finish();
        if (shards_) return shards_->finish();
        one_->finish();
        return {one_->prefix()};
    }

private:
    std::optional<output_lock> own_lock_;  // first: the writers below are destroyed (their temporaries removed) before it goes
    std::unique_ptr<llmc_writer> llmc_;
    std::unique_ptr<megatron_shards_writer> shards_;
    std::unique_ptr<megatron_writer> one_;
    std::uint64_t documents_ = 0;
};

}  // namespace feedline
