// reduce_kernels_bench — throughput of pdcoll::kernels::apply per element type
// and op, next to memcpy of the same bytes, on a buffer that fits in cache
// (256 KiB) and one that does not (64 MiB), with each instruction set the
// kernels run on this CPU (the second argument: 0 baseline, 1 AVX2; rows of
// an ISA the CPU lacks are skipped; reduce/kernel_isa.hpp).
//
// Bytes/s counts memory traffic: apply(inout, in, n) reads two buffers and
// writes one (3 * buffer bytes per call); memcpy reads one and writes one
// (2 * buffer bytes). A kernel "at memory bandwidth" therefore shows about
// the same bytes/s as memcpy on the 64 MiB rows.
//
//   cmake -S . -B build-rel -DCMAKE_BUILD_TYPE=Release
//   cmake --build build-rel --target reduce_kernels_bench
//   build-rel/bench/reduce_kernels_bench --benchmark_min_time=0.5
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "pdcoll/reduce/kernels.hpp"

namespace {

constexpr std::int64_t in_cache = 256 << 10;
constexpr std::int64_t in_memory = 64 << 20;

// Values that keep every op finite (no overflow to Inf, no NaN) for the run.
template <class T>
std::vector<T> filled(std::size_t n, float value) {
  std::vector<T> v(n);
  for (auto& x : v) {
    if constexpr (std::is_integral_v<T>)
      x = static_cast<T>(value);
    else
      x = T(value);
  }
  return v;
}

template <class T, class Op>
void bm_apply(benchmark::State& state) {
  const auto isa = static_cast<pdcoll::kernels::kernel_isa>(state.range(1));
  if (!pdcoll::kernels::use_kernel_isa(isa)) {
    state.SkipWithError("this CPU cannot run this instruction set");
    return;
  }
  state.SetLabel(pdcoll::kernels::to_string(isa));
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const std::size_t n = bytes / sizeof(T);
  // prod multiplies by 1 so the accumulator neither overflows nor underflows.
  auto acc = filled<T>(n, 1.0f);
  const auto in = filled<T>(n, std::is_same_v<Op, pdcoll::op::prod_t> ? 1.0f : 0.0f);
  for (auto _ : state) {
    pdcoll::kernels::apply(acc.data(), in.data(), n, Op{});
    benchmark::DoNotOptimize(acc.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * 3 * static_cast<std::int64_t>(bytes));
}

void bm_memcpy(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  std::vector<unsigned char> src(bytes, 1), dst(bytes, 0);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * 2 * static_cast<std::int64_t>(bytes));
}

using pdcoll::bfloat16;
using pdcoll::float16;
namespace op = pdcoll::op;

#define PDCOLL_SIZES ->Arg(in_cache)->Arg(in_memory)->Unit(benchmark::kMicrosecond)
#define PDCOLL_SIZES_AND_ISAS ->ArgsProduct({{in_cache, in_memory}, {0, 1}})->Unit(benchmark::kMicrosecond)

BENCHMARK(bm_memcpy) PDCOLL_SIZES;
BENCHMARK_TEMPLATE(bm_apply, float, op::sum_t) PDCOLL_SIZES_AND_ISAS;
BENCHMARK_TEMPLATE(bm_apply, float, op::prod_t) PDCOLL_SIZES_AND_ISAS;
BENCHMARK_TEMPLATE(bm_apply, float, op::min_t) PDCOLL_SIZES_AND_ISAS;
BENCHMARK_TEMPLATE(bm_apply, float, op::max_t) PDCOLL_SIZES_AND_ISAS;
BENCHMARK_TEMPLATE(bm_apply, bfloat16, op::sum_t) PDCOLL_SIZES_AND_ISAS;
BENCHMARK_TEMPLATE(bm_apply, float16, op::sum_t) PDCOLL_SIZES_AND_ISAS;
BENCHMARK_TEMPLATE(bm_apply, double, op::sum_t) PDCOLL_SIZES_AND_ISAS;
BENCHMARK_TEMPLATE(bm_apply, std::int8_t, op::sum_t) PDCOLL_SIZES_AND_ISAS;
BENCHMARK_TEMPLATE(bm_apply, std::uint8_t, op::sum_t) PDCOLL_SIZES_AND_ISAS;
BENCHMARK_TEMPLATE(bm_apply, std::int32_t, op::sum_t) PDCOLL_SIZES_AND_ISAS;
BENCHMARK_TEMPLATE(bm_apply, std::uint32_t, op::sum_t) PDCOLL_SIZES_AND_ISAS;
BENCHMARK_TEMPLATE(bm_apply, std::int64_t, op::sum_t) PDCOLL_SIZES_AND_ISAS;
BENCHMARK_TEMPLATE(bm_apply, std::uint64_t, op::sum_t) PDCOLL_SIZES_AND_ISAS;

}  // namespace

BENCHMARK_MAIN();
