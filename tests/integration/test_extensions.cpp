// The extension points, each used by a second implementation defined here as a user would write one:
// a storage scheme ("mem://": objects served from memory, as a remote store serves them) under the
// formats and every reader backend, and a tokenizer kind ("bytes": one id per byte) under the text
// source. Each must give exactly what the built-in implementation gives for the same data.
#include <doctest/doctest.h>

#include <feedline/pipeline.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include "test_support.hpp"

using namespace feedline;
namespace ft = feedline::test;

namespace {

// "mem://<path>": the bytes of the local file at <path>, read once into memory when opened; listed
// through the local directory. A byte source that is not a local file, as a remote object is not.
class memory_source final : public byte_source {
public:
    memory_source(std::string name, std::vector<std::byte> bytes) : name_(std::move(name)), bytes_(std::move(bytes)) {}
    const std::string& name() const noexcept override { return name_; }
    std::uint64_t size() const noexcept override { return bytes_.size(); }
    void read_at(void* dest, std::uint64_t length, std::uint64_t offset) const override {
        reads.fetch_add(1);
        if (const int us = delay_us.load()) std::this_thread::sleep_for(std::chrono::microseconds(us));  // a request's latency
        if (offset > bytes_.size() || length > bytes_.size() - offset) throw format_error(name_, offset, "read past the end");
        std::memcpy(dest, bytes_.data() + offset, length);
        served.fetch_add(length);
    }
    std::string version() const override { return std::to_string(bytes_.size()); }
    static inline std::atomic<std::uint64_t> reads{0}, served{0};
    static inline std::atomic<int> delay_us{0};

private:
    std::string name_;
    std::vector<std::byte> bytes_;
};

constexpr std::string_view mem = "mem://";
std::string local(const std::string& location) { return location.substr(mem.size()); }
std::vector<std::string> with_scheme(std::vector<std::string> paths) {
    for (auto& p : paths) p = std::string(mem) + p;
    return paths;
}

const bool memory_registered = storage_registry::add(
    {.name = "mem",
     .owns = [](std::string_view location) { return location.substr(0, mem.size()) == mem; },
     .open = [](const std::string& location) -> std::unique_ptr<byte_source> {
         if (!std::filesystem::is_regular_file(local(location))) throw io_error(location, ENOENT, "no such object");
         return std::make_unique<memory_source>(location, ft::read_bytes(local(location)));
     },
     .exists = [](const std::string& location) { return std::filesystem::is_regular_file(local(location)); },
     .is_directory = [](const std::string& location) { return std::filesystem::is_directory(local(location)); },
     .list_directory = [](const std::string& location) { return with_scheme(local_storage().list_directory(local(location))); },
     .glob = [](const std::string& pattern) { return with_scheme(local_storage().glob(local(pattern))); }});

// "bytes": id = byte + 3 (0 unused, 1 BOS, 2 EOS); its model file says so in its first line.
class byte_tokenizer final : public tokenizer {
public:
    explicit byte_tokenizer(const tokenizer_options& o) : o_(o) {}
    std::string_view kind() const noexcept override { return "bytes"; }
    std::string identity() const override { return "bytes 1 bos " + std::to_string(o_.add_bos) + " eos " + std::to_string(o_.add_eos); }
    int vocab_size() const override { return 259; }
    int bos_id() const override { return 1; }
    int eos_id() const override { return 2; }
    std::string encode(std::string_view text, std::vector<std::int32_t>& out, const std::atomic<bool>*) override {
        out.clear();
        if (o_.add_bos) out.push_back(1);
        for (unsigned char c : text) out.push_back(c + 3);
        if (o_.add_eos) out.push_back(2);
        return {};
    }

private:
    tokenizer_options o_;
};

const bool bytes_registered =
    tokenizer_registry::add({.name = "bytes",
                             .recognizes =
                                 [](const std::string& model) {
                                     std::ifstream in(model);
                                     std::string first;
                                     return std::getline(in, first) && first == "bytes tokenizer";
                                 },
                             .make = [](const tokenizer_options& o, const std::string&) -> std::unique_ptr<tokenizer> {
                                 return std::make_unique<byte_tokenizer>(o);
                             }});

std::uint64_t token_sum(pipeline& p, std::uint64_t& batches) {
    std::uint64_t sum = 0;
    batches = 0;
    for (auto& b : p) {
        for (std::int32_t t : b.host_inputs()) sum += static_cast<std::uint64_t>(t) * (batches + 1);
        ++batches;
    }
    return sum;
}

}  // namespace

TEST_CASE("Extensions.ByteSource.ShardsFromAnotherSchemeGiveTheSameBatchesThroughEveryReader") {
    REQUIRE(memory_registered);
    ft::scratch_dir dir;
    for (int k = 0; k < 3; ++k) {
        megatron_writer w(dir / ("part_" + std::to_string(k)), token_dtype::uint16);
        for (std::uint32_t d = 0; d < 40; ++d) w.add_document(std::vector<std::uint32_t>(20 + (d * 7 + k) % 90, d + 100 * k + 1));
        w.finish();
        llmc_writer l(dir / ("stream_" + std::to_string(k)), token_dtype::uint16, 0);
        for (std::uint32_t d = 0; d < 40; ++d) l.add_document(std::vector<std::uint32_t>(15 + d % 50, d + 7 * k + 1));
        l.finish();
    }
    std::vector<io_backend> backends{io_backend::mmap, io_backend::pread};
    if (!io_uring_unavailable_reason()) backends.push_back(io_backend::io_uring);
    for (const std::string pattern : {"part_*.idx", "stream_*.bin"}) {
        for (const sample_mode mode : {sample_mode::windows, sample_mode::packed}) {
            CAPTURE(pattern);
            pipeline_config c{.batch_size = 4,
                              .seq_len = 32,
                              .seed = 5,
                              .mode = mode,
                              .workers = 2,
                              .device = device_kind::cpu,
                              .rank = 0,
                              .world_size = 1,
                              .max_steps = 40};
            std::uint64_t local_batches = 0, remote_batches = 0;
            pipeline here(dir / pattern, c);
            const std::uint64_t expected = token_sum(here, local_batches);
            REQUIRE(local_batches == 40);
            for (const io_backend backend : backends) {
                CAPTURE(to_string(backend));
                c.shards.backend = backend;
                const auto reads_before = memory_source::reads.load();
                pipeline there(std::string(mem) + (dir / pattern), c);
                CHECK(token_sum(there, remote_batches) == expected);
                CHECK(remote_batches == local_batches);
                CHECK(memory_source::reads.load() > reads_before);  // the tokens came through the scheme
                CHECK(to_json(there.state()) == to_json(here.state()));
            }
        }
    }
    // Its errors name its locations.
    try {
        token_dataset ds(std::string(mem) + (dir / "nothing_*.bin"));
        FAIL("opened a glob that matches nothing");
    } catch (const io_error& e) {
        CHECK(e.file() == std::string(mem) + (dir / "nothing_*.bin"));
    }
}

TEST_CASE("Extensions.ByteSource.LaterStepsAreFetchedAheadEachRangeOnceWithTheSameBatches") {
    REQUIRE(memory_registered);
    ft::scratch_dir dir;
    for (int k = 0; k < 3; ++k) {
        llmc_writer l(dir / ("stream_" + std::to_string(k)), token_dtype::uint16, 0);
        for (std::uint32_t d = 0; d < 60; ++d) l.add_document(std::vector<std::uint32_t>(15 + d % 50, d + 7 * k + 1));
        l.finish();
        megatron_writer w(dir / ("part_" + std::to_string(k)), token_dtype::uint16);
        for (std::uint32_t d = 0; d < 40; ++d) w.add_document(std::vector<std::uint32_t>(20 + (d * 7 + k) % 90, d + 100 * k + 1));
        w.finish();
    }
    memory_source::delay_us = 200;  // each range read takes a while, as a remote one does: workers fall behind
    struct reset_delay {
        ~reset_delay() { memory_source::delay_us = 0; }
    } reset;
    for (const sample_mode mode : {sample_mode::windows, sample_mode::packed}) {
        CAPTURE(static_cast<int>(mode));
        pipeline_config c{.batch_size = 4,
                          .seq_len = 32,
                          .seed = 9,
                          .mode = mode,
                          .workers = 1,
                          .device = device_kind::cpu,
                          .rank = 0,
                          .world_size = 1,
                          .max_steps = 60};
        std::uint64_t local_batches = 0, remote_batches = 0;
        pipeline here(dir / "stream_*.bin", c);
        const std::uint64_t expected = token_sum(here, local_batches);
        pipeline there(std::string(mem) + (dir / "stream_*.bin"), c);
        CHECK(there.memory().fetch_ahead_bytes > 0);                       // in the memory plan
        const std::uint64_t served_before = memory_source::served.load();  // after opening (headers, indexes)
        CHECK(token_sum(there, remote_batches) == expected);
        CHECK(remote_batches == local_batches);
        there.stop();  // the fetch-ahead thread has joined: its counts are final
        const pipeline_stats s = there.stats();
        REQUIRE(s.remote_fetch_ahead_bytes.has_value());
        CHECK(*s.remote_fetch_ahead_bytes > 0);  // workers took ranges fetched ahead of them
        CHECK(*s.remote_fetch_ahead_steps >= 1);
        // Every range was read from the source once, by the fetch ahead or by a worker, except those
        // fetched ahead that a worker had read itself first (counted as unused).
        CHECK(memory_source::served.load() - served_before == s.bytes_read + *s.remote_fetch_ahead_unused_bytes);
        CHECK(*s.remote_fetch_ahead_bytes <= s.bytes_read);
        CHECK(to_json(there.state()) == to_json(here.state()));
    }
    // A blend of local and remote data: only the remote ranges are fetched ahead, by the blend's steps.
    pipeline_config c{
        .batch_size = 4, .seq_len = 32, .seed = 2, .workers = 2, .device = device_kind::cpu, .rank = 0, .world_size = 1, .max_steps = 50};
    std::uint64_t local_batches = 0, mixed_batches = 0;
    pipeline here(std::vector<weighted_spec>{{0.5, dir / "part_0"}, {0.5, dir / "stream_*.bin"}}, c);
    const std::uint64_t expected = token_sum(here, local_batches);
    pipeline mixed(std::vector<weighted_spec>{{0.5, dir / "part_0"}, {0.5, std::string(mem) + (dir / "stream_*.bin")}}, c);
    CHECK(token_sum(mixed, mixed_batches) == expected);
    CHECK(mixed_batches == local_batches);
    mixed.stop();
    CHECK(mixed.stats().remote_fetch_ahead_bytes.value_or(0) > 0);
}

TEST_CASE("Extensions.Tokenizer.ARegisteredKindTokenizesTextAndKeysItsCache") {
    REQUIRE(bytes_registered);
    ft::scratch_dir dir;
    ft::write_text(dir / "vocab.bytes", "bytes tokenizer\n");
    std::ofstream out(dir / "docs.jsonl");
    std::string all;
    for (int d = 0; d < 30; ++d) {
        const std::string text = "document " + std::to_string(d) + std::string(static_cast<std::size_t>(d % 7), 'x');
        out << "{\"text\": \"" << text << "\"}\n";
        all += text;
    }
    out.close();
    CHECK(make_tokenizer({.model = dir / "vocab.bytes"})->kind() == "bytes");
    ft::write_text(dir / "unknown.model", "no tokenizer reads this\n");
    CHECK_THROWS_WITH_AS(make_tokenizer({.model = dir / "unknown.model"}), doctest::Contains("no tokenizer recognizes this model"),
                         config_error);
    CHECK_THROWS_WITH_AS(make_tokenizer({.model = dir / "vocab.bytes", .kind = "wordpiece"}),
                         doctest::Contains("no tokenizer of kind 'wordpiece'"), config_error);
    // In stream order (shuffle none), the windows are the documents' bytes + 3, each followed by EOS.
    std::vector<std::int32_t> expected;
    for (int d = 0; d < 30; ++d) {
        const std::string text = "document " + std::to_string(d) + std::string(static_cast<std::size_t>(d % 7), 'x');
        for (unsigned char ch : text) expected.push_back(ch + 3);
        expected.push_back(2);
    }
    pipeline_config c{.batch_size = 2,
                      .seq_len = 16,
                      .shuffle = shuffle_mode::none,
                      .workers = 1,
                      .device = device_kind::cpu,
                      .rank = 0,
                      .world_size = 1,
                      .max_steps = 3};
    c.text.tokenizer = dir / "vocab.bytes";
    c.text.cache_dir = dir / "cache";
    pipeline p(dir / "docs.jsonl", c);
    std::vector<std::int32_t> got;
    for (auto& b : p) got.insert(got.end(), b.host_inputs().begin(), b.host_inputs().end());
    REQUIRE(got.size() == 3 * 2 * 16u);
    // Windows of 16 inputs over the stream, one after the other (a window's last target is the next
    // one's first input).
    for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == expected[i]);
    // The token counts are cached under the tokenizer's identity: a second open reads them.
    const text_source again({dir / "docs.jsonl"}, c.text);
    CHECK(again.lengths_origin().find("read from") == 0);
    CHECK(again.total_tokens() == expected.size());
}

TEST_CASE("Extensions.ByteSource.TextFromAnotherSchemeGivesTheSameBatchesAndNamesItsObjects") {
    REQUIRE(memory_registered);
    REQUIRE(bytes_registered);
    ft::scratch_dir dir;
    ft::write_text(dir / "vocab.bytes", "bytes tokenizer\n");
    std::filesystem::create_directories(dir / "corpus");
    for (int f = 0; f < 3; ++f) {
        std::ofstream out(dir / ("corpus/part_" + std::to_string(f) + ".jsonl"));
        for (int d = 0; d < 25; ++d)
            out << "{\"text\": \"file " << f << " doc " << d << std::string(static_cast<std::size_t>(d % 11), 'y') << "\"}\n";
    }
    std::string plain;  // blocks of one to three lines, separated by one or two blank lines, some with \r\n
    for (int b = 0; b < 40; ++b)
        plain +=
            "block " + std::to_string(b) + (b % 3 ? "\r\nsecond line" : "") + (b % 5 ? "\nthird line\n" : "\n") + (b % 2 ? "\n\n" : "\n");
    ft::write_text(dir / "plain.txt", plain);
    pipeline_config c{
        .batch_size = 2, .seq_len = 24, .seed = 9, .workers = 2, .device = device_kind::cpu, .rank = 0, .world_size = 1, .max_steps = 12};
    c.text.tokenizer = dir / "vocab.bytes";
    c.text.cache_dir = "none";
    c.text.documents.split = text_split::blank_lines;
    for (const std::string spec : {"corpus", "corpus/part_*.jsonl", "plain.txt"}) {
        CAPTURE(spec);
        std::uint64_t local_batches = 0, remote_batches = 0;
        pipeline here(dir / spec, c);
        const std::uint64_t expected = token_sum(here, local_batches);
        const auto reads_before = memory_source::reads.load();
        pipeline there(std::string(mem) + (dir / spec), c);
        CHECK(token_sum(there, remote_batches) == expected);
        CHECK(remote_batches == local_batches);
        CHECK(memory_source::reads.load() > reads_before);  // the documents came through the scheme
    }
    // A document the JSONL parser refuses is named by its object's location and offset.
    ft::write_text(dir / "bad.jsonl", "{\"text\": \"fine\"}\n{\"text\": 3}\n");
    try {
        text_corpus corpus({std::string(mem) + (dir / "bad.jsonl")});
        FAIL("a line without a string field was accepted");
    } catch (const format_error& e) {
        CHECK(e.file() == std::string(mem) + (dir / "bad.jsonl"));
        CHECK(e.offset() == 17u);
    }
}

namespace {

// A kind of source as a user would write one: source `id`'s every token is id + 1 (4 documents of 500
// tokens). Its writer leaves its rows to finish() (as token shards do: a batch converted in one pass),
// and with `shares` it accepts every source of its kind, so the pipeline binds one writer per thread to
// each source before that source's rows. Counts what the pipeline asked of it.
struct constant_counts {
    std::atomic<int> made{0}, binds{0}, finishes{0}, finished_rows{0};
};

class constant_source final : public batch_source {
public:
    constant_source(std::int32_t id, bool shares, constant_counts& counts) : id_(id), shares_(shares), counts_(counts) {}
    source_kind kind() const noexcept override { return kind_; }
    std::string describe() const override { return "tokens " + std::to_string(id_ + 1); }
    sampler_dataset sampling(const source_context&) const override {
        return {.documents = 4, .length = [](std::uint64_t) -> std::uint64_t { return 500; }, .block_starts = {}};
    }
    std::uint64_t index_bytes(const source_context&) const override { return 0; }
    std::uint64_t worker_bytes(const source_context&) const override { return 1024; }
    std::string prepare(const source_context&) override { return "constant"; }
    std::unique_ptr<source_worker> make_worker(const source_context&, source_counters& counters) override {
        counts_.made.fetch_add(1);
        return std::make_unique<writer>(*this, counters);
    }

private:
    class writer final : public source_worker {
    public:
        writer(const constant_source& s, source_counters& counters) : shares_(s.shares_), counts_(s.counts_) { set(s, counters); }
        bool accepts(const batch_source& other) const override {
            return shares_ && dynamic_cast<const constant_source*>(&other) != nullptr;
        }
        void bind(const batch_source& other, source_counters& counters) override {
            CHECK(accepts(other));
            counts_.binds.fetch_add(1);
            set(static_cast<const constant_source&>(other), counters);
        }
        void write(const batch_plan& plan, std::span<const std::uint32_t> rows, const slot_view&) override {
            for (const std::uint32_t r : rows) {
                CHECK(plan.samples[r].dataset == static_cast<std::uint32_t>(id_));  // bound to this source's rows
                pending_.emplace_back(r, id_ + 1);
            }
        }
        void finish(const slot_view& slot) override {
            counts_.finishes.fetch_add(1);
            counters_->bytes_read.fetch_add(pending_.size() * (slot.seq_len + 1) * sizeof(std::int32_t), std::memory_order_relaxed);
            counts_.finished_rows.fetch_add(static_cast<int>(pending_.size()));
            for (const auto& [row, token] : pending_) {
                const std::vector<std::int32_t> tokens(slot.seq_len + 1, token);
                slot.put_window_tokens(row, 0, tokens.data(), tokens.size());
            }
            pending_.clear();
        }

    private:
        void set(const constant_source& s, source_counters& counters) {
            id_ = s.id_;
            counters_ = &counters;
        }
        bool shares_;
        constant_counts& counts_;
        std::int32_t id_ = -1;
        source_counters* counters_ = nullptr;  // the bound source's: finish() counts into them
        std::vector<std::pair<std::uint32_t, std::int32_t>> pending_;
    };

    static constexpr source_kind kind_{"constant tokens"};
    std::int32_t id_;
    bool shares_;
    constant_counts& counts_;
};

}  // namespace

TEST_CASE("Extensions.Source.AWriterThatAcceptsOtherSourcesIsBoundToEachBeforeItsRowsAndFinishedOncePerBatch") {
    constexpr int sources = 60, steps = 40;
    constexpr unsigned workers = 2;
    constexpr std::uint64_t batch = 16;
    for (const bool shares : {true, false}) {
        CAPTURE(shares);
        constant_counts counts;
        std::vector<weighted_source> blend;
        for (int i = 0; i < sources; ++i) blend.push_back({1.0, std::make_shared<constant_source>(i, shares, counts)});
        pipeline p(std::move(blend), {.batch_size = batch,
                                      .seq_len = 32,
                                      .seed = 5,
                                      .workers = workers,
                                      .memory_budget = 64 << 20,
                                      .device = device_kind::cpu,
                                      .rank = 0,
                                      .world_size = 1,
                                      .max_steps = steps});
        std::uint64_t batches = 0;
        std::vector<bool> met(sources);
        int sources_per_batch = 0;  // summed over batches
        for (auto& b : p) {
            const auto inputs = b.host_inputs();
            const auto datasets = b.host_datasets();
            std::vector<bool> in_batch(sources);
            for (std::uint64_t r = 0; r < batch; ++r) {
                const std::int32_t d = datasets[r];
                REQUIRE(d >= 0);
                REQUIRE(d < sources);
                in_batch[static_cast<std::size_t>(d)] = true;
                met[static_cast<std::size_t>(d)] = true;
                for (std::uint64_t t = 0; t < 32; ++t) REQUIRE(inputs[r * 32 + t] == d + 1);  // the row is its own source's
            }
            sources_per_batch += static_cast<int>(std::count(in_batch.begin(), in_batch.end(), true));
            ++batches;
        }
        REQUIRE(batches == steps);
        CHECK(p.stats().bytes_read == steps * batch * 33 * sizeof(std::int32_t));  // counted into the bound sources'
        const int sources_met = static_cast<int>(std::count(met.begin(), met.end(), true));
        CHECK(sources_met > 40);  // 640 rows drawn over 60 equal shares
        CHECK(counts.finished_rows.load() == static_cast<int>(steps * batch));
        if (shares) {
            // One writer per worker thread for all 60 sources, finished once per batch.
            CHECK(counts.made.load() >= 1);
            CHECK(counts.made.load() <= static_cast<int>(workers));
            CHECK(counts.finishes.load() == steps);
            CHECK(counts.binds.load() >= sources_met - counts.made.load());
        } else {
            // A writer per source a worker met, each finished in every batch it wrote.
            CHECK(counts.made.load() >= sources_met);
            CHECK(counts.made.load() <= static_cast<int>(workers) * sources_met);
            CHECK(counts.binds.load() == 0);
            CHECK(counts.finishes.load() == sources_per_batch);
        }
    }
}
