// A stand-in for a training step's compute: one block that spins for a given number of GPU clock
// cycles, and a byte checksum of device memory. Built by nvcc; called from the C++ GPU tests and
// bench_h2d through the plain functions below.
#include <cuda_runtime.h>

#include <cstdint>

#include "spin_kernel.hpp"

namespace {
__global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {
    }
}
__global__ void checksum(const unsigned char* p, std::size_t n, unsigned long long* out) {
    unsigned long long local = 0;
    for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += std::size_t(blockDim.x) * gridDim.x)
        local += static_cast<unsigned long long>(p[i]) * (i % 251 + 1);
    atomicAdd(out, local);
}
}  // namespace

namespace feedline::test {

cudaError_t launch_spin(cudaStream_t stream, long long cycles) {
    spin<<<1, 1, 0, stream>>>(cycles);
    return cudaGetLastError();
}

cudaError_t launch_checksum(cudaStream_t stream, const void* data, std::size_t n, unsigned long long* device_out) {
    cudaError_t st = cudaMemsetAsync(device_out, 0, sizeof(unsigned long long), stream);
    if (st != cudaSuccess) return st;
    checksum<<<64, 256, 0, stream>>>(static_cast<const unsigned char*>(data), n, device_out);
    return cudaGetLastError();
}

}  // namespace feedline::test
