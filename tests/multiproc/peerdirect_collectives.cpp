// File: tests/multiproc/peerdirect_collectives.cpp — Peer Direct end to end:
// every collective on emulated_device memory across real processes started
// by tools/pdcoll-run, over the path the job's transport gives (direct over
// libfabric, host-staged over io_uring or with PDCOLL_FORCE_STAGING=1),
// checking results, the domain's copy counters, the communicator's
// data-path statistics and the registration cache.
//
// Every rank runs the same test cases in the same order (the collectives
// must line up); each asserts on its own rank.
#include <doctest/doctest.h>

#include <pdcoll/memory/domains.hpp>
#include <pdcoll/memory/track.hpp>
#include <pdcoll/pdcoll.hpp>
#include <support/variable_blocks.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

namespace {

using device = pdcoll::memory::emulated_device;
using pdcoll::transport::data_path;
using pdcoll::transport::memory_kind;

constexpr auto deadline = std::chrono::seconds(60);

pdcoll::job& the_job() {
  static pdcoll::job job = pdcoll::job::from_environment();
  return job;
}

device& the_device() {
  static device dev(std::size_t{64} << 20);
  return dev;
}

template <class Sender>
void run(Sender&& s) {
  pdcoll::exec::sync_wait(std::forward<Sender>(s) | pdcoll::exec::with_deadline(deadline));
}

pdcoll::memory::device_buffer<float, device> upload(const std::vector<float>& host) {
  auto buf = the_device().allocate<float>(host.size());
  the_device().copy_from_host(std::span<const float>(host), buf.view());
  return buf;
}

std::vector<float> download(const pdcoll::memory::device_buffer<float, device>& buf) {
  std::vector<float> host(buf.size());
  the_device().copy_to_host(buf.const_view(), std::span<float>(host));
  return host;
}

bool staging_expected(const pdcoll::communicator& comm) {
  return comm.transport_name().rfind("uring", 0) == 0 || comm.options().force_host_staging;
}

// Rank r's value at element i: small integers, so float sums are exact.
float value(int r, std::size_t i) { return static_cast<float>(r + 1 + static_cast<int>(i % 7)); }

}  // namespace

TEST_CASE("every collective on emulated_device memory gives the right result on the job's data path") {
  auto& comm = the_job().comm();
  const int P = comm.world_size(), r = comm.rank();
  const auto Pz = static_cast<std::size_t>(P);
  const std::size_t n = 50'000;  // 195 KiB per rank: several staging chunks at the tests' 64 KiB

  std::vector<float> mine(n), blocks(n * Pz);
  for (std::size_t i = 0; i < n; ++i) mine[i] = value(r, i);
  for (std::size_t i = 0; i < n * Pz; ++i) blocks[i] = value(r, i) + static_cast<float>(i / n);

  auto ar = upload(mine);
  auto ar_out = upload(std::vector<float>(n, -1.0f));
  auto bc = upload(r == 0 ? mine : std::vector<float>(n, -1.0f));
  auto rd_out = upload(std::vector<float>(n, -1.0f));
  auto ag_in = upload(mine);
  auto ag_out = upload(std::vector<float>(n * Pz, -1.0f));
  auto rs_in = upload(blocks);
  auto rs_out = upload(std::vector<float>(n, -1.0f));
  auto a2a_in = upload(blocks);
  auto a2a_out = upload(std::vector<float>(n * Pz, -1.0f));

  the_device().reset_counters();
  const auto paths_before = comm.data_path_statistics();
  run(pdcoll::all_reduce(comm, ar.view(), ar_out.view(), pdcoll::op::sum));
  run(pdcoll::all_reduce(comm, ar.view(), pdcoll::op::sum));  // in place
  run(pdcoll::broadcast(comm, bc.view(), 0));
  run(pdcoll::reduce(comm, ag_in.view(), rd_out.view(), pdcoll::op::max, P - 1));
  run(pdcoll::all_gather(comm, ag_in.view(), ag_out.view()));
  run(pdcoll::reduce_scatter(comm, rs_in.view(), rs_out.view(), pdcoll::op::sum));
  run(pdcoll::all_to_all(comm, a2a_in.view(), a2a_out.view()));
  const auto copies = the_device().counters();
  const auto paths = comm.data_path_statistics();
  const std::uint64_t ops = 7;

  const bool staged = staging_expected(comm);
  INFO("transport " << comm.transport_name() << ", last path " << pdcoll::transport::to_string(paths.last_path));
  if (staged) {
    CHECK(paths.last_path == data_path::host_staged);
    CHECK(paths.staged_operations - paths_before.staged_operations == ops);
    CHECK(paths.direct_operations == paths_before.direct_operations);
    // Every staged byte went through the domain's counted copies, in chunks.
    CHECK(copies.device_to_host_bytes + copies.host_to_device_bytes ==
          paths.staged_bytes - paths_before.staged_bytes);
    CHECK(copies.device_to_host_bytes > 0);
    CHECK(copies.host_to_device_bytes > 0);
    CHECK(paths.staged_chunks - paths_before.staged_chunks > ops);  // chunked, not whole buffers
  } else {
    CHECK((paths.last_path == data_path::hmem_iface || paths.last_path == data_path::dmabuf));
    CHECK(paths.direct_operations - paths_before.direct_operations == ops);
    CHECK(paths.staged_operations == paths_before.staged_operations);
    CHECK(copies == pdcoll::memory::copy_counters{});  // the direct path copies nothing
  }

  const float ranks_sum = static_cast<float>(P * (P + 1) / 2);
  auto got = download(ar_out);
  auto got_in_place = download(ar);
  auto got_bc = download(bc);
  auto got_rd = download(rd_out);
  auto got_ag = download(ag_out);
  auto got_rs = download(rs_out);
  auto got_a2a = download(a2a_out);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float k = static_cast<float>(i % 7);
    wrong += got[i] != ranks_sum + static_cast<float>(P) * k;
    wrong += got_in_place[i] != got[i];
    wrong += got_bc[i] != value(0, i);
    wrong += r == P - 1 ? got_rd[i] != value(P - 1, i) : got_rd[i] != -1.0f;
    // reduce_scatter: block r of every rank's `blocks`, summed.
    const std::size_t j = static_cast<std::size_t>(r) * n + i;
    wrong += got_rs[i] != ranks_sum + static_cast<float>(P) * (static_cast<float>(j % 7) + static_cast<float>(r));
  }
  for (std::size_t b = 0; b < Pz; ++b)
    for (std::size_t i = 0; i < n; ++i) {
      wrong += got_ag[b * n + i] != value(static_cast<int>(b), i);
      // all_to_all: block b of out is block r of rank b's `blocks`.
      const std::size_t j = static_cast<std::size_t>(r) * n + i;
      wrong += got_a2a[b * n + i] != value(static_cast<int>(b), j) + static_cast<float>(r);
    }
  CHECK(wrong == 0);
}

TEST_CASE("all_to_allv and all_gatherv on emulated_device memory give the right result on the job's data path") {
  using namespace pdcoll::testing;
  auto& comm = the_job().comm();
  const int P = comm.world_size(), r = comm.rank();
  const std::uint64_t salt = 71;
  const std::size_t max_count = 40'000;  // blocks up to 156 KiB: past the tests' 64 KiB staging chunk
  const auto l = all_to_allv_layout(salt, P, r, max_count, false);
  auto a2av_in = upload(make_input<float>(salt, r, l.input_elems, false));
  auto a2av_out = upload(std::vector<float>(l.output_elems, gap_fill<float>()));
  const auto g = all_gatherv_layout(salt + 1, P, max_count, false);
  auto agv_in = upload(make_input<float>(salt + 1, r, g.recv_counts[static_cast<std::size_t>(r)], false));
  auto agv_out = upload(std::vector<float>(g.output_elems, gap_fill<float>()));

  the_device().reset_counters();
  const auto before = comm.data_path_statistics();
  run(pdcoll::all_to_allv(comm, a2av_in.view(), l.send_counts, l.send_displs, a2av_out.view(), l.recv_counts,
                          l.recv_displs));
  run(pdcoll::all_gatherv(comm, agv_in.view(), agv_out.view(), g.recv_counts, g.recv_displs));
  const auto copies = the_device().counters();
  const auto paths = comm.data_path_statistics();
  INFO("transport " << comm.transport_name());
  if (staging_expected(comm)) {
    // Staged per pair in chunks of 64 KiB / P (PDCOLL_STAGING_CHUNK_BYTES):
    // as many as this rank's longest block needs (n / chunk + 1), every
    // byte of its blocks through the counted copies.
    const std::size_t chunk = 65536 / sizeof(float) / static_cast<std::size_t>(P);
    std::size_t longest = 0, longest_gathered = 0;
    std::uint64_t blocks_bytes = 0;
    for (int p = 0; p < P; ++p) {
      const auto q = static_cast<std::size_t>(p);
      longest = std::max({longest, l.send_counts[q], l.recv_counts[q]});
      longest_gathered = std::max(longest_gathered, g.recv_counts[q]);
      blocks_bytes += (l.send_counts[q] + l.recv_counts[q] + g.recv_counts[q]) * sizeof(float);
    }
    blocks_bytes += g.recv_counts[static_cast<std::size_t>(r)] * sizeof(float);  // all_gatherv's input, once
    CHECK(paths.staged_operations - before.staged_operations == 2);
    CHECK(paths.staged_chunks - before.staged_chunks == longest / chunk + 1 + longest_gathered / chunk + 1);
    CHECK(paths.staged_bytes - before.staged_bytes == blocks_bytes);
    CHECK(copies.device_to_host_bytes + copies.host_to_device_bytes == paths.staged_bytes - before.staged_bytes);
  } else {
    CHECK(paths.direct_operations - before.direct_operations == 2);
    CHECK(copies == pdcoll::memory::copy_counters{});
  }
  CHECK(download(a2av_out) == expected_all_to_allv<float>(salt, P, r, max_count, false));
  CHECK(download(agv_out) == expected_all_gatherv<float>(salt + 1, P, max_count, false));
}

TEST_CASE("device registrations go through the cache: a miss on first use, hits after") {
  auto& comm = the_job().comm();
  if (staging_expected(comm) ||
      !comm.endpoint().needs_registration(memory_kind::emulated_device)) {
    // Staged: only host bounce buffers are registered (if the transport needs
    // it). tcp;ofi_rxm on libfabric 1.17 moves the FI_HMEM_SYSTEM mapping
    // without descriptors, so nothing is registered at all.
    MESSAGE(comm.transport_name() << ": device memory needs no registration here");
    CHECK(comm.path_for(memory_kind::emulated_device) != data_path::unreachable);
    return;
  }
  if (!comm.options().cache_registrations) return;
  auto tracking = pdcoll::track_frees(the_device(), comm);  // only memory whose frees it hears of is cached
  auto buf = upload(std::vector<float>(1 << 16, 1.0f));
  const auto before = comm.registration_statistics();
  run(pdcoll::all_reduce<pdcoll::algo::recursive_doubling>(comm, buf.view(), pdcoll::op::sum));
  const auto first = comm.registration_statistics();
  CHECK(first.misses > before.misses);
  CHECK(first.registrations > before.registrations);
  run(pdcoll::all_reduce<pdcoll::algo::recursive_doubling>(comm, buf.view(), pdcoll::op::sum));
  const auto second = comm.registration_statistics();
  CHECK(second.misses == first.misses);
  CHECK(second.hits > first.hits);
}

TEST_CASE("memory freed and reallocated at the same address is registered anew under track_frees") {
  auto& comm = the_job().comm();
  const bool registers = !staging_expected(comm) &&
                         comm.endpoint().needs_registration(memory_kind::emulated_device) &&
                         comm.options().cache_registrations;
  device dev(std::size_t{4} << 20);  // its own arena: first fit returns the freed offset
  auto tracking = pdcoll::track_frees(dev, comm);
  const std::size_t n = 1 << 16;
  std::vector<float> ones(n, 1.0f);

  auto a = dev.allocate<float>(n);
  dev.copy_from_host(std::span<const float>(ones), a.view());
  const auto address = a.view().device_address();
  run(pdcoll::all_reduce<pdcoll::algo::recursive_doubling>(comm, a.view(), pdcoll::op::sum));
  const auto used = comm.registration_statistics();
  a = {};  // freed: the hook invalidates the cached registration
  const auto freed = comm.registration_statistics();
  if (registers) CHECK(freed.invalidations > used.invalidations);

  auto b = dev.allocate<float>(n);
  REQUIRE(b.view().device_address() == address);
  dev.copy_from_host(std::span<const float>(ones), b.view());
  run(pdcoll::all_reduce<pdcoll::algo::recursive_doubling>(comm, b.view(), pdcoll::op::sum));
  const auto again = comm.registration_statistics();
  if (registers) CHECK(again.misses > freed.misses);  // not a hit on the stale entry
  std::vector<float> out(n);
  dev.copy_to_host(b.const_view(), std::span<float>(out));
  CHECK(out[0] == static_cast<float>(comm.world_size()));
  CHECK(out[n - 1] == static_cast<float>(comm.world_size()));
  b = {};
  tracking.stop();
}
