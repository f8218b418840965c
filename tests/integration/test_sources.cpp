// One behavioural suite for both sources. A corpus of JSONL documents in three files, a sentencepiece
// model trained on it in the test, and Megatron shards holding exactly that model's ids (one shard per
// file): the same documents as token shards and as text tokenized on the fly. Every case runs on both:
// batches are the planned tokens in every mode (windows/packed x global/shard_blocks/none x drop/pad),
// the same with any worker count, rank slices join to the one-rank batch, resume is exact anywhere
// (mid-document, across an epoch edge), tails count as documented, packed boundaries agree. Then what
// only text has (ids equal spm_encode, the token-length cache, long documents tokenized once, errors),
// blends of any two sources, and config fields a source cannot honour.
#include <doctest/doctest.h>

#include <feedline/output/pack_text.hpp>
#include <feedline/pipeline.hpp>

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "run_command.hpp"
#include "test_support.hpp"

namespace ft = feedline::test;
using namespace feedline;

namespace {

constexpr std::uint64_t files = 3, docs_per_file = 50;

// Documents of 1..30 words, every 10th of ~300 (longer than a window), and one of ~3000 words that
// spans many batches; written as JSONL (three files) and as one document per line for spm_encode.
struct corpus_fixture {
    ft::scratch_dir dir;
    std::vector<std::string> docs;
    std::vector<std::vector<std::int32_t>> ids;  // the model's ids of each document, plus EOS
    std::string lines = dir / "docs.txt", model = dir / "m.model", cache = dir / "cache";
    std::string text_spec = dir / "docs_*.jsonl", shard_spec = dir / "part_*.bin";
    corpus_fixture() {
        const char* words[] = {"alpha", "beta",   "gamma",  "delta",  "river", "stone",
                               "quiet", "bright", "engine", "garden", "north", "south"};
        std::mt19937 rng(3);
        for (std::uint64_t d = 0; d < files * docs_per_file; ++d) {
            const std::uint64_t n = d == 77 ? 3000 : 1 + rng() % (d % 10 == 0 ? 300 : 30);
            std::string t;
            for (std::uint64_t w = 0; w < n; ++w) t += std::string(w ? " " : "") + words[rng() % 12] + (rng() % 7 == 0 ? "." : "");
            docs.push_back(t);
        }
        std::ofstream l(lines);
        for (const auto& t : docs) l << t << "\n";
        l.close();
        for (std::uint64_t f = 0; f < files; ++f) {
            std::ofstream j(dir / ("docs_" + std::to_string(f) + ".jsonl"));
            for (std::uint64_t d = f * docs_per_file; d < (f + 1) * docs_per_file; ++d) j << "{\"text\": \"" << docs[d] << "\"}\n";
        }
        auto st = sentencepiece::SentencePieceTrainer::Train("--input=" + lines + " --model_prefix=" + (dir / "m") +
                                                             " --vocab_size=200 --hard_vocab_limit=false --minloglevel=2 --num_threads=1");
        REQUIRE_MESSAGE(st.ok(), st.ToString());
        sentencepiece::SentencePieceProcessor spm;
        REQUIRE(spm.Load(model).ok());
        for (const auto& t : docs) {
            std::vector<int> v;
            REQUIRE(spm.Encode(t, &v).ok());
            v.push_back(spm.eos_id());
            ids.emplace_back(v.begin(), v.end());
        }
        for (std::uint64_t f = 0; f < files; ++f) {
            megatron_writer w(dir / ("part_" + std::to_string(f)), token_dtype::uint16);
            for (std::uint64_t d = f * docs_per_file; d < (f + 1) * docs_per_file; ++d)
                w.add_document(std::vector<std::uint32_t>(ids[d].begin(), ids[d].end()));
            w.finish();
        }
    }
    std::uint64_t total_tokens() const {
        std::uint64_t n = 0;
        for (const auto& v : ids) n += v.size();
        return n;
    }
    const std::string& spec(source_kind k) const { return k == source_kind::text ? text_spec : shard_spec; }
    pipeline_config config(source_kind k, unsigned workers, std::uint64_t steps, sample_mode mode = sample_mode::windows) const {
        pipeline_config c{.batch_size = 4,
                          .seq_len = 32,
                          .seed = 9,
                          .mode = mode,
                          .workers = workers,
                          .memory_budget = 64 << 20,
                          .device = device_kind::cpu,
                          .rank = 0,
                          .world_size = 1,
                          .max_steps = steps};
        if (k == source_kind::text) c.text = {.tokenizer = model, .cache_dir = cache};
        return c;
    }
};

const source_kind both[] = {source_kind::tokens, source_kind::text};

struct copied {
    std::uint64_t step = 0;
    std::vector<std::int32_t> inputs, targets, positions, cu, pieces, datasets;
    friend bool operator==(const copied&, const copied&) = default;
};

copied copy_of(const batch& b) {
    auto v = [](auto s) { return std::vector<std::int32_t>(s.begin(), s.end()); };
    return {b.step(),           v(b.host_inputs()),  v(b.host_targets()), v(b.host_position_ids()), v(b.host_cu_seqlens()),
            v(b.host_pieces()), v(b.host_datasets())};
}

std::vector<copied> take(pipeline& p, std::uint64_t n = UINT64_MAX) {
    std::vector<copied> out;
    for (std::uint64_t i = 0; i < n; ++i) {
        auto b = p.next();
        if (!b) break;
        out.push_back(copy_of(*b));
    }
    return out;
}

// What a batch must hold, from the sampler's plan over the documents' ids: shards permute samples
// within an epoch, text keeps them in the epoch's document order.
std::vector<copied> expected(const corpus_fixture& f, source_kind k, const pipeline_config& c, std::uint64_t steps,
                             const sampler_state* from = nullptr) {
    const sampler_dataset d{.documents = f.ids.size(),
                            .length = [&f](std::uint64_t i) { return std::uint64_t(f.ids[i].size()); },
                            .block_starts = {0, docs_per_file, 2 * docs_per_file},
                            .in_stream_order = k == source_kind::text};
    sampler s({d}, {1.0},
              {.seq_len = c.seq_len,
               .global_batch = c.batch_size * std::uint64_t(c.world_size),
               .seed = c.seed,
               .mode = c.mode,
               .shuffle = c.shuffle,
               .tail = c.tail,
               .rank = c.rank,
               .world_size = c.world_size});
    if (from) s.restore(*from);
    const std::uint64_t T = c.seq_len;
    std::vector<copied> out;
    for (std::uint64_t i = 0; i < steps; ++i) {
        const batch_plan plan = s.next();
        copied e{.step = plan.step};
        for (const sample_plan& sp : plan.samples) {
            std::vector<std::int32_t> row;
            for (const segment& g : sp.segments)
                row.insert(row.end(), f.ids[g.document].begin() + g.offset, f.ids[g.document].begin() + g.offset + g.length);
            e.datasets.push_back(0);
            if (c.mode == sample_mode::windows) {
                REQUIRE(row.size() == T + 1);
                e.inputs.insert(e.inputs.end(), row.begin(), row.end() - 1);
                e.targets.insert(e.targets.end(), row.begin() + 1, row.end());
                continue;
            }
            detail::row_boundaries b;
            detail::boundaries_of(sp.segments, T, b);
            std::vector<std::int32_t> targets(T, -1);
            for (std::size_t p = 0; p + 1 < b.cu_seqlens.size(); ++p)
                for (std::int32_t j = b.cu_seqlens[p]; j + 1 < b.cu_seqlens[p + 1]; ++j) targets[j] = row[j + 1];
            e.pieces.push_back(static_cast<std::int32_t>(b.cu_seqlens.size() - 1));
            row.resize(T, 0);
            b.cu_seqlens.resize(T + 1, b.cu_seqlens.back());
            e.inputs.insert(e.inputs.end(), row.begin(), row.end());
            e.targets.insert(e.targets.end(), targets.begin(), targets.end());
            e.positions.insert(e.positions.end(), b.position_ids.begin(), b.position_ids.end());
            e.cu.insert(e.cu.end(), b.cu_seqlens.begin(), b.cu_seqlens.end());
        }
        out.push_back(std::move(e));
    }
    return out;
}

std::string name(source_kind k) { return std::string(to_string(k)); }

}  // namespace

TEST_CASE("Sources.Batches.ArePlannedTokensInEveryModeShuffleAndTail") {
    corpus_fixture f;
    for (source_kind k : both)
        for (sample_mode mode : {sample_mode::windows, sample_mode::packed})
            for (shuffle_mode shuffle : {shuffle_mode::global, shuffle_mode::shard_blocks, shuffle_mode::none})
                for (tail_policy tail : {tail_policy::drop, tail_policy::pad}) {
                    CAPTURE(name(k));
                    CAPTURE(static_cast<int>(mode));
                    CAPTURE(static_cast<int>(shuffle));
                    CAPTURE(static_cast<int>(tail));
                    auto c = f.config(k, 2, 130, mode);  // more than an epoch: the edge and the tail show
                    c.shuffle = shuffle;
                    c.tail = tail;
                    pipeline p(f.spec(k), c);
                    const auto got = take(p);
                    REQUIRE(got.size() == 130);
                    const auto want = expected(f, k, c, 130);
                    for (std::size_t i = 0; i < got.size(); ++i) {
                        CAPTURE(i);
                        REQUIRE(got[i] == want[i]);
                    }
                    CHECK(p.state().epoch[0] >= 1);
                }
}

TEST_CASE("Sources.Shuffle.ModesGiveDifferentOrdersAndNoneIsFileOrder") {
    corpus_fixture f;
    for (source_kind k : both) {
        CAPTURE(name(k));
        std::vector<std::vector<std::int32_t>> firsts;
        for (shuffle_mode shuffle : {shuffle_mode::global, shuffle_mode::shard_blocks, shuffle_mode::none}) {
            auto c = f.config(k, 1, 1);
            c.shuffle = shuffle;
            pipeline p(f.spec(k), c);
            firsts.push_back(take(p).at(0).inputs);
        }
        CHECK(firsts[0] != firsts[2]);
        CHECK(firsts[1] != firsts[2]);
        if (k == source_kind::text) {  // stream order, documents in file order: the first batch is the stream's first 4 x 32 tokens
            std::vector<std::int32_t> stream;
            for (std::size_t d = 0; stream.size() < 4 * 32; ++d) stream.insert(stream.end(), f.ids[d].begin(), f.ids[d].end());
            stream.resize(4 * 32);
            CHECK(firsts[2] == stream);
        }
    }
}

TEST_CASE("Sources.Workers.SameBatchesWithOneOrThreeWorkers") {
    corpus_fixture f;
    for (source_kind k : both)
        for (sample_mode mode : {sample_mode::windows, sample_mode::packed}) {
            CAPTURE(name(k));
            pipeline one(f.spec(k), f.config(k, 1, 60, mode)), three(f.spec(k), f.config(k, 3, 60, mode));
            const auto a = take(one), b = take(three);
            REQUIRE(a.size() == 60);
            CHECK(a == b);
        }
}

TEST_CASE("Sources.Resume.ExactAtRandomStepsMidDocumentAndAcrossAnEpochEdge") {
    corpus_fixture f;
    std::mt19937 rng(5);
    for (source_kind k : both)
        for (sample_mode mode : {sample_mode::windows, sample_mode::packed}) {
            CAPTURE(name(k));
            CAPTURE(static_cast<int>(mode));
            const std::uint64_t steps = 120;
            pipeline whole(f.spec(k), f.config(k, 2, steps, mode));
            const auto all = take(whole);
            REQUIRE(all.size() == steps);
            // Where epoch 1 starts: stops just before, at and after it, and at random steps.
            std::uint64_t edge = 0;
            {
                pipeline walk(f.spec(k), f.config(k, 1, steps, mode));
                for (std::uint64_t i = 0; walk.next() && edge == 0; ++i)
                    if (walk.state().epoch[0] == 1) edge = i;
            }
            REQUIRE(edge > 1);
            bool mid_document = false;
            for (std::uint64_t stop : {edge - 1, edge, edge + 1, std::uint64_t(1 + rng() % 100), std::uint64_t(1 + rng() % 100)}) {
                CAPTURE(stop);
                std::string saved;
                {
                    pipeline first(f.spec(k), f.config(k, 3, stop, mode));
                    (void)take(first);
                    saved = nlohmann::json::parse(to_json(first.state())).dump();  // as a checkpoint's JSON library writes it back
                }
                const pipeline_state s = pipeline_state_from_json(saved);
                CHECK(s.step == stop);
                pipeline second(f.spec(k), f.config(k, 1, steps, mode));
                second.restore(s);
                const auto rest = take(second);
                REQUIRE(rest.size() == steps - stop);
                CHECK(std::equal(rest.begin(), rest.end(), all.begin() + static_cast<std::ptrdiff_t>(stop)));
                sampler probe({sampler_dataset{.documents = f.ids.size(),
                                               .length = [&f](std::uint64_t i) { return std::uint64_t(f.ids[i].size()); },
                                               .block_starts = {0, docs_per_file, 2 * docs_per_file},
                                               .in_stream_order = k == source_kind::text}},
                              {1.0}, {.seq_len = 32, .global_batch = 4, .seed = 9, .mode = mode, .rank = 0, .world_size = 1});
                probe.restore(s);
                mid_document = mid_document || probe.next().samples[0].segments[0].offset > 0;
            }
            CHECK(mid_document);  // at least one resumed batch starts inside a document
        }
}

TEST_CASE("Sources.Ranks.SlicesAreDisjointAndJoinToTheOneRankBatch") {
    corpus_fixture f;
    for (source_kind k : both)
        for (sample_mode mode : {sample_mode::windows, sample_mode::packed}) {
            CAPTURE(name(k));
            auto one = f.config(k, 2, 40, mode);
            one.batch_size = 6;
            pipeline single(f.spec(k), one);
            const auto whole = take(single);
            for (int world : {2, 3}) {
                CAPTURE(world);
                std::vector<std::vector<copied>> ranks;
                for (int r = 0; r < world; ++r) {
                    auto c = one;
                    c.batch_size = 6 / static_cast<std::uint64_t>(world);
                    c.world_size = world;
                    c.rank = r;
                    pipeline p(f.spec(k), c);
                    ranks.push_back(take(p));
                    REQUIRE(ranks.back().size() == 40);
                }
                for (std::size_t step = 0; step < 40; ++step) {
                    copied joined{.step = step};
                    for (const auto& r : ranks) {
                        auto add = [](std::vector<std::int32_t>& to, const std::vector<std::int32_t>& from) {
                            to.insert(to.end(), from.begin(), from.end());
                        };
                        add(joined.inputs, r[step].inputs), add(joined.targets, r[step].targets), add(joined.positions, r[step].positions);
                        add(joined.cu, r[step].cu), add(joined.pieces, r[step].pieces), add(joined.datasets, r[step].datasets);
                    }
                    REQUIRE(joined == whole[step]);
                }
            }
        }
}

TEST_CASE("Sources.Tail.DropAndPadGiveTheDocumentedStepsPerEpoch") {
    // Windows: an epoch has (tokens - 1) / T samples; drop keeps floor(samples / B) steps, pad
    // ceil(samples / B), completing the last batch with the epoch's first samples.
    corpus_fixture f;
    const std::uint64_t samples = (f.total_tokens() - 1) / 32;
    REQUIRE(samples % 4 != 0);  // the corpus leaves a partial last batch
    for (source_kind k : both)
        for (tail_policy tail : {tail_policy::drop, tail_policy::pad}) {
            CAPTURE(name(k));
            auto c = f.config(k, 2, 0);
            c.tail = tail;
            pipeline p(f.spec(k), c);
            std::vector<copied> epoch0;
            while (auto b = p.next()) {
                if (p.state().epoch[0] != 0) break;
                epoch0.push_back(copy_of(*b));
            }
            CHECK(epoch0.size() == (tail == tail_policy::drop ? samples / 4 : (samples + 3) / 4));
            if (tail == tail_policy::pad) {  // the padded rows repeat the epoch's first samples
                const std::uint64_t padded = epoch0.size() * 4 - samples, kept = 4 - padded;
                const auto& last = epoch0.back().inputs;
                CHECK(std::equal(last.begin() + static_cast<std::ptrdiff_t>(kept * 32), last.end(), epoch0.front().inputs.begin()));
            }
        }
}

TEST_CASE("Sources.Packed.BoundariesTargetsAndPositionsAgree") {
    corpus_fixture f;
    for (source_kind k : both) {
        CAPTURE(name(k));
        pipeline p(f.spec(k), f.config(k, 2, 60, sample_mode::packed));
        std::uint64_t pieces = 0;
        for (const auto& b : take(p))
            for (std::size_t row = 0; row < 4; ++row) {
                const std::int32_t* cu = b.cu.data() + row * 33;
                const std::int32_t* in = b.inputs.data() + row * 32;
                const std::int32_t* tg = b.targets.data() + row * 32;
                const std::int32_t* pos = b.positions.data() + row * 32;
                REQUIRE(cu[0] == 0);
                REQUIRE(cu[b.pieces[row]] == cu[32]);  // entries after the last piece repeat its end
                pieces += static_cast<std::uint64_t>(b.pieces[row]);
                for (std::int32_t p = 0; p < b.pieces[row]; ++p)
                    for (std::int32_t j = cu[p]; j < cu[p + 1]; ++j) {
                        REQUIRE(pos[j] == j - cu[p]);
                        REQUIRE(tg[j] == (j + 1 < cu[p + 1] ? in[j + 1] : -1));
                    }
                for (std::int32_t j = cu[32]; j < 32; ++j) REQUIRE((in[j] == 0 && tg[j] == -1 && pos[j] == 0));
            }
        CHECK(pieces > 60 * 4);  // rows hold several documents
        CHECK(p.stats().padding_tokens > 0);
    }
}

TEST_CASE("TextSource.Ids.EqualSpmEncodeForTheSameModelAndText") {
    if (std::system("command -v spm_encode >/dev/null 2>&1") != 0) ft::skip("spm_encode not installed (Debian package sentencepiece)");
    corpus_fixture f;
    auto r = ft::run("spm_encode --model=" + f.model + " --output_format=id < " + f.lines, f.dir);
    REQUIRE(r.code == 0);
    sentencepiece::SentencePieceProcessor spm;
    REQUIRE(spm.Load(f.model).ok());
    std::vector<std::int32_t> stream;  // each document's ids, then EOS, in file order
    std::istringstream in(r.out);
    for (std::string line; std::getline(in, line);) {
        std::istringstream ids(line);
        for (int id; ids >> id;) stream.push_back(id);
        stream.push_back(spm.eos_id());
    }
    auto c = f.config(source_kind::text, 2, 40);
    c.shuffle = shuffle_mode::none;  // file order, windows in stream order: batch k is stream tokens [k B T, (k + 1) B T + 1)
    for (const std::string& input : {f.text_spec, f.lines}) {
        CAPTURE(input);
        if (input == f.lines) c.text.documents.split = text_split::lines;
        pipeline p(input, c);
        const auto batches = take(p);
        REQUIRE(batches.size() == 40);
        std::uint64_t at = 0;
        for (const auto& b : batches)
            for (std::uint64_t row = 0; row < 4; ++row, at += 32)
                for (std::uint64_t t = 0; t < 32; ++t) {
                    REQUIRE(at + t + 1 < stream.size());
                    CHECK(b.inputs[row * 32 + t] == stream[at + t]);
                    CHECK(b.targets[row * 32 + t] == stream[at + t + 1]);
                }
        CHECK(p.stats().tokenize_s > 0);
    }
}

TEST_CASE("TextSource.Lengths.CachedReusedAndCountedAgainWhenStaleOrDamaged") {
    corpus_fixture f;
    const text_config cfg{.tokenizer = f.model, .cache_dir = f.cache};
    const text_source first({f.text_spec}, cfg);
    CHECK(first.lengths_origin().find("computed by") == 0);
    CHECK(first.lengths_origin().find("cached in " + f.cache) != std::string::npos);
    CHECK(first.total_tokens() == f.total_tokens());
    for (std::size_t d = 0; d < f.ids.size(); ++d) REQUIRE(first.document_tokens(d) == f.ids[d].size());
    const text_source second({f.text_spec}, cfg);
    CHECK(second.lengths_origin().find("read from " + f.cache) == 0);
    // Another tokenizer option is another key: counted, cached beside the first.
    const text_source with_bos({f.text_spec}, text_config{.tokenizer = f.model, .add_bos = true, .cache_dir = f.cache});
    CHECK(with_bos.lengths_origin().find("computed by") == 0);
    CHECK(with_bos.total_tokens() == f.total_tokens() + f.ids.size());
    // A damaged cache file (one flipped byte) is noticed by its checksum, counted again and rewritten.
    const std::string path = second.lengths_origin().substr(std::string("read from ").size());
    {
        std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
        io.seekp(-9, std::ios::end);
        const char c = static_cast<char>(io.peek());
        io.put(static_cast<char>(c ^ 0x10));
    }
    const text_source damaged({f.text_spec}, cfg);
    CHECK(damaged.lengths_origin().find("cache unusable") == 0);
    CHECK(damaged.lengths_origin().find("checksum mismatch") != std::string::npos);
    CHECK(damaged.total_tokens() == f.total_tokens());
    CHECK(text_source({f.text_spec}, cfg).lengths_origin().find("read from") == 0);
    // A changed file is a different corpus: its identity (size, time) is in the key.
    {
        std::ofstream more(f.dir / "docs_2.jsonl", std::ios::app);
        more << "{\"text\": \"alpha beta gamma\"}\n";
    }
    const text_source changed({f.text_spec}, cfg);
    CHECK(changed.lengths_origin().find("computed by") == 0);
    CHECK(changed.corpus().document_count() == f.docs.size() + 1);
    // cache_dir "none": nothing written.
    const text_source uncached({f.text_spec}, text_config{.tokenizer = f.model, .cache_dir = "none"});
    CHECK(uncached.lengths_origin().find("not cached (cache_dir none)") != std::string::npos);
}

TEST_CASE("TextSource.LongDocuments.TokenizedOncePerEpochNotOncePerBatch") {
    // Document 77 (~3000 words) spans many batches made by different workers; each other document is
    // tokenized by the one or two batches that hold it. Over one epoch the text read for tokenizing
    // stays below twice the corpus (without the shared cache it would be many times the long document).
    corpus_fixture f;
    auto c = f.config(source_kind::text, 3, 0);
    c.shuffle = shuffle_mode::none;
    pipeline p(f.text_spec, c);
    const std::uint64_t steps = (f.total_tokens() - 1) / 32 / 4;
    for (std::uint64_t i = 0; i < steps; ++i) REQUIRE(p.next());
    std::uint64_t text_bytes = 0;
    for (const auto& d : f.docs) text_bytes += d.size();
    REQUIRE(f.docs[77].size() > text_bytes / 4);
    MESSAGE("one epoch read " << p.stats().bytes_read << " bytes of text for a corpus of " << text_bytes);
    CHECK(p.stats().bytes_read >= text_bytes * 9 / 10);
    CHECK(p.stats().bytes_read < 2 * text_bytes);
    const auto* source = dynamic_cast<const text_source*>(p.sources()[0].source.get());
    REQUIRE(source != nullptr);
    CHECK(source->document_cache().used() <= source->document_cache().capacity());
}

TEST_CASE("TextSource.Errors.NamedFileOffsetAndField") {
    corpus_fixture f;
    // An invalid JSONL line is found when the corpus is opened: format_error with the file and offset.
    ft::write_text(f.dir / "bad.jsonl", "{\"text\": \"fine\"}\n{\"text\": 3}\n");
    auto c = f.config(source_kind::text, 1, 1);
    try {
        pipeline p(f.dir / "bad.jsonl", c);
        FAIL("opened");
    } catch (const format_error& e) {
        CHECK(e.file() == f.dir / "bad.jsonl");
        CHECK(e.offset() == 17u);
    }
    c.text.tokenizer = f.dir / "missing.model";
    try {
        pipeline p(f.text_spec, c);
        FAIL("opened without a model");
    } catch (const config_error& e) {
        CHECK(e.field() == "text.tokenizer");
    }
    c.text.tokenizer.clear();
    CHECK_THROWS_AS(pipeline(f.text_spec, c), config_error);
    CHECK_THROWS_AS(pipeline(f.dir / "nothing-here.jsonl", f.config(source_kind::text, 1, 1)), io_error);
    // Every document empty and no EOS: no tokens at all is a config_error at construction, not a hang.
    ft::write_text(f.dir / "empty.jsonl", "{\"text\": \"\"}\n{\"text\": \"\"}\n");
    c = f.config(source_kind::text, 1, 1);
    c.text.add_eos = false;
    try {
        pipeline p(f.dir / "empty.jsonl", c);
        FAIL("a corpus without tokens was accepted");
    } catch (const config_error& e) {
        CHECK(std::string(e.what()).find("0 tokens") != std::string::npos);
    }
    // A document rewritten under a running job (same bytes, other words) is a format_error naming the file.
    {
        pipeline p(f.dir / "docs_0.jsonl", f.config(source_kind::text, 1, 0));
        std::string all;
        {
            std::ifstream in(f.dir / "docs_0.jsonl");
            all.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
        }
        for (char& ch : all)
            if (ch >= 'a' && ch <= 'z') ch = 'x';
        ft::write_text(f.dir / "docs_0.jsonl", all);
        try {
            for (int i = 0; i < 1000 && p.next(); ++i) {
            }
            FAIL("the rewritten file was never noticed");
        } catch (const format_error& e) {
            CHECK(e.file() == f.dir / "docs_0.jsonl");
        }
    }
    // A file truncated after opening surfaces at next() as a format_error naming it.
    pipeline p(f.dir / "docs_1.jsonl", f.config(source_kind::text, 1, 0));
    std::filesystem::resize_file(f.dir / "docs_1.jsonl", 10);
    try {
        for (int i = 0; i < 1000 && p.next(); ++i) {
        }
        FAIL("ran over a truncated file");
    } catch (const format_error& e) {
        CHECK(e.file() == f.dir / "docs_1.jsonl");
        CHECK(std::string(e.what()).find("ends early") != std::string::npos);
    }
}

TEST_CASE("TextSource.State.AnOldTextPipelineStateIsRefusedWithItsVersion") {
    const std::string old = R"({"format": "feedline.text_state", "version": 1, "seed": 9, "seq_len": 32, "batch_size": 4, "world_size": 1,
                                "rank": 0, "packed": 0, "step": 11, "document": 17, "offset": 5})";
    try {
        (void)pipeline_state_from_json(old);
        FAIL("an old text state was accepted");
    } catch (const config_error& e) {
        CHECK(e.field() == "state");
        CHECK(std::string(e.what()).find("feedline.text_state version 1") != std::string::npos);
    }
}

TEST_CASE("Blend.Proportions.EveryPrefixWithinOneSampleOfItsWeight") {
    corpus_fixture f;
    // Second datasets: the third shard alone, the first JSONL file alone.
    const std::string shard_b = f.dir / "part_2", text_b = f.dir / "docs_0.jsonl";
    struct blend_case {
        const char* what;
        std::vector<weighted_spec> specs;
    };
    const blend_case cases[] = {{"shard + shard", {{0.7, f.shard_spec}, {0.3, shard_b}}},
                                {"text + shard", {{0.25, f.text_spec}, {0.75, f.shard_spec}}},
                                {"text + text", {{2, f.text_spec}, {1, text_b}}},
                                {"three", {{0.5, f.shard_spec}, {0.3, f.text_spec}, {0.2, text_b}}}};
    for (const auto& bc : cases) {
        CAPTURE(bc.what);
        auto c = f.config(source_kind::tokens, 2, 150);
        bool text = false;
        for (const auto& s : bc.specs) text = text || detect_source(s.spec) == source_kind::text;
        if (text) c.text = {.tokenizer = f.model, .cache_dir = f.cache};
        pipeline p(bc.specs, c);
        double total = 0;
        for (const auto& s : bc.specs) total += s.weight;
        std::vector<std::uint64_t> taken(bc.specs.size(), 0);
        std::uint64_t n = 0;
        for (const auto& b : take(p))
            for (std::int32_t d : b.datasets) {
                REQUIRE(d >= 0);
                REQUIRE(static_cast<std::size_t>(d) < taken.size());
                ++taken[static_cast<std::size_t>(d)];
                ++n;
                for (std::size_t i = 0; i < taken.size(); ++i)
                    REQUIRE(std::abs(double(taken[i]) - bc.specs[i].weight / total * double(n)) <= 1.0);
            }
        CHECK(n == 150 * 4);
    }
}

// A worker gathers the windows of every source in a batch and converts them in one pass at its end:
// each window must still be read in its own file's dtype, whichever source's writer does the pass.
TEST_CASE("Blend.Dtypes.ABatchOfUint16Int32AndLlmcWindowsReadsEachInItsOwnDtypeOnEveryBackend") {
    ft::scratch_dir dir;
    {
        megatron_writer small(dir / "small", token_dtype::uint16);  // tokens 1..30,000
        megatron_writer wide(dir / "wide", token_dtype::int32);     // tokens 100,000..199,999: no uint16 holds them
        for (std::uint32_t d = 0; d < 300; ++d) {
            std::vector<std::uint32_t> a(40 + d % 23), b(30 + d % 17);
            for (std::uint32_t i = 0; i < a.size(); ++i) a[i] = (d * 131 + i) % 30000 + 1;
            for (std::uint32_t i = 0; i < b.size(); ++i) b[i] = 100000 + (d * 977 + i) % 100000;
            small.add_document(a);
            wide.add_document(b);
        }
        small.finish();
        wide.finish();
        llmc_writer lc(dir / "lc", token_dtype::uint16, 0, 4000);  // delimiter 0, tokens 40,000..49,999
        for (std::uint32_t d = 0; d < 300; ++d) {
            std::vector<std::uint32_t> t(35 + d % 19);
            for (std::uint32_t i = 0; i < t.size(); ++i) t[i] = 40000 + (d * 37 + i) % 10000;
            lc.add_document(std::span<const std::uint32_t>(t));
        }
        lc.finish();
    }
    const std::string spec = "0.3 " + (dir / "small") + " 0.4 " + (dir / "wide") + " 0.3 " + (dir / "lc_*.bin");
    const auto in_range = [](std::int32_t dataset, std::int32_t t) {
        switch (dataset) {
            case 0: return t >= 1 && t <= 30000;
            case 1: return t >= 100000 && t < 200000;
            case 2: return t == 0 || (t >= 40000 && t < 50000);
            default: return false;
        }
    };
    std::vector<io_backend> backends{io_backend::pread, io_backend::mmap};
    if (!io_uring_unavailable_reason()) backends.push_back(io_backend::io_uring);
    std::vector<std::vector<std::int32_t>> first;  // pread's batches: inputs, then targets, then datasets
    for (const io_backend backend : backends) {
        CAPTURE(to_string(backend));
        const pipeline_config c{.batch_size = 16,
                                .seq_len = 32,
                                .workers = 2,
                                .memory_budget = 64 << 20,
                                .device = device_kind::cpu,
                                .rank = 0,
                                .world_size = 1,
                                .max_steps = 60,
                                .shards = {.backend = backend}};
        pipeline p(spec, c);
        std::vector<std::vector<std::int32_t>> got;
        std::uint64_t mixed = 0;  // batches holding rows of all three
        for (std::optional<batch> b; (b = p.next());) {
            const auto in = b->host_inputs(), tg = b->host_targets(), ds = b->host_datasets();
            bool seen[3] = {false, false, false};
            for (std::size_t r = 0; r < ds.size(); ++r) {
                REQUIRE((ds[r] >= 0 && ds[r] < 3));
                seen[ds[r]] = true;
                for (std::size_t i = 0; i < 32; ++i) {
                    CAPTURE(r);
                    CAPTURE(i);
                    REQUIRE(in_range(ds[r], in[r * 32 + i]));
                    REQUIRE(in_range(ds[r], tg[r * 32 + i]));
                    if (i + 1 < 32) REQUIRE(tg[r * 32 + i] == in[r * 32 + i + 1]);  // one window, shifted by one
                }
            }
            mixed += seen[0] && seen[1] && seen[2];
            got.emplace_back(in.begin(), in.end());
            got.emplace_back(tg.begin(), tg.end());
            got.emplace_back(ds.begin(), ds.end());
        }
        CHECK(got.size() == 3 * 60);
        CHECK(mixed > 30);
        if (first.empty())
            first = got;
        else
            CHECK(got == first);  // pread reads each source into its own buffer: the reference
    }
}

TEST_CASE("Blend.Resume.MidBlendEqualsTheUninterruptedRun") {
    corpus_fixture f;
    auto c = f.config(source_kind::text, 2, 100);
    const std::string spec = "0.6 " + f.shard_spec + " 0.4 " + f.text_spec;  // Megatron's --data-path form
    pipeline whole(spec, c);
    const auto all = take(whole);
    REQUIRE(all.size() == 100);
    for (std::uint64_t stop : {1ull, 37ull, 80ull}) {
        CAPTURE(stop);
        std::string saved;
        {
            auto first_cfg = c;
            first_cfg.max_steps = stop;
            first_cfg.workers = 3;
            pipeline first(spec, first_cfg);
            (void)take(first);
            saved = to_json(first.state());
        }
        pipeline second(spec, c);
        second.restore(pipeline_state_from_json(saved));
        const auto rest = take(second);
        REQUIRE(rest.size() == 100 - stop);
        CHECK(std::equal(rest.begin(), rest.end(), all.begin() + static_cast<std::ptrdiff_t>(stop)));
    }
    // The list form is the same blend.
    pipeline listed(std::vector<weighted_spec>{{0.6, f.shard_spec}, {0.4, f.text_spec}}, c);
    CHECK(take(listed) == all);
    // A state of another blend (other weights) is refused.
    pipeline other("0.5 " + f.shard_spec + " 0.5 " + f.text_spec, c);
    pipeline_state s = whole.state();
    CHECK_THROWS_AS(other.restore(s), config_error);
}

TEST_CASE("Blend.Spec.WeightsAndWordsAreCheckedWithTheirPosition") {
    auto refused = [](const std::string& spec, const std::string& says) {
        CAPTURE(spec);
        try {
            (void)parse_data_spec(spec);
            FAIL("accepted");
        } catch (const config_error& e) {
            CHECK(e.field() == "dataset");
            CHECK(std::string(e.what()).find(says) != std::string::npos);
        }
    };
    refused("0.7 a 0.3", "word 3 has no path after it");
    refused("0 a 1 b", "weight 1 (0.000000) must be a positive");
    refused("1 a -2 b", "weight 2");
    refused("nan a 1 b", "weight 1");
    refused("1 a inf b", "weight 2");
    refused("x a 1 b", "word 1 of");
    refused("   ", "empty");
    const auto one = parse_data_spec("data/web");
    REQUIRE(one.size() == 1);
    CHECK(one[0].spec == "data/web");
    const auto two = parse_data_spec("0.7 data/web 0.3 code/*.jsonl");
    REQUIRE(two.size() == 2);
    CHECK(two[1].weight == 0.3);
    CHECK(two[1].spec == "code/*.jsonl");
    corpus_fixture f;
    CHECK_THROWS_AS(pipeline(std::vector<weighted_spec>{{1, f.shard_spec}, {-1, f.shard_spec}}, f.config(source_kind::tokens, 1, 1)),
                    config_error);
    auto c = f.config(source_kind::tokens, 1, 1);
    c.tail = tail_policy::pad;  // a blend has no epoch end
    try {
        pipeline p("1 " + f.shard_spec + " 1 " + f.dir / "part_0", c);
        FAIL("tail = pad accepted for a blend");
    } catch (const config_error& e) {
        CHECK(e.field() == "tail");
    }
}

TEST_CASE("Config.EveryOptionTheDataCannotUseIsAnErrorNamingTheField") {
    corpus_fixture f;
    auto refused = [&](const std::string& spec, const pipeline_config& c, const std::string& field) {
        CAPTURE(field);
        try {
            pipeline p(spec, c);
            FAIL("accepted");
        } catch (const config_error& e) {
            CHECK(e.field() == field);
        }
    };
    const auto shards = f.config(source_kind::tokens, 1, 1);
    auto c = shards;
    c.text.tokenizer = f.model;
    refused(f.shard_spec, c, "text.tokenizer");
    c = shards;
    c.text.add_bos = true;
    refused(f.shard_spec, c, "text.add_bos");
    c = shards;
    c.text.add_eos = false;
    refused(f.shard_spec, c, "text.add_eos");
    c = shards;
    c.text.documents.field = "content";
    refused(f.shard_spec, c, "text.documents.field");
    c = shards;
    c.text.documents.split = text_split::lines;
    refused(f.shard_spec, c, "text.documents.split");
    c = shards;
    c.text.documents.skip_invalid = true;
    refused(f.shard_spec, c, "text.documents.skip_invalid");
    c = shards;
    c.text.cache_dir = f.cache;
    refused(f.shard_spec, c, "text.cache_dir");
    // Set explicitly, even to its default (as a command line or Python sets it): refused too.
    c = shards;
    set_option(c, "field", "text");
    refused(f.shard_spec, c, "text.documents.field");
    c = f.config(source_kind::text, 1, 1);
    c.shards.backend = io_backend::mmap;
    refused(f.text_spec, c, "shards.backend");
    // With a blend of both kinds, both option sets apply.
    c.shards.backend = io_backend::pread;
    pipeline both_kinds("1 " + f.shard_spec + " 1 " + f.text_spec, c);
    CHECK(both_kinds.next());
    CHECK(both_kinds.stats().io_backend.find("pread") != std::string::npos);
}

TEST_CASE("Transform.TokenizeInOrder.IdsInInputOrderWithAnyThreadsAndAFailureStopsEveryThread") {
    corpus_fixture f;
    for (unsigned threads : {1u, 3u}) {
        CAPTURE(threads);
        std::size_t next = 0;
        std::vector<std::vector<std::int32_t>> got;
        tokenize_in_order(
            {.model = f.model}, threads,
            [&](std::vector<std::string>& chunk) {  // chunks of 7 documents
                for (; chunk.size() < 7 && next < f.docs.size(); ++next) chunk.push_back(f.docs[next]);
                return !chunk.empty();
            },
            [&](const std::vector<std::string>& docs, const std::vector<std::vector<std::int32_t>>& ids) {
                REQUIRE(docs.size() == ids.size());
                got.insert(got.end(), ids.begin(), ids.end());
            });
        CHECK(got == f.ids);  // add_eos is on by default: the ids plus EOS, in input order
    }
    // A reader that says "no more" with documents in hand still has them written.
    std::vector<std::vector<std::int32_t>> last;
    tokenize_in_order(
        {.model = f.model}, 2,
        [&](std::vector<std::string>& chunk) {
            chunk = {f.docs[0], f.docs[1]};
            return false;
        },
        [&](const auto&, const std::vector<std::vector<std::int32_t>>& ids) { last.insert(last.end(), ids.begin(), ids.end()); });
    CHECK(last == std::vector<std::vector<std::int32_t>>{f.ids[0], f.ids[1]});
    // A failure while writing (or reading) reaches the caller with its type; no thread is left behind.
    const std::size_t threads_before = ft::baseline_thread_count();
    std::size_t chunks = 0;
    CHECK_THROWS_AS(tokenize_in_order(
                        {.model = f.model}, 2,
                        [&](std::vector<std::string>& chunk) {
                            chunk.assign(3, f.docs[0]);
                            return true;  // never ends by itself
                        },
                        [&](const auto&, const auto&) {
                            if (++chunks == 5) throw io_error("out.bin", ENOSPC, "disk full");
                        }),
                    io_error);
    // pthread_join returns once the kernel clears the thread's id, a moment before the thread leaves
    // /proc/self/task (CI saw one still listed): wait, boundedly, for exited threads to go. A thread
    // left running stays counted. At most: the baseline itself may have counted its exiting thread.
    for (int i = 0; i < 2000 && ft::thread_count() > threads_before; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    CHECK(ft::thread_count() <= threads_before);
    CHECK_THROWS_AS(tokenize_in_order(
                        {.model = f.model}, 2, [&](std::vector<std::string>&) -> bool { throw format_error("in.jsonl", 7, "bad line"); },
                        [&](const auto&, const auto&) {}),
                    format_error);
}

TEST_CASE("Output.PackText.TheSameDatasetWithAnyThreadsAndAStopFromAnotherThreadLeavesNoOutput") {
    // pack_text (feedline-pack's engine) on its reader, tokenizer and writer threads: the tools are not
    // built under ThreadSanitizer, so this is where its threads are checked. The dataset must be the
    // corpus's ids (spm's own, plus EOS) in input order, byte for byte the same with 1 and 3 threads.
    corpus_fixture f;
    const std::string out_dir = f.dir / "packed";
    std::filesystem::create_directories(out_dir);
    // The corpus 30 times over (4,500 documents): the reader hands out 2,048 a chunk, so the three
    // tokenizers each get chunks and the writer puts them back in order.
    const int copies = 30;
    const std::string input = f.dir / "repeated.jsonl";
    {
        std::ofstream j(input);
        for (int c = 0; c < copies; ++c) {
            for (const auto& t : f.docs) j << "{\"text\": \"" << t << "\"}\n";
            j << "{\"text\": unquoted}\n";  // one invalid line a copy: skipped and counted
        }
    }
    std::vector<std::byte> want;
    for (int c = 0; c < copies; ++c)
        for (const auto& doc : f.ids)
            for (const std::int32_t id : doc) {
                const auto v = static_cast<std::uint16_t>(id);  // 200 pieces: uint16 tokens, little-endian
                want.push_back(static_cast<std::byte>(v & 0xFF));
                want.push_back(static_cast<std::byte>(v >> 8));
            }
    std::vector<std::vector<std::byte>> indexes;
    for (unsigned threads : {1u, 3u}) {
        CAPTURE(threads);
        const std::string out = out_dir + "/t" + std::to_string(threads);
        std::uint64_t reports = 0, skipped_seen = 0;
        bool skipped_rise = true;
        const pack_result r = pack_text(
            out, {.inputs = {input}, .tokenizer = {.model = f.model}, .documents = {.skip_invalid = true}, .threads = threads}, nullptr,
            [&](const pack_progress& p) {  // on the writing thread while the reader reads on
                ++reports;
                skipped_rise &= p.skipped >= skipped_seen && p.skipped <= copies;
                skipped_seen = p.skipped;
            },
            nullptr, std::chrono::milliseconds(0));
        CHECK(r.totals.documents == copies * f.docs.size());
        CHECK(r.totals.skipped == copies);
        CHECK(skipped_rise);
        CHECK(reports >= 4);  // after each chunk written, and the totals
        REQUIRE(r.written == std::vector<std::string>{out});
        CHECK(ft::read_bytes(out + ".bin") == want);
        indexes.push_back(ft::read_bytes(out + ".idx"));
    }
    CHECK(indexes[0] == indexes[1]);

    // A stop set by another thread while the writer reports: "interrupted", every thread joined, and
    // nothing under the output's name (no pair, no half-written file, no lock left).
    const std::size_t threads_before = ft::baseline_thread_count();
    std::atomic<bool> stop{false}, reported{false};
    std::thread stopper([&] {
        for (int i = 0; i < 10000 && !reported.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        stop.store(true);
    });
    const std::string stopped = out_dir + "/stopped";
    std::string failure;  // checked once the stopper is joined
    try {
        pack_text(
            stopped, {.inputs = {input}, .tokenizer = {.model = f.model}, .documents = {.skip_invalid = true}, .threads = 3}, nullptr,
            [&](const pack_progress&) {
                reported.store(true);
                // Held here until the stop is set (boundedly), so the pack cannot finish first.
                for (int i = 0; i < 10000 && !stop.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
            },
            &stop, std::chrono::milliseconds(0));
        failure = "none: the pack finished despite the stop";
    } catch (const error& e) {
        failure = e.what();
    }
    stopper.join();
    CHECK_MESSAGE(failure.find("interrupted") != std::string::npos, failure);
    for (int i = 0; i < 2000 && ft::thread_count() > threads_before; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    CHECK(ft::thread_count() <= threads_before);
    for (const auto& e : std::filesystem::directory_iterator(out_dir))
        CHECK_MESSAGE(e.path().filename().string().rfind("stopped", 0) != 0, "left behind: " << e.path());
}

TEST_CASE("Text.Tokenizer.LongDocumentsEncodedInPiecesGiveTheIdsOfTheWholeDocument") {
    // Mixed text: several scripts, digits, punctuation, and every kind of whitespace run, so a split
    // before a space lands next to all of them.
    ft::scratch_dir dir;
    const char* sentences[] = {"The river, quiet at dawn, carried 42 boats.",
                               "Ça coûte 3,50 € — très cher!",
                               "東京は大きい都市です。",
                               "naïve café résumé déjà vu",
                               "x=1; y = 2;  z=x+y  # sum",
                               "Ελληνικά κείμενα εδώ.",
                               "emoji 🙂 and   three spaces",
                               "tab\tseparated\tvalues",
                               "line one\nline two\n\nafter a blank",
                               "  leading and trailing  "};
    std::mt19937 rng(11);
    const char* gaps[] = {" ", "  ", "\t", "\n", " \n ", "   "};
    std::string training, long_doc;
    for (int i = 0; i < 4000; ++i) {
        const std::string s = sentences[rng() % 10];
        training += s + "\n";
        long_doc += s + gaps[rng() % 6];
    }
    ft::write_text(dir / "train.txt", training);
    auto train = [&](const std::string& name, const std::string& extra) {
        auto st = sentencepiece::SentencePieceTrainer::Train(
            "--input=" + (dir / "train.txt") + " --model_prefix=" + (dir / name) +
            " --vocab_size=300 --hard_vocab_limit=false --minloglevel=2 --num_threads=1 --character_coverage=1.0" + extra);
        REQUIRE_MESSAGE(st.ok(), st.ToString());
        return dir / (name + ".model");
    };
    for (const std::string type : {"unigram", "bpe"}) {
        for (const std::string norm : {"nmt_nfkc", "identity"}) {
            CAPTURE(type);
            CAPTURE(norm);
            const std::string model = train(type + "-" + norm, " --model_type=" + type + " --normalization_rule_name=" + norm);
            sentencepiece_tokenizer whole({.model = model, .piece_bytes = std::uint64_t(1) << 30});
            sentencepiece_tokenizer pieces({.model = model, .piece_bytes = 1000});
            REQUIRE(pieces.pieces_are_exact());
            std::vector<std::int32_t> a, b;
            REQUIRE(whole.encode(long_doc, a).empty());
            REQUIRE(pieces.encode(long_doc, b).empty());
            REQUIRE(a.size() > 1000);
            CHECK(a == b);
            sentencepiece::SentencePieceProcessor spm;  // and both are sentencepiece's own ids
            REQUIRE(spm.Load(model).ok());
            std::vector<int> ref;
            REQUIRE(spm.Encode(long_doc, &ref).ok());
            ref.push_back(spm.eos_id());
            CHECK(std::vector<std::int32_t>(ref.begin(), ref.end()) == a);
            // Split at every space of a shorter stretch too: each piece as small as it gets.
            sentencepiece_tokenizer smallest({.model = model, .piece_bytes = 1});
            const std::string part = long_doc.substr(0, 20000);
            REQUIRE(whole.encode(part, a).empty());
            REQUIRE(smallest.encode(part, b).empty());
            CHECK(a == b);
        }
    }
    // A run without a space longer than may be given at once: refused, saying where.
    const std::string model = dir / "unigram-nmt_nfkc.model";
    sentencepiece_tokenizer bounded({.model = model, .piece_bytes = 1000, .max_unsplit_bytes = 4000});
    std::vector<std::int32_t> ids;
    const std::string run = "start " + std::string(5000, 'x') + " end";
    const std::string problem = bounded.encode(run, ids);
    CHECK_MESSAGE(problem.find("a run of 5001 bytes without a space at byte 5") != std::string::npos, problem);
    // Stopped between pieces when asked.
    std::atomic<bool> cancel{true};
    CHECK(bounded.encode(long_doc, ids, &cancel) == "interrupted");
    // A model that keeps runs of spaces cannot be split exactly: whole up to the bound, refused past it.
    sentencepiece_tokenizer kept(
        {.model = train("kept", " --remove_extra_whitespaces=false"), .piece_bytes = 1000, .max_unsplit_bytes = 20000});
    CHECK_FALSE(kept.pieces_are_exact());
    CHECK(kept.encode(long_doc.substr(0, 15000), ids).empty());
    CHECK(kept.encode(long_doc.substr(0, 25000), ids).find("longer than the 20000") != std::string::npos);
}
