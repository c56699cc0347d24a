// File: bench/peer_direct_bench.cpp — Peer Direct versus host staging:
// all-reduce bus bandwidth on emulated device memory from 64 KiB to 256 MiB,
// in one run over one provider, for three communicators side by side:
// direct with the registration cache, direct without it
// (cache_registrations = false: register/deregister around every
// operation), and host-staged (force_host_staging).
//
//     tools/pdcoll-run -n 2 build-rel/bench/peer_direct_bench [max_bytes]
//     PDCOLL_PROVIDER=tcp tools/pdcoll-run -n 4 build-rel/bench/peer_direct_bench
//
// `--uring-fixed [max_bytes] [iterations]` measures something else: the
// io_uring transport's registered buffers. Two uring_tcp endpoints with
// zero-copy sends from 64 KiB, one sending from a buffer registered with
// register_region (IORING_OP_SEND_ZC, fixed buffer) and one from the same
// buffer unregistered (IORING_OP_SENDMSG_ZC, pages pinned per send), swap
// `bytes` between ranks 0 and 1 in both directions at once; each cell is the
// median over the iterations (default 10), the two endpoints alternating.
//
//     tools/pdcoll-run -n 2 build-rel/bench/peer_direct_bench --uring-fixed
//
// Build optimised (-DCMAKE_BUILD_TYPE=Release). busbw is nccl-tests'
// algbw * 2(P-1)/P; each cell is the median of several runs (fewer for
// large sizes). Nothing here is tuned for the emulation: the emulated
// device's copies are plain memcpy on the calling core.
#include <pdcoll/memory/domains.hpp>
#include <pdcoll/memory/track.hpp>
#include <pdcoll/pdcoll.hpp>
#include <pdcoll/transport/uring_tcp/endpoint.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace {

using device = pdcoll::memory::emulated_device;

double median_seconds(pdcoll::communicator& comm, device& dev, std::size_t bytes, int iters) {
  auto buf = dev.allocate<float>(bytes / sizeof(float));
  std::vector<double> times;
  for (int i = 0; i < iters + 1; ++i) {
    pdcoll::exec::sync_wait(pdcoll::barrier(comm));
    auto t0 = std::chrono::steady_clock::now();
    pdcoll::exec::sync_wait(pdcoll::all_reduce(comm, buf.view(), pdcoll::op::sum) |
                            pdcoll::exec::with_deadline(std::chrono::seconds(120)));
    if (i > 0) times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

std::unique_ptr<pdcoll::communicator> twin(pdcoll::job& job, bool cache, bool staged) {
  pdcoll::communicator_options o;
  o.cache_registrations = cache;
  o.force_host_staging = staged;
  auto ep = pdcoll::transport::libfabric::make_endpoint(job.rank(), job.world_size(), job.store().exchange());
  return std::make_unique<pdcoll::communicator>(std::move(ep), o);
}

namespace uring = pdcoll::transport::uring_tcp;

/// A completion context that only records that it ran and how.
struct finished : pdcoll::transport::completion_context {
  bool done = false;
  std::error_code error;
  finished() {
    on_complete = [](pdcoll::transport::completion_context* self, const pdcoll::transport::completion& c) noexcept {
      auto* f = static_cast<finished*>(self);
      f->done = true;
      f->error = c.error;
    };
  }
};

/// Sends `bytes` from `from` to the other rank while receiving as many into
/// `into`; returns the seconds both took. A 0-byte exchange first lines the
/// two ranks up.
double swap_seconds(pdcoll::transport::endpoint& ep, const std::byte* from, std::byte* into, std::size_t bytes,
                    void* descriptor, std::uint64_t tag) {
  const int peer = 1 - ep.rank();
  auto run = [&](const void* send, void* recv, std::size_t n, void* desc, std::uint64_t t) {
    finished s, r;
    if (ep.post_recv(peer, recv, n, t, 0, nullptr, &r) || ep.post_send(peer, send, n, t, desc, &s))
      throw std::runtime_error("uring-fixed: post failed");
    const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (!(s.done && r.done)) {
      if (std::chrono::steady_clock::now() > limit) throw std::runtime_error("uring-fixed: transfer timed out");
      if (ep.progress() == 0) ep.wait(std::chrono::steady_clock::now() + std::chrono::milliseconds(1));
    }
    if (s.error || r.error) throw std::system_error(s.error ? s.error : r.error, "uring-fixed transfer");
  };
  run(nullptr, nullptr, 0, nullptr, 2 * tag);
  const auto t0 = std::chrono::steady_clock::now();
  run(from, into, bytes, descriptor, 2 * tag + 1);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int uring_fixed_bench(pdcoll::job& job, std::size_t max_bytes, int iterations) {
  if (job.world_size() != 2) {
    std::fprintf(stderr, "peer_direct_bench --uring-fixed: needs exactly 2 ranks\n");
    return 2;
  }
  uring::options o;
  o.token = "peer_direct_bench";
  o.zero_copy_threshold = 64 << 10;
  auto plain = uring::make_endpoint(job.rank(), 2, job.store().exchange(), o);
  auto fixed = uring::make_endpoint(job.rank(), 2, job.store().exchange(), o);
  std::vector<std::byte> data(max_bytes, std::byte{1}), into(max_bytes);
  pdcoll::transport::registration_handle handle;
  pdcoll::transport::memory_region region;
  region.address = data.data();
  region.length = data.size();
  fixed->register_region(region, handle);
  auto& fixed_tcp = dynamic_cast<uring::tcp_endpoint&>(*fixed);
  if (!handle.descriptor) {
    std::fprintf(stderr, "peer_direct_bench --uring-fixed: %zu bytes could not be registered (PDCOLL_DEBUG=INFO says why)\n",
                 max_bytes);
    return 1;
  }
  if (job.rank() == 0) {
    std::printf("# uring_tcp, 2 ranks, both directions at once, zero copy >= 64 KiB; GB/s per direction, median of %d\n",
                iterations);
    std::printf("%12s %14s %14s %10s\n", "bytes", "SENDMSG_ZC", "SEND_ZC fixed", "fixed/plain");
  }
  std::uint64_t tag = 1;
  for (std::size_t bytes = 64 << 10; bytes <= max_bytes; bytes *= 4) {
    std::vector<double> t_plain, t_fixed;
    for (int i = 0; i < iterations; ++i) {
      t_plain.push_back(swap_seconds(*plain, data.data(), into.data(), bytes, nullptr, tag++));
      t_fixed.push_back(swap_seconds(*fixed, data.data(), into.data(), bytes, handle.descriptor, tag++));
    }
    std::sort(t_plain.begin(), t_plain.end());
    std::sort(t_fixed.begin(), t_fixed.end());
    const double plain_gbs = static_cast<double>(bytes) / t_plain[t_plain.size() / 2] / 1e9;
    const double fixed_gbs = static_cast<double>(bytes) / t_fixed[t_fixed.size() / 2] / 1e9;
    if (job.rank() == 0) {
      std::printf("%12zu %14.3f %14.3f %10.3f\n", bytes, plain_gbs, fixed_gbs, fixed_gbs / plain_gbs);
      std::fflush(stdout);
    }
  }
  if (job.rank() == 0)
    std::printf("# fixed endpoint: %llu SEND_ZC fixed submissions; %llu send submissions in all (0-byte syncs included)\n",
                static_cast<unsigned long long>(fixed_tcp.stats().fixed_buffer_submissions),
                static_cast<unsigned long long>(fixed_tcp.stats().send_submissions));
  fixed->deregister(handle);
  // Line up before the endpoints close, so neither sees the other leave mid-transfer.
  swap_seconds(*plain, data.data(), into.data(), 0, nullptr, tag++);
  swap_seconds(*fixed, data.data(), into.data(), 0, nullptr, tag++);
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc > 1 && std::string_view(argv[1]) == "--uring-fixed") {
    const std::size_t max_bytes = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : std::size_t{256} << 20;
    const int iterations = argc > 3 ? std::max(1, std::atoi(argv[3])) : 10;
    pdcoll::job job = pdcoll::job::from_environment();
    return uring_fixed_bench(job, max_bytes, iterations);
  }
  const std::size_t max_bytes = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : std::size_t{256} << 20;
  pdcoll::job job = pdcoll::job::from_environment();
  if (job.comm().transport_name().rfind("libfabric", 0) != 0) {
    std::fprintf(stderr, "peer_direct_bench: needs PDCOLL_TRANSPORT=libfabric (uring can only stage)\n");
    return 2;
  }
  const int P = job.world_size();
  device dev(2 * max_bytes + (std::size_t{64} << 20));  // the buffer plus algorithm scratch (rabenseifner: n)
  auto direct = twin(job, true, false);
  auto uncached = twin(job, false, false);
  auto staged = twin(job, true, true);
  auto t1 = pdcoll::track_frees(dev, *direct);
  auto t2 = pdcoll::track_frees(dev, *staged);
  if (job.rank() == 0) {
    std::printf("# all_reduce sum float32 on emulated_device memory, %d ranks, %s; busbw in GB/s\n", P,
                direct->transport_name().c_str());
    std::printf("%12s %12s %14s %12s %14s %14s\n", "bytes", "direct", "direct-nocache", "staged", "direct/staged",
                "cache on/off");
  }
  for (std::size_t bytes = 64 << 10; bytes <= max_bytes; bytes *= 4) {
    const int iters = static_cast<int>(std::clamp<std::size_t>((std::size_t{64} << 20) / bytes, 3, 20));
    const double f = 2.0 * (P - 1) / P / 1e9 * static_cast<double>(bytes);
    const double bw_direct = f / median_seconds(*direct, dev, bytes, iters);
    const double bw_uncached = f / median_seconds(*uncached, dev, bytes, iters);
    const double bw_staged = f / median_seconds(*staged, dev, bytes, iters);
    if (job.rank() == 0) {
      std::printf("%12zu %12.3f %14.3f %12.3f %14.2f %14.2f\n", bytes, bw_direct, bw_uncached, bw_staged,
                  bw_direct / bw_staged, bw_direct / bw_uncached);
      std::fflush(stdout);
    }
  }
  const auto reg = direct->registration_statistics();
  const auto st = staged->data_path_statistics();
  if (job.rank() == 0)
    std::printf("# direct: %llu registrations, %llu hits, %llu misses; staged: %llu MiB through host in %llu chunks\n",
                static_cast<unsigned long long>(reg.registrations), static_cast<unsigned long long>(reg.hits),
                static_cast<unsigned long long>(reg.misses), static_cast<unsigned long long>(st.staged_bytes >> 20),
                static_cast<unsigned long long>(st.staged_chunks));
  for (auto* c : {direct.get(), uncached.get(), staged.get()}) pdcoll::exec::sync_wait(pdcoll::barrier(*c));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "peer_direct_bench: %s\n", e.what());
  return 1;
}
