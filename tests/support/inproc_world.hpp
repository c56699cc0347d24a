// File: tests/support/inproc_world.hpp — runs a function on N communicators
// over the inproc transport, one thread per rank, and joins them.
#pragma once

#include <pdcoll/communicator.hpp>
#include <pdcoll/transport/inproc.hpp>

#include <exception>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

namespace pdcoll::testing {

/// Runs body(comm) on `world_size` ranks in threads; rethrows the first
/// exception a rank threw. Each rank's communicator lives for the call.
/// `node_memory_bytes` > 0 gives the ranks node memory (as on shm), whose
/// bulk_through_slots() answers `bulk_through_slots` (on shm the copy
/// probe's verdict).
inline void run_inproc(int world_size, const std::function<void(communicator&)>& body,
                       communicator_options options = {}, std::size_t node_memory_bytes = 0,
                       bool bulk_through_slots = false) {
  auto fabric = transport::inproc::fabric::create(world_size);
  if (node_memory_bytes) fabric->enable_node_memory(node_memory_bytes, bulk_through_slots);
  std::vector<std::unique_ptr<communicator>> comms;
  for (int r = 0; r < world_size; ++r) comms.push_back(std::make_unique<communicator>(fabric->endpoint_for(r), options));
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(world_size));
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      try {
        body(*comms[static_cast<std::size_t>(r)]);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  comms.clear();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace pdcoll::testing
