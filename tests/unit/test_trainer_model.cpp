// The sample trainer's CPU model: its analytic gradient equals central finite differences of its own
// loss, for every parameter tensor, with packed position ids and ignored (-1) targets in the batch;
// the learning-rate schedule behaves as documented (checkpoints: test_checkpoint.cpp).
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <random>
#include <vector>

#include "cpu_backend.hpp"
#include "test_support.hpp"

namespace {

struct small_batch {
    std::vector<std::int32_t> inputs, targets, positions;
    trainer::batch_view view(bool packed) const { return {inputs.data(), targets.data(), packed ? positions.data() : nullptr, 3, 7}; }
};

// 3 rows of 7 tokens from a vocabulary of 11; row 1 holds two documents (positions restart at 4) and
// its last two targets are padding.
small_batch make_batch() {
    small_batch b;
    std::mt19937 rng(5);
    for (int r = 0; r < 3; ++r)
        for (int t = 0; t < 7; ++t) {
            b.inputs.push_back(static_cast<std::int32_t>(rng() % 11));
            b.targets.push_back(static_cast<std::int32_t>(rng() % 11));
            b.positions.push_back(r == 1 && t >= 4 ? t - 4 : t);
        }
    b.targets[7 + 5] = b.targets[7 + 6] = -1;
    return b;
}

double loss_of(trainer::cpu_backend& m, const trainer::batch_view& v) {
    m.forward_backward(v, false);
    return m.take_loss_sum();
}

}  // namespace

TEST_CASE("CPU model: analytic gradient matches central finite differences for every tensor") {
    const trainer::model_config c{.vocab = 11, .context = 3, .embed = 4, .hidden = 6};
    for (bool packed : {false, true}) {
        CAPTURE(packed);
        const small_batch data = make_batch();
        const auto view = data.view(packed);
        // Chunks of 5 tokens: rows are split across chunks, as with real batches.
        trainer::cpu_backend m(c, {}, trainer::initial_parameters(c, 3), nullptr, 5);
        m.zero_grads();
        m.forward_backward(view, true);
        (void)m.take_loss_sum();
        const std::vector<float> grad = m.gradients();

        struct tensor {
            const char* name;
            std::uint64_t at, n;
        };
        const tensor tensors[] = {{"embeddings", c.embeddings_at(), (c.vocab + 1ull) * c.embed},
                                  {"W1", c.w1_at(), c.concat() * c.hidden},
                                  {"W2", c.w2_at(), std::uint64_t(c.hidden) * c.vocab},
                                  {"b1", c.b1_at(), c.hidden},
                                  {"b2", c.b2_at(), c.vocab}};
        int checked = 0;
        for (const tensor& t : tensors) {
            CAPTURE(t.name);
            for (std::uint64_t i = t.at; i < t.at + t.n; i += 1 + t.n / 12) {
                float& p = m.parameters()[i];
                const float saved = p;
                const float eps = 1e-2f;
                p = saved + eps;
                const double up = loss_of(m, view);
                p = saved - eps;
                const double down = loss_of(m, view);
                p = saved;
                const double numeric = (up - down) / (2.0 * eps);
                CAPTURE(i);
                CHECK(grad[i] == doctest::Approx(numeric).epsilon(2e-2).scale(std::max(1.0, std::abs(numeric))));
                ++checked;
            }
        }
        CHECK(checked > 40);
        // The padding context row gets gradient only from positions that look before a row (or document) start.
        double pad_grad = 0;
        for (std::uint32_t e = 0; e < c.embed; ++e) pad_grad += std::abs(grad[c.embeddings_at() + c.vocab * c.embed + e]);
        CHECK(pad_grad > 0);
    }
}

TEST_CASE("CPU model: packed position ids keep the context inside each document") {
    const trainer::model_config c{.vocab = 11, .context = 3, .embed = 4, .hidden = 6};
    small_batch data = make_batch();
    data.targets[7 + 3] = -1;  // ignore the one prediction of document 1 that reads token 3 of row 1
    trainer::cpu_backend m(c, {}, trainer::initial_parameters(c, 3));
    // Token 3 of row 1 ends the first document. Packed, no remaining prediction may see it; in windows
    // mode positions 4 and 5 (the next document) have it in their context.
    auto loss_with = [&](bool packed, std::int32_t token) {
        data.inputs[7 + 3] = token;
        return loss_of(m, data.view(packed));
    };
    CHECK(loss_with(true, 1) == loss_with(true, 2));
    CHECK(loss_with(false, 1) != loss_with(false, 2));
}

TEST_CASE("learning rate: linear warmup, cosine decay to the floor, flat after the horizon") {
    const trainer::optimizer_config o{.lr = 1.0f, .min_lr_fraction = 0.1f, .warmup = 10, .decay_steps = 110};
    CHECK(trainer::learning_rate(o, 1) == doctest::Approx(0.1));
    CHECK(trainer::learning_rate(o, 10) == doctest::Approx(1.0));
    CHECK(trainer::learning_rate(o, 60) == doctest::Approx(0.55));
    CHECK(trainer::learning_rate(o, 110) == doctest::Approx(0.1));
    CHECK(trainer::learning_rate(o, 500) == doctest::Approx(0.1));
    for (std::uint64_t s = 11; s < 110; ++s) CHECK(trainer::learning_rate(o, s + 1) <= trainer::learning_rate(o, s));
}
