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
// - Host memory for the model: DeepSpeed's estimate_zero2_model_states_mem_needs
//   (deepspeed/runtime/zero/stage_1_and_2.py): without offload, each process holds the fp32 weights
//   (4 bytes per parameter) while a checkpoint loads or the model is built; with ZeRO-Offload, 16 bytes
//   per parameter of the node's partitions (fp32 master weights, Adam's two moments, fp32 gradients),
//   whichever is more, times 1.5 for buffers and fragmentation.
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
    std::uint64_t prefetch = 8;        // batches staged per rank (feedline's ring)
    double cpu_adam_params_per_s = 0;  // an offloaded optimizer's update rate per core; 0: the measured figure
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
    // When it does not fit: the changes that make it fit, each evaluated (e.g. "--zero-stage 3: fits on
    // 12 or more GPUs"), most direct first; empty when nothing within reach does.
    std::vector<std::string> would_fit;
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
    non_negative(in.cpu_adam_params_per_s, "cpu-adam-params-per-s");
}

// Tokens per second one feedline worker delivers, measured (docs/benchmarks.md, bench_end_to_end on
// a 16-CPU host with an H100, 2026-11-24): windows from llm.c shards with 1 worker, and JSONL
// tokenized on the fly by libsentencepiece (vocabulary 8000) with 1 worker. feedline's own encoder,
// the default since, was 6.3x the library in the same measurement on the 2-vCPU VM (2026-11-25); this
// stays the library's host figure, an overestimate of the workers text needs, until measured there.
inline constexpr double measured_shard_worker_tokens_per_s = 645e6;
inline constexpr double measured_text_worker_tokens_per_s = 2.27e6;
// Parameters one core updates per second as an offloaded optimizer: AdamW over fp32 states writing a
// 16-bit copy (measure_cpu_adam, feedline-doctor check --data; docs/benchmarks.md, 2-vCPU VM,
// 2026-11-27). Memory-bound, so a server core with more bandwidth per core updates more.
inline constexpr double measured_cpu_adam_params_per_s_per_core = 3.9e8;
// Bytes an offloaded update moves per parameter: fp32 weights, momentum and variance read and written
// (24), the fp32 gradient read (4), the 16-bit copy written (2). SGD with momentum: 8 fewer (no variance).
inline constexpr double cpu_adam_bytes_per_param = 30, cpu_sgd_bytes_per_param = 22;
// Bytes read per token: uint16 shards; the demo's JSONL (7.98 MB for 2.94 M tokens).
inline constexpr double shard_bytes_per_token = 2.0, text_bytes_per_token = 2.7;

namespace detail {

// Model states on one GPU with `ranks` data-parallel ranks: what stage z partitions is divided by
// them; an offloaded optimizer takes its states and the gradients to host memory.
inline std::array<double, 3> states_on_gpu(const plan_input& in, double psi, double ranks) {
    const state_bytes b = bytes_per_parameter(in);
    const unsigned z = in.zero_stage;
    const double p = psi * b.params / (z >= 3 ? ranks : 1.0);
    const double g = in.offload_optimizer ? 0.0 : psi * b.grads / (z >= 2 ? ranks : 1.0);
    const double o = in.offload_optimizer ? 0.0 : psi * b.optimizer / (z >= 1 ? ranks : 1.0);
    return {p, g, o};
}

// Activations of one micro-batch, 16-bit (twice that in fp32); 0 without the model's shape.
inline double activation_bytes(const plan_input& in) {
    if (in.layers == 0) return 0;
    const double s = double(in.seq_len), bb = double(in.micro_batch), h = double(in.hidden), a = double(in.heads), l = double(in.layers);
    const double width = in.precision == "fp32" ? 2.0 : 1.0;
    const double per_layer = s * bb * h * (34 + 5 * a * s / h) * width;
    return in.activation_checkpointing ? l * 2 * s * bb * h * width + per_layer : l * per_layer;
}

// The fewest data-parallel ranks whose GPUs hold the job (only partitioned states shrink with them);
// 0 when what no number of ranks divides already exceeds a GPU.
inline std::uint64_t min_ranks(const plan_input& in, double psi) {
    const double act = activation_bytes(in);
    auto fits_with = [&](double ranks) {
        const auto x = states_on_gpu(in, psi, ranks);
        return x[0] + x[1] + x[2] + act + in.gpu_reserve <= in.gpu_memory;
    };
    if (!fits_with(std::numeric_limits<double>::infinity())) return 0;
    std::uint64_t lo = 1, hi = 1;
    while (!fits_with(double(hi))) {
        if (hi >= (std::uint64_t(1) << 40)) return 0;  // only on the exact boundary of the check above
        hi *= 2;
    }
    while (lo < hi) {
        const std::uint64_t mid = lo + (hi - lo) / 2;
        if (fits_with(double(mid)))
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

}  // namespace detail

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

    const auto st = detail::states_on_gpu(in, psi, nd);
    const std::string part = "ZeRO stage " + std::to_string(z) + " over " + std::to_string(r.ranks) + " rank(s)";
    r.per_gpu.push_back({"parameters", st[0], "bytes",
                         std::to_string(int(b.params)) + " bytes x " + params_rule + (z >= 3 ? ", / Nd (" + part + ")" : "")});
    r.per_gpu.push_back({"gradients", st[1], "bytes",
                         in.offload_optimizer
                             ? "offloaded with the optimizer (ZeRO-Offload): moved to host memory as they are reduced"
                             : std::to_string(int(b.grads)) + " bytes per parameter" + (z >= 2 ? ", / Nd (" + part + ")" : "")});
    r.per_gpu.push_back({"optimizer_states", st[2], "bytes",
                         in.offload_optimizer ? "offloaded to host memory" : b.rule + (z >= 1 ? ", / Nd (" + part + ")" : "")});
    r.per_gpu.push_back({"model_states", st[0] + st[1] + st[2], "bytes",
                         "parameters + gradients + optimizer states (the ZeRO paper's total: 16 Ψ, 4 Ψ + 12 Ψ / Nd, 2 Ψ + 14 Ψ / Nd, "
                         "16 Ψ / Nd for stages 0-3 with mixed-precision Adam)"});

    const double act = detail::activation_bytes(in);
    const std::string act_rule =
        !shape ? "not computed: needs the model's shape (--layers, --hidden, --heads, --vocab)"
        : in.activation_checkpointing
            ? "2 s b h per layer (each layer's input) + one layer's s b h (34 + 5 a s / h) while recomputed (Korthikanti et al. 2022)"
            : "s b h (34 + 5 a s / h) bytes per layer, no recomputation (Korthikanti et al. 2022, section 4.1)";
    r.per_gpu.push_back({"activations", act, "bytes", act_rule});
    r.per_gpu.push_back({"reserve", in.gpu_reserve, "bytes", "--gpu-reserve: CUDA context, library workspaces, allocator slack"});
    const double used = st[0] + st[1] + st[2] + act + in.gpu_reserve;
    r.per_gpu.push_back({"gpu_memory_needed", used, "bytes", "model states + activations + reserve"});
    r.per_gpu.push_back({"gpu_memory_margin", in.gpu_memory - used, "bytes", "--gpu-memory minus what is needed (negative: does not fit)"});
    r.fits = used <= in.gpu_memory;
    r.min_ranks = detail::min_ranks(in, psi);

    // Not fitting: what would, each change evaluated on its own (a reader acts on one at a time).
    if (!r.fits) {
        auto ranks_text = [](std::uint64_t n) { return fmt::format("{} data-parallel rank{}", n, n == 1 ? "" : "s"); };
        if (r.min_ranks != 0)
            r.would_fit.push_back(fmt::format("more GPUs: it fits on {} or more (now {})", ranks_text(r.min_ranks), r.ranks));
        auto consider = [&](const std::string& change, auto edit) {
            plan_input x = in;
            edit(x);
            const std::uint64_t n = detail::min_ranks(x, psi);
            if (n == 0) return;
            r.would_fit.push_back(n <= r.ranks ? change + ": fits as planned (" + ranks_text(r.ranks) + ")"
                                               : change + ": fits on " + ranks_text(n) + " or more");
        };
        for (unsigned stage = z + 1; stage <= 3; ++stage)
            consider("--zero-stage " + std::to_string(stage), [&](plan_input& x) { x.zero_stage = stage; });
        if (!in.offload_optimizer)
            consider(std::string("--offload-optimizer") + (z == 0 ? " --zero-stage 1" : ""), [](plan_input& x) {
                x.offload_optimizer = true;
                x.zero_stage = std::max(x.zero_stage, 1u);
            });
        if (shape && !in.activation_checkpointing)
            consider("--activation-checkpointing", [](plan_input& x) { x.activation_checkpointing = true; });
        if (shape && in.micro_batch > 1)
            consider("--micro-batch 1 (with --grad-accum x " + std::to_string(in.micro_batch) + " to keep the global batch)",
                     [](plan_input& x) { x.micro_batch = 1; });
    }

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
    // Each GPU's process runs its own workers, at least one: the count check and diagnose need too.
    const double workers_per_gpu = std::max(1.0, rate > 0 ? std::ceil(rate / per_worker) : 1.0);
    const double workers_per_node = workers_per_gpu * double(in.gpus);
    const double bytes_per_token = in.data == "text" ? text_bytes_per_token : shard_bytes_per_token;

    // Host memory per node.
    const double offloaded = in.offload_optimizer ? psi * (b.optimizer + 4) / (z >= 1 ? nd : 1.0) * double(in.gpus) : 0;
    const double checkpoint_peak = 4 * psi * double(in.gpus);
    const double host_states = 1.5 * std::max(checkpoint_peak, offloaded);
    const double batch_bytes = double(in.micro_batch) * double(in.seq_len) * 4 * 2;  // int32 inputs + targets
    const double pinned = batch_bytes * double(in.prefetch) * double(in.gpus);
    r.per_node.push_back({"tokens_per_s", node_rate, "tokens/s",
                          rate > 0 ? rate_rule + " x GPUs per node" : "not computed: give --tokens-per-s-per-gpu or --gpu-tflops"});
    r.per_node.push_back(
        {"data_workers", workers_per_node, "cores",
         rate > 0 ? "GPUs x max(1, tokens/s per GPU / " + fmt::format("{:.3g}", per_worker) + " tokens/s per worker (" + worker_rule + "))"
                  : "GPUs x 1 (no training rate given: one worker per GPU's process)"});
    // An offloaded optimizer updates the node's partitions on its CPUs once per step: cores enough to
    // do it within one GPU step, which ZeRO-Offload's delayed parameter update hides behind the next
    // step (without it, the update adds to every step).
    double optimizer_cores = 0;
    if (in.offload_optimizer) {
        const double params_node = psi / (z >= 1 ? nd : 1.0) * double(in.gpus);
        const double adam = in.cpu_adam_params_per_s > 0 ? in.cpu_adam_params_per_s : measured_cpu_adam_params_per_s_per_core;
        const std::string adam_rule = fmt::format("{:.3g} parameters/s per core ({})", adam,
                                                  in.cpu_adam_params_per_s > 0 ? "--cpu-adam-params-per-s"
                                                                               : "measured: CPU Adam on one core, docs/benchmarks.md; "
                                                                                 "measure yours: feedline-doctor check --data");
        const double step_s = rate > 0 ? double(in.micro_batch) * double(in.grad_accum) * double(in.seq_len) / rate : 0;
        if (step_s > 0) {
            optimizer_cores = std::max(double(in.gpus), std::ceil(params_node / (adam * step_s)));
            r.per_node.push_back({"optimizer_cores", optimizer_cores, "cores",
                                  fmt::format("the node's optimizer partitions ({:.3g} parameters) updated at {} within one GPU step "
                                              "({:.3g} s: micro-batch x accumulation x seq-len / tokens/s per GPU), at least one per "
                                              "GPU's process",
                                              params_node, adam_rule, step_s)});
            const bool sgd = in.optimizer == "sgd";
            r.per_node.push_back(
                {"optimizer_bandwidth", params_node * (sgd ? cpu_sgd_bytes_per_param : cpu_adam_bytes_per_param) / step_s, "bytes/s",
                 fmt::format("the update's memory traffic within one GPU step ({:g} bytes per parameter: fp32 weights, momentum{} read "
                             "and written, the gradient read, the 16-bit copy written); past the node's memory bandwidth more cores do "
                             "not help{}",
                             sgd ? cpu_sgd_bytes_per_param : cpu_adam_bytes_per_param, sgd ? "" : " and variance",
                             sgd ? " (the cores assume Adam's rate: an upper bound for SGD)" : "")});
        } else {
            optimizer_cores = double(in.gpus);
            r.per_node.push_back(
                {"optimizer_cores", optimizer_cores, "cores",
                 "one per GPU's process; not computed from the step (give --tokens-per-s-per-gpu or --gpu-tflops): " + adam_rule});
        }
    }
    r.per_node.push_back({"cpu_cores", double(in.gpus) + workers_per_node + optimizer_cores + double(in.os_cores), "cores",
                          "one training process per GPU + data workers + " +
                              (in.offload_optimizer ? std::string("the offloaded optimizer's + ") : std::string()) +
                              std::to_string(in.os_cores) + " for the OS (the count feedline-doctor check uses)"});
    r.per_node.push_back({"checkpoint_peak", checkpoint_peak, "bytes",
                          "fp32 weights (4 bytes per parameter) in each GPU's process while a checkpoint loads or the model is built"});
    r.per_node.push_back({"offloaded_states", offloaded, "bytes",
                          in.offload_optimizer ? "fp32 gradients and optimizer states, " + std::to_string(int(b.optimizer + 4)) +
                                                     " bytes per parameter of the node's partitions (" + part + ")"
                                               : "no offload"});
    r.per_node.push_back({"host_model_states", host_states, "bytes",
                          "1.5 x the larger of the two above (DeepSpeed's estimate_zero2_model_states_mem_needs: buffers, fragmentation)"});
    r.per_node.push_back(
        {"host_pinned_staging", pinned, "bytes", "--prefetch batches of micro-batch x seq-len int32 inputs and targets per GPU"});
    r.per_node.push_back(
        {"host_page_cache", in.dataset_bytes, "bytes",
         in.dataset_bytes > 0 ? "--dataset-bytes (the dataset kept in the page cache)" : "not counted: give --dataset-bytes"});
    r.per_node.push_back({"host_processes", in.process_overhead * double(in.gpus), "bytes", "--process-overhead per training process"});
    double host = 0;
    for (const auto& f : r.per_node)
        if (f.name.rfind("host_", 0) == 0) host += f.value;
    r.per_node.push_back({"host_memory", host, "bytes", "model states on the host + pinned staging + page cache + processes"});
    r.per_node.push_back({"read_bandwidth", node_rate * bytes_per_token, "bytes/s",
                          "tokens/s per node x " + std::to_string(bytes_per_token).substr(0, 3) + " bytes per token (" +
                              (in.data == "text" ? "the demo corpus's JSONL" : "uint16 shards") + ")"});
    return r;
}

}  // namespace feedline::doctor
