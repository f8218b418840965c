// feedline/names.hpp: the names of an enumeration's values, declared once beside the enumeration (a
// specialization of enum_names), and what follows from them: printing a value, parsing a string from a
// command line, JSON or Python with an error that lists the choices, and the choices for help texts
// and docs. One parser for every enumeration instead of one hand-written per enum and per tool.
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <utility>

#include <feedline/error.hpp>

namespace feedline {

// Specialize with `static constexpr std::array<std::pair<E, std::string_view>, N> values`: each value's
// name, the canonical one first; a value may appear again under another accepted spelling.
template <class E>
struct enum_names;

// One entry of such a table: named(E::value, "name").
template <class E>
constexpr std::pair<E, std::string_view> named(E value, std::string_view name) noexcept {
    return {value, name};
}

template <class E>
concept named_enum = requires {
    enum_names<E>::values;
};

// The canonical name of `e` ("?" for a value without one). Never throws.
template <named_enum E>
constexpr std::string_view name_of(E e) noexcept {
    for (const auto& [value, name] : enum_names<E>::values)
        if (value == e) return name;
    return "?";
}

// "a, b or c": the canonical names, for errors and help.
template <named_enum E>
std::string choices_of() {
    std::string out;
    std::size_t n = 0, count = 0;
    for (std::size_t i = 0; i < enum_names<E>::values.size(); ++i)
        if (name_of(enum_names<E>::values[i].first) == enum_names<E>::values[i].second) ++count;
    for (const auto& [value, name] : enum_names<E>::values) {
        if (name_of(value) != name) continue;  // another spelling of a value already listed
        out += (n == 0 ? "" : n + 1 == count ? " or " : ", ") + std::string(name);
        ++n;
    }
    return out;
}

// The value named `text` (any accepted spelling). Throws config_error naming `field` and the choices.
template <named_enum E>
E parse_enum(std::string_view text, const std::string& field) {
    for (const auto& [value, name] : enum_names<E>::values)
        if (name == text) return value;
    throw config_error(field, "'" + std::string(text) + "' (expected " + choices_of<E>() + ")");
}

}  // namespace feedline
