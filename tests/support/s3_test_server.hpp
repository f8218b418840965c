// The S3 server the s3:// tests talk to: SeaweedFS started once per test run by a ctest fixture
// (scripts/s3-test-server.sh, bound to 127.0.0.1) in $FEEDLINE_TEST_TMPDIR/s3-server. A test skips
// with the reason when there is none. Objects are put and removed with libcurl's own SigV4 signing,
// as any S3 client would, so the server's contents are made through its S3 API.
#pragma once

#include <curl/curl.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <feedline/remote/s3_location.hpp>
#include <feedline/remote/s3_scheme.hpp>

#include "test_support.hpp"

namespace feedline::test {

inline constexpr const char* s3_access_key = "feedline";
inline constexpr const char* s3_secret_key = "feedline-secret";

// Sets an environment variable while it lives (and restores what was there).
class scoped_env {
public:
    scoped_env(const char* name, const std::string& value) : name_(name) {
        if (const char* old = std::getenv(name)) old_ = old;
        ::setenv(name, value.c_str(), 1);
    }
    ~scoped_env() {
        if (old_)
            ::setenv(name_, old_->c_str(), 1);
        else
            ::unsetenv(name_);
    }
    scoped_env(const scoped_env&) = delete;
    scoped_env& operator=(const scoped_env&) = delete;

private:
    const char* name_;
    std::optional<std::string> old_;
};

// The endpoint of the run's server (http://127.0.0.1:PORT); skips the test when there is none.
inline std::string s3_endpoint() {
    const char* dir = std::getenv("FEEDLINE_TEST_TMPDIR");
    std::ifstream in(std::string(dir ? dir : "") + "/s3-server/endpoint");
    std::string endpoint;
    if (!dir || !std::getline(in, endpoint) || endpoint.empty())
        skip("no S3 test server (scripts/s3-test-server.sh needs SeaweedFS from scripts/install-deps.sh)");
    return endpoint;
}

// Points this process's AWS settings at the test server (or `through`, a proxy in front of it) with the
// right (or a given) secret, and makes feedline read them again.
inline std::string use_s3_server(const std::string& secret = s3_secret_key, const std::string& through = {}) {
    const std::string endpoint = through.empty() ? s3_endpoint() : through;
    ::setenv("AWS_ENDPOINT_URL", endpoint.c_str(), 1);
    ::setenv("AWS_ACCESS_KEY_ID", s3_access_key, 1);
    ::setenv("AWS_SECRET_ACCESS_KEY", secret.c_str(), 1);
    ::setenv("AWS_REGION", "us-east-1", 1);
    ::unsetenv("AWS_PROFILE");
    ::unsetenv("AWS_NO_SIGN_REQUEST");
    ::setenv("HOME", "/nonexistent", 1);  // no ~/.aws of the machine's
    s3_catalog::instance().reset();
    return endpoint;
}

// One signed request of the test's own (PUT a bucket or an object, DELETE one); throws unless 2xx.
inline void s3_request(const std::string& method, const std::string& path, const std::string& body = {}) {
    const std::string url = s3_endpoint() + "/" + path;
    CURL* e = curl_easy_init();
    if (e == nullptr) throw std::runtime_error("curl_easy_init failed");
    std::string response;
    curl_easy_setopt(e, CURLOPT_URL, url.c_str());
    curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method.c_str());
    curl_easy_setopt(e, CURLOPT_AWS_SIGV4, "aws:amz:us-east-1:s3");
    curl_easy_setopt(e, CURLOPT_USERNAME, s3_access_key);
    curl_easy_setopt(e, CURLOPT_PASSWORD, s3_secret_key);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TIMEOUT, 60L);
    struct upload {
        const std::string* body;
        std::size_t at = 0;
    } up{&body};
    if (method == "PUT") {  // an upload, as `curl -T` sends it (libcurl signs its payload so)
        curl_easy_setopt(e, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(e, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(body.size()));
        curl_easy_setopt(
            e, CURLOPT_READFUNCTION, +[](char* p, std::size_t s, std::size_t n, void* u) {
                auto& in = *static_cast<upload*>(u);
                const std::size_t k = std::min(s * n, in.body->size() - in.at);
                std::memcpy(p, in.body->data() + in.at, k);
                in.at += k;
                return k;
            });
        curl_easy_setopt(e, CURLOPT_READDATA, &up);
    }
    curl_easy_setopt(
        e, CURLOPT_WRITEFUNCTION, +[](char* p, std::size_t s, std::size_t n, void* u) {
            static_cast<std::string*>(u)->append(p, s * n);
            return s * n;
        });
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &response);
    const CURLcode rc = curl_easy_perform(e);
    long status = 0;
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(e);
    if (rc != CURLE_OK || status / 100 != 2)
        throw std::runtime_error(method + " " + url + ": " + (rc != CURLE_OK ? curl_easy_strerror(rc) : "HTTP " + std::to_string(status)) +
                                 " " + response);
}

// The tests' bucket, made on first use, and this process's own part of it: every key a test puts is
// under "<pid>/", so cases running at once never see each other's objects. (One bucket for the run:
// each bucket is a collection of volumes of its own to SeaweedFS, and a few dozen exhaust its slots.)
inline std::string s3_test_bucket() {
    static const std::string bucket = [] {
        try {
            s3_request("PUT", "feedline-tests");
        } catch (const std::runtime_error& e) {  // made by another case already
            if (std::string(e.what()).find("BucketAlready") == std::string::npos) throw;
        }
        return std::string("feedline-tests");
    }();
    return bucket;
}
inline std::string s3_test_prefix() { return std::to_string(::getpid()) + "/"; }

inline void s3_put(const std::string& key, const std::string& bytes);
// Uploads a local file as `key` (under this process's prefix) of the tests' bucket.
inline void s3_put_file(const std::string& local_path, const std::string& key) { s3_put(key, read_text(local_path)); }
// Puts `bytes` as `key` (under this process's prefix) of the tests' bucket.
inline void s3_put(const std::string& key, const std::string& bytes) {
    s3_request("PUT", s3_test_bucket() + "/" + detail::encode_key(s3_test_prefix() + key), bytes);
}
// The s3:// URL of `key` (under this process's prefix).
inline std::string s3_url(const std::string& key) { return "s3://" + s3_test_bucket() + "/" + s3_test_prefix() + key; }

}  // namespace feedline::test
