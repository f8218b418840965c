// feedline/device/nvml.hpp: what the GPU is doing, from NVIDIA's management library (NVML), and a
// side thread that samples it. NVML comes with the driver (libnvidia-ml.so.1), not the toolkit, so it
// is opened at run time with dlopen: one binary runs with and without it, and a machine without it gets
// the reason instead of a figure (absent, never zero). The few declarations below are NVML's stable
// C ABI (the versioned _v2/_v3 entry points exist so that such declarations keep working). Feeds the
// pipeline's stats lines, the trainer's log and feedline-doctor check.
#pragma once

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <feedline/detail/thread_name.hpp>

namespace feedline {

// One reading of one GPU. A field NVML does not give stays empty: the PCIe link on virtual GPUs,
// utilization on MIG, memory on a MIG GPU for an unprivileged process (nvml.h: aggregate memory "only
// if the caller has appropriate privileges").
struct gpu_reading {
    std::string name, pci_bus_id;                            // pci_bus_id as sysfs spells it: "0000:1a:00.0"
    std::optional<std::uint64_t> memory_total, memory_used;  // bytes, all processes together
    std::optional<double> utilization;  // share of the last sample period a kernel ran, 0..1; MIG and vGPUs may not say
    std::optional<unsigned> pcie_gen, pcie_width, pcie_max_gen, pcie_max_width;
    // MIG is on: the figures are the whole GPU's, of which a job sees one instance.
    bool mig = false;
};

namespace detail {

// Domain, bus and device of a PCI address in any of its spellings: sysfs's "0000:1a:00.0", CUDA's
// "0000:1A:00.0", NVML's "00000000:1A:00.0". nullopt for anything else.
inline std::optional<std::array<unsigned, 3>> parse_pci_bus_id(const std::string& s) {
    unsigned domain = 0, bus = 0, device = 0, function = 0;
    int used = 0;
    if (std::sscanf(s.c_str(), "%x:%x:%x.%x%n", &domain, &bus, &device, &function, &used) != 4 || used != static_cast<int>(s.size()))
        return std::nullopt;
    return std::array<unsigned, 3>{domain, bus, device};
}

}  // namespace detail

namespace detail::nvml_abi {
using result = int;  // nvmlReturn_t: 0 is NVML_SUCCESS
using device = struct opaque_device*;
struct utilization {
    unsigned gpu, memory;
};  // nvmlUtilization_t, percent
struct memory {
    unsigned long long total, free, used;
};                 // nvmlMemory_t, bytes
struct pci_info {  // nvmlPciInfo_t (v3)
    char bus_id_legacy[16];
    unsigned domain, bus, device, pci_device_id, pci_subsystem_id;
    char bus_id[32];
};
}  // namespace detail::nvml_abi

// The library, opened once per process. Never closed: other threads (a sampler) may still call it
// while static destructors run, and the driver keeps its own state for the process anyway.
class nvml {
public:
    static const nvml& get() {
        static const nvml instance;
        return instance;
    }
    bool available() const noexcept { return init_ != nullptr; }
    const std::string& reason() const noexcept { return reason_; }  // why not available

    unsigned count() const {
        unsigned n = 0;
        return available() && count_(&n) == 0 ? n : 0;
    }
    using handle = detail::nvml_abi::device;

    std::optional<gpu_reading> read(unsigned index) const {
        handle d = nullptr;
        if (!available() || by_index_(index, &d) != 0) return std::nullopt;
        return read_device(d);
    }
    // The GPU at a PCI bus id (cudaDeviceGetPCIBusId's or sysfs's spelling): CUDA's device numbers
    // and NVML's differ (CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER), the bus id does not.
    std::optional<gpu_reading> read(const std::string& pci_bus_id) const {
        const auto d = find(pci_bus_id);
        return d ? read_device(*d) : std::nullopt;
    }
    // NVML's handle of the GPU at `pci_bus_id`. nvml.h documents the id it takes only as "the
    // nvmlPciInfo_t::busId" (8 upper-case domain digits), so when the lookup refuses another spelling,
    // every GPU's domain, bus and device numbers are compared instead.
    std::optional<handle> find(const std::string& pci_bus_id) const {
        if (!available() || pci_bus_id.empty()) return std::nullopt;
        if (handle d = nullptr; by_pci_(pci_bus_id.c_str(), &d) == 0) return d;
        const auto want = detail::parse_pci_bus_id(pci_bus_id);
        if (!want) return std::nullopt;
        for (unsigned i = 0, n = count(); i < n; ++i) {
            handle d = nullptr;
            detail::nvml_abi::pci_info p{};
            if (by_index_(i, &d) == 0 && pci_(d, &p) == 0 && std::array<unsigned, 3>{p.domain, p.bus, p.device} == *want) return d;
        }
        return std::nullopt;
    }
    // What changes from one moment to the next (memory, utilization), for a sampler: two calls,
    // where read() makes eight. nullopt when NVML gives neither.
    std::optional<gpu_reading> read_usage(handle d) const {
        gpu_reading g;
        if (detail::nvml_abi::memory m{}; memory_(d, &m) == 0) g.memory_total = m.total, g.memory_used = m.used;
        if (detail::nvml_abi::utilization u{}; utilization_(d, &u) == 0) g.utilization = std::min(100u, u.gpu) / 100.0;
        if (!g.memory_used && !g.utilization) return std::nullopt;
        return g;
    }

private:
    template <class F>
    bool bind(F& f, const char* symbol) {
        f = reinterpret_cast<F>(::dlsym(lib_, symbol));
        if (f == nullptr) reason_ = std::string("NVML lacks ") + symbol + " (driver too old)";
        return f != nullptr;
    }

    nvml() {
        lib_ = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
        if (lib_ == nullptr) {
            const char* e = ::dlerror();
            reason_ = std::string("no NVML: libnvidia-ml.so.1 cannot be opened (no NVIDIA driver here)") + (e ? std::string(": ") + e : "");
            return;
        }
        decltype(init_) init = nullptr;
        if (!bind(init, "nvmlInit_v2") || !bind(count_, "nvmlDeviceGetCount_v2") || !bind(by_index_, "nvmlDeviceGetHandleByIndex_v2") ||
            !bind(by_pci_, "nvmlDeviceGetHandleByPciBusId_v2") || !bind(name_, "nvmlDeviceGetName") ||
            !bind(memory_, "nvmlDeviceGetMemoryInfo") || !bind(utilization_, "nvmlDeviceGetUtilizationRates") ||
            !bind(pci_, "nvmlDeviceGetPciInfo_v3"))
            return;
        // Optional: virtual GPUs and old drivers lack them, and the readings then leave the fields empty.
        link_gen_ = reinterpret_cast<decltype(link_gen_)>(::dlsym(lib_, "nvmlDeviceGetCurrPcieLinkGeneration"));
        link_width_ = reinterpret_cast<decltype(link_width_)>(::dlsym(lib_, "nvmlDeviceGetCurrPcieLinkWidth"));
        max_gen_ = reinterpret_cast<decltype(max_gen_)>(::dlsym(lib_, "nvmlDeviceGetMaxPcieLinkGeneration"));
        max_width_ = reinterpret_cast<decltype(max_width_)>(::dlsym(lib_, "nvmlDeviceGetMaxPcieLinkWidth"));
        mig_mode_ = reinterpret_cast<decltype(mig_mode_)>(::dlsym(lib_, "nvmlDeviceGetMigMode"));
        if (const int r = init(); r != 0) {
            reason_ = "no NVML: nvmlInit_v2 returned " + std::to_string(r) + (r == 9 ? " (the NVIDIA driver is not loaded)" : "");
            return;
        }
        init_ = init;
    }

    // "0000:1a:00.0", sysfs's spelling (5 digits for VMD domains too), or empty when NVML does not say.
    std::string bus_id(handle d) const {
        detail::nvml_abi::pci_info p{};
        if (pci_(d, &p) != 0) return {};
        char id[32];
        std::snprintf(id, sizeof id, "%04x:%02x:%02x.0", p.domain, p.bus & 0xffu, p.device & 0xffu);
        return id;
    }

    std::optional<gpu_reading> read_device(handle d) const {
        gpu_reading g = read_usage(d).value_or(gpu_reading{});
        char name[96] = {};  // NVML_DEVICE_NAME_V2_BUFFER_SIZE
        if (name_(d, name, sizeof name) == 0) g.name = name;
        g.pci_bus_id = bus_id(d);
        if (g.name.empty() && g.pci_bus_id.empty() && !g.memory_used && !g.utilization) return std::nullopt;  // NVML knows nothing of it
        unsigned v = 0, pending = 0;
        if (mig_mode_ && mig_mode_(d, &v, &pending) == 0) g.mig = v == 1;  // NVML_DEVICE_MIG_ENABLE
        if (link_gen_ && link_gen_(d, &v) == 0) g.pcie_gen = v;
        if (link_width_ && link_width_(d, &v) == 0) g.pcie_width = v;
        if (max_gen_ && max_gen_(d, &v) == 0) g.pcie_max_gen = v;
        if (max_width_ && max_width_(d, &v) == 0) g.pcie_max_width = v;
        return g;
    }

    using dev = detail::nvml_abi::device;
    using res = detail::nvml_abi::result;
    void* lib_ = nullptr;
    std::string reason_;
    res (*init_)() = nullptr;
    res (*count_)(unsigned*) = nullptr;
    res (*by_index_)(unsigned, dev*) = nullptr;
    res (*by_pci_)(const char*, dev*) = nullptr;
    res (*name_)(dev, char*, unsigned) = nullptr;
    res (*memory_)(dev, detail::nvml_abi::memory*) = nullptr;
    res (*utilization_)(dev, detail::nvml_abi::utilization*) = nullptr;
    res (*pci_)(dev, detail::nvml_abi::pci_info*) = nullptr;
    res (*link_gen_)(dev, unsigned*) = nullptr;
    res (*link_width_)(dev, unsigned*) = nullptr;
    res (*max_gen_)(dev, unsigned*) = nullptr;
    res (*max_width_)(dev, unsigned*) = nullptr;
    res (*mig_mode_)(dev, unsigned*, unsigned*) = nullptr;  // current, pending
};

// The mean of a GPU's samples over one logging interval.
struct gpu_interval {
    std::optional<double> utilization;                       // mean, 0..1; empty when no sample had it
    std::optional<std::uint64_t> memory_used, memory_total;  // mean used (bytes), total; empty when no sample had them
    unsigned samples = 0;                                    // 0: no sample fell in the interval; the latest one is repeated
    unsigned utilization_samples = 0;                        // of them, those with a utilization (the weight of its mean)
};

// Samples a GPU every `period` on its own thread, so the trainer never waits on the driver; take()
// gives the mean since the previous take(). A utilization figure is itself NVML's share of its own
// sampling window (1/6 s to 1 s, by GPU) in which a kernel ran: one sample says little, the mean of an
// interval's samples is what the logs carry.
class gpu_sampler {
public:
    using read_fn = std::function<std::optional<gpu_reading>()>;

    // The first sample is taken here, on the caller's thread: a take() right after construction (the
    // first log line of a short run) already has a reading.
    gpu_sampler(read_fn read, std::chrono::milliseconds period = std::chrono::milliseconds(100)) : read_(std::move(read)), period_(period) {
        sample();
        thread_ = std::thread([this] { run(); });
    }
    gpu_sampler(const gpu_sampler&) = delete;
    gpu_sampler& operator=(const gpu_sampler&) = delete;
    ~gpu_sampler() {
        {
            std::lock_guard lock(mutex_);
            stop_ = true;
        }
        wake_.notify_all();
        thread_.join();
    }

    // A sampler for the GPU at `pci_bus_id` through NVML, or nullptr (with the reason in `why`) when
    // NVML is absent or does not know the GPU.
    static std::unique_ptr<gpu_sampler> for_gpu(const std::string& pci_bus_id, std::string* why = nullptr,
                                                std::chrono::milliseconds period = std::chrono::milliseconds(100)) {
        const nvml& lib = nvml::get();
        auto fail = [&](std::string r) {
            if (why) *why = std::move(r);
            return std::unique_ptr<gpu_sampler>();
        };
        if (!lib.available()) return fail(lib.reason());
        if (pci_bus_id.empty()) return fail("no GPU to sample (no PCI bus id)");
        const auto d = lib.find(pci_bus_id);
        if (!d) return fail("NVML does not report the GPU at " + pci_bus_id);
        // In MIG mode NVML gives the whole GPU's memory (of which this job holds one instance: no
        // headroom to read from it) and no utilization, so there is nothing of this job's to sample.
        if (const auto r = lib.read(pci_bus_id); r && r->mig)
            return fail("the GPU at " + pci_bus_id + " is in MIG mode: NVML reports no utilization and only the whole GPU's memory");
        if (!lib.read_usage(*d)) return fail("NVML reports neither memory nor utilization for the GPU at " + pci_bus_id);
        return std::make_unique<gpu_sampler>([&lib, h = *d] { return lib.read_usage(h); }, period);
    }

    // The mean since the previous take(), or nullopt while no sample has succeeded yet.
    std::optional<gpu_interval> take() {
        std::lock_guard lock(mutex_);
        if (n_ == 0) {
            if (!latest_) return std::nullopt;
            return gpu_interval{latest_->utilization, latest_->memory_used, latest_->memory_total, 0, 0};
        }
        gpu_interval out{util_n_ ? std::optional<double>(util_sum_ / util_n_) : std::nullopt,
                         memory_n_ ? std::optional<std::uint64_t>(static_cast<std::uint64_t>(memory_sum_ / memory_n_)) : std::nullopt,
                         memory_n_ ? latest_memory_total_ : std::nullopt, n_, util_n_};
        util_sum_ = memory_sum_ = 0;
        n_ = util_n_ = memory_n_ = 0;
        return out;
    }
    std::uint64_t samples_taken() const {
        std::lock_guard lock(mutex_);
        return total_samples_;
    }

private:
    void sample() {
        std::optional<gpu_reading> r;
        try {
            r = read_();  // outside the lock: take() never waits on the driver
        } catch (...) {   // a reader that throws is a failed sample, never a dead process
        }
        if (!r) return;
        std::lock_guard lock(mutex_);
        latest_ = r;
        if (r->utilization) util_sum_ += *r->utilization, ++util_n_;
        if (r->memory_used) memory_sum_ += static_cast<double>(*r->memory_used), ++memory_n_, latest_memory_total_ = r->memory_total;
        ++n_;
        ++total_samples_;
    }

    void run() {
        detail::name_this_thread("feedline-gpumon");
        for (;;) {
            {
                std::unique_lock lock(mutex_);
                if (wake_.wait_for(lock, period_, [this] { return stop_; })) return;
            }
            sample();
        }
    }

    read_fn read_;
    std::chrono::milliseconds period_;
    mutable std::mutex mutex_;
    std::condition_variable wake_;
    bool stop_ = false;
    std::optional<gpu_reading> latest_;
    double util_sum_ = 0, memory_sum_ = 0;
    std::optional<std::uint64_t> latest_memory_total_;
    unsigned n_ = 0, util_n_ = 0, memory_n_ = 0;  // samples in this interval; those that had a utilization, memory
    std::uint64_t total_samples_ = 0;
    std::thread thread_;  // started in the constructor's body, once every member exists
};

}  // namespace feedline
