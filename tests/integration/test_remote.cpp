// s3:// datasets against a real S3 server (SeaweedFS on loopback, started by the ctest fixture):
// batches read from a bucket are bit-identical to the same files read locally in every form a path
// has, a job lists a prefix once, and every failure (wrong secret, missing object or bucket, a
// malformed URL, an object replaced under a running job) is a typed error naming the URL. The settings
// (credentials, endpoint, region, profiles) are read the way AWS's tools read them.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <feedline/pipeline.hpp>
#include <feedline/remote/s3_settings.hpp>
#if FEEDLINE_HAS_DOCTOR
#include <feedline/doctor/measure.hpp>
#endif

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "fault_proxy.hpp"
#include "run_command.hpp"
#include "s3_test_server.hpp"
#include "test_support.hpp"

using namespace feedline;
namespace ft = feedline::test;

namespace {

// A fixed environment for s3_settings_from.
auto env_of(std::map<std::string, std::string> vars) {
    return [vars = std::move(vars)](const char* name) -> std::optional<std::string> {
        if (auto it = vars.find(name); it != vars.end()) return it->second;
        return std::nullopt;
    };
}

// Megatron pairs and llm.c shards of arithmetic documents, written locally and uploaded under the same
// names to `prefix` in the test's bucket. Returns the local directory's path.
void write_and_upload(const ft::scratch_dir& dir, const std::string& prefix) {
    std::filesystem::create_directories(dir / "megatron");
    std::filesystem::create_directories(dir / "llmc");
    for (int k = 0; k < 3; ++k) {
        megatron_writer w(dir / ("megatron/part_" + std::to_string(k)), token_dtype::uint16);
        for (std::uint32_t d = 0; d < 60; ++d) w.add_document(std::vector<std::uint32_t>(20 + (d * 7 + k) % 150, d + 100 * k + 1));
        w.finish();
        llmc_writer l(dir / ("llmc/stream_train_" + std::to_string(k)), token_dtype::uint16, 0);
        for (std::uint32_t d = 0; d < 60; ++d) l.add_document(std::vector<std::uint32_t>(15 + d % 90, d + 7 * k + 1));
        l.finish();
    }
    for (const char* sub : {"megatron", "llmc"})
        for (const auto& e : std::filesystem::directory_iterator(dir / sub))
            if (e.is_regular_file()) ft::s3_put_file(e.path().string(), prefix + sub + "/" + e.path().filename().string());
}

struct run_result {
    std::uint64_t batches = 0, sum = 0;
    std::string state;
};

// Every batch of `p`: how many, a position-weighted token sum, and the state after the last.
run_result consume(pipeline& p) {
    run_result r;
    for (auto& b : p) {
        for (std::int32_t t : b.host_inputs()) r.sum += static_cast<std::uint64_t>(t) * (r.batches + 1);
        ++r.batches;
    }
    r.state = to_json(p.state());
    return r;
}

run_result run(const std::string& spec, const pipeline_config& c) {
    pipeline p(spec, c);
    return consume(p);
}

}  // namespace

TEST_CASE("Remote.Urls.AreCheckedBeforeAnyRequestAndKeysEncodedAsSigV4Signs") {
    const s3_location l = parse_s3_url("s3://my-bucket.v2/data/web text&more.bin");
    CHECK(l.bucket == "my-bucket.v2");
    CHECK(l.key == "data/web text&more.bin");
    CHECK(l.url() == "s3://my-bucket.v2/data/web text&more.bin");
    CHECK(parse_s3_url("s3://bucket").key.empty());
    CHECK(detail::encode_key("data/web text&more+~_.bin") == "data/web%20text%26more%2B~_.bin");
    CHECK(detail::encode_key("a/b", false) == "a%2Fb");
    CHECK(detail::encode_key("\xc3\xa9") == "%C3%A9");  // UTF-8 bytes, each encoded
    for (const std::string& bad :
         std::vector<std::string>{"s3://", "s3:///key", "s3://ab/key", "s3://Upper/key", "s3://-dash/key", "s3://under_score/k",
                                  "s3://bucket/a\nb", "file:///x", "s3://" + std::string(64, 'a') + "/k"}) {
        CAPTURE(bad);
        CHECK_THROWS_AS(parse_s3_url(bad), config_error);
    }
    CHECK_THROWS_WITH_AS(parse_s3_url("s3://Upper/key"), doctest::Contains("lowercase"), config_error);
}

TEST_CASE("Remote.Settings.CredentialsEndpointAndRegionComeFromWhereAwsToolsReadThem") {
    ft::scratch_dir dir;
    ft::write_text(dir / "credentials",
                   "[default]\naws_access_key_id = DEFKEY\naws_secret_access_key = defsecret\n\n"
                   "# a comment\n[work]\naws_access_key_id=WORKKEY\naws_secret_access_key=worksecret\naws_session_token = tok\n");
    ft::write_text(dir / "config",
                   "[default]\nregion = eu-west-1\n[profile work]\nregion = ap-south-1\nendpoint_url = http://127.0.0.1:9000/\n"
                   "s3 =\n  addressing_style = virtual\n");
    const std::map<std::string, std::string> files{{"AWS_SHARED_CREDENTIALS_FILE", dir / "credentials"},
                                                   {"AWS_CONFIG_FILE", dir / "config"}};

    // The default profile: keys from the credentials file, the region from config, AWS's endpoint.
    auto s = s3_settings_from(env_of(files));
    CHECK(s.access_key == "DEFKEY");
    CHECK(s.secret_key == "defsecret");
    CHECK(s.region == "eu-west-1");
    CHECK(s.endpoint == "https://s3.eu-west-1.amazonaws.com");
    CHECK_FALSE(s.path_style);
    CHECK(s.object_url({"bucket", "a b/c"}) == "https://bucket.s3.eu-west-1.amazonaws.com/a%20b/c");
    CHECK(s.sigv4() == "aws:amz:eu-west-1:s3");
    CHECK(s.credentials_source.find("profile 'default'") == 0);

    // AWS_PROFILE: its keys, token, region and endpoint (path style there).
    auto with_profile = files;
    with_profile["AWS_PROFILE"] = "work";
    s = s3_settings_from(env_of(with_profile));
    CHECK(s.access_key == "WORKKEY");
    CHECK(s.session_token == "tok");
    CHECK(s.region == "ap-south-1");
    CHECK(s.endpoint == "http://127.0.0.1:9000");
    CHECK(s.path_style);
    CHECK(s.object_url({"bucket", "k"}) == "http://127.0.0.1:9000/bucket/k");

    // The environment wins over the files, AWS_ENDPOINT_URL_S3 over AWS_ENDPOINT_URL.
    auto env = with_profile;
    env["AWS_ACCESS_KEY_ID"] = "ENVKEY";
    env["AWS_SECRET_ACCESS_KEY"] = "envsecret";
    env["AWS_REGION"] = "us-west-2";
    env["AWS_ENDPOINT_URL"] = "http://general:1";
    env["AWS_ENDPOINT_URL_S3"] = "https://s3only:2";
    s = s3_settings_from(env_of(env));
    CHECK(s.access_key == "ENVKEY");
    CHECK(s.session_token.empty());
    CHECK(s.region == "us-west-2");
    CHECK(s.endpoint == "https://s3only:2");
    CHECK(s.credentials_source.find("environment") != std::string::npos);

    // Anonymous requests for a public bucket; no credentials at all is refused when a client is made.
    s = s3_settings_from(env_of({{"AWS_NO_SIGN_REQUEST", "true"}, {"HOME", dir / "nowhere"}}));
    CHECK_FALSE(s.sign);
    CHECK_NOTHROW(s3_client{s});
    CHECK_THROWS_WITH_AS(s3_client{s3_settings_from(env_of({{"HOME", dir / "nowhere"}}))}, doctest::Contains("AWS_NO_SIGN_REQUEST"),
                         config_error);

    // Bad values name their variable.
    CHECK_THROWS_WITH_AS(s3_settings_from(env_of({{"AWS_ACCESS_KEY_ID", "K"}})), doctest::Contains("AWS_SECRET_ACCESS_KEY"), config_error);
    CHECK_THROWS_WITH_AS(s3_settings_from(env_of({{"AWS_ENDPOINT_URL", "127.0.0.1:9000"}})), doctest::Contains("AWS_ENDPOINT_URL"),
                         config_error);
    auto missing = files;
    missing["AWS_PROFILE"] = "nosuch";
    CHECK_THROWS_WITH_AS(s3_settings_from(env_of(missing)), doctest::Contains("'nosuch'"), config_error);
    CHECK_THROWS_WITH_AS(s3_settings_from(env_of({{"FEEDLINE_S3_ATTEMPTS", "-3"}})), doctest::Contains("FEEDLINE_S3_ATTEMPTS"),
                         config_error);
    CHECK(s3_settings_from(env_of({{"FEEDLINE_S3_MAX_REQUESTS", "7"}})).max_requests == 7);
}

TEST_CASE("Remote.Shards.BatchesFromABucketAreTheLocalFilesBatchesInEveryForm") {
    ft::use_s3_server();
    ft::scratch_dir dir;
    write_and_upload(dir, "shards/");
    const std::string bucket = ft::s3_url("shards/");
    const std::vector<std::pair<std::string, std::string>> forms{
        {"megatron/part_1", "megatron/part_1"},          // a Megatron prefix
        {"megatron", "megatron"},                        // a directory (a prefix without '/')
        {"megatron/part_*.idx", "megatron/part_*.idx"},  // a glob
        {"llmc/stream_train_*.bin", "llmc/stream_train_*.bin"},
        {"llmc", "llmc/"},  // a "directory" prefix, with its '/'
    };
    for (const auto& form : forms) {
        const std::string& local = form.first;
        const std::string& remote = form.second;  // named, not a structured binding: clang 14 cannot capture one
        for (const sample_mode mode : {sample_mode::windows, sample_mode::packed}) {
            for (const int rank : {0, 1}) {
                CAPTURE(remote);
                CAPTURE(static_cast<int>(mode));
                CAPTURE(rank);
                const pipeline_config c{.batch_size = 4,
                                        .seq_len = 48,
                                        .seed = 11,
                                        .mode = mode,
                                        .workers = 2,
                                        .device = device_kind::cpu,
                                        .rank = rank,
                                        .world_size = 2,
                                        .max_steps = 30};
                const run_result here = run(dir / local, c);
                const run_result there = run(bucket + remote, c);
                CHECK(here.batches == 30);
                CHECK(there.batches == here.batches);
                CHECK(there.sum == here.sum);
                CHECK(there.state == here.state);
            }
        }
    }
    // A blend of local and remote data, and a resume in the middle of a run.
    pipeline_config c{
        .batch_size = 4, .seq_len = 32, .seed = 3, .workers = 2, .device = device_kind::cpu, .rank = 0, .world_size = 1, .max_steps = 40};
    const std::vector<weighted_spec> local_blend{{0.6, dir / "megatron"}, {0.4, dir / "llmc/stream_train_*.bin"}};
    const std::vector<weighted_spec> mixed_blend{{0.6, dir / "megatron"}, {0.4, bucket + "llmc/stream_train_*.bin"}};
    std::vector<std::int32_t> all_local, all_mixed, resumed;
    {
        pipeline p(local_blend, c);
        for (auto& b : p) all_local.insert(all_local.end(), b.host_inputs().begin(), b.host_inputs().end());
    }
    std::string saved;
    {
        pipeline p(mixed_blend, c);
        for (auto& b : p) {
            all_mixed.insert(all_mixed.end(), b.host_inputs().begin(), b.host_inputs().end());
            if (b.step() == 16) saved = to_json(p.state());
        }
    }
    CHECK(all_mixed == all_local);
    REQUIRE_FALSE(saved.empty());
    pipeline again(mixed_blend, c);
    again.restore(pipeline_state_from_json(saved));
    for (auto& b : again) resumed.insert(resumed.end(), b.host_inputs().begin(), b.host_inputs().end());
    const std::size_t per_batch = 4 * 32;
    REQUIRE(resumed.size() == (40 - 17) * per_batch);
    CHECK(std::equal(resumed.begin(), resumed.end(), all_local.begin() + 17 * per_batch));
}

TEST_CASE("Remote.Listing.AGlobOfManyShardsCostsOneListingAndNoHeads") {
    ft::use_s3_server();
    ft::scratch_dir dir;
    for (int k = 0; k < 40; ++k) {
        const std::string name = "many_" + std::to_string(1000 + k);
        llmc_writer l(dir / name, token_dtype::uint16, 0);
        for (std::uint32_t d = 0; d < 5; ++d) l.add_document(std::vector<std::uint32_t>(30 + d, d + k + 1));
        l.finish();
        ft::s3_put_file(dir / (name + "_000000.bin"), "many/" + name + "_000000.bin");
    }
    ft::s3_put_file(dir / "many_1000_000000.bin", "many/many_nested/x.bin");  // below the glob's level: no match
    const auto before = detail::remote_counters::instance().snapshot();
    const token_dataset ds(ft::s3_url("many/many_*.bin"));
    const auto opened = detail::remote_counters::instance().snapshot().since(before);
    CHECK(ds.shard_count() == 40);
    CHECK(s3_catalog::instance().listings() == 1);
    // One listing, then each shard's 1 KiB header: no HEAD for any of them (the listing has their sizes
    // and ETags), and no question about a missing .idx beside them.
    CHECK(opened.requests == 1 + 40);
    CHECK(opened.failures == 0);
    CHECK(opened.latency_quantile(0.5) > 0);
}

TEST_CASE("Remote.Errors.NameTheUrlAndTheServersCodeWithinSeconds") {
    ft::use_s3_server();
    ft::scratch_dir dir;
    write_and_upload(dir, "errors/");
    const std::string base = ft::s3_url("errors/");
    const auto t0 = std::chrono::steady_clock::now();

    // A missing object, a missing prefix, a missing bucket.
    try {
        token_dataset ds(base + "llmc/nothing_here.bin");
        FAIL("opened a missing object");
    } catch (const io_error& e) {
        CHECK(e.file() == base + "llmc/nothing_here.bin");
        CHECK(e.error_code() == ENOENT);
    }
    CHECK_THROWS_WITH_AS(token_dataset(base + "llmc/none_*.bin"), doctest::Contains("matches no file"), io_error);
    try {
        token_dataset ds("s3://no-such-bucket-feedline/data/x_*.bin");
        FAIL("listed a missing bucket");
    } catch (const io_error& e) {
        CHECK(std::string(e.what()).find("NoSuchBucket") != std::string::npos);
        CHECK(e.file().find("s3://no-such-bucket-feedline/") == 0);
    }
    // A malformed URL: refused before any request.
    CHECK_THROWS_AS(token_dataset("s3://Bad_Bucket/x.bin"), config_error);

    // The wrong secret: the server's code, and where the credentials came from.
    ft::use_s3_server("not-the-secret");
    try {
        token_dataset ds(base + "llmc/stream_train_*.bin");
        FAIL("listed with the wrong secret");
    } catch (const io_error& e) {
        CHECK(e.error_code() == EACCES);
        CHECK(std::string(e.what()).find("SignatureDoesNotMatch") != std::string::npos);
        CHECK(std::string(e.what()).find("AWS_ACCESS_KEY_ID") != std::string::npos);
    }
    // None of it was retried: each answer came at once.
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20));
}

TEST_CASE("Remote.Replaced.AnObjectReplacedUnderARunningJobIsAnErrorNamingItNeverMixedData") {
    const ft::scoped_env no_cache("FEEDLINE_S3_CACHE_BYTES", "0");  // every read goes to the store, pinned by If-Match
    ft::use_s3_server();
    ft::scratch_dir dir;
    write_and_upload(dir, "replaced/");
    const std::string url = ft::s3_url("replaced/llmc/stream_train_1_000000.bin");
    const token_dataset ds(url);
    std::vector<std::byte> before(64);
    ds.shard(0).bin->read_at(before.data(), before.size(), 2048);
    // Same size, other bytes: only the ETag tells them apart.
    std::string other = ft::read_text(dir / "llmc/stream_train_1_000000.bin");
    for (std::size_t i = 1024; i < other.size(); ++i) other[i] = static_cast<char>(other[i] ^ 0x5a);
    ft::s3_put("replaced/llmc/stream_train_1_000000.bin", other);
    std::vector<std::byte> after(64);
    try {
        ds.shard(0).bin->read_at(after.data(), after.size(), 2048);
        FAIL("read an object that was replaced");
    } catch (const io_error& e) {
        CHECK(e.file() == url);
        CHECK(e.error_code() == ESTALE);
        CHECK(std::string(e.what()).find("replaced") != std::string::npos);
        CHECK(e.offset() == 2048u);
    }
}

TEST_CASE("Remote.Faults.RetriedFaultsLeaveTheBatchesIdenticalAndShowInStats") {
    const ft::scoped_env no_cache("FEEDLINE_S3_CACHE_BYTES", "0");  // every batch's reads meet the faults
    ft::use_s3_server();
    ft::scratch_dir dir;
    write_and_upload(dir, "faults/");
    ft::fault_proxy proxy(ft::s3_endpoint());
    // Every kind of fault, spread over the requests; a stalled body is given up after 1 s.
    proxy.set([](std::uint64_t n) {
        using f = ft::fault_proxy::fault;
        if (n % 5 == 1) return f::slow_down;
        if (n % 7 == 2) return f::reset;
        if (n % 11 == 3) return f::short_body;
        if (n == 20) return f::stall;
        return f::none;
    });
    const ft::scoped_env stall("FEEDLINE_S3_STALL_SECONDS", "1"), backoff("FEEDLINE_S3_BACKOFF_SECONDS", "0.02");
    ft::use_s3_server(ft::s3_secret_key, proxy.endpoint());
    for (const sample_mode mode : {sample_mode::windows, sample_mode::packed}) {
        CAPTURE(static_cast<int>(mode));
        const pipeline_config c{.batch_size = 4,
                                .seq_len = 40,
                                .seed = 8,
                                .mode = mode,
                                .workers = 2,
                                .device = device_kind::cpu,
                                .rank = 0,
                                .world_size = 1,
                                .max_steps = 25};
        const run_result here = run(dir / "megatron", c);
        pipeline p(ft::s3_url("faults/megatron"), c);
        const run_result there = consume(p);
        CHECK(there.batches == here.batches);
        CHECK(there.sum == here.sum);
        const pipeline_stats s = p.stats();
        REQUIRE(s.remote_requests.has_value());
        CHECK(*s.remote_retries > 0);
        CHECK(*s.remote_failures == 0);
        CHECK(p.stats().to_json().find("\"remote_retries\": ") != std::string::npos);
    }
    CHECK(proxy.faults() > 5);
}

TEST_CASE("Remote.Faults.ExhaustedRetriesAndStallsGiveTheNamedErrorWithinTheirBound") {
    const ft::scoped_env no_cache("FEEDLINE_S3_CACHE_BYTES", "0");  // the read asks for exactly its range
    ft::use_s3_server();
    ft::scratch_dir dir;
    write_and_upload(dir, "exhausted/");
    ft::fault_proxy proxy(ft::s3_endpoint());
    const ft::scoped_env attempts("FEEDLINE_S3_ATTEMPTS", "4"), backoff("FEEDLINE_S3_BACKOFF_SECONDS", "0.05"),
        stall("FEEDLINE_S3_STALL_SECONDS", "1");
    ft::use_s3_server(ft::s3_secret_key, proxy.endpoint());
    const std::string url = ft::s3_url("exhausted/llmc/stream_train_0_000000.bin");
    const auto object = open_byte_source(url);  // opened while the server answers
    for (const auto kind : {ft::fault_proxy::fault::slow_down, ft::fault_proxy::fault::stall, ft::fault_proxy::fault::reset,
                            ft::fault_proxy::fault::short_body}) {
        CAPTURE(static_cast<int>(kind));
        proxy.set([kind](std::uint64_t) { return kind; });
        const auto t0 = std::chrono::steady_clock::now();
        std::vector<std::byte> buffer(100);
        try {
            object->read_at(buffer.data(), buffer.size(), 1024);
            FAIL("a server that always fails was read");
        } catch (const io_error& e) {
            const std::string what = e.what();
            CHECK(e.file() == url);
            CHECK(e.offset() == 1024u);
            CHECK(what.find("bytes 1024-1123") != std::string::npos);
            CHECK(what.find("after 4 attempts") != std::string::npos);
            if (kind == ft::fault_proxy::fault::slow_down) CHECK(what.find("HTTP 503 SlowDown") != std::string::npos);
            if (kind == ft::fault_proxy::fault::stall) {
                CHECK(what.find("stalled") != std::string::npos);
                CHECK(e.error_code() == ETIMEDOUT);
            }
            if (kind == ft::fault_proxy::fault::reset) CHECK(what.find("reset") != std::string::npos);
            if (kind == ft::fault_proxy::fault::short_body) CHECK(what.find("partial") != std::string::npos);
        }
        // 4 attempts: 3 backoffs of at most 0.05, 0.1 and 0.2 s; for stalls, 4 silences of 1-2 s.
        CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(12));
    }
}

TEST_CASE("Remote.Cancel.AStoppedPipelineDoesNotWaitOutASlowBucket") {
    ft::use_s3_server();
    ft::scratch_dir dir;
    write_and_upload(dir, "cancel/");
    ft::fault_proxy proxy(ft::s3_endpoint());
    ft::use_s3_server(ft::s3_secret_key, proxy.endpoint());
    const pipeline_config c{.batch_size = 4, .seq_len = 40, .workers = 2, .device = device_kind::cpu, .rank = 0, .world_size = 1};
    auto p = std::make_unique<pipeline>(ft::s3_url("cancel/megatron"), c);  // opened: listing and indexes read
    // From here every request stalls, and would be retried for a minute.
    proxy.set([](std::uint64_t) { return ft::fault_proxy::fault::stall; });
    int checks = 0;
    p->set_wait_check([&] { return ++checks == 3; });  // the trainer gives up after ~300 ms, as on Ctrl-C
    CHECK_THROWS_AS(p->next(), wait_interrupted);
    const auto t0 = std::chrono::steady_clock::now();
    p.reset();  // joins the workers, which are inside a stalled fetch
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
}

#if FEEDLINE_HAS_DOCTOR
TEST_CASE("Remote.Doctor.CheckMeasuresLatencyBandwidthAndTheConcurrencyNeeded") {
    ft::use_s3_server();
    ft::scratch_dir dir;
    write_and_upload(dir, "doctor/");
    ft::fault_proxy proxy(ft::s3_endpoint());
    proxy.set({}, std::chrono::milliseconds(30));
    ft::use_s3_server(ft::s3_secret_key, proxy.endpoint());
    const auto m = doctor::measure_reads({.data = ft::s3_url("doctor/llmc/stream_train_*.bin"), .seconds = 0.3, .seq_len = 64});
    CHECK(m["remote"] == true);
    CHECK(m["files"] == 3);
    CHECK(m["window_bytes"] == 130);
    const double p50 = m["latency_p50_s"].get<double>();
    CHECK(p50 >= 0.03);  // the proxy's 30 ms are in every request
    CHECK(m["in_flight_per_million_tokens_per_s"].get<double>() == doctest::Approx(1e6 / 64 * p50));
    CHECK(m["sixteen_streams_bytes_per_s"].get<double>() > 0);
    // Concurrency is what buys windows: 16 in flight fetch more than one at a time could.
    CHECK(m["windows_per_s_16_in_flight"].get<double>() > 2 / p50);
}
#endif

namespace {

// The bytes of the cache's block files (finished and being written), by walking its directory.
std::uint64_t cache_files_bytes(const std::string& dir) {
    std::uint64_t total = 0;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir + "/blocks"))
        if (e.is_regular_file() && e.path().filename().string().find(".blk") != std::string::npos) total += e.file_size();
    return total;
}

// llm.c shards of `documents` arithmetic documents each, written locally and uploaded under `prefix`.
void write_llmc(const ft::scratch_dir& dir, const std::string& name, int shards, std::uint32_t documents, const std::string& prefix) {
    for (int k = 0; k < shards; ++k) {
        const std::string stem = name + "_" + std::to_string(k);
        llmc_writer l(dir / stem, token_dtype::uint16, 0);
        for (std::uint32_t d = 0; d < documents; ++d) l.add_document(std::vector<std::uint32_t>(40 + d % 200, d * 3 + k + 1));
        l.finish();
        ft::s3_put_file(dir / (stem + "_000000.bin"), prefix + stem + "_000000.bin");
    }
}

}  // namespace

TEST_CASE("Remote.Cache.ASecondRunReadsEveryBlockFromTheCacheWithTheSameBatches") {
    ft::scratch_dir dir;
    const ft::scoped_env cache_dir("FEEDLINE_CACHE_DIR", dir / "cache"), budget("FEEDLINE_S3_CACHE_BYTES", "64M"),
        block("FEEDLINE_S3_CACHE_BLOCK_BYTES", "16K");
    ft::use_s3_server();
    write_llmc(dir, "warm", 3, 300, "warm/");
    ft::fault_proxy proxy(ft::s3_endpoint());  // counts the requests
    ft::use_s3_server(ft::s3_secret_key, proxy.endpoint());
    const pipeline_config c{
        .batch_size = 4, .seq_len = 64, .seed = 5, .workers = 2, .device = device_kind::cpu, .rank = 0, .world_size = 1, .max_steps = 40};
    const run_result here = run(dir / "warm_*.bin", c);
    const run_result cold = run(ft::s3_url("warm/warm_*.bin"), c);
    CHECK(cold.sum == here.sum);
    CHECK(cold.state == here.state);
    s3_catalog::instance().reset();  // a new run: listing and lookups again, the cache's files kept
    const auto before = proxy.requests();
    pipeline p(ft::s3_url("warm/warm_*.bin"), c);
    const run_result warm = consume(p);
    CHECK(warm.sum == here.sum);
    CHECK(proxy.requests() - before == 1);  // the listing: every header and window came from the cache
    const pipeline_stats s = p.stats();
    REQUIRE(s.remote_cache_hits.has_value());
    CHECK(*s.remote_cache_hits > 0);
    CHECK(*s.remote_cache_misses == 0);
    CHECK(*s.remote_requests == proxy.requests() - before);  // stats count what opening the data asked for too
    block_cache check({.directory = dir / "cache/remote", .budget_bytes = 64 << 20, .block_bytes = 16 << 10});
    const auto [files, bad] = check.verify_all();
    CHECK(files > 0);
    CHECK(bad == 0);
    CHECK(check.used_bytes() == cache_files_bytes(dir / "cache/remote"));

    // A block damaged on disk is a miss: fetched again, and the batches stay the same.
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir / "cache/remote/blocks"))
        if (e.is_regular_file()) {
            std::string bytes = ft::read_text(e.path().string());
            bytes[bytes.size() / 3] ^= 0x40;
            ft::write_text(e.path().string(), bytes);
        }
    s3_catalog::instance().reset();
    const run_result repaired = run(ft::s3_url("warm/warm_*.bin"), c);
    CHECK(repaired.sum == here.sum);
}

TEST_CASE("Remote.Cache.TheBudgetHoldsAndOnlyTheCachesOwnFilesAreDeleted") {
    ft::scratch_dir dir;
    const std::uint64_t budget = 320 << 10;
    const ft::scoped_env cache_dir("FEEDLINE_CACHE_DIR", dir / "cache"), budget_env("FEEDLINE_S3_CACHE_BYTES", std::to_string(budget)),
        block("FEEDLINE_S3_CACHE_BLOCK_BYTES", "16K");
    ft::use_s3_server();
    write_llmc(dir, "first", 2, 300, "budget/");   // ~2 x 70 KiB: fits
    write_llmc(dir, "second", 2, 350, "budget/");  // ~2 x 80 KiB: fits, but not beside the first
    write_llmc(dir, "large", 8, 350, "budget/");   // ~640 KiB: twice the cache
    const std::string cache = dir / "cache/remote";
    // What is not the cache's: a file of another name among its blocks, and a directory beside them.
    std::filesystem::create_directories(cache + "/blocks/ab");
    ft::write_text(cache + "/blocks/ab/notes.txt", "not feedline's");
    ft::write_text(cache + "/blocks/ab/0123456789abcdef0123456789abcdef.1.blk.tmp-1-nothex", "not feedline's either");
    const pipeline_config c{
        .batch_size = 4, .seq_len = 64, .seed = 9, .workers = 2, .device = device_kind::cpu, .rank = 0, .world_size = 1, .max_steps = 60};
    for (const std::string name : {"first", "second", "first", "large", "second"}) {
        CAPTURE(name);
        s3_catalog::instance().reset();
        const auto before = detail::remote_counters::instance().snapshot();
        CHECK(run(ft::s3_url("budget/" + name + "_*.bin"), c).sum == run(dir / (name + "_*.bin"), c).sum);
        const auto d = detail::remote_counters::instance().snapshot().since(before);
        const std::uint64_t on_disk = cache_files_bytes(cache);
        CHECK(on_disk <= budget);
        CHECK(on_disk > 0);
        // Larger than the cache: streamed, not cached (but the headers of the shards opened while the
        // data opened so far still fitted).
        if (name == "large") CHECK(d.cache_hits + d.cache_misses <= 8);
        CHECK(std::filesystem::exists(cache + "/blocks/ab/notes.txt"));
        CHECK(std::filesystem::exists(cache + "/blocks/ab/0123456789abcdef0123456789abcdef.1.blk.tmp-1-nothex"));
    }
    block_cache check({.directory = cache, .budget_bytes = budget, .block_bytes = 16 << 10});
    CHECK(check.verify_all().second == 0);
    // A directory that is not the cache's is refused, never written into.
    std::filesystem::create_directories(dir / "elsewhere");
    ft::write_text(dir / "elsewhere/FEEDLINE-REMOTE-CACHE", "something else\n");
    CHECK_THROWS_AS(block_cache({.directory = dir / "elsewhere", .budget_bytes = budget}), io_error);
}

TEST_CASE("Remote.Cache.ThreadsPublishingTheSameBlocksUnderEvictionKeepTheLedgerEqualToTheFiles") {
    // Four threads insert the same 48 blocks in different orders into a cache that holds 10: the same
    // block is published by two threads at once (one loses, its reservation given back) while others
    // evict by scanning the directory. However they interleave, the ledger never falls below the bytes
    // the files hold (which would let later inserts exceed the budget), and the files never exceed it.
    ft::scratch_dir dir;
    const std::uint64_t block = 4096, budget = 10 * (block + 64);
    block_cache cache({.directory = dir / "cache", .budget_bytes = budget, .block_bytes = block});
    const std::string object = "00112233445566778899aabbccddeeff";
    std::atomic<std::uint64_t> under_counted{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
        threads.emplace_back([&, t] {
            std::vector<std::byte> bytes(block);
            for (int round = 0; round < 30; ++round)
                for (std::uint64_t k = 0; k < 48; ++k) {
                    const std::uint64_t index = (k * (2 * t + 1) + round) % 48;
                    std::fill(bytes.begin(), bytes.end(), static_cast<std::byte>(index));
                    cache.insert(object, index, bytes);  // no find: the mappings it keeps would end the inserts
                    if (const auto a = cache.audit(); a.ledger_bytes < a.file_bytes || a.file_bytes > budget) ++under_counted;
                }
        });
    for (auto& t : threads) t.join();
    CHECK(under_counted.load() == 0);
    const auto end = cache.audit();
    CHECK(end.ledger_bytes == end.file_bytes);
    CHECK(end.file_bytes == cache_files_bytes(dir / "cache"));
    CHECK(cache.snapshot().evicted > 0);
    const auto [files, bad] = cache.verify_all();
    CHECK(files > 0);
    CHECK(bad == 0);
}

TEST_CASE("Remote.Cache.TwoProcessesSharingOneCacheGetIdenticalBatchesAndAConsistentCache") {
    ft::scratch_dir dir;
    const std::string bin = FEEDLINE_BIN_DIR;
    if (!std::filesystem::exists(bin + "/feedline-iterate")) ft::skip("feedline-iterate is not built");
    const ft::scoped_env cache_dir("FEEDLINE_CACHE_DIR", dir / "cache"), budget("FEEDLINE_S3_CACHE_BYTES", "256K"),
        block("FEEDLINE_S3_CACHE_BLOCK_BYTES", "8K");
    const std::string endpoint = ft::use_s3_server();
    write_llmc(dir, "shared", 3, 250, "shared/");
    const std::string args = " --batch-size 8 --seq-len 64 --seed 3 --workers 2 --device cpu --batches 50 ";
    // Two processes at once, on one cache directory that holds their data with little room to spare.
    const std::string url = "'" + ft::s3_url("shared/shared_*.bin") + "'";  // quoted: the shell must not expand the glob
    const std::string cmd = "(" + bin + "/feedline-iterate " + url + args + " > " + (dir / "a.json") + " 2>" + (dir / "a.err") + " & " +
                            bin + "/feedline-iterate " + url + args + " > " + (dir / "b.json") + " 2>" + (dir / "b.err") + " & wait)";
    REQUIRE(std::system(cmd.c_str()) == 0);
    const auto last_line = [](const std::string& text) {
        const auto lines = text.substr(0, text.find_last_not_of('\n') + 1);
        return nlohmann::json::parse(lines.substr(lines.rfind('\n') + 1));
    };
    INFO(ft::read_text(dir / "a.err"), ft::read_text(dir / "b.err"));
    const auto a = last_line(ft::read_text(dir / "a.json")), b = last_line(ft::read_text(dir / "b.json"));
    const auto local = last_line(ft::run(bin + "/feedline-iterate '" + (dir / "shared_*.bin") + "'" + args, dir).out);
    CHECK(a["token_sum"] == local["token_sum"]);
    CHECK(b["token_sum"] == local["token_sum"]);
    CHECK(a["state"] == local["state"]);
    block_cache check({.directory = dir / "cache/remote", .budget_bytes = 256 << 10, .block_bytes = 8 << 10});
    const auto [files, bad] = check.verify_all();
    CHECK(files > 0);
    CHECK(bad == 0);
    CHECK(cache_files_bytes(dir / "cache/remote") <= (256u << 10));
    (void)endpoint;
}

TEST_CASE("Remote.Cache.BlockChecksumsAreCrc32cOnEveryPath") {
    const std::string check = "123456789";
    const auto bytes = std::as_bytes(std::span(check.data(), check.size()));
    CHECK(detail::crc32c_portable(bytes) == 0xE3069283u);
    CHECK(detail::crc32c_of(bytes) == 0xE3069283u);
    const auto data = ft::patterned_bytes(1'000'003, 17);  // odd length: the tail after the 8-byte steps
    CHECK(detail::crc32c_of(data) == detail::crc32c_portable(data));
}
