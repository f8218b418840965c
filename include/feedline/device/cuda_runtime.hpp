// feedline/device/cuda_runtime.hpp: checked CUDA runtime calls and "is there a usable GPU?".
// Every CUDA call in feedline goes through FEEDLINE_CUDA_CHECK, which throws cuda_error naming the
// call and the status; destructors use cuda_ignore_errors instead, because they must not throw and may
// run after the CUDA runtime has been unloaded at exit. gpu_probe() answers at run time, so one binary
// runs on machines with and without a GPU. Without the CUDA Toolkit at build time only gpu_probe()
// exists, and it says so. Feeds device/pinned_ring.hpp and device/make_ring.hpp.
#pragma once

#include <cctype>
#include <string>

#include <feedline/error.hpp>

#if FEEDLINE_HAS_CUDA
#include <cuda_runtime_api.h>
#endif

namespace feedline {

struct gpu_availability {
    int devices = 0;            // usable CUDA devices (0 when none, or when built without CUDA)
    std::string reason;         // why there are none, or the first device's name
    bool none_visible = false;  // the driver answered and has no device for this process (none, or CUDA_VISIBLE_DEVICES hides them all)
    explicit operator bool() const noexcept { return devices > 0; }
};

#if FEEDLINE_HAS_CUDA

namespace detail {
inline void cuda_check(cudaError_t status, const char* call) {
    if (status != cudaSuccess) {
        (void)cudaGetLastError();  // clear the sticky-free error so later calls are not blamed for it
        throw cuda_error(call, static_cast<int>(status), std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status));
    }
}
}  // namespace detail

// For destructors (feedline's and a trainer's): CUDA may already be shutting down
// (cudaErrorCudartUnloading) or the context may be gone after a device error; freeing then is
// impossible and must not throw. Clears the error so the next checked call does not report it.
inline void cuda_ignore_errors(cudaError_t) noexcept { (void)cudaGetLastError(); }

#define FEEDLINE_CUDA_CHECK(call) ::feedline::detail::cuda_check((call), #call)

// Queries the driver once per call: device count, or the reason there is none (no driver, driver
// older than the runtime, no device, CUDA_VISIBLE_DEVICES hides them all).
inline gpu_availability gpu_probe() {
    gpu_availability out;
    int count = 0;
    cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) {
        (void)cudaGetLastError();
        out.reason =
            std::string("no usable GPU: cudaGetDeviceCount says ") + cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")";
        out.none_visible = status == cudaErrorNoDevice;
        return out;
    }
    if (count == 0) {
        out.reason = "no usable GPU: the driver reports 0 devices";
        out.none_visible = true;
        return out;
    }
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) out.reason = std::string(prop.name);
    (void)cudaGetLastError();
    out.devices = count;
    return out;
}

// The device's PCI address as sysfs spells it ("0000:1a:00.0", lower case), to find its NUMA node
// in the topology. Empty when the runtime cannot say.
inline std::string gpu_pci_bus_id(int device) {
    char id[32] = {};
    if (cudaDeviceGetPCIBusId(id, sizeof id, device) != cudaSuccess) {
        (void)cudaGetLastError();
        return {};
    }
    std::string out(id);
    for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return out;
}

#else

inline std::string gpu_pci_bus_id(int) { return {}; }

inline gpu_availability gpu_probe() { return {0, "no usable GPU: feedline was built without the CUDA Toolkit"}; }

#endif

}  // namespace feedline
