// feedline/storage/uring_reader.hpp: the io_uring backend (liburing), for cold data and O_DIRECT.
// Many reads are queued per system call with a bounded number in flight, so a batch of random windows
// costs one submit instead of one syscall each and the device sees a deep queue. Short reads are
// requeued and -EAGAIN retried, as liburing's own examples do. With O_DIRECT the page cache is bypassed;
// alignment is handled here (aligned bounce buffers, optionally registered), so callers still ask for
// arbitrary byte ranges. Fed by datasets, feeds batch assembly.
#pragma once

#if FEEDLINE_HAS_URING

#include <liburing.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <feedline/storage/fetch_ahead.hpp>
#include <feedline/storage/read_request.hpp>

namespace feedline {

struct uring_options {
    // Most reads in flight at once. 32 saturates NVMe and virtio disks measured here (see
    // docs/benchmarks.md); deeper queues only add memory for bounce buffers.
    unsigned queue_depth = 32;
    // Larger requests are split into pieces of this size so one big read proceeds in parallel and a
    // bounce buffer stays small. Must be a multiple of detail::direct_io_alignment.
    std::uint32_t max_chunk = 1u << 20;
    // Open shards with O_DIRECT: bypass the page cache (cold reads that should not evict other data).
    bool direct = false;
    // Register the bounce buffers with the ring (direct mode), so the kernel pins them once instead of
    // on every read.
    bool register_buffers = false;
};

class uring_reader {
public:
    // Why io_uring cannot be used in this process, or an empty string when it can. Creates and
    // destroys a 2-entry ring. Thread-safe; never throws.
    static std::string unavailable_reason() {
        io_uring ring{};
        int rc = io_uring_queue_init(2, &ring, 0);
        if (rc == 0) {
            io_uring_queue_exit(&ring);
            return {};
        }
        return describe_setup_failure(-rc);
    }

    // Sets up the ring and, in direct mode, the aligned bounce buffers. Throws io_error when the
    // kernel refuses the ring (the message says why) and config_error on bad options.
    explicit uring_reader(uring_options options = {}) : opt_(options) {
        if (opt_.queue_depth == 0 || opt_.queue_depth > 4096)
            throw config_error("uring_options.queue_depth", "must be in [1, 4096], got " + std::to_string(opt_.queue_depth));
        if (opt_.max_chunk == 0 || opt_.max_chunk % detail::direct_io_alignment != 0)
            throw config_error("uring_options.max_chunk", "must be a positive multiple of " + std::to_string(detail::direct_io_alignment) +
                                                              ", got " + std::to_string(opt_.max_chunk));
        int rc = io_uring_queue_init(opt_.queue_depth, &ring_, 0);
        if (rc < 0) throw io_error("io_uring", -rc, describe_setup_failure(-rc));
        slots_.resize(opt_.queue_depth);
        for (unsigned i = 0; i < opt_.queue_depth; ++i) free_slots_.push_back(i);
        if (opt_.direct) {
            // Room for a chunk plus one alignment block at each end (the caller's range rarely starts
            // or ends on a block boundary).
            bounce_size_ = opt_.max_chunk + 2 * detail::direct_io_alignment;
            void* mem = nullptr;
            if (::posix_memalign(&mem, detail::direct_io_alignment, bounce_size_ * opt_.queue_depth) != 0) {
                io_uring_queue_exit(&ring_);
                throw std::bad_alloc();
            }
            bounce_.reset(static_cast<std::byte*>(mem));
            if (opt_.register_buffers) {
                std::vector<iovec> iov(opt_.queue_depth);
                for (unsigned i = 0; i < opt_.queue_depth; ++i) iov[i] = iovec{bounce_.get() + std::size_t(i) * bounce_size_, bounce_size_};
                rc = io_uring_register_buffers(&ring_, iov.data(), opt_.queue_depth);
                // Registration can fail under a low RLIMIT_MEMLOCK; unregistered reads still work.
                registered_ = (rc == 0);
            }
        }
    }
    uring_reader(const uring_reader&) = delete;
    uring_reader& operator=(const uring_reader&) = delete;
    ~uring_reader() { io_uring_queue_exit(&ring_); }

    // Fills every request. Not thread-safe. Allocates only the per-call op list. On any failure it
    // stops submitting, waits for every read in flight, then throws (format_error when a file ends
    // before the requested range, io_error otherwise), so no buffer is written after it returns.
    void read(std::span<const read_request> requests) {
        if (failed_ != 0)
            throw io_error("io_uring", failed_,
                           "this reader's ring failed in an earlier read (io_uring_submit_and_wait); it reads no more");
        // Requests in runs that name at most max_files_in_flight() files: each run's files are leased
        // (their descriptors held open) while its reads are in flight, so a batch of windows from
        // thousands of shards never asks the descriptor pool for more than its budget at once.
        const std::size_t most = max_files_in_flight();
        for (std::size_t first = 0; first < requests.size();) {
            run_files_.clear();
            std::size_t last = first;
            for (; last < requests.size(); ++last) {
                const file* f = requests[last].source->local_file();
                if (f != nullptr && !run_files_.contains(f)) {
                    if (run_files_.size() == most) break;
                    run_files_.insert(f);
                }
            }
            read_run(requests.subspan(first, last - first));
            first = last;
        }
    }

    // Files one read() leases at once: a sixteenth of the descriptor pool's budget (workers read
    // side by side), at least 8.
    static std::size_t max_files_in_flight() { return std::max<std::size_t>(8, detail::descriptor_pool::budget() / 16); }

private:
    void read_run(std::span<const read_request> requests) {
        // The descriptors leased for this run's reads (one per file), released when it returns (or throws).
        const struct release_leases {
            std::unordered_map<const file*, file::lease>& leased;
            ~release_leases() { leased.clear(); }
        } release{leased_};
        std::deque<op> pending;
        others_.clear();
        for (const auto& r : requests) {
            detail::check_in_file(r);
            if (r.length == 0) continue;
            if (const file* f = r.source->local_file())
                split_into_ops(r, *f, pending);
            else
                others_.push_back(r);  // not a local file: through its source, all at once
        }
        detail::read_remote(others_);
        std::exception_ptr failure;
        std::vector<unsigned> resume;  // bounce ops that keep their slot and buffer for another read
        unsigned in_flight = 0;
        while (!pending.empty() || !resume.empty() || in_flight > 0) {
            if (failure) {
                for (unsigned slot : resume) free_slots_.push_back(slot);
                resume.clear();
                pending.clear();
            }
            unsigned queued = 0;
            // The SQ ring has queue_depth entries and at most queue_depth reads are in flight, so
            // io_uring_get_sqe cannot run dry here.
            for (unsigned slot : resume) {
                prepare(io_uring_get_sqe(&ring_), slot);
                ++queued;
            }
            resume.clear();
            while (!failure && !pending.empty() && !free_slots_.empty()) {
                io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
                if (sqe == nullptr) break;
                unsigned slot = free_slots_.back();
                free_slots_.pop_back();
                slots_[slot] = std::move(pending.front());
                pending.pop_front();
                prepare(sqe, slot);
                ++queued;
            }
            in_flight += queued;
            if (in_flight == 0) break;
            int rc = io_uring_submit_and_wait(&ring_, 1);
            if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
                // The ring itself failed. Reads the kernel took may still complete into the callers'
                // buffers, so wait for those (and only those: waiting for the rest would never end).
                // The ones it never took stay queued in the ring and would go out with the next
                // submission, naming descriptors the pool may have closed and given to other files by
                // then: this reader reads no more.
                if (!failure) failure = std::make_exception_ptr(io_error("io_uring", -rc, "io_uring_submit_and_wait failed"));
                const unsigned unsent = std::min(io_uring_sq_ready(&ring_), in_flight);
                drain(in_flight - unsent);
                failed_ = -rc;
                break;
            }
            io_uring_cqe* cqe = nullptr;
            unsigned head = 0, seen = 0;
            io_uring_for_each_cqe(&ring_, head, cqe) {
                ++seen;
                complete(static_cast<unsigned>(io_uring_cqe_get_data64(cqe)), cqe->res, pending, resume, failure);
            }
            io_uring_cq_advance(&ring_, seen);
            in_flight -= seen;
        }
        if (failure) std::rethrow_exception(failure);
    }

public:
    std::string_view name() const noexcept { return "io_uring"; }
    const uring_options& options() const noexcept { return opt_; }
    // Whether the bounce buffers are registered with the kernel (direct mode with register_buffers).
    bool buffers_registered() const noexcept { return registered_; }

private:
    struct op {
        const file* source = nullptr;
        int fd = -1;
        std::uint64_t offset = 0;   // where the next read starts in the file
        std::byte* dest = nullptr;  // where it lands (caller buffer, or bounce buffer + got)
        std::uint64_t remaining = 0;
        // Bounce ops (O_DIRECT with an unaligned range): read [aligned start, aligned end) into a
        // bounce buffer, then copy `want` bytes from `skip` into `final_dest`.
        bool bounce = false;
        std::uint64_t got = 0, skip = 0, want = 0, aligned_offset = 0;
        std::byte* final_dest = nullptr;
        unsigned retries = 0;
    };
    struct free_deleter {
        void operator()(std::byte* p) const noexcept { std::free(p); }
    };

    static std::string describe_setup_failure(int err) {
        std::string why = std::generic_category().message(err);
        if (err == ENOSYS) return "kernel has no io_uring (io_uring_setup: ENOSYS, " + why + ")";
        if (err == EPERM)
            return "kernel refused io_uring_setup (EPERM, " + why + "): a seccomp profile or kernel.io_uring_disabled forbids it";
        return "io_uring ring setup failed: " + why;
    }

    int direct_fd(const file& f) {
        for (auto& [src, df] : direct_files_)
            if (src == &f) return leased_fd(df);
        file direct(f.path(), /*direct=*/true);
        if (!direct.same_inode(f))  // opened by path: the name may lead elsewhere by now
            throw io_error(f.path(), ESTALE, "was replaced since it was opened (found reopening it with O_DIRECT)");
        direct_files_.emplace_back(&f, std::move(direct));
        return leased_fd(direct_files_.back().second);
    }

    // `f`'s descriptor, held open until read_run() returns (the descriptor pool closes no leased one).
    int leased_fd(const file& f) {
        auto it = leased_.find(&f);
        if (it == leased_.end()) it = leased_.emplace(&f, f.use()).first;
        return it->second.fd();
    }

    void split_into_ops(const read_request& r, const file& source, std::deque<op>& out) {
        const std::uint64_t a = detail::direct_io_alignment;
        for (std::uint64_t done = 0; done < r.length;) {
            std::uint64_t n = std::min<std::uint64_t>(opt_.max_chunk, r.length - done);
            op o;
            o.source = &source;
            std::uint64_t off = r.offset + done;
            std::byte* dst = r.dest + done;
            bool aligned = (reinterpret_cast<std::uintptr_t>(dst) % a == 0) && off % a == 0 && n % a == 0;
            if (!opt_.direct) {
                o.fd = leased_fd(source);
                o.offset = off;
                o.dest = dst;
                o.remaining = n;
            } else if (aligned) {  // already aligned: read straight into the caller's buffer
                o.fd = direct_fd(source);
                o.offset = off;
                o.dest = dst;
                o.remaining = n;
            } else {
                o.fd = direct_fd(source);
                o.bounce = true;
                o.aligned_offset = off & ~(a - 1);
                o.skip = off - o.aligned_offset;
                o.want = n;
                std::uint64_t end = (off + n + a - 1) & ~(a - 1);
                o.remaining = end - o.aligned_offset;
                o.offset = o.aligned_offset;
                o.final_dest = dst;
            }
            out.push_back(o);
            done += n;
        }
    }

    std::byte* bounce_of(unsigned slot) const noexcept { return bounce_.get() + std::size_t(slot) * bounce_size_; }

    void prepare(io_uring_sqe* sqe, unsigned slot) {
        op& o = slots_[slot];
        std::byte* target = o.bounce ? bounce_of(slot) + o.got : o.dest;
        auto len = static_cast<unsigned>(o.remaining);
        if (o.bounce && registered_)
            io_uring_prep_read_fixed(sqe, o.fd, target, len, o.offset, static_cast<int>(slot));
        else
            io_uring_prep_read(sqe, o.fd, target, len, o.offset);
        io_uring_sqe_set_data64(sqe, slot);
    }

    // Accounts for one completion: finished ops release their slot, short or interrupted reads go
    // back to `pending` (plain ops) or `resume` (bounce ops, which keep their slot's buffer).
    void complete(unsigned slot, int res, std::deque<op>& pending, std::vector<unsigned>& resume, std::exception_ptr& failure) {
        op& o = slots_[slot];
        auto release = [&] { free_slots_.push_back(slot); };
        if (failure) return release();
        if (res == -EAGAIN || res == -EINTR) {
            // Transient. Bounded so a device that always says EAGAIN fails loudly instead of spinning.
            if (++o.retries > 10000) {
                failure = std::make_exception_ptr(io_error(o.source->path(), -res, "read kept failing", o.offset));
                return release();
            }
            if (o.bounce) return resume.push_back(slot);
            pending.push_front(std::move(o));
            return release();
        }
        if (res < 0) {
            failure = std::make_exception_ptr(io_error(o.source->path(), -res, "io_uring read failed", o.offset));
            return release();
        }
        auto n = static_cast<std::uint64_t>(res);
        if (o.bounce && o.got + n >= o.skip + o.want) {
            std::memcpy(o.final_dest, bounce_of(slot) + o.skip, o.want);
            return release();
        }
        if (!o.bounce && n == o.remaining) return release();
        if (n == 0) {
            failure = std::make_exception_ptr(format_error(o.source->path(), o.offset, "file ends early (short read at end of file)"));
            return release();
        }
        o.offset += n;
        o.remaining -= n;
        if (o.bounce) {
            o.got += n;
            return resume.push_back(slot);
        }
        o.dest += n;
        pending.push_front(std::move(o));
        return release();
    }

    void drain(unsigned in_flight) noexcept {
        while (in_flight > 0) {
            io_uring_cqe* cqe = nullptr;
            // A signal (a profiler's, a child's exit) ends a wait early: wait again, or a read still in
            // flight would write into a buffer its caller has freed by then.
            if (const int rc = io_uring_wait_cqe(&ring_, &cqe); rc == -EINTR || rc == -EAGAIN || rc == -ETIME)
                continue;
            else if (rc != 0)
                return;
            free_slots_.push_back(static_cast<unsigned>(io_uring_cqe_get_data64(cqe)));
            io_uring_cqe_seen(&ring_, cqe);
            --in_flight;
        }
    }

    uring_options opt_;
    io_uring ring_{};
    std::vector<op> slots_;
    std::vector<unsigned> free_slots_;
    std::vector<read_request> others_;                     // requests of sources that are not local files (reused)
    std::unordered_map<const file*, file::lease> leased_;  // read_run()'s leased descriptors (at most max_files_in_flight)
    std::unordered_set<const file*> run_files_;            // read(): the files of the run being formed
    std::unique_ptr<std::byte, free_deleter> bounce_;
    std::size_t bounce_size_ = 0;
    bool registered_ = false;
    int failed_ = 0;  // the errno of a failed submission: the ring may hold reads never sent (read_run)
    std::vector<std::pair<const file*, file>> direct_files_;
};

static_assert(reader<uring_reader>);

}  // namespace feedline

#endif  // FEEDLINE_HAS_URING
