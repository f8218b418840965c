// trainer/model.hpp: the sample trainer's model, independent of where it runs.
// A context-window neural language model (Bengio et al. 2003): each position's k most recent tokens
// are embedded, concatenated, passed through one tanh hidden layer and projected to vocabulary logits;
// the loss is cross-entropy against the next token. Almost all of its work is three dense matrix
// products forward and five backward, so it exercises BLAS the way a transformer's MLPs do while
// staying readable in one sitting.
//
// All parameters live in one flat fp32 buffer (embeddings, W1, W2, then biases), so the optimizer,
// the gradient all-reduce and the checkpoint each handle one contiguous array. Weight decay applies
// to the matrices, which come first: the first decayed_count() values.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#ifdef __CUDACC__
#define FEEDLINE_HD __host__ __device__
#else
#define FEEDLINE_HD
#endif

namespace trainer {

struct model_config {
    std::uint32_t vocab = 8000;  // token ids in [0, vocab); id `vocab` is the padding context token
    std::uint32_t context = 4;   // k: tokens each prediction looks at (the current one and k - 1 before it)
    std::uint32_t embed = 64;    // d: embedding width
    std::uint32_t hidden = 256;  // H: hidden layer width

    std::uint64_t concat() const noexcept { return std::uint64_t(context) * embed; }  // C = k x d
    // Offsets into the flat parameter buffer.
    std::uint64_t embeddings_at() const noexcept { return 0; }                                             // [vocab + 1, d]
    std::uint64_t w1_at() const noexcept { return embeddings_at() + (std::uint64_t(vocab) + 1) * embed; }  // [C, H]
    std::uint64_t w2_at() const noexcept { return w1_at() + concat() * hidden; }                           // [H, vocab]
    std::uint64_t b1_at() const noexcept { return w2_at() + std::uint64_t(hidden) * vocab; }               // [H]
    std::uint64_t b2_at() const noexcept { return b1_at() + hidden; }                                      // [vocab]
    std::uint64_t parameter_count() const noexcept { return b2_at() + vocab; }
    std::uint64_t decayed_count() const noexcept { return b1_at(); }
    // Multiply-adds per token for forward + backward (the GEMMs; the rest is small).
    double gemm_flops_per_token() const noexcept { return 2.0 * 3.0 * (double(concat()) * hidden + double(hidden) * vocab); }
};

// The token that fills context slot j (0 = the current token) of position t in a row of T tokens:
// none before the row starts, and in packed mode none before the current document piece starts
// (position ids restart there), so predictions never look across documents.
FEEDLINE_HD inline std::int32_t context_token(const std::int32_t* row_inputs, const std::int32_t* row_positions, std::uint32_t t,
                                              std::uint32_t j, std::int32_t pad) {
    if (j > t) return pad;
    if (row_positions != nullptr && static_cast<std::uint32_t>(row_positions[t]) < j) return pad;
    return row_inputs[t - j];
}

// A batch as the backends see it: [B, T] int32 arrays where the backend computes (device memory for
// the CUDA backend), plus the host copy of the targets for counting. positions is null in windows mode.
struct batch_view {
    const std::int32_t* inputs = nullptr;
    const std::int32_t* targets = nullptr;
    const std::int32_t* positions = nullptr;
    std::uint64_t rows = 0, seq_len = 0;
    std::uint64_t tokens() const noexcept { return rows * seq_len; }
};

struct optimizer_config {
    float lr = 3e-3f, min_lr_fraction = 0.1f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
    std::uint64_t warmup = 20, decay_steps = 1000;  // linear warmup, then cosine down to min_lr_fraction x lr
};

// Learning rate at optimizer step `step` (1-based).
inline float learning_rate(const optimizer_config& o, std::uint64_t step) {
    if (step <= o.warmup) return o.lr * static_cast<float>(step) / static_cast<float>(o.warmup ? o.warmup : 1);
    const double span = o.decay_steps > o.warmup ? double(o.decay_steps - o.warmup) : 1.0;
    const double progress = std::min(1.0, double(step - o.warmup) / span);
    const double cosine = 0.5 * (1.0 + std::cos(3.14159265358979323846 * progress));
    return static_cast<float>(o.lr * (o.min_lr_fraction + (1.0 - o.min_lr_fraction) * cosine));
}

// One AdamW update's scalars: the gradient buffers hold sums over tokens, scaled by 1 / count here.
struct adamw_step {
    float lr = 0, grad_scale = 1;
    std::uint64_t step = 1;  // 1-based, for bias correction
};

// AdamW on one element; shared by the CPU loop and the CUDA kernel so both do the same arithmetic.
FEEDLINE_HD inline void adamw_update(float& p, float g, float& m, float& v, const optimizer_config& o, float lr, float bias1, float bias2,
                                     bool decay) {
    m = o.beta1 * m + (1.0f - o.beta1) * g;
    v = o.beta2 * v + (1.0f - o.beta2) * g * g;
    const float mhat = m / bias1, vhat = v / bias2;
    p -= lr * (mhat / (sqrtf(vhat) + o.eps) + (decay ? o.weight_decay * p : 0.0f));
}

// Deterministic initial parameters (the same on every rank and backend): embeddings N(0, 0.1^2),
// W1 N(0, 1/C), W2 N(0, 1/H) x 0.5, biases 0. splitmix64 + Box-Muller, so no library's distribution
// implementation changes the numbers.
inline std::vector<float> initial_parameters(const model_config& c, std::uint64_t seed) {
    std::vector<float> p(c.parameter_count(), 0.0f);
    std::uint64_t s = seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
    auto uniform = [&] {
        std::uint64_t z = (s += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        return (static_cast<double>(z >> 11) + 0.5) * 0x1.0p-53;
    };
    auto normal = [&] { return std::sqrt(-2.0 * std::log(uniform())) * std::cos(6.283185307179586 * uniform()); };
    auto fill = [&](std::uint64_t at, std::uint64_t n, double stddev) {
        for (std::uint64_t i = 0; i < n; ++i) p[at + i] = static_cast<float>(normal() * stddev);
    };
    fill(c.embeddings_at(), (std::uint64_t(c.vocab) + 1) * c.embed, 0.1);
    fill(c.w1_at(), c.concat() * c.hidden, 1.0 / std::sqrt(double(c.concat())));
    fill(c.w2_at(), std::uint64_t(c.hidden) * c.vocab, 0.5 / std::sqrt(double(c.hidden)));
    return p;
}

// Where a model runs. The trainer drives it the same way on both: zero_grads, forward_backward for
// each micro-batch (gradients of the summed loss accumulate), all-reduce, adamw.
class backend {
public:
    virtual ~backend() = default;
    virtual std::string describe() const = 0;
    // The stream compute is queued on (a cudaStream_t), or null on the CPU.
    virtual void* stream() noexcept { return nullptr; }
    virtual void zero_grads() = 0;
    // Adds the gradient of this batch's summed loss (targets of -1 are ignored) and its loss to the
    // running loss sum. With backward = false only the loss (evaluation).
    virtual void forward_backward(const batch_view& b, bool backward) = 0;
    // The loss summed since the last call, then reset. May wait for the device.
    virtual double take_loss_sum() = 0;
    // Sums gradients across ranks (MPI on the CPU, NCCL on GPUs); no-op for one rank.
    virtual void allreduce_grads() = 0;
    virtual void adamw(const adamw_step& s) = 0;
    // Parameters and optimizer moments, for checkpoints (flat, parameter_count() each).
    virtual void save_state(std::vector<float>& params, std::vector<float>& m, std::vector<float>& v) = 0;
    virtual void load_state(const std::vector<float>& params, const std::vector<float>& m, const std::vector<float>& v) = 0;
    // The accumulated gradient (sums over tokens, before the all-reduce's division), for tests.
    virtual void save_gradients(std::vector<float>& grads) = 0;
    virtual std::uint64_t device_bytes() const noexcept { return 0; }
};

}  // namespace trainer
