// Topology: the exact machine description and worker recommendation read from fixture trees of a
// 2-socket 8-GPU server, a 1-node VM and a cgroup-limited container; the live machine read through
// libnuma agrees with sysfs; the pipeline's worker policy follows from them; NUMA buffers say how they
// were placed; producer threads leave the trainer's CPU when the process has one to spare.
#include <doctest/doctest.h>

#include <feedline/device/nvml.hpp>
#include <feedline/exec/host_memory.hpp>
#include <feedline/exec/numa_memory.hpp>
#include <feedline/exec/topology.hpp>
#include <feedline/exec/trainer_cpu.hpp>
#include <feedline/pipeline/pipeline.hpp>
#include <feedline/storage/mmap_reader.hpp>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "test_support.hpp"

using namespace feedline;
namespace ft = feedline::test;

namespace {
topology fixture(const std::string& name) {
    return read_topology({.root = std::string(FEEDLINE_SOURCE_DIR) + "/tests/fixtures/topology/" + name});
}
std::vector<int> range(int lo, int hi) {
    std::vector<int> v;
    for (int i = lo; i <= hi; ++i) v.push_back(i);
    return v;
}
}  // namespace

TEST_CASE("Topology.CpuList.ParsesAndFormats") {
    CHECK(detail::parse_cpu_list("0-3,8,10-11\n") == std::vector<int>{0, 1, 2, 3, 8, 10, 11});
    CHECK(detail::format_cpu_list({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11");
    CHECK(detail::parse_cpu_list("").empty());
    CHECK_THROWS_AS(detail::parse_cpu_list("3-1"), config_error);
    CHECK_THROWS_AS(detail::parse_cpu_list("a-b"), config_error);
}

TEST_CASE("Topology.Fixture.TwoSocketsEightGpus") {
    auto t = fixture("two_socket_8gpu");
    CHECK(t.online_cpus == range(0, 63));
    CHECK(t.allowed_cpus == range(0, 63));
    CHECK_FALSE(t.cgroup_cpu_quota.has_value());
    CHECK_FALSE(t.cgroup_memory_max.has_value());
    REQUIRE(t.nodes.size() == 2);
    CHECK(t.nodes[1].cpus == range(32, 63));
    CHECK(t.nodes[0].memory_bytes == 256ull << 30);
    CHECK(t.hugepage_sizes == std::vector<std::uint64_t>{2ull << 20, 1ull << 30});
    CHECK_FALSE(t.memlock_limit.has_value());
    REQUIRE(t.gpus.size() == 8);  // the Mellanox NIC is not a GPU
    CHECK(t.gpus[0].pci_bus_id == "0000:18:00.0");
    CHECK(t.gpus[3].numa_node == 0);
    CHECK(t.gpus[4].numa_node == 1);
    CHECK(cpus_near_gpu(t, 5) == range(32, 63));
    CHECK(t.node_of_cpu(40) == 1);
    auto plan = recommend_workers(t, 8, 2);
    CHECK(plan.workers_per_gpu == 6);  // (64 - 2) / 8 = 7 cores per GPU: 1 consumer + 6 workers
    CHECK(plan.cores_needed == 58);
    CHECK_FALSE(plan.short_of_cores);
}

TEST_CASE("Topology.Fixture.SmallVm") {
    auto t = fixture("vm_1node");
    CHECK(t.online_cpus == range(0, 1));
    REQUIRE(t.nodes.size() == 1);
    CHECK(t.nodes[0].memory_bytes == 24ull << 30);
    CHECK(t.gpus.empty());
    CHECK(t.memlock_limit == 8ull << 20);
    CHECK(t.hugepage_sizes == std::vector<std::uint64_t>{2ull << 20});
    CHECK(t.usable_cores() == doctest::Approx(2.0));
    auto plan = recommend_workers(t, 1);
    CHECK(plan.workers_per_gpu == 1);
    CHECK(plan.cores_needed == 3);
    CHECK(plan.short_of_cores);
    CHECK(plan.explanation.find("SHORT") != std::string::npos);
    auto cpu = recommend_workers(t, 0, 0);  // CPU training, nothing reserved: 1 worker + the trainer
    CHECK(cpu.workers_per_gpu == 1);
    CHECK_FALSE(cpu.short_of_cores);
}

TEST_CASE("Topology.Fixture.CgroupLimitedContainer") {
    auto t = fixture("container_cgroup");
    CHECK(t.online_cpus == range(0, 15));
    CHECK(t.allowed_cpus == range(0, 7));
    REQUIRE(t.cgroup_cpu_quota.has_value());
    CHECK(*t.cgroup_cpu_quota == doctest::Approx(1.5));
    CHECK(t.cgroup_memory_max == 4ull << 30);
    CHECK(t.usable_cores() == doctest::Approx(1.5));
    CHECK(t.memlock_limit == 65536u);
    REQUIRE(t.gpus.size() == 1);
    CHECK(t.gpus[0].numa_node == -1);
    CHECK(cpus_near_gpu(t, 0) == range(0, 7));  // local CPUs restricted to the affinity mask
    auto plan = recommend_workers(t, 1);
    CHECK(plan.short_of_cores);
    CHECK(plan.explanation.find("cgroup quota 1.5") != std::string::npos);
}

TEST_CASE("Topology.Workers.OnePolicyFromTheMachineTheLauncherAndTheConfig") {
    // choose_workers is what every pipeline starts with: recommend_workers for the trainers on the node.
    const auto server = fixture("two_socket_8gpu");
    const launch_info eight{.local_world_size = 8};
    const auto shared = detail::choose_workers({}, server, eight);  // 8 ranks share 64 cores: (64 - 1) / 8 = 7 each, 1 trains
    CHECK(shared.workers == 6);
    CHECK(shared.autotune);
    CHECK(detail::choose_workers({}, server, {}).workers == defaults::max_auto_workers);  // one trainer: 62, capped
    const auto fixed = detail::choose_workers({.workers = 3}, server, eight);
    CHECK(fixed.workers == 3);
    CHECK_FALSE(fixed.autotune);
    CHECK(detail::choose_workers({.max_workers = 5}, server, eight).workers == 5);
    const auto vm = detail::choose_workers({.device = device_kind::cpu}, fixture("vm_1node"), {});
    CHECK(vm.workers == 1);
    CHECK_FALSE(vm.autotune);  // one worker: nothing to park
    CHECK(vm.reason.find("CPU trainer") != std::string::npos);
    // Workers of a GPU on a two-socket machine run on its node's CPUs; elsewhere anywhere.
    CHECK(worker_cpus_for_gpu(server, server.gpus[0].pci_bus_id) == range(0, 31));
    CHECK(worker_cpus_for_gpu(server, server.gpus[5].pci_bus_id) == range(32, 63));
    CHECK(worker_cpus_for_gpu(server, "0000:ff:00.0").empty());  // not a GPU the topology lists
    const auto container = fixture("container_cgroup");
    CHECK(worker_cpus_for_gpu(container, container.gpus[0].pci_bus_id).empty());  // one node: nothing to choose
}

TEST_CASE("Topology.Live.LibnumaAndSysfsAgree") {
    auto live = read_topology();
    auto via_files = read_topology({.root = "/."});  // any root but "/" reads the files only
    CHECK(!live.online_cpus.empty());
    CHECK(live.online_cpus == via_files.online_cpus);
    REQUIRE(live.nodes.size() == via_files.nodes.size());
    for (std::size_t i = 0; i < live.nodes.size(); ++i) CHECK(live.nodes[i].cpus == via_files.nodes[i].cpus);
#if FEEDLINE_HAS_NUMA
    CHECK((live.numa_source == "libnuma" || live.nodes.empty()));
#endif
    CHECK(via_files.numa_source == "sysfs");
    CHECK(live.usable_cores() >= 1.0);
}

TEST_CASE("Topology.NumaBuffer.PlacesPagesAndSaysHow") {
    auto t = read_topology();
    numa_buffer b(10000, t.nodes.empty() ? -1 : t.nodes[0].id);
    CHECK(b.size() == 12288);
    CHECK(reinterpret_cast<std::uintptr_t>(b.data()) % 4096 == 0);
    CHECK(!b.placement().empty());
    if (t.nodes.size() == 1) CHECK(b.placement().find("single NUMA node") != std::string::npos);
    b.data()[b.size() - 1] = std::byte{1};
    numa_buffer moved = std::move(b);
    CHECK(moved.data()[moved.size() - 1] == std::byte{1});
}

TEST_CASE("TrainerCpu.Placement.ProducersLeaveTheNotedCpuOnlyWithOneToSpare") {
    const std::vector<int> allowed = ft::allowed_cpus_of_this_thread();
    // A producer thread's view after keep_off(): its own affinity, and the CPU it recorded.
    auto producer = [](trainer_cpu& t) {
        std::pair<std::vector<int>, int> out;
        std::thread([&] {
            int excluded = -1;
            t.keep_off(excluded);
            out = {ft::allowed_cpus_of_this_thread(), excluded};
        }).join();
        return out;
    };
    {
        trainer_cpu off;
        off.start(1, false);  // avoid_trainer_cpu = false
        off.note();
        CHECK_FALSE(off.enabled());
        CHECK(off.trainer() == -1);
        CHECK(producer(off).first == allowed);
        CHECK(off.describe().rfind("left to the kernel", 0) == 0);
    }
    {
        trainer_cpu crowded;  // as many producers as CPUs: none to spare
        crowded.start(static_cast<unsigned>(allowed.size()));
        crowded.note();
        CHECK_FALSE(crowded.enabled());
        CHECK(producer(crowded).first == allowed);
        CHECK(crowded.describe().rfind("may share the trainer's CPU", 0) == 0);
    }
    trainer_cpu t;
    t.start(1);
    if (allowed.size() < 2) {
        CHECK_FALSE(t.enabled());
        CHECK(t.describe().rfind("may share the trainer's CPU", 0) == 0);
        return;
    }
    REQUIRE(t.enabled());
    const auto before = producer(t);  // nothing noted yet: producers stay where they are
    CHECK(before.first == allowed);
    CHECK(before.second == -1);
    t.note();
    const int trainer = t.trainer();
    REQUIRE(std::find(allowed.begin(), allowed.end(), trainer) != allowed.end());
    auto expected = allowed;
    expected.erase(std::find(expected.begin(), expected.end(), trainer));
    const auto after = producer(t);
    CHECK(after.first == expected);
    CHECK(after.second == trainer);
    CHECK(t.describe().rfind("off the trainer's CPU (now " + std::to_string(trainer) + ")", 0) == 0);
}

TEST_CASE("Topology.Fixture.SmtAndPcieLinks") {
    CHECK(fixture("two_socket_8gpu").threads_per_core == 1);
    CHECK(fixture("vm_1node").threads_per_core == 2);
    const auto t = fixture("two_socket_8gpu");
    REQUIRE(t.gpus.size() == 8);
    for (const auto& g : t.gpus) {
        CAPTURE(g.pci_bus_id);
        CHECK(g.max_link_width == 16);
        CHECK(g.link_width == (g.pci_bus_id == "0000:ab:00.0" ? 8 : 16));
        CHECK(g.link_speed == "32.0 GT/s PCIe");
    }
    const auto c = fixture("container_cgroup");
    REQUIRE(c.gpus.size() == 1);
    CHECK(c.gpus[0].link_speed == "2.5 GT/s PCIe");
    CHECK(c.gpus[0].max_link_speed == "16.0 GT/s PCIe");
}

TEST_CASE("HostMemory.Fixtures.RamSwapSwappinessAndHugepages") {
    const auto root = [](const char* name) {
        return topology_source{std::string(FEEDLINE_SOURCE_DIR) + "/tests/fixtures/topology/" + name};
    };
    const auto vm = read_host_memory(root("vm_1node"));
    CHECK(vm.total == 25165824ull * 1024);
    CHECK(vm.available == 12582912ull * 1024);
    CHECK(vm.used() == (25165824ull - 12582912ull) * 1024);
    CHECK(vm.swap_used() == 1048576ull * 1024);
    CHECK(vm.swappiness == 60);
    CHECK(vm.transparent_hugepages == "madvise");
    const auto box = read_host_memory(root("container_cgroup"));
    CHECK(box.swap_used() == 0u);
    CHECK(box.transparent_hugepages == "always");
    // A tree without the files: every field absent, none zero.
    ft::scratch_dir empty;
    const auto none = read_host_memory({empty.path().string()});
    CHECK_FALSE(none.total.has_value());
    CHECK_FALSE(none.used().has_value());
    CHECK_FALSE(none.swappiness.has_value());
    CHECK(none.transparent_hugepages.empty());
    CHECK_FALSE(read_process_memory({empty.path().string()}).rss_anon.has_value());
}

// A pipeline's start asks for the host's memory once per source (each chooses its reader); under a
// host_memory_memo the first reading answers them all, for its own root only, until the memo ends.
TEST_CASE("HostMemory.Memo.OneReadingWhileItLivesForItsRootOnly") {
    ft::scratch_dir a, b;
    const auto meminfo = [](const ft::scratch_dir& d, std::uint64_t available_kib) {
        std::filesystem::create_directories(d.path() / "proc");
        std::ofstream(d.path() / "proc" / "meminfo") << "MemTotal: 1000000 kB\nMemAvailable: " << available_kib << " kB\n";
    };
    const topology_source at_a{a.path().string()}, at_b{b.path().string()};
    meminfo(a, 1000);
    meminfo(b, 7000);
    {
        host_memory_memo once;  // filled by the reading: not const
        CHECK(read_host_memory(at_a).available == 1000ull * 1024);
        meminfo(a, 2000);
        meminfo(b, 8000);
        CHECK(read_host_memory(at_a).available == 1000ull * 1024);  // the first reading
        CHECK(read_host_memory(at_b).available == 8000ull * 1024);  // another root: read
        CHECK(read_host_memory(at_a).available == 1000ull * 1024);
        {
            host_memory_memo inner;
            CHECK(read_host_memory(at_a).available == 2000ull * 1024);  // a memo of its own
            meminfo(a, 3000);
            CHECK(read_host_memory(at_a).available == 2000ull * 1024);
        }
        CHECK(read_host_memory(at_a).available == 1000ull * 1024);  // the outer memo's again
    }
    CHECK(read_host_memory(at_a).available == 3000ull * 1024);  // no memo: read
    CHECK(host_memory_memo::active() == nullptr);
}

TEST_CASE("HostMemory.Live.ProcessMemorySplitsAnonymousFromFilePages") {
    const auto h = read_host_memory();
    REQUIRE(h.total.has_value());
    REQUIRE(h.available.has_value());
    CHECK(*h.available <= *h.total);
    // 64 MiB of our own touched memory shows in RssAnon; a 64 MiB file mapped and read shows in RssFile.
    const auto before = read_process_memory();
    REQUIRE(before.rss_anon.has_value());
    REQUIRE(before.rss_file.has_value());
    std::vector<char> own(64 << 20, 1);
    ft::scratch_dir dir;
    ft::write_bytes(dir / "f", own.data(), own.size());
    file f(dir / "f");
    file_mapping m(f, access_pattern::sequential);
    const auto bytes = m.bytes();
    std::uint64_t sum = 0;
    for (std::size_t i = 0; i < bytes.size(); i += 4096) sum += static_cast<unsigned char>(bytes[i]);
    CHECK(sum == bytes.size() / 4096);
    const auto after = read_process_memory();
    CHECK(*after.rss_anon >= *before.rss_anon + (60ull << 20));
    // Mapped pages of a file on tmpfs count as shared memory, not file pages.
    CHECK(*after.rss_file + after.rss_shmem.value_or(0) >= *before.rss_file + before.rss_shmem.value_or(0) + (60ull << 20));
}

TEST_CASE("GpuSampler.MeansEachIntervalOnItsOwnThread") {
    // A reader standing in for NVML (which this machine may lack): utilization 0.2 then 0.6, alternating.
    std::atomic<int> calls{0};
    gpu_sampler s(
        [&]() -> std::optional<gpu_reading> {
            const int n = calls++;
            gpu_reading r;
            r.utilization = n % 2 ? 0.6 : 0.2;
            r.memory_used = n % 2 ? 300 : 100;
            r.memory_total = 1000;
            return r;
        },
        std::chrono::milliseconds(1));
    while (s.samples_taken() < 20) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const auto a = s.take();
    REQUIRE(a.has_value());
    CHECK(a->samples >= 20);
    REQUIRE(a->utilization.has_value());
    CHECK(*a->utilization == doctest::Approx(0.4).epsilon(0.1));
    CHECK(a->utilization_samples == a->samples);
    REQUIRE(a->memory_used.has_value());
    CHECK(*a->memory_used >= 150);
    CHECK(*a->memory_used <= 250);
    CHECK(a->memory_total == 1000u);
    CHECK(ft::has_thread_named("feedline-gpumon"));
}

TEST_CASE("GpuSampler.NoReadingIsAbsentAndAThrowingReaderIsAFailedSample") {
    std::atomic<int> calls{0};
    {
        gpu_sampler s(
            [&]() -> std::optional<gpu_reading> {
                ++calls;
                return std::nullopt;
            },
            std::chrono::milliseconds(1));
        while (calls < 5) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        CHECK_FALSE(s.take().has_value());
    }
    calls = 0;
    gpu_sampler t(
        [&]() -> std::optional<gpu_reading> {
            if (++calls < 3) throw std::runtime_error("driver hiccup");
            return gpu_reading{.memory_total = 8, .utilization = 1.0};
        },
        std::chrono::milliseconds(1));
    while (t.samples_taken() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    CHECK(calls >= 4);  // two failed reads, then two good ones
    const auto g = t.take();
    REQUIRE(g.has_value());
    CHECK(g->utilization == 1.0);
    // Right after a take() (new samples or not) the interval still has a reading.
    const auto again = t.take();
    REQUIRE(again.has_value());
    CHECK(again->memory_total == 8);
}

TEST_CASE("GpuSampler.AGpuWithoutUtilizationStillGivesItsMemory") {
    // MIG instances and some virtual GPUs report memory but not utilization.
    gpu_sampler s([] { return std::optional<gpu_reading>(gpu_reading{.memory_total = 100, .memory_used = 40}); },
                  std::chrono::milliseconds(1));
    while (s.samples_taken() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const auto g = s.take();
    REQUIRE(g.has_value());
    CHECK_FALSE(g->utilization.has_value());
    CHECK(g->memory_used == 40u);
}

TEST_CASE("GpuSampler.HasItsFirstReadingWhenConstructed") {
    // A log line written right after the sampler starts (a short run's only one) has GPU figures.
    gpu_sampler s([] { return std::optional<gpu_reading>(gpu_reading{.memory_total = 100, .memory_used = 40}); }, std::chrono::hours(1));
    const auto g = s.take();
    REQUIRE(g.has_value());
    CHECK(g->samples == 1);
    CHECK(g->memory_used == 40u);
}

TEST_CASE("GpuSampler.EachFigureIsTheMeanOfTheSamplesThatHadIt") {
    // Odd samples carry only utilization (0.9), even ones only memory (500 of 1000): neither mean is
    // diluted by the samples without it, and the utilization's weight is its own count.
    std::atomic<int> calls{0};
    gpu_sampler s(
        [&]() -> std::optional<gpu_reading> {
            gpu_reading r;
            if (calls++ % 2)
                r.utilization = 0.9;
            else
                r.memory_used = 500, r.memory_total = 1000;
            return r;
        },
        std::chrono::milliseconds(1));
    while (s.samples_taken() < 10) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const auto g = s.take();
    REQUIRE(g.has_value());
    CHECK(g->utilization == doctest::Approx(0.9));
    CHECK(g->memory_used == 500u);
    CHECK(g->memory_total == 1000u);
    CHECK(g->utilization_samples >= g->samples / 2 - 1);
    CHECK(g->utilization_samples <= g->samples / 2 + 1);
    CHECK(g->utilization_samples < g->samples);
}

TEST_CASE("Nvml.WithoutTheDriverSaysWhyAndSamplesNothing") {
    if (nvml::get().available()) ft::skip("NVML is present here");
    CHECK(nvml::get().count() == 0);
    CHECK(nvml::get().reason().find("NVML") != std::string::npos);
    std::string why;
    CHECK(gpu_sampler::for_gpu("0000:01:00.0", &why) == nullptr);
    CHECK(why == nvml::get().reason());
}
