// hybrid_parallel: tensor and data parallelism with groups (job::split).
//
//     tools/pdcoll-run -n 4 build/default/examples/hybrid_parallel [tp]
//
// The ranks form a grid of `dp` replicas by `tp` shards (tp = argv[1];
// default 2 when it divides the world, else 1). Every replica runs a
// linear layer y = W x split by columns, as Megatron's row-parallel layer
// is: shard t holds columns [t*k/tp, (t+1)*k/tp) of W and the same slice of
// the replica's input x, computes the partial product, and an all-reduce
// over its tensor-parallel group sums the partials into y. With the loss
// |y|^2 / 2 the gradient of the shard is y x_shard^T, and an averaging
// all-reduce over the data-parallel group (the shards with the same t in
// every replica) gives the gradient of the mean loss. Each rank checks y
// and its averaged gradient against a plain single-process computation of
// every replica, and prints PASS or FAIL.
#include <pdcoll/pdcoll.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <vector>

namespace {

constexpr int rows = 64;    // m: outputs
constexpr int cols = 240;   // k: inputs (divisible by 1-6 and 8)

double weight(int i, int j) { return std::sin(0.37 * i + 0.11 * j) * 0.1; }
double input(int replica, int j) { return std::cos(0.23 * j + 1.7 * replica); }

}  // namespace

int main(int argc, char** argv) {
  pdcoll::job job = pdcoll::job::from_environment();
  const int world = job.world_size();
  int tp = argc > 1 ? std::atoi(argv[1]) : (world % 2 == 0 ? 2 : 1);
  if (tp < 1 || world % tp != 0 || cols % tp != 0) {
    std::fprintf(stderr, "tp=%d must divide the world (%d) and %d\n", tp, world, cols);
    return 2;
  }
  const int dp = world / tp;
  const int shard = job.rank() % tp, replica = job.rank() / tp;

  // Neighbours form a replica's tensor-parallel group; equal shards across
  // replicas form a data-parallel group.
  std::optional<pdcoll::group> tensor = job.split(replica);
  std::optional<pdcoll::group> data = job.split(shard);

  const int width = cols / tp, first = shard * width;
  std::vector<float> y(rows, 0.0f);
  for (int i = 0; i < rows; ++i)
    for (int j = first; j < first + width; ++j)
      y[i] += static_cast<float>(weight(i, j) * input(replica, j));
  pdcoll::exec::sync_wait(pdcoll::all_reduce(tensor->comm(), y, pdcoll::op::sum));

  std::vector<float> grad(static_cast<std::size_t>(rows) * width);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < width; ++j)
      grad[static_cast<std::size_t>(i) * width + j] = y[i] * static_cast<float>(input(replica, first + j));
  pdcoll::exec::sync_wait(pdcoll::all_reduce(data->comm(), grad, pdcoll::op::avg) |
                          pdcoll::exec::with_deadline(std::chrono::seconds(30)));

  // The reference: every replica's y in double, then the mean gradient.
  // Tolerances: y sums `cols` products in float (tp partial sums, then the
  // group's sum), so its error is at most about cols * u * sum|w x|; the
  // gradient adds x's rounding, one product and a dp-term average (a sum
  // and a scaling) on top.
  const double u = 0x1p-24;
  double worst_y = 0, worst_grad = 0;
  std::vector<double> ref_y(static_cast<std::size_t>(rows) * dp), bound_y(ref_y.size());
  for (int d = 0; d < dp; ++d)
    for (int i = 0; i < rows; ++i) {
      double sum = 0, magnitude = 0;
      for (int j = 0; j < cols; ++j) {
        sum += weight(i, j) * input(d, j);
        magnitude += std::fabs(weight(i, j) * input(d, j));
      }
      ref_y[static_cast<std::size_t>(d) * rows + i] = sum;
      bound_y[static_cast<std::size_t>(d) * rows + i] = (cols + 1) * u * magnitude;
    }
  for (int i = 0; i < rows; ++i) {
    const double err = std::fabs(y[i] - ref_y[static_cast<std::size_t>(replica) * rows + i]);
    worst_y = std::max(worst_y, err / bound_y[static_cast<std::size_t>(replica) * rows + i]);
    for (int j = 0; j < width; ++j) {
      double mean = 0, bound = 0;
      for (int d = 0; d < dp; ++d) {
        const double yd = ref_y[static_cast<std::size_t>(d) * rows + i], xd = input(d, first + j);
        mean += yd * xd / dp;
        bound += (bound_y[static_cast<std::size_t>(d) * rows + i] + (dp + 3) * u * std::fabs(yd)) * std::fabs(xd) / dp;
      }
      worst_grad = std::max(worst_grad, std::fabs(grad[static_cast<std::size_t>(i) * width + j] - mean) / bound);
    }
  }
  const bool pass = worst_y <= 1 && worst_grad <= 1;
  std::printf("rank %d: replica %d of %d (tensor group rank %d of %d), shard %d (data group rank %d of %d): "
              "y error %.2g and gradient error %.2g of their bounds: %s\n",
              job.rank(), replica, dp, tensor->rank(), tensor->world_size(), shard, data->rank(),
              data->world_size(), worst_y, worst_grad, pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}
