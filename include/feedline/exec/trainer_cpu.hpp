// feedline/exec/trainer_cpu.hpp: keeps the threads that fill the staging ring off the CPU the trainer
// runs on, when the process has a CPU to spare for the trainer.
//
// Why: a producer that waits for a free slot sleeps and is woken by the trainer releasing one. The
// kernel tends to run a woken thread on the waker's CPU when the other CPUs look busy, and on a
// virtual machine an idle vCPU looks busy (the host has descheduled it, so the guest sees it as
// preempted). The producer then shares the trainer's CPU and runs only when the trainer blocks: the
// ring drains and a trainer that keeps its CPU busy (a CPU step, a spinning GPU sync) stalls once per
// pass through the ring. Measured on a 2-vCPU VM with one worker and a trainer step of twice a
// batch's production time: the trainer waited ~75 us every `depth` batches (p99 75-120 us, 5-8% of
// its time) with the worker on its CPU, and p99 ~8 us, 0.1% with the worker kept off it
// (docs/benchmarks.md).
//
// How: the trainer notes its CPU at next() when it has been busy between batches (pipeline/detail/delivery.hpp
// decides; sched_getcpu reads the CPU from glibc's rseq area or the vDSO, without a system call);
// each producer compares it, once per batch, with the CPU it excluded last and, only when it changed,
// sets its own affinity to the CPUs the trainer's thread could use when the pipeline started, minus
// that one. Enabled only when those CPUs outnumber the producers: with as many producers as CPUs,
// confining them to one CPU fewer would cost them more than the trainer gains. The trainer's thread is
// never pinned.
#pragma once

#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

namespace feedline {

class trainer_cpu {
public:
    // Disabled until start().
    trainer_cpu() { CPU_ZERO(&allowed_); }
    trainer_cpu(const trainer_cpu&) = delete;
    trainer_cpu& operator=(const trainer_cpu&) = delete;

    // On the trainer's thread, before the producers start: reads the CPUs this thread (and so the
    // threads it creates) may use, within `producer_cpus` when given (the GPU's local CPUs, where the
    // producers run); enables the placement when they outnumber `producers` (and `wanted`).
    void start(unsigned producers, bool wanted = true, const std::vector<int>& producer_cpus = {}) {
        CPU_ZERO(&allowed_);
        allowed_count_ = 0;
        process_count_ = 0;
        if (::sched_getaffinity(0, sizeof allowed_, &allowed_) == 0) {
            process_count_ = CPU_COUNT(&allowed_);
            if (!producer_cpus.empty()) {
                cpu_set_t within;
                CPU_ZERO(&within);
                for (int c : producer_cpus)
                    if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &within);
                CPU_AND(&allowed_, &allowed_, &within);
            }
            allowed_count_ = CPU_COUNT(&allowed_);
        }
        producers_ = producers;
        wanted_ = wanted;
        enabled_.store(wanted && allowed_count_ > static_cast<int>(producers), std::memory_order_relaxed);
    }

    // Trainer: called at a next() that followed a busy step (pipeline/detail/delivery.hpp). A relaxed
    // store when the CPU changed, nothing otherwise.
    void note() noexcept {
        if (!enabled_.load(std::memory_order_relaxed)) return;
        const int cpu = ::sched_getcpu();
        if (cpu >= 0 && cpu != cpu_.load(std::memory_order_relaxed)) cpu_.store(cpu, std::memory_order_relaxed);
    }

    // Producer: called once per batch with the thread's own `excluded` (start it at -1). Re-pins the
    // calling thread only when the trainer moved since the last call. A failure (a seccomp policy, a
    // cpuset that changed under the process) turns the placement off for every thread, with its reason.
    void keep_off(int& excluded) noexcept {
        if (!enabled_.load(std::memory_order_relaxed)) return;
        const int cpu = cpu_.load(std::memory_order_relaxed);
        if (cpu < 0 || cpu == excluded || !CPU_ISSET(cpu, &allowed_)) return;
        cpu_set_t set = allowed_;
        CPU_CLR(cpu, &set);
        if (const int rc = ::pthread_setaffinity_np(::pthread_self(), sizeof set, &set); rc != 0) {
            int none = 0;
            failure_.compare_exchange_strong(none, rc);
            enabled_.store(false, std::memory_order_relaxed);
            return;
        }
        excluded = cpu;
    }

    bool enabled() const noexcept { return enabled_.load(std::memory_order_relaxed); }
    // The CPUs the trainer's thread may use, read at start(), the GPU's local ones or not (0: the
    // affinity mask was unreadable).
    int cpus() const noexcept { return process_count_; }
    // The trainer's CPU as last noted (-1: not noted, or the placement is off).
    int trainer() const noexcept { return enabled() ? cpu_.load(std::memory_order_relaxed) : -1; }

    // One line for stats: what the producers do and why.
    std::string describe() const {
        const std::string n = std::to_string(allowed_count_), p = std::to_string(producers_);
        if (!wanted_) return "left to the kernel (avoid_trainer_cpu = false)";
        if (const int rc = failure_.load(); rc != 0)
            return "may share the trainer's CPU: setting a worker's affinity failed (" + std::string(std::strerror(rc)) + ")";
        if (allowed_count_ == 0) return "may share the trainer's CPU: the CPU affinity mask is unreadable";
        if (!enabled()) return "may share the trainer's CPU: " + p + " producer thread(s) for " + n + " CPU(s), none to spare";
        if (const int cpu = cpu_.load(std::memory_order_relaxed); cpu >= 0)
            return "off the trainer's CPU (now " + std::to_string(cpu) + "): " + p + " producer thread(s) on the other " +
                   std::to_string(allowed_count_ - 1) + " of " + n + " CPUs";
        return "unpinned until the trainer is busy between batches: " + p + " producer thread(s), " + n + " CPUs";
    }

private:
    cpu_set_t allowed_;
    int allowed_count_ = 0;  // within producer_cpus
    int process_count_ = 0;  // the whole affinity mask
    unsigned producers_ = 0;
    bool wanted_ = true;
    std::atomic<bool> enabled_{false};
    std::atomic<int> cpu_{-1};
    std::atomic<int> failure_{0};  // the first pthread_setaffinity_np error
};

}  // namespace feedline
