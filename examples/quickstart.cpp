// quickstart: the smallest complete use of feedline. Streams [8, 256] token batches from a packed
// dataset to the GPU (or host memory without one), resumes from a checkpoint, prints where time went.
// Usage: quickstart DATASET [STEPS]
#include <feedline/pipeline.hpp>

#include <cstdio>
#include <string>

int main(int argc, char** argv) try {
    if (argc < 2) return std::fprintf(stderr, "usage: quickstart DATASET [STEPS]\n"), 2;
    const std::uint64_t steps = argc > 2 ? std::stoull(argv[2]) : 100;
    feedline::pipeline data(argv[1], {.batch_size = 8, .seq_len = 256, .seed = 42, .max_steps = steps});

    std::uint64_t checksum = 0;
    for (feedline::batch& b : data) {
        b.wait_on(nullptr);  // GPU: your compute stream waits for the copy (no host sync); CPU: no-op
        // ... the training step reads b.inputs() and b.targets(): [8, 256] int32, on the device ...
        for (std::int32_t t : b.host_inputs()) checksum += static_cast<std::uint64_t>(t);
        if (b.step() == steps / 2) std::printf("checkpoint: %s\n", feedline::to_json(data.state()).c_str());
    }
    std::printf("%llu batches, input checksum %llu\n", static_cast<unsigned long long>(data.stats().batches),
                static_cast<unsigned long long>(checksum));
    std::printf("%s\n", data.stats().to_json().c_str());
    // Resume: a new pipeline, data.restore(feedline::pipeline_state_from_json(saved)), same batches on.
    return 0;
} catch (const feedline::error& e) {  // bad data or config: the message names the file, offset or field
    std::fprintf(stderr, "quickstart: %s\n", e.what());
    return 1;
} catch (const std::exception& e) {  // out of memory (std::bad_alloc) and the like
    std::fprintf(stderr, "quickstart: %s\n", e.what());
    return 1;
}
