// Kernels for the GPU tests and bench_h2d (tests/gpu/spin_kernel.cu).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace feedline::test {

// Occupies `stream` for about `cycles` GPU clock cycles (a synthetic compute step).
cudaError_t launch_spin(cudaStream_t stream, long long cycles);
// *device_out = sum of data[i] * (i % 251 + 1), computed on `stream`.
cudaError_t launch_checksum(cudaStream_t stream, const void* data, std::size_t n, unsigned long long* device_out);

// The same checksum on the host.
inline unsigned long long host_checksum(const void* data, std::size_t n) {
    auto p = static_cast<const unsigned char*>(data);
    unsigned long long s = 0;
    for (std::size_t i = 0; i < n; ++i) s += static_cast<unsigned long long>(p[i]) * (i % 251 + 1);
    return s;
}

}  // namespace feedline::test
