// On-the-fly tokenization: text_pipeline's windows are cut from exactly the ids spm_encode gives for
// the same model and documents (model trained in the test), the stream is the same with 1 or 3
// workers, resume is exact from the middle of a document, packed rows equal the shard sampler's on
// the same ids, feedline::pipeline picks the text path from the spec, ranks take disjoint documents,
// and bad input fails with the file and offset.
#include <doctest/doctest.h>

#include <feedline/pipeline.hpp>

#include <sentencepiece_trainer.h>

#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "run_command.hpp"
#include "test_support.hpp"

namespace ft = feedline::test;
using namespace feedline;

namespace {

// Documents of varied length from a small vocabulary (some longer than a window), as JSONL and as
// one-document-per-line text, plus a unigram model of 200 pieces trained on them.
struct text_fixture {
    ft::scratch_dir dir;
    std::vector<std::string> docs;
    std::string jsonl = dir / "docs.jsonl", lines = dir / "docs.txt", model = dir / "m.model";
    text_fixture() {
        const char* words[] = {"alpha", "beta", "gamma", "delta", "river", "stone", "quiet", "bright", "engine", "garden", "north", "south"};
        std::mt19937 rng(3);
        for (int d = 0; d < 120; ++d) {
            std::string t;
            const int n = 1 + static_cast<int>(rng() % (d % 10 == 0 ? 300 : 30));
            for (int w = 0; w < n; ++w) t += std::string(w ? " " : "") + words[rng() % 12] + (rng() % 7 == 0 ? "." : "");
            docs.push_back(t);
        }
        std::ofstream j(jsonl), l(lines);
        for (const auto& t : docs) {
            j << "{\"text\": \"" << t << "\"}\n";
            l << t << "\n";
        }
        j.close();
        l.close();
        auto st = sentencepiece::SentencePieceTrainer::Train("--input=" + lines + " --model_prefix=" + (dir / "m") +
                                                             " --vocab_size=200 --hard_vocab_limit=false --minloglevel=2 --num_threads=1");
        REQUIRE_MESSAGE(st.ok(), st.ToString());
    }
    pipeline_config config(unsigned workers, std::uint64_t steps) const {
        return {.batch_size = 3, .seq_len = 16, .seed = 9, .shuffle = shuffle_mode::none, .workers = workers, .device = "cpu", .max_steps = steps,
                .tokenizer = model};
    }
};

struct copied {
    std::vector<std::int32_t> inputs, targets;
    friend bool operator==(const copied&, const copied&) = default;
};
template <class Pipeline>
std::vector<copied> take(Pipeline& p) {
    std::vector<copied> out;
    for (auto& b : p) out.push_back({{b.host_inputs().begin(), b.host_inputs().end()}, {b.host_targets().begin(), b.host_targets().end()}});
    return out;
}

}  // namespace

TEST_CASE("TextPipeline.Ids.EqualSpmEncodeForTheSameModelAndText") {
    if (std::system("command -v spm_encode >/dev/null 2>&1") != 0) ft::skip("spm_encode not installed (Debian package sentencepiece)");
    text_fixture f;
    auto r = ft::run("spm_encode --model=" + f.model + " --output_format=id < " + f.lines, f.dir);
    REQUIRE(r.code == 0);
    // The expected stream: each document's ids, then EOS (file order: shuffle none).
    sentencepiece::SentencePieceProcessor spm;
    REQUIRE(spm.Load(f.model).ok());
    std::vector<std::int32_t> stream;
    std::istringstream in(r.out);
    for (std::string line; std::getline(in, line);) {
        std::istringstream ids(line);
        for (int id; ids >> id;) stream.push_back(id);
        stream.push_back(spm.eos_id());
    }
    for (const std::string& input : {f.jsonl, f.lines}) {
        CAPTURE(input);
        text_options opt;
        opt.split = text_split::lines;
        text_pipeline p({input}, f.config(2, 40), opt);
        CHECK(p.corpus().document_count() == f.docs.size());
        const auto batches = take(p);
        REQUIRE(batches.size() == 40);
        std::uint64_t at = 0;  // windows of T + 1 tokens, consecutive rows sharing one
        for (const auto& b : batches)
            for (std::uint64_t row = 0; row < 3; ++row, at += 16)
                for (std::uint64_t t = 0; t < 16; ++t) {
                    REQUIRE(at + t + 1 < stream.size());
                    CHECK(b.inputs[row * 16 + t] == stream[at + t]);
                    CHECK(b.targets[row * 16 + t] == stream[at + t + 1]);
                }
        CHECK(p.stats().tokenize_s > 0);
    }
}

TEST_CASE("TextPipeline.Threads.TokenizersAndAssemblerAreNamed") {
    text_fixture f;
    text_pipeline p({f.jsonl}, f.config(1, 10));
    REQUIRE(p.next());  // made by tokenizer 0 and the assembler, each named before its first piece of work
    CHECK(ft::has_thread_named("feedline-tok0"));
    CHECK(ft::has_thread_named("feedline-asm"));
}

TEST_CASE("TextPipeline.Placement.TheAssemblerLeavesABusyTrainersCpu") {
    // The assembler is the thread a release wakes; with a trainer that computes between batches and
    // two or more CPUs, its affinity leaves out the CPU the trainer was last seen busy on.
    text_fixture f;
    const std::vector<int> process = ft::allowed_cpus_of_this_thread();
    text_pipeline p({f.jsonl}, f.config(1, 0));
    if (process.size() < 2) {
        REQUIRE(p.next());
        CHECK(p.stats().worker_placement.rfind("may share the trainer's CPU", 0) == 0);
        return;
    }
    CHECK(ft::busy_trainer_until_kept_off(p, "feedline-asm", process));
    CHECK(ft::allowed_cpus_of_thread("feedline-tok0") == process);  // tokenizers are not woken by the trainer
}

TEST_CASE("TextPipeline.Workers.SameStreamWithOneOrThreeWorkersAndShuffled") {
    text_fixture f;
    auto cfg = f.config(1, 60);
    cfg.shuffle = shuffle_mode::global;
    text_pipeline one({f.jsonl}, cfg);
    cfg.workers = 3;
    text_pipeline three({f.jsonl}, cfg);
    const auto a = take(one), b = take(three);
    REQUIRE(a.size() == 60);
    REQUIRE(b.size() == 60);
    for (std::size_t i = 0; i < a.size(); ++i) CHECK(a[i].inputs == b[i].inputs);
    // Shuffled: the first window is not file order's first document.
    text_pipeline ordered({f.jsonl}, f.config(1, 1));
    CHECK(take(ordered)[0].inputs != a[0].inputs);
}

TEST_CASE("TextPipeline.Autotune.ParksTokenizersForASlowTrainerAndWakesThemWhenItStalls") {
    text_fixture f;
    auto cfg = f.config(0, 480);  // workers = 0: the autotuner decides, up to max_workers
    cfg.max_workers = 3;
    cfg.batch_size = 8;
    cfg.seq_len = 64;
    cfg.shuffle = shuffle_mode::global;
    text_pipeline tuned({f.jsonl}, cfg);
    CHECK(tuned.active_workers() == 3);
    CHECK(tuned.prefetch_depth() == 6);  // prefetch = 0: 2 per worker to start
    unsigned fewest = 3, most_after = 0;
    std::vector<copied> a;
    for (std::uint64_t i = 0; i < 480; ++i) {
        auto b = tuned.next();
        REQUIRE(b);
        a.push_back({{b->host_inputs().begin(), b->host_inputs().end()}, {b->host_targets().begin(), b->host_targets().end()}});
        b.reset();
        if (i < 160) {
            std::this_thread::sleep_for(std::chrono::milliseconds(3));  // a trainer much slower than tokenizing
            fewest = std::min(fewest, tuned.active_workers());
        } else {
            most_after = std::max(most_after, tuned.active_workers());  // then one that only waits for data
        }
    }
    CHECK_FALSE(tuned.next());
    CHECK(fewest == 1);     // the assembler waited on free slots: tokenizers parked down to one
    CHECK(most_after > 1);  // the trainer stalled: parked tokenizers woke up
    CHECK(tuned.stats().workers == 3);
    CHECK(tuned.stats().workers_active == tuned.active_workers());
    auto fixed_cfg = cfg;
    fixed_cfg.workers = 1;
    text_pipeline fixed({f.jsonl}, fixed_cfg);
    CHECK(take(fixed) == a);  // only timing changed
    CHECK(fixed.active_workers() == 1);
}

TEST_CASE("TextPipeline.Resume.ExactFromTheMiddleOfADocument") {
    text_fixture f;
    text_pipeline full({f.jsonl}, f.config(2, 50));
    const auto all = take(full);
    REQUIRE(all.size() == 50);
    // Stop at every step from 1 to 49 in turn; at least one stop is inside a document.
    bool inside = false;
    for (std::uint64_t k = 1; k < 50; k += 6) {
        CAPTURE(k);
        text_pipeline first({f.jsonl}, f.config(2, k));
        (void)take(first);
        const std::string saved = to_json(first.state());
        const text_state s = text_state_from_json(saved);
        CHECK(s.step == k);
        inside = inside || s.offset > 0;
        text_pipeline second({f.jsonl}, f.config(3, 50));
        second.restore(s);
        const auto rest = take(second);
        REQUIRE(rest.size() == 50 - k);
        for (std::size_t i = 0; i < rest.size(); ++i) {
            CHECK(rest[i].inputs == all[k + i].inputs);
            CHECK(rest[i].targets == all[k + i].targets);
        }
    }
    CHECK(inside);
    // A state from another shape is refused.
    text_pipeline other({f.jsonl}, f.config(1, 5));
    auto s = other.state();
    s.seq_len = 32;
    CHECK_THROWS_AS(text_pipeline({f.jsonl}, f.config(1, 5)).restore(s), config_error);
}

TEST_CASE("Pipeline.Text.OneEntryPointForTextWithItsStateInCheckpoints") {
    text_fixture f;
    // What the spec names decides the pipeline: JSONL / text files, alone or in a directory or glob.
    CHECK(detect_source(f.jsonl) == source_kind::text);
    CHECK(detect_source(f.lines) == source_kind::text);
    CHECK(detect_source(f.dir / "*.jsonl") == source_kind::text);
    CHECK(detect_source(f.dir.path().string()) == source_kind::text);
    CHECK(open_dataset(f.jsonl).kind() == source_kind::text);

    text_pipeline direct({f.jsonl}, f.config(2, 30));
    const auto expected = take(direct);
    pipeline whole(f.jsonl, f.config(2, 30));
    CHECK(whole.kind() == source_kind::text);
    CHECK(whole.text() != nullptr);
    CHECK(whole.tokens() == nullptr);
    CHECK(whole.describe().find("120 text documents") != std::string::npos);
    CHECK(take(whole) == expected);
    CHECK(whole.stats().batches == 30);

    // A checkpoint stores the state as JSON; a JSON library re-serialises it (keys sorted) and the
    // restored pipeline, with another worker count, continues exactly.
    std::string saved;
    {
        pipeline first(f.jsonl, f.config(1, 11));
        (void)take(first);
        saved = nlohmann::json::parse(to_json(first.state())).dump();
    }
    pipeline second(f.jsonl, f.config(3, 30));
    const pipeline_state s = pipeline_state_from_json(saved);
    REQUIRE(std::holds_alternative<text_state>(s));
    CHECK(std::get<text_state>(s).step == 11);
    second.restore(s);
    const auto rest = take(second);
    REQUIRE(rest.size() == 19);
    CHECK(std::equal(rest.begin(), rest.end(), expected.begin() + 11));

    // A token-shard state does not restore a text pipeline; text needs a tokenizer; garbage is no state.
    pipeline third(f.jsonl, f.config(1, 5));
    CHECK_THROWS_AS(third.restore(sampler_state{}), config_error);
    auto no_model = f.config(1, 5);
    no_model.tokenizer.clear();
    CHECK_THROWS_AS(pipeline(f.jsonl, no_model), config_error);
    CHECK_THROWS_AS(pipeline_state_from_json("{\"format\": \"feedline.text_state\", \"version\": 1}"), format_error);
    CHECK_THROWS_AS(pipeline_state_from_json("not json"), format_error);
    CHECK_THROWS_AS(pipeline_state_from_json("{\"format\": 1}"), format_error);  // not nlohmann's own type_error
    CHECK_THROWS_AS(pipeline_state_from_json("[1, 2]"), format_error);

    // Hand-edited numbers: a negative offset would wrap to 2^64 - 3, a float document be cast
    // (undefined when out of range). Each is refused with the field's name.
    auto edited = [&](const std::string& field, const std::string& value) {
        auto j = nlohmann::json::parse(saved);
        j[field] = nlohmann::json::parse(value);
        return j.dump();
    };
    CHECK(std::get<text_state>(pipeline_state_from_json(edited("offset", "2"))).offset == 2);
    for (const auto& edit : {std::pair{"offset", "-3"}, {"document", "1e300"}, {"seed", "1.5"}, {"step", "\"5\""}, {"packed", "2"},
                             {"version", "4294967297"}, {"rank", "null"}}) {
        const std::string field = edit.first, value = edit.second;  // named copies: CAPTURE cannot take bindings
        CAPTURE(field);
        CAPTURE(value);
        try {
            (void)pipeline_state_from_json(edited(field, value));
            FAIL("accepted");
        } catch (const format_error& e) {
            CHECK(std::string(e.what()).find(field) != std::string::npos);
        }
    }
}

namespace {
struct packed_batch {
    std::vector<std::int32_t> inputs, targets, positions, cu, pieces;
    friend bool operator==(const packed_batch&, const packed_batch&) = default;
};
template <class Pipeline>
std::vector<packed_batch> take_packed(Pipeline& p) {
    std::vector<packed_batch> out;
    auto v = [](auto span) { return std::vector<std::int32_t>(span.begin(), span.end()); };
    for (auto& b : p) out.push_back({v(b.host_inputs()), v(b.host_targets()), v(b.host_position_ids()), v(b.host_cu_seqlens()), v(b.host_pieces())});
    return out;
}
}  // namespace

TEST_CASE("TextPipeline.Packed.RowsEqualTheShardSamplersOnTheSameIdsAndResumeMidDocument") {
    text_fixture f;
    // The reference: every document's sentencepiece ids + EOS written to a Megatron shard and packed
    // by the shard sampler. The text pipeline packs its stream by the same rule as documents arrive.
    sentencepiece::SentencePieceProcessor spm;
    REQUIRE(spm.Load(f.model).ok());
    {
        megatron_writer w(f.dir / "ref", token_dtype::int32);
        for (const auto& d : f.docs) {
            std::vector<int> ids;
            REQUIRE(spm.Encode(d, &ids).ok());
            ids.push_back(spm.eos_id());
            w.add_document(std::vector<std::uint32_t>(ids.begin(), ids.end()));
        }
        w.finish();
    }
    const std::uint64_t steps = 40;
    auto cfg = f.config(2, steps);
    cfg.mode = sample_mode::packed;
    const std::uint64_t B = cfg.batch_size, T = cfg.seq_len;
    // The shard sampler's packed rows in order (documents in file order, rows not shuffled: a stream
    // cannot shuffle rows it has not seen), assembled as the slot layout documents.
    auto ref = std::make_shared<const token_dataset>(f.dir / "ref");
    REQUIRE(ref->total_tokens() > 2 * steps * B * T);  // within the first epoch
    sampler rows(*ref,
                 {.seq_len = T, .global_batch = B, .seed = 9, .mode = sample_mode::packed, .shuffle = shuffle_mode::none, .shuffle_samples = false,
                  .rank = 0, .world_size = 1},
                 ref->shard_document_starts());
    pread_reader reader;
    std::vector<packed_batch> expected;
    for (std::uint64_t step = 0; step < steps; ++step) {
        packed_batch e;
        for (const auto& sample : rows.next().samples) {
            std::vector<std::int32_t> row;
            for (const auto& seg : sample.segments) {
                std::vector<std::int32_t> t(seg.length);
                ref->read_tokens(reader, ref->document(seg.document), seg.offset, seg.length, t.data());
                row.insert(row.end(), t.begin(), t.end());
            }
            row_boundaries bounds;
            boundaries_of(sample.segments, T, bounds);
            std::vector<std::int32_t> targets(T, -1);
            for (std::size_t k = 0; k + 1 < bounds.cu_seqlens.size(); ++k)  // the next token inside each piece
                for (std::int32_t j = bounds.cu_seqlens[k]; j + 1 < bounds.cu_seqlens[k + 1]; ++j) targets[j] = row[j + 1];
            const auto pieces = static_cast<std::int32_t>(bounds.cu_seqlens.size() - 1);
            row.resize(T, 0);
            bounds.cu_seqlens.resize(T + 1, bounds.cu_seqlens.back());
            e.inputs.insert(e.inputs.end(), row.begin(), row.end());
            e.targets.insert(e.targets.end(), targets.begin(), targets.end());
            e.positions.insert(e.positions.end(), bounds.position_ids.begin(), bounds.position_ids.end());
            e.cu.insert(e.cu.end(), bounds.cu_seqlens.begin(), bounds.cu_seqlens.end());
            e.pieces.push_back(pieces);
        }
        expected.push_back(std::move(e));
    }
    pipeline text(f.jsonl, cfg);
    const auto got = take_packed(text);
    REQUIRE(got.size() == steps);
    for (std::size_t i = 0; i < steps; ++i) {
        CAPTURE(i);
        CHECK(got[i] == expected[i]);
    }
    CHECK(text.stats().padding_tokens > 0);

    // Resume at several steps (some inside a document split across rows), with another worker count.
    bool inside = false;
    for (std::uint64_t k : {1ull, 6ull, 13ull, 22ull, 31ull}) {
        CAPTURE(k);
        pipeline first(f.jsonl, [&] { auto c = cfg; c.max_steps = k; return c; }());
        (void)take_packed(first);
        const auto s = pipeline_state_from_json(to_json(first.state()));
        inside = inside || std::get<text_state>(s).offset > 0;
        pipeline second(f.jsonl, [&] { auto c = cfg; c.workers = 3; return c; }());
        second.restore(s);
        const auto rest = take_packed(second);
        REQUIRE(rest.size() == steps - k);
        CHECK(std::equal(rest.begin(), rest.end(), got.begin() + static_cast<std::ptrdiff_t>(k)));
    }
    CHECK(inside);
    // A windows-mode state does not restore a packed pipeline.
    pipeline windows(f.jsonl, f.config(1, 3));
    (void)take(windows);
    pipeline packed(f.jsonl, cfg);
    CHECK_THROWS_AS(packed.restore(windows.state()), config_error);
}

TEST_CASE("TextPipeline.Ranks.TakeDisjointDocuments") {
    text_fixture f;
    // One window per document would be needed to see documents directly; instead compare streams: with
    // shuffle none and 2 ranks, rank r's stream is documents r, r + 2, ... so the two streams differ and
    // each equals a 1-rank pipeline over just those documents' text.
    auto cfg = f.config(1, 4);
    cfg.world_size = 2;
    cfg.rank = 0;
    text_pipeline r0({f.lines}, cfg, {.split = text_split::lines});
    cfg.rank = 1;
    text_pipeline r1({f.lines}, cfg, {.split = text_split::lines});
    std::ofstream even(f.dir / "even.txt"), odd(f.dir / "odd.txt");
    for (std::size_t i = 0; i < f.docs.size(); ++i) (i % 2 ? odd : even) << f.docs[i] << "\n";
    even.close();
    odd.close();
    auto solo = f.config(1, 4);
    text_pipeline e({f.dir / "even.txt"}, solo, {.split = text_split::lines}), o({f.dir / "odd.txt"}, solo, {.split = text_split::lines});
    const auto a = take(r0), b = take(r1), ea = take(e), ob = take(o);
    REQUIRE(a.size() == 4);
    for (std::size_t i = 0; i < 4; ++i) {
        CHECK(a[i].inputs == ea[i].inputs);
        CHECK(b[i].inputs == ob[i].inputs);
    }
    CHECK(a[0].inputs != b[0].inputs);
}

TEST_CASE("TextPipeline.Errors.NamedFileOffsetAndField") {
    text_fixture f;
    // An invalid JSONL line is found when the corpus is opened: format_error with the file and offset.
    std::ofstream bad(f.dir / "bad.jsonl");
    bad << "{\"text\": \"fine\"}\n{\"text\": 3}\n";
    bad.close();
    try {
        text_pipeline p({f.dir / "bad.jsonl"}, f.config(1, 1));
        FAIL("opened");
    } catch (const format_error& e) {
        CHECK(e.file() == std::string(f.dir / "bad.jsonl"));
        CHECK(e.offset() == 17u);
    }
    auto cfg = f.config(1, 1);
    cfg.tokenizer = f.dir / "missing.model";
    CHECK_THROWS_AS(text_pipeline({f.jsonl}, cfg), config_error);
    cfg = f.config(1, 1);
    cfg.tokenizer.clear();
    CHECK_THROWS_AS(text_pipeline({f.jsonl}, cfg), config_error);
    cfg = f.config(1, 1);
    cfg.seq_len = 0;
    CHECK_THROWS_AS(text_pipeline({f.jsonl}, cfg), config_error);
    CHECK_THROWS_AS(text_pipeline({f.dir / "nothing-here.jsonl"}, f.config(1, 1)), io_error);
    // A file truncated after opening surfaces at next() as a format_error naming it and the offset.
    text_pipeline p({f.jsonl}, f.config(1, 1000));
    std::filesystem::resize_file(f.jsonl, 10);
    try {
        for (auto& b : p) (void)b;
        FAIL("ran to the end over a truncated file");
    } catch (const format_error& e) {
        CHECK(e.file() == f.jsonl);
        CHECK(std::string(e.what()).find("ends early") != std::string::npos);
    }
}
