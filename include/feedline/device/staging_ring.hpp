// feedline/device/staging_ring.hpp: the slot protocol shared by the host ring and the pinned ring.
// N slots, allocated once. Batch `seq` always lives in slot seq % N, so the ring doubles as the reorder
// window: producers fill slots in any order, the consumer takes them in sequence order. A slot's life:
//   free (for seq) -> filling (a worker writes the batch straight into the slot's host memory; the host
//   ring picks that memory when the slot is acquired, device/host_ring.hpp)
//   -> published (pinned ring: H2D copy queued on the copy stream, event recorded) -> handed to the
//   consumer as a batch_handle -> released (pinned ring: an event on the consumer's stream, so the next
//   copy into the device buffer waits for compute on the GPU, not on the host) -> free (for seq + N).
// Each slot's state is one 64-bit stamp: 2*seq means "free for seq", 2*seq + 1 "holds seq", so a
// producer or consumer waits for one exact value and the protocol takes no lock (the host ring's choice
// of buffer takes a short one). Waiting spins, yields, then
// sleeps on a futex (detail::wait_point). Fed by the pipeline's workers; feeds the trainer.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>

#include <feedline/detail/futex.hpp>
#include <feedline/error.hpp>

namespace feedline {

// What the producer says about the batch it published (the pipeline's [B, T] windows).
struct batch_shape {
    std::uint64_t batch = 0;
    std::uint64_t seq_len = 0;
    friend bool operator==(const batch_shape&, const batch_shape&) = default;
};

struct ring_options {
    std::size_t slots = 4;             // batches in flight between the workers and the trainer
    std::size_t slot_bytes = 0;        // bytes per batch (all of a batch's tensors)
    int numa_node = -1;                // host memory placement (-1: first touch); the GPU's node is best
    int device = 0;                    // pinned ring: the CUDA device
    bool pin = true;                   // pinned ring: false keeps host slots pageable (baseline for benchmarks)
    std::uint64_t first_sequence = 0;  // the first batch's number (a restored pipeline starts past 0)
    // Coalesced wake-ups: once next() has to sleep, it sleeps until half the prefetch depth is ready
    // (at most this long), not until its one batch is. 0: woken for each batch. Only for producers
    // that never wait on the consumer except through the ring's slots (the pipeline turns it on).
    std::chrono::microseconds coalesce_wakeups{0};
};

// Counters a ring keeps; read with staging_ring::stats() from any thread (values are approximate
// while producers run).
struct ring_stats {
    std::uint64_t published = 0, consumed = 0;
    std::uint64_t producer_wait_ns = 0;  // workers waiting for a free slot (the trainer is slower)
    std::uint64_t consumer_wait_ns = 0;  // the trainer waiting in next() (the data side is slower)
    std::uint64_t consumer_sleeps = 0;   // times next() stopped spinning to sleep (woken by a producer's futex call)
    std::size_t ready = 0;               // published, not yet taken
};

class staging_ring;

// One batch in a slot, owned by the consumer until released (or destroyed). Move-only. Must not
// outlive its ring.
class batch_handle {
public:
    batch_handle() = default;
    batch_handle(batch_handle&& o) noexcept { *this = std::move(o); }
    batch_handle& operator=(batch_handle&& o) noexcept {
        if (this != &o) {
            release();
            ring_ = std::exchange(o.ring_, nullptr);
            seq_ = o.seq_;
            slot_ = o.slot_;
            host_ = o.host_;
            device_ = o.device_;
            bytes_ = o.bytes_;
            shape_ = o.shape_;
            event_ = o.event_;
            stream_ = o.stream_;
        }
        return *this;
    }
    ~batch_handle() { release(); }

    explicit operator bool() const noexcept { return ring_ != nullptr; }
    std::uint64_t sequence() const noexcept { return seq_; }
    std::size_t slot() const noexcept { return slot_; }
    std::size_t bytes() const noexcept { return bytes_; }
    batch_shape shape() const noexcept { return shape_; }
    // The batch in host memory (valid until release; for the pinned ring, the staging copy).
    const std::byte* host() const noexcept { return host_; }
    // Where compute reads it: device memory for the pinned ring (fixed per slot for the ring's life,
    // so a captured CUDA graph stays valid), the same host memory for the host ring.
    void* data() const noexcept { return device_; }
    template <class T>
    std::span<const T> host_as(std::size_t offset_bytes, std::size_t count) const noexcept {
        return {reinterpret_cast<const T*>(host_ + offset_bytes), count};
    }
    // The pinned ring's "copy finished" event (a cudaEvent_t), null for the host ring.
    void* ready_event() const noexcept { return event_; }

    // Makes `stream` (a cudaStream_t; null: the legacy default stream) wait for the copy, without
    // blocking the host. The host ring has nothing to wait for. Remembers the stream for release().
    inline void wait_on(void* stream);
    // Returns the slot. Pinned ring: records an event on `stream` (default: the one given to
    // wait_on) so the slot's next copy waits for the compute queued so far on it. Idempotent.
    inline void release(void* stream) noexcept;
    void release() noexcept { release(stream_); }

private:
    friend class staging_ring;
    staging_ring* ring_ = nullptr;
    std::uint64_t seq_ = 0;
    std::size_t slot_ = 0;
    const std::byte* host_ = nullptr;
    void* device_ = nullptr;
    std::size_t bytes_ = 0;
    batch_shape shape_;
    void* event_ = nullptr;
    void* stream_ = nullptr;
};

class staging_ring {
public:
    staging_ring(const staging_ring&) = delete;
    staging_ring& operator=(const staging_ring&) = delete;
    virtual ~staging_ring() = default;

    std::size_t slots() const noexcept { return n_; }
    std::size_t slot_bytes() const noexcept { return slot_bytes_; }
    // True when batches end up in GPU memory.
    virtual bool on_device() const noexcept = 0;
    // Whether host slots are page-locked (pinned ring) and anything a user should know about them.
    virtual bool pinned() const noexcept = 0;
    virtual std::string description() const = 0;

    // Producer: blocks until slot seq % N is free for `seq` (the consumer released seq - N and, for the
    // pinned ring, its copy out of host memory finished). Returns the host memory to write the batch
    // into (slot_bytes(), page-aligned; the pinned ring: the slot's own; the host ring: a free buffer,
    // preferably one this thread filled before), or nullptr once the ring is closed or failed.
    // Thread-safe across distinct seqs; each seq is acquired by one producer once, and seq must be >=
    // the first sequence.
    std::byte* acquire(std::uint64_t seq) {
        slot& s = slots_[seq % n_];
        auto t0 = std::chrono::steady_clock::now();
        // A producer sleeps on its own slot's wait point, whatever the depth, and each release wakes
        // only the producers it lets go: the one whose slot it freed, and below full depth the one its
        // count admits (release_slot). With 16 workers behind a consumer that takes batches as fast as
        // they come, waking every sleeping producer at each release cost more than the copies
        // (docs/benchmarks.md). A depth change or close() wakes them all.
        auto free_for_seq = [&] { return s.stamp.load(std::memory_order_acquire) == 2 * seq && within_depth(seq); };
        s.room.wait([&] { return stopped() || free_for_seq(); });
        producer_wait_ns_.fetch_add(elapsed_ns(t0), std::memory_order_relaxed);
        if (stopped()) return nullptr;
        prepare_fill(seq % n_);
        return host_slot(seq % n_);
    }

    // Producer: the batch for `seq` (acquired before) is complete in its first `bytes` bytes. Pinned
    // ring: queues its H2D copy. Never blocks on the consumer.
    void publish(std::uint64_t seq, std::size_t bytes, batch_shape shape = {}) {
        if (bytes > slot_bytes_)
            throw config_error("slot_bytes",
                               "batch of " + std::to_string(bytes) + " bytes published into slots of " + std::to_string(slot_bytes_));
        slot& s = slots_[seq % n_];
        s.bytes = bytes;
        s.shape = shape;
        start_copy(seq % n_, bytes);
        s.stamp.store(2 * seq + 1, std::memory_order_release);
        published_.fetch_add(1, std::memory_order_relaxed);
        ready_.notify_if([&] { return wake_at_.load(std::memory_order_relaxed) == seq; });
    }

    // Consumer: the next batch in sequence order. Blocks until it is published; returns an empty
    // optional once the ring is closed and that batch was never published; rethrows a producer's
    // failure (with its type). One consumer thread.
    //
    // Waiting spins, then polls (set_consumer_poll: for a consumer with a CPU of its own), then sleeps
    // (or sleeps at once: set_consumer_spins). A sleeping consumer is woken only by the publish of the
    // batch it sleeps for. With coalesced wake-ups on and no batch held, it sleeps until the batch half the
    // depth ahead is published instead (or the ring closes, or coalesce_wakeups passes), then takes
    // its own: producers that run ahead wake it once per burst, not once per batch. A futex wake-up
    // costs the producer a system call and a context switch on some core; with batches tens of
    // microseconds apart and no core to spare that was a large part of a worker's time
    // (docs/benchmarks.md). The producers can always reach that batch without the consumer: nothing
    // is held, so depth batches past the last release may be in flight.
    std::optional<batch_handle> next() {
        const std::uint64_t seq = next_;
        slot& s = slots_[seq % n_];
        auto t0 = std::chrono::steady_clock::now();
        auto published = [&](std::uint64_t q) { return slots_[q % n_].stamp.load(std::memory_order_acquire) == 2 * q + 1; };
        auto ready = [&] { return stopped() || published(seq); };
        if (!(consumer_spins() ? ready_.spin(ready) || poll_for(ready) : ready())) {
            consumer_sleeps_.fetch_add(1, std::memory_order_relaxed);
            const std::size_t burst = coalesce_.count() > 0 && outstanding() == 0 ? depth() / 2 : 1;
            if (burst > 1) {
                const std::uint64_t last = seq + burst - 1;
                wake_at_.store(last, std::memory_order_relaxed);  // before sleep() registers: see notify_if
                ready_.sleep([&] { return stopped() || published(last); }, std::chrono::steady_clock::now() + coalesce_);
            }
            wake_at_.store(seq, std::memory_order_relaxed);
            if (!wait_check_) {
                ready_.sleep(ready);
            } else {
                while (!ready_.sleep(ready, std::chrono::steady_clock::now() + wait_check_every_))
                    if (wait_check_()) throw wait_interrupted();
            }
        }
        consumer_wait_ns_.fetch_add(elapsed_ns(t0), std::memory_order_relaxed);
        if (failed_.load(std::memory_order_acquire)) std::rethrow_exception(failure_);
        if (s.stamp.load(std::memory_order_acquire) != 2 * seq + 1) return std::nullopt;
        ++next_;
        batch_handle h;
        h.ring_ = this;
        h.seq_ = seq;
        h.slot_ = seq % n_;
        h.host_ = host_slot(h.slot_);
        h.device_ = device_slot(h.slot_);
        h.bytes_ = s.bytes;
        h.shape_ = s.shape;
        h.event_ = copy_event(h.slot_);
        outstanding_.fetch_add(1, std::memory_order_relaxed);
        return h;
    }

    // Whether next() spins (and yields) before it sleeps; on by default. The pipeline turns it off
    // while its workers take every CPU of a large enough host (pipeline/defaults.hpp): a consumer
    // spinning on the batch a worker is late with then holds a CPU that worker needs (17 busy threads
    // on 16 CPUs), and that lateness holds up every batch after its own. A consumer that sleeps at
    // once is woken by the publish it waits for, once per burst with coalesced wake-ups
    // (docs/benchmarks.md). Set on the consumer's thread.
    void set_consumer_spins(bool on) noexcept { consumer_spins_.store(on, std::memory_order_relaxed); }
    bool consumer_spins() const noexcept { return consumer_spins_.load(std::memory_order_relaxed); }
    // How long a spinning consumer goes on polling for its batch, past the short spin, before it
    // sleeps (0, the default: not at all). For a consumer with a CPU of its own: the producer that
    // publishes the batch then finds nobody to wake, where the futex wake-up of a sleeping consumer
    // cost a worker about a tenth of its time on a 2-vCPU VM (a VM exit each; docs/benchmarks.md).
    // The pipeline sets it only while its workers leave the trainer a CPU. At most 10 ms (the wait check
    // runs only once it sleeps). Set on the consumer's thread.
    void set_consumer_poll(std::chrono::microseconds t) noexcept {
        consumer_poll_us_.store(
            std::clamp<std::chrono::microseconds>(t, std::chrono::microseconds(0), std::chrono::milliseconds(10)).count(),
            std::memory_order_relaxed);
    }
    std::chrono::microseconds consumer_poll() const noexcept {
        return std::chrono::microseconds(consumer_poll_us_.load(std::memory_order_relaxed));
    }

    // While the consumer sleeps in next(), `check` runs every `every`; when it returns true, next()
    // throws wait_interrupted and takes nothing. For a consumer thread that must notice other events
    // while it waits (the Python binding: Ctrl-C). Set before the first next().
    void set_wait_check(std::function<bool()> check, std::chrono::milliseconds every) {
        wait_check_ = std::move(check);
        wait_check_every_ = std::max(every, std::chrono::milliseconds(1));
    }

    // No more batches will be published: producers waiting in acquire() get nullptr; the consumer
    // still receives every batch already published in sequence, then an empty optional.
    void close() noexcept {
        closed_.store(true, std::memory_order_release);
        notify_producers();
        ready_.notify();
    }
    // A producer failed: the consumer's next() rethrows `e` (the first failure wins) and producers stop.
    // Only the first failure closes the ring: a second producer failing at the same moment must not
    // wake the consumer before failed_ is set, or it would see a plain end of data and lose the error.
    void fail(std::exception_ptr e) noexcept {
        bool expected = false;
        if (failing_.compare_exchange_strong(expected, true)) {
            failure_ = std::move(e);
            failed_.store(true, std::memory_order_release);
            close();
        }
    }
    bool closed() const noexcept { return closed_.load(std::memory_order_acquire); }

    // Prefetch depth: at most `depth` batches between the producers and the release of the consumer's
    // batches (filling, ready, or held), so producers run at most that far ahead; [1, slots()], all
    // slots by default. The pipeline's autotuner raises it when the trainer's bursts outrun a shallow
    // ring; memory is allocated for slots() up front either way. A consumer must hold fewer handles
    // than the depth, as it must hold fewer than slots().
    void set_depth(std::size_t depth) noexcept {
        depth_.store(std::clamp<std::size_t>(depth, 1, n_), std::memory_order_seq_cst);  // see release_slot
        notify_producers();
    }
    std::size_t depth() const noexcept { return depth_.load(std::memory_order_acquire); }

    std::uint64_t next_sequence() const noexcept { return next_; }
    // Producers asleep in acquire() now, and wake-ups sent to a sleeping consumer or to sleeping
    // producers so far (close() included): lets tests wait for a producer to block, or check that a
    // publish or a release woke nobody it did not let go.
    std::size_t producers_asleep() const noexcept {
        std::size_t n = 0;
        for (std::size_t i = 0; i < n_; ++i) n += slots_[i].room.sleepers();
        return n;
    }
    std::uint64_t consumer_wakeups() const noexcept { return ready_.wakes(); }
    std::uint64_t producer_wakeups() const noexcept {
        std::uint64_t n = 0;
        for (std::size_t i = 0; i < n_; ++i) n += slots_[i].room.wakes();
        return n;
    }
    // Handles given out and not yet released (a ring must not be destroyed while this is non-zero).
    std::size_t outstanding() const noexcept { return outstanding_.load(std::memory_order_relaxed); }

    ring_stats stats() const noexcept {
        ring_stats r;
        r.published = published_.load(std::memory_order_relaxed);
        r.consumed = consumed_.load(std::memory_order_relaxed);
        r.producer_wait_ns = producer_wait_ns_.load(std::memory_order_relaxed);
        r.consumer_wait_ns = consumer_wait_ns_.load(std::memory_order_relaxed);
        r.consumer_sleeps = consumer_sleeps_.load(std::memory_order_relaxed);
        for (std::size_t i = 0; i < n_; ++i) r.ready += slots_[i].stamp.load(std::memory_order_relaxed) & 1;
        return r;
    }

protected:
    // Throws config_error for 0 slots or 0 bytes.
    explicit staging_ring(const ring_options& o)
            : n_(o.slots),
              slot_bytes_(o.slot_bytes),
              slots_(std::make_unique<slot[]>(o.slots == 0 ? 1 : o.slots)),
              first_(o.first_sequence),
              next_(o.first_sequence),
              depth_(o.slots),
              coalesce_(std::clamp<std::chrono::microseconds>(o.coalesce_wakeups, std::chrono::microseconds(0), std::chrono::hours(24))) {
        if (o.slots == 0) throw config_error("slots", "a ring needs at least 1 slot");
        if (o.slot_bytes == 0) throw config_error("slot_bytes", "must be at least 1");
        // Slot i first serves the first sequence s >= first_sequence with s % N == i.
        for (std::size_t i = 0; i < n_; ++i) {
            std::uint64_t base = o.first_sequence - o.first_sequence % n_ + i;
            if (base < o.first_sequence) base += n_;
            slots_[i].stamp.store(2 * base, std::memory_order_relaxed);
        }
    }

    // Memory and copies: what differs between the host ring and the pinned ring.
    virtual std::byte* host_slot(std::size_t slot) noexcept = 0;
    virtual void* device_slot(std::size_t slot) noexcept = 0;
    virtual void* copy_event(std::size_t) noexcept { return nullptr; }
    virtual void prepare_fill(std::size_t) {}
    virtual void start_copy(std::size_t, std::size_t) {}
    virtual void consumer_wait(std::size_t, void*) {}
    virtual void record_release(std::size_t, void*) noexcept {}

private:
    friend class batch_handle;
    struct alignas(64) slot {
        std::atomic<std::uint64_t> stamp{0};
        std::size_t bytes = 0;
        batch_shape shape;
        detail::wait_point room;  // its next producer waits here (acquire)
    };

    // Every producer, wherever it waits (depth changes, close).
    void notify_producers() noexcept {
        for (std::size_t i = 0; i < n_; ++i) slots_[i].room.notify();
    }

    bool stopped() const noexcept { return closed_.load(std::memory_order_acquire); }
    // set_consumer_poll's phase: ready() polled, the clock read every 64 polls, until the time passes.
    template <class Ready>
    bool poll_for(Ready&& ready) const {
        const std::chrono::microseconds poll = consumer_poll();
        if (poll.count() == 0) return false;
        const auto until = std::chrono::steady_clock::now() + poll;
        for (;;) {
            for (int i = 0; i < 64; ++i) {
                if (ready()) return true;
                detail::cpu_relax();
            }
            if (std::chrono::steady_clock::now() >= until) return ready();
        }
    }
    // Below full depth, seq may start only once all but depth - 1 of the batches before it were
    // released. At full depth the slot stamps alone decide (a consumer may release out of order).
    bool within_depth(std::uint64_t seq) const noexcept {
        const std::size_t d = depth_.load(std::memory_order_seq_cst);
        return d >= n_ || seq < first_ + consumed_.load(std::memory_order_seq_cst) + d;
    }
    static std::uint64_t elapsed_ns(std::chrono::steady_clock::time_point t0) noexcept {
        return static_cast<std::uint64_t>(
            std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
    }

    void release_slot(std::uint64_t seq, std::size_t slot, void* stream) noexcept {
        record_release(slot, stream);
        slots_[slot].stamp.store(2 * (seq + n_), std::memory_order_release);
        // seq_cst with the depth's load and store: a release that reads an old depth wakes the wrong
        // slot, but then set_depth's notify of every slot comes after this count in the single total
        // order, so a producer it misses sees the new count when it checks again.
        const std::uint64_t consumed = consumed_.fetch_add(1, std::memory_order_seq_cst) + 1;
        outstanding_.fetch_sub(1, std::memory_order_relaxed);
        slots_[slot].room.notify();  // one RMW each when nobody sleeps there
        // Below full depth this release admits one more batch: the one `depth` past the released count.
        const std::size_t d = depth_.load(std::memory_order_seq_cst);
        if (d < n_) slots_[(first_ + consumed + d - 1) % n_].room.notify();
    }

    std::size_t n_, slot_bytes_;
    std::unique_ptr<slot[]> slots_;
    std::uint64_t first_;
    std::uint64_t next_;  // consumer thread only
    std::atomic<std::size_t> depth_;
    std::chrono::microseconds coalesce_;
    std::function<bool()> wait_check_;        // consumer only
    std::atomic<bool> consumer_spins_{true};  // set by the consumer, read by stats() too
    std::atomic<std::int64_t> consumer_poll_us_{0};  // set_consumer_poll's; atomic like consumer_spins_, for any reader
    std::chrono::milliseconds wait_check_every_{100};
    std::atomic<std::uint64_t> wake_at_{UINT64_MAX};  // the batch a sleeping consumer waits for (written by it only)
    std::atomic<bool> closed_{false}, failing_{false}, failed_{false};
    std::exception_ptr failure_;
    std::atomic<std::uint64_t> published_{0}, consumed_{0}, producer_wait_ns_{0}, consumer_wait_ns_{0}, consumer_sleeps_{0};
    std::atomic<std::size_t> outstanding_{0};
    detail::wait_point ready_;
};

inline void batch_handle::wait_on(void* stream) {
    if (ring_ == nullptr) return;
    stream_ = stream;
    ring_->consumer_wait(slot_, stream);
}

inline void batch_handle::release(void* stream) noexcept {
    if (ring_ == nullptr) return;
    std::exchange(ring_, nullptr)->release_slot(seq_, slot_, stream);
}

}  // namespace feedline
