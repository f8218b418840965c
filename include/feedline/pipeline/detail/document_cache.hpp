// feedline/pipeline/detail/document_cache.hpp: the tokens of documents several workers need (those
// longer than a sample, and each batch's first and last, which neighbouring batches share), shared by
// the workers of every pipeline over one text source (pipeline/text_source.hpp), so a document that
// spans batches made by different workers is tokenized once.
#pragma once

#include <cstdint>
#include <future>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace feedline::detail {

// Tokens of documents several workers need, shared by the workers of every pipeline over one text
// source: a document longer than a sample spans batches that different workers make, and a batch's first
// and last documents are its neighbours' too; each worker would tokenize all of it.
// The first worker to ask tokenizes it; workers asking meanwhile wait for that result instead of
// tokenizing it again. Least recently used entries go once the cache holds more than `capacity` bytes
// (the newest entry always stays, so a document larger than the cache costs one copy).
class document_cache {
public:
    using tokens = std::shared_ptr<const std::vector<std::int32_t>>;
    explicit document_cache(std::uint64_t capacity) : capacity_(capacity) {}

    // The document's tokens: cached, being made by another thread (waited for; its error rethrown),
    // or made here by `make()` (returns std::vector<std::int32_t>).
    template <class Make>
    tokens get(std::uint64_t document, Make&& make) {
        std::unique_lock lock(mutex_);
        if (auto it = entries_.find(document); it != entries_.end()) {
            order_.splice(order_.begin(), order_, it->second.position);
            std::shared_future<tokens> value = it->second.value;
            lock.unlock();
            return value.get();
        }
        std::promise<tokens> promise;
        order_.push_front(document);
        entries_.emplace(document, entry{promise.get_future().share(), order_.begin(), 0});
        lock.unlock();
        tokens made;
        try {
            made = std::make_shared<const std::vector<std::int32_t>>(make());
        } catch (...) {
            promise.set_exception(std::current_exception());
            lock.lock();
            erase(document);
            throw;
        }
        promise.set_value(made);
        lock.lock();
        if (auto it = entries_.find(document); it != entries_.end()) {
            it->second.bytes = made->size() * sizeof(std::int32_t) + sizeof(entry);
            used_ += it->second.bytes;
            evict(document);
        }
        return made;
    }

    std::uint64_t capacity() const noexcept { return capacity_; }
    // Bytes held now (approximate: for stats and tests).
    std::uint64_t used() const {
        std::lock_guard lock(mutex_);
        return used_;
    }

private:
    struct entry {
        std::shared_future<tokens> value;
        std::list<std::uint64_t>::iterator position;
        std::uint64_t bytes = 0;  // 0 while being made: never evicted then
    };
    void erase(std::uint64_t document) {
        auto it = entries_.find(document);
        if (it == entries_.end()) return;
        used_ -= it->second.bytes;
        order_.erase(it->second.position);
        entries_.erase(it);
    }
    void evict(std::uint64_t keep) {
        for (auto it = order_.end(); used_ > capacity_ && it != order_.begin();) {
            --it;
            const std::uint64_t doc = *it;
            auto& e = entries_.at(doc);
            if (doc == keep || e.bytes == 0) continue;
            ++it;  // erase() invalidates the element only
            erase(doc);
        }
    }

    std::uint64_t capacity_;
    mutable std::mutex mutex_;
    std::unordered_map<std::uint64_t, entry> entries_;
    std::list<std::uint64_t> order_;  // most recently used first
    std::uint64_t used_ = 0;
};

}  // namespace feedline::detail
