// File: tests/unit/uring_support.hpp — helpers for the uring_tcp tests: a
// completion recorder, an in-process address exchange, a world of endpoints
// built on threads, and a progress loop with a deadline.
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include "pdcoll/error.hpp"
#include "pdcoll/transport/uring_tcp/endpoint.hpp"

namespace uring_test {

using pdcoll::transport::completion;
using pdcoll::transport::completion_context;
using pdcoll::transport::endpoint;
using clock_type = std::chrono::steady_clock;

/// A context that records its completions (there must be exactly one).
struct recorder : completion_context {
  std::optional<completion> result;
  int calls = 0;
  recorder() { on_complete = &record; }
  static void record(completion_context* self, const completion& c) noexcept {
    auto* r = static_cast<recorder*>(self);
    r->result = c;
    ++r->calls;
  }
  bool done() const { return calls > 0; }
};

/// All-gather of addresses between threads of one process, with a deadline.
class local_exchange {
 public:
  explicit local_exchange(int world_size) : addresses_(static_cast<std::size_t>(world_size)) {}

  pdcoll::transport::address_exchange for_rank(int rank) {
    return [this, rank](std::string_view mine) {
      std::unique_lock lock(mutex_);
      addresses_[static_cast<std::size_t>(rank)] = std::string(mine);
      ++arrived_;
      changed_.notify_all();
      if (!changed_.wait_for(lock, std::chrono::seconds(20),
                             [&] { return arrived_ == static_cast<int>(addresses_.size()); })) {
        throw std::system_error(make_error_code(pdcoll::errc::timeout), "local exchange");
      }
      return addresses_;
    };
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<std::string> addresses_;
  int arrived_ = 0;
};

/// Builds `world_size` connected endpoints in this process (setup runs on
/// one thread per rank). Rethrows the first setup failure.
inline std::vector<std::unique_ptr<endpoint>> make_world(
    int world_size, const pdcoll::transport::uring_tcp::options& opts = {.bind_address = "127.0.0.1"}) {
  local_exchange exchange(world_size);
  std::vector<std::unique_ptr<endpoint>> world(static_cast<std::size_t>(world_size));
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(world_size));
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      try {
        world[static_cast<std::size_t>(r)] =
            pdcoll::transport::uring_tcp::make_endpoint(r, world_size, exchange.for_rank(r), opts);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  return world;
}

/// Progresses every endpoint until `done()` or the deadline; true if done.
inline bool drive(const std::vector<endpoint*>& endpoints, const std::function<bool()>& done,
                  std::chrono::milliseconds limit = std::chrono::seconds(20)) {
  auto deadline = clock_type::now() + limit;
  while (!done()) {
    if (clock_type::now() >= deadline) return false;
    std::size_t delivered = 0;
    for (auto* e : endpoints) delivered += e->progress();
    if (delivered == 0 && !done() && endpoints.size() == 1) {
      endpoints.front()->wait(std::min(deadline, clock_type::now() + std::chrono::milliseconds(50)));
    }
  }
  return true;
}

inline std::vector<endpoint*> raw(const std::vector<std::unique_ptr<endpoint>>& world) {
  std::vector<endpoint*> out;
  for (auto& e : world) out.push_back(e.get());
  return out;
}

/// Bytes whose value depends on position and a seed, to catch misplaced data.
inline std::vector<unsigned char> pattern(std::size_t length, unsigned seed) {
  std::vector<unsigned char> out(length);
  std::uint32_t x = seed * 2654435761u + 1;
  for (auto& b : out) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<unsigned char>(x >> 24);
  }
  return out;
}

inline pdcoll::transport::uring_tcp::tcp_endpoint& as_tcp(endpoint& e) {
  return dynamic_cast<pdcoll::transport::uring_tcp::tcp_endpoint&>(e);
}

/// The receive mode a test that runs both paths asks for.
inline pdcoll::transport::uring_tcp::receive_mode receiving(bool multishot) {
  using mode = pdcoll::transport::uring_tcp::receive_mode;
  return multishot ? mode::multishot : mode::single;
}

}  // namespace uring_test
