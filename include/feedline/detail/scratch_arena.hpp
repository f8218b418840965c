// feedline/detail/scratch_arena.hpp: blocks of memory for a parse's short-lived tree, given back to the
// system all at once when the parse is done. A mixture file of 10,000 domains parses into ~60,000
// small JSON nodes; on the heap, the objects made from them while the tree still lived (each domain's
// name and path) and the domains opened next landed between them, and once the tree was freed every
// domain kept a 128-byte hole next to its objects (malloc_info after the pipeline's constructor: 9,942
// free 128-byte chunks, 1.28 MB, about a tenth of the process's memory per domain). A tree built in
// an arena leaves nothing behind: its blocks are mapped for it and unmapped with it. (Its strings too,
// when their type takes the allocator: mixture_file.hpp's do.)
//
// scratch_allocator<T> takes from the arena made last on the calling thread, while it lives, and from
// the heap otherwise; a tree built in an arena must be destroyed before it, on the same thread (declare
// the arena first). Arenas nest (one made while another lives takes over until it goes). Not for
// anything that outlives the parse.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <new>
#include <utility>
#include <vector>

namespace feedline::detail {

class scratch_arena {
public:
    scratch_arena() noexcept : previous_(current_) { current_ = this; }
    ~scratch_arena() {
        current_ = previous_;
        for (const auto& [at, bytes] : blocks_) ::munmap(at, bytes);
    }
    scratch_arena(const scratch_arena&) = delete;
    scratch_arena& operator=(const scratch_arena&) = delete;

    // The arena made last on this thread and still alive, or null.
    static scratch_arena* current() noexcept { return current_; }

    // `bytes` aligned to `align` (a power of two up to a page). Throws std::bad_alloc when the system
    // has no memory left to map.
    void* allocate(std::size_t bytes, std::size_t align) {
        if (bytes > std::numeric_limits<std::size_t>::max() / 2) throw std::bad_alloc();  // no sum below can wrap
        bytes = std::max<std::size_t>(bytes, 1);  // a pointer past a full block's end would not be owns()'
        auto fits = [&] {
            const std::size_t pad = (align - reinterpret_cast<std::uintptr_t>(at_) % align) % align;
            return at_ != nullptr && pad <= static_cast<std::size_t>(end_ - at_) && bytes <= static_cast<std::size_t>(end_ - at_) - pad;
        };
        if (!fits()) add_block(bytes + align);
        at_ += (align - reinterpret_cast<std::uintptr_t>(at_) % align) % align;
        void* p = at_;
        at_ += bytes;
        used_ += bytes;
        return p;
    }
    // Whether `p` lies in one of this arena's blocks.
    bool owns(const void* p) const noexcept {
        const auto* b = static_cast<const std::byte*>(p);
        return std::any_of(blocks_.begin(), blocks_.end(),
                           [b](const auto& block) { return b >= block.first && b < block.first + block.second; });
    }
    // Whether `p` came from an arena alive on this thread (the current one or one it was made inside).
    static bool any_owns(const void* p) noexcept {
        for (const scratch_arena* a = current_; a != nullptr; a = a->previous_)
            if (a->owns(p)) return true;
        return false;
    }
    std::size_t bytes_used() const noexcept { return used_; }
    std::size_t bytes_mapped() const noexcept { return mapped_; }
    std::size_t blocks() const noexcept { return blocks_.size(); }

    // The first block; each next one doubles, up to the last size (a 10,000-domain tree takes ~7 MB:
    // a dozen blocks).
    static constexpr std::size_t first_block = std::size_t{64} << 10, largest_block = std::size_t{4} << 20;

private:
    void add_block(std::size_t at_least) {
        std::size_t bytes = blocks_.empty() ? first_block : std::min(largest_block, blocks_.back().second * 2);
        bytes = std::max(bytes, (at_least + 4095) & ~std::size_t{4095});
        blocks_.reserve(blocks_.size() + 1);  // before the mapping: nothing to unmap if this throws
        void* at = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (at == MAP_FAILED) throw std::bad_alloc();
        blocks_.emplace_back(static_cast<std::byte*>(at), bytes);
        at_ = static_cast<std::byte*>(at);
        end_ = at_ + bytes;
        mapped_ += bytes;
    }

    static inline thread_local scratch_arena* current_ = nullptr;
    scratch_arena* previous_;
    std::vector<std::pair<std::byte*, std::size_t>> blocks_;
    std::byte* at_ = nullptr;
    std::byte* end_ = nullptr;
    std::size_t used_ = 0, mapped_ = 0;
};

// A standard allocator over scratch_arena::current() (the heap when there is none). Stateless, so
// containers made with it compare equal and nlohmann::basic_json can make one where it needs one.
// Freeing into an arena gives nothing back until the arena goes: a tree is freed whole.
template <class T>
struct scratch_allocator {
    using value_type = T;
    scratch_allocator() noexcept = default;
    template <class U>
    scratch_allocator(const scratch_allocator<U>&) noexcept {}

    T* allocate(std::size_t n) {
        if (n > std::numeric_limits<std::size_t>::max() / sizeof(T)) throw std::bad_array_new_length();
        if (scratch_arena* a = scratch_arena::current()) return static_cast<T*>(a->allocate(n * sizeof(T), alignof(T)));
        return std::allocator<T>().allocate(n);
    }
    void deallocate(T* p, std::size_t n) noexcept {
        if (scratch_arena::any_owns(p)) return;
        std::allocator<T>().deallocate(p, n);
    }
    template <class U>
    friend bool operator==(const scratch_allocator&, const scratch_allocator<U>&) noexcept {
        return true;
    }
};

}  // namespace feedline::detail
