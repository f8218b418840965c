// feedline/detail/registry.hpp: the one registry behind the extension points (storage schemes, tokenizer
// kinds, kinds of source). An implementation joins by adding its entry from its own header, through an
// inline variable initialised with add() (so including the header registers it); users read the
// entries in registration order. One registry per entry type; thread-safe; entries live as long as the
// process, so a reference to one stays valid while others are added.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

namespace feedline::detail {

template <class Entry>
class registry {
public:
    // Adds an entry; returns true (to initialise the inline variable that registers it).
    static bool add(Entry e) {
        auto& r = instance();
        std::lock_guard lock(r.mutex_);
        r.entries_.push_back(std::make_shared<const Entry>(std::move(e)));
        return true;
    }
    // The entries, in registration order.
    static std::vector<std::shared_ptr<const Entry>> entries() {
        auto& r = instance();
        std::lock_guard lock(r.mutex_);
        return r.entries_;
    }

private:
    static registry& instance() {
        static registry r;
        return r;
    }
    std::mutex mutex_;
    std::vector<std::shared_ptr<const Entry>> entries_;
};

}  // namespace feedline::detail
