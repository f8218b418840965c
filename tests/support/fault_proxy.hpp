// A loopback HTTP proxy in front of the real S3 server that injects faults request by request: latency,
// 503 SlowDown, a connection reset before the response, a body cut short, a stalled body. Remote reads
// go through it by pointing AWS_ENDPOINT_URL at it; requests keep their Host header, so their SigV4
// signatures still verify at the server. Bound to 127.0.0.1; every thread waits at most 100 ms at a
// time and stops with the proxy. For the s3:// fault tests and bench_remote.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

namespace feedline::test {

class fault_proxy {
public:
    enum class fault { none, slow_down, reset, short_body, stall };

    // `upstream`: "http://127.0.0.1:PORT" (the real server).
    explicit fault_proxy(const std::string& upstream) : upstream_port_(port_of(upstream)) {
        listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (listener_ < 0) throw std::runtime_error("fault_proxy: socket failed");
        const int one = 1;
        ::setsockopt(listener_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        sockaddr_in a = loopback(0);
        socklen_t len = sizeof a;
        if (::bind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(listener_, 256) != 0 ||
            ::getsockname(listener_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
            ::close(listener_);
            throw std::runtime_error("fault_proxy: cannot listen on 127.0.0.1");
        }
        port_ = ntohs(a.sin_port);
        acceptor_ = std::thread([this] { accept_loop(); });
    }
    ~fault_proxy() {
        stop_ = true;
        acceptor_.join();  // no connection is added after this
        std::list<std::thread> connections;
        {
            std::lock_guard lock(mutex_);
            connections.swap(connections_);
        }
        for (auto& t : connections) t.join();  // outside the lock: a connection's thread takes it
        ::close(listener_);
    }
    fault_proxy(const fault_proxy&) = delete;
    fault_proxy& operator=(const fault_proxy&) = delete;

    std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }

    // What to do with request number n (0, 1, 2, ... in arrival order), and a delay before each request
    // is forwarded.
    void set(std::function<fault(std::uint64_t)> fault_of, std::chrono::milliseconds latency = {}) {
        std::lock_guard lock(mutex_);
        fault_of_ = std::move(fault_of);
        latency_ = latency;
    }
    std::uint64_t requests() const noexcept { return requests_.load(); }
    std::uint64_t faults() const noexcept { return faults_.load(); }

private:
    static int port_of(const std::string& url) { return std::stoi(url.substr(url.rfind(':') + 1)); }
    static sockaddr_in loopback(int port) {
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(static_cast<std::uint16_t>(port));
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        return a;
    }
    // Waits until `fd` is readable (or hung up), in 100 ms steps; false when the proxy stops first.
    bool wait_readable(int fd) const {
        for (;;) {
            if (stop_) return false;
            pollfd p{fd, POLLIN, 0};
            const int r = ::poll(&p, 1, 100);
            if (r > 0) return true;
            if (r < 0 && errno != EINTR) return false;
        }
    }
    bool send_all(int fd, const char* p, std::size_t n) const {
        while (n > 0) {
            const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
            if (k <= 0) return false;
            p += k;
            n -= static_cast<std::size_t>(k);
        }
        return true;
    }

    void accept_loop() {
        while (wait_readable(listener_)) {
            const int client = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
            if (client < 0) continue;
            std::lock_guard lock(mutex_);
            connections_.emplace_back([this, client] {
                serve(client);
                ::close(client);
            });
        }
    }

    // One client connection: requests (GET or HEAD, no body) one after the other, each forwarded on a
    // new upstream connection and its response relayed, or replaced by a fault.
    void serve(int client) {
        std::string in;
        for (;;) {
            std::size_t head_end;
            while ((head_end = in.find("\r\n\r\n")) == std::string::npos) {
                if (!wait_readable(client)) return;
                char buf[16384];
                const ssize_t k = ::recv(client, buf, sizeof buf, 0);
                if (k <= 0) return;
                in.append(buf, static_cast<std::size_t>(k));
            }
            const std::string request = in.substr(0, head_end + 4);
            in.erase(0, head_end + 4);
            const std::uint64_t n = requests_.fetch_add(1);
            fault f = fault::none;
            std::chrono::milliseconds latency{};
            {
                std::lock_guard lock(mutex_);
                if (fault_of_) f = fault_of_(n);
                latency = latency_;
            }
            for (auto until = std::chrono::steady_clock::now() + latency; std::chrono::steady_clock::now() < until;) {
                if (stop_) return;
                std::this_thread::sleep_for(
                    std::min<std::chrono::steady_clock::duration>(until - std::chrono::steady_clock::now(), std::chrono::milliseconds(20)));
            }
            if (f != fault::none) faults_.fetch_add(1);
            if (f == fault::slow_down) {
                const std::string body =
                    "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SlowDown</Code>"
                    "<Message>Please reduce your request rate.</Message></Error>";
                const std::string response =
                    "HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nContent-Length: " + std::to_string(body.size()) +
                    "\r\n\r\n" + body;
                if (!send_all(client, response.data(), response.size())) return;
                continue;
            }
            if (f == fault::reset) {  // an RST instead of a response
                const linger l{1, 0};
                ::setsockopt(client, SOL_SOCKET, SO_LINGER, &l, sizeof l);
                return;
            }
            std::string response = forward(request);
            if (response.empty()) return;
            const std::size_t split = response.find("\r\n\r\n");
            std::string head = response.substr(0, split + 4);
            const std::string body = response.substr(split + 4);
            // The upstream connection closes after each response; the client's need not.
            for (std::size_t c = head.find("Connection: close\r\n"); c != std::string::npos; c = head.find("Connection: close\r\n"))
                head.erase(c, 19);
            if (f == fault::short_body || f == fault::stall) {
                const std::string half = head + body.substr(0, body.size() / 2);
                if (!send_all(client, half.data(), half.size())) return;
                if (f == fault::short_body) return;  // closed with the body cut short
                while (wait_readable(client)) {      // stalled: nothing more until the client gives up
                    char sink[4096];
                    if (::recv(client, sink, sizeof sink, 0) <= 0) return;
                }
                return;
            }
            const std::string whole = head + body;
            if (!send_all(client, whole.data(), whole.size())) return;
        }
    }

    // The upstream's whole response to `request` (sent with "Connection: close"); "" when it fails.
    std::string forward(const std::string& request) const {
        const int up = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (up < 0) return {};
        sockaddr_in a = loopback(upstream_port_);
        std::string out;
        if (::connect(up, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
            const std::string closing = request.substr(0, request.size() - 2) + "Connection: close\r\n\r\n";
            if (send_all(up, closing.data(), closing.size())) {
                char buf[65536];
                while (wait_readable(up)) {
                    const ssize_t k = ::recv(up, buf, sizeof buf, 0);
                    if (k <= 0) break;
                    out.append(buf, static_cast<std::size_t>(k));
                }
            }
        }
        ::close(up);
        return out.find("\r\n\r\n") == std::string::npos ? std::string() : out;
    }

    int upstream_port_;
    int listener_ = -1;
    int port_ = 0;
    std::atomic<bool> stop_{false};
    std::atomic<std::uint64_t> requests_{0}, faults_{0};
    mutable std::mutex mutex_;
    std::function<fault(std::uint64_t)> fault_of_;
    std::chrono::milliseconds latency_{};
    std::list<std::thread> connections_;
    std::thread acceptor_;
};

}  // namespace feedline::test
