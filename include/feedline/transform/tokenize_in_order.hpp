// feedline/transform/tokenize_in_order.hpp: documents to token ids on several threads, handed back in
// the order they were read. A reader thread fills chunks of documents; `threads` tokenizers
// (transform/tokenizer.hpp) take chunks from a bounded lock-free queue (exec/queue.hpp); results pass
// through a reorder window (exec/reorder.hpp) to the calling thread in input order, whatever the
// thread count. Reading, tokenizing and writing overlap, and at most about 6 x threads + 2 chunks
// exist at once (2 x threads queued, 3 x threads in the window, one per tokenizer, the reader's and
// the writer's), so memory stays bounded on any corpus. Used by feedline-pack (tools/pack.cpp) and
// the text source's token-count pass (pipeline/detail/text_token_counts.hpp).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <feedline/error.hpp>
#include <feedline/exec/queue.hpp>
#include <feedline/exec/reorder.hpp>
#include <feedline/transform/tokenizers.hpp>

namespace feedline {

// A document the tokenizer could not encode: its position in the input (0-based, in the order read)
// and the tokenizer's reason. Callers that know where documents come from turn it into a format_error
// naming the file and offset.
class encode_error : public error {
public:
    encode_error(std::uint64_t document, std::string problem)
            : error("document " + std::to_string(document) + ": the tokenizer could not encode it: " + problem),
              document_(document),
              problem_(std::move(problem)) {}
    std::uint64_t document() const noexcept { return document_; }
    const std::string& problem() const noexcept { return problem_; }

private:
    std::uint64_t document_;
    std::string problem_;
};

// `read(std::vector<std::string>& docs) -> bool` fills the next chunk, false when there is no more
// (documents it filled then are still tokenized and written); called on the reader thread. `write(const std::vector<std::string>& docs, const std::vector<std::vector<std::int32_t>>& ids)`
// receives every chunk's documents and ids, in input order, on the calling thread. The first failure
// anywhere (reading, a document the tokenizer cannot encode: encode_error, writing) stops every thread
// and is rethrown here with its type; every thread is joined before this returns or throws. `stop`, when
// given, is watched every 100 ms: once set, every thread stops within about a second (tokenizers
// between documents and between the pieces of a long one) and an error "interrupted" is thrown.
template <class Read, class Write>
void tokenize_in_order(const tokenizer_options& options, unsigned threads, Read&& read, Write&& write,
                       const std::atomic<bool>* stop = nullptr, const std::function<void()>& on_wait = {}) {
    struct chunk {
        std::uint64_t seq = 0;
        std::uint64_t first_document = 0;  // the position of docs[0] in the input
        bool last = false;                 // the end marker, after the last chunk of documents
        std::vector<std::string> docs;
        std::vector<std::vector<std::int32_t>> ids;
    };
    threads = std::max(1u, threads);
    mpmc_queue<chunk> todo(2 * std::size_t(threads));
    reorder_window<chunk> done(3 * std::size_t(threads));  // room for every chunk a tokenizer may hold
    std::mutex failure_mutex;
    std::exception_ptr failure;
    std::atomic<bool> stopping{false};  // tokenizers check it between documents and pieces
    auto fail = [&] {
        {
            std::lock_guard lock(failure_mutex);
            if (!failure) failure = std::current_exception();
        }
        stopping.store(true);
        todo.close();
        done.close();
    };

    std::thread reader;
    std::vector<std::thread> tokenizers;
    auto join_all = [&] {
        todo.close();  // tokenizers waiting for work see the end
        done.close();
        if (reader.joinable()) reader.join();
        for (auto& t : tokenizers) t.join();
    };
    try {
        reader = std::thread([&] {
            try {
                for (std::uint64_t seq = 0, documents = 0;;) {
                    chunk c{.seq = seq, .first_document = documents};
                    const bool more = read(c.docs);
                    if (!c.docs.empty()) {
                        documents += c.docs.size();
                        if (!todo.push(std::move(c))) return;  // not pushed: stopped by a failure
                        ++seq;
                    }
                    if (!more) {
                        (void)todo.push(chunk{.seq = seq, .last = true});
                        return;
                    }
                }
            } catch (...) {
                fail();
            }
        });
        for (unsigned t = 0; t < threads; ++t)
            tokenizers.emplace_back([&] {
                try {
                    const auto tok = make_tokenizer(options);
                    while (auto c = todo.pop()) {
                        c->ids.resize(c->docs.size());
                        for (std::size_t i = 0; i < c->docs.size(); ++i) {
                            if (stopping.load(std::memory_order_relaxed)) return;
                            if (const std::string problem = tok->encode(c->docs[i], c->ids[i], &stopping); !problem.empty()) {
                                if (stopping.load()) return;
                                throw encode_error(c->first_document + i, problem);
                            }
                        }
                        const std::uint64_t seq = c->seq;
                        if (!done.wait_for_room(seq)) return;
                        done.put(seq, std::move(*c));
                    }
                } catch (...) {
                    fail();
                }
            });
    } catch (const std::system_error& e) {  // a thread could not be created (a pids limit): stop the ones that were
        fail();
        join_all();
        throw resource_error("tokenizer thread " + std::to_string(tokenizers.size() + 1) + " of " + std::to_string(threads) +
                             " could not be started (" + e.what() +
                             "): a process or thread limit was reached; use fewer threads or raise the limit");
    } catch (...) {
        fail();
        join_all();
        throw;
    }
    try {
        for (;;) {
            auto c = done.pop_for(std::chrono::milliseconds(100));
            if (!c) {
                if (done.closed()) break;
                if (on_wait) on_wait();
                if (stop && stop->load()) throw error("interrupted");
                continue;
            }
            if (c->last) break;
            write(c->docs, c->ids);
        }
    } catch (...) {
        fail();
    }
    join_all();
    if (failure) std::rethrow_exception(failure);
}

}  // namespace feedline
