// feedline/remote/s3_settings.hpp: where S3 requests go and how they are signed, read the way AWS's own
// tools read it: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, then the profile
// (AWS_PROFILE, else "default") in ~/.aws/credentials and ~/.aws/config (AWS_SHARED_CREDENTIALS_FILE,
// AWS_CONFIG_FILE move them); AWS_REGION / AWS_DEFAULT_REGION, then the profile's region; the endpoint
// from AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, then the profile's endpoint_url, else AWS's own.
// Anonymous requests (a public bucket) with AWS_NO_SIGN_REQUEST=true (the tools' --no-sign). Path-style
// URLs (endpoint/bucket/key) when an endpoint is given (MinIO, SeaweedFS, Ceph), virtual-hosted
// (bucket.s3.region.amazonaws.com/key) for AWS. How requests are retried and timed out comes from
// FEEDLINE_S3_* variables (docs/remote.md). Needs no HTTP client; feeds remote/s3_client.hpp.
#pragma once

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include <feedline/detail/paths.hpp>
#include <feedline/error.hpp>
#include <feedline/remote/s3_location.hpp>
#include <feedline/storage/file.hpp>

namespace feedline {

struct s3_settings {
    std::string endpoint;  // scheme://host[:port], no trailing '/'
    bool path_style = true;
    std::string region = "us-east-1";
    std::string access_key, secret_key, session_token;
    bool sign = true;                // false: anonymous requests (a public bucket)
    std::string credentials_source;  // where the keys came from, for errors and `feedline-inspect`
    // Ranged GETs one worker keeps in flight (each worker reads its batch's windows at once). Unless
    // set (FEEDLINE_S3_MAX_REQUESTS), the pipeline's fetch ahead may keep more, from the measured
    // latency (detail::remote_requests_in_flight).
    unsigned max_requests = 32;
    bool max_requests_set = false;
    // The local block cache (remote/block_cache.hpp): its directory ("" = none), its budget (nullopt:
    // a tenth of the free space where it lives, at most 32 GiB; 0: no cache) and its block size.
    std::string cache_directory;
    std::optional<std::uint64_t> cache_bytes;
    std::uint64_t cache_block_bytes = 1 << 20;
    // How hard a request is tried. Each attempt that fails in a way that may pass (a 5xx, 429 or SlowDown,
    // a timeout, a reset connection, a body cut short) is retried after a capped exponential backoff with
    // full jitter, until `attempts` were made or `retry_seconds` passed; then the error names the URL, the
    // range, the attempts and the last status.
    struct retry_policy {
        unsigned attempts = 10;
        double first_backoff_seconds = 0.1;
        double max_backoff_seconds = 5;
        double retry_seconds = 60;
        double connect_timeout_seconds = 10;
        // A response that sends no byte for this long is a stalled connection: dropped and retried.
        double stall_seconds = 20;
    } retry;

    // The URL of an object (or of a bucket, for an empty key), its key percent-encoded.
    std::string object_url(const s3_location& where) const {
        if (path_style) return endpoint + "/" + where.bucket + "/" + detail::encode_key(where.key);
        const std::size_t scheme_end = endpoint.find("://");
        const std::size_t host = scheme_end == std::string::npos ? 0 : scheme_end + 3;
        return endpoint.substr(0, host) + where.bucket + "." + endpoint.substr(host) + "/" + detail::encode_key(where.key);
    }
    // "aws:amz:<region>:s3", libcurl's CURLOPT_AWS_SIGV4 for this region.
    std::string sigv4() const { return "aws:amz:" + region + ":s3"; }
};

namespace detail {

// One profile's keys from an AWS credentials or config file: `[name]` sections (the config file spells
// them `[profile name]`, except `[default]`), `key = value` lines, '#' and ';' comments. Indented
// lines belong to a nested setting ("s3 =\n  addressing_style = path") and are skipped.
inline std::map<std::string, std::string> aws_profile_section(const std::string& text, const std::string& profile, bool config_file) {
    std::map<std::string, std::string> out;
    bool inside = false;
    std::size_t at = 0;
    auto trim = [](std::string_view s) {
        while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
        while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
        return s;
    };
    while (at <= text.size()) {
        const std::size_t end = std::min(text.find('\n', at), text.size());
        const std::string_view raw(text.data() + at, end - at);
        at = end + 1;
        if (!raw.empty() && (raw.front() == ' ' || raw.front() == '\t')) continue;
        const std::string_view line = trim(raw);
        if (line.empty() || line.front() == '#' || line.front() == ';') continue;
        if (line.front() == '[' && line.back() == ']') {
            std::string_view name = trim(line.substr(1, line.size() - 2));
            if (config_file && name.substr(0, 8) == "profile ") name = trim(name.substr(8));
            inside = name == profile;
            continue;
        }
        const std::size_t eq = line.find('=');
        if (!inside || eq == std::string_view::npos) continue;
        out[std::string(trim(line.substr(0, eq)))] = std::string(trim(line.substr(eq + 1)));
    }
    return out;
}

// A FEEDLINE_S3_* byte count (digits, optionally with a K/M/G/T binary suffix), or nullopt when unset.
// Throws config_error naming the variable otherwise.
inline std::optional<std::uint64_t> byte_setting(const std::function<std::optional<std::string>(const char*)>& env, const char* name) {
    const auto v = env(name);
    if (!v || v->empty()) return std::nullopt;
    std::uint64_t n = 0;
    std::size_t i = 0;
    for (; i < v->size() && (*v)[i] >= '0' && (*v)[i] <= '9'; ++i) {
        if (n > (UINT64_MAX - 9) / 10) throw config_error(name, "'" + *v + "' is too large");
        n = n * 10 + static_cast<std::uint64_t>((*v)[i] - '0');
    }
    const std::string suffix = v->substr(i);
    const std::string units = "KMGT";
    unsigned shift = 0;
    if (!suffix.empty()) {
        const std::size_t u = units.find(static_cast<char>(std::toupper(static_cast<unsigned char>(suffix[0]))));
        if (i == 0 || u == std::string::npos || (suffix.size() > 1 && suffix.substr(1) != "iB" && suffix.substr(1) != "B"))
            throw config_error(name, "'" + *v + "' (expected bytes: a whole number, optionally with K, M, G or T)");
        shift = 10 * static_cast<unsigned>(u + 1);
    } else if (i == 0) {
        throw config_error(name, "'" + *v + "' (expected bytes: a whole number, optionally with K, M, G or T)");
    }
    if (shift && n > (UINT64_MAX >> shift)) throw config_error(name, "'" + *v + "' is too large");
    return n << shift;
}

inline bool truthy(std::string_view v) { return v == "1" || v == "true" || v == "TRUE" || v == "True" || v == "yes" || v == "on"; }

// A FEEDLINE_S3_* number, or `fallback` when unset. Throws config_error naming the variable when it is
// not a positive number.
inline double positive_setting(const std::function<std::optional<std::string>(const char*)>& env, const char* name, double fallback) {
    const auto v = env(name);
    if (!v || v->empty()) return fallback;
    char* end = nullptr;
    const double x = std::strtod(v->c_str(), &end);
    if (end == v->c_str() || *end != '\0' || !(x > 0) || x > 1e9) throw config_error(name, "'" + *v + "' (expected a positive number)");
    return x;
}

}  // namespace detail

// The settings this process's environment gives (see the header comment). `env` reads a variable
// (tests pass their own; nullopt: unset). Throws config_error naming a variable with a bad value, or a
// profile named by AWS_PROFILE that neither file has.
inline s3_settings s3_settings_from(const std::function<std::optional<std::string>(const char*)>& env) {
    auto get = [&](const char* name) -> std::string {
        const auto v = env(name);
        return v ? *v : std::string();
    };
    const std::string home = get("HOME");
    auto read_if_there = [&](const std::string& path) -> std::optional<std::string> {
        if (path.empty() || !detail::path_exists(path)) return std::nullopt;
        return read_regular_file(path, 1 << 20);  // an AWS file is small; a FIFO or directory is refused
    };
    const std::string credentials_path = !get("AWS_SHARED_CREDENTIALS_FILE").empty() ? get("AWS_SHARED_CREDENTIALS_FILE")
                                         : home.empty()                              ? ""
                                                                                     : home + "/.aws/credentials";
    const std::string config_path = !get("AWS_CONFIG_FILE").empty() ? get("AWS_CONFIG_FILE") : home.empty() ? "" : home + "/.aws/config";
    const std::string named_profile = !get("AWS_PROFILE").empty() ? get("AWS_PROFILE") : get("AWS_DEFAULT_PROFILE");
    const std::string profile = named_profile.empty() ? "default" : named_profile;
    const auto credentials_text = read_if_there(credentials_path);
    const auto config_text = read_if_there(config_path);
    const auto from_credentials =
        credentials_text ? detail::aws_profile_section(*credentials_text, profile, false) : std::map<std::string, std::string>{};
    const auto from_config = config_text ? detail::aws_profile_section(*config_text, profile, true) : std::map<std::string, std::string>{};
    if (!named_profile.empty() && from_credentials.empty() && from_config.empty())
        throw config_error("AWS_PROFILE", "profile '" + profile + "' is in neither " + credentials_path + " nor " + config_path);
    auto setting = [&](const std::string& key) -> std::string {
        if (auto it = from_credentials.find(key); it != from_credentials.end()) return it->second;
        if (auto it = from_config.find(key); it != from_config.end()) return it->second;
        return {};
    };

    s3_settings s;
    if (!get("AWS_ACCESS_KEY_ID").empty() || !get("AWS_SECRET_ACCESS_KEY").empty()) {
        if (get("AWS_ACCESS_KEY_ID").empty() || get("AWS_SECRET_ACCESS_KEY").empty())
            throw config_error(get("AWS_ACCESS_KEY_ID").empty() ? "AWS_ACCESS_KEY_ID" : "AWS_SECRET_ACCESS_KEY",
                               "is not set, but its partner is: set both, or neither (to use a profile)");
        s.access_key = get("AWS_ACCESS_KEY_ID");
        s.secret_key = get("AWS_SECRET_ACCESS_KEY");
        s.session_token = get("AWS_SESSION_TOKEN");
        s.credentials_source = "the environment (AWS_ACCESS_KEY_ID)";
    } else if (!setting("aws_access_key_id").empty()) {
        s.access_key = setting("aws_access_key_id");
        s.secret_key = setting("aws_secret_access_key");
        s.session_token = setting("aws_session_token");
        if (s.secret_key.empty()) throw config_error("aws_secret_access_key", "profile '" + profile + "' has a key id but no secret");
        s.credentials_source =
            "profile '" + profile + "' (" + (from_credentials.count("aws_access_key_id") ? credentials_path : config_path) + ")";
    }
    s.sign = !detail::truthy(get("AWS_NO_SIGN_REQUEST"));
    if (!s.sign) s.credentials_source = "none: anonymous requests (AWS_NO_SIGN_REQUEST)";

    if (!get("AWS_REGION").empty())
        s.region = get("AWS_REGION");
    else if (!get("AWS_DEFAULT_REGION").empty())
        s.region = get("AWS_DEFAULT_REGION");
    else if (!setting("region").empty())
        s.region = setting("region");

    std::string endpoint = !get("AWS_ENDPOINT_URL_S3").empty() ? get("AWS_ENDPOINT_URL_S3")
                           : !get("AWS_ENDPOINT_URL").empty()  ? get("AWS_ENDPOINT_URL")
                                                               : setting("endpoint_url");
    if (!endpoint.empty()) {
        while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
        if (endpoint.rfind("http://", 0) != 0 && endpoint.rfind("https://", 0) != 0)
            throw config_error("AWS_ENDPOINT_URL", "'" + endpoint + "' (expected http://HOST[:PORT] or https://HOST[:PORT])");
        s.endpoint = endpoint;
        s.path_style = true;  // MinIO, SeaweedFS, Ceph: buckets are not host names there
    } else {
        s.endpoint = "https://s3." + s.region + ".amazonaws.com";
        s.path_style = false;
    }

    s.max_requests = static_cast<unsigned>(detail::positive_setting(env, "FEEDLINE_S3_MAX_REQUESTS", s.max_requests));
    if (const auto v = env("FEEDLINE_S3_MAX_REQUESTS"); v && !v->empty()) s.max_requests_set = true;
    s.retry.attempts = static_cast<unsigned>(detail::positive_setting(env, "FEEDLINE_S3_ATTEMPTS", s.retry.attempts));
    s.retry.retry_seconds = detail::positive_setting(env, "FEEDLINE_S3_RETRY_SECONDS", s.retry.retry_seconds);
    s.retry.first_backoff_seconds = detail::positive_setting(env, "FEEDLINE_S3_BACKOFF_SECONDS", s.retry.first_backoff_seconds);
    s.retry.max_backoff_seconds = std::max(s.retry.first_backoff_seconds, s.retry.max_backoff_seconds);
    s.retry.connect_timeout_seconds = detail::positive_setting(env, "FEEDLINE_S3_CONNECT_TIMEOUT_SECONDS", s.retry.connect_timeout_seconds);
    s.retry.stall_seconds = detail::positive_setting(env, "FEEDLINE_S3_STALL_SECONDS", s.retry.stall_seconds);

    // The cache lives beside the token-count cache (FEEDLINE_CACHE_DIR, XDG_CACHE_HOME, ~/.cache; "none":
    // no cache), in the process's environment.
    const std::string root = detail::cache_directory("");
    s.cache_directory = root.empty() ? "" : root + "/remote";
    s.cache_bytes = detail::byte_setting(env, "FEEDLINE_S3_CACHE_BYTES");
    if (const auto b = detail::byte_setting(env, "FEEDLINE_S3_CACHE_BLOCK_BYTES")) s.cache_block_bytes = *b;
    return s;
}

// The settings of this process's environment.
inline s3_settings s3_settings_from_environment() {
    return s3_settings_from([](const char* name) -> std::optional<std::string> {
        const char* v = std::getenv(name);
        if (v == nullptr) return std::nullopt;
        return std::string(v);
    });
}

}  // namespace feedline
