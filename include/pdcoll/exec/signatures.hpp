// File: exec/signatures.hpp — compile-time helpers that build, merge and
// transform completion_signatures lists for the algorithms.
//
// They pattern-match on the vocabulary's `completion_signatures<...>` and
// `set_*_t(...)` function types, so they work unchanged when the vocabulary
// aliases stdexec's (PDCOLL_USE_STDEXEC).
#pragma once

#include <exception>
#include <tuple>
#include <type_traits>
#include <variant>

#include "pdcoll/exec/vocabulary.hpp"

namespace pdcoll::exec::detail {

/// A plain list of types.
template <class... Ts>
struct type_list {};

/// The concatenation of type_lists.
template <class... Lists>
struct join_type_lists {
  using type = type_list<>;
};
template <class... As, class... Rest>
struct join_type_lists<type_list<As...>, Rest...> {
  template <class Tail>
  struct prepend;
  template <class... Bs>
  struct prepend<type_list<Bs...>> {
    using type = type_list<As..., Bs...>;
  };
  using type = typename prepend<typename join_type_lists<Rest...>::type>::type;
};

// ---- dedup-appending and concatenation of signature lists -------------------

template <class List, class... Add>
struct append_unique {
  using type = List;
};
template <class... Have, class First, class... Rest>
struct append_unique<completion_signatures<Have...>, First, Rest...> {
  using type = typename append_unique<
      std::conditional_t<(std::is_same_v<First, Have> || ...), completion_signatures<Have...>,
                         completion_signatures<Have..., First>>,
      Rest...>::type;
};

template <class... Lists>
struct concat_signatures {
  using type = completion_signatures<>;
};
template <class... Sigs, class... Rest>
struct concat_signatures<completion_signatures<Sigs...>, Rest...> {
  template <class Acc, class Next>
  struct join;
  template <class Acc, class... More>
  struct join<Acc, completion_signatures<More...>> {
    using type = typename append_unique<Acc, More...>::type;
  };
  using tail = typename concat_signatures<Rest...>::type;
  using type = typename join<typename append_unique<completion_signatures<>, Sigs...>::type,
                             tail>::type;
};

/// The union of several completion_signatures lists, duplicates removed, first
/// occurrence order kept.
template <class... Lists>
using concat_signatures_t = typename concat_signatures<Lists...>::type;

/// Applies `Map<Sig>::type` (itself a completion_signatures list) to every
/// signature of Sigs and joins the results.
template <class Sigs, template <class> class Map>
struct transform_signatures;
template <class... Sigs, template <class> class Map>
struct transform_signatures<completion_signatures<Sigs...>, Map> {
  using type = concat_signatures_t<typename Map<Sigs>::type...>;
};
template <class Sigs, template <class> class Map>
using transform_signatures_t = typename transform_signatures<Sigs, Map>::type;

/// `set_error_t(std::exception_ptr)` when May is true, else nothing.
template <bool May>
using exception_signature_if =
    std::conditional_t<May, completion_signatures<set_error_t(std::exception_ptr)>,
                       completion_signatures<>>;

// ---- queries on a list ------------------------------------------------------

template <class Sig>
inline constexpr bool is_value_signature = false;
template <class... As>
inline constexpr bool is_value_signature<set_value_t(As...)> = true;
template <class Sig>
inline constexpr bool is_error_signature = false;
template <class E>
inline constexpr bool is_error_signature<set_error_t(E)> = true;
template <class Sig>
inline constexpr bool is_stopped_signature = std::is_same_v<Sig, set_stopped_t()>;

template <class Sigs>
struct signature_counts;
template <class... Sigs>
struct signature_counts<completion_signatures<Sigs...>> {
  static constexpr std::size_t values = (std::size_t{0} + ... + is_value_signature<Sigs>);
  static constexpr std::size_t errors = (std::size_t{0} + ... + is_error_signature<Sigs>);
  static constexpr bool stopped = (false || ... || is_stopped_signature<Sigs>);
};

/// For each signature, a type_list of the types `Wrap<Args...>` for the
/// matching channel (e.g. the decayed value tuples), duplicates kept.
template <class Sigs, template <class...> class Wrap>
struct value_types;
template <class... Sigs, template <class...> class Wrap>
struct value_types<completion_signatures<Sigs...>, Wrap> {
  template <class Sig>
  struct one {
    using type = type_list<>;
  };
  template <class... As>
  struct one<set_value_t(As...)> {
    using type = type_list<Wrap<As...>>;
  };
  using type = typename join_type_lists<typename one<Sigs>::type...>::type;
};

template <class Sigs>
struct error_types;
template <class... Sigs>
struct error_types<completion_signatures<Sigs...>> {
  template <class Sig>
  struct one {
    using type = type_list<>;
  };
  template <class E>
  struct one<set_error_t(E)> {
    using type = type_list<E>;
  };
  using type = typename join_type_lists<typename one<Sigs>::type...>::type;
};

// ---- type_list utilities ----------------------------------------------------

template <class List, class... Add>
struct list_append_unique {
  using type = List;
};
template <class... Have, class First, class... Rest>
struct list_append_unique<type_list<Have...>, First, Rest...> {
  using type = typename list_append_unique<
      std::conditional_t<(std::is_same_v<First, Have> || ...), type_list<Have...>,
                         type_list<Have..., First>>,
      Rest...>::type;
};
template <class List>
struct unique_list;
template <class... Ts>
struct unique_list<type_list<Ts...>> {
  using type = typename list_append_unique<type_list<>, Ts...>::type;
};
/// The list with duplicates removed.
template <class List>
using unique_list_t = typename unique_list<List>::type;

template <class List, template <class...> class To>
struct apply_list;
template <class... Ts, template <class...> class To>
struct apply_list<type_list<Ts...>, To> {
  using type = To<Ts...>;
};
/// `To<Ts...>` for `type_list<Ts...>`.
template <class List, template <class...> class To>
using apply_list_t = typename apply_list<List, To>::type;

template <class List, template <class> class Map>
struct map_list;
template <class... Ts, template <class> class Map>
struct map_list<type_list<Ts...>, Map> {
  using type = type_list<typename Map<Ts>::type...>;
};

template <class... Ts>
using decayed_tuple = std::tuple<std::decay_t<Ts>...>;

template <class... Ts>
struct variant_of_unique {
  using type = apply_list_t<unique_list_t<type_list<std::monostate, Ts...>>, std::variant>;
};
template <class List>
struct variant_from_list;
template <class... Ts>
struct variant_from_list<type_list<Ts...>> {
  using type = typename variant_of_unique<Ts...>::type;
};
/// `std::variant<std::monostate, unique Ts...>` for `type_list<Ts...>`.
template <class List>
using storage_variant_t = typename variant_from_list<List>::type;

/// Whether every type in `As...` can be decay-copied without throwing.
template <class... As>
inline constexpr bool nothrow_decay_copyable =
    (std::is_nothrow_constructible_v<std::decay_t<As>, As> && ...);

template <class Sig>
inline constexpr bool nothrow_decay_copyable_signature = false;
template <class Tag, class... As>
inline constexpr bool nothrow_decay_copyable_signature<Tag(As...)> = nothrow_decay_copyable<As...>;
/// Whether every argument of every signature in Sigs decay-copies without throwing.
template <class Sigs>
inline constexpr bool nothrow_decay_copyable_results = false;
template <class... Sigs>
inline constexpr bool nothrow_decay_copyable_results<completion_signatures<Sigs...>> =
    (nothrow_decay_copyable_signature<Sigs> && ...);

/// The first type of a non-empty pack, or empty_env: the env an algorithm
/// computes its completions in when asked through the static template form.
template <class... Env>
struct first_env {
  using type = empty_env;
};
template <class E, class... Rest>
struct first_env<E, Rest...> {
  using type = E;
};
template <class... Env>
using first_env_t = typename first_env<Env...>::type;

}  // namespace pdcoll::exec::detail

namespace pdcoll::exec::detail {

/// The operation state type of connecting S to R.
template <class S, class R>
using connect_result_t = decltype(exec::connect(std::declval<S>(), std::declval<R>()));

/// Whether connecting S to R cannot throw.
template <class S, class R>
inline constexpr bool nothrow_connect = noexcept(exec::connect(std::declval<S>(), std::declval<R>()));

/// Converts to the result of `fn()`: lets `optional::emplace` /
/// `variant::emplace` build an immovable operation state straight from
/// `connect(...)`'s return value (guaranteed copy elision).
template <class Fn>
struct emplace_from {
  Fn fn;
  using type = std::invoke_result_t<Fn>;
  operator type() && noexcept(std::is_nothrow_invocable_v<Fn>) { return std::move(fn)(); }
};
template <class Fn>
emplace_from(Fn) -> emplace_from<Fn>;

/// A receiver that accepts every completion and has environment Env: used to
/// ask compile-time questions about senders before the real receiver exists.
template <class Env>
struct probe_receiver {
  using receiver_concept = receiver_t;
  template <class... As>
  void set_value(As&&...) noexcept {}
  template <class E>
  void set_error(E&&) noexcept {}
  void set_stopped() noexcept {}
  Env get_env() const noexcept;
};

}  // namespace pdcoll::exec::detail
