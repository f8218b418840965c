// Fuzz target: on any line, jsonl_field_parser's fast path (simdjson, then nlohmann for what simdjson
// refuses) must give the same status and text as nlohmann_json alone, the reference that defines
// which JSONL lines feedline accepts. Input: byte 0 picks the field name, the rest is the line.
#include <cstddef>
#include <cstdint>
#include <string>

#include <feedline/format/jsonl_field.hpp>

using namespace feedline;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size == 0) return 0;
    static const char* const fields[] = {"text", "t", ""};
    const std::string field = fields[data[0] % 3];
    const std::string line(reinterpret_cast<const char*>(data + 1), size - 1);
    static jsonl_field_parser fast, reference(jsonl_field_parser::engine::nlohmann);
    std::string a = line, b = line, text_a, text_b;
    const jsonl_field_status sa = fast.extract(a, field, text_a), sb = reference.extract(b, field, text_b);
    if (sa != sb || text_a != text_b || a != line) __builtin_trap();
    return 0;
}
