// Element types, ops and their descriptors: what is supported is decided at
// compile time, and the runtime descriptors have stable values and names.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>

#include "pdcoll/reduce/kernels.hpp"

namespace {

using pdcoll::bfloat16;
using pdcoll::data_type;
using pdcoll::float16;
using pdcoll::reduction;
namespace op = pdcoll::op;

struct absmax {
  float operator()(float a, float b) const { return std::fabs(a) < std::fabs(b) ? b : a; }
};
struct int8_saturating_add {
  std::int8_t operator()(std::int8_t a, std::int8_t b) const {
    const int s = a + b;
    return static_cast<std::int8_t>(s > 127 ? 127 : s < -128 ? -128 : s);
  }
};
struct bf16_first {  // written on the storage type only
  bfloat16 operator()(bfloat16 a, bfloat16) const { return a; }
};
struct stateful_scale {  // has state: its behaviour is a runtime value
  float factor;
  float operator()(float a, float b) const { return factor * (a + b); }
};
struct returns_double {
  double operator()(float a, float b) const { return double(a) + b; }
};

float plain_add(float a, float b) { return a + b; }

template <class T, class Op>
concept can_apply = requires(T* p, Op o) { pdcoll::kernels::apply(p, p, std::size_t{1}, o); };

template <class T>
concept has_data_type = requires { pdcoll::data_type_of<T>; };

}  // namespace

TEST_SUITE("reduce.ops") {

TEST_CASE("every supported element type maps to its data_type, size and stable name") {
  static_assert(pdcoll::data_type_of<float> == data_type::float32);
  static_assert(pdcoll::data_type_of<double> == data_type::float64);
  static_assert(pdcoll::data_type_of<float16> == data_type::float16);
  static_assert(pdcoll::data_type_of<bfloat16> == data_type::bfloat16);
  static_assert(pdcoll::data_type_of<std::int8_t> == data_type::int8);
  static_assert(pdcoll::data_type_of<std::uint8_t> == data_type::uint8);
  static_assert(pdcoll::data_type_of<std::int32_t> == data_type::int32);
  static_assert(pdcoll::data_type_of<std::uint32_t> == data_type::uint32);
  static_assert(pdcoll::data_type_of<std::int64_t> == data_type::int64);
  static_assert(pdcoll::data_type_of<std::uint64_t> == data_type::uint64);
  static_assert(pdcoll::data_type_of<long long> == data_type::int64);  // distinct from int64_t on LP64
  static_assert(pdcoll::data_type_of<unsigned long long> == data_type::uint64);

  const char* names[] = {"float32", "float64", "float16", "bfloat16", "int8",
                         "uint8",   "int32",   "uint32",  "int64",    "uint64"};
  const std::size_t sizes[] = {4, 8, 2, 2, 1, 1, 4, 4, 8, 8};
  for (std::size_t i = 0; i < pdcoll::data_type_count; ++i) {
    const auto t = static_cast<data_type>(i);
    CHECK(pdcoll::is_valid(t));
    CHECK(pdcoll::to_string(t) == names[i]);
    CHECK(pdcoll::element_size(t) == sizes[i]);
  }
  const auto bogus = static_cast<data_type>(200);
  CHECK_FALSE(pdcoll::is_valid(bogus));
  CHECK(pdcoll::to_string(bogus) == "unknown");
  CHECK(pdcoll::element_size(bogus) == 0);
}

TEST_CASE("types outside the supported set have no data_type and cannot be reduced") {
  static_assert(!has_data_type<bool>);
  static_assert(!has_data_type<char>);
  static_assert(!has_data_type<char8_t>);
  static_assert(!has_data_type<std::int16_t>);
  static_assert(!has_data_type<std::uint16_t>);
  static_assert(!has_data_type<long double>);
  static_assert(!has_data_type<const float>);
  static_assert(!has_data_type<std::string>);
  static_assert(!pdcoll::is_supported_v<bool, op::sum_t>);
  static_assert(!pdcoll::is_supported_v<std::int16_t, op::max_t>);
  static_assert(!pdcoll::is_supported_v<long double, op::sum_t>);
  static_assert(!pdcoll::reduction_op<op::sum_t, char>);
  static_assert(!can_apply<bool, op::sum_t>);
  static_assert(!can_apply<std::int16_t, op::prod_t>);
  static_assert(!can_apply<long double, op::min_t>);
}

TEST_CASE("every built-in op supports every element type and names its reduction") {
  auto all_ops = []<class T>(T*) {
    static_assert(pdcoll::is_supported_v<T, op::sum_t> && pdcoll::is_supported_v<T, op::prod_t> &&
                  pdcoll::is_supported_v<T, op::min_t> && pdcoll::is_supported_v<T, op::max_t> &&
                  pdcoll::is_supported_v<T, op::avg_t>);
    static_assert(pdcoll::reduction_op<decltype(op::sum), T>);  // the object's type (const) works too
    static_assert(can_apply<T, op::avg_t>);
  };
  all_ops(static_cast<float*>(nullptr));
  all_ops(static_cast<double*>(nullptr));
  all_ops(static_cast<float16*>(nullptr));
  all_ops(static_cast<bfloat16*>(nullptr));
  all_ops(static_cast<std::int8_t*>(nullptr));
  all_ops(static_cast<std::uint8_t*>(nullptr));
  all_ops(static_cast<std::int32_t*>(nullptr));
  all_ops(static_cast<std::uint32_t*>(nullptr));
  all_ops(static_cast<std::int64_t*>(nullptr));
  all_ops(static_cast<std::uint64_t*>(nullptr));

  static_assert(pdcoll::reduction_of<op::sum_t> == reduction::sum);
  static_assert(pdcoll::reduction_of<decltype(op::prod)> == reduction::prod);
  static_assert(pdcoll::reduction_of<op::min_t&> == reduction::min);
  static_assert(pdcoll::reduction_of<op::max_t> == reduction::max);
  static_assert(pdcoll::reduction_of<op::avg_t> == reduction::avg);
  static_assert(pdcoll::reduction_of<absmax> == reduction::custom);

  const char* names[] = {"sum", "prod", "min", "max", "avg", "custom"};
  for (std::size_t i = 0; i < pdcoll::reduction_count; ++i) {
    CHECK(pdcoll::is_valid(static_cast<reduction>(i)));
    CHECK(pdcoll::to_string(static_cast<reduction>(i)) == names[i]);
  }
  CHECK_FALSE(pdcoll::is_valid(static_cast<reduction>(6)));
  CHECK(pdcoll::to_string(static_cast<reduction>(99)) == "unknown");
}

TEST_CASE("a user op is supported exactly when it is stateless and maps (T, T) to T") {
  // absmax on float serves float, and bfloat16/float16 through float.
  static_assert(pdcoll::reduction_op<absmax, float>);
  static_assert(pdcoll::reduction_op<absmax, bfloat16>);
  static_assert(pdcoll::reduction_op<absmax, float16>);
  static_assert(!pdcoll::reduction_op<absmax, double>);        // returns float, not double
  static_assert(!pdcoll::reduction_op<absmax, std::int32_t>);  // returns float, not int32
  static_assert(pdcoll::reduction_op<int8_saturating_add, std::int8_t>);
  static_assert(!pdcoll::reduction_op<int8_saturating_add, std::uint8_t>);
  static_assert(pdcoll::reduction_op<bf16_first, bfloat16>);
  static_assert(!pdcoll::reduction_op<bf16_first, float16>);
  static_assert(!pdcoll::reduction_op<stateful_scale, float>);
  static_assert(!pdcoll::reduction_op<returns_double, float>);
  static_assert(!pdcoll::reduction_op<decltype(&plain_add), float>);
  auto lambda = [](float a, float b) { return a > b ? a : b; };
  static_assert(pdcoll::reduction_op<decltype(lambda), float>);
  const float captured = 2.0f;
  auto capturing = [captured](float a, float b) { return captured * (a + b); };
  static_assert(!pdcoll::reduction_op<decltype(capturing), float>);
  static_assert(!can_apply<float, decltype(capturing)>);
  CHECK(capturing(1.0f, 1.0f) == 4.0f);
}

}  // TEST_SUITE
