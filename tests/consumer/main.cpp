// A user's program: include the one public header, write a small dataset, read it back.
#include <feedline/pipeline.hpp>

#include <cstdio>
#include <string>
#include <vector>

int main(int argc, char** argv) {
    std::string prefix = std::string(argc > 1 ? argv[1] : ".") + "/consumer-data";
    feedline::megatron_writer writer(prefix, feedline::token_dtype::uint16);
    writer.add_document(std::vector<std::uint16_t>{1, 2, 3});
    writer.add_document(std::vector<std::uint16_t>{4});
    writer.finish();

    feedline::token_dataset dataset(prefix);
    auto reader = feedline::make_reader();
    std::vector<std::uint32_t> tokens(3);
    dataset.read_tokens(reader, dataset.document(0), 0, 3, tokens.data());
    bool ok = dataset.document_count() == 2 && tokens == std::vector<std::uint32_t>{1, 2, 3};
    std::printf("consumer %s (feedline %s, reader: %s)\n", ok ? "ok" : "MISMATCH", feedline::version_string, reader.reason().c_str());
    return ok ? 0 : 1;
}
