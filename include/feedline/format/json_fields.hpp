// feedline/format/json_fields.hpp: reading a saved document's fields from JSON without trusting them.
// Resume files are meant to be read and sometimes edited by people, so every number is checked by
// hand: nlohmann's get<std::uint64_t>() would wrap a negative number and cast a float (undefined
// behaviour when it is out of range), and value() throws its own type_error for a mistyped field.
// Every failure is a format_error naming the field.
#pragma once

#if FEEDLINE_HAS_JSON
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <feedline/error.hpp>

namespace feedline {

// The "format" string of a parsed document: empty when it is not an object, has no "format" or
// the field is not a string.
inline std::string json_format_of(const nlohmann::json& j) {
    if (!j.is_object()) return {};
    const auto it = j.find("format");
    return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

class json_fields {
public:
    // `object`: a parsed JSON object; `what`: how errors name the document ("text state (JSON)").
    json_fields(const nlohmann::json& object, std::string what) : j_(object), what_(std::move(what)) {}

    [[noreturn]] void fail(const std::string& why) const { throw format_error(what_, 0, why); }

    const nlohmann::json& field(const char* name) const {
        const auto it = j_.find(name);
        if (it == j_.end()) fail(std::string("missing field: ") + name);
        return *it;
    }
    // An integer in [0, max]; `name` is what the error calls it.
    std::uint64_t whole(const nlohmann::json& v, const std::string& name, std::uint64_t max) const {
        if (!v.is_number_unsigned() || v.get<std::uint64_t>() > max) fail(name + " is not an integer in [0, " + std::to_string(max) + "]");
        return v.get<std::uint64_t>();
    }
    std::uint64_t u64(const char* name) const { return whole(field(name), name, UINT64_MAX); }
    std::uint32_t u32(const char* name) const { return static_cast<std::uint32_t>(whole(field(name), name, UINT32_MAX)); }
    const nlohmann::json& array(const char* name) const {
        const auto& v = field(name);
        if (!v.is_array()) fail(std::string(name) + " is not an array");
        return v;
    }
    std::vector<std::uint64_t> u64s(const char* name) const {
        std::vector<std::uint64_t> out;
        for (const auto& v : array(name)) out.push_back(whole(v, std::string(name) + "[]", UINT64_MAX));
        return out;
    }
    std::vector<double> numbers(const char* name) const {
        std::vector<double> out;
        for (const auto& v : array(name)) {
            if (!v.is_number()) fail(std::string(name) + "[] is not a number");
            out.push_back(v.get<double>());
        }
        return out;
    }

private:
    const nlohmann::json& j_;
    std::string what_;
};

}  // namespace feedline
#endif
