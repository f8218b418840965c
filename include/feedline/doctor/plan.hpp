// feedline/doctor/plan.hpp: what a data-parallel training job needs, per GPU and per node: GPU memory (model
// states under ZeRO partitioning, activations, what is left), host memory, CPU cores and read
// bandwidth. Every figure carries the rule that produced it, so a reader can check it and a script
// can act on it. Sources:
// - Model states: Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
//   Models" (SC'20), section 3.1 and Figure 1: 16-bit parameters and gradients (2 + 2 bytes each) and
//   K = 12 bytes of Adam state (fp32 master weights, momentum, variance) per parameter; stage 1
//   partitions the optimizer states over the Nd data-parallel ranks, stage 2 the gradients too,
//   stage 3 the parameters too.
// - Parameters of a GPT-style model: Narayanan et al., "Efficient Large-Scale Language Model Training
//   on GPU Clusters Using Megatron-LM" (SC'21), section 5.1: P = 12 l h^2 (1 + 13/(12 h) + (V + s)/(12 l h)).
// - Activations: Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models"
//   (MLSys'23), section 4.1: s b h (34 + 5 a s / h) bytes per layer with 16-bit activations and no
//   tensor or sequence parallelism; with full recomputation, 2 s b h per layer (each layer's input)
//   plus one layer's full activations while it is recomputed.
// - Training FLOPs: 6 P per token (Kaplan et al. 2020), 8 P with full recomputation (one more forward).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <feedline/error.hpp>
#include <feedline/exec/topology.hpp>

namespace feedline::doctor {

inline constexpr double gib = 1024.0 * 1024.0 * 1024.0;

struct plan_input {
    double params = 0;  // Ψ; 0: from the shape below
    std::uint64_t layers = 0, hidden = 0, heads = 0, vocab = 0;
    std::string precision = "bf16";   // bf16 | fp16 (mixed precision with fp32 master weights) | fp32
    std::string optimizer = "adamw";  // adamw | sgd (with momentum)
    std::uint64_t gpus = 1;           // per node
    std::uint64_t nodes = 1;
    unsigned zero_stage = 0;
    bool offload_optimizer = false;  // optimizer states in host memory (ZeRO-Offload)
    std::uint64_t micro_batch = 1, seq_len = 2048, grad_accum = 1;
    bool activation_checkpointing = false;
    double gpu_memory = 80 * gib;
    double gpu_reserve = 1 * gib;     // CUDA context, library workspaces, allocator slack
    double tokens_per_s_per_gpu = 0;  // 0: from gpu_tflops x mfu
    double gpu_tflops = 0, mfu = 0.4;
    std::string data = "shards";        // shards (pre-tokenized) | text (tokenized on the fly)
    double worker_tokens_per_s = 0;     // 0: the measured figure for `data` (docs/sizing.md)
    double dataset_bytes = 0;           // page cache wanted for the dataset on each node (0: not counted)
    double process_overhead = 4 * gib;  // host memory of one training process besides the above
    std::uint64_t os_cores = feedline::os_reserve_cores;
    std::uint64_t prefetch = 8;  // batches staged per rank (feedline's ring)
};

struct figure {
    std::string name;
    double value = 0;  // bytes, cores, bytes/s or tokens/s (see unit)
    std::string unit;
    std::string rule;
};

struct plan_result {
    double params = 0;
    std::uint64_t ranks = 1;
    std::vector<figure> per_gpu, per_node;
    bool fits = false;
    std::uint64_t min_ranks = 0;  // the fewest data-parallel ranks whose GPUs hold it (0: none)
    const figure& get(const std::string& name) const {
        for (const auto* list : {&per_gpu, &per_node})
            for (const auto& f : *list)
                if (f.name == name) return f;
        throw std::out_of_range("no figure " + name);
    }
};

// Bytes per parameter of each model state (ZeRO's 2 + 2 + K for mixed precision with Adam).
struct state_bytes {
    double params, grads, optimizer;
    std::string rule;
};

inline state_bytes bytes_per_parameter(const plan_input& in) {
    const bool mixed = in.precision != "fp32";
    const bool adam = in.optimizer == "adamw";
    // Mixed precision: fp32 master weights (4) plus Adam's momentum and variance (4 + 4), or SGD's
    // momentum (4). fp32: no master copy.
    const double k = (mixed ? 4.0 : 0.0) + (adam ? 8.0 : 4.0);
    const double w = mixed ? 2.0 : 4.0;
    return {w, w, k,
            std::string(mixed ? "16-bit parameters and gradients (2 + 2 bytes)" : "fp32 parameters and gradients (4 + 4 bytes)") +
                ", optimizer states " + std::to_string(int(k)) + " bytes per parameter (" + (mixed ? "fp32 master weights, " : "") +
                (adam ? "Adam momentum and variance" : "SGD momentum") + "): ZeRO section 3.1"};
}

// 12 l h^2 (1 + 13/(12 h) + (V + s)/(12 l h)) = 12 l h^2 + 13 l h + (V + s) h.
inline double gpt_parameters(std::uint64_t l, std::uint64_t h, std::uint64_t v, std::uint64_t s) {
    const double L = double(l), H = double(h);
    return 12 * L * H * H + 13 * L * H + (double(v) + double(s)) * H;
}

inline void check_input(const plan_input& in) {
    using feedline::config_error;
    auto positive = [](double v, const char* field) {
        if (!(v > 0) || !std::isfinite(v)) throw config_error(field, "must be a positive number (got " + std::to_string(v) + ")");
    };
    auto non_negative = [](double v, const char* field) {
        if (!(v >= 0) || !std::isfinite(v)) throw config_error(field, "must be a number >= 0 (got " + std::to_string(v) + ")");
    };
    const bool shape = in.layers || in.hidden || in.heads || in.vocab;
    if (in.params == 0 && !shape) throw config_error("params", "give --params, or --layers, --hidden, --heads and --vocab");
    if (in.params != 0) positive(in.params, "params");
    if (shape) {
        for (auto [v, f] : {std::pair{in.layers, "layers"}, {in.hidden, "hidden"}, {in.heads, "heads"}, {in.vocab, "vocab"}})
            if (v == 0) throw config_error(f, "the model's shape needs --layers, --hidden, --heads and --vocab, each > 0");
        if (in.hidden % in.heads != 0)
            throw config_error("heads", std::to_string(in.heads) + " does not divide --hidden " + std::to_string(in.hidden));
    }
    if (in.precision != "bf16" && in.precision != "fp16" && in.precision != "fp32")
        throw config_error("precision", "'" + in.precision + "' (expected bf16, fp16 or fp32)");
    if (in.optimizer != "adamw" && in.optimizer != "sgd") throw config_error("optimizer", "'" + in.optimizer + "' (expected adamw or sgd)");
    if (in.data != "shards" && in.data != "text") throw config_error("data", "'" + in.data + "' (expected shards or text)");
    if (in.zero_stage > 3) throw config_error("zero-stage", std::to_string(in.zero_stage) + " (expected 0, 1, 2 or 3)");
    for (auto [v, f] : {std::pair{in.gpus, "gpus"},
                        {in.nodes, "nodes"},
                        {in.micro_batch, "micro-batch"},
                        {in.seq_len, "seq-len"},
                        {in.grad_accum, "grad-accum"},
                        {in.prefetch, "prefetch"}})
        if (v == 0 || v > (std::uint64_t(1) << 32)) throw config_error(f, "must be an integer in [1, 2^32]");
    positive(in.gpu_memory, "gpu-memory");
    non_negative(in.gpu_reserve, "gpu-reserve");
    non_negative(in.tokens_per_s_per_gpu, "tokens-per-s-per-gpu");
    non_negative(in.gpu_tflops, "gpu-tflops");
    if (!(in.mfu > 0 && in.mfu <= 1)) throw config_error("mfu", "must be in (0, 1] (got " + std::to_string(in.mfu) + ")");
    non_negative(in.worker_tokens_per_s, "worker-tokens-per-s");
    non_negative(in.dataset_bytes, "dataset-bytes");
    non_negative(in.process_overhead, "process-overhead");
}

// Tokens per second one feedline worker delivers, measured (docs/benchmarks.md, bench_end_to_end on
// a 16-CPU host with an H100, 2026-11-24): windows from llm.c shards with 1 worker, and JSONL
// tokenized on the fly by libsentencepiece (vocabulary 8000) with 1 worker. feedline's own encoder,
// the default since, was 6.3x the library in the same measurement on the 2-vCPU VM (2026-11-25); this
// stays the library's host figure, an overestimate of the workers text needs, until measured there.
inline constexpr double measured_shard_worker_tokens_per_s = 645e6;
inline constexpr double measured_text_worker_tokens_per_s = 2.27e6;
// Bytes read per token: uint16 shards; the demo's JSONL (7.98 MB for 2.94 M tokens).
inline constexpr double shard_bytes_per_token = 2.0, text_bytes_per_token = 2.7;

inline plan_result make_plan(const plan_input& in) {
    check_input(in);
    plan_result r;
    const bool shape = in.layers != 0;
    r.params = in.params != 0 ? in.params : gpt_parameters(in.layers, in.hidden, in.vocab, in.seq_len);
    const std::string params_rule = in.params != 0 ? "--params" : "12 l h^2 + 13 l h + (V + s) h (Megatron-LM, Narayanan et al. 2021)";
    r.ranks = in.gpus * in.nodes;
    const double nd = double(r.ranks), psi = r.params;
    const state_bytes b = bytes_per_parameter(in);
    const unsigned z = in.zero_stage;

    // Model states per GPU: what stage z partitions is divided by Nd; offloaded optimizer states
    // leave the GPU for host memory.
    auto states_on_gpu = [&](double ranks) {
        const double p = psi * b.params / (z >= 3 ? ranks : 1.0);
        const double g = psi * b.grads / (z >= 2 ? ranks : 1.0);
        const double o = in.offload_optimizer ? 0.0 : psi * b.optimizer / (z >= 1 ? ranks : 1.0);
        return std::array<double, 3>{p, g, o};
    };
    const auto st = states_on_gpu(nd);
    const std::string part = "ZeRO stage " + std::to_string(z) + " over " + std::to_string(r.ranks) + " rank(s)";
    r.per_gpu.push_back({"parameters", st[0], "bytes",
                         std::to_string(int(b.params)) + " bytes x " + params_rule + (z >= 3 ? ", / Nd (" + part + ")" : "")});
    r.per_gpu.push_back(
        {"gradients", st[1], "bytes", std::to_string(int(b.grads)) + " bytes per parameter" + (z >= 2 ? ", / Nd (" + part + ")" : "")});
    r.per_gpu.push_back({"optimizer_states", st[2], "bytes",
                         in.offload_optimizer ? "offloaded to host memory" : b.rule + (z >= 1 ? ", / Nd (" + part + ")" : "")});

    // Activations of one micro-batch, 16-bit (twice that in fp32).
    double act = 0;
    std::string act_rule = "not computed: needs the model's shape (--layers, --hidden, --heads, --vocab)";
    if (shape) {
        const double s = double(in.seq_len), bb = double(in.micro_batch), h = double(in.hidden), a = double(in.heads),
                     l = double(in.layers);
        const double per_layer = s * bb * h * (34 + 5 * a * s / h) * (in.precision == "fp32" ? 2.0 : 1.0);
        if (in.activation_checkpointing) {
            act = l * 2 * s * bb * h * (in.precision == "fp32" ? 2.0 : 1.0) + per_layer;
            act_rule =
                "2 s b h per layer (each layer's input) + one layer's s b h (34 + 5 a s / h) while recomputed (Korthikanti et al. 2022)";
        } else {
            act = l * per_layer;
            act_rule = "s b h (34 + 5 a s / h) bytes per layer, no recomputation (Korthikanti et al. 2022, section 4.1)";
        }
    }
    r.per_gpu.push_back({"activations", act, "bytes", act_rule});
    r.per_gpu.push_back({"reserve", in.gpu_reserve, "bytes", "--gpu-reserve: CUDA context, library workspaces, allocator slack"});
    const double used = st[0] + st[1] + st[2] + act + in.gpu_reserve;
    r.per_gpu.push_back({"gpu_memory_needed", used, "bytes", "model states + activations + reserve"});
    r.per_gpu.push_back({"gpu_memory_margin", in.gpu_memory - used, "bytes", "--gpu-memory minus what is needed (negative: does not fit)"});
    r.fits = used <= in.gpu_memory;

    // The fewest ranks that fit: only partitioned states shrink with Nd.
    auto fits_with = [&](double ranks) {
        const auto x = states_on_gpu(ranks);
        return x[0] + x[1] + x[2] + act + in.gpu_reserve <= in.gpu_memory;
    };
    const auto at_infinity = states_on_gpu(std::numeric_limits<double>::infinity());  // what no number of ranks divides
    const double unpartitioned = at_infinity[0] + at_infinity[1] + at_infinity[2];
    if (unpartitioned + act + in.gpu_reserve > in.gpu_memory) {
        r.min_ranks = 0;
        std::string why = "--zero-stage " + std::to_string(z) + (in.offload_optimizer ? " with the optimizer offloaded" : "") + ": ";
        why += fmt::format(
            "what no number of GPUs divides ({:.2f} GiB of model states, {:.2f} GiB of activations, {:.2f} GiB reserve) exceeds "
            "--gpu-memory {:.2f} GiB",
            unpartitioned / gib, act / gib, in.gpu_reserve / gib, in.gpu_memory / gib);
        throw feedline::config_error("gpu-memory", why + "; raise the ZeRO stage, offload, checkpoint activations or lower --micro-batch");
    }
    std::uint64_t lo = 1, hi = 1;
    while (!fits_with(double(hi))) {
        if (hi >= (std::uint64_t(1) << 40))  // only on the exact boundary of the check above
            throw feedline::config_error("gpu-memory", "the job fits on no number of GPUs below 2^40 with these settings");
        hi *= 2;
    }
    while (lo < hi) {
        const std::uint64_t mid = lo + (hi - lo) / 2;
        if (fits_with(double(mid)))
            hi = mid;
        else
            lo = mid + 1;
    }
    r.min_ranks = lo;

    // Training rate and the data it consumes.
    const double flops_per_token = (in.activation_checkpointing ? 8.0 : 6.0) * psi;
    double rate = in.tokens_per_s_per_gpu;
    std::string rate_rule = "--tokens-per-s-per-gpu";
    if (rate == 0 && in.gpu_tflops > 0) {
        rate = in.gpu_tflops * 1e12 * in.mfu / flops_per_token;
        rate_rule = "--gpu-tflops x --mfu / (" + std::string(in.activation_checkpointing ? "8" : "6") + " x parameters) FLOPs per token";
    }
    const double per_worker = in.worker_tokens_per_s > 0 ? in.worker_tokens_per_s
                              : in.data == "text"        ? measured_text_worker_tokens_per_s
                                                         : measured_shard_worker_tokens_per_s;
    const std::string worker_rule = in.worker_tokens_per_s > 0
                                        ? "--worker-tokens-per-s"
                                        : "measured: one feedline worker, " +
                                              std::string(in.data == "text" ? "JSONL tokenized on the fly" : "token shards") +
                                              ", docs/benchmarks.md (measure yours: bench_end_to_end)";
    const double node_rate = rate * double(in.gpus);
    const double workers_per_node = rate > 0 ? std::ceil(node_rate / per_worker) : 0;
    const double bytes_per_token = in.data == "text" ? text_bytes_per_token : shard_bytes_per_token;

    // Host memory per node.
    const double offloaded = in.offload_optimizer ? psi * b.optimizer / (z >= 1 ? nd : 1.0) * double(in.gpus) : 0;
    const double batch_bytes = double(in.micro_batch) * double(in.seq_len) * 4 * 2;  // int32 inputs + targets
    const double pinned = batch_bytes * double(in.prefetch) * double(in.gpus);
    r.per_node.push_back({"tokens_per_s", node_rate, "tokens/s",
                          rate > 0 ? rate_rule + " x GPUs per node" : "not computed: give --tokens-per-s-per-gpu or --gpu-tflops"});
    r.per_node.push_back({"data_workers", workers_per_node, "cores",
                          rate > 0
                              ? "tokens/s per node / " + fmt::format("{:.3g}", per_worker) + " tokens/s per worker (" + worker_rule + ")"
                              : "not computed: no training rate"});
    r.per_node.push_back({"cpu_cores", double(in.gpus) + workers_per_node + double(in.os_cores), "cores",
                          "one training process per GPU + data workers + " + std::to_string(in.os_cores) + " for the OS"});
    r.per_node.push_back({"host_offloaded_states", offloaded, "bytes",
                          in.offload_optimizer ? "optimizer states of the node's ranks (" + part + ")" : "no offload"});
    r.per_node.push_back(
        {"host_pinned_staging", pinned, "bytes", "--prefetch batches of micro-batch x seq-len int32 inputs and targets per GPU"});
    r.per_node.push_back(
        {"host_page_cache", in.dataset_bytes, "bytes",
         in.dataset_bytes > 0 ? "--dataset-bytes (the dataset kept in the page cache)" : "not counted: give --dataset-bytes"});
    r.per_node.push_back({"host_processes", in.process_overhead * double(in.gpus), "bytes", "--process-overhead per training process"});
    double host = 0;
    for (const auto& f : r.per_node)
        if (f.name.rfind("host_", 0) == 0) host += f.value;
    r.per_node.push_back({"host_memory", host, "bytes", "offloaded states + pinned staging + page cache + processes"});
    r.per_node.push_back({"read_bandwidth", node_rate * bytes_per_token, "bytes/s",
                          "tokens/s per node x " + std::to_string(bytes_per_token).substr(0, 3) + " bytes per token (" +
                              (in.data == "text" ? "the demo corpus's JSONL" : "uint16 shards") + ")"});
    return r;
}

}  // namespace feedline::doctor
