// A libnvidia-ml.so.1 describing two GPUs, for machines without NVIDIA's driver: tests run
// feedline-doctor check with LD_LIBRARY_PATH pointing here, the way fixture trees stand in for /sys.
// It exports the entry points feedline/device/nvml.hpp opens, with NVML's C signatures and struct
// layouts (nvml.h, stable C ABI). GPU 0: 80 GiB with 24 GiB held by "another process", 37% busy, link
// gen 5 x16. GPU 1: a GPU in MIG mode seen by an unprivileged process, as nvml.h describes it: no
// utilization (NVML_ERROR_NOT_SUPPORTED) and no memory (NVML_ERROR_NO_PERMISSION).
#include <strings.h>
#include <cstring>

namespace {

struct fake_device {
    const char* name;
    const char* bus_id;  // NVML spells it with 8 hex digits of domain, upper case
    unsigned domain, bus, device;
    unsigned long long total, used;
    int utilization;  // -1: not supported
    bool mig;         // MIG on: memory needs privileges this process lacks
};

fake_device devices[2] = {
    {"Fake GPU 80GB", "00000000:1A:00.0", 0, 0x1a, 0, 80ull << 30, 24ull << 30, 37, false},
    {"Fake MIG A100", "00000000:3B:00.0", 0, 0x3b, 0, 40ull << 30, 20ull << 30, -1, true},
};
bool initialized = false;

// Only NVML's own spelling: nvml.h promises no more ("corresponds to nvmlPciInfo_t::busId"), so a
// lookup in sysfs's "0000:1a:00.0" fails here and feedline's fallback (every GPU's numbers) is what
// finds the device.
bool same_bus_id(const char* a, const char* b) { return strcasecmp(a, b) == 0; }

}  // namespace

extern "C" {

struct nvmlMemory_t {
    unsigned long long total, free, used;
};
struct nvmlUtilization_t {
    unsigned gpu, memory;
};
struct nvmlPciInfo_t {
    char busIdLegacy[16];
    unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
};
using nvmlDevice_t = fake_device*;

int nvmlInit_v2() {
    initialized = true;
    return 0;
}
int nvmlDeviceGetCount_v2(unsigned* n) {
    if (!initialized) return 1;  // NVML_ERROR_UNINITIALIZED
    *n = 2;
    return 0;
}
int nvmlDeviceGetHandleByIndex_v2(unsigned i, nvmlDevice_t* d) {
    if (i >= 2) return 2;  // NVML_ERROR_INVALID_ARGUMENT
    *d = &devices[i];
    return 0;
}
int nvmlDeviceGetHandleByPciBusId_v2(const char* id, nvmlDevice_t* d) {
    for (auto& x : devices)
        if (same_bus_id(id, x.bus_id)) {
            *d = &x;
            return 0;
        }
    return 6;  // NVML_ERROR_NOT_FOUND
}
int nvmlDeviceGetName(nvmlDevice_t d, char* out, unsigned n) {
    std::strncpy(out, d->name, n);
    out[n - 1] = '\0';
    return 0;
}
int nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t* m) {
    if (d->mig) return 4;  // NVML_ERROR_NO_PERMISSION
    *m = {d->total, d->total - d->used, d->used};
    return 0;
}
int nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned* current, unsigned* pending) {
    *current = *pending = d->mig ? 1 : 0;  // NVML_DEVICE_MIG_ENABLE
    return 0;
}
int nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t* u) {
    if (d->utilization < 0) return 3;  // NVML_ERROR_NOT_SUPPORTED
    *u = {static_cast<unsigned>(d->utilization), 10};
    return 0;
}
int nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t* p) {
    std::memset(p, 0, sizeof *p);
    p->domain = d->domain;
    p->bus = d->bus;
    p->device = d->device;
    std::strncpy(p->busId, d->bus_id, sizeof p->busId - 1);
    return 0;
}
int nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t, unsigned* v) { return *v = 5, 0; }
int nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t, unsigned* v) { return *v = 16, 0; }
int nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t, unsigned* v) { return *v = 5, 0; }
int nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t, unsigned* v) { return *v = 16, 0; }

}  // extern "C"
