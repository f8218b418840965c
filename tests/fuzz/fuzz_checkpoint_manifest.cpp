// Fuzz target: the sample trainer's checkpoint manifest and trainer.json. Any bytes either parse or
// throw checkpoint_error; what parses keeps the manifest's promises (plain, distinct file names, both
// required files listed), so a damaged manifest can never point the loader outside its directory.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "checkpoint.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size == 0) return 0;
    const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
    try {
        if (data[0] % 2 == 0) {
            const auto entries = trainer::parse_manifest(text, "fuzz/manifest.json");
            for (const auto& e : entries)
                if (e.name.empty() || e.name.find('/') != std::string::npos || e.name == "." || e.name == ".." ||
                    std::count_if(entries.begin(), entries.end(), [&](const auto& o) { return o.name == e.name; }) != 1)
                    __builtin_trap();
            for (const char* required : {"trainer.json", "tensors.bin"})
                if (std::none_of(entries.begin(), entries.end(), [&](const auto& e) { return e.name == required; })) __builtin_trap();
        } else {
            (void)trainer::parse_checkpoint(text, std::string(), "fuzz/trainer.json", "fuzz/tensors.bin");
            __builtin_trap();  // an empty tensors file never loads
        }
    } catch (const trainer::checkpoint_error&) {
    }
    return 0;
}
