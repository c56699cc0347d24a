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

#include <limits>
#include <ranges>
#include <span>
#include <type_traits>

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

/// A buffer argument: a pdcoll::view or a contiguous range of a pdcoll element type.
template <class B>
concept buffer_argument = requires { typename view_of<std::remove_cvref_t<B>>::type; } ||
                          (std::ranges::contiguous_range<B> && std::ranges::sized_range<B>);

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

// Whether in and out overlap other than as `form` allows, for blocks of `block_bytes` on rank `rank`.
inline bool overlaps_wrongly(const user_buffer& in, const user_buffer& out, in_place_form form, int rank,
                             std::size_t block_bytes) noexcept {
  if (!overlap(in, out)) return false;
  const auto i0 = reinterpret_cast<std::uintptr_t>(in.region.address);
  const auto o0 = reinterpret_cast<std::uintptr_t>(out.region.address);
  const std::size_t at = static_cast<std::size_t>(rank) * block_bytes;
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
  if (!s.invalid && overlaps_wrongly(s.input, s.output, in_place, comm.rank(), count * sizeof(T)))
    s.invalid = make_error_code(errc::overlapping_buffers);
  return s;
}

inline bool root_ok(const communicator& comm, int root) noexcept { return root >= 0 && root < comm.world_size(); }

template <class V, class W>
inline constexpr bool same_element = std::is_same_v<element_of<V>, element_of<W>> &&
                                     std::is_same_v<domain_of<V>, domain_of<W>>;

}  // namespace detail

/// All-reduce: every rank's `in` combined element-wise with `op`, result in
/// every rank's `out` (out.size() >= in.size(); in == out for in place).
/// Algorithm chosen at compile time (default algo::automatic).
/// Cost: see the algorithm's header. Completes with set_value() or set_error(errc::…).
template <class Algo = algo::automatic, detail::buffer_argument In, detail::buffer_argument Out, class Op = op::sum_t>
  requires(!detail::buffer_argument<Op>)
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
  return collective_sender(comm, std::move(s));
}

/// In-place all-reduce of `data`.
template <class Algo = algo::automatic, detail::buffer_argument Data, class Op = op::sum_t>
  requires(!detail::buffer_argument<Op>)
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
/// ranks from 64 KiB to below 512 KiB; otherwise the tree, and
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
  requires(!detail::buffer_argument<Op>)
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
  requires(!detail::buffer_argument<Op>)
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
/// algo::automatic (where ranks share a host, through node memory below
/// 64 KiB of whole buffer on 2 ranks and 256 KiB on more, every block posted
/// at once above; pairwise exchange otherwise), algo::shared_memory,
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
