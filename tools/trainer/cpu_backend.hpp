// trainer/cpu_backend.hpp: the model on the CPU. Every dense product is an OpenBLAS cblas_sgemm
// (row-major, fp32); the rest (gather, tanh, softmax + cross-entropy, scatter, AdamW) are plain loops.
// Tokens are processed in chunks so activation memory stays bounded whatever the batch size: the
// logits of a chunk are [chunk, vocab] floats.
#pragma once

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "communicator.hpp"
#include "model.hpp"

namespace trainer {

class cpu_backend final : public backend {
public:
    cpu_backend(const model_config& c, const optimizer_config& o, std::vector<float> initial, communicator* comm = nullptr,
                std::uint64_t chunk_tokens = 2048)
            : c_(c), o_(o), comm_(comm), chunk_(std::max<std::uint64_t>(1, chunk_tokens)), params_(std::move(initial)) {
        if (params_.size() != c_.parameter_count()) throw std::invalid_argument("cpu_backend: parameter buffer has the wrong size");
        grads_.assign(params_.size(), 0.0f);
        m_.assign(params_.size(), 0.0f);
        v_.assign(params_.size(), 0.0f);
        x_.resize(chunk_ * c_.concat());
        a_.resize(chunk_ * c_.hidden);
        da_.resize(chunk_ * c_.hidden);
        logits_.resize(chunk_ * c_.vocab);
        dx_.resize(chunk_ * c_.concat());
        ctx_.resize(chunk_ * c_.context);
    }

    std::string describe() const override {
        return "cpu (OpenBLAS sgemm, " + std::to_string(openblas_get_num_threads()) + " threads, fp32)";
    }

    void zero_grads() override { std::fill(grads_.begin(), grads_.end(), 0.0f); }

    void forward_backward(const batch_view& b, bool backward) override {
        for (std::uint64_t at = 0; at < b.tokens(); at += chunk_) chunk(b, at, std::min(chunk_, b.tokens() - at), backward);
    }

    double take_loss_sum() override { return std::exchange(loss_sum_, 0.0); }

    void allreduce_grads() override {
        if (comm_ != nullptr) comm_->allreduce_sum(grads_.data(), grads_.size());
    }

    void adamw(const adamw_step& s) override {
        const float bias1 = 1.0f - std::pow(o_.beta1, static_cast<float>(s.step));
        const float bias2 = 1.0f - std::pow(o_.beta2, static_cast<float>(s.step));
        const std::uint64_t decayed = c_.decayed_count();
        for (std::uint64_t i = 0; i < params_.size(); ++i)
            adamw_update(params_[i], grads_[i] * s.grad_scale, m_[i], v_[i], o_, s.lr, bias1, bias2, i < decayed);
    }

    void save_state(std::vector<float>& params, std::vector<float>& m, std::vector<float>& v) override {
        params = params_;
        m = m_;
        v = v_;
    }
    void load_state(const std::vector<float>& params, const std::vector<float>& m, const std::vector<float>& v) override {
        if (params.size() != params_.size() || m.size() != params_.size() || v.size() != params_.size())
            throw std::invalid_argument("cpu_backend: state of the wrong size");
        params_ = params;
        m_ = m;
        v_ = v;
    }

    void save_gradients(std::vector<float>& grads) override { grads = grads_; }

    // For tests: the accumulated gradient (sum over tokens) and the parameters.
    const std::vector<float>& gradients() const noexcept { return grads_; }
    std::vector<float>& parameters() noexcept { return params_; }

private:
    // Forward (and backward) for tokens [at, at + n) of the flattened [B, T] batch.
    void chunk(const batch_view& b, std::uint64_t at, std::uint64_t n, bool backward) {
        const std::uint64_t k = c_.context, d = c_.embed, C = c_.concat(), H = c_.hidden, V = c_.vocab;
        const float* E = params_.data() + c_.embeddings_at();
        const float* W1 = params_.data() + c_.w1_at();
        const float* W2 = params_.data() + c_.w2_at();
        const float* b1 = params_.data() + c_.b1_at();
        const float* b2 = params_.data() + c_.b2_at();
        const auto pad = static_cast<std::int32_t>(V);

        // Gather: X[i] = the k context embeddings of token at + i, concatenated.
        for (std::uint64_t i = 0; i < n; ++i) {
            const std::uint64_t row = (at + i) / b.seq_len, t = (at + i) % b.seq_len;
            const std::int32_t* inputs = b.inputs + row * b.seq_len;
            const std::int32_t* positions = b.positions ? b.positions + row * b.seq_len : nullptr;
            for (std::uint64_t j = 0; j < k; ++j) {
                const std::int32_t tok =
                    context_token(inputs, positions, static_cast<std::uint32_t>(t), static_cast<std::uint32_t>(j), pad);
                ctx_[i * k + j] = tok;
                std::memcpy(&x_[i * C + j * d], E + std::uint64_t(tok) * d, d * sizeof(float));
            }
        }
        // A = tanh(X W1 + b1)
        for (std::uint64_t i = 0; i < n; ++i) std::memcpy(&a_[i * H], b1, H * sizeof(float));
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(n), int(H), int(C), 1.0f, x_.data(), int(C), W1, int(H), 1.0f, a_.data(),
                    int(H));
        for (std::uint64_t i = 0; i < n * H; ++i) a_[i] = std::tanh(a_[i]);
        // Logits = A W2 + b2
        for (std::uint64_t i = 0; i < n; ++i) std::memcpy(&logits_[i * V], b2, V * sizeof(float));
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(n), int(V), int(H), 1.0f, a_.data(), int(H), W2, int(V), 1.0f,
                    logits_.data(), int(V));
        // Softmax cross-entropy; logits become dLoss/dLogits (softmax - one-hot; 0 for ignored targets).
        const std::int32_t* targets = b.targets + at;
        for (std::uint64_t i = 0; i < n; ++i) {
            float* z = &logits_[i * V];
            const std::int32_t y = targets[i];
            if (y < 0) {
                std::fill(z, z + V, 0.0f);
                continue;
            }
            const float mx = *std::max_element(z, z + V);
            const double target_logit = double(z[y]) - mx;
            double sum = 0;
            for (std::uint64_t v = 0; v < V; ++v) sum += (z[v] = std::exp(z[v] - mx));
            loss_sum_ += std::log(sum) - target_logit;
            const float inv = static_cast<float>(1.0 / sum);
            for (std::uint64_t v = 0; v < V; ++v) z[v] *= inv;
            z[y] -= 1.0f;
        }
        if (!backward) return;

        float* dE = grads_.data() + c_.embeddings_at();
        float* dW1 = grads_.data() + c_.w1_at();
        float* dW2 = grads_.data() + c_.w2_at();
        float* db1 = grads_.data() + c_.b1_at();
        float* db2 = grads_.data() + c_.b2_at();
        // dW2 += A^T dL;  db2 += column sums of dL;  dA = dL W2^T
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(H), int(V), int(n), 1.0f, a_.data(), int(H), logits_.data(), int(V), 1.0f,
                    dW2, int(V));
        for (std::uint64_t i = 0; i < n; ++i)
            for (std::uint64_t v = 0; v < V; ++v) db2[v] += logits_[i * V + v];
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(n), int(H), int(V), 1.0f, logits_.data(), int(V), W2, int(V), 0.0f,
                    da_.data(), int(H));
        // Through tanh: dH = dA (1 - A^2);  db1 += column sums;  dW1 += X^T dH;  dX = dH W1^T
        for (std::uint64_t i = 0; i < n * H; ++i) da_[i] *= 1.0f - a_[i] * a_[i];
        for (std::uint64_t i = 0; i < n; ++i)
            for (std::uint64_t h = 0; h < H; ++h) db1[h] += da_[i * H + h];
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(C), int(H), int(n), 1.0f, x_.data(), int(C), da_.data(), int(H), 1.0f, dW1,
                    int(H));
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(n), int(C), int(H), 1.0f, da_.data(), int(H), W1, int(H), 0.0f, dx_.data(),
                    int(C));
        // Scatter dX back to the embedding rows it came from.
        for (std::uint64_t i = 0; i < n; ++i)
            for (std::uint64_t j = 0; j < k; ++j) {
                float* row = dE + std::uint64_t(ctx_[i * k + j]) * d;
                const float* g = &dx_[i * C + j * d];
                for (std::uint64_t e = 0; e < d; ++e) row[e] += g[e];
            }
    }

    model_config c_;
    optimizer_config o_;
    communicator* comm_;
    std::uint64_t chunk_;
    std::vector<float> params_, grads_, m_, v_;
    std::vector<float> x_, a_, da_, logits_, dx_;
    std::vector<std::int32_t> ctx_;
    double loss_sum_ = 0;
};

}  // namespace trainer
