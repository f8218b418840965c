// The baseline every queue benchmark compares against: a bounded queue guarded by std::mutex and two
// std::condition_variable, the way most hand-written data loaders hand off work.
#pragma once

#include <condition_variable>
#include <mutex>
#include <optional>
#include <vector>

namespace feedline::bench {

template <class T>
class mutex_queue {
public:
    explicit mutex_queue(std::size_t capacity) : buf_(capacity) {}
    void push(T v) {
        std::unique_lock lock(m_);
        not_full_.wait(lock, [&] { return size_ < buf_.size(); });
        buf_[(head_ + size_) % buf_.size()] = std::move(v);
        ++size_;
        not_empty_.notify_one();
    }
    std::optional<T> pop() {
        std::unique_lock lock(m_);
        not_empty_.wait(lock, [&] { return size_ > 0 || closed_; });
        if (size_ == 0) return std::nullopt;
        T v = std::move(buf_[head_]);
        head_ = (head_ + 1) % buf_.size();
        --size_;
        not_full_.notify_one();
        return v;
    }
    void close() {
        std::lock_guard lock(m_);
        closed_ = true;
        not_empty_.notify_all();
    }

private:
    std::mutex m_;
    std::condition_variable not_empty_, not_full_;
    std::vector<T> buf_;
    std::size_t head_ = 0, size_ = 0;
    bool closed_ = false;
};

}  // namespace feedline::bench
