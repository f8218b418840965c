// feedline/remote/s3_client.hpp: S3's four requests feedline makes (HEAD an object, GET byte ranges of
// it pinned to its ETag, list a prefix with ListObjectsV2), over libcurl, which signs them with SigV4
// (CURLOPT_AWS_SIGV4: no hand-written crypto) and keeps connections alive. A batch of requests runs
// concurrently on the calling thread's curl multi handle (a worker asks for all of its batch's windows
// at once), each retried on its own after a capped, jittered backoff when the failure may pass, and
// the batch fails as a whole with an io_error naming the URL, range, attempts and last status when one
// cannot succeed. Nothing waits unboundedly: connections time out, stalled bodies are dropped, retries
// stop after their attempts or seconds, and the waiting thread's io_cancel ends a wait within 100 ms.
// Fed by the S3 storage scheme (remote/s3_scheme.hpp).
#pragma once

#include <curl/curl.h>

#include <pugixml.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <feedline/error.hpp>
#include <feedline/remote/s3_location.hpp>
#include <feedline/remote/s3_settings.hpp>
#include <feedline/storage/remote_counters.hpp>

namespace feedline {

// An object as S3 describes it (HEAD, or a listing's entry).
struct s3_object_info {
    std::string key;
    std::uint64_t size = 0;
    std::string etag;  // with its quotes, as S3 sends it: what If-Match takes back
};

struct s3_listing {
    std::vector<s3_object_info> objects;  // sorted by key (S3 lists in UTF-8 binary order)
    std::vector<std::string> prefixes;    // "subdirectories" (with a delimiter), sorted
};

namespace detail {

inline void curl_global_once() {
    static const CURLcode rc = curl_global_init(CURL_GLOBAL_DEFAULT);
    if (rc != CURLE_OK) throw io_error("libcurl", EIO, std::string("curl_global_init failed: ") + curl_easy_strerror(rc));
}

// The <Code> and <Message> of an S3 error body; empty when the body is not one.
inline std::pair<std::string, std::string> s3_error_of(const std::string& body) {
    pugi::xml_document doc;
    if (body.empty() || !doc.load_buffer(body.data(), body.size())) return {};
    const pugi::xml_node e = doc.child("Error");
    return {e.child_value("Code"), e.child_value("Message")};
}

// One HTTP request of a batch, and what came back.
struct s3_request {
    // Asked
    std::string url;          // the request URL (query included)
    std::string object;       // the s3:// URL errors name
    bool head = false;        // HEAD (no body)
    bool missing_ok = false;  // a 404 is an answer (status() says so), not an error
    std::string if_match;     // the pinned ETag, or ""
    bool ranged = false;      // GET of [offset, offset + length) into dest
    std::uint64_t offset = 0, length = 0;
    std::byte* dest = nullptr;
    std::size_t max_body = 1 << 20;  // other bodies (a listing page, an error) are kept up to this

    // Answered (the last response of the last attempt)
    long status = 0;
    std::string etag;
    std::optional<std::uint64_t> content_length;
    std::optional<std::uint64_t> range_start;
    std::uint64_t received = 0;  // ranged: bytes written to dest
    std::string body;
    std::string refused;   // why the body was refused while it arrived ("" when it was not)
    bool stalled = false;  // dropped: nothing arrived for stall_seconds

    // Retries
    unsigned attempts = 0;
    std::chrono::steady_clock::time_point first_try{}, next_try{};
    std::string last_failure;

    std::string range_text() const {
        return ranged ? " bytes " + std::to_string(offset) + "-" + std::to_string(offset + length - 1) : std::string();
    }
    void reset_response() {
        status = 0;
        etag.clear();
        content_length.reset();
        range_start.reset();
        received = 0;
        body.clear();
        refused.clear();
        stalled = false;
    }
};

inline bool header_is(std::string_view line, std::string_view name) {
    if (line.size() <= name.size() || line[name.size()] != ':') return false;
    for (std::size_t i = 0; i < name.size(); ++i)
        if (std::tolower(static_cast<unsigned char>(line[i])) != name[i]) return false;
    return true;
}

inline std::string_view header_value(std::string_view line, std::size_t name_size) {
    std::string_view v = line.substr(name_size + 1);
    while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
    while (!v.empty() && (v.back() == '\r' || v.back() == '\n' || v.back() == ' ')) v.remove_suffix(1);
    return v;
}

inline std::optional<std::uint64_t> parse_u64(std::string_view s) {
    if (s.empty() || s.size() > 19) return std::nullopt;
    std::uint64_t v = 0;
    for (const char c : s) {
        if (c < '0' || c > '9') return std::nullopt;
        v = v * 10 + static_cast<std::uint64_t>(c - '0');
    }
    return v;
}

// Every header line of every response (a 100 Continue, then the real one): a status line starts a new
// response, so only the last one's fields are kept.
inline std::size_t on_s3_header(char* data, std::size_t size, std::size_t count, void* user) {
    auto& r = *static_cast<s3_request*>(user);
    const std::string_view line(data, size * count);
    if (line.substr(0, 5) == "HTTP/") {
        r.reset_response();
        const std::size_t space = line.find(' ');
        if (space != std::string_view::npos) r.status = static_cast<long>(parse_u64(line.substr(space + 1, 3)).value_or(0));
    } else if (header_is(line, "etag")) {
        r.etag = std::string(header_value(line, 4));
    } else if (header_is(line, "content-length")) {
        r.content_length = parse_u64(header_value(line, 14));
    } else if (header_is(line, "content-range")) {
        const std::string_view v = header_value(line, 13);  // "bytes 10-19/100000"
        if (v.substr(0, 6) == "bytes ") r.range_start = parse_u64(v.substr(6, v.find('-') - 6));
    }
    return size * count;
}

// A body: a ranged GET's bytes go straight into its buffer, checked to be the range asked for; any
// other body (a listing, an error) is kept up to max_body. Returning short aborts the transfer.
inline std::size_t on_s3_body(char* data, std::size_t size, std::size_t count, void* user) {
    auto& r = *static_cast<s3_request*>(user);
    const std::size_t n = size * count;
    if (r.ranged && r.status / 100 == 2) {
        if (r.status == 206 && r.range_start != r.offset) {
            r.refused = "the server answered with another range (Content-Range starts at " +
                        (r.range_start ? std::to_string(*r.range_start) : std::string("nothing")) + ")";
            return 0;
        }
        if (r.status == 200 && r.offset != 0) {
            r.refused = "the server ignored the Range header (HTTP 200 with the whole object)";
            return 0;
        }
        if (n > r.length - r.received) {
            if (r.status == 200) {  // a whole object from a server that ignores Range: only the range's bytes
                std::memcpy(r.dest + r.received, data, r.length - r.received);
                r.received = r.length;
                return 0;  // enough: ended here, judged complete (received == length)
            }
            r.refused = "the body is longer than the range asked for";
            return 0;
        }
        std::memcpy(r.dest + r.received, data, n);
        r.received += n;
        return n;
    }
    if (r.body.size() + n > r.max_body) {
        r.refused = "the body is longer than " + std::to_string(r.max_body) + " bytes";
        return 0;
    }
    r.body.append(data, n);
    return n;
}

// The calling thread's multi handle and easy handles: connections stay open between batches of the
// same thread (keep-alive), and no lock is shared with other threads.
class curl_handles {
public:
    curl_handles() {
        curl_global_once();
        multi_ = curl_multi_init();
        if (multi_ == nullptr) throw resource_error("libcurl could not make a multi handle (out of memory?)");
    }
    ~curl_handles() {
        for (CURL* e : idle_) curl_easy_cleanup(e);
        curl_multi_cleanup(multi_);
    }
    curl_handles(const curl_handles&) = delete;
    curl_handles& operator=(const curl_handles&) = delete;

    CURLM* multi() const noexcept { return multi_; }
    CURL* take() {
        if (idle_.empty()) {
            CURL* e = curl_easy_init();
            if (e == nullptr) throw resource_error("libcurl could not make a handle (out of memory?)");
            return e;
        }
        CURL* e = idle_.back();
        idle_.pop_back();
        curl_easy_reset(e);  // options cleared; live connections and the DNS cache kept
        return e;
    }
    void give_back(CURL* e) noexcept {
        try {
            idle_.push_back(e);
        } catch (...) {
            curl_easy_cleanup(e);
        }
    }

    static curl_handles& of_this_thread() {
        thread_local curl_handles h;
        return h;
    }

private:
    CURLM* multi_ = nullptr;
    std::vector<CURL*> idle_;
};

// What to do about a finished attempt.
enum class s3_outcome { done, retry, fail };

// Judges an attempt: done, worth retrying (why in last_failure), or failed for good (why in
// last_failure, errno in `err`).
inline s3_outcome judge_s3_attempt(s3_request& r, CURLcode rc, const char* curl_message, const s3_settings& s, int& err) {
    const bool ended_early = rc == CURLE_WRITE_ERROR && r.refused.empty() && r.ranged && r.received == r.length;
    if (rc == CURLE_ABORTED_BY_CALLBACK && r.stalled) {
        err = ETIMEDOUT;
        r.last_failure =
            "Timeout: nothing arrived for " + std::to_string(static_cast<int>(s.retry.stall_seconds)) + " s (a stalled connection)";
        return s3_outcome::retry;
    }
    if (!r.refused.empty()) {
        err = EPROTO;
        r.last_failure = r.refused;
        return s3_outcome::fail;
    }
    if (rc != CURLE_OK && !ended_early) {
        r.last_failure = std::string(curl_easy_strerror(rc)) + (curl_message && *curl_message ? std::string(": ") + curl_message : "");
        err = rc == CURLE_OPERATION_TIMEDOUT ? ETIMEDOUT : rc == CURLE_COULDNT_CONNECT ? ECONNREFUSED : EIO;
        switch (rc) {
            case CURLE_OPERATION_TIMEDOUT:
            case CURLE_COULDNT_CONNECT:
            case CURLE_COULDNT_RESOLVE_HOST:
            case CURLE_RECV_ERROR:
            case CURLE_SEND_ERROR:
            case CURLE_GOT_NOTHING:
            case CURLE_PARTIAL_FILE:
            case CURLE_SSL_CONNECT_ERROR:
            case CURLE_HTTP2:
            case CURLE_HTTP2_STREAM: return s3_outcome::retry;
            default: return s3_outcome::fail;
        }
    }
    const long st = r.status;
    if (st / 100 == 2) {
        if (r.ranged && r.received != r.length) {
            r.last_failure = "the body was cut short (" + std::to_string(r.received) + " of " + std::to_string(r.length) + " bytes)";
            return s3_outcome::retry;
        }
        if (!r.if_match.empty() && !r.etag.empty() && r.etag != r.if_match) {  // a server that ignores If-Match
            err = ESTALE;
            r.last_failure = "the object was replaced since it was opened (ETag " + r.if_match + ", now " + r.etag + ")";
            return s3_outcome::fail;
        }
        return s3_outcome::done;
    }
    if (st == 404 && r.missing_ok) return s3_outcome::done;
    const auto [code, message] = s3_error_of(r.body);
    const std::string what =
        "HTTP " + std::to_string(st) + (code.empty() ? "" : " " + code) + (message.empty() ? std::string() : ": " + message);
    if (st == 412) {
        err = ESTALE;
        r.last_failure = "the object was replaced since it was opened (its ETag is no longer " + r.if_match +
                         "; restart the job to read the new object, or restore the old one)";
        return s3_outcome::fail;
    }
    if (st == 429 || st == 500 || st == 502 || st == 503 || st == 504 || code == "SlowDown" || code == "RequestTimeout" ||
        code == "InternalError") {
        r.last_failure = what;
        return s3_outcome::retry;
    }
    r.last_failure = what;
    if (st == 404) {
        err = ENOENT;
        if (code.empty()) r.last_failure += " (no such object)";
    } else if (st == 403 || st == 401) {
        err = EACCES;
        r.last_failure += " (credentials: " + (s.credentials_source.empty() ? std::string("none found") : s.credentials_source) +
                          "; endpoint " + s.endpoint + ", region " + s.region + ")";
    } else {
        err = EIO;
    }
    return s3_outcome::fail;
}

// Runs every request, at most `max_in_flight` at once, on this thread's handles. Returns when all are
// done; throws io_error for the first that fails for good (after the others were stopped: no buffer is
// written after this returns or throws).
inline void run_s3_requests(std::span<s3_request> requests, const s3_settings& s, unsigned max_in_flight) {
    using clock = std::chrono::steady_clock;
    curl_handles& handles = curl_handles::of_this_thread();
    CURLM* multi = handles.multi();
    struct running {
        CURL* easy = nullptr;
        curl_slist* headers = nullptr;
        s3_request* request = nullptr;
        clock::time_point started;
        char error[CURL_ERROR_SIZE] = {};
        // Stall detection: when the bytes received last changed (libcurl's progress callback, about
        // once a second). libcurl's own low-speed limit averages over seconds of history, so a burst
        // then silence would be noticed only seconds late.
        curl_off_t seen = -1;
        clock::time_point progressed;
        std::chrono::duration<double> stall{};
    };
    std::vector<std::unique_ptr<running>> active;
    std::vector<s3_request*> waiting;
    for (auto& r : requests) waiting.push_back(&r);
    thread_local std::minstd_rand jitter(static_cast<unsigned>(clock::now().time_since_epoch().count()));

    auto finish = [&](running& a) noexcept {
        curl_multi_remove_handle(multi, a.easy);
        curl_slist_free_all(a.headers);
        handles.give_back(a.easy);
    };
    struct stop_all {
        std::vector<std::unique_ptr<running>>& active;
        decltype(finish)& f;
        ~stop_all() {
            for (auto& a : active) f(*a);
        }
    } guard{active, finish};

    auto start = [&](s3_request& r) {
        auto a = std::make_unique<running>();
        a->request = &r;
        a->easy = handles.take();
        CURL* e = a->easy;
        r.reset_response();
        if (r.attempts == 0) r.first_try = clock::now();
        ++r.attempts;
        curl_easy_setopt(e, CURLOPT_URL, r.url.c_str());
        curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
        curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
        curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(s.retry.connect_timeout_seconds * 1000));
        a->stall = std::chrono::duration<double>(s.retry.stall_seconds);
        a->progressed = clock::now();
        curl_easy_setopt(e, CURLOPT_NOPROGRESS, 0L);
        curl_easy_setopt(e, CURLOPT_XFERINFODATA, a.get());
        curl_easy_setopt(
            e, CURLOPT_XFERINFOFUNCTION, +[](void* user, curl_off_t, curl_off_t now_down, curl_off_t, curl_off_t) -> int {
                auto& x = *static_cast<running*>(user);
                const auto now = clock::now();
                if (now_down != x.seen) {
                    x.seen = now_down;
                    x.progressed = now;
                    return 0;
                }
                if (now - x.progressed < x.stall) return 0;
                x.request->stalled = true;
                return 1;  // aborts the transfer: CURLE_ABORTED_BY_CALLBACK
            });
        curl_easy_setopt(e, CURLOPT_ERRORBUFFER, a->error);
        curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, &on_s3_header);
        curl_easy_setopt(e, CURLOPT_HEADERDATA, &r);
        curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, &on_s3_body);
        curl_easy_setopt(e, CURLOPT_WRITEDATA, &r);
        curl_easy_setopt(e, CURLOPT_PRIVATE, a.get());
        if (r.head) curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
        if (s.sign && !s.access_key.empty()) {
            curl_easy_setopt(e, CURLOPT_AWS_SIGV4, s.sigv4().c_str());  // copied by libcurl
            curl_easy_setopt(e, CURLOPT_USERNAME, s.access_key.c_str());
            curl_easy_setopt(e, CURLOPT_PASSWORD, s.secret_key.c_str());
            if (!s.session_token.empty()) a->headers = curl_slist_append(a->headers, ("x-amz-security-token: " + s.session_token).c_str());
        }
        if (r.ranged)
            a->headers = curl_slist_append(
                a->headers, ("Range: bytes=" + std::to_string(r.offset) + "-" + std::to_string(r.offset + r.length - 1)).c_str());
        if (!r.if_match.empty()) a->headers = curl_slist_append(a->headers, ("If-Match: " + r.if_match).c_str());
        if (a->headers != nullptr) curl_easy_setopt(e, CURLOPT_HTTPHEADER, a->headers);
        a->started = clock::now();
        if (const CURLMcode mc = curl_multi_add_handle(multi, e); mc != CURLM_OK) {
            curl_slist_free_all(a->headers);
            handles.give_back(e);
            throw io_error(r.object, EIO, std::string("libcurl refused a request: ") + curl_multi_strerror(mc));
        }
        active.push_back(std::move(a));
    };

    auto fail = [&](s3_request& r, int err) {
        remote_counters::instance().failed();
        throw io_error(r.object, err,
                       "S3 " + std::string(r.head ? "HEAD" : "GET") + r.range_text() + " failed after " + std::to_string(r.attempts) +
                           " attempt" + (r.attempts == 1 ? "" : "s") + ": " + r.last_failure,
                       r.ranged ? std::optional<std::uint64_t>(r.offset) : std::nullopt);
    };

    std::size_t done = 0;
    while (done < requests.size()) {
        const auto now = clock::now();
        // Start what may start (retries once their backoff passed), up to the cap.
        for (auto it = waiting.begin(); it != waiting.end() && active.size() < max_in_flight;) {
            if ((*it)->next_try <= now) {
                start(**it);
                it = waiting.erase(it);
            } else {
                ++it;
            }
        }
        int still_running = 0;
        if (const CURLMcode mc = curl_multi_perform(multi, &still_running); mc != CURLM_OK)
            throw io_error(requests[0].object, EIO, std::string("libcurl failed: ") + curl_multi_strerror(mc));
        int left = 0;
        while (CURLMsg* m = curl_multi_info_read(multi, &left)) {
            if (m->msg != CURLMSG_DONE) continue;
            running* a = nullptr;
            curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, reinterpret_cast<char**>(&a));
            const CURLcode rc = m->data.result;
            s3_request& r = *a->request;
            int err = EIO;
            const s3_outcome outcome = judge_s3_attempt(r, rc, a->error, s, err);
            const auto ended = clock::now();
            if (rc == CURLE_OK || r.status != 0)
                remote_counters::instance().answered(
                    r.ranged ? r.received : r.body.size(),
                    static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(ended - a->started).count()));
            auto at = std::find_if(active.begin(), active.end(), [&](const auto& x) { return x.get() == a; });
            finish(*a);
            active.erase(at);  // `a` is gone from here on
            if (outcome == s3_outcome::done) {
                ++done;
                continue;
            }
            if (outcome == s3_outcome::fail) fail(r, err);
            // Retry: full jitter over a capped exponential backoff, within the attempts and the seconds.
            const double cap =
                std::min(s.retry.max_backoff_seconds, s.retry.first_backoff_seconds * double(1u << std::min(r.attempts - 1, 20u)));
            const double wait = std::uniform_real_distribution<double>(0, cap)(jitter);
            const double spent = std::chrono::duration<double>(ended - r.first_try).count();
            if (r.attempts >= s.retry.attempts || spent + wait > s.retry.retry_seconds) {
                char took[32];
                std::snprintf(took, sizeof took, "%.1f", spent);
                r.last_failure += std::string(" (giving up after ") + took + " s)";
                fail(r, err);
            }
            remote_counters::instance().retried();
            r.next_try = ended + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(wait));
            waiting.push_back(&r);
        }
        if (done == requests.size()) break;
        if (io_cancel && io_cancel())
            throw io_error(requests[0].object, ECANCELED, "the read was abandoned: the pipeline that waited for it stopped");
        // Sleep until a socket is ready, the next retry is due, or 100 ms (to look at io_cancel).
        auto wake = clock::now() + std::chrono::milliseconds(100);
        for (const s3_request* w : waiting) wake = std::min(wake, w->next_try);
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(wake - clock::now()).count();
        if (ms > 0 || !active.empty()) curl_multi_poll(multi, nullptr, 0, static_cast<int>(std::clamp<long long>(ms, 0, 100)), nullptr);
    }
}

}  // namespace detail

// The S3 requests of one endpoint and set of credentials. Thread-safe: each call runs on the calling
// thread's own handles.
class s3_client {
public:
    explicit s3_client(s3_settings settings) : s_(std::move(settings)) {
        if (s_.sign && s_.access_key.empty())
            throw config_error("AWS_ACCESS_KEY_ID",
                               "no AWS credentials found (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE, ~/.aws/credentials); "
                               "for a public bucket set AWS_NO_SIGN_REQUEST=true (the tools' --no-sign)");
    }
    const s3_settings& settings() const noexcept { return s_; }

    // The object's size and ETag; nullopt when there is none. Throws io_error for anything else (no
    // bucket, access denied, retries exhausted).
    std::optional<s3_object_info> head(const s3_location& where) const {
        std::vector<detail::s3_request> one(1);
        auto& r = one[0];
        r.url = s_.object_url(where);
        r.object = where.url();
        r.head = true;
        r.missing_ok = true;
        detail::run_s3_requests(one, s_, 1);
        if (r.status == 404) return std::nullopt;
        if (!r.content_length) throw io_error(r.object, EPROTO, "S3 HEAD answered without a Content-Length");
        return s3_object_info{where.key, *r.content_length, r.etag};
    }

    // Every object under `prefix` (one level when `delimiter` is '/', then sub-prefixes are listed
    // apart), following continuation tokens. Throws io_error naming the bucket (no such bucket, access
    // denied) or a malformed page.
    s3_listing list(const std::string& bucket, const std::string& prefix, bool one_level) const {
        s3_listing out;
        std::string token;
        const std::string where = std::string(s3_url_prefix) + bucket + "/" + prefix;
        for (int page = 0;; ++page) {
            // Parameters sorted by name, values encoded: the canonical query SigV4 signs (libcurl signs
            // the query as it is given).
            std::string query;
            if (!token.empty()) query += "continuation-token=" + detail::encode_key(token, false) + "&";
            if (one_level) query += "delimiter=%2F&";
            query += "list-type=2&prefix=" + detail::encode_key(prefix, false);
            std::vector<detail::s3_request> one(1);
            auto& r = one[0];
            r.url = s_.object_url({bucket, ""}) + "?" + query;
            r.object = where;
            r.max_body = 64 << 20;
            detail::run_s3_requests(one, s_, 1);
            pugi::xml_document doc;
            if (!doc.load_buffer(r.body.data(), r.body.size()) || !doc.child("ListBucketResult"))
                throw io_error(where, EPROTO,
                               "S3 ListObjectsV2 answered something that is not a listing (page " + std::to_string(page + 1) + ")");
            const pugi::xml_node result = doc.child("ListBucketResult");
            for (const pugi::xml_node c : result.children("Contents")) {
                const auto size = detail::parse_u64(c.child_value("Size"));
                if (!size) throw io_error(where, EPROTO, "S3 listed '" + std::string(c.child_value("Key")) + "' without a size");
                out.objects.push_back({c.child_value("Key"), *size, c.child_value("ETag")});
            }
            for (const pugi::xml_node p : result.children("CommonPrefixes")) out.prefixes.emplace_back(p.child_value("Prefix"));
            if (std::string_view(result.child_value("IsTruncated")) != "true") break;
            token = result.child_value("NextContinuationToken");
            if (token.empty()) throw io_error(where, EPROTO, "S3 said the listing goes on but gave no continuation token");
        }
        std::sort(out.objects.begin(), out.objects.end(), [](const auto& a, const auto& b) { return a.key < b.key; });
        std::sort(out.prefixes.begin(), out.prefixes.end());
        return out;
    }

    // Ranges of objects, each into its buffer, all at once (up to max_requests in flight), every one
    // pinned to its object's ETag. Throws io_error naming the object, range and attempts.
    struct range {
        const s3_location* where;
        const std::string* etag;
        std::uint64_t offset, length;
        std::byte* dest;
    };
    void get(std::span<const range> ranges) const {
        std::vector<detail::s3_request> requests(ranges.size());
        for (std::size_t i = 0; i < ranges.size(); ++i) {
            auto& r = requests[i];
            r.url = s_.object_url(*ranges[i].where);
            r.object = ranges[i].where->url();
            r.if_match = *ranges[i].etag;
            r.ranged = true;
            r.offset = ranges[i].offset;
            r.length = ranges[i].length;
            r.dest = ranges[i].dest;
        }
        const unsigned in_flight = s_.max_requests_set ? s_.max_requests : std::max(s_.max_requests, detail::remote_requests_in_flight);
        detail::run_s3_requests(requests, s_, in_flight);
    }

private:
    s3_settings s_;
};

}  // namespace feedline
