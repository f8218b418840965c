// feedline/remote/s3_scheme.hpp: s3:// locations as a storage scheme (storage/storage_scheme.hpp), so
// every form a local path has works on a bucket: a Megatron prefix, llm.c shards by glob, a "directory"
// prefix, JSONL/text objects, and blends of local and remote data. A process-wide catalog lists each
// prefix once (ListObjectsV2, paginated) and answers later questions about the objects it covers from
// that listing, so 300 shards cost one listing, not 300 HEADs. An object is opened with the size and
// ETag it had then (s3_object), and every range read of it is pinned to that ETag (If-Match): an
// object replaced under a running job is an io_error naming it, never a mix of two versions. Without
// libcurl in the build, s3:// is refused with the reason. Registered by its #include in
// storage/schemes.hpp.
#pragma once

#include <fnmatch.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <feedline/error.hpp>
#include <feedline/remote/s3_location.hpp>
#include <feedline/storage/byte_source.hpp>
#include <feedline/storage/read_request.hpp>
#include <feedline/storage/storage_scheme.hpp>

#if FEEDLINE_HAS_REMOTE
#include <sys/statvfs.h>

#include <set>
#include <unordered_map>

#include <feedline/remote/block_cache.hpp>
#include <feedline/remote/s3_client.hpp>
#include <feedline/remote/s3_settings.hpp>
#endif

namespace feedline {

#if FEEDLINE_HAS_REMOTE

// What this process knows of its buckets: the settings and client (read from the environment at first
// use), the listings made, and the objects looked up. Thread-safe.
class s3_catalog {
public:
    static s3_catalog& instance() {
        static s3_catalog c;
        return c;
    }

    // The client, made from the environment at first use. Throws config_error (no credentials, a bad
    // setting). Shared: objects keep theirs, and a request in flight its own, through a reset().
    std::shared_ptr<const s3_client> client() {
        std::lock_guard lock(mutex_);
        if (!client_) client_ = std::make_shared<const s3_client>(s3_settings_from_environment());
        return client_;
    }

    // The object's size and ETag (from a listing that covers it, else a HEAD, remembered), or nullopt.
    std::optional<s3_object_info> find(const s3_location& where) {
        {
            std::lock_guard lock(mutex_);
            if (auto it = objects_.find(where.url()); it != objects_.end()) return it->second;
            for (const auto& l : listings_)
                if (l.covers(where)) {
                    const auto found = std::lower_bound(l.result.objects.begin(), l.result.objects.end(), where.key,
                                                        [](const s3_object_info& o, const std::string& k) { return o.key < k; });
                    if (found != l.result.objects.end() && found->key == where.key) return *found;
                    return std::nullopt;
                }
        }
        auto info = client()->head(where);  // no lock held across a request
        std::lock_guard lock(mutex_);
        objects_.emplace(where.url(), info);
        return info;
    }

    // A listing of `prefix` (one level: sub-prefixes apart), made once per process.
    s3_listing list(const std::string& bucket, const std::string& prefix, bool one_level) {
        {
            std::lock_guard lock(mutex_);
            for (const auto& l : listings_)
                if (l.bucket == bucket && l.prefix == prefix && l.one_level == one_level) return l.result;
        }
        s3_listing result = client()->list(bucket, prefix, one_level);
        std::lock_guard lock(mutex_);
        listings_.push_back({bucket, prefix, one_level, result});
        return result;
    }

    // Forgets the listings, lookups, client and cache: the next use reads the environment again
    // (rotated credentials; tests that change it). Objects already open, and reads in flight, keep the
    // client and cache they hold (shared), so a reset beside a running pipeline frees nothing under it.
    void reset() {
        std::lock_guard lock(mutex_);
        client_.reset();
        listings_.clear();
        objects_.clear();
        cache_.reset();
        cache_tried_ = false;
        opened_.clear();
        opened_bytes_ = 0;
    }

    // Notes an object opened for reading (its bytes count towards what the cache must hold).
    void opened(const std::string& url, std::uint64_t size) {
        std::lock_guard lock(mutex_);
        if (opened_.insert(url).second) opened_bytes_ += size;
    }

    // The block cache reads go through, or nullptr: none configured (FEEDLINE_S3_CACHE_BYTES=0,
    // FEEDLINE_CACHE_DIR=none), its directory unusable (why: cache_state()), or more data opened than
    // it holds. A dataset larger than the cache is read range by range: in a shuffled epoch its blocks
    // would be evicted before they were read again, and fetching whole blocks would multiply the bytes.
    std::shared_ptr<block_cache> cache_for_reads() {
        std::lock_guard lock(mutex_);
        if (!cache_tried_) make_cache();
        return cache_ && opened_bytes_ <= cache_->budget_bytes() ? cache_ : nullptr;
    }
    // One line: where the cache is and its budget, or why there is none.
    std::string cache_state() {
        std::lock_guard lock(mutex_);
        if (!cache_tried_) make_cache();
        return cache_state_;
    }

    // How many listings this process made (one per distinct prefix), for tests and stats.
    std::size_t listings() const {
        std::lock_guard lock(mutex_);
        return listings_.size();
    }

private:
    struct listing {
        std::string bucket, prefix;
        bool one_level;
        s3_listing result;
        bool covers(const s3_location& w) const {
            if (w.bucket != bucket || w.key.compare(0, prefix.size(), prefix) != 0) return false;
            return !one_level || w.key.find('/', prefix.size()) == std::string::npos;
        }
    };
    // With mutex_ held.
    void make_cache() {
        cache_tried_ = true;
        const s3_settings s = client_ ? client_->settings() : s3_settings_from_environment();
        if (s.cache_directory.empty()) {
            cache_state_ = "no cache: FEEDLINE_CACHE_DIR is none, or no home directory";
            return;
        }
        std::uint64_t budget = 0;
        if (s.cache_bytes) {
            budget = *s.cache_bytes;
        } else {  // a tenth of the free space where it lives, at most 32 GiB
            std::error_code ec;
            std::filesystem::create_directories(s.cache_directory, ec);
            struct statvfs v {};
            if (::statvfs(s.cache_directory.c_str(), &v) == 0)
                budget = std::min<std::uint64_t>(std::uint64_t(32) << 30, std::uint64_t(v.f_bavail) * v.f_frsize / 10);
        }
        if (budget == 0) {
            cache_state_ = "no cache: FEEDLINE_S3_CACHE_BYTES is 0 (or no free space at " + s.cache_directory + ")";
            return;
        }
        try {
            cache_ = std::make_unique<block_cache>(
                block_cache::options{.directory = s.cache_directory, .budget_bytes = budget, .block_bytes = s.cache_block_bytes});
            cache_state_ = s.cache_directory + ": " + std::to_string(budget >> 20) + " MiB in blocks of " +
                           std::to_string(s.cache_block_bytes >> 10) + " KiB";
        } catch (const error& e) {
            cache_state_ = std::string("no cache: ") + e.what();
        }
    }

    mutable std::mutex mutex_;
    std::shared_ptr<const s3_client> client_;
    std::shared_ptr<block_cache> cache_;
    bool cache_tried_ = false;
    std::string cache_state_;
    std::set<std::string> opened_;
    std::uint64_t opened_bytes_ = 0;
    std::vector<listing> listings_;
    std::map<std::string, std::optional<s3_object_info>> objects_;
};

// One object, as it was when opened: its size and ETag are fixed, and every read asks for that ETag.
class s3_object final : public byte_source {
public:
    s3_object(s3_location where, s3_object_info info, std::shared_ptr<const s3_client> client, s3_catalog& catalog)
            : where_(std::move(where)),
              url_(where_.url()),
              info_(std::move(info)),
              client_(std::move(client)),
              catalog_(&catalog),
              // Its blocks in the cache: named by everything that tells its bytes apart.
              cache_id_(detail::identity_hash(client_->settings().endpoint + "\n" + where_.bucket + "\n" + where_.key + "\n" + info_.etag +
                                              "\n" + std::to_string(client_->settings().cache_block_bytes))) {
        catalog.opened(url_, info_.size);
    }

    const std::string& name() const noexcept override { return url_; }
    std::uint64_t size() const noexcept override { return info_.size; }
    std::string version() const override { return info_.etag; }
    const s3_location& location() const noexcept { return where_; }

    void read_at(void* dest, std::uint64_t length, std::uint64_t offset) const override {
        const read_request one{this, offset, length, static_cast<std::byte*>(dest)};
        read_batch(std::span<const read_request>(&one, 1));
    }

    // Objects of one client read a batch together.
    const void* batch_key() const noexcept override { return client_.get(); }

    // Every request at once, through the local block cache when the data fits in it (blocks found
    // there are copied from their mappings; the missing ones are fetched whole, kept, and copied
    // from), else straight from the store.
    void read_batch(std::span<const read_request> requests) const override {
        check_ranges(requests);
        if (const auto cache = detail::remote_cache_bypass ? nullptr : catalog_->cache_for_reads())
            read_through_cache(*cache, requests);
        else
            fetch(requests);
    }

    // The range's blocks are in the local block cache: the fetch ahead leaves it to the worker.
    bool at_hand(std::uint64_t offset, std::uint64_t length) const override {
        const auto cache = detail::remote_cache_bypass ? nullptr : catalog_->cache_for_reads();
        if (cache == nullptr || length == 0 || offset > size() || length > size() - offset) return false;
        if (thread_blocks().size() > 8192) thread_blocks().clear();  // no pointer into it is held here
        const std::uint64_t block = cache->block_bytes();
        for (std::uint64_t b = offset / block; b <= (offset + length - 1) / block; ++b)
            if (local_block(*cache, b) == nullptr) return false;
        return true;
    }

    // Ranges that lie within one block of the local cache: views into its mapping (no copy).
    void cached_views(std::span<const read_request> requests, std::span<std::span<const std::byte>> views) const override {
        const auto cache = detail::remote_cache_bypass ? nullptr : catalog_->cache_for_reads();
        if (thread_blocks().size() > 8192) thread_blocks().clear();  // bounded: the views of earlier calls are not used again
        std::uint64_t hits = 0;
        for (std::size_t i = 0; i < requests.size(); ++i) {
            const read_request& r = requests[i];
            const auto* o = static_cast<const s3_object*>(r.source);
            views[i] = {};
            if (cache == nullptr || r.length == 0 || r.offset > o->size() || r.length > o->size() - r.offset) continue;
            const std::uint64_t block = cache->block_bytes(), b = r.offset / block;
            if ((r.offset + r.length - 1) / block != b) continue;  // across two blocks: read (rare for a window)
            if (const cached_block* local = o->local_block(*cache, b)) {
                views[i] = local->bytes.subspan(r.offset - b * block, r.length);
                ++hits;
            }
        }
        if (hits) detail::remote_counters::instance().cached(hits, 0);
    }

private:
    // This thread's table of the blocks it has read: no lock, no reference count touched per window
    // (blocks are immutable, named by content).
    using block_table = std::unordered_map<block_cache::block_key, cached_block, block_cache::block_key_hash>;
    static block_table& thread_blocks() {
        thread_local block_table mine;
        return mine;
    }
    // Block `b` from this thread's table, else the cache (then kept in the table); nullptr: not cached.
    const cached_block* local_block(block_cache& cache, std::uint64_t b) const {
        block_table& mine = thread_blocks();
        const block_cache::block_key k = block_cache::key_of(cache_id_, b);
        if (auto it = mine.find(k); it != mine.end()) return &it->second;
        const std::uint64_t length = std::min(cache.block_bytes(), size() - b * cache.block_bytes());
        if (auto hit = cache.find(cache_id_, b, length)) return &mine.emplace(k, std::move(*hit)).first->second;
        return nullptr;
    }

    static void check_ranges(std::span<const read_request> requests) {
        for (const read_request& r : requests) {
            const auto* o = static_cast<const s3_object*>(r.source);
            if (r.offset > o->size() || r.length > o->size() - r.offset)
                throw format_error(o->name(), r.offset,
                                   "read of " + std::to_string(r.length) + " bytes goes past the end of the object (size " +
                                       std::to_string(o->size()) + ")");
        }
    }

    void read_through_cache(block_cache& cache, std::span<const read_request> requests) const {
        const std::uint64_t block = cache.block_bytes();
        // The blocks this batch needs (a few dozen: found by a linear search), from this thread's table
        // of blocks it has read, else the cache, else to fetch.
        struct needed {
            const s3_object* object;
            std::uint64_t index;
            const cached_block* bytes;
            bool missing;
        };
        if (thread_blocks().size() > 8192) thread_blocks().clear();  // between batches only: `have` points into it
        thread_local std::vector<needed> have;                       // reused: no allocation per batch once warm
        have.clear();
        std::vector<cached_block> fetched;  // the missing blocks' buffers, for this batch
        const auto find = [&](const s3_object* o, std::uint64_t b) -> needed* {
            for (auto& n : have)
                if (n.object == o && n.index == b) return &n;
            return nullptr;
        };
        std::size_t missing = 0;
        for (const read_request& r : requests) {
            if (r.length == 0) continue;
            const auto* o = static_cast<const s3_object*>(r.source);
            for (std::uint64_t b = r.offset / block; b <= (r.offset + r.length - 1) / block; ++b) {
                if (find(o, b) != nullptr) continue;
                if (const cached_block* local = o->local_block(cache, b)) {
                    have.push_back({o, b, local, false});
                } else {
                    have.push_back({o, b, nullptr, true});
                    ++missing;
                }
            }
        }
        if (missing > 0) {
            // The missing blocks, fetched together (adjacent ones as one range), each into its own buffer.
            std::vector<read_request> fetches;
            fetched.reserve(missing);
            for (auto& n : have) {
                if (!n.missing) continue;
                const std::uint64_t length = std::min(block, n.object->size() - n.index * block);
                auto buffer = std::shared_ptr<std::byte[]>(new std::byte[length]);
                fetches.push_back({n.object, n.index * block, length, buffer.get()});
                fetched.push_back({std::span<const std::byte>(buffer.get(), length), std::shared_ptr<const void>(buffer, buffer.get())});
                n.bytes = &fetched.back();  // reserved: no reallocation moves it
            }
            fetch(fetches);
            for (const auto& n : have)
                if (n.missing) (void)cache.insert(n.object->cache_id_, n.index, n.bytes->bytes);
        }
        detail::remote_counters::instance().cached(have.size() - missing, missing);
        // Each request from its blocks, under one recovery point: a mapped block whose file was cut
        // short by hand (SIGBUS) makes the batch's requests read again from the store.
        const bool whole = detail::guarded_reads([&](detail::sigbus_guard& guard) noexcept {
            for (const read_request& r : requests) {
                const auto* o = static_cast<const s3_object*>(r.source);
                for (std::uint64_t at = r.offset; at < r.offset + r.length;) {
                    const std::uint64_t b = at / block, within = at - b * block;
                    const std::uint64_t n = std::min(r.offset + r.length - at, block - within);
                    const std::byte* src = find(o, b)->bytes->bytes.data() + within;
                    guard.covering(src, n);
                    detail::copy_from_mapping(r.dest + (at - r.offset), src, n);
                    at += n;
                }
            }
        });
        if (!whole) fetch(requests);
        have.clear();
    }

    // Straight from the store: ranges of one object within `gap` bytes of each other are fetched as
    // one (the bytes between are read and dropped: cheaper than a request), long ranges are split into
    // parts fetched in parallel, and all of them are in flight together (max_requests at a time).
    void fetch(std::span<const read_request> requests) const {
        constexpr std::uint64_t gap = 256 << 10, part = 8 << 20;
        struct piece {
            const s3_object* object;
            std::uint64_t offset, length;
            std::size_t request;
        };
        std::vector<piece> pieces;
        for (std::size_t i = 0; i < requests.size(); ++i) {
            const read_request& r = requests[i];
            if (r.length > 0) pieces.push_back({static_cast<const s3_object*>(r.source), r.offset, r.length, i});
        }
        std::sort(pieces.begin(), pieces.end(),
                  [](const piece& a, const piece& b) { return a.object != b.object ? a.object < b.object : a.offset < b.offset; });
        // Groups of pieces fetched as one range: [first, last] of `pieces`.
        struct group {
            std::size_t first, last;
            std::uint64_t offset, end;
        };
        std::vector<group> groups;
        for (std::size_t i = 0; i < pieces.size(); ++i) {
            const piece& p = pieces[i];
            if (!groups.empty()) {
                group& g = groups.back();
                if (pieces[g.first].object == p.object && p.offset <= g.end + gap &&
                    std::max(g.end, p.offset + p.length) - g.offset <= part) {
                    g.last = i;
                    g.end = std::max(g.end, p.offset + p.length);
                    continue;
                }
            }
            groups.push_back({i, i, p.offset, p.offset + p.length});
        }
        // A group of one piece lands in its request's buffer; a merged one in scratch, copied out after.
        std::vector<s3_client::range> ranges;
        std::vector<std::unique_ptr<std::byte[]>> scratch(groups.size());
        for (std::size_t g = 0; g < groups.size(); ++g) {
            const group& gr = groups[g];
            const s3_object& o = *pieces[gr.first].object;
            std::byte* dest = requests[pieces[gr.first].request].dest;
            if (gr.first != gr.last) {
                scratch[g] = std::make_unique<std::byte[]>(gr.end - gr.offset);
                dest = scratch[g].get();
            }
            for (std::uint64_t at = gr.offset; at < gr.end; at += part)
                ranges.push_back({&o.where_, &o.info_.etag, at, std::min(part, gr.end - at), dest + (at - gr.offset)});
        }
        client_->get(ranges);
        for (std::size_t g = 0; g < groups.size(); ++g) {
            if (!scratch[g]) continue;
            for (std::size_t i = groups[g].first; i <= groups[g].last; ++i) {
                const piece& p = pieces[i];
                std::memcpy(requests[p.request].dest, scratch[g].get() + (p.offset - groups[g].offset), p.length);
            }
        }
    }

    s3_location where_;
    std::string url_;
    s3_object_info info_;
    std::shared_ptr<const s3_client> client_;
    s3_catalog* catalog_;
    std::string cache_id_;
};

namespace detail {

inline std::string s3_prefix_of_directory(const s3_location& w) { return w.key.empty() || w.key.back() == '/' ? w.key : w.key + "/"; }

inline std::vector<std::string> s3_urls(const std::string& bucket, const std::vector<s3_object_info>& objects, const std::string& skip) {
    std::vector<std::string> out;
    for (const auto& o : objects)
        if (o.key != skip) out.push_back(s3_location{bucket, o.key}.url());  // a "directory marker" (the prefix itself) is no file
    return out;
}

}  // namespace detail

namespace detail {
inline const bool s3_scheme_registered = storage_registry::add(
    {.name = "s3",
     .owns = [](std::string_view location) { return is_s3_url(location); },
     .open = [](const std::string& url) -> std::unique_ptr<byte_source> {
         const s3_location where = parse_s3_url(url);
         if (where.key.empty() || where.key.back() == '/') throw io_error(url, EISDIR, "is a prefix (a \"directory\"), not an object");
         auto& catalog = s3_catalog::instance();
         const auto info = catalog.find(where);
         if (!info) throw io_error(url, ENOENT, "no such object");
         return std::make_unique<s3_object>(where, *info, catalog.client(), catalog);
     },
     .exists =
         [](const std::string& url) {
             const s3_location where = parse_s3_url(url);
             return !where.key.empty() && where.key.back() != '/' && s3_catalog::instance().find(where).has_value();
         },
     .is_directory =
         [](const std::string& url) {
             const s3_location where = parse_s3_url(url);
             auto& catalog = s3_catalog::instance();
             if (!where.key.empty() && where.key.back() != '/' && catalog.find(where)) return false;
             const s3_listing l = catalog.list(where.bucket, detail::s3_prefix_of_directory(where), true);
             return !l.objects.empty() || !l.prefixes.empty() || where.key.empty() || where.key.back() == '/';
         },
     .list_directory =
         [](const std::string& url) {
             const s3_location where = parse_s3_url(url);
             const std::string prefix = detail::s3_prefix_of_directory(where);
             return detail::s3_urls(where.bucket, s3_catalog::instance().list(where.bucket, prefix, true).objects, prefix);
         },
     .glob =
         [](const std::string& pattern) {
             const s3_location where = parse_s3_url(pattern);
             // List from the pattern's literal start; one level when its wildcards stay within one.
             const std::size_t wild = where.key.find_first_of("*?[");
             const std::string literal = where.key.substr(0, wild);
             const bool one_level = wild == std::string::npos || where.key.find('/', wild) == std::string::npos;
             const std::string prefix = one_level ? literal : literal.substr(0, literal.rfind('/') + 1);
             std::vector<s3_object_info> matched;
             for (auto& o : s3_catalog::instance().list(where.bucket, prefix, one_level).objects)
                 if (::fnmatch(where.key.c_str(), o.key.c_str(), FNM_PATHNAME) == 0) matched.push_back(o);
             return detail::s3_urls(where.bucket, matched, "");
         }});
}  // namespace detail

#else

// s3:// without libcurl in the build: every use says why.
namespace detail {
inline const bool s3_scheme_registered = [] {
    auto refuse = [](const std::string& url) -> bool {
        throw config_error("dataset", "'" + url +
                                          "': s3:// support not built (libcurl and pugixml were not found when feedline was configured; "
                                          "install libcurl4-openssl-dev libpugixml-dev and reconfigure)");
    };
    return storage_registry::add({.name = "s3",
                                  .owns = [](std::string_view location) { return is_s3_url(location); },
                                  .open = [=](const std::string& url) -> std::unique_ptr<byte_source> {
                                      refuse(url);
                                      return nullptr;
                                  },
                                  .exists = refuse,
                                  .is_directory = refuse,
                                  .list_directory = [=](const std::string& url) -> std::vector<std::string> {
                                      refuse(url);
                                      return {};
                                  },
                                  .glob = [=](const std::string& url) -> std::vector<std::string> {
                                      refuse(url);
                                      return {};
                                  }});
}();
}  // namespace detail

#endif

}  // namespace feedline
