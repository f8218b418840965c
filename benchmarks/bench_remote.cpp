// bench_remote: how fast does feedline stream shuffled windows from an S3 bucket, against the same
// files read locally and against a naive loop that issues one GET per window?
//
// A real S3 server (SeaweedFS, scripts/s3-test-server.sh, on 127.0.0.1) holds llm.c shards of random
// uint16 tokens; a loopback proxy in front of it (tests/support/fault_proxy.hpp) adds --latency-ms to
// every request, as a remote bucket would. In one run, interleaved rounds (medians):
//   local        feedline::pipeline over the local files (page cache warm): the ceiling
//   s3           the same pipeline over s3://bucket/shards_*.bin through the proxy, the local cache off:
//                a fresh process state each round (listing, headers), its time to the first batch, then
//                tokens/s
//   s3_warm      the same with the local block cache on (FEEDLINE_S3_CACHE_BYTES), after one unmeasured
//                pass filled it: a second epoch, or the next run
//   s3_no_ahead  the same as s3 with shards.fetch_ahead = 0: each worker fetches its own batch's
//                windows when it gets to them, nothing ahead (what the fetch ahead gains)
//   naive_get    one thread, one signed ranged GET per window over one kept-alive connection, through
//                the same proxy: what a loader that reads a window at a time gets
// Last line: one JSON object with s3_vs_naive, s3_vs_no_ahead, s3_vs_local, s3_warm_vs_local, first_batch_s, ...
#include <curl/curl.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <random>
#include <thread>
#include <vector>

#include <feedline/pipeline.hpp>

#include "bench_common.hpp"
#include "fault_proxy.hpp"
#include "s3_test_server.hpp"

using namespace feedline;
using namespace feedline::bench;
namespace ft = feedline::test;

namespace {

// The S3 server of this run, stopped (and its data removed) however the run ends.
struct server {
    std::string script, dir;
    server(std::string source_dir, std::string root) : script(source_dir + "/scripts/s3-test-server.sh"), dir(root + "/s3-server") {
        if (std::system((script + " start " + dir).c_str()) != 0) throw std::runtime_error("the S3 server did not start (see above)");
    }
    ~server() { (void)std::system((script + " stop " + dir + " >/dev/null 2>&1").c_str()); }
};

struct naive_getter {
    CURL* easy = curl_easy_init();
    std::vector<std::byte> buffer;
    std::size_t received = 0;
    ~naive_getter() { curl_easy_cleanup(easy); }

    // One signed GET of [offset, offset + n) of `url` into the buffer.
    void get(const std::string& url, std::uint64_t offset, std::uint64_t n) {
        buffer.resize(n);
        received = 0;
        const std::string range = "Range: bytes=" + std::to_string(offset) + "-" + std::to_string(offset + n - 1);
        curl_slist* headers = curl_slist_append(nullptr, range.c_str());
        curl_easy_setopt(easy, CURLOPT_URL, url.c_str());
        curl_easy_setopt(easy, CURLOPT_HTTPHEADER, headers);
        curl_easy_setopt(easy, CURLOPT_AWS_SIGV4, "aws:amz:us-east-1:s3");
        curl_easy_setopt(easy, CURLOPT_USERNAME, ft::s3_access_key);
        curl_easy_setopt(easy, CURLOPT_PASSWORD, ft::s3_secret_key);
        curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(easy, CURLOPT_WRITEDATA, this);
        curl_easy_setopt(
            easy, CURLOPT_WRITEFUNCTION, +[](char* p, std::size_t s, std::size_t k, void* u) {
                auto& g = *static_cast<naive_getter*>(u);
                const std::size_t n = std::min(s * k, g.buffer.size() - g.received);
                std::memcpy(g.buffer.data() + g.received, p, n);
                g.received += n;
                return s * k;
            });
        const CURLcode rc = curl_easy_perform(easy);
        curl_slist_free_all(headers);
        if (rc != CURLE_OK || received != n) throw std::runtime_error("naive GET failed: " + std::string(curl_easy_strerror(rc)));
    }
};

}  // namespace

int main(int argc, char** argv) try {
    CLI::App app{"bench_remote: s3:// windows vs local files vs one GET per window"};
    unsigned latency_ms = 20, shards = 8, shard_mib = 8, workers = 2, rounds = 3;
    std::uint64_t batch = 32, seq = 1024, batches = 60, warm_batches = 3000, naive_windows = 150;
    std::string scratch = std::filesystem::temp_directory_path().string();
    app.add_option("--latency-ms", latency_ms, "added to every request by the proxy")->capture_default_str();
    app.add_option("--shards", shards, "llm.c shards")->capture_default_str();
    app.add_option("--shard-mib", shard_mib, "MiB per shard")->capture_default_str();
    app.add_option("--workers", workers, "pipeline workers")->capture_default_str();
    app.add_option("--batch", batch, "windows per batch")->capture_default_str();
    app.add_option("--seq-len", seq, "tokens per window")->capture_default_str();
    app.add_option("--batches", batches, "batches per round from the store (s3, cache off)")->capture_default_str();
    app.add_option("--warm-batches", warm_batches, "batches per round from local memory (local, s3_warm): long enough to be the rate")
        ->capture_default_str();
    app.add_option("--naive-windows", naive_windows, "windows per naive round")->capture_default_str();
    app.add_option("--rounds", rounds, "interleaved rounds")->capture_default_str();
    app.add_option("--scratch", scratch, "where the shards and the server's data go")->capture_default_str();
    CLI11_PARSE(app, argc, argv);

    const std::string root = scratch + "/bench_remote." + std::to_string(::getpid());
    std::filesystem::create_directories(root);
    ::setenv("FEEDLINE_TEST_TMPDIR", root.c_str(), 1);  // where s3_test_server.hpp finds the endpoint
    const server s3(FEEDLINE_SOURCE_DIR, root);

    // Shards of random tokens, written locally and uploaded under the same names.
    std::mt19937_64 rng(7);
    const std::uint64_t tokens_per_shard = (std::uint64_t(shard_mib) << 20) / 2;
    for (unsigned k = 0; k < shards; ++k) {
        llmc_writer w(root + "/shards_" + std::to_string(k), token_dtype::uint16, 0);
        std::vector<std::uint32_t> doc(tokens_per_shard - 1);
        for (auto& t : doc) t = static_cast<std::uint32_t>(rng() % 50000 + 1);
        w.add_document(doc);
        w.finish();
        const std::string name = "shards_" + std::to_string(k) + "_000000.bin";
        ft::s3_put_file(root + "/" + name, "bench/" + name);
    }
    ft::fault_proxy proxy(ft::s3_endpoint());
    proxy.set({}, std::chrono::milliseconds(latency_ms));
    ft::use_s3_server(ft::s3_secret_key, proxy.endpoint());
    std::printf("%u llm.c shards of %u MiB in s3://%s/%sbench/, %u ms added per request; B=%llu T=%llu, %u workers\n", shards, shard_mib,
                ft::s3_test_bucket().c_str(), ft::s3_test_prefix().c_str(), latency_ms, static_cast<unsigned long long>(batch),
                static_cast<unsigned long long>(seq), workers);

    const pipeline_config config{.batch_size = batch,
                                 .seq_len = seq,
                                 .seed = 1,
                                 .workers = workers,
                                 .device = device_kind::cpu,
                                 .rank = 0,
                                 .world_size = 1,
                                 .max_steps = batches};
    pipeline_config warm_config = config;
    warm_config.max_steps = warm_batches;
    const double tokens_per_batch = static_cast<double>(batch * seq);
    auto stream = [&](pipeline& p) {
        const auto t0 = clock_type::now();
        std::uint64_t n = 0, sink = 0;
        for (auto& b : p) {
            sink += static_cast<std::uint64_t>(b.host_inputs()[0]);
            ++n;
        }
        if (sink == 1) std::printf(" ");
        return static_cast<double>(n) * tokens_per_batch / seconds_since(t0);
    };
    std::vector<double> first_batch, listings, ahead_steps, ahead_share, ahead_requests;
    interleaved cases;
    cases.add("local (tokens/s)", [&] {
        pipeline p(root + "/shards_*.bin", warm_config);
        if (!p.next()) throw std::runtime_error("no local batch");  // start-up is not the rate, as for s3 below
        return stream(p);
    });
    const std::string cache_root = root + "/cache";
    auto use_cache = [&](bool on) {  // read again at the catalog's reset
        ::setenv("FEEDLINE_CACHE_DIR", cache_root.c_str(), 1);
        ::setenv("FEEDLINE_S3_CACHE_BYTES", on ? "4G" : "0", 1);
        s3_catalog::instance().reset();
    };
    use_cache(true);
    {  // the unmeasured pass that fills the cache
        pipeline p(ft::s3_url("bench/shards_*.bin"), config);
        stream(p);
    }
    cases.add("s3_warm (tokens/s)", [&] {
        use_cache(true);
        pipeline p(ft::s3_url("bench/shards_*.bin"), warm_config);
        if (!p.next()) throw std::runtime_error("no batch from s3");
        return stream(p);
    });
    cases.add("s3 (tokens/s)", [&] {
        use_cache(false);  // a fresh process's state: listing and headers again, every window from the store
        const auto t0 = clock_type::now();
        pipeline p(ft::s3_url("bench/shards_*.bin"), config);
        if (!p.next()) throw std::runtime_error("no batch from s3");  // counted in the time to the first batch, not the rate
        first_batch.push_back(seconds_since(t0));
        listings.push_back(static_cast<double>(s3_catalog::instance().listings()));
        const double rate = stream(p);
        const pipeline_stats st = p.stats();
        ahead_steps.push_back(static_cast<double>(st.remote_fetch_ahead_steps.value_or(0)));
        ahead_requests.push_back(static_cast<double>(st.remote_fetch_ahead_requests.value_or(0)));
        ahead_share.push_back(st.bytes_read ? static_cast<double>(st.remote_fetch_ahead_bytes.value_or(0)) / st.bytes_read : 0);
        return rate;
    });
    cases.add("s3_no_ahead (tokens/s)", [&] {
        use_cache(false);
        pipeline_config c = config;
        c.shards.fetch_ahead = 0;
        pipeline p(ft::s3_url("bench/shards_*.bin"), c);
        if (!p.next()) throw std::runtime_error("no batch from s3");
        return stream(p);
    });
    cases.add("naive_get (tokens/s)", [&] {
        naive_getter g;
        std::mt19937_64 pick(3);
        const auto t0 = clock_type::now();
        for (std::uint64_t i = 0; i < naive_windows; ++i) {
            const unsigned shard = static_cast<unsigned>(pick() % shards);
            const std::uint64_t first = pick() % (tokens_per_shard - seq - 1);
            g.get(proxy.endpoint() + "/" + ft::s3_test_bucket() + "/" + ft::s3_test_prefix() + "bench/shards_" + std::to_string(shard) +
                      "_000000.bin",
                  1024 + first * 2, (seq + 1) * 2);
        }
        return static_cast<double>(naive_windows * seq) / seconds_since(t0);
    });
    auto results = cases.run(static_cast<int>(rounds), "median");
    const summary first = summarise(first_batch);
    const double s3_rate = results["s3 (tokens/s)"].median;
    nlohmann::json j{{"latency_ms", latency_ms},
                     {"workers", workers},
                     {"batch", batch},
                     {"seq_len", seq},
                     {"local_tokens_per_s", results["local (tokens/s)"].median},
                     {"s3_tokens_per_s", s3_rate},
                     {"naive_get_tokens_per_s", results["naive_get (tokens/s)"].median},
                     {"s3_vs_naive", s3_rate / results["naive_get (tokens/s)"].median},
                     {"s3_vs_local", s3_rate / results["local (tokens/s)"].median},
                     {"s3_no_ahead_tokens_per_s", results["s3_no_ahead (tokens/s)"].median},
                     {"s3_vs_no_ahead", s3_rate / results["s3_no_ahead (tokens/s)"].median},
                     {"fetch_ahead_steps", summarise(ahead_steps).median},
                     {"fetch_ahead_share", summarise(ahead_share).median},
                     {"fetch_ahead_requests", summarise(ahead_requests).median},
                     {"s3_warm_tokens_per_s", results["s3_warm (tokens/s)"].median},
                     {"s3_warm_vs_local", results["s3_warm (tokens/s)"].median / results["local (tokens/s)"].median},
                     {"first_batch_s", first.median},
                     {"first_batch_s_max", first.hi},
                     {"listings_per_open", summarise(listings).median},
                     {"proxy_requests", proxy.requests()}};
    std::printf("first batch from s3: %.3f s (median; max %.3f s); listings per open: %.0f\n", first.median, first.hi,
                summarise(listings).median);
    std::printf("%s\n", j.dump().c_str());
    std::filesystem::remove_all(root);
    return 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "bench_remote: %s\n", e.what());
    return 1;
}
