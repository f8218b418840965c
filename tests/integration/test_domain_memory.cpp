// What a mixture's domain costs on the heap: the pipelines of two mixtures, of 100 and of 300 small
// domains (a Megatron pair of nine documents each, or an llm.c shard), are measured by this binary's
// own operator new and delete, and the difference between them, per domain, must stay under a
// KiB. The difference cancels what every pipeline holds whatever its domains (ring, workers' scratch,
// queues). Measured while each pipeline is open, after it has delivered its batches (so every domain
// has its epoch's layout, and the delivery its state). A binary of its own: the operators are the
// process's.
#include <doctest/doctest.h>

#include <feedline/format/megatron.hpp>
#include <feedline/pipeline.hpp>

#include <malloc.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <new>
#include <string>
#include <vector>

#include "test_support.hpp"

namespace {

// Bytes the allocator handed out and not yet taken back: each block's usable size and its chunk header
// (glibc: 8 bytes), what a block really costs.
std::atomic<std::int64_t> live_bytes{0};
constexpr std::int64_t chunk_header = 8;

void* counted(void* p) {
    if (p != nullptr) live_bytes.fetch_add(static_cast<std::int64_t>(::malloc_usable_size(p)) + chunk_header, std::memory_order_relaxed);
    return p;
}
void* allocate(std::size_t n, std::size_t align = 0) {
    void* p = align <= alignof(std::max_align_t) ? std::malloc(n == 0 ? 1 : n) : std::aligned_alloc(align, (n + align - 1) / align * align);
    return counted(p);
}
// GCC cannot see that every block freed here came from allocate (std::malloc), not from a new.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void release(void* p) noexcept {
    if (p == nullptr) return;
    live_bytes.fetch_sub(static_cast<std::int64_t>(::malloc_usable_size(p)) + chunk_header, std::memory_order_relaxed);
    std::free(p);
}
#pragma GCC diagnostic pop

}  // namespace

void* operator new(std::size_t n) {
    if (void* p = allocate(n)) return p;
    throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
    if (void* p = allocate(n)) return p;
    throw std::bad_alloc();
}
void* operator new(std::size_t n, std::align_val_t a) {
    if (void* p = allocate(n, static_cast<std::size_t>(a))) return p;
    throw std::bad_alloc();
}
void* operator new[](std::size_t n, std::align_val_t a) {
    if (void* p = allocate(n, static_cast<std::size_t>(a))) return p;
    throw std::bad_alloc();
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return allocate(n); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return allocate(n); }
void operator delete(void* p) noexcept { release(p); }
void operator delete[](void* p) noexcept { release(p); }
void operator delete(void* p, std::size_t) noexcept { release(p); }
void operator delete[](void* p, std::size_t) noexcept { release(p); }
void operator delete(void* p, std::align_val_t) noexcept { release(p); }
void operator delete[](void* p, std::align_val_t) noexcept { release(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { release(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { release(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { release(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { release(p); }

using namespace feedline;
namespace ft = feedline::test;

namespace {

enum class domain_kind { megatron_pair, llmc_shard };

// Where the domains are, from the scratch directory (the working directory while the test runs): a
// domain's data file is named by a path of 62 characters whatever the checkout's place, the length
// of a real corpus's ("corpus/pretraining-mix-2026/web-and-code/domains/m300_0123.bin"); the file
// keeps it, and a longer one would cost its bytes more.
const std::string domains_dir = "corpus/pretraining-mix-2026/web-and-code/domains";

// A mixture file over `n` domains of ~3,600 tokens each in nine documents (bench_mixture's 10,000
// domains of 40 M tokens are 4,000 each), every domain its own tokens, weights 1 to 5. Its data
// paths are relative to it.
std::string write_mixture(int n, domain_kind kind) {
    const std::string tag = (kind == domain_kind::megatron_pair ? "m" : "l") + std::to_string(n);
    std::filesystem::create_directories(domains_dir);
    std::string domains, weights;
    for (int k = 0; k < n; ++k) {
        std::string name = std::to_string(k);
        name = tag + "_" + std::string(4 - name.size(), '0') + name;
        const std::string path = domains_dir + "/" + name;
        std::string data = name;
        if (kind == domain_kind::megatron_pair) {
            megatron_writer w(path, token_dtype::uint16);
            for (std::uint32_t d = 0; d < 9; ++d)
                w.add_document(std::vector<std::uint32_t>(200 + 50 * d, static_cast<std::uint32_t>(k + d)));
            w.finish();
        } else {
            llmc_writer w(path, token_dtype::uint16, /*delimiter=*/65535);
            for (std::uint32_t d = 0; d < 9; ++d)
                w.add_document(std::vector<std::uint16_t>(200 + 50 * d, static_cast<std::uint16_t>(k + d + 1)));
            const auto shards = w.finish();
            REQUIRE(shards.size() == 1);
            data = std::filesystem::path(shards[0]).filename().string();
        }
        domains += std::string(k ? ", " : "") + R"({"name": ")" + name + R"(", "data": ")" + data + R"("})";
        weights += std::string(k ? ", " : "") + "\"" + name + "\": " + std::to_string(1 + k % 5);
    }
    const std::string file = domains_dir + "/" + tag + ".json";
    ft::write_text(file, R"({"domains": [)" + domains + R"(], "stages": [{"at_step": 0, "weights": {)" + weights + "}}]}");
    return file;
}

// Heap bytes a pipeline over the mixture holds once it has delivered all of its 40 batches (its
// workers idle, so that nothing is half-made), beyond what was live before it was made.
double pipeline_heap_bytes(const std::string& mixture) {
    const std::int64_t before = live_bytes.load();
    // Batches of 8: what a step holds per domain it draws from (its ring slot's resume delta, the
    // worker's pieces) is bounded by the batch, and with both mixtures' steps drawing from about 8
    // domains it cancels out of the difference.
    pipeline_config c{.batch_size = 8, .seq_len = 64, .seed = 3, .workers = 2, .device = device_kind::cpu, .max_steps = 40};
    pipeline p(mixture, c);
    int batches = 0;
    for (auto& b : p) {
        REQUIRE(b.host_inputs().size() == 8u * 64);
        ++batches;
    }
    REQUIRE(batches == 40);
    return static_cast<double>(live_bytes.load() - before);
}

}  // namespace

TEST_CASE("Mixture.Memory.ADomainCostsUnderAKibOfHeap") {
    ft::scratch_dir dir;
    const auto back_to = std::filesystem::current_path();
    std::filesystem::current_path(dir.path());
    struct restore_cwd {
        std::filesystem::path to;
        ~restore_cwd() { std::filesystem::current_path(to); }
    } restore{back_to};
    for (const auto kind : {domain_kind::megatron_pair, domain_kind::llmc_shard}) {
        const std::string kind_name = kind == domain_kind::megatron_pair ? "Megatron pairs" : "llm.c shards";
        CAPTURE(kind_name);
        const std::string small = write_mixture(100, kind), large = write_mixture(300, kind);
        pipeline_heap_bytes(small);  // the process's first pipeline makes what outlives it (pools, topology)
        const double per_domain = (pipeline_heap_bytes(large) - pipeline_heap_bytes(small)) / 200.0;
        MESSAGE(kind_name << ": " << per_domain << " heap bytes a domain");
        // A domain holds at least its dataset, its file and its stream: a count this low means the
        // operators above were not the ones called.
        CHECK(per_domain > 200);
        CHECK(per_domain < 1024);
    }
}
