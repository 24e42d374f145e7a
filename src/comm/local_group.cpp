#include "comm/local_group.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "comm/values_text.h"

namespace hpm::comm {

namespace {

void cpu_relax() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

long long ms_until(Clock::time_point start, Clock::time_point deadline) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(deadline - start).count();
}

// dst[i] = dst[i] (op) src[i]
void combine(float* dst, const float* src, std::int64_t n, ReduceOp op) {
  if (op == ReduceOp::kMax) {
    for (std::int64_t i = 0; i < n; ++i) dst[i] = std::max(dst[i], src[i]);
  } else {
    for (std::int64_t i = 0; i < n; ++i) dst[i] += src[i];
  }
}

void scale(float* data, std::int64_t n, float s) {
  for (std::int64_t i = 0; i < n; ++i) data[i] *= s;
}

// out[0, hi - lo) becomes the reduction, in rank order, of elements [lo, hi) of every rank's
// buffer, staged through a small block that stays in L1.
template <typename Buffers>
void reduce_range(float* out, const Buffers& buffers, int size, std::int64_t lo, std::int64_t hi,
                  ReduceOp op) {
  constexpr std::int64_t kBlock = 2048;
  alignas(64) float tmp[kBlock];
  const float inv = 1.0f / static_cast<float>(size);
  for (std::int64_t b = lo; b < hi; b += kBlock) {
    const std::int64_t m = std::min(kBlock, hi - b);
    std::memcpy(tmp, buffers(0) + b, static_cast<std::size_t>(m) * sizeof(float));
    for (int j = 1; j < size; ++j) combine(tmp, buffers(j) + b, m, op);
    if (op == ReduceOp::kAverage) scale(tmp, m, inv);
    std::memcpy(out + (b - lo), tmp, static_cast<std::size_t>(m) * sizeof(float));
  }
}

std::int64_t part(std::int64_t n, int i, int parts) { return n * i / parts; }

}  // namespace

std::string CollectiveDesc::str() const {
  std::ostringstream os;
  os << kind << " of " << count << " " << values_of(dtype);
  if (root >= 0) os << " from root " << root;
  if (std::strcmp(kind, "allreduce") == 0 || std::strcmp(kind, "reduce_scatter") == 0) {
    os << " (" << reduce_op_name(op);
    if (algorithm != Algorithm::kAuto) os << ", " << algorithm_name(algorithm);
    os << ")";
  }
  return os.str();
}

LocalGroup::LocalGroup(int size)
    : size_(size),
      slots_(static_cast<std::size_t>(size)),
      arrived_at_(size, 0),
      left_(size, false) {}

void LocalGroup::check_failed_locked() const {
  if (!failure_.empty()) throw CommError(failure_);
}

void LocalGroup::fail(const std::string& message) {
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failure_.empty()) failure_ = message;
    reason = failure_;
  }
  cv_.notify_all();
  throw CommError(reason);
}

void LocalGroup::leave(int rank) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    left_[rank] = true;
  }
  cv_.notify_all();
}

void LocalGroup::sync(int rank, const CollectiveDesc& desc, Clock::time_point deadline) {
  const auto start = Clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  check_failed_locked();
  slots_[rank].desc = desc;
  const std::uint64_t gen = generation_;
  arrived_at_[rank] = gen + 1;
  if (++arrived_ == size_) {
    for (int r = 1; r < size_; ++r) {
      if (!(slots_[r].desc == slots_[0].desc)) {
        failure_ = "mismatched collectives: rank 0 called " + slots_[0].desc.str() + ", rank " +
                   std::to_string(r) + " called " + slots_[r].desc.str();
        cv_.notify_all();
        throw CommError(failure_);
      }
    }
    arrived_ = 0;
    generation_.store(gen + 1, std::memory_order_release);
    cv_.notify_all();
    return;
  }
  // Spin briefly before sleeping: a collective's ranks usually arrive within microseconds of each
  // other, and a condition variable's wake-up costs tens of them.
  lock.unlock();
  for (int i = 0; i < 2000; ++i) {
    if (generation_.load(std::memory_order_acquire) != gen) return;
    cpu_relax();
  }
  lock.lock();
  auto missing_left = [&] {
    for (int r = 0; r < size_; ++r) {
      if (left_[r] && arrived_at_[r] != gen + 1) return r;
    }
    return -1;
  };
  waiters_.fetch_add(1);
  const bool done = cv_.wait_until(lock, deadline, [&] {
    return generation_ != gen || !failure_.empty() || missing_left() >= 0;
  });
  waiters_.fetch_sub(1);
  if (done && generation_ != gen) return;
  if (failure_.empty()) {
    std::ostringstream os;
    if (const int r = missing_left(); r >= 0) {
      os << desc.str() << ": rank " << r << " has left the group";
    } else {
      os << desc.str() << ": rank(s)";
      const char* sep = " ";
      for (int r = 0; r < size_; ++r) {
        if (arrived_at_[r] != gen + 1) {
          os << sep << r;
          sep = ", ";
        }
      }
      os << " did not arrive within " << ms_until(start, deadline) << " ms";
    }
    failure_ = os.str();
    cv_.notify_all();
  }
  throw CommError(failure_);
}

void LocalGroup::publish(int rank, std::uint64_t value) {
  slots_[rank].progress.store(value);
  if (waiters_.load() > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_all();
  }
}

void LocalGroup::wait_progress(int rank, int peer, std::uint64_t target, Clock::time_point deadline,
                               const CollectiveDesc& desc) {
  auto& progress = slots_[peer].progress;
  for (int i = 0; i < 512; ++i) {
    if (progress.load(std::memory_order_acquire) >= target) return;
    cpu_relax();
  }
  const auto start = Clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  waiters_.fetch_add(1);
  cv_.wait_until(lock, deadline,
                 [&] { return progress.load() >= target || !failure_.empty() || left_[peer]; });
  waiters_.fetch_sub(1);
  if (progress.load() >= target) return;
  lock.unlock();
  if (left_[peer]) fail(desc.str() + ": rank " + std::to_string(peer) + " has left the group");
  {
    std::lock_guard<std::mutex> relock(mu_);
    check_failed_locked();
  }
  fail(desc.str() + ": rank " + std::to_string(rank) + " waited " +
       std::to_string(ms_until(start, deadline)) + " ms for rank " + std::to_string(peer) +
       ", which is stuck or gone");
}

// ---------------------------------------------------------------------------------------------
// all-reduce

void LocalGroup::allreduce(int rank, float* data, std::int64_t n, ReduceOp op, Algorithm algorithm,
                           Clock::time_point deadline) {
  const CollectiveDesc d{"allreduce", n, -1, op, algorithm};
  if (size_ == 1) return;  // sum, average and max of one rank are the identity
  switch (algorithm) {
    case Algorithm::kRing:
      return allreduce_ring(rank, data, n, op, deadline, d);
    case Algorithm::kRecursiveDoubling:
      return allreduce_doubling(rank, data, n, op, deadline, d);
    case Algorithm::kDirect:
    case Algorithm::kAuto:
      return allreduce_direct(rank, data, n, op, deadline, d);
  }
}

// Rank r reduces elements [n*r/N, n*(r+1)/N) of every rank's buffer into its own, then copies the
// other ranks' reduced parts: each element is read N times and written twice, the least any
// all-reduce can move. No rank writes a part that another rank reads in the same phase.
void LocalGroup::allreduce_direct(int rank, float* data, std::int64_t n, ReduceOp op,
                                  Clock::time_point deadline, const CollectiveDesc& d) {
  slots_[rank].data = data;
  sync(rank, d, deadline);
  auto buffers = [this](int j) -> const float* { return slots_[j].data; };
  const std::int64_t lo = part(n, rank, size_), hi = part(n, rank + 1, size_);
  reduce_range(data + lo, buffers, size_, lo, hi, op);
  sync(rank, d, deadline);
  for (int j = 0; j < size_; ++j) {
    if (j == rank) continue;
    const std::int64_t a = part(n, j, size_), b = part(n, j + 1, size_);
    std::memcpy(data + a, slots_[j].data + a, static_cast<std::size_t>(b - a) * sizeof(float));
  }
  sync(rank, d, deadline);
}

// Reduce-scatter then all-gather around the ring r-1 -> r, 2(N-1) steps over N segments. Each
// segment moves in sub-chunks, and a rank starts sub-chunk k of step g as soon as its predecessor
// has finished sub-chunk k of step g-1, so the steps overlap along the ring.
void LocalGroup::allreduce_ring(int rank, float* data, std::int64_t n, ReduceOp op,
                                Clock::time_point deadline, const CollectiveDesc& d) {
  const int N = size_;
  const int prev = (rank + N - 1) % N;
  const std::int64_t max_segment = (n + N - 1) / N;
  const std::int64_t S =
      std::max<std::int64_t>(1, (max_segment + kRingSubChunk - 1) / kRingSubChunk);
  const auto steps = static_cast<std::uint64_t>(S);
  const std::uint64_t base = slots_[rank].progress.load();
  slots_[rank].data = data;
  sync(rank, d, deadline);
  const float* src = slots_[prev].data;
  const float inv = 1.0f / static_cast<float>(N);
  for (int g = 0; g < 2 * (N - 1); ++g) {
    const bool reducing = g < N - 1;
    const int seg = reducing ? (rank - g - 1 + 2 * N) % N : (rank - (g - (N - 1)) + 2 * N) % N;
    const std::int64_t seg_lo = part(n, seg, N), seg_hi = part(n, seg + 1, N);
    for (std::int64_t k = 0; k < S; ++k) {
      const auto ku = static_cast<std::uint64_t>(k);
      if (g > 0)
        wait_progress(rank, prev, base + static_cast<std::uint64_t>(g - 1) * steps + ku + 1,
                      deadline, d);
      const std::int64_t lo = std::min(seg_hi, seg_lo + k * kRingSubChunk);
      const std::int64_t hi = std::min(seg_hi, lo + kRingSubChunk);
      if (reducing) {
        combine(data + lo, src + lo, hi - lo, op);
        if (g == N - 2 && op == ReduceOp::kAverage) scale(data + lo, hi - lo, inv);
      } else {
        std::memcpy(data + lo, src + lo, static_cast<std::size_t>(hi - lo) * sizeof(float));
      }
      publish(rank, base + static_cast<std::uint64_t>(g) * steps + ku + 1);
    }
  }
  sync(rank, d, deadline);  // the successor has read everything it needs from this buffer
}

// Recursive doubling: in step k rank r combines its partial result with that of r xor 2^k, so
// after log2(N) steps every rank holds the whole reduction; each step is one exchange, the fewest
// for a small message. Ranks beyond the largest power of two p fold into rank r-p first and copy
// the result back at the end. Partners combine the same two operands, so every rank ends bitwise
// equal (IEEE addition and max are commutative).
void LocalGroup::allreduce_doubling(int rank, float* data, std::int64_t n, ReduceOp op,
                                    Clock::time_point deadline, const CollectiveDesc& d) {
  int levels = 0;
  while ((2 << levels) <= size_) ++levels;
  const int p = 1 << levels;
  const std::uint64_t per_op = static_cast<std::uint64_t>(levels) + 2;
  Slot& self = slots_[rank];
  const std::uint64_t base = self.progress.load();
  self.stages.resize(static_cast<std::size_t>((levels + 1) * n));
  sync(rank, d, deadline);  // so that mismatched calls are reported, not waited out
  auto stage = [&](int r, int k) {
    return slots_[r].stages.data() + static_cast<std::int64_t>(k) * n;
  };
  const auto bytes = static_cast<std::size_t>(n) * sizeof(float);
  std::memcpy(stage(rank, 0), data, bytes);
  if (rank >= p) {
    publish(rank, base + 1);
    wait_progress(rank, rank - p, base + static_cast<std::uint64_t>(levels) + 1, deadline, d);
    std::memcpy(data, stage(rank - p, levels), bytes);
  } else {
    if (rank + p < size_) {
      wait_progress(rank, rank + p, base + 1, deadline, d);
      combine(stage(rank, 0), stage(rank + p, 0), n, op);
    }
    publish(rank, base + 1);
    for (int k = 0; k < levels; ++k) {
      const int partner = rank ^ (1 << k);
      wait_progress(rank, partner, base + static_cast<std::uint64_t>(k) + 1, deadline, d);
      float* next = stage(rank, k + 1);
      std::memcpy(next, stage(rank, k), bytes);
      combine(next, stage(partner, k), n, op);
      if (k == levels - 1 && op == ReduceOp::kAverage)
        scale(next, n, 1.0f / static_cast<float>(size_));
      publish(rank, base + static_cast<std::uint64_t>(k) + 2);
    }
    std::memcpy(data, stage(rank, levels), bytes);
  }
  publish(rank, base + per_op);
  sync(rank, d, deadline);  // nobody still reads this rank's stages when the next op reuses them
}

// ---------------------------------------------------------------------------------------------
// the other collectives

void LocalGroup::reduce_scatter(int rank, const float* in, float* out, std::int64_t block,
                                ReduceOp op, Clock::time_point deadline) {
  const CollectiveDesc d{"reduce_scatter", block * size_, -1, op, Algorithm::kAuto};
  slots_[rank].in = in;
  sync(rank, d, deadline);
  auto inputs = [this](int j) { return slots_[j].in; };
  reduce_range(out, inputs, size_, rank * block, (rank + 1) * block, op);
  sync(rank, d, deadline);
}

void LocalGroup::allgather(int rank, const Tensor& in, const Tensor& out,
                           Clock::time_point deadline) {
  const CollectiveDesc d{"allgather",    out.numel(),      -1,
                         ReduceOp::kSum, Algorithm::kAuto, in.dtype()};
  slots_[rank].bytes_in = in.raw_data();
  sync(rank, d, deadline);
  const std::size_t block = in.nbytes();
  for (int j = 0; j < size_; ++j) {
    std::memcpy(static_cast<char*>(out.raw_data()) + j * block, slots_[j].bytes_in, block);
  }
  sync(rank, d, deadline);
}

void LocalGroup::broadcast(int rank, const Tensor& data, int root, Clock::time_point deadline) {
  const CollectiveDesc d{"broadcast",    data.numel(),     root,
                         ReduceOp::kSum, Algorithm::kAuto, data.dtype()};
  slots_[rank].bytes = data.raw_data();
  sync(rank, d, deadline);
  if (rank != root) std::memcpy(data.raw_data(), slots_[root].bytes, data.nbytes());
  sync(rank, d, deadline);
}

void LocalGroup::barrier(int rank, Clock::time_point deadline) {
  sync(rank, CollectiveDesc{"barrier", 0, -1, ReduceOp::kSum, Algorithm::kAuto}, deadline);
}

// ---------------------------------------------------------------------------------------------
// point to point

namespace {
// Lets go of the receiver's buffer before the Work completes: once it does, the receiver may
// free the buffer and the Device it lives on (a pipeline stage's), and a reference still held
// here would be released into a dead Device.
void deliver(const char* src, std::size_t bytes, Tensor dst, const WorkPtr& work, int from,
             int tag) {
  if (bytes != dst.nbytes()) {
    const std::size_t unit = dtype_size(dst.dtype());
    const std::string what = values_of(dst.dtype());
    const std::string has = bytes % unit == 0 ? std::to_string(bytes / unit) + " " + what
                                              : std::to_string(bytes) + " bytes";
    const auto expected = std::to_string(dst.numel()) + " " + what;
    dst = Tensor();
    work->finish(std::make_exception_ptr(CommError("recv from rank " + std::to_string(from) +
                                                   " tag " + std::to_string(tag) + ": expected " +
                                                   expected + ", the message has " + has)));
    return;
  }
  std::memcpy(dst.raw_data(), src, bytes);
  dst = Tensor();
  work->finish();
}
}  // namespace

void LocalGroup::send(int src, int dst, int tag, const Tensor& data) {
  std::unique_lock<std::mutex> lock(mail_mu_);
  for (auto it = pending_.begin(); it != pending_.end(); ++it) {
    if (it->src == src && it->dst == dst && it->tag == tag) {
      PendingRecv r = std::move(*it);
      pending_.erase(it);
      lock.unlock();
      deliver(static_cast<const char*>(data.raw_data()), data.nbytes(), std::move(r.data), r.work,
              src, tag);
      return;
    }
  }
  const auto* p = static_cast<const char*>(data.raw_data());
  mailbox_.push_back(Message{src, dst, tag, std::vector<char>(p, p + data.nbytes())});
}

void LocalGroup::recv(int dst, int src, int tag, const Tensor& data, const WorkPtr& work) {
  std::unique_lock<std::mutex> lock(mail_mu_);
  for (auto it = mailbox_.begin(); it != mailbox_.end(); ++it) {
    if (it->src == src && it->dst == dst && it->tag == tag) {
      Message m = std::move(*it);
      mailbox_.erase(it);
      lock.unlock();
      deliver(m.data.data(), m.data.size(), data, work, src, tag);
      return;
    }
  }
  pending_.push_back(PendingRecv{src, dst, tag, data, work});
}

LocalGroup::~LocalGroup() {
  for (PendingRecv& r : pending_) {
    r.data = Tensor();  // the receiver may free it, and its Device, once the Work completes
    r.work->finish(std::make_exception_ptr(CommError(r.work->what() + ": its group is gone")));
  }
}

void LocalGroup::withdraw(const Work* work) {
  std::unique_lock<std::mutex> lock(mail_mu_);
  auto it = std::find_if(pending_.begin(), pending_.end(),
                         [&](const PendingRecv& r) { return r.work.get() == work; });
  if (it == pending_.end()) return;  // delivered already
  PendingRecv r = std::move(*it);
  pending_.erase(it);
  lock.unlock();
  r.data = Tensor();
  r.work->finish(std::make_exception_ptr(CommError(r.work->what() + ": cancelled")));
}

}  // namespace hpm::comm
