// data_parallel_training — how a custom training runtime uses pdcoll:
// data-parallel SGD of a two-layer MLP on synthetic data over N ranks, with
// gradient buckets whose all-reduces start during the backward pass.
//
//     tools/pdcoll-run -n 4 build/default/examples/data_parallel_training [steps] [batch] [bucket_floats]
//
// The shape of a real runtime's step (PyTorch DDP, Horovod, a custom one):
//  1. forward on this rank's shard of the global batch;
//  2. backward, layer by layer from the output. The gradients live in one
//     flat buffer ordered by when backward produces them; the buffer is cut
//     into buckets, and each bucket's all-reduce (a sender) is started the
//     moment its last gradient is written, while backward goes on with the
//     rest (the communicator's progress thread moves the bytes meanwhile);
//  3. wait for every bucket (the join before the optimizer step);
//  4. optimizer step (plain SGD) with the summed gradients scaled by 1/batch.
// Summing and then scaling by 1/global_batch (instead of op::avg, which
// divides by the number of ranks) keeps the result exact when the batch does
// not split evenly over the ranks.
//
// At the end every rank trains the same model on the whole batch in one
// process and checks that its distributed weights and final loss agree
// within a tolerance derived from float rounding (see training_tolerance).
// Prints PASS or FAIL; exits 1 on FAIL.
#include <pdcoll/pdcoll.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace {

// --- the model ------------------------------------------------------------

/// Sizes of the two-layer MLP y = W2 · tanh(W1 · x + b1) + b2.
struct mlp_shape {
  int inputs = 16, hidden = 32, outputs = 4;

  // Offsets into the flat parameter (and gradient) buffer, in the order the
  // backward pass finishes them: layer 2 first, then b1, then W1 row by row.
  std::size_t w2() const { return 0; }
  std::size_t b2() const { return w2() + std::size_t(outputs) * hidden; }
  std::size_t b1() const { return b2() + outputs; }
  std::size_t w1() const { return b1() + hidden; }
  std::size_t size() const { return w1() + std::size_t(hidden) * inputs; }
};

/// Synthetic regression data: inputs uniform in [-1, 1], targets from a fixed
/// random "teacher" MLP plus a little noise. Same seed on every rank, so every
/// rank holds the same data set (and shards it by index).
struct data_set {
  int samples = 0;
  std::vector<float> x, y;  // samples × inputs, samples × outputs
};

data_set make_data(const mlp_shape& s, int samples) {
  std::mt19937 gen(2024);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  std::normal_distribution<float> noise(0.0f, 0.01f);
  std::vector<float> teacher(s.size());
  for (auto& w : teacher) w = uni(gen);
  data_set d{samples, std::vector<float>(std::size_t(samples) * s.inputs), std::vector<float>(std::size_t(samples) * s.outputs)};
  for (auto& v : d.x) v = uni(gen);
  std::vector<float> h(s.hidden);
  for (int i = 0; i < samples; ++i) {
    const float* xi = &d.x[std::size_t(i) * s.inputs];
    for (int j = 0; j < s.hidden; ++j) {
      float a = teacher[s.b1() + j];
      for (int k = 0; k < s.inputs; ++k) a += teacher[s.w1() + std::size_t(j) * s.inputs + k] * xi[k];
      h[j] = std::tanh(a);
    }
    for (int o = 0; o < s.outputs; ++o) {
      float a = teacher[s.b2() + o];
      for (int j = 0; j < s.hidden; ++j) a += teacher[s.w2() + std::size_t(o) * s.hidden + j] * h[j];
      d.y[std::size_t(i) * s.outputs + o] = a + noise(gen);
    }
  }
  return d;
}

std::vector<float> initial_parameters(const mlp_shape& s) {
  std::mt19937 gen(7);
  std::normal_distribution<float> n(0.0f, 0.3f);
  std::vector<float> p(s.size());
  for (auto& w : p) w = n(gen);
  return p;
}

/// Forward and backward over samples [first, last) of `d`: adds the sum of the
/// per-sample gradients of 0.5·|y − target|² to `grad` (and, if `abs_grad` is
/// given, the sum of their absolute values, for the tolerance). Calls
/// `ready(n)` whenever grad[0, n) is final, in increasing n: the hook where a
/// runtime starts all-reduces. Returns the summed loss of the samples.
double forward_backward(const mlp_shape& s, std::span<const float> p, const data_set& d, int first, int last,
                        std::span<float> grad, std::span<float> abs_grad,
                        const std::function<void(std::size_t)>& ready) {
  const int n = last - first;
  std::vector<float> h(std::size_t(n) * s.hidden), dy(std::size_t(n) * s.outputs), dh(std::size_t(n) * s.hidden);
  double loss = 0;
  // Forward: hidden activations and output errors, kept for backward.
  for (int i = 0; i < n; ++i) {
    const float* xi = &d.x[std::size_t(first + i) * s.inputs];
    for (int j = 0; j < s.hidden; ++j) {
      float a = p[s.b1() + j];
      for (int k = 0; k < s.inputs; ++k) a += p[s.w1() + std::size_t(j) * s.inputs + k] * xi[k];
      h[std::size_t(i) * s.hidden + j] = std::tanh(a);
    }
    for (int o = 0; o < s.outputs; ++o) {
      float a = p[s.b2() + o];
      for (int j = 0; j < s.hidden; ++j) a += p[s.w2() + std::size_t(o) * s.hidden + j] * h[std::size_t(i) * s.hidden + j];
      const float e = a - d.y[std::size_t(first + i) * s.outputs + o];
      dy[std::size_t(i) * s.outputs + o] = e;
      loss += 0.5 * double(e) * double(e);
    }
  }
  auto add = [&](std::size_t at, float g) {
    grad[at] += g;
    if (!abs_grad.empty()) abs_grad[at] += std::fabs(g);
  };
  // Backward, layer 2: dW2 = Σ dy·hᵀ, db2 = Σ dy. Then this layer's bucket(s) can go.
  for (int i = 0; i < n; ++i)
    for (int o = 0; o < s.outputs; ++o) {
      const float e = dy[std::size_t(i) * s.outputs + o];
      for (int j = 0; j < s.hidden; ++j) add(s.w2() + std::size_t(o) * s.hidden + j, e * h[std::size_t(i) * s.hidden + j]);
      add(s.b2() + o, e);
    }
  ready(s.b1());
  // Backward through tanh: dh = (W2ᵀ dy) ⊙ (1 − h²); db1 = Σ dh.
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < s.hidden; ++j) {
      float a = 0;
      for (int o = 0; o < s.outputs; ++o) a += p[s.w2() + std::size_t(o) * s.hidden + j] * dy[std::size_t(i) * s.outputs + o];
      const float hj = h[std::size_t(i) * s.hidden + j];
      dh[std::size_t(i) * s.hidden + j] = a * (1.0f - hj * hj);
      add(s.b1() + j, dh[std::size_t(i) * s.hidden + j]);
    }
  ready(s.w1());
  // Layer 1, one row of W1 (one hidden unit) at a time: dW1[j] = Σ dh[j]·x.
  for (int j = 0; j < s.hidden; ++j) {
    for (int i = 0; i < n; ++i) {
      const float g = dh[std::size_t(i) * s.hidden + j];
      const float* xi = &d.x[std::size_t(first + i) * s.inputs];
      for (int k = 0; k < s.inputs; ++k) add(s.w1() + std::size_t(j) * s.inputs + k, g * xi[k]);
    }
    ready(s.w1() + std::size_t(j + 1) * s.inputs);
  }
  return loss;
}

/// Mean loss of `p` over the whole data set (the same code and order for both
/// weight sets that are compared).
double full_loss(const mlp_shape& s, std::span<const float> p, const data_set& d) {
  std::vector<float> scratch(s.size());
  return forward_backward(s, p, d, 0, d.samples, scratch, {}, [](std::size_t) {}) / d.samples;
}

// --- gradient buckets in flight ---------------------------------------------

/// The buckets of one step: started one by one as backward finishes them,
/// joined before the optimizer step. Each bucket's all-reduce is a detached
/// sender whose completion (value, error or stop) is counted here. Every
/// all-reduce carries the communicator's deadline, so a lost peer surfaces
/// as an error at the join, not a hang.
class bucket_flight {
 public:
  bucket_flight(pdcoll::communicator& comm, std::span<float> grads, std::size_t bucket_floats)
      : comm_(comm), grads_(grads), bucket_floats_(bucket_floats) {}

  /// grads[0, n) is final: start the all-reduce of every bucket that now is.
  void ready(std::size_t n) {
    while (started_end_ < grads_.size()) {
      const std::size_t end = std::min(grads_.size(), started_end_ + bucket_floats_);
      if (end > n) break;
      start(grads_.subspan(started_end_, end - started_end_));
      started_end_ = end;
    }
  }

  /// Waits for every started bucket (the join before the optimizer step);
  /// throws std::system_error with the first bucket's error. Each bucket's
  /// all-reduce ends by the communicator's deadline (with an error if a peer
  /// is lost or late), so this wait is bounded without one of its own; and
  /// it never returns while a bucket is still reducing into the gradients.
  void join() {
    std::unique_lock lock(mutex_);
    while (pending_ > 0) {
      // With a progress thread this only sleeps; without one it drives progress here.
      lock.unlock();
      const bool worked = pdcoll::exec::drive_progress_once(std::chrono::steady_clock::now() + std::chrono::milliseconds(1));
      lock.lock();
      if (!worked && pending_ > 0) done_.wait_for(lock, std::chrono::milliseconds(1));
    }
    if (error_) throw std::system_error(error_, "gradient all-reduce");
    started_end_ = 0;
  }

  /// Number of all-reduces started so far (over all steps).
  int buckets_started() const { return started_; }

 private:
  void start(std::span<float> bucket) {
    {
      std::lock_guard lock(mutex_);
      ++pending_;
    }
    ++started_;
    pdcoll::exec::start_detached(pdcoll::all_reduce(comm_, bucket, pdcoll::op::sum) |
                                 pdcoll::exec::then([this]() noexcept { finish({}); }) |
                                 pdcoll::exec::upon_error([this](std::error_code e) noexcept { finish(e); }) |
                                 pdcoll::exec::upon_stopped([this]() noexcept {
                                   finish(make_error_code(pdcoll::errc::aborted));
                                 }));
  }
  void finish(std::error_code e) noexcept {
    std::lock_guard lock(mutex_);
    if (e && !error_) error_ = e;
    --pending_;
    done_.notify_all();
  }

  pdcoll::communicator& comm_;
  std::span<float> grads_;
  std::size_t bucket_floats_;
  std::size_t started_end_ = 0;
  int started_ = 0;
  std::mutex mutex_;
  std::condition_variable done_;
  int pending_ = 0;
  std::error_code error_;
};

// --- training ----------------------------------------------------------------

struct run_config {
  int steps = 30, global_batch = 64, samples = 256;
  std::size_t bucket_floats = 128;
  float learning_rate = 0.05f;
};

/// The samples of step `t`'s global batch that `rank` of `world` trains on.
std::pair<int, int> shard(const run_config& c, int t, int rank, int world) {
  const int base = (t * c.global_batch) % c.samples;
  return {base + c.global_batch * rank / world, base + c.global_batch * (rank + 1) / world};
}

void sgd_step(std::span<float> p, std::span<const float> grad_sum, const run_config& c) {
  const float scale = c.learning_rate / float(c.global_batch);
  for (std::size_t i = 0; i < p.size(); ++i) p[i] -= scale * grad_sum[i];
}

/// The tolerance of the comparison, per parameter, accumulated over the run.
///
/// Both trainings compute each gradient element as a float sum of the same B
/// per-sample terms (B = global batch), in different orders: the reference in
/// sample order, the distributed run as per-rank partial sums combined by the
/// all-reduce's tree or ring. Any order of summing n floats is within
/// γ(n−1)·Σ|terms| of the exact sum, γ(k) = k·u/(1 − k·u), u = 2⁻²⁴ (Higham,
/// Accuracy and Stability of Numerical Algorithms, §4.2), so the two sums
/// differ by at most 2·γ(B−1)·Σ|terms|, and the step moves the parameter by
/// lr/B times that. Summed over the steps this is the first-order bound δ.
/// Earlier differences also feed back through later gradients; with this
/// small learning rate that feedback is a factor (1 + lr·λ)^steps close to
/// 1, covered by a margin of 4. (The worst-case bound itself assumes every
/// rounding goes the same way; the observed difference is usually 10–100×
/// below it, which the program prints.)
struct training_tolerance {
  std::vector<double> per_parameter;
  static constexpr double margin = 4.0;

  /// One step: `abs_grad_sum` = Σ|per-sample gradient|, `grad_sum` and
  /// `params` (before the update) from the reference run.
  void add_step(std::span<const float> abs_grad_sum, std::span<const float> grad_sum, std::span<const float> params,
                const run_config& c) {
    const double u = std::ldexp(1.0, -24), k = c.global_batch - 1;
    const double gamma = k * u / (1.0 - k * u), scale = double(c.learning_rate) / c.global_batch;
    if (per_parameter.empty()) per_parameter.assign(abs_grad_sum.size(), 0.0);
    for (std::size_t i = 0; i < abs_grad_sum.size(); ++i)
      // The sums' difference, plus the update p − scale·g rounding (two
      // roundings, each ≤ u relative) differently on each side.
      per_parameter[i] += scale * 2.0 * gamma * abs_grad_sum[i] +
                          2.0 * u * (std::fabs(params[i]) + 2.0 * scale * std::fabs(grad_sum[i]));
  }
  double bound(std::size_t i) const { return margin * per_parameter[i]; }
};

int run(int argc, char** argv) {
  run_config c;
  if (argc > 1) c.steps = std::atoi(argv[1]);
  if (argc > 2) c.global_batch = std::atoi(argv[2]);
  if (argc > 3) c.bucket_floats = std::size_t(std::atoll(argv[3]));
  c.samples = 4 * c.global_batch;

  // The communicator's progress thread moves bucket bytes while this thread
  // computes the rest of backward.
  pdcoll::job_options options;
  options.communicator.progress_thread = true;
  pdcoll::job job = pdcoll::job::from_environment(options);
  auto& comm = job.comm();
  const int rank = comm.rank(), world = comm.world_size();
  if (c.steps < 1 || c.global_batch < world || c.bucket_floats < 1) {
    if (rank == 0) std::fprintf(stderr, "usage: data_parallel_training [steps>=1] [batch>=ranks] [bucket_floats>=1]\n");
    return 2;
  }

  const mlp_shape s;
  const data_set data = make_data(s, c.samples);
  std::vector<float> params = initial_parameters(s);
  // Gradients in shareable host memory: over shm, buckets of 256 KiB and up
  // would be reduced in place, without copies through node memory (this
  // small model's never are; the allocation shows the pattern).
  auto grads_memory = pdcoll::memory::host::allocate_shareable<float>(s.size());
  const std::span<float> grads = grads_memory.span();
  bucket_flight flight(comm, grads, c.bucket_floats);
  const double initial_loss = full_loss(s, params, data);

  // Distributed training.
  const auto t0 = std::chrono::steady_clock::now();
  for (int t = 0; t < c.steps; ++t) {
    std::fill(grads.begin(), grads.end(), 0.0f);
    const auto [first, last] = shard(c, t, rank, world);
    forward_backward(s, params, data, first, last, grads, {}, [&](std::size_t n) { flight.ready(n); });
    flight.ready(grads.size());  // the tail bucket, if backward's last call did not complete it
    flight.join();
    sgd_step(params, grads, c);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double final_loss = full_loss(s, params, data);

  // Single-process reference on the full global batch, same steps.
  std::vector<float> ref = initial_parameters(s), ref_grads(s.size()), abs_grads(s.size());
  training_tolerance tol;
  for (int t = 0; t < c.steps; ++t) {
    std::fill(ref_grads.begin(), ref_grads.end(), 0.0f);
    std::fill(abs_grads.begin(), abs_grads.end(), 0.0f);
    const auto [first, last] = shard(c, t, 0, 1);
    forward_backward(s, ref, data, first, last, ref_grads, abs_grads, [](std::size_t) {});
    tol.add_step(abs_grads, ref_grads, ref, c);
    sgd_step(ref, ref_grads, c);
  }
  const double ref_loss = full_loss(s, ref, data);

  // Compare. The loss tolerance follows from the weights': |ΔL| ≤ Σ|∂L/∂w|·δw
  // (gradient of the mean loss at the reference weights), plus the loss sum's
  // own rounding (relative 1e-6 covers a double sum of float terms).
  std::vector<float> loss_grad(s.size());
  forward_backward(s, ref, data, 0, data.samples, loss_grad, {}, [](std::size_t) {});
  double worst_ratio = 0, max_diff = 0, loss_tolerance = 1e-6 * std::fabs(ref_loss);
  std::size_t worst = 0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const double diff = std::fabs(double(params[i]) - double(ref[i]));
    const double bound = std::max(tol.bound(i), double(std::numeric_limits<float>::min()));
    max_diff = std::max(max_diff, diff);
    if (diff / bound > worst_ratio) worst_ratio = diff / bound, worst = i;
    loss_tolerance += std::fabs(double(loss_grad[i])) / data.samples * tol.bound(i);
  }
  const double loss_diff = std::fabs(final_loss - ref_loss);
  const bool pass = worst_ratio <= 1.0 && loss_diff <= loss_tolerance && final_loss < initial_loss;

  std::printf("rank %d/%d over %s: %d steps, batch %d, %zu parameters in buckets of %zu floats (%d all-reduces, "
              "%.1f ms/step)\n",
              rank, world, comm.transport_name().c_str(), c.steps, c.global_batch, params.size(), c.bucket_floats,
              flight.buckets_started(), seconds * 1e3 / c.steps);
  std::printf("rank %d: loss %.6f -> %.6f (single process %.6f, |diff| %.3g <= %.3g); weights max |diff| %.3g, "
              "worst diff/tolerance %.3f at parameter %zu: %s\n",
              rank, initial_loss, final_loss, ref_loss, loss_diff, loss_tolerance, max_diff, worst_ratio, worst,
              pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) try {
  return run(argc, argv);
} catch (const std::exception& e) {
  std::fprintf(stderr, "data_parallel_training: %s\n", e.what());
  return 1;
}
