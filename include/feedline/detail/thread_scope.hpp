// feedline/detail/thread_scope.hpp: an object that is in force on its thread while it lives, found by
// code far down the call stack without being passed there. Scopes nest: the innermost is active, and
// the one outside it is again once it ends. What a mixture's opening shares across its 10,000 sources
// (one reading of the host's memory, one listing of each directory) lives in such scopes.
#pragma once

namespace feedline::detail {

// CRTP base: `Derived` is the scope's own type, and each type has its own chain of scopes per thread.
template <class Derived>
class thread_scope {
public:
    thread_scope(const thread_scope&) = delete;
    thread_scope& operator=(const thread_scope&) = delete;

    // The innermost scope of this type in force on this thread (nullptr: none).
    static Derived* active() noexcept { return innermost(); }

protected:
    thread_scope() noexcept : outer_(innermost()) { innermost() = static_cast<Derived*>(this); }
    ~thread_scope() { innermost() = outer_; }

private:
    static Derived*& innermost() noexcept {
        thread_local Derived* current = nullptr;
        return current;
    }
    Derived* outer_;
};

}  // namespace feedline::detail
