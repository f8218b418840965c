// feedline/remote/s3_location.hpp: what an s3:// URL names (a bucket and a key or key prefix), checked
// once, up front, with an error that says what is wrong with it; and the one way a key is spelled in a
// request path (percent-encoded as SigV4's canonical URI wants it, '/' kept). Needs no HTTP client:
// used by the S3 storage scheme (remote/s3_scheme.hpp) and by its tests.
#pragma once

#include <string>
#include <string_view>

#include <feedline/error.hpp>

namespace feedline {

inline constexpr std::string_view s3_url_prefix = "s3://";

inline bool is_s3_url(std::string_view location) noexcept { return location.substr(0, s3_url_prefix.size()) == s3_url_prefix; }

struct s3_location {
    std::string bucket;
    std::string key;  // may be empty (the bucket's root) or end in '/' (a "directory" prefix)

    std::string url() const { return std::string(s3_url_prefix) + bucket + "/" + key; }
    friend bool operator==(const s3_location&, const s3_location&) = default;
};

// Parses "s3://bucket/key". Throws config_error naming the URL when it has no bucket, a bucket name
// S3 refuses (3-63 characters of lowercase letters, digits, '.' and '-', starting and ending with a
// letter or digit), a key longer than S3's 1024 bytes, or characters no object key holds (control
// characters), so the mistake is reported before any request is made.
inline s3_location parse_s3_url(std::string_view url) {
    auto refuse = [&](const std::string& why) -> s3_location {
        throw config_error("dataset", "'" + std::string(url) + "' is not a usable s3:// URL: " + why);
    };
    if (!is_s3_url(url)) return refuse("it does not start with s3://");
    const std::string_view rest = url.substr(s3_url_prefix.size());
    const std::size_t slash = rest.find('/');
    s3_location out{std::string(rest.substr(0, slash)),
                    slash == std::string_view::npos ? std::string() : std::string(rest.substr(slash + 1))};
    const std::string& b = out.bucket;
    if (b.empty()) return refuse("no bucket (expected s3://BUCKET/KEY)");
    if (b.size() < 3 || b.size() > 63) return refuse("a bucket name has 3 to 63 characters, '" + b + "' has " + std::to_string(b.size()));
    auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };  // ASCII, whatever the locale
    for (const char c : b)
        if (!(alnum(c) || c == '.' || c == '-'))
            return refuse("bucket names hold lowercase letters, digits, '.' and '-' only ('" + b + "')");
    if (!alnum(b.front()) || !alnum(b.back())) return refuse("a bucket name starts and ends with a letter or digit ('" + b + "')");
    if (out.key.size() > 1024) return refuse("the key is longer than S3's 1024 bytes");
    for (const char c : out.key)
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return refuse("the key holds a control character");
    return out;
}

namespace detail {

// A key as it goes into a request path: every byte but RFC 3986's unreserved characters and '/'
// percent-encoded (upper-case hex), which is the canonical URI SigV4 signs for S3; a key with '&', '+'
// or a space then signs the same on both sides.
inline std::string encode_key(std::string_view key, bool keep_slash = true) {
    static constexpr char hex[] = "0123456789ABCDEF";
    std::string out;
    out.reserve(key.size());
    for (const char ch : key) {
        const auto c = static_cast<unsigned char>(ch);
        const bool alnum = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');  // not the locale's
        if (alnum || c == '-' || c == '.' || c == '_' || c == '~' || (keep_slash && c == '/')) {
            out += ch;
        } else {
            out += '%';
            out += hex[c >> 4];
            out += hex[c & 15];
        }
    }
    return out;
}

}  // namespace detail
}  // namespace feedline
