// The kernels against a scalar reference: every (type, op) pair on random
// data, counts that leave vector tails, aliasing forms of apply3, user ops,
// avg finalisation and the type-erased entry points; each with every
// instruction set this CPU runs (reduce/kernel_isa.hpp), and the AVX2 loops
// against the baseline ones bit for bit.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <ostream>  // doctest prints std::error_code through operator<<
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "pdcoll/reduce/kernels.hpp"

namespace {

using pdcoll::bfloat16;
using pdcoll::float16;
namespace op = pdcoll::op;
namespace kernels = pdcoll::kernels;

template <class T>
double as_double(T x) {
  return static_cast<double>(static_cast<float>(x));
}
template <>
double as_double(double x) {
  return x;
}

// Counts around the kernels' 64-element block and vector widths, including 0.
constexpr std::size_t counts[] = {0, 1, 3, 15, 17, 63, 64, 65, 129, 1001};

template <class T>
std::vector<T> random_values(std::size_t n, std::mt19937_64& rng) {
  std::vector<T> v(n);
  for (auto& x : v) {
    if constexpr (std::is_integral_v<T>) {
      x = static_cast<T>(rng());  // the full range, so sums and products wrap
    } else {
      std::uniform_real_distribution<float> d(-100.0f, 100.0f);
      x = T(d(rng));
    }
  }
  return v;
}

// Scalar reference semantics written independently of the kernels: integers
// combine modulo 2^64 then truncate; floating values combine in float (the
// 16-bit types) or their own type; min/max return NaN if either side is NaN.
template <class T>
T reference(pdcoll::reduction r, T a, T b) {
  using pdcoll::reduction;
  if constexpr (std::is_integral_v<T>) {
    const auto ua = static_cast<std::uint64_t>(a), ub = static_cast<std::uint64_t>(b);
    switch (r) {
      case reduction::sum:
      case reduction::avg: return static_cast<T>(ua + ub);
      case reduction::prod: return static_cast<T>(ua * ub);
      case reduction::min: return std::min(a, b);
      case reduction::max: return std::max(a, b);
      default: break;
    }
    return T{};
  } else {
    using C = std::conditional_t<pdcoll::is_half_v<T>, float, T>;
    const C x = static_cast<C>(a), y = static_cast<C>(b);
    const C nan = std::numeric_limits<C>::quiet_NaN();
    C z{};
    switch (r) {
      case reduction::sum:
      case reduction::avg: z = x + y; break;
      case reduction::prod: z = x * y; break;
      case reduction::min: z = std::isnan(x) || std::isnan(y) ? nan : std::min(x, y); break;
      case reduction::max: z = std::isnan(x) || std::isnan(y) ? nan : std::max(x, y); break;
      default: break;
    }
    return T(z);
  }
}

template <class T>
bool same_value(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    return a == b;
  } else {
    const float x = static_cast<float>(a), y = static_cast<float>(b);
    if (std::isnan(x) || std::isnan(y)) return std::isnan(x) && std::isnan(y);
    if constexpr (pdcoll::is_half_v<T>)
      return a.bits == b.bits;
    else
      return std::memcmp(&a, &b, sizeof a) == 0;
  }
}

template <class T, class Op>
void check_op_against_reference(Op o) {
  constexpr pdcoll::reduction r = pdcoll::reduction_of<Op>;
  std::mt19937_64 rng(0x5eed + static_cast<unsigned>(r) * 31 + sizeof(T));
  for (const std::size_t n : counts) {
    CAPTURE(n);
    const auto a = random_values<T>(n, rng);
    const auto b = random_values<T>(n, rng);
    std::vector<T> expected(n);
    for (std::size_t i = 0; i < n; ++i) expected[i] = reference(r, a[i], b[i]);
    auto check_all = [&](const std::vector<T>& got, const char* form) {
      CAPTURE(form);
      for (std::size_t i = 0; i < n; ++i) {
        CAPTURE(i);
        REQUIRE(same_value(got[i], expected[i]));
      }
    };

    auto inout = a;
    kernels::apply(inout.data(), b.data(), n, o);
    check_all(inout, "apply");

    std::vector<T> out(n);
    kernels::apply3(out.data(), a.data(), b.data(), n, o);
    check_all(out, "apply3 out of place");

    auto aliased_a = a;
    kernels::apply3(aliased_a.data(), aliased_a.data(), b.data(), n, o);
    check_all(aliased_a, "apply3 out == a");

    auto aliased_b = b;
    kernels::apply3(aliased_b.data(), a.data(), aliased_b.data(), n, o);
    check_all(aliased_b, "apply3 out == b");

    auto erased = a;
    REQUIRE_FALSE(kernels::apply(pdcoll::data_type_of<T>, r, erased.data(), b.data(), n));
    check_all(erased, "type-erased apply");
  }
}

using kernels::kernel_isa;

// Runs `body` once per instruction set this CPU supports, with the kernels
// switched to it, and puts the process's choice back afterwards.
template <class F>
void for_each_isa(F&& body) {
  const kernel_isa before = kernels::kernel_isa_in_use();
  for (const kernel_isa isa : {kernel_isa::baseline, kernel_isa::avx2}) {
    if (!kernels::use_kernel_isa(isa)) continue;
    const char* name = kernels::to_string(isa);
    CAPTURE(name);
    body();
  }
  REQUIRE(kernels::use_kernel_isa(before));
}

// Every shape of every kernel entry point on (a, b) with the kernels on `isa`.
template <class T, class Op>
std::vector<std::vector<T>> every_shape(kernel_isa isa, const std::vector<T>& a, const std::vector<T>& b, Op o) {
  REQUIRE(kernels::use_kernel_isa(isa));
  std::vector<std::vector<T>> results;
  auto inout = a;
  kernels::apply(inout.data(), b.data(), a.size(), o);
  results.push_back(inout);
  std::vector<T> out(a.size());
  kernels::apply3(out.data(), a.data(), b.data(), a.size(), o);
  results.push_back(out);
  auto aliased_b = b;
  kernels::apply3(aliased_b.data(), a.data(), aliased_b.data(), a.size(), o);
  results.push_back(aliased_b);
  auto both = a;
  kernels::apply3(both.data(), both.data(), both.data(), a.size(), o);
  results.push_back(both);
  return results;
}

template <class T>
bool is_nan(T x) {
  if constexpr (std::is_integral_v<T>)
    return false;
  else
    return std::isnan(as_double(x));
}

template <class T>
std::vector<T> from_bits(const std::vector<std::uint64_t>& bits) {
  std::vector<T> v(bits.size());
  for (std::size_t i = 0; i < v.size(); ++i) std::memcpy(&v[i], &bits[i], sizeof(T));
  return v;
}

// The AVX2 loops and the baseline loops on the same operands, compared as bit
// patterns (NaN payloads included). `a_bits`/`b_bits` hold each element's
// encoding in their low sizeof(T) bytes.
template <class T>
void check_isas_agree(const std::vector<std::uint64_t>& a_bits, const std::vector<std::uint64_t>& b_bits) {
  const auto a = from_bits<T>(a_bits), b = from_bits<T>(b_bits);
  const kernel_isa before = kernels::kernel_isa_in_use();
  auto check = [&](auto o, const std::string op_name) {
    CAPTURE(op_name);
    const auto wide = every_shape(kernel_isa::avx2, a, b, o);
    const auto base = every_shape(kernel_isa::baseline, a, b, o);
    for (std::size_t shape = 0; shape < wide.size(); ++shape) {
      CAPTURE(shape);
      for (std::size_t i = 0; i < a.size(); ++i) {
        // Which NaN comes out of an addition or product of two NaNs is
        // unspecified (IEEE 754 §6.2.3), and compilers swap the operands of
        // commutative operations: only there may the encodings differ.
        if (is_nan(a[i]) && is_nan(b[i]) && is_nan(wide[shape][i]) && is_nan(base[shape][i])) continue;
        if (std::memcmp(&wide[shape][i], &base[shape][i], sizeof(T)) != 0) {
          CAPTURE(i);
          CAPTURE(a_bits[i]);
          CAPTURE(b_bits[i]);
          FAIL("the AVX2 and baseline kernels disagree");
        }
      }
    }
  };
  check(op::sum, "sum");
  check(op::prod, "prod");
  check(op::min, "min");
  check(op::max, "max");
  REQUIRE(kernels::use_kernel_isa(before));
}

}  // namespace

TEST_SUITE("reduce.kernels") {

TEST_CASE_TEMPLATE("every op on every element type matches the scalar reference, tails included", T, float,
                   double, float16, bfloat16, std::int8_t, std::uint8_t, std::int32_t, std::uint32_t,
                   std::int64_t, std::uint64_t) {
  for_each_isa([] {
    check_op_against_reference<T>(op::sum);
    check_op_against_reference<T>(op::prod);
    check_op_against_reference<T>(op::min);
    check_op_against_reference<T>(op::max);
    check_op_against_reference<T>(op::avg);  // combines as sum
  });
}

TEST_CASE("the AVX2 kernels give the baseline kernels' bits for every float16 and bfloat16 encoding") {
  if (!kernels::kernel_isa_supported(kernel_isa::avx2)) {
    MESSAGE("this CPU has no AVX2 and F16C: only the baseline kernels run here");
    return;
  }
  // Every encoding (NaNs with payloads, infinities, subnormals, both zeros)
  // against a random one and against its own neighbour, over a count that
  // leaves a tail after the 64-element blocks.
  std::mt19937_64 rng(0xf16c);
  std::vector<std::uint64_t> all(65536 + 37), random(all.size()), shifted(all.size());
  for (std::size_t i = 0; i < all.size(); ++i) {
    all[i] = i & 0xffff;
    random[i] = rng() & 0xffff;
    shifted[i] = (i + 1) & 0xffff;
  }
  check_isas_agree<float16>(all, random);
  check_isas_agree<float16>(random, all);
  check_isas_agree<float16>(all, shifted);
  check_isas_agree<bfloat16>(all, random);
  check_isas_agree<bfloat16>(random, all);
}

TEST_CASE_TEMPLATE("the AVX2 kernels give the baseline kernels' bits on random encodings", T, float, double,
                   std::int8_t, std::uint8_t, std::int32_t, std::uint32_t, std::int64_t, std::uint64_t) {
  if (!kernels::kernel_isa_supported(kernel_isa::avx2)) return;
  std::mt19937_64 rng(0xa5c2 + sizeof(T));
  std::vector<std::uint64_t> a(10007), b(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    a[i] = rng();
    b[i] = rng();
    if (i % 5 == 0) b[i] = a[i];  // equal operands: min/max ties, x + x
  }
  check_isas_agree<T>(a, b);
}

TEST_CASE("the kernels' instruction set is chosen once and can be switched where the CPU supports it") {
  const kernel_isa before = kernels::kernel_isa_in_use();
  CHECK(kernels::kernel_isa_supported(kernel_isa::baseline));
  REQUIRE(kernels::use_kernel_isa(kernel_isa::baseline));
  CHECK(kernels::kernel_isa_in_use() == kernel_isa::baseline);
  const bool wide = kernels::kernel_isa_supported(kernel_isa::avx2);
  CHECK(kernels::use_kernel_isa(kernel_isa::avx2) == wide);
  CHECK(kernels::kernel_isa_in_use() == (wide ? kernel_isa::avx2 : kernel_isa::baseline));
  // PDCOLL_KERNEL_ISA=baseline rules the wide loops out of the default.
  const char* old = std::getenv("PDCOLL_KERNEL_ISA");
  const std::string saved = old ? old : "";
  ::setenv("PDCOLL_KERNEL_ISA", "baseline", 1);
  CHECK(kernels::detail::default_kernel_isa() == kernel_isa::baseline);
  ::unsetenv("PDCOLL_KERNEL_ISA");
  CHECK(kernels::detail::default_kernel_isa() == (wide ? kernel_isa::avx2 : kernel_isa::baseline));
  if (old) ::setenv("PDCOLL_KERNEL_ISA", saved.c_str(), 1);
  REQUIRE(kernels::use_kernel_isa(before));
}

TEST_CASE("integer sum and product wrap modulo 2^bits instead of overflowing") {
  std::int32_t a[] = {std::numeric_limits<std::int32_t>::max(), std::numeric_limits<std::int32_t>::min()};
  const std::int32_t b[] = {1, -1};
  kernels::apply(a, b, 2, op::sum);
  CHECK(a[0] == std::numeric_limits<std::int32_t>::min());
  CHECK(a[1] == std::numeric_limits<std::int32_t>::max());
  std::int8_t c[] = {64, -128};
  const std::int8_t d[] = {2, -1};
  kernels::apply(c, d, 2, op::prod);
  CHECK(c[0] == -128);
  CHECK(c[1] == -128);
}

TEST_CASE_TEMPLATE("min and max return NaN when either operand is NaN, whatever the order", T, float, double,
                   bfloat16, float16) {
  const T nan = T(std::numeric_limits<float>::quiet_NaN());
  std::vector<T> x(70, T(1.0f)), y(70, T(2.0f));
  x[3] = nan;   // NaN on the left
  y[5] = nan;   // NaN on the right
  x[66] = nan;  // in the tail
  y[67] = nan;
  for_each_isa([&] {
  for (int which = 0; which < 2; ++which) {
    std::vector<T> out(x.size());
    if (which == 0)
      kernels::apply3(out.data(), x.data(), y.data(), out.size(), op::min);
    else
      kernels::apply3(out.data(), x.data(), y.data(), out.size(), op::max);
    for (std::size_t i = 0; i < out.size(); ++i) {
      const bool nan_expected = i == 3 || i == 5 || i == 66 || i == 67;
      CAPTURE(i);
      CHECK(std::isnan(as_double(out[i])) == nan_expected);
      if (!nan_expected) CHECK(as_double(out[i]) == (which == 0 ? 1.0 : 2.0));
    }
  }
  });
}

TEST_CASE("a user-defined absmax reduces float and bfloat16 buffers through float") {
  struct absmax {
    float operator()(float a, float b) const { return std::fabs(a) < std::fabs(b) ? b : a; }
  };
  float f[] = {1.0f, -5.0f, 3.0f, -0.5f, 2.0f};
  const float g[] = {-2.0f, 4.0f, -3.5f, 0.25f, -2.0f};
  kernels::apply(f, g, 5, absmax{});
  CHECK(f[0] == -2.0f);
  CHECK(f[1] == -5.0f);
  CHECK(f[2] == -3.5f);
  CHECK(f[3] == -0.5f);
  CHECK(f[4] == 2.0f);  // ties keep the left operand

  std::vector<bfloat16> a(131), b(131);
  for (std::size_t i = 0; i < a.size(); ++i) {
    a[i] = bfloat16(static_cast<float>(i) * ((i % 2) ? -1.0f : 1.0f));
    b[i] = bfloat16(static_cast<float>(a.size() - i));
  }
  auto out = a;
  kernels::apply(out.data(), b.data(), out.size(), absmax{});
  for (std::size_t i = 0; i < a.size(); ++i) {
    CAPTURE(i);
    CHECK(static_cast<float>(out[i]) == absmax{}(static_cast<float>(a[i]), static_cast<float>(b[i])));
  }
}

TEST_CASE("apply3 keeps the operand order of a non-commutative user op when out aliases either input") {
  struct left_minus_twice_right {
    std::int32_t operator()(std::int32_t a, std::int32_t b) const { return a - 2 * b; }
  };
  std::vector<std::int32_t> a(100), b(100);
  for (int i = 0; i < 100; ++i) {
    a[static_cast<std::size_t>(i)] = 3 * i;
    b[static_cast<std::size_t>(i)] = i + 1;
  }
  auto expected = [&](std::size_t i) { return a[i] - 2 * b[i]; };
  auto out_a = a;
  kernels::apply3(out_a.data(), out_a.data(), b.data(), 100, left_minus_twice_right{});
  auto out_b = b;
  kernels::apply3(out_b.data(), a.data(), out_b.data(), 100, left_minus_twice_right{});
  auto self = a;
  kernels::apply3(self.data(), self.data(), self.data(), 100, left_minus_twice_right{});
  for (std::size_t i = 0; i < 100; ++i) {
    CAPTURE(i);
    CHECK(out_a[i] == expected(i));
    CHECK(out_b[i] == expected(i));
    CHECK(self[i] == -a[i]);
  }
}

TEST_CASE("a user op written on the storage type runs on bfloat16 without going through float") {
  struct keep_bits_max {
    bfloat16 operator()(bfloat16 a, bfloat16 b) const { return a.bits < b.bits ? b : a; }
  };
  const bfloat16 nan_payload = bfloat16::from_bits(0x7f81);  // a NaN float conversion would quieten
  std::vector<bfloat16> a(67, bfloat16::from_bits(0x0001)), b(67, nan_payload);
  kernels::apply(a.data(), b.data(), a.size(), keep_bits_max{});
  for (const auto& x : a) CHECK(x.bits == 0x7f81);
}

TEST_CASE_TEMPLATE("avg finalisation divides floating sums by the world size", T, float, double, bfloat16,
                   float16) {
  // Three ranks each hold (i, 2i, 3i): the sum is 6i, the mean 2i.
  const int world = 3;
  std::vector<T> acc(77), contribution(77);
  for (std::size_t i = 0; i < acc.size(); ++i) acc[i] = T(static_cast<float>(i));
  for (int rank = 2; rank <= world; ++rank) {
    for (std::size_t i = 0; i < acc.size(); ++i)
      contribution[i] = T(static_cast<float>(rank * static_cast<int>(i)));
    kernels::apply(acc.data(), contribution.data(), acc.size(), op::avg);
  }
  REQUIRE_FALSE(kernels::finalize_avg(acc.data(), acc.size(), world));
  for (std::size_t i = 0; i < acc.size(); ++i) {
    CAPTURE(i);
    // Every partial sum (at most 6 * 76) fits bfloat16's 8 significant bits,
    // so the mean is exact in every type.
    CHECK(as_double(acc[i]) == 2.0 * static_cast<double>(i));
  }
  std::vector<T> one(5, T(7.0f));
  REQUIRE_FALSE(kernels::finalize_avg(one.data(), one.size(), 1));
  for (const auto& x : one) CHECK(as_double(x) == 7.0);
}

TEST_CASE("integer avg finalisation truncates toward zero") {
  std::int32_t s[] = {7, -7, 6, -1, std::numeric_limits<std::int32_t>::min()};
  REQUIRE_FALSE(kernels::finalize_avg(s, 5, 2));
  CHECK(s[0] == 3);
  CHECK(s[1] == -3);
  CHECK(s[2] == 3);
  CHECK(s[3] == 0);
  CHECK(s[4] == std::numeric_limits<std::int32_t>::min() / 2);
  std::uint8_t u[] = {255, 4, 5};
  REQUIRE_FALSE(kernels::finalize_avg(u, 3, 4));
  CHECK(u[0] == 63);
  CHECK(u[1] == 1);
  CHECK(u[2] == 1);
  std::int64_t big[] = {std::numeric_limits<std::int64_t>::min(), -9};
  REQUIRE_FALSE(kernels::finalize_avg(big, 2, 8));
  CHECK(big[0] == std::numeric_limits<std::int64_t>::min() / 8);
  CHECK(big[1] == -1);
}

TEST_CASE("avg finalisation rejects a world size below one and leaves the data untouched") {
  float f[] = {4.0f, 8.0f};
  for (const int bad : {0, -1, std::numeric_limits<int>::min()}) {
    const std::error_code ec = kernels::finalize_avg(f, 2, bad);
    CHECK(ec == pdcoll::errc::invalid_argument);
    CHECK(&ec.category() == &pdcoll::error_category());
  }
  CHECK(f[0] == 4.0f);
  CHECK(f[1] == 8.0f);
  CHECK(kernels::finalize_avg(pdcoll::data_type::int32, f, 2, 0) == pdcoll::errc::invalid_argument);
}

TEST_CASE("type-erased entry points reject custom and unknown descriptors") {
  float a[] = {1.0f}, b[] = {2.0f};
  CHECK(kernels::apply(pdcoll::data_type::float32, pdcoll::reduction::custom, a, b, 1) ==
        pdcoll::errc::unsupported_op);
  CHECK(kernels::apply(pdcoll::data_type::float32, static_cast<pdcoll::reduction>(42), a, b, 1) ==
        pdcoll::errc::unsupported_op);
  CHECK(kernels::apply(static_cast<pdcoll::data_type>(42), pdcoll::reduction::sum, a, b, 1) ==
        pdcoll::errc::invalid_argument);
  CHECK(a[0] == 1.0f);
  std::int64_t sums[] = {10, -10};
  REQUIRE_FALSE(kernels::finalize_avg(pdcoll::data_type::int64, sums, 2, 4));
  CHECK(sums[0] == 2);
  CHECK(sums[1] == -2);
}

}  // TEST_SUITE
