// trainer/communicator.hpp: the ranks of a data-parallel run, through MPI (Open MPI's mpirun starts
// them; no home-made launcher or collectives). Without MPI in the build, or when not started by
// mpirun, it is one rank and every collective is the identity.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#ifdef FEEDLINE_TRAINER_MPI
#include <mpi.h>
#endif

#include <feedline/sampling/sampler.hpp>

namespace trainer {

class communicator {
public:
    communicator(int* argc, char*** argv) {
        const feedline::launch_info env = feedline::launch_from_environment();
#ifdef FEEDLINE_TRAINER_MPI
        if (env.world_size > 1) {
            check(MPI_Init(argc, argv), "MPI_Init");
            initialized_ = true;
            MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
            MPI_Comm_size(MPI_COMM_WORLD, &size_);
            local_rank_ = env.local_rank;
            return;
        }
#else
        (void)argc;
        (void)argv;
        if (env.world_size > 1)
            throw std::runtime_error("launched as rank " + std::to_string(env.rank) + " of " + std::to_string(env.world_size) + " (" +
                                     env.source + ") but this feedline-train was built without MPI (install libopenmpi-dev and rebuild)");
#endif
    }
    communicator(const communicator&) = delete;
    communicator& operator=(const communicator&) = delete;
    ~communicator() {
#ifdef FEEDLINE_TRAINER_MPI
        if (initialized_) MPI_Finalize();
#endif
    }

    int rank() const noexcept { return rank_; }
    int size() const noexcept { return size_; }
    int local_rank() const noexcept { return local_rank_; }

    void allreduce_sum(float* data, std::size_t n) { reduce(data, n, /*is_double=*/false); }
    void allreduce_sum(double* data, std::size_t n) { reduce(data, n, /*is_double=*/true); }

    // Rank 0's bytes on every rank (e.g. NCCL's unique id).
    void broadcast(void* data, std::size_t bytes) {
#ifdef FEEDLINE_TRAINER_MPI
        if (size_ > 1) check(MPI_Bcast(data, static_cast<int>(bytes), MPI_BYTE, 0, MPI_COMM_WORLD), "MPI_Bcast");
#else
        (void)data;
        (void)bytes;
#endif
    }
    // Every rank's `bytes` bytes, in rank order, on every rank.
    std::vector<std::byte> allgather(const void* mine, std::size_t bytes) {
        std::vector<std::byte> all(bytes * static_cast<std::size_t>(size_));
#ifdef FEEDLINE_TRAINER_MPI
        if (size_ > 1) {
            check(MPI_Allgather(mine, static_cast<int>(bytes), MPI_BYTE, all.data(), static_cast<int>(bytes), MPI_BYTE, MPI_COMM_WORLD),
                  "MPI_Allgather");
            return all;
        }
#endif
        std::memcpy(all.data(), mine, bytes);
        return all;
    }
    // Ends every rank (after an error on this one, the others may be blocked in a collective).
    void abort(int code) noexcept {
#ifdef FEEDLINE_TRAINER_MPI
        if (size_ > 1) MPI_Abort(MPI_COMM_WORLD, code);
#else
        (void)code;
#endif
    }
    void barrier() {
#ifdef FEEDLINE_TRAINER_MPI
        if (size_ > 1) check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
#endif
    }

private:
    void reduce(void* data, std::size_t n, bool is_double) {
#ifdef FEEDLINE_TRAINER_MPI
        if (size_ <= 1) return;
        // MPI counts are int: large buffers go in pieces.
        constexpr std::size_t piece = std::size_t(1) << 30;
        auto* bytes = static_cast<char*>(data);
        const std::size_t width = is_double ? sizeof(double) : sizeof(float);
        for (std::size_t at = 0; at < n; at += piece) {
            const int count = static_cast<int>(std::min(piece, n - at));
            check(MPI_Allreduce(MPI_IN_PLACE, bytes + at * width, count, is_double ? MPI_DOUBLE : MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD),
                  "MPI_Allreduce");
        }
#else
        (void)data;
        (void)n;
        (void)is_double;
#endif
    }
#ifdef FEEDLINE_TRAINER_MPI
    static void check(int rc, const char* what) {
        if (rc != MPI_SUCCESS) throw std::runtime_error(std::string(what) + " failed with MPI error " + std::to_string(rc));
    }
    bool initialized_ = false;
#endif
    int rank_ = 0, size_ = 1, local_rank_ = 0;
};

}  // namespace trainer
