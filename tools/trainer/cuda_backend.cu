// trainer/cuda_backend.cu: the model on a GPU; see cuda_backend.hpp. All work is queued on one
// compute stream and nothing in a training step waits on the host: the batch's copy is waited for
// with cudaStreamWaitEvent (the pipeline's batch::wait_on), the loss accumulates in device memory and
// is read only when the trainer logs. Row-major matrices throughout; gemm() maps them onto cuBLAS's
// column-major convention (C^T = B^T A^T).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#ifdef FEEDLINE_TRAINER_NCCL
#include <nccl.h>
#endif

#include <feedline/device/cuda_runtime.hpp>

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

#include "cuda_backend.hpp"

namespace trainer {
namespace {

void cublas_check(cublasStatus_t s, const char* call) {
    if (s != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(std::string(call) + " failed: " + cublasGetStatusString(s));
}
#define TRAINER_CUBLAS(call) cublas_check((call), #call)
#define TRAINER_CUDA(call) FEEDLINE_CUDA_CHECK(call)
#define TRAINER_LAUNCH() TRAINER_CUDA(cudaGetLastError())

constexpr int threads = 256;
unsigned blocks_for(std::uint64_t n) { return static_cast<unsigned>((n + threads - 1) / threads); }

__global__ void to_bf16(const float* in, __nv_bfloat16* out, std::uint64_t n) {
    const std::uint64_t i = blockIdx.x * std::uint64_t(blockDim.x) + threadIdx.x;
    if (i < n) out[i] = __float2bfloat16(in[i]);
}

// X[i, j*d + e] = E[context token j of position i, e]; ctx[i*k + j] remembers the token for the scatter.
__global__ void gather(const std::int32_t* inputs, const std::int32_t* positions, std::uint64_t T, std::uint64_t n, std::uint32_t k,
                       std::uint32_t d, std::int32_t pad, const float* E, float* X, __nv_bfloat16* Xh, std::int32_t* ctx) {
    const std::uint64_t idx = blockIdx.x * std::uint64_t(blockDim.x) + threadIdx.x;
    if (idx >= n * k * d) return;
    const std::uint64_t e = idx % d, j = (idx / d) % k, i = idx / (std::uint64_t(d) * k);
    const std::uint64_t row = i / T, t = i % T;
    const std::int32_t tok = context_token(inputs + row * T, positions ? positions + row * T : nullptr, static_cast<std::uint32_t>(t),
                                           static_cast<std::uint32_t>(j), pad);
    const float x = E[std::uint64_t(tok) * d + e];
    X[idx] = x;
    if (Xh) Xh[idx] = __float2bfloat16(x);
    if (e == 0) ctx[i * k + j] = tok;
}

__global__ void bias_tanh(float* A, __nv_bfloat16* Ah, const float* b, std::uint64_t n, std::uint32_t H) {
    const std::uint64_t idx = blockIdx.x * std::uint64_t(blockDim.x) + threadIdx.x;
    if (idx >= n * H) return;
    const float a = tanhf(A[idx] + b[idx % H]);
    A[idx] = a;
    if (Ah) Ah[idx] = __float2bfloat16(a);
}

__device__ float block_reduce(float x, bool is_max, float* scratch) {
    for (int o = 16; o > 0; o /= 2) {
        const float y = __shfl_xor_sync(0xffffffffu, x, o);
        x = is_max ? fmaxf(x, y) : x + y;
    }
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0) scratch[warp] = x;
    __syncthreads();
    if (warp == 0) {
        x = lane < int(blockDim.x / 32) ? scratch[lane] : (is_max ? -INFINITY : 0.0f);
        for (int o = 16; o > 0; o /= 2) {
            const float y = __shfl_xor_sync(0xffffffffu, x, o);
            x = is_max ? fmaxf(x, y) : x + y;
        }
        if (lane == 0) scratch[0] = x;
    }
    __syncthreads();
    const float r = scratch[0];
    __syncthreads();
    return r;
}

// One block per row: logits (+ b2) -> loss, and dLogits = softmax - one-hot (zeros where the target is -1).
__global__ void softmax_xent(float* Z, __nv_bfloat16* Zh, const float* b2, const std::int32_t* targets, std::uint32_t V, double* loss,
                             bool backward) {
    __shared__ float scratch[32];
    float* z = Z + std::uint64_t(blockIdx.x) * V;
    __nv_bfloat16* zh = Zh ? Zh + std::uint64_t(blockIdx.x) * V : nullptr;
    const std::int32_t y = targets[blockIdx.x];
    if (y < 0) {
        if (backward)
            for (std::uint32_t v = threadIdx.x; v < V; v += blockDim.x) {
                z[v] = 0.0f;
                if (zh) zh[v] = __float2bfloat16(0.0f);
            }
        return;
    }
    float mx = -INFINITY;
    for (std::uint32_t v = threadIdx.x; v < V; v += blockDim.x) mx = fmaxf(mx, z[v] += b2[v]);
    mx = block_reduce(mx, true, scratch);
    float sum = 0.0f;
    for (std::uint32_t v = threadIdx.x; v < V; v += blockDim.x) sum += __expf(z[v] - mx);
    sum = block_reduce(sum, false, scratch);
    if (threadIdx.x == 0) atomicAdd(loss, double(logf(sum)) - double(z[y] - mx));
    __syncthreads();  // z[y] read above before it is overwritten below
    if (!backward) return;
    const float inv = 1.0f / sum;
    for (std::uint32_t v = threadIdx.x; v < V; v += blockDim.x) {
        const float g = __expf(z[v] - mx) * inv - (std::int32_t(v) == y ? 1.0f : 0.0f);
        z[v] = g;
        if (zh) zh[v] = __float2bfloat16(g);
    }
}

__global__ void tanh_backward(float* dA, __nv_bfloat16* dAh, const float* A, std::uint64_t n) {
    const std::uint64_t i = blockIdx.x * std::uint64_t(blockDim.x) + threadIdx.x;
    if (i >= n) return;
    const float g = dA[i] * (1.0f - A[i] * A[i]);
    dA[i] = g;
    if (dAh) dAh[i] = __float2bfloat16(g);
}

__global__ void scatter(const float* dX, const std::int32_t* ctx, float* dE, std::uint64_t n, std::uint32_t k, std::uint32_t d) {
    const std::uint64_t idx = blockIdx.x * std::uint64_t(blockDim.x) + threadIdx.x;
    if (idx >= n * k * d) return;
    const std::uint64_t e = idx % d, ij = idx / d;
    atomicAdd(&dE[std::uint64_t(ctx[ij]) * d + e], dX[idx]);
}

__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, std::uint64_t n, std::uint64_t decayed, optimizer_config o,
                             float lr, float scale, float bias1, float bias2) {
    const std::uint64_t i = blockIdx.x * std::uint64_t(blockDim.x) + threadIdx.x;
    if (i < n) adamw_update(p[i], g[i] * scale, m[i], v[i], o, lr, bias1, bias2, i < decayed);
}

__global__ void fill_ones(float* x, std::uint64_t n) {
    const std::uint64_t i = blockIdx.x * std::uint64_t(blockDim.x) + threadIdx.x;
    if (i < n) x[i] = 1.0f;
}

template <class T>
struct device_array {
    T* p = nullptr;
    std::uint64_t n = 0;
    device_array() = default;
    device_array(const device_array&) = delete;
    device_array& operator=(const device_array&) = delete;
    ~device_array() { reset(); }
    void reset() noexcept {
        if (p) feedline::cuda_ignore_errors(cudaFree(p));
        p = nullptr;
        n = 0;
    }
    void allocate(std::uint64_t count) {
        reset();
        if (count) TRAINER_CUDA(cudaMalloc(&p, count * sizeof(T)));
        n = count;
    }
};

class cuda_backend final : public backend {
public:
    cuda_backend(const model_config& c, const optimizer_config& o, const std::vector<float>& initial, int device, gpu_precision precision,
                 communicator* comm)
            : c_(c), o_(o), device_(device), comm_(comm) {
        try {
            setup(initial, precision);
        } catch (...) {
            release();  // the destructor does not run for a constructor that throws
            throw;
        }
    }

    ~cuda_backend() override { release(); }

private:
    void setup(const std::vector<float>& initial, gpu_precision precision) {
        TRAINER_CUDA(cudaSetDevice(device_));
        cudaDeviceProp prop{};
        TRAINER_CUDA(cudaGetDeviceProperties(&prop, device_));
        name_ = prop.name;
        bf16_ = precision == gpu_precision::bf16 || (precision == gpu_precision::automatic && prop.major >= 8);
        TRAINER_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
        TRAINER_CUBLAS(cublasCreate(&blas_));
        TRAINER_CUBLAS(cublasSetStream(blas_, stream_));
        const std::uint64_t n = c_.parameter_count();
        for (auto* a : {&params_, &grads_, &m_, &v_}) a->allocate(n);
        TRAINER_CUDA(cudaMemsetAsync(m_.p, 0, n * sizeof(float), stream_));
        TRAINER_CUDA(cudaMemsetAsync(v_.p, 0, n * sizeof(float), stream_));
        TRAINER_CUDA(cudaMemsetAsync(grads_.p, 0, n * sizeof(float), stream_));
        TRAINER_CUDA(cudaMemcpyAsync(params_.p, initial.data(), n * sizeof(float), cudaMemcpyHostToDevice, stream_));
        if (bf16_) {
            w1h_.allocate(c_.concat() * c_.hidden);
            w2h_.allocate(std::uint64_t(c_.hidden) * c_.vocab);
            refresh_bf16_weights();
        }
        loss_.allocate(1);
        TRAINER_CUDA(cudaMemsetAsync(loss_.p, 0, sizeof(double), stream_));
        TRAINER_CUDA(cudaStreamSynchronize(stream_));  // `initial` may go away after we return
#ifdef FEEDLINE_TRAINER_NCCL
        // NCCL refuses a communicator in which two ranks use the same GPU ("invalid usage"), which is
        // what `mpirun -np 4` on a 2-GPU machine gives. Such runs still train, summing gradients
        // through host memory; every rank sees the same UUIDs, so all of them take the same path.
        if (comm_ && comm_->size() > 1) {
            const auto uuids = comm_->allgather(&prop.uuid, sizeof prop.uuid);
            for (int r = 0; r < comm_->size() && !gpu_shared_; ++r)
                for (int q = r + 1; q < comm_->size() && !gpu_shared_; ++q)
                    gpu_shared_ =
                        std::memcmp(uuids.data() + r * sizeof prop.uuid, uuids.data() + q * sizeof prop.uuid, sizeof prop.uuid) == 0;
        }
        if (comm_ && comm_->size() > 1 && !gpu_shared_) {
            ncclUniqueId id{};
            if (comm_->rank() == 0) nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
            comm_->broadcast(&id, sizeof id);
            nccl_check(ncclCommInitRank(&nccl_, comm_->size(), id, comm_->rank()), "ncclCommInitRank");
        }
#endif
    }

    void release() noexcept {
#ifdef FEEDLINE_TRAINER_NCCL
        if (nccl_) ncclCommDestroy(nccl_);
        nccl_ = nullptr;
#endif
        if (blas_) cublasDestroy(blas_);
        blas_ = nullptr;
        if (stream_) feedline::cuda_ignore_errors(cudaStreamDestroy(stream_));
        stream_ = nullptr;
    }

public:
    std::string describe() const override {
        std::string collective = "one rank";
        if (comm_ && comm_->size() > 1)
            collective = nccl_         ? "NCCL all-reduce"
                         : gpu_shared_ ? "MPI all-reduce through host memory: ranks share a GPU, and NCCL needs one GPU per rank"
                                       : "MPI all-reduce through host memory (built without NCCL)";
        return "cuda:" + std::to_string(device_) + " " + name_ + " (cuBLAS, " + (bf16_ ? "bf16 operands, fp32 accumulation" : "fp32") +
               ", " + collective + ")";
    }
    void* stream() noexcept override { return stream_; }

    void zero_grads() override { TRAINER_CUDA(cudaMemsetAsync(grads_.p, 0, grads_.n * sizeof(float), stream_)); }

    void forward_backward(const batch_view& b, bool backward) override {
        const std::uint64_t n = b.tokens(), C = c_.concat(), H = c_.hidden, V = c_.vocab;
        if (n == 0) return;
        ensure_capacity(n);
        float* P = params_.p;
        __nv_bfloat16* Xh = bf16_ ? xh_.p : nullptr;
        __nv_bfloat16* Ah = bf16_ ? ah_.p : nullptr;
        __nv_bfloat16* Zh = bf16_ ? zh_.p : nullptr;
        __nv_bfloat16* dHh = bf16_ ? dah_.p : nullptr;

        gather<<<blocks_for(n * C), threads, 0, stream_>>>(b.inputs, b.positions, b.seq_len, n, c_.context, c_.embed, std::int32_t(V),
                                                           P + c_.embeddings_at(), x_.p, Xh, ctx_.p);
        TRAINER_LAUNCH();
        gemm(false, false, n, H, C, operand(x_.p, Xh), operand(P + c_.w1_at(), w1h_.p), 0.0f, a_.p);
        bias_tanh<<<blocks_for(n * H), threads, 0, stream_>>>(a_.p, Ah, P + c_.b1_at(), n, c_.hidden);
        TRAINER_LAUNCH();
        gemm(false, false, n, V, H, operand(a_.p, Ah), operand(P + c_.w2_at(), w2h_.p), 0.0f, z_.p);
        softmax_xent<<<static_cast<unsigned>(n), threads, 0, stream_>>>(z_.p, Zh, P + c_.b2_at(), b.targets, c_.vocab, loss_.p, backward);
        TRAINER_LAUNCH();
        if (!backward) return;

        float* G = grads_.p;
        const float one = 1.0f;
        gemm(true, false, H, V, n, operand(a_.p, Ah), operand(z_.p, Zh), 1.0f, G + c_.w2_at());  // dW2 += A^T dZ
        TRAINER_CUBLAS(cublasSgemv(blas_, CUBLAS_OP_N, int(V), int(n), &one, z_.p, int(V), ones_.p, 1, &one, G + c_.b2_at(), 1));  // db2
        gemm(false, true, n, H, V, operand(z_.p, Zh), operand(P + c_.w2_at(), w2h_.p), 0.0f, da_.p);  // dA = dZ W2^T
        tanh_backward<<<blocks_for(n * H), threads, 0, stream_>>>(da_.p, dHh, a_.p, n * H);
        TRAINER_LAUNCH();
        TRAINER_CUBLAS(cublasSgemv(blas_, CUBLAS_OP_N, int(H), int(n), &one, da_.p, int(H), ones_.p, 1, &one, G + c_.b1_at(), 1));  // db1
        gemm(true, false, C, H, n, operand(x_.p, Xh), operand(da_.p, dHh), 1.0f, G + c_.w1_at());      // dW1 += X^T dH
        gemm(false, true, n, C, H, operand(da_.p, dHh), operand(P + c_.w1_at(), w1h_.p), 0.0f, x_.p);  // dX = dH W1^T (X no longer needed)
        scatter<<<blocks_for(n * C), threads, 0, stream_>>>(x_.p, ctx_.p, G + c_.embeddings_at(), n, c_.context, c_.embed);
        TRAINER_LAUNCH();
    }

    double take_loss_sum() override {
        double out = 0;
        TRAINER_CUDA(cudaMemcpyAsync(&out, loss_.p, sizeof out, cudaMemcpyDeviceToHost, stream_));
        TRAINER_CUDA(cudaMemsetAsync(loss_.p, 0, sizeof(double), stream_));
        TRAINER_CUDA(cudaStreamSynchronize(stream_));
        return out;
    }

    void allreduce_grads() override {
        if (!comm_ || comm_->size() <= 1) return;
#ifdef FEEDLINE_TRAINER_NCCL
        if (nccl_) {
            nccl_check(ncclAllReduce(grads_.p, grads_.p, grads_.n, ncclFloat, ncclSum, nccl_, stream_), "ncclAllReduce");
            return;
        }
#endif
        std::vector<float> host(grads_.n);
        TRAINER_CUDA(cudaMemcpyAsync(host.data(), grads_.p, grads_.n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
        TRAINER_CUDA(cudaStreamSynchronize(stream_));
        comm_->allreduce_sum(host.data(), host.size());
        TRAINER_CUDA(cudaMemcpyAsync(grads_.p, host.data(), grads_.n * sizeof(float), cudaMemcpyHostToDevice, stream_));
        TRAINER_CUDA(cudaStreamSynchronize(stream_));
    }

    void adamw(const adamw_step& s) override {
        const float bias1 = 1.0f - std::pow(o_.beta1, static_cast<float>(s.step));
        const float bias2 = 1.0f - std::pow(o_.beta2, static_cast<float>(s.step));
        adamw_kernel<<<blocks_for(params_.n), threads, 0, stream_>>>(params_.p, grads_.p, m_.p, v_.p, params_.n, c_.decayed_count(), o_,
                                                                     s.lr, s.grad_scale, bias1, bias2);
        TRAINER_LAUNCH();
        if (bf16_) refresh_bf16_weights();
    }

    void save_state(std::vector<float>& params, std::vector<float>& m, std::vector<float>& v) override {
        for (auto [dst, src] : {std::pair{&params, &params_}, std::pair{&m, &m_}, std::pair{&v, &v_}}) {
            dst->resize(src->n);
            TRAINER_CUDA(cudaMemcpyAsync(dst->data(), src->p, src->n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
        }
        TRAINER_CUDA(cudaStreamSynchronize(stream_));
    }
    void load_state(const std::vector<float>& params, const std::vector<float>& m, const std::vector<float>& v) override {
        for (auto [src, dst] : {std::pair{&params, &params_}, std::pair{&m, &m_}, std::pair{&v, &v_}}) {
            if (src->size() != dst->n) throw std::invalid_argument("cuda_backend: state of the wrong size");
            TRAINER_CUDA(cudaMemcpyAsync(dst->p, src->data(), dst->n * sizeof(float), cudaMemcpyHostToDevice, stream_));
        }
        if (bf16_) refresh_bf16_weights();
        TRAINER_CUDA(cudaStreamSynchronize(stream_));
    }

    void save_gradients(std::vector<float>& grads) override {
        grads.resize(grads_.n);
        TRAINER_CUDA(cudaMemcpyAsync(grads.data(), grads_.p, grads_.n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
        TRAINER_CUDA(cudaStreamSynchronize(stream_));
    }

    std::uint64_t device_bytes() const noexcept override {
        std::size_t free = 0, total = 0;
        if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
            (void)cudaGetLastError();
            return 0;
        }
        return total - free;
    }

private:
    struct operand_ref {
        const void* p;
        cudaDataType_t type;
    };
    operand_ref operand(const float* f, const __nv_bfloat16* h) const {
        return bf16_ ? operand_ref{h, CUDA_R_16BF} : operand_ref{f, CUDA_R_32F};
    }

    // Row-major C[M, N] = op(A) op(B) + beta C, fp32 output and accumulation. A row-major matrix is
    // its transpose in column-major terms, so cuBLAS computes C^T = op(B)^T op(A)^T with the same flags.
    void gemm(bool ta, bool tb, std::uint64_t M, std::uint64_t N, std::uint64_t K, operand_ref A, operand_ref B, float beta, float* C) {
        const float alpha = 1.0f;
        const int lda = int(ta ? M : K), ldb = int(tb ? K : N);
        TRAINER_CUBLAS(cublasGemmEx(blas_, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, int(N), int(M), int(K), &alpha,
                                    B.p, B.type, ldb, A.p, A.type, lda, &beta, C, CUDA_R_32F, int(N), CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT));
    }

    void refresh_bf16_weights() {
        to_bf16<<<blocks_for(w1h_.n), threads, 0, stream_>>>(params_.p + c_.w1_at(), w1h_.p, w1h_.n);
        to_bf16<<<blocks_for(w2h_.n), threads, 0, stream_>>>(params_.p + c_.w2_at(), w2h_.p, w2h_.n);
        TRAINER_LAUNCH();
    }

    // Activations for n tokens; grown (never shrunk) when a bigger batch arrives.
    void ensure_capacity(std::uint64_t n) {
        if (n <= capacity_) return;
        TRAINER_CUDA(cudaStreamSynchronize(stream_));
        x_.allocate(n * c_.concat());
        a_.allocate(n * c_.hidden);
        da_.allocate(n * c_.hidden);
        z_.allocate(n * c_.vocab);
        ctx_.allocate(n * c_.context);
        ones_.allocate(n);
        if (bf16_) {
            xh_.allocate(n * c_.concat());
            ah_.allocate(n * c_.hidden);
            dah_.allocate(n * c_.hidden);
            zh_.allocate(n * c_.vocab);
        }
        fill_ones<<<blocks_for(n), threads, 0, stream_>>>(ones_.p, n);
        TRAINER_LAUNCH();
        capacity_ = n;
    }

#ifdef FEEDLINE_TRAINER_NCCL
    static void nccl_check(ncclResult_t r, const char* call) {
        if (r != ncclSuccess) throw std::runtime_error(std::string(call) + " failed: " + ncclGetErrorString(r));
    }
    ncclComm_t nccl_ = nullptr;
#else
    void* nccl_ = nullptr;
#endif
    bool gpu_shared_ = false;  // two ranks on one GPU: gradients go through host memory, not NCCL

    model_config c_;
    optimizer_config o_;
    int device_;
    communicator* comm_;
    std::string name_;
    bool bf16_ = false;
    cudaStream_t stream_ = nullptr;
    cublasHandle_t blas_ = nullptr;
    std::uint64_t capacity_ = 0;
    device_array<float> params_, grads_, m_, v_, x_, a_, da_, z_, ones_;
    device_array<__nv_bfloat16> w1h_, w2h_, xh_, ah_, dah_, zh_;
    device_array<std::int32_t> ctx_;
    device_array<double> loss_;
};

}  // namespace

std::unique_ptr<backend> make_cuda_backend(const model_config& c, const optimizer_config& o, const std::vector<float>& initial, int device,
                                           gpu_precision precision, communicator* comm) {
    return std::make_unique<cuda_backend>(c, o, initial, device, precision, comm);
}

}  // namespace trainer
