// moe_dispatch: a mixture-of-experts layer's token dispatch and combine
// with all_to_allv (expert parallelism).
//
//     tools/pdcoll-run -n 4 build/default/examples/moe_dispatch [tokens] [hidden]
//
// Every rank holds `tokens` tokens of `hidden` floats and hosts one expert
// (rank e hosts expert e). A top-1 router sends each token to the expert
// with the highest score, so how many tokens go where differs from rank to
// rank, and some ranks send an expert none:
//   1. an all_to_all of the per-expert token counts tells every rank how
//      many tokens each peer will send it (the split sizes);
//   2. all_to_allv dispatches the tokens, sorted by expert;
//   3. each expert runs its feed-forward layer, relu(W_e x), on what it got;
//   4. all_to_allv returns the outputs (send and receive counts swapped);
//   5. each rank puts its tokens' outputs back in token order, scaled by the
//      router's gate.
// Each rank then computes its own tokens locally with every expert's weights
// through the same function, so the outputs must match bit for bit, and
// prints PASS or FAIL.
#include <pdcoll/pdcoll.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

float token_value(int rank, int token, int i) { return static_cast<float>(std::sin(0.7 * rank + 0.13 * token + 0.31 * i)); }
float expert_weight(int expert, int row, int col) { return static_cast<float>(std::cos(0.5 * expert + 0.17 * row - 0.07 * col) / 4); }

// The router's score of `expert` for a token: on more than one rank, expert
// 0 is never the best for odd ranks' tokens, so some pairs of ranks
// exchange no tokens.
float router_score(int rank, int token, int expert) {
  const double s = std::sin(1.3 * token + 2.1 * expert + 0.9 * rank);
  return static_cast<float>(expert == 0 && rank % 2 == 1 ? s - 3 : s);
}

// relu(W_e x) for one token; one out-of-line function for the dispatched
// and the local computation, so both run the same instructions.
[[gnu::noinline]] void expert_forward(int expert, const float* x, float* y, int hidden) {
  for (int r = 0; r < hidden; ++r) {
    float acc = 0;
    for (int c = 0; c < hidden; ++c) acc += expert_weight(expert, r, c) * x[c];
    y[r] = acc > 0 ? acc : 0;
  }
}

}  // namespace

int main(int argc, char** argv) {
  pdcoll::job job = pdcoll::job::from_environment();
  auto& comm = job.comm();
  const int P = comm.world_size(), me = comm.rank();
  const int tokens = argc > 1 ? std::atoi(argv[1]) : 37;
  const int hidden = argc > 2 ? std::atoi(argv[2]) : 16;
  if (tokens < 0 || hidden < 1) {
    std::fprintf(stderr, "usage: moe_dispatch [tokens >= 0] [hidden >= 1]\n");
    return 2;
  }
  const auto H = static_cast<std::size_t>(hidden), Pz = static_cast<std::size_t>(P);
  const auto deadline = pdcoll::exec::with_deadline(std::chrono::seconds(30));

  // Route: each token's expert and gate (the softmax of its best score over all).
  std::vector<int> expert_of(static_cast<std::size_t>(tokens));
  std::vector<float> gate(static_cast<std::size_t>(tokens));
  std::vector<std::size_t> tokens_to(Pz, 0);
  for (int t = 0; t < tokens; ++t) {
    int best = 0;
    float total = 0;
    for (int e = 0; e < P; ++e) {
      if (router_score(me, t, e) > router_score(me, t, best)) best = e;
      total += std::exp(router_score(me, t, e));
    }
    expert_of[static_cast<std::size_t>(t)] = best;
    gate[static_cast<std::size_t>(t)] = std::exp(router_score(me, t, best)) / total;
    ++tokens_to[static_cast<std::size_t>(best)];
  }

  // 1. Split sizes: tokens_from[p] is how many tokens rank p sends this rank.
  std::vector<std::size_t> tokens_from(Pz);
  pdcoll::exec::sync_wait(pdcoll::all_to_all(comm, tokens_to, tokens_from) | deadline);

  // 2. Dispatch: tokens packed by expert, `hidden` floats each.
  std::vector<std::size_t> send_counts(Pz), recv_counts(Pz), first_of(Pz + 1, 0);
  for (std::size_t p = 0; p < Pz; ++p) {
    send_counts[p] = tokens_to[p] * H;
    recv_counts[p] = tokens_from[p] * H;
    first_of[p + 1] = first_of[p] + tokens_to[p];
  }
  std::vector<float> outgoing(static_cast<std::size_t>(tokens) * H);
  std::vector<int> slot_of(static_cast<std::size_t>(tokens));  // where token t sits in `outgoing`
  {
    std::vector<std::size_t> next(first_of.begin(), first_of.end() - 1);
    for (int t = 0; t < tokens; ++t) {
      const std::size_t slot = next[static_cast<std::size_t>(expert_of[static_cast<std::size_t>(t)])]++;
      slot_of[static_cast<std::size_t>(t)] = static_cast<int>(slot);
      for (int i = 0; i < hidden; ++i) outgoing[slot * H + static_cast<std::size_t>(i)] = token_value(me, t, i);
    }
  }
  std::size_t received_tokens = 0;
  for (std::size_t n : tokens_from) received_tokens += n;
  std::vector<float> arrived(received_tokens * H), results(received_tokens * H);
  pdcoll::exec::sync_wait(pdcoll::all_to_allv(comm, outgoing, send_counts, arrived, recv_counts) | deadline);

  // 3. This rank's expert on every token it received.
  for (std::size_t k = 0; k < received_tokens; ++k) expert_forward(me, &arrived[k * H], &results[k * H], hidden);

  // 4. Combine: the outputs go back the way the tokens came.
  std::vector<float> returned(outgoing.size());
  pdcoll::exec::sync_wait(pdcoll::all_to_allv(comm, results, recv_counts, returned, send_counts) | deadline);

  // 5. Token order, scaled by the gate; then the local reference.
  std::size_t wrong = 0;
  std::vector<float> x(H), y(H);
  for (int t = 0; t < tokens; ++t) {
    const auto ts = static_cast<std::size_t>(t);
    for (int i = 0; i < hidden; ++i) x[static_cast<std::size_t>(i)] = token_value(me, t, i);
    expert_forward(expert_of[ts], x.data(), y.data(), hidden);
    const std::size_t slot = static_cast<std::size_t>(slot_of[ts]);
    for (std::size_t i = 0; i < H; ++i) wrong += gate[ts] * returned[slot * H + i] != gate[ts] * y[i];
  }
  std::printf("rank %d: sent", me);
  for (std::size_t p = 0; p < Pz; ++p) std::printf(" %zu", tokens_to[p]);
  std::printf(" tokens to experts 0..%d, received %zu; %zu wrong outputs: %s\n", P - 1, received_tokens, wrong,
              wrong == 0 ? "PASS" : "FAIL");
  return wrong == 0 ? 0 : 1;
}
