// Compile-time checks: pdcoll's collective and point-to-point senders are
// senders in every environment a caller connects them with, and declare
// exactly the completion signatures their documentation promises.
#include <doctest/doctest.h>

#include <pdcoll/pdcoll.hpp>

#include <cstddef>
#include <system_error>
#include <span>
#include <type_traits>
#include <vector>

namespace {

namespace ex = pdcoll::exec;

using collective_completions =
    ex::completion_signatures<ex::set_value_t(), ex::set_error_t(std::error_code), ex::set_stopped_t()>;
using send_completions = collective_completions;
using recv_completions =
    ex::completion_signatures<ex::set_value_t(std::size_t), ex::set_error_t(std::error_code), ex::set_stopped_t()>;

/// An environment with a stop token, as with_deadline and when_all give their children.
struct stoppable_env {
  ex::inplace_stop_token token;
  ex::inplace_stop_token query(ex::get_stop_token_t) const noexcept { return token; }
};

template <class S, class Sigs, class Env>
constexpr bool declares_in = ex::sender_in<S, Env> && std::is_same_v<ex::completion_signatures_of_t<S, Env>, Sigs>;

template <class S, class Sigs>
constexpr bool declares = declares_in<S, Sigs, ex::empty_env> && declares_in<S, Sigs, ex::sync_wait_env> &&
                          declares_in<S, Sigs, stoppable_env> && declares_in<const S&, Sigs, ex::empty_env>;

static_assert(declares<pdcoll::collective_sender, collective_completions>);
static_assert(declares<pdcoll::send_sender, send_completions>);
static_assert(declares<pdcoll::recv_sender, recv_completions>);

// The free functions return those sender types, whatever buffer they are given.
static_assert(std::is_same_v<decltype(pdcoll::send(std::declval<pdcoll::communicator&>(), 0,
                                                   std::declval<const std::vector<float>&>())),
                             pdcoll::send_sender>);
static_assert(std::is_same_v<decltype(pdcoll::recv(std::declval<pdcoll::communicator&>(), 0,
                                                   std::declval<std::vector<int>&>(), 3u)),
                             pdcoll::recv_sender>);
static_assert(std::is_same_v<decltype(pdcoll::all_reduce(std::declval<pdcoll::communicator&>(),
                                                         std::declval<std::vector<float>&>())),
                             pdcoll::collective_sender>);
static_assert(std::is_same_v<decltype(pdcoll::barrier(std::declval<pdcoll::communicator&>())),
                             pdcoll::collective_sender>);

// A buffer must outlive the sender: lvalue containers and borrowed ranges
// are taken, a temporary container is refused (the sender would point into
// storage the full expression destroys).
template <class B>
constexpr bool all_reduce_takes =
    requires(pdcoll::communicator& c, B&& b) { pdcoll::all_reduce(c, std::forward<B>(b)); };
template <class In, class Out>
constexpr bool out_of_place_takes =
    requires(pdcoll::communicator& c, In&& in, Out&& out) { pdcoll::all_gather(c, std::forward<In>(in), std::forward<Out>(out)); };
template <class B>
constexpr bool send_takes = requires(pdcoll::communicator& c, B&& b) { pdcoll::send(c, 0, std::forward<B>(b)); };
static_assert(all_reduce_takes<std::vector<float>&>);
static_assert(all_reduce_takes<std::span<float>>);
static_assert(all_reduce_takes<pdcoll::view<float>>);
static_assert(!all_reduce_takes<std::vector<float>>);
static_assert(out_of_place_takes<const std::vector<float>&, std::span<float>>);
static_assert(!out_of_place_takes<std::vector<float>, std::vector<float>&>);
static_assert(!out_of_place_takes<const std::vector<float>&, std::vector<float>>);
template <class In, class Out>
constexpr bool all_reduce_into_takes =
    requires(pdcoll::communicator& c, In&& in, Out&& out) { pdcoll::all_reduce(c, std::forward<In>(in), std::forward<Out>(out)); };
static_assert(all_reduce_into_takes<const std::vector<float>&, std::vector<float>&>);
static_assert(!all_reduce_into_takes<const std::vector<float>&, std::vector<float>>);  // not taken for an op either
static_assert(send_takes<const std::vector<int>&>);
static_assert(!send_takes<std::vector<int>>);

// Per-operation deadlines keep the sender's type (and so its signatures).
static_assert(std::is_same_v<decltype(std::declval<const pdcoll::recv_sender&>().with_timeout(
                                 std::chrono::milliseconds(1))),
                             pdcoll::recv_sender>);
static_assert(std::is_same_v<decltype(std::declval<const pdcoll::collective_sender&>().with_timeout(
                                 std::chrono::milliseconds(1))),
                             pdcoll::collective_sender>);

// Composed: when_all of a receive and a collective yields the byte count,
// and sync_wait accepts the result.
using receive_and_reduce = decltype(ex::when_all(std::declval<pdcoll::recv_sender>(),
                                                 std::declval<pdcoll::collective_sender>()));
static_assert(ex::sender_in<receive_and_reduce, ex::sync_wait_env>);
static_assert(std::is_same_v<ex::sync_wait_result_t<receive_and_reduce>, std::optional<std::tuple<std::size_t>>>);
static_assert(std::is_same_v<ex::sync_wait_result_t<pdcoll::send_sender>, std::optional<std::tuple<>>>);

// A sender's operation states model operation_state for a sync_wait receiver.
template <class S>
using operation_for = decltype(ex::connect(std::declval<S>(),
                                           std::declval<ex::detail::sync_wait_receiver<std::tuple<>>>()));
static_assert(ex::operation_state<operation_for<pdcoll::send_sender>>);
static_assert(ex::operation_state<operation_for<pdcoll::collective_sender>>);

}  // namespace

TEST_CASE("collective and point-to-point senders declare exactly their completion signatures") {
  // Everything is checked at compile time above; this case makes the binary a test.
  CHECK(std::is_same_v<ex::completion_signatures_of_t<pdcoll::recv_sender>, recv_completions>);
  CHECK(!std::is_same_v<ex::completion_signatures_of_t<pdcoll::send_sender>, recv_completions>);
}
