// feedline/device/pinned_ring.hpp: the staging ring for a CUDA GPU. Each slot owns page-locked host
// memory (cudaHostAlloc, or a NUMA-local buffer registered with cudaHostRegister), a device buffer
// allocated once (fixed address for the ring's life: a trainer may capture its step in a CUDA graph),
// and two events: "copied" (recorded after the slot's H2D copy on the ring's non-blocking copy stream)
// and "released" (recorded on the consumer's stream when it returns the slot). The copy into a slot's
// device buffer waits on the GPU for "released", and a worker refilling the host buffer waits for
// "copied" on its own thread: the training thread never synchronises with the host.
// Pinning refused (RLIMIT_MEMLOCK, cudaErrorMemoryAllocation) falls back to pageable host memory with
// one warning; pinned() says which. Without the CUDA Toolkit this header declares nothing; use
// device/make_ring.hpp, which picks the host ring then.
#pragma once

#if FEEDLINE_HAS_CUDA

#include <cstdio>
#include <string>
#include <vector>

#include <feedline/device/cuda_runtime.hpp>
#include <feedline/device/staging_ring.hpp>
#include <feedline/exec/numa_memory.hpp>

namespace feedline {

class pinned_ring final : public staging_ring {
public:
    // Allocates everything now. Throws cuda_error when the device, its memory, the stream or the
    // events cannot be created (nothing is leaked then), config_error for a bad shape.
    explicit pinned_ring(const ring_options& o) : staging_ring(o), device_(o.device) {
        try {
            FEEDLINE_CUDA_CHECK(cudaSetDevice(device_));
            FEEDLINE_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
            host_.resize(o.slots);
            for (std::size_t i = 0; i < o.slots; ++i) allocate_host(host_[i], o);
            device_buffers_.resize(o.slots, nullptr);
            copied_.resize(o.slots, nullptr);
            released_.resize(o.slots, nullptr);
            for (std::size_t i = 0; i < o.slots; ++i) {
                FEEDLINE_CUDA_CHECK(cudaMalloc(&device_buffers_[i], o.slot_bytes));
                FEEDLINE_CUDA_CHECK(cudaEventCreateWithFlags(&copied_[i], cudaEventDisableTiming));
                FEEDLINE_CUDA_CHECK(cudaEventCreateWithFlags(&released_[i], cudaEventDisableTiming));
            }
        } catch (...) {
            free_all();
            throw;
        }
        if (!pin_failure_.empty()) std::fprintf(stderr, "feedline: warning: %s\n", pin_failure_.c_str());
    }
    ~pinned_ring() override {
        close();
        free_all();
    }

    bool on_device() const noexcept override { return true; }
    bool pinned() const noexcept override { return pin_failure_.empty() && pin_requested_; }
    std::string description() const override {
        std::string s = "pinned ring on CUDA device " + std::to_string(device_) + ": " + std::to_string(slots()) + " slots x " +
                        std::to_string(slot_bytes()) + " bytes, host memory ";
        if (!pin_requested_) return s + "pageable (pinning not requested)";
        if (!pin_failure_.empty()) return s + "pageable (" + pin_failure_ + ")";
        return s + (registered_ ? "NUMA-local and registered (cudaHostRegister)" : "from cudaHostAlloc");
    }
    int device() const noexcept { return device_; }
    cudaStream_t copy_stream() const noexcept { return copy_stream_; }
    // Page-locked bytes this ring holds (0 when it fell back to pageable memory).
    std::size_t pinned_bytes() const noexcept { return pinned() ? slots() * slot_bytes() : 0; }

private:
    struct host_slot_memory {
        std::byte* data = nullptr;
        bool from_cuda = false;   // cudaHostAlloc'd: cudaFreeHost
        bool registered = false;  // numa_buffer + cudaHostRegister: unregister, then the buffer frees itself
        numa_buffer pageable;
    };

    void allocate_host(host_slot_memory& m, const ring_options& o) {
        pin_requested_ = o.pin;
        const std::size_t bytes = (o.slot_bytes + 4095) & ~std::size_t(4095);
        if (o.pin && pin_failure_.empty()) {
            if (o.numa_node >= 0) {
                m.pageable = numa_buffer(bytes, o.numa_node);
                cudaError_t st = cudaHostRegister(m.pageable.data(), bytes, cudaHostRegisterPortable);
                if (st == cudaSuccess) {
                    m.data = m.pageable.data();
                    m.registered = registered_ = true;
                    return;
                }
                note_pin_failure("cudaHostRegister", st);
            } else {
                void* p = nullptr;
                cudaError_t st = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
                if (st == cudaSuccess) {
                    m.data = static_cast<std::byte*>(p);
                    m.from_cuda = true;
                    return;
                }
                note_pin_failure("cudaHostAlloc", st);
            }
        }
        if (m.pageable.data() == nullptr) m.pageable = numa_buffer(bytes, o.numa_node);
        m.data = m.pageable.data();
    }

    void note_pin_failure(const char* call, cudaError_t st) {
        (void)cudaGetLastError();
        pin_failure_ = std::string(call) + " refused to pin host memory (" + cudaGetErrorName(st) +
                       "; check `ulimit -l` / RLIMIT_MEMLOCK): using pageable memory, copies will not overlap compute fully";
    }

    std::byte* host_slot(std::size_t i) noexcept override { return host_[i].data; }
    void* device_slot(std::size_t i) noexcept override { return device_buffers_[i]; }
    void* copy_event(std::size_t i) noexcept override { return copied_[i]; }

    // A worker is about to overwrite the host buffer: the previous copy out of it must be done.
    void prepare_fill(std::size_t i) override { FEEDLINE_CUDA_CHECK(cudaEventSynchronize(copied_[i])); }

    void start_copy(std::size_t i, std::size_t bytes) override {
        FEEDLINE_CUDA_CHECK(cudaSetDevice(device_));  // the calling worker's current device
        // The consumer may still be computing on the previous batch in this device buffer.
        FEEDLINE_CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, released_[i], 0));
        FEEDLINE_CUDA_CHECK(cudaMemcpyAsync(device_buffers_[i], host_[i].data, bytes, cudaMemcpyHostToDevice, copy_stream_));
        FEEDLINE_CUDA_CHECK(cudaEventRecord(copied_[i], copy_stream_));
    }

    void consumer_wait(std::size_t i, void* stream) override {
        FEEDLINE_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), copied_[i], 0));
    }

    void record_release(std::size_t i, void* stream) noexcept override {
        if (cudaEventRecord(released_[i], static_cast<cudaStream_t>(stream)) != cudaSuccess) {
            // Cannot order the next copy after this compute on the GPU: wait for the device instead
            // (slow but safe; only on a broken context).
            cuda_ignore_errors(cudaDeviceSynchronize());
        }
    }

    void free_all() noexcept {
        if (copy_stream_ != nullptr) cuda_ignore_errors(cudaStreamSynchronize(copy_stream_));
        for (auto* e : copied_)
            if (e != nullptr) cuda_ignore_errors(cudaEventDestroy(e));
        for (auto* e : released_)
            if (e != nullptr) cuda_ignore_errors(cudaEventDestroy(e));
        for (void* d : device_buffers_)
            if (d != nullptr) cuda_ignore_errors(cudaFree(d));
        for (auto& m : host_) {
            if (m.from_cuda) cuda_ignore_errors(cudaFreeHost(m.data));
            if (m.registered) cuda_ignore_errors(cudaHostUnregister(m.data));
            m = host_slot_memory{};
        }
        if (copy_stream_ != nullptr) cuda_ignore_errors(cudaStreamDestroy(copy_stream_));
        copied_.clear();
        released_.clear();
        device_buffers_.clear();
        copy_stream_ = nullptr;
    }

    int device_;
    cudaStream_t copy_stream_ = nullptr;
    std::vector<host_slot_memory> host_;
    std::vector<void*> device_buffers_;
    std::vector<cudaEvent_t> copied_, released_;
    bool pin_requested_ = true, registered_ = false;
    std::string pin_failure_;
};

}  // namespace feedline

#endif  // FEEDLINE_HAS_CUDA
