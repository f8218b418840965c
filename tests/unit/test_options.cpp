// The pipeline's options from their one declaration: every option parses from text and JSON as its type
// says (enumerations by name, numbers in range, booleans), refuses what it cannot be naming its field,
// round-trips through JSON, counts as set once set by name (even to its default), and is named in
// errors; the enumerations' one parser lists their choices.
#include <doctest/doctest.h>

#include <feedline/pipeline.hpp>

using namespace feedline;

TEST_CASE("Options.Declarations.EveryOptionParsesAndRoundTripsThroughJson") {
    pipeline_config c;
    set_option(c, "batch_size", "64");
    set_option(c, "mode", "packed");
    set_option(c, "shuffle", "shard_blocks");
    set_option(c, "tail", "pad");
    set_option(c, "device", "cuda:1");
    set_option(c, "rank", "-1");
    set_option(c, "avoid_trainer_cpu", "false");
    set_option(c, "shards.backend", "uring");  // by its config path and another spelling
    set_option(c, "text_split", "blank");
    set_option(c, "max_line_bytes", "1048576");
    CHECK(c.batch_size == 64);
    CHECK(c.mode == sample_mode::packed);
    CHECK(c.shuffle == shuffle_mode::shard_blocks);
    CHECK(c.tail == tail_policy::pad);
    CHECK(c.device == device_choice(device_kind::cuda, 1));
    CHECK_FALSE(c.avoid_trainer_cpu);
    CHECK(c.shards.backend == io_backend::io_uring);
    CHECK(c.text.documents.split == text_split::blank_lines);
    CHECK(c.text.documents.max_line_bytes == (1u << 20));
#if FEEDLINE_HAS_JSON
    const auto j = options_to_json(c);
    CHECK(j["mode"] == "packed");
    CHECK(j["io_backend"] == "io_uring");
    CHECK(j["batch_size"] == 64);
    CHECK(j.size() == detail::option_count);
    pipeline_config back;
    options_from_json(back, j, "saved.json");
    CHECK(options_to_json(back) == j);
    CHECK_THROWS_WITH_AS(options_from_json(back, nlohmann::json{{"bach_size", 3}}, "x.json"), doctest::Contains("no such option"),
                         config_error);
    CHECK_THROWS_WITH_AS(options_from_json(back, nlohmann::json{{"seed", 1.5}}, "x.json"), doctest::Contains("whole number"), config_error);
#endif
}

TEST_CASE("Options.Declarations.BadValuesAreRefusedNamingTheFieldAndWhatWasExpected") {
    pipeline_config c;
    auto refused = [&](const std::string name, const std::string value, const std::string& field, const std::string& words) {
        CAPTURE(name);
        CAPTURE(value);
        try {
            set_option(c, name, value);
            FAIL("accepted");
        } catch (const config_error& e) {
            CHECK(e.field() == field);
            CHECK_MESSAGE(std::string(e.what()).find(words) != std::string::npos, e.what());
        }
    };
    refused("batch_size", "-3", "batch_size", "whole number from 0");
    refused("batch_size", "1.5", "batch_size", "whole number");
    refused("batch_size", "18446744073709551616", "batch_size", "whole number");
    refused("workers", "40000", "workers", "to 1024");
    refused("rank", "-2", "rank", "from -1");
    refused("mode", "sideways", "mode", "windows or packed");
    refused("shuffle", "random", "shuffle", "none, global or shard_blocks");
    refused("io_backend", "aio", "shards.backend", "auto, io_uring, mmap or pread");
    refused("add_eos", "maybe", "text.add_eos", "true or false");
    refused("device", "tpu", "device", "auto, cpu, cuda");
    refused("bach_size", "4", "bach_size", "did you mean batch_size");
    CHECK(c == pipeline_config{});  // nothing was changed by a refused value
}

TEST_CASE("Options.SetByUser.AnOptionSetByNameCountsAsSetEvenAtItsDefault") {
    pipeline_config c;
    CHECK(detail::options_set_for(c, data_scope::text).empty());
    set_option(c, "field", "text");  // the default, given explicitly
    CHECK(detail::options_set_for(c, data_scope::text) == std::vector<std::string>{"text.documents.field"});
    pipeline_config d{.text = {.add_bos = true}};  // C++: set when it differs from the default
    CHECK(detail::options_set_for(d, data_scope::text) == std::vector<std::string>{"text.add_bos"});
    CHECK(detail::options_set_for(d, data_scope::tokens).empty());
}

TEST_CASE("Options.Names.EveryEnumerationHasOneParserThatListsItsChoices") {
    CHECK(name_of(io_backend::automatic) == "auto");
    CHECK(parse_enum<io_backend>("uring", "x") == io_backend::io_uring);
    CHECK(name_of(parse_enum<io_backend>("uring", "x")) == "io_uring");
    CHECK(choices_of<text_split>() == "file, blank or line");
    CHECK(parse_enum<sample_mode>("packed", "mode") == sample_mode::packed);
    CHECK_THROWS_WITH_AS(parse_enum<tail_policy>("none", "tail"), doctest::Contains("config tail: 'none' (expected drop, pad or mask)"),
                         config_error);
    CHECK(options_markdown().find("| `io_backend` | `--io-backend` | auto, io_uring, mmap or pread | `auto` | token shards |") !=
          std::string::npos);
}
