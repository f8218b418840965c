// feedline/device/make_ring.hpp: choosing the ring at run time. "auto" takes the pinned ring when this
// build has CUDA and the machine has a usable GPU, else the host ring; the reason is kept so a trainer
// can print one line saying where its batches go and why. "cuda" insists (config_error when there is
// no GPU), "cpu" never touches CUDA. Host slots of the pinned ring go on the GPU's NUMA node (from
// the topology) unless the options name one.
#pragma once

#include <cstdlib>
#include <memory>
#include <string>

#include <feedline/device/cuda_runtime.hpp>
#include <feedline/device/host_ring.hpp>
#include <feedline/device/pinned_ring.hpp>
#include <feedline/error.hpp>
#include <feedline/exec/topology.hpp>

namespace feedline {

enum class device_kind { automatic, cpu, cuda };

// Where batches go. Converts from a device_kind, so a config can say `.device = device_kind::cpu`;
// parse_device reads the strings of command lines and JSON ("auto", "cpu", "cuda:1").
struct device_choice {
    device_kind kind = device_kind::automatic;
    int index = -1;  // CUDA device (cuda, or automatic when a GPU is found); -1: the current one (resolve_device)
    device_choice() = default;
    device_choice(device_kind k, int i = -1) : kind(k), index(i) {}  // NOLINT(google-explicit-constructor): see above
    friend bool operator==(const device_choice&, const device_choice&) = default;
};

inline std::string to_string(const device_choice& d) {
    switch (d.kind) {
        case device_kind::automatic: return "auto";
        case device_kind::cpu: return "cpu";
        case device_kind::cuda: return d.index < 0 ? "cuda" : "cuda:" + std::to_string(d.index);
    }
    return "?";
}

// "auto", "cpu", "cuda", "cuda:N" or "N" (a CUDA device index). Throws config_error otherwise. "auto"
// and "cuda" name no device: resolve_device picks the current one.
inline device_choice parse_device(const std::string& text) {
    auto index_of = [&](const std::string& digits) {
        char* end = nullptr;
        long v = std::strtol(digits.c_str(), &end, 10);
        if (digits.empty() || *end != '\0' || v < 0 || v > 1024)
            throw config_error("device", "'" + text + "' is not auto, cpu, cuda, cuda:N or a device index");
        return static_cast<int>(v);
    };
    if (text == "auto") return {device_kind::automatic};
    if (text == "cpu") return {device_kind::cpu};
    if (text == "cuda" || text == "gpu") return {device_kind::cuda};
    if (text.rfind("cuda:", 0) == 0) return {device_kind::cuda, index_of(text.substr(5))};
    return {device_kind::cuda, index_of(text)};
}

namespace detail {

// The NUMA node of the GPU at `pci_bus_id` on a machine with more than one node, else -1 (placement
// would be a no-op, or the firmware does not say).
inline int gpu_numa_node(const topology& t, const std::string& pci_bus_id) {
    if (t.nodes.size() < 2 || pci_bus_id.empty()) return -1;
    for (const auto& g : t.gpus)
        if (g.pci_bus_id == pci_bus_id) return g.numa_node;
    return -1;
}

}  // namespace detail

// A device without a number ("auto", "cuda") is the calling thread's current CUDA device, as torch's
// "cuda" is: a rank that ran cudaSetDevice(local_rank) before building its pipeline gets its batches
// on its own GPU, not all ranks on GPU 0. 0 where there is no GPU; a numbered device stays as named.
inline device_choice resolve_device(device_choice d) {
    if (d.kind == device_kind::cpu || d.index >= 0) return d;
    d.index = 0;
#if FEEDLINE_HAS_CUDA
    if (int current = 0; gpu_probe() && cudaGetDevice(&current) == cudaSuccess)
        d.index = current;
    else
        (void)cudaGetLastError();
#endif
    return d;
}

struct ring_selection {
    std::unique_ptr<staging_ring> ring;
    std::string reason;  // one line: which ring and why
};

inline ring_selection make_ring(ring_options options, device_choice device = {}) {
    device = resolve_device(device);
    if (device.kind == device_kind::cpu) return {std::make_unique<host_ring>(options), "host ring: device cpu was requested"};
    gpu_availability gpu = gpu_probe();
    if (gpu && device.index >= gpu.devices) {
        if (device.kind == device_kind::cuda)
            throw config_error("device",
                               "CUDA device " + std::to_string(device.index) + " requested, " + std::to_string(gpu.devices) + " present");
        gpu.devices = 0;
        gpu.reason = "device " + std::to_string(device.index) + " not present";
    }
#if FEEDLINE_HAS_CUDA
    if (gpu) {
        options.device = device.index;
        if (options.numa_node < 0) options.numa_node = detail::gpu_numa_node(read_topology(), gpu_pci_bus_id(device.index));
        auto ring = std::make_unique<pinned_ring>(options);
        std::string reason = ring->description() + " (" + gpu.reason + ")";
        return {std::move(ring), std::move(reason)};
    }
#endif
    if (device.kind == device_kind::cuda) throw config_error("device", "cuda requested but " + gpu.reason);
    return {std::make_unique<host_ring>(options), "host ring: " + gpu.reason};
}

}  // namespace feedline
