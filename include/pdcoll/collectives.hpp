// File: collectives.hpp — the collectives as free functions returning senders.
//
//     pdcoll::exec::sync_wait(pdcoll::all_reduce(comm, grads, pdcoll::op::sum));
//     auto step = pdcoll::exec::when_all(pdcoll::all_reduce(comm, bucket0),
//                                        pdcoll::all_reduce(comm, bucket1));
//
// Buffers are pdcoll::view<T, Domain> (std::span, std::vector and arrays
// convert to host views). Arguments are checked when the sender is made; a
// rejected call still returns a sender, which completes with set_error(errc::…)
// when started, and posts nothing: null or undersized buffers
// (null_buffer, buffer_too_small), sizes that overflow (count_overflow), roots
// or peers out of range (root_out_of_range), input and output that overlap
// other than in the collective's in-place form (overlapping_buffers; see
// each function), an op the type does not support at run time
// (unsupported_op). Every rank must start the same collectives in the same
// order with the same counts, types, ops and roots; a rank that does not
// makes every rank complete with errc::collective_mismatch.
#pragma once

#include <pdcoll/algorithm/automatic.hpp>
#include <pdcoll/algorithm/chain.hpp>
#include <pdcoll/algorithm/dissemination.hpp>
#include <pdcoll/communicator.hpp>
#include <pdcoll/detail/collective_operation.hpp>
#include <pdcoll/memory/view.hpp>
#include <pdcoll/reduce/data_type.hpp>
#include <pdcoll/reduce/kernels.hpp>
#include <pdcoll/reduce/ops.hpp>

#include <algorithm>
#include <limits>
#include <optional>
#include <ranges>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

namespace pdcoll {

namespace detail {

template <class B>
struct view_of {};
template <class T, class D>
struct view_of<view<T, D>> {
  using type = view<T, D>;
};

/// The pdcoll::view a buffer argument stands for (views as they are;
/// contiguous ranges as host views).
template <class B>
auto as_view(B&& buffer) {
  using plain = std::remove_cvref_t<B>;
  if constexpr (requires { typename view_of<plain>::type; }) {
    return buffer;
  } else {
    using element = std::remove_reference_t<std::ranges::range_reference_t<B>>;
    return view<element, memory::host>(std::ranges::data(buffer), std::ranges::size(buffer));
  }
}

template <class B>
using view_t = decltype(as_view(std::declval<B>()));

/// A buffer type, whatever the argument's lifetime: a pdcoll::view or a
/// contiguous sized range (tells a buffer from an op in the overloads).
template <class B>
concept buffer_like = requires { typename view_of<std::remove_cvref_t<B>>::type; } ||
                      (std::ranges::contiguous_range<B> && std::ranges::sized_range<B>);

/// A buffer argument: a pdcoll::view, or a contiguous range of a pdcoll
/// element type that outlives the call (an lvalue container or a borrowed
/// range such as a span). A temporary container is refused: the sender
/// would keep a pointer into it after the full expression destroyed it.
template <class B>
concept buffer_argument = requires { typename view_of<std::remove_cvref_t<B>>::type; } ||
                          (buffer_like<B> && (std::is_lvalue_reference_v<B> || std::ranges::borrowed_range<B>));

template <class V>
using element_of = typename V::value_type;
template <class V>
using domain_of = typename V::domain_type;

template <class T, class Op>
constexpr reduction_table make_reduction() noexcept {
  reduction_table t;
  t.element_size = sizeof(T);
  t.type_id = static_cast<std::uint32_t>(data_type_of<T>);
  t.op_id = static_cast<std::uint32_t>(reduction_of<Op>);
  t.apply = [](void* inout, const void* in, std::size_t n) noexcept {
    kernels::apply<T, Op>(static_cast<T*>(inout), static_cast<const T*>(in), n);
  };
  t.apply3 = [](void* out, const void* a, const void* b, std::size_t n) noexcept {
    kernels::apply3<T, Op>(static_cast<T*>(out), static_cast<const T*>(a), static_cast<const T*>(b), n);
  };
  if constexpr (std::is_same_v<Op, op::avg_t>) {
    t.finalize = [](void* data, std::size_t n, int world) noexcept {
      (void)kernels::finalize_avg<T>(static_cast<T*>(data), n, world);
    };
  }
  return t;
}

/// The reduction table of `Op` on `T` (one constant per pair: a collective's
/// arguments carry a pointer to it).
template <class T, class Op>
inline constexpr reduction_table reduction_for = make_reduction<T, Op>();

/// The table of collectives over `T` that move data without reducing.
template <class T>
inline constexpr reduction_table plain_table_for = [] {
  reduction_table t;
  t.element_size = sizeof(T);
  t.type_id = static_cast<std::uint32_t>(data_type_of<T>);
  t.op_id = 255;
  return t;
}();

/// Whether the domain keeps collectives' scratch (memory/scratch_cache.hpp).
template <class Domain>
inline constexpr bool has_scratch_cache = requires(Domain& d) { d.scratch(); };

/// The engine's operations on device domain `Domain` (one constant table per type).
template <class Domain>
struct device_domain_operations {
  using buffer_type = decltype(std::declval<Domain&>().template allocate<std::byte>(1));

  // Scratch comes from the domain's scratch cache when it has one
  // (memory/scratch_cache.hpp): device allocation per collective is costly.
  static void* allocate(void* d, std::size_t bytes, transport::memory_region& region) {
    auto* dom = static_cast<Domain*>(d);
    auto fresh = [dom](std::size_t n) { return dom->template allocate<std::byte>(n); };
    buffer_type* buffer = nullptr;
    if constexpr (has_scratch_cache<Domain>) buffer = new buffer_type(dom->scratch().take(bytes, fresh));
    else buffer = new buffer_type(fresh(bytes));
    region = memory::detail::fabric_region(buffer->view());
    return buffer;
  }
  static void deallocate(void* d, void* handle) noexcept {
    auto* buffer = static_cast<buffer_type*>(handle);
    if constexpr (has_scratch_cache<Domain>) static_cast<Domain*>(d)->scratch().give(std::move(*buffer));
    delete buffer;
  }
  static void to_host(void* d, std::uint64_t address, void* dst, std::size_t bytes) {
    auto* dom = static_cast<Domain*>(d);
    auto src = memory::detail::domain_access::make_view<const std::byte, Domain>(dom, address, bytes);
    dom->copy_to_host(src, std::span<std::byte>(static_cast<std::byte*>(dst), bytes));
  }
  static void from_host(void* d, std::uint64_t address, const void* src, std::size_t bytes) {
    auto* dom = static_cast<Domain*>(d);
    auto dst = memory::detail::domain_access::make_view<std::byte, Domain>(dom, address, bytes);
    dom->copy_from_host(std::span<const std::byte>(static_cast<const std::byte*>(src), bytes), dst);
  }
  static constexpr domain_operations table{&allocate, &deallocate, &to_host, &from_host};
};

template <class Domain>
domain_access make_domain_access(Domain* domain) noexcept {
  domain_access a;
  if constexpr (!std::is_same_v<Domain, memory::host>) {
    a.ops = &device_domain_operations<Domain>::table;
    a.domain = domain;
    a.reduces_on_device = domain ? domain->reduces_on_device() : true;
  }
  return a;
}

template <class T, class D>
user_buffer make_user_buffer(const view<T, D>& v) noexcept {
  user_buffer b;
  b.region = memory::detail::fabric_region(v);
  b.device_address = v.device_address();
  if constexpr (std::is_same_v<D, memory::host>) {
    b.domain = make_domain_access<D>(nullptr);
  } else {
    b.domain = make_domain_access<D>(v.empty() ? nullptr : &v.domain());
  }
  return b;
}

/// True when n * multiplier * element_size fits in a size_t (checked by
/// multiplication: a 64-bit division costs tens of cycles on every call).
inline bool bytes_fit(std::size_t n, std::size_t multiplier, std::size_t element_size) noexcept {
  std::size_t product = 0;
  return !__builtin_mul_overflow(n, multiplier, &product) && !__builtin_mul_overflow(product, element_size, &product);
}

inline bool is_null(const user_buffer& b) noexcept { return b.region.address == nullptr; }

/// The one overlap of input and output a collective accepts as "in place";
/// any other overlap is errc::overlapping_buffers.
enum class in_place_form {
  none,             ///< no overlap at all (all_to_all)
  same_buffer,      ///< input and output start at the same element (all_reduce, broadcast, reduce)
  input_in_output,  ///< input is block `rank` of the output (all_gather, as ncclAllGather and MPI_IN_PLACE)
  output_in_input,  ///< output is block `rank` of the input (reduce_scatter, as ncclReduceScatter)
};

inline bool overlap(const user_buffer& a, const user_buffer& b) noexcept {
  if (a.region.kind != b.region.kind || !a.region.length || !b.region.length) return false;
  auto a0 = reinterpret_cast<std::uintptr_t>(a.region.address), b0 = reinterpret_cast<std::uintptr_t>(b.region.address);
  return a0 < b0 + b.region.length && b0 < a0 + a.region.length;
}

// Whether in and out overlap other than as `form` allows, where this rank's
// block starts `at` bytes into the buffer that holds every block.
inline bool overlaps_wrongly(const user_buffer& in, const user_buffer& out, in_place_form form,
                             std::size_t at) noexcept {
  if (!overlap(in, out)) return false;
  const auto i0 = reinterpret_cast<std::uintptr_t>(in.region.address);
  const auto o0 = reinterpret_cast<std::uintptr_t>(out.region.address);
  switch (form) {
    case in_place_form::same_buffer: return i0 != o0;
    case in_place_form::input_in_output: return i0 != o0 + at;
    case in_place_form::output_in_input: return o0 != i0 + at;
    case in_place_form::none: break;
  }
  return true;
}

// Fills the parts every collective shares and checks the buffers:
// `in_elems`/`out_elems` are the elements this rank's call needs; for the
// block forms of in_place, a block is `count` elements.
template <class In, class Out>
collective_spec make_spec(const communicator& comm, collective_kind kind, const In& in, const Out& out,
                          std::size_t count, std::size_t in_elems, std::size_t out_elems, in_place_form in_place) {
  collective_spec s;
  s.kind = kind;
  s.count = count;
  s.input = make_user_buffer(in);
  s.output = make_user_buffer(out);
  using T = typename Out::value_type;
  const auto P = static_cast<std::size_t>(comm.world_size());
  if (!bytes_fit(count, P, sizeof(T))) {
    s.invalid = make_error_code(errc::count_overflow);
  } else if ((in_elems && is_null(s.input)) || (out_elems && is_null(s.output))) {
    s.invalid = make_error_code(errc::null_buffer);
  } else if (in.size() < in_elems || out.size() < out_elems) {
    s.invalid = make_error_code(errc::buffer_too_small);
  }
  // The engine moves exactly what the collective needs, so only that can overlap.
  s.input.region.length = in_elems * sizeof(T);
  s.output.region.length = out_elems * sizeof(T);
  if (!s.invalid &&
      overlaps_wrongly(s.input, s.output, in_place, static_cast<std::size_t>(comm.rank()) * count * sizeof(T)))
    s.invalid = make_error_code(errc::overlapping_buffers);
  return s;
}

inline bool root_ok(const communicator& comm, int root) noexcept { return root >= 0 && root < comm.world_size(); }

/// The v forms' blocks, checked: `input_elems` and `output_elems` are the
/// extents the blocks reach (elements).
struct variable_extents {
  std::size_t input_elems = 0;
  std::size_t output_elems = 0;
  std::error_code invalid;
};

/// Checks the four arrays of a v form of P ranks over elements of
/// `element_size` bytes: each has P entries (invalid_argument); every
/// non-empty block's end fits a size_t in bytes (count_overflow; an empty
/// block's displacement may be anything, as in MPI); the block to itself is
/// as long as the block from itself (invalid_argument); receive blocks do
/// not overlap each other (overlapping_buffers).
inline variable_extents check_variable_blocks(std::size_t P, std::size_t rank, std::size_t element_size,
                                              std::span<const std::size_t> send_counts,
                                              std::span<const std::size_t> send_displs,
                                              std::span<const std::size_t> recv_counts,
                                              std::span<const std::size_t> recv_displs) {
  variable_extents e;
  if (send_counts.size() != P || send_displs.size() != P || recv_counts.size() != P || recv_displs.size() != P ||
      send_counts[rank] != recv_counts[rank]) {
    e.invalid = make_error_code(errc::invalid_argument);
    return e;
  }
  // One block's end, or nullopt when it or its byte size overflows.
  auto end_of = [element_size](std::size_t displ, std::size_t count) -> std::optional<std::size_t> {
    std::size_t end = 0;
    if (__builtin_add_overflow(displ, count, &end) || !bytes_fit(end, 1, element_size)) return std::nullopt;
    return end;
  };
  std::vector<std::pair<std::size_t, std::size_t>> received;  // (displacement, end) of non-empty receive blocks
  received.reserve(P);
  for (std::size_t p = 0; p < P; ++p) {
    auto send_end = send_counts[p] ? end_of(send_displs[p], send_counts[p]) : std::optional<std::size_t>(0);
    auto recv_end = recv_counts[p] ? end_of(recv_displs[p], recv_counts[p]) : std::optional<std::size_t>(0);
    if (!send_end || !recv_end) {
      e.invalid = make_error_code(errc::count_overflow);
      return e;
    }
    e.input_elems = std::max(e.input_elems, *send_end);
    e.output_elems = std::max(e.output_elems, *recv_end);
    if (recv_counts[p]) received.emplace_back(recv_displs[p], *recv_end);
  }
  std::sort(received.begin(), received.end());
  for (std::size_t i = 1; i < received.size(); ++i)
    if (received[i].first < received[i - 1].second) e.invalid = make_error_code(errc::overlapping_buffers);
  return e;
}

/// The spec of a v form (collective_spec::peer_blocks). `input_in_output`:
/// the input may be this rank's receive block of the output (all_gatherv's
/// in place); any other overlap of input and output is overlapping_buffers.
template <class In, class Out>
collective_spec make_variable_spec(const communicator& comm, collective_kind kind, const In& in, const Out& out,
                                   std::span<const std::size_t> send_counts, std::span<const std::size_t> send_displs,
                                   std::span<const std::size_t> recv_counts, std::span<const std::size_t> recv_displs,
                                   bool input_in_output) {
  using T = typename Out::value_type;
  collective_spec s;
  s.kind = kind;
  s.input = make_user_buffer(in);
  s.output = make_user_buffer(out);
  const auto P = static_cast<std::size_t>(comm.world_size()), me = static_cast<std::size_t>(comm.rank());
  const auto extents = check_variable_blocks(P, me, sizeof(T), send_counts, send_displs, recv_counts, recv_displs);
  s.invalid = extents.invalid;
  if (s.invalid) return s;
  if ((extents.input_elems && is_null(s.input)) || (extents.output_elems && is_null(s.output))) {
    s.invalid = make_error_code(errc::null_buffer);
  } else if (in.size() < extents.input_elems || out.size() < extents.output_elems) {
    s.invalid = make_error_code(errc::buffer_too_small);
  }
  s.input.region.length = extents.input_elems * sizeof(T);
  s.output.region.length = extents.output_elems * sizeof(T);
  // This rank's receive block, for the in-place form (an empty one's
  // displacement is unchecked, but its input is empty and overlaps nothing).
  const auto form = input_in_output ? in_place_form::input_in_output : in_place_form::none;
  const std::size_t own_block = recv_counts[me] ? recv_displs[me] * sizeof(T) : 0;
  if (!s.invalid && overlaps_wrongly(s.input, s.output, form, own_block))
    s.invalid = make_error_code(errc::overlapping_buffers);
  if (s.invalid) return s;
  s.peer_blocks.reserve(4 * P);
  for (auto part : {send_counts, send_displs, recv_counts, recv_displs})
    s.peer_blocks.insert(s.peer_blocks.end(), part.begin(), part.end());
  return s;
}

/// The sender of a v form over elements T, run by `algorithm` of Algo.
template <class T, class Algo>
collective_sender variable_sender(communicator& comm, collective_spec&& s, algorithm_fn algorithm) {
  s.red = &plain_table_for<T>;
  s.algorithm = algorithm;
  s.algorithm_name = Algo::name;
  return collective_sender(comm, std::move(s));
}

/// Displacements of blocks packed back to back: the running sums of
/// `counts` (an overflowing sum gives a displacement that fails the checks).
inline std::vector<std::size_t> packed_displacements(std::span<const std::size_t> counts) {
  std::vector<std::size_t> displs(counts.size());
  std::size_t at = 0;
  bool overflowed = false;
  for (std::size_t p = 0; p < counts.size(); ++p) {
    displs[p] = overflowed ? std::numeric_limits<std::size_t>::max() : at;
    overflowed = overflowed || __builtin_add_overflow(at, counts[p], &at);
  }
  return displs;
}

template <class V, class W>
inline constexpr bool same_element = std::is_same_v<element_of<V>, element_of<W>> &&
                                     std::is_same_v<domain_of<V>, domain_of<W>>;

}  // namespace detail

/// All-reduce: every rank's `in` combined element-wise with `op`, result in
/// every rank's `out` (out.size() >= in.size(); in == out for in place).
/// Algorithm chosen at compile time (default algo::automatic).
/// Cost: see the algorithm's header. Completes with set_value() or set_error(errc::…).
template <class Algo = algo::automatic, detail::buffer_argument In, detail::buffer_argument Out, class Op = op::sum_t>
  requires(!detail::buffer_like<Op>)
collective_sender all_reduce(communicator& comm, In&& in, Out&& out, Op = {}) {
  auto vin = detail::as_view(std::forward<In>(in));
  auto vout = detail::as_view(std::forward<Out>(out));
  using T = detail::element_of<decltype(vout)>;
  static_assert(detail::same_element<decltype(vin), decltype(vout)>, "all_reduce: input and output differ in type or domain");
  static_assert(is_supported_v<T, Op>, "all_reduce: this op is not defined for this element type");
  auto s = detail::make_spec(comm, collective_kind::all_reduce, vin, vout, vin.size(), vin.size(), vin.size(),
                             detail::in_place_form::same_buffer);
  s.red = &detail::reduction_for<T, Op>;
  s.algorithm = [](detail::collective_context& ctx) -> detail::collective_task {
    auto ec = co_await Algo::all_reduce(ctx);
    if (!ec && ctx.red->finalize) ctx.red->finalize(ctx.output.address, ctx.count, ctx.world_size);
    co_return ec;
  };
  s.algorithm_name = Algo::name;
  if constexpr (requires { Algo::node_small_bytes(); }) s.node_small_bytes = Algo::node_small_bytes();
  // Refused alike on every rank (a misspelt PDCOLL_ALGO), so before it starts.
  if constexpr (requires { Algo::refuses(); })
    if (!s.invalid && Algo::refuses()) s.invalid = make_error_code(errc::invalid_argument);
  return collective_sender(comm, std::move(s));
}

/// In-place all-reduce of `data`.
template <class Algo = algo::automatic, detail::buffer_argument Data, class Op = op::sum_t>
  requires(!detail::buffer_like<Op>)
collective_sender all_reduce(communicator& comm, Data&& data, Op op = {}) {
  auto v = detail::as_view(std::forward<Data>(data));
  return all_reduce<Algo>(comm, v, v, op);
}

/// All-reduce with the op given at run time (e.g. from a command line);
/// completes with errc::unsupported_op when the type does not support it.
template <class Algo = algo::automatic, detail::buffer_argument In, detail::buffer_argument Out>
collective_sender all_reduce(communicator& comm, In&& in, Out&& out, reduction op) {
  auto vin = detail::as_view(std::forward<In>(in));
  auto vout = detail::as_view(std::forward<Out>(out));
  using T = detail::element_of<decltype(vout)>;
  auto unsupported = [&] {
    auto s = detail::make_spec(comm, collective_kind::all_reduce, vin, vout, vin.size(), vin.size(), vin.size(),
                               detail::in_place_form::same_buffer);
    s.invalid = make_error_code(errc::unsupported_op);
    return collective_sender(comm, std::move(s));
  };
  auto with = [&](auto o) -> collective_sender {
    if constexpr (is_supported_v<T, decltype(o)>) {
      return all_reduce<Algo>(comm, vin, vout, o);
    } else {
      return unsupported();
    }
  };
  switch (op) {
    case reduction::sum: return with(op::sum);
    case reduction::prod: return with(op::prod);
    case reduction::min: return with(op::min);
    case reduction::max: return with(op::max);
    case reduction::avg: return with(op::avg);
    default: return unsupported();
  }
}

/// Broadcast: `in` at `root` copied into `out` on every rank (in == out for
/// in place; non-roots may pass their `out` as `in`). Algo: algo::automatic
/// (through node memory where ranks share a host, but for one message on 2
/// ranks from 64 KiB to below 512 KiB where the node's copy probe found one
/// kernel copy faster than two through the slots; otherwise the tree, and
/// the chain from 4 MiB on more than 2 ranks), algo::shared_memory,
/// algo::tree (binomial) or algo::chain (pipelined, for large messages).
template <class Algo = algo::automatic, detail::buffer_argument In, detail::buffer_argument Out>
collective_sender broadcast(communicator& comm, In&& in, Out&& out, int root) {
  auto vin = detail::as_view(std::forward<In>(in));
  auto vout = detail::as_view(std::forward<Out>(out));
  using T = detail::element_of<decltype(vout)>;
  static_assert(detail::same_element<decltype(vin), decltype(vout)>, "broadcast: input and output differ");
  const std::size_t n = vout.size();
  auto s = detail::make_spec(comm, collective_kind::broadcast, vin, vout, n, comm.rank() == root ? n : 0, n,
                             detail::in_place_form::same_buffer);
  if (!s.invalid && !detail::root_ok(comm, root)) s.invalid = make_error_code(errc::root_out_of_range);
  s.root = root;
  s.red = &detail::plain_table_for<T>;
  s.algorithm = &Algo::broadcast;
  s.algorithm_name = Algo::name;
  return collective_sender(comm, std::move(s));
}

/// In-place broadcast of `data` from `root`.
template <class Algo = algo::automatic, detail::buffer_argument Data>
collective_sender broadcast(communicator& comm, Data&& data, int root) {
  auto v = detail::as_view(std::forward<Data>(data));
  return broadcast<Algo>(comm, v, v, root);
}

/// Reduce: every rank's `in` combined with `op` into `out` at `root` (other
/// ranks' `out` is not touched and may be empty). Algo: algo::automatic
/// (through node memory, in rank order, where ranks share a host; the
/// binomial tree otherwise), algo::shared_memory or algo::tree.
template <class Algo = algo::automatic, detail::buffer_argument In, detail::buffer_argument Out, class Op = op::sum_t>
  requires(!detail::buffer_like<Op>)
collective_sender reduce(communicator& comm, In&& in, Out&& out, Op, int root) {
  auto vin = detail::as_view(std::forward<In>(in));
  auto vout = detail::as_view(std::forward<Out>(out));
  using T = detail::element_of<decltype(vout)>;
  static_assert(detail::same_element<decltype(vin), decltype(vout)>, "reduce: input and output differ");
  static_assert(is_supported_v<T, Op>, "reduce: this op is not defined for this element type");
  const std::size_t n = vin.size();
  auto s = detail::make_spec(comm, collective_kind::reduce, vin, vout, n, n, comm.rank() == root ? n : 0,
                             detail::in_place_form::same_buffer);
  if (!s.invalid && !detail::root_ok(comm, root)) s.invalid = make_error_code(errc::root_out_of_range);
  s.root = root;
  s.red = &detail::reduction_for<T, Op>;
  s.algorithm = [](detail::collective_context& ctx) -> detail::collective_task {
    auto ec = co_await Algo::reduce(ctx);
    if (!ec && ctx.rank == ctx.root && ctx.red->finalize) ctx.red->finalize(ctx.output.address, ctx.count, ctx.world_size);
    co_return ec;
  };
  s.algorithm_name = Algo::name;
  return collective_sender(comm, std::move(s));
}

/// In-place reduce: every rank's `data` is its input; at `root` it becomes
/// the result (as ncclReduce with sendbuff == recvbuff). Other ranks'
/// `data` is left as it was.
template <class Algo = algo::automatic, detail::buffer_argument Data, class Op = op::sum_t>
  requires(!detail::buffer_like<Op>)
collective_sender reduce(communicator& comm, Data&& data, Op op, int root) {
  auto v = detail::as_view(std::forward<Data>(data));
  return reduce<Algo>(comm, v, v, op, root);
}

/// All-gather: every rank's `in` (n elements) concatenated in rank order into
/// every rank's `out` (P·n elements). In place, as ncclAllGather: `in` is
/// this rank's block of `out`, `out.subspan(rank * n, n)`; any other overlap
/// is errc::overlapping_buffers. Algo: algo::automatic (where ranks share a
/// host: through node memory, or from 256 KiB peers' node-shareable inputs
/// copied straight into the output; the ring otherwise), algo::node_direct,
/// algo::shared_memory, algo::ring or algo::recursive_doubling (Bruck).
template <class Algo = algo::automatic, detail::buffer_argument In, detail::buffer_argument Out>
collective_sender all_gather(communicator& comm, In&& in, Out&& out) {
  auto vin = detail::as_view(std::forward<In>(in));
  auto vout = detail::as_view(std::forward<Out>(out));
  using T = detail::element_of<decltype(vout)>;
  static_assert(detail::same_element<decltype(vin), decltype(vout)>, "all_gather: input and output differ");
  const std::size_t n = vin.size(), P = static_cast<std::size_t>(comm.world_size());
  auto s = detail::make_spec(comm, collective_kind::all_gather, vin, vout, n, n,
                             detail::bytes_fit(n, P, sizeof(T)) ? n * P : 0, detail::in_place_form::input_in_output);
  s.red = &detail::plain_table_for<T>;
  s.algorithm = &Algo::all_gather;
  s.algorithm_name = Algo::name;
  return collective_sender(comm, std::move(s));
}

/// Reduce-scatter: `in` holds P blocks of n = out.size() elements; rank r
/// receives block r combined over all ranks with `op`. In place, as
/// ncclReduceScatter: `out` is this rank's block of `in`,
/// `in.subspan(rank * n, n)`; any other overlap is errc::overlapping_buffers.
/// Algo: algo::automatic (where ranks share a host: through node memory, or
/// from 256 KiB every rank's node-shareable inputs combined straight into
/// the output; the ring otherwise), algo::node_direct, algo::shared_memory,
/// algo::ring or algo::recursive_halving.
template <class Algo = algo::automatic, detail::buffer_argument In, detail::buffer_argument Out, class Op = op::sum_t>
  requires(!detail::buffer_like<Op>)
collective_sender reduce_scatter(communicator& comm, In&& in, Out&& out, Op = {}) {
  auto vin = detail::as_view(std::forward<In>(in));
  auto vout = detail::as_view(std::forward<Out>(out));
  using T = detail::element_of<decltype(vout)>;
  static_assert(detail::same_element<decltype(vin), decltype(vout)>, "reduce_scatter: input and output differ");
  static_assert(is_supported_v<T, Op>, "reduce_scatter: this op is not defined for this element type");
  const std::size_t n = vout.size(), P = static_cast<std::size_t>(comm.world_size());
  auto s = detail::make_spec(comm, collective_kind::reduce_scatter, vin, vout, n,
                             detail::bytes_fit(n, P, sizeof(T)) ? n * P : 0, n, detail::in_place_form::output_in_input);
  s.red = &detail::reduction_for<T, Op>;
  s.algorithm = [](detail::collective_context& ctx) -> detail::collective_task {
    auto ec = co_await Algo::reduce_scatter(ctx);
    if (!ec && ctx.red->finalize) ctx.red->finalize(ctx.output.address, ctx.count, ctx.world_size);
    co_return ec;
  };
  s.algorithm_name = Algo::name;
  return collective_sender(comm, std::move(s));
}

/// All-to-all: `in` holds P blocks of n elements; block p goes to rank p,
/// which stores it as block r (this rank) of its `out`. Algo:
/// algo::automatic (where ranks share a host, through node memory; where the
/// node's copy probe found one kernel copy faster than two through the
/// slots, only below 64 KiB of whole buffer on 2 ranks and 256 KiB on more,
/// every block posted at once above; pairwise exchange otherwise),
/// algo::shared_memory,
/// algo::direct (every block posted at once) or algo::pairwise (P-1 steps).
template <class Algo = algo::automatic, detail::buffer_argument In, detail::buffer_argument Out>
collective_sender all_to_all(communicator& comm, In&& in, Out&& out) {
  auto vin = detail::as_view(std::forward<In>(in));
  auto vout = detail::as_view(std::forward<Out>(out));
  using T = detail::element_of<decltype(vout)>;
  static_assert(detail::same_element<decltype(vin), decltype(vout)>, "all_to_all: input and output differ");
  const auto P = static_cast<std::size_t>(comm.world_size());
  const std::size_t n = vin.size() / P;
  auto s =
      detail::make_spec(comm, collective_kind::all_to_all, vin, vout, n, n * P, n * P, detail::in_place_form::none);
  if (!s.invalid && vin.size() % P != 0) s.invalid = make_error_code(errc::invalid_argument);
  s.red = &detail::plain_table_for<T>;
  s.algorithm = &Algo::all_to_all;
  s.algorithm_name = Algo::name;
  return collective_sender(comm, std::move(s));
}

/// All-to-all with blocks of varied sizes (MPI_Alltoallv; the split sizes of
/// PyTorch's all_to_all_single, as in mixture-of-experts token dispatch):
/// rank r sends `send_counts[p]` elements of `in` from `send_displs[p]` to
/// rank p, which stores them as `recv_counts[r]` elements of its `out` at
/// `recv_displs[r]`. Counts and displacements are elements, world_size()
/// of each (invalid_argument otherwise, or when send_counts[rank] differs
/// from recv_counts[rank]). Every non-empty block must lie in its buffer
/// (buffer_too_small; an empty block's displacement may be anything);
/// receive blocks must not overlap each other, and the input's extent (up
/// to its last block's end) must not overlap the output's
/// (overlapping_buffers): there is no in-place form. Arguments are checked
/// on each rank alone: a rank whose call is refused sends nothing, and its
/// peers wait for it until their deadline. A send count that differs from
/// its receiver's receive count fails the receiving rank with
/// errc::collective_mismatch and aborts the communicator (every block's
/// length reaches its receiver, empty blocks included, and the receiver
/// checks it); ranks that finish before the abort reaches them fail their
/// next collective. Algo, the same on every rank: algo::automatic (where
/// ranks share a host and the buffers are reached directly, one
/// node-memory step carries the lengths and the blocks that fit a slot's
/// section, or only those below the all-to-all's slot threshold where the
/// node's copy probe favours messages; larger blocks one message each; pairwise
/// otherwise), algo::shared_memory (the same step, every block that fits a
/// slot's section through it), algo::direct (every block a message, all
/// posted at once) or algo::pairwise (P-1 steps of one exchange). Device
/// memory the transport cannot reach is staged per pair in pipelined
/// chunks of staging_chunk_bytes() / P (detail/staging.hpp).
template <class Algo = algo::automatic, detail::buffer_argument In, detail::buffer_argument Out>
collective_sender all_to_allv(communicator& comm, In&& in, std::span<const std::size_t> send_counts,
                              std::span<const std::size_t> send_displs, Out&& out,
                              std::span<const std::size_t> recv_counts, std::span<const std::size_t> recv_displs) {
  auto vin = detail::as_view(std::forward<In>(in));
  auto vout = detail::as_view(std::forward<Out>(out));
  using T = detail::element_of<decltype(vout)>;
  static_assert(detail::same_element<decltype(vin), decltype(vout)>, "all_to_allv: input and output differ");
  auto s = detail::make_variable_spec(comm, collective_kind::all_to_allv, vin, vout, send_counts, send_displs,
                                      recv_counts, recv_displs, false);
  return detail::variable_sender<T, Algo>(comm, std::move(s), &Algo::all_to_allv);
}

/// all_to_allv with the blocks packed back to back in rank order: the
/// displacements are the running sums of the counts (as all_to_all_single).
template <class Algo = algo::automatic, detail::buffer_argument In, detail::buffer_argument Out>
collective_sender all_to_allv(communicator& comm, In&& in, std::span<const std::size_t> send_counts, Out&& out,
                              std::span<const std::size_t> recv_counts) {
  const auto send_displs = detail::packed_displacements(send_counts);
  const auto recv_displs = detail::packed_displacements(recv_counts);
  return all_to_allv<Algo>(comm, std::forward<In>(in), send_counts, send_displs, std::forward<Out>(out), recv_counts,
                           recv_displs);
}

/// All-gather with blocks of varied sizes (MPI_Allgatherv; uneven shards):
/// rank p's first `recv_counts[p]` elements of `in` land in every rank's
/// `out` at `recv_displs[p]`. Every rank passes the same `recv_counts` and
/// `recv_displs` (world_size() entries each; a count on which ranks
/// disagree fails a rank that receives that block with
/// errc::collective_mismatch and aborts the communicator, as all_to_allv).
/// Non-empty receive blocks must lie in `out` (buffer_too_small) and not
/// overlap each other (overlapping_buffers). In place, as MPI_IN_PLACE:
/// `in` is this rank's block of `out`, `out.subspan(recv_displs[rank],
/// recv_counts[rank])`; any other overlap is errc::overlapping_buffers.
/// Algo and staging as all_to_allv (through node memory, a rank's block is
/// in its slot once for every peer to read).
template <class Algo = algo::automatic, detail::buffer_argument In, detail::buffer_argument Out>
collective_sender all_gatherv(communicator& comm, In&& in, Out&& out, std::span<const std::size_t> recv_counts,
                              std::span<const std::size_t> recv_displs) {
  auto vin = detail::as_view(std::forward<In>(in));
  auto vout = detail::as_view(std::forward<Out>(out));
  using T = detail::element_of<decltype(vout)>;
  static_assert(detail::same_element<decltype(vin), decltype(vout)>, "all_gatherv: input and output differ");
  const auto P = static_cast<std::size_t>(comm.world_size()), me = static_cast<std::size_t>(comm.rank());
  // Every send block is this rank's input: P copies of its count, at 0.
  const std::size_t mine = recv_counts.size() == P ? recv_counts[me] : 0;
  const std::vector<std::size_t> send_counts(P, mine), send_displs(P, 0);
  auto s = detail::make_variable_spec(comm, collective_kind::all_gatherv, vin, vout, send_counts, send_displs,
                                      recv_counts, recv_displs, true);
  return detail::variable_sender<T, Algo>(comm, std::move(s), &Algo::all_gatherv);
}

/// all_gatherv with the blocks packed back to back in rank order.
template <class Algo = algo::automatic, detail::buffer_argument In, detail::buffer_argument Out>
collective_sender all_gatherv(communicator& comm, In&& in, Out&& out, std::span<const std::size_t> recv_counts) {
  const auto recv_displs = detail::packed_displacements(recv_counts);
  return all_gatherv<Algo>(comm, std::forward<In>(in), std::forward<Out>(out), recv_counts, recv_displs);
}

/// Barrier: completes on a rank once every rank has started it. Dissemination.
template <class Algo = algo::dissemination>
collective_sender barrier(communicator& comm) {
  detail::collective_spec s;
  s.kind = collective_kind::barrier;
  s.red = &detail::plain_table_for<std::uint8_t>;
  s.algorithm = &Algo::barrier;
  s.algorithm_name = Algo::name;
  return collective_sender(comm, std::move(s));
}

}  // namespace pdcoll
