// The gloo backend (see gloo.h for the algorithms and the failure protocol).
//
// Sections: rendezvous (arrive, connect, confirm), collectives on the WorkQueue, send/recv on
// waiter threads, and failure: note, abort, diagnosis.
//
// Slots. Gloo matches messages by (peer, slot). Collectives get tag = 16 bits of sequence number
// and 16 bits folded from the byte count, so ranks that disagree on a size never match each
// other's messages (gloo's event loop would abort the process on an oversized message) and time
// out instead. send/recv put (tag, size) in the slot for the same reason.
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/attr.h>
#include <gloo/transport/tcp/device.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <optional>
#include <thread>

#include "comm/duration_text.h"
#include "comm/values_text.h"
#include "comm/work_queue.h"
#include "hpm/comm/gloo.h"
#include "hpm/comm/store.h"
#include "hpm/tensor/backend/cpu.h"  // host views: bf16 messages as bytes
#include "hpm/tensor/kernels.h"
#include "hpm/trace/trace.h"

namespace hpm::comm {

namespace {

using Clock = std::chrono::steady_clock;
using ReduceFn = void (*)(void*, const void*, const void*, std::size_t);

// Slot prefixes of our own messages (gloo's own use 0x01..0x08 in the top byte).
constexpr std::uint8_t kDirectScatterPrefix = 0x40;
constexpr std::uint8_t kDirectGatherPrefix = 0x41;
constexpr std::uint8_t kP2pPrefix = 0x42;
constexpr std::uint8_t kProbePrefix = 0x43;
constexpr int kMaxTag = (1 << 24) - 1;
// What gloo's tcp transport records on every pair when this process gave up on an operation
// (its own timeout, or our deliberate abort): anything else on a pair came from the peer's side.
constexpr const char* kLocalAbortMessage = "Application timeout caused pair closure";

std::uint64_t slot(std::uint8_t prefix, std::uint64_t tag) {
  return (std::uint64_t{prefix} << 56) | tag;
}

std::uint32_t collective_tag(std::uint64_t seq, std::size_t bytes) {
  const std::uint64_t b = bytes;
  const auto fold = static_cast<std::uint32_t>((b ^ (b >> 16) ^ (b >> 32) ^ (b >> 48)) & 0xffff);
  return static_cast<std::uint32_t>((seq & 0xffff) << 16) | fold;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    s += (i == 0 ? "" : i + 1 == ranks.size() ? " and " : ", ") + std::to_string(ranks[i]);
  }
  return s;
}

Milliseconds left(Clock::time_point deadline, Milliseconds at_least = Milliseconds(1)) {
  return std::max(std::chrono::duration_cast<Milliseconds>(deadline - Clock::now()), at_least);
}

// A gloo rendezvous context that also exposes its transport context, whose timeout gloo's bcube
// all-reduce uses (it waits without passing one) and which must follow the communicator's.
class MeshContext : public gloo::rendezvous::Context {
 public:
  using gloo::rendezvous::Context::Context;
  void set_all_timeouts(Milliseconds t) {
    setTimeout(t);
    if (transportContext_) transportContext_->setTimeout(t);
  }
};

// Threads that block in gloo's waitSend/waitRecv for send/recv Works: one per operation in
// flight (idle threads are reused), so every Work completes as soon as its own message does and
// none waits behind another's.
class WaiterPool {
 public:
  ~WaiterPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  void run(std::function<void()> job) {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(std::move(job));
    ++busy_;
    if (waiting_ >= jobs_.size()) {
      cv_.notify_one();
    } else {
      threads_.emplace_back([this] { work(); });
    }
  }
  bool busy() {
    std::lock_guard<std::mutex> lock(mu_);
    return busy_ > 0;
  }

 private:
  void work() {
    trace::name_thread("gloo p2p");
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      ++waiting_;
      cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      --waiting_;
      if (jobs_.empty()) return;
      std::function<void()> job = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      job();
      lock.lock();
      --busy_;
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::size_t waiting_ = 0, busy_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

bool looks_like_host_port(const std::string& s) {
  const auto colon = s.rfind(':');
  if (colon == std::string::npos || colon + 1 == s.size() || s.find('/') != std::string::npos)
    return false;
  return std::all_of(s.begin() + static_cast<std::ptrdiff_t>(colon) + 1, s.end(),
                     [](char c) { return c >= '0' && c <= '9'; });
}

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

std::vector<char> bytes_of(const std::string& s) { return std::vector<char>(s.begin(), s.end()); }

// Gloo's messages start with "[./gloo/transport/tcp/pair.cc:589] ": keep what follows.
std::string gloo_text(const std::string& message) {
  if (message.empty() || message[0] != '[') return message;
  const auto end = message.find("] ");
  return end == std::string::npos ? message : message.substr(end + 2);
}

// A write to a socket whose peer died raises SIGPIPE, which would kill this process instead of
// failing the operation; gloo's tcp transport writes with plain writev.
void ignore_sigpipe() {
  struct sigaction old {};
  if (::sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL)
    ::signal(SIGPIPE, SIG_IGN);
}

// ---------------------------------------------------------------------------------------------

class GlooCommunicator final : public Communicator {
 public:
  explicit GlooCommunicator(const GlooOptions& o);
  ~GlooCommunicator() override;

  int rank() const override { return options_.rank; }
  int size() const override { return options_.world_size; }
  std::string backend() const override { return "gloo"; }

  WorkPtr allreduce(Tensor data, ReduceOp op) override;
  WorkPtr reduce_scatter(Tensor input, Tensor output, ReduceOp op) override;
  WorkPtr allgather(Tensor input, Tensor output) override;
  WorkPtr broadcast(Tensor data, int root) override;
  WorkPtr barrier() override;
  WorkPtr send(Tensor data, int dst, int tag) override;
  WorkPtr recv(Tensor data, int src, int tag) override;

 private:
  // -- rendezvous
  void open_store(Clock::time_point deadline);
  void rendezvous(Clock::time_point deadline);
  std::string key(const char* what, int rank) const {
    return options_.prefix + "/" + what + "/" + std::to_string(rank);
  }
  std::vector<std::string> keys(const char* what) const;
  // Waits for `what` keys of every rank until the deadline; throws naming the ranks missing.
  void await_all(const char* what, const std::string& failing, Clock::time_point deadline);
  std::string where() const;

  // -- collectives
  Algorithm pick(std::size_t bytes) const;
  WorkPtr submit(std::string what, std::function<void()> body);
  void allreduce_floats(float* data, std::size_t n, ReduceOp op, Algorithm a, std::uint32_t tag);
  void allreduce_bf16(std::uint16_t* data, std::size_t n, ReduceOp op, Algorithm a,
                      std::uint32_t tag);
  void direct_allreduce(float* data, std::size_t n, ReduceFn fn, std::uint32_t tag);
  std::uint64_t next_seq() { return seq_.fetch_add(1); }

  // -- send/recv
  WorkPtr point_to_point(bool sending, Tensor data, int peer, int tag);

  // -- failure
  // The error for `what`, which failed with `cause`: the first failure runs the diagnosis.
  CommError failure(const std::string& what, const std::string& cause);
  std::string diagnose(const std::string& what, const std::string& cause);
  void abort_transport();
  std::string describe(int r) const { return "rank " + std::to_string(r) + " (" + peers_[r] + ")"; }
  // Whether `peer` ("pid P on HOST, ADDRESS") ran on this host and its process has exited.
  static bool process_gone(const std::string& peer);
  // How long a failing rank waits for its peers' notes (and rank 0 keeps the store up for them).
  Milliseconds grace() const {
    return std::clamp(timeout_ / 10, Milliseconds(200), Milliseconds(2000));
  }
  void throw_if_broken(const std::string& what);
  // Rank 0 after a failure: stays the peers' store until every peer not known gone left its note.
  void keep_store_for_peers();

  GlooOptions options_;
  bool tcp_store_ = false;
  std::unique_ptr<TcpStoreServer> server_;
  std::unique_ptr<Store> store_;
  std::vector<std::string> peers_;  // "pid 812 on host, 127.0.0.1" by rank
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<MeshContext> context_;
  std::atomic<std::uint64_t> seq_{0};
  Milliseconds applied_timeout_{0};  // the gloo contexts' timeout (the queue thread's business)

  std::mutex fail_mu_;
  std::optional<std::string> broken_;  // the first failure's message
  std::atomic<bool> is_broken_{false};
  bool diagnosed_ = false;  // broken by a failure (not by destruction)
  std::vector<int> gone_;   // the ranks the diagnosis found gone

  std::unique_ptr<WaiterPool> waiters_;
  std::unique_ptr<WorkQueue> queue_;
};

// ---- rendezvous ------------------------------------------------------------------------------
//
// 1. every rank sets <prefix>/arrived/<rank> = "pid P on HOST, ADDRESS" and waits for all the
//    others, so a missing rank is named rather than reported as a missing gloo key;
// 2. gloo's connectFullMesh under <prefix>/gloo;
// 3. every rank sets <prefix>/connected/<rank> and waits for all: nobody leaves (and rank 0 does
//    not stop the store) while a peer still reads addresses.

GlooCommunicator::GlooCommunicator(const GlooOptions& o) : options_(o) {
  if (o.world_size < 1) throw std::invalid_argument("gloo: world size must be >= 1");
  if (o.rank < 0 || o.rank >= o.world_size) {
    throw std::invalid_argument("gloo: rank " + std::to_string(o.rank) + " is outside 0.." +
                                std::to_string(o.world_size - 1));
  }
  if (o.rendezvous.empty())
    throw std::invalid_argument("gloo: no rendezvous (HOST:PORT or a directory)");
  if (o.timeout.count() <= 0) throw std::invalid_argument("gloo: the timeout must be positive");
  if (o.prefix.empty()) throw std::invalid_argument("gloo: empty store prefix");
  timeout_ = o.timeout;
  ignore_sigpipe();
  const auto deadline = Clock::now() + o.timeout;
  open_store(deadline);
  rendezvous(deadline);
  waiters_ = std::make_unique<WaiterPool>();
  queue_ = std::make_unique<WorkQueue>("gloo rank " + std::to_string(o.rank));
}

GlooCommunicator::~GlooCommunicator() {
  queue_.reset();  // runs what was issued
  // A send or recv still in flight would otherwise hold its waiter thread until the timeout.
  if (waiters_->busy()) {
    {
      std::lock_guard<std::mutex> lock(fail_mu_);
      if (!broken_) broken_ = "the communicator was destroyed";
      is_broken_ = true;
    }
    abort_transport();
  }
  waiters_.reset();
  context_.reset();
  device_.reset();
  if (server_ && diagnosed_) keep_store_for_peers();
  store_.reset();
  server_.reset();
}

// A survivor may notice a failure only at its own timeout (a receive the dead rank's close did not
// wake). Were the store gone by then, it could not tell a dead peer from rank 0 that merely left
// first, and would blame rank 0. Bounded, so that a peer that never fails delays the exit of a
// failed job by seconds, not by a long collective timeout.
void GlooCommunicator::keep_store_for_peers() {
  const auto until = Clock::now() + std::min(timeout_, Milliseconds(10000)) + grace();
  for (bool all = false; !all && Clock::now() < until;) {
    all = true;
    try {
      for (int r = 0; r < size() && all; ++r) {
        const bool gone = std::find(gone_.begin(), gone_.end(), r) != gone_.end();
        all = r == rank() || gone || store_->check({key("failed", r)});
      }
    } catch (const std::exception&) {
      return;
    }
    if (!all) std::this_thread::sleep_for(Milliseconds(10));
  }
  // The last of them still reads the others' notes.
  std::this_thread::sleep_for(grace());
}

std::string GlooCommunicator::where() const {
  return "gloo rendezvous at " + options_.rendezvous + " (prefix '" + options_.prefix + "')";
}

void GlooCommunicator::open_store(Clock::time_point deadline) {
  tcp_store_ = looks_like_host_port(options_.rendezvous) &&
               !std::filesystem::is_directory(options_.rendezvous);
  if (!tcp_store_) {
    store_ = std::make_unique<FileStore>(options_.rendezvous, options_.timeout);
    return;
  }
  HostPort hp = parse_host_port(options_.rendezvous);
  if (hp.port == 0 && size() > 1) {
    throw std::invalid_argument(where() + ": port 0 (any free port) only works for a group of one");
  }
  if (options_.rank == 0) {
    // Bind the name given unless it is a loopback address: a host name may resolve to another
    // local address (Debian maps it to 127.0.1.1) than the one the other hosts reach.
    server_ = std::make_unique<TcpStoreServer>(is_loopback(hp.host) ? hp.host : "", hp.port);
    hp.port = server_->port();
  }
  try {
    store_ = std::make_unique<TcpStore>(hp.host, hp.port, left(deadline));
  } catch (const CommError& e) {
    if (rank() == 0) throw CommError(where() + ": " + e.what());
    throw CommError(where() + ": rank 0, which hosts the store, did not arrive within " +
                    seconds_text(options_.timeout) + " (" + e.what() + ")");
  }
}

std::vector<std::string> GlooCommunicator::keys(const char* what) const {
  std::vector<std::string> out;
  for (int r = 0; r < size(); ++r) out.push_back(key(what, r));
  return out;
}

void GlooCommunicator::await_all(const char* what, const std::string& failing,
                                 Clock::time_point deadline) {
  const std::vector<std::string> all = keys(what);
  try {
    store_->wait(all, left(deadline));
    return;
  } catch (const CommError&) {
  }
  std::vector<int> missing, present;
  for (int r = 0; r < size(); ++r) (store_->check({key(what, r)}) ? present : missing).push_back(r);
  if (missing.empty()) return;  // they arrived just now
  throw CommError(where() + ": rank(s) " + rank_list(missing) + " " + failing + " within " +
                  seconds_text(options_.timeout) + " (rank(s) " + rank_list(present) + " did)");
}

void GlooCommunicator::rendezvous(Clock::time_point deadline) {
  char host[256] = "?";
  ::gethostname(host, sizeof host - 1);
  const std::string me =
      "pid " + std::to_string(::getpid()) + " on " + host + ", " + options_.hostname;
  store_->set(key("arrived", rank()), bytes_of(me));
  await_all("arrived", "did not arrive", deadline);
  peers_.resize(static_cast<std::size_t>(size()));
  for (int r = 0; r < size(); ++r) {
    const std::vector<char> v = store_->get(key("arrived", r));
    peers_[r] = std::string(v.begin(), v.end());
  }

  gloo::transport::tcp::attr attr;
  attr.hostname = options_.hostname;
  try {
    device_ = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    throw CommError("gloo: cannot open a TCP device on '" + options_.hostname + "': " + e.what());
  }
  context_ = std::make_shared<MeshContext>(rank(), size());
  // Gloo's pairs wait up to 5x the context timeout for a peer to connect: keep the total within
  // what is left of the rendezvous timeout.
  context_->set_all_timeouts(std::max(left(deadline) / 5, Milliseconds(100)));
  try {
    gloo::rendezvous::PrefixStore gloo_keys(options_.prefix + "/gloo", *store_);
    context_->connectFullMesh(gloo_keys, device_);
  } catch (const std::exception& e) {
    std::vector<int> silent;
    try {
      for (int r = 0; r < size(); ++r)
        if (!store_->check({options_.prefix + "/gloo/" + std::to_string(r)})) silent.push_back(r);
    } catch (const std::exception&) {  // the store is gone too: say what gloo said
    }
    throw CommError(
        where() + ": rank " + std::to_string(rank()) + " could not connect to its peers" +
        (silent.empty()
             ? std::string()
             : " (rank(s) " + rank_list(silent) + " arrived but never published an address)") +
        ": " + gloo_text(e.what()));
  }
  store_->set(key("connected", rank()), bytes_of("1"));
  await_all("connected", "did not finish connecting", deadline);
  context_->set_all_timeouts(options_.timeout);
  applied_timeout_ = options_.timeout;
}

// ---- collectives -------------------------------------------------------------------------------

Algorithm GlooCommunicator::pick(std::size_t bytes) const {
  if (algorithm_ != Algorithm::kAuto) return algorithm_;
  return bytes < small_message_bytes_ ? Algorithm::kRecursiveDoubling : Algorithm::kRing;
}

void GlooCommunicator::throw_if_broken(const std::string& what) {
  if (!is_broken_.load()) return;
  std::lock_guard<std::mutex> lock(fail_mu_);
  throw CommError(what + ": not run: the communicator failed earlier: " + *broken_);
}

WorkPtr GlooCommunicator::submit(std::string what, std::function<void()> body) {
  return queue_->submit(what, [this, what, body = std::move(body)] {
    throw_if_broken(what);
    if (timeout_ != applied_timeout_) {  // set_timeout() since the last collective
      context_->set_all_timeouts(timeout_);
      applied_timeout_ = timeout_;
    }
    try {
      body();
    } catch (const CommError&) {
      throw;
    } catch (const std::exception& e) {  // gloo::IoException, gloo::EnforceNotMet
      throw failure(what, e.what());
    }
  });
}

void GlooCommunicator::allreduce_floats(float* data, std::size_t n, ReduceOp op, Algorithm a,
                                        std::uint32_t tag) {
  const ReduceFn fn = op == ReduceOp::kMax ? static_cast<ReduceFn>(&gloo::max<float>)
                                           : static_cast<ReduceFn>(&gloo::sum<float>);
  if (size() > 1 && n > 0) {
    if (a == Algorithm::kDirect) {
      direct_allreduce(data, n, fn, tag);
    } else {
      gloo::AllreduceOptions opts(context_);
      opts.setOutput(data, n);
      opts.setReduceFunction(fn);
      opts.setTag(tag);
      opts.setTimeout(timeout_);
      opts.setAlgorithm(a == Algorithm::kRing ? gloo::AllreduceOptions::Algorithm::RING
                                              : gloo::AllreduceOptions::Algorithm::BCUBE);
      gloo::allreduce(opts);
    }
  }
  if (op == ReduceOp::kAverage) {
    const float scale = 1.0f / static_cast<float>(size());
    for (std::size_t i = 0; i < n; ++i) data[i] *= scale;
  }
}

// The distribution all-reduce: block b of the buffer (balanced split) is reduced by rank b, which
// receives it from every peer, then sends the result back to all. Every block is reduced by one
// rank in one order, so all ranks end with bit-identical results.
void GlooCommunicator::direct_allreduce(float* data, std::size_t n, ReduceFn fn,
                                        std::uint32_t tag) {
  const int world = size(), me = rank();
  const auto begin = [&](int b) {
    return n * static_cast<std::size_t>(b) / static_cast<std::size_t>(world);
  };
  const std::size_t my_begin = begin(me), my_len = begin(me + 1) - my_begin;
  std::vector<float> scratch(
      std::max<std::size_t>(1, my_len * static_cast<std::size_t>(world - 1)));
  auto out = context_->createUnboundBuffer(data, n * sizeof(float));
  auto tmp = context_->createUnboundBuffer(scratch.data(), scratch.size() * sizeof(float));
  const std::uint64_t scatter = slot(kDirectScatterPrefix, std::uint64_t{tag} << 24);
  const std::uint64_t gather = slot(kDirectGatherPrefix, std::uint64_t{tag} << 24);
  const auto wait_all = [&](int recvs, gloo::transport::UnboundBuffer* rb, int sends,
                            gloo::transport::UnboundBuffer* sb) {
    for (int i = 0; i < recvs; ++i) rb->waitRecv(timeout_);
    for (int i = 0; i < sends; ++i) sb->waitSend(timeout_);
  };

  // Reduce-scatter: peers' shares of my block land in scratch[i-1]; my shares of theirs leave.
  int recvs = 0, sends = 0;
  for (int i = 1; i < world && my_len > 0; ++i, ++recvs) {
    tmp->recv((me + i) % world, scatter, (i - 1) * my_len * sizeof(float), my_len * sizeof(float));
  }
  for (int i = 1; i < world; ++i) {
    const int peer = (me + i) % world;
    const std::size_t len = begin(peer + 1) - begin(peer);
    if (len == 0) continue;
    out->send(peer, scatter, begin(peer) * sizeof(float), len * sizeof(float));
    ++sends;
  }
  wait_all(recvs, tmp.get(), sends, out.get());
  for (int i = 1; i < world && my_len > 0; ++i) {
    fn(data + my_begin, data + my_begin, scratch.data() + (i - 1) * my_len, my_len);
  }

  // All-gather: my reduced block goes to everyone; theirs land in place.
  recvs = sends = 0;
  for (int i = 1; i < world; ++i) {
    const int peer = (me + i) % world;
    const std::size_t len = begin(peer + 1) - begin(peer);
    if (len == 0) continue;
    out->recv(peer, gather, begin(peer) * sizeof(float), len * sizeof(float));
    ++recvs;
  }
  for (int i = 1; i < world && my_len > 0; ++i, ++sends) {
    out->send((me + i) % world, gather, my_begin * sizeof(float), my_len * sizeof(float));
  }
  wait_all(recvs, out.get(), sends, out.get());
}

namespace {

// c = a + b (or max) over n bf16 values: in f32, rounded to nearest even, a block at a time.
template <bool kMax>
void bf16_reduce(void* c, const void* a, const void* b, std::size_t n) {
  constexpr std::size_t kBlock = 1024;
  float fa[kBlock], fb[kBlock];
  for (std::size_t at = 0; at < n; at += kBlock) {
    const auto m = static_cast<std::int64_t>(std::min(kBlock, n - at));
    cpu::bf16_to_f32(static_cast<const std::uint16_t*>(a) + at, fa, m);
    cpu::bf16_to_f32(static_cast<const std::uint16_t*>(b) + at, fb, m);
    for (std::int64_t i = 0; i < m; ++i) fa[i] = kMax ? std::max(fa[i], fb[i]) : fa[i] + fb[i];
    cpu::f32_to_bf16(fa, static_cast<std::uint16_t*>(c) + at, m);
  }
}

}  // namespace

// bf16 messages through gloo's ring (or bcube) with a reduction of its own: half the bytes of
// f32.
void GlooCommunicator::allreduce_bf16(std::uint16_t* data, std::size_t n, ReduceOp op, Algorithm a,
                                      std::uint32_t tag) {
  if (size() > 1 && n > 0) {
    gloo::AllreduceOptions opts(context_);
    opts.setOutput(data, n);
    opts.setReduceFunction(op == ReduceOp::kMax ? &bf16_reduce<true> : &bf16_reduce<false>);
    opts.setTag(tag);
    opts.setTimeout(timeout_);
    opts.setAlgorithm(a == Algorithm::kRecursiveDoubling ? gloo::AllreduceOptions::Algorithm::BCUBE
                                                         : gloo::AllreduceOptions::Algorithm::RING);
    gloo::allreduce(opts);
  }
  if (op == ReduceOp::kAverage) {
    const float scale = 1.0f / static_cast<float>(size());
    float f[1024];
    for (std::size_t at = 0; at < n; at += 1024) {
      const auto m = static_cast<std::int64_t>(std::min<std::size_t>(1024, n - at));
      cpu::bf16_to_f32(data + at, f, m);
      for (std::int64_t i = 0; i < m; ++i) f[i] *= scale;
      cpu::f32_to_bf16(f, data + at, m);
    }
  }
}

WorkPtr GlooCommunicator::allreduce(Tensor data, ReduceOp op) {
  check_allreduce_buffer(data, "allreduce");
  const std::size_t n = static_cast<std::size_t>(data.numel());
  if (data.dtype() == DType::BF16) {
    Algorithm a = pick(n * 2);
    if (a == Algorithm::kDirect) a = Algorithm::kRing;  // the direct all-reduce is f32 only
    const std::uint64_t seq = next_seq();
    const std::string what = "gloo allreduce #" + std::to_string(seq) + " (" + std::to_string(n) +
                             " bf16, " + reduce_op_name(op) + ", " + algorithm_name(a) + ")";
    return submit(what, [this, data, n, op, a, tag = collective_tag(seq, n * 2)] {
      trace::Span span("allreduce", "comm");
      allreduce_bf16(data.data<std::uint16_t>(), n, op, a, tag);
    });
  }
  const Algorithm a = pick(n * sizeof(float));
  const std::uint64_t seq = next_seq();
  const std::string what = "gloo allreduce #" + std::to_string(seq) + " (" + std::to_string(n) +
                           " floats, " + reduce_op_name(op) + ", " + algorithm_name(a) + ")";
  return submit(what, [this, data, n, op, a, tag = collective_tag(seq, n * sizeof(float))] {
    trace::Span span("allreduce", "comm");
    allreduce_floats(data.data<float>(), n, op, a, tag);
  });
}

WorkPtr GlooCommunicator::reduce_scatter(Tensor input, Tensor output, ReduceOp op) {
  check_buffer(input, "reduce_scatter input");
  check_buffer(output, "reduce_scatter output");
  const std::size_t block = static_cast<std::size_t>(output.numel());
  if (static_cast<std::size_t>(input.numel()) != block * static_cast<std::size_t>(size())) {
    throw std::invalid_argument("reduce_scatter: input has " + std::to_string(input.numel()) +
                                " elements, expected world size x output = " +
                                std::to_string(block * static_cast<std::size_t>(size())));
  }
  const std::size_t n = block * static_cast<std::size_t>(size());
  const Algorithm a = pick(n * sizeof(float));
  const std::uint64_t seq = next_seq();
  const std::string what = "gloo reduce_scatter #" + std::to_string(seq) + " (" +
                           std::to_string(n) + " floats, " + reduce_op_name(op) + ", " +
                           algorithm_name(a) + ")";
  // Gloo's options API has no reduce-scatter: all-reduce a copy (the input stays untouched) and
  // keep this rank's block. It moves about twice the bytes a ring reduce-scatter would.
  return submit(what, [this, input, output, n, block, op, a,
                       tag = collective_tag(seq, n * sizeof(float))] {
    trace::Span span("reduce_scatter", "comm");
    const float* in = input.data<float>();
    std::vector<float> all(in, in + n);
    allreduce_floats(all.data(), n, op, a, tag);
    std::copy_n(all.data() + block * static_cast<std::size_t>(rank()), block, output.data<float>());
  });
}

WorkPtr GlooCommunicator::allgather(Tensor input, Tensor output) {
  check_bytes(input, "allgather input");
  check_bytes(output, "allgather output");
  check_same_dtype(input, output, "allgather");
  const std::size_t n = static_cast<std::size_t>(input.numel());
  if (static_cast<std::size_t>(output.numel()) != n * static_cast<std::size_t>(size())) {
    throw std::invalid_argument("allgather: output has " + std::to_string(output.numel()) +
                                " elements, expected world size x input = " +
                                std::to_string(n * static_cast<std::size_t>(size())));
  }
  const std::uint64_t seq = next_seq();
  const std::size_t bytes = input.nbytes();
  const std::string what = "gloo allgather #" + std::to_string(seq) + " (" + std::to_string(n) +
                           " " + values_of(input.dtype()) + " per rank)";
  return submit(what, [this, input, output, bytes, tag = collective_tag(seq, bytes)] {
    trace::Span span("allgather", "comm");
    if (size() == 1 || bytes == 0) {
      std::memcpy(output.raw_data(), input.raw_data(), bytes);
      return;
    }
    gloo::AllgatherOptions opts(context_);
    opts.setInput(static_cast<std::uint8_t*>(input.raw_data()), bytes);
    opts.setOutput(static_cast<std::uint8_t*>(output.raw_data()),
                   bytes * static_cast<std::size_t>(size()));
    opts.setTag(tag);
    opts.setTimeout(timeout_);
    gloo::allgather(opts);
  });
}

WorkPtr GlooCommunicator::broadcast(Tensor data, int root) {
  check_bytes(data, "broadcast");
  if (root < 0 || root >= size()) {
    throw std::invalid_argument("broadcast: root " + std::to_string(root) + " is outside 0.." +
                                std::to_string(size() - 1));
  }
  const std::size_t n = static_cast<std::size_t>(data.numel());
  const std::uint64_t seq = next_seq();
  const std::size_t bytes = data.nbytes();
  const std::string what = "gloo broadcast #" + std::to_string(seq) + " (" + std::to_string(n) +
                           " " + values_of(data.dtype()) + " from rank " + std::to_string(root) +
                           ")";
  return submit(what, [this, data, bytes, root, tag = collective_tag(seq, bytes)] {
    trace::Span span("broadcast", "comm");
    if (size() == 1 || bytes == 0) return;
    gloo::BroadcastOptions opts(context_);
    opts.setOutput(static_cast<std::uint8_t*>(data.raw_data()), bytes);
    opts.setRoot(root);
    opts.setTag(tag);
    opts.setTimeout(timeout_);
    gloo::broadcast(opts);
  });
}

WorkPtr GlooCommunicator::barrier() {
  const std::uint64_t seq = next_seq();
  const std::string what = "gloo barrier #" + std::to_string(seq);
  return submit(what, [this, tag = collective_tag(seq, 0)] {
    trace::Span span("barrier", "comm");
    if (size() == 1) return;
    gloo::BarrierOptions opts(context_);
    opts.setTag(tag);
    opts.setTimeout(timeout_);
    gloo::barrier(opts);
  });
}

// ---- send/recv ---------------------------------------------------------------------------------

WorkPtr GlooCommunicator::point_to_point(bool sending, Tensor data, int peer, int tag) {
  const char* verb = sending ? "send" : "recv";
  check_bytes(data, verb);
  if (peer < 0 || peer >= size() || peer == rank()) {
    throw std::invalid_argument(std::string(verb) + ": peer " + std::to_string(peer) +
                                " must be another rank in 0.." + std::to_string(size() - 1));
  }
  if (tag < 0 || tag > kMaxTag) {
    throw std::invalid_argument(std::string(verb) + ": tag " + std::to_string(tag) +
                                " is outside 0.." + std::to_string(kMaxTag));
  }
  const std::size_t bytes = data.nbytes();
  const std::string what = std::string("gloo ") + verb + (sending ? " to rank " : " from rank ") +
                           std::to_string(peer) + ", tag " + std::to_string(tag) + " (" +
                           std::to_string(data.nbytes()) + " bytes)";
  auto work = std::make_shared<Work>(what);
  const std::uint64_t s = slot(kP2pPrefix, (std::uint64_t(tag) << 32) | (bytes & 0xffffffffu));
  std::shared_ptr<gloo::transport::UnboundBuffer> buf;
  try {
    throw_if_broken(what);
    buf = context_->createUnboundBuffer(data.raw_data(), bytes);
    if (sending) {
      buf->send(peer, s);
    } else {
      buf->recv(peer, s);
    }
  } catch (const CommError&) {
    work->finish(std::current_exception());
    return work;
  } catch (const std::exception& e) {
    work->finish(std::make_exception_ptr(failure(what, e.what())));
    return work;
  }
  waiters_->run([this, work, buf, data, sending, what]() mutable {
    std::exception_ptr error;
    try {
      trace::Span span(sending ? "send" : "recv", "comm");
      const bool done = sending ? buf->waitSend(timeout_) : buf->waitRecv(timeout_);
      if (!done) throw CommError(what + ": aborted");
    } catch (const CommError&) {
      error = std::current_exception();
    } catch (const std::exception& e) {
      error = std::make_exception_ptr(failure(what, e.what()));
    }
    // The caller may free the buffer, and the Device it lives on, as soon as the Work completes:
    // let go of it first.
    buf.reset();
    data = Tensor();
    work->finish(error);
  });
  return work;
}

WorkPtr GlooCommunicator::send(Tensor data, int dst, int tag) {
  return point_to_point(true, data, dst, tag);
}
WorkPtr GlooCommunicator::recv(Tensor data, int src, int tag) {
  return point_to_point(false, data, src, tag);
}

// ---- failure -----------------------------------------------------------------------------------

CommError GlooCommunicator::failure(const std::string& what, const std::string& cause) {
  std::lock_guard<std::mutex> lock(fail_mu_);
  if (broken_) return CommError(what + ": the communicator failed: " + *broken_);
  broken_ = diagnose(what, cause);
  diagnosed_ = true;
  is_broken_ = true;
  return CommError(*broken_);
}

// Gloo's tcp transport, when an operation times out, records an error on every pair of the
// context, wakes everything pending on them and closes their sockets. A 1 ms wait for a message
// nobody sends does exactly that on purpose: peers blocked on this rank then fail at once.
void GlooCommunicator::abort_transport() {
  char byte = 0;
  try {
    context_->createUnboundBuffer(&byte, 1)->waitRecv(nullptr, Milliseconds(1));
  } catch (const std::exception&) {
  }
}

std::string GlooCommunicator::diagnose(const std::string& what, const std::string& gloo_cause) {
  const std::string cause = gloo_text(gloo_cause);
  // 1. A note first, so that peers woken by the abort below find this rank alive.
  const std::string note = "rank " + std::to_string(rank()) + " failed in " + what + ": " + cause;
  bool store_ok = true;
  try {
    store_->set(key("failed", rank()), bytes_of(note));
  } catch (const std::exception&) {
    store_ok = false;
  }
  abort_transport();

  // 2. What each connection saw: an error of the peer's side, or only our abort.
  // After the abort every pair holds an error, which any call on it rethrows before doing
  // anything else: the first one recorded, so a peer's error survives our abort.
  std::vector<std::string> broke(static_cast<std::size_t>(size()));
  char byte = 0;
  auto probe = context_->createUnboundBuffer(&byte, 0);
  for (int r = 0; r < size(); ++r) {
    if (r == rank()) continue;
    try {
      probe->send(r, slot(kProbePrefix, 0), 0, 0);
    } catch (const std::exception& e) {
      if (std::strstr(e.what(), kLocalAbortMessage) == nullptr) broke[r] = gloo_text(e.what());
    }
  }

  // 3. Which peers left notes (they are alive), waiting a little for those that have not yet.
  // Polled key by key, so what was seen survives the store going away meanwhile (rank 0 exits).
  std::vector<bool> noted(static_cast<std::size_t>(size()), false);
  noted[rank()] = true;
  bool store_lost = !store_ok;
  if (store_ok) {
    const auto until = Clock::now() + grace();
    for (;;) {
      try {
        for (int r = 0; r < size(); ++r)
          if (!noted[r] && store_->check({key("failed", r)})) noted[r] = true;
      } catch (const std::exception&) {
        store_lost = true;
        break;
      }
      if (std::all_of(noted.begin(), noted.end(), [](bool b) { return b; }) ||
          Clock::now() >= until)
        break;
      std::this_thread::sleep_for(Milliseconds(10));
    }
  }

  // 4. The verdict: a peer whose connection broke and that left no note is gone; one that left
  // no note although its connection held is not responding.
  // A connection that held may only not have recorded the peer's close before our abort: a peer
  // on this host whose process no longer exists is gone all the same.
  std::vector<int> gone, silent;
  for (int r = 0; r < size(); ++r) {
    if (noted[r]) continue;
    (broke[r].empty() && !process_gone(peers_[r]) ? silent : gone).push_back(r);
  }
  gone_ = gone;
  if (store_lost) {
    // Missing notes prove nothing now. When the store was never reachable and its host, rank 0,
    // broke its connection too, rank 0 is the one that went.
    silent.clear();
    if (!store_ok && tcp_store_ && rank() != 0 && !broke[0].empty()) gone = {0};
  }
  std::string verdict;
  const auto describe_all = [&](const std::vector<int>& ranks) {
    std::string s;
    for (std::size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + describe(ranks[i]);
    return s;
  };
  if (!gone.empty()) {
    verdict =
        describe_all(gone) + (gone.size() == 1 ? " is" : " are") +
        " gone: the connection closed without an error report (the process exited, died or was "
        "killed)" +
        (store_ok ? "" : "; the rendezvous store " + store_->address() + " does not answer") +
        " [gloo: " + broke[gone[0]] + "]";
  } else if (!silent.empty()) {
    const bool timed_out = cause.find("Timed out") != std::string::npos;
    verdict =
        describe_all(silent) + (silent.size() == 1 ? " is" : " are") + " not responding: " +
        (timed_out ? "no progress within " + seconds_text(timeout_) + " and " : std::string()) +
        "no error report (hung, stopped, died or far behind?) [gloo: " + cause + "]";
  } else {
    verdict = cause +
              " (every rank reported this operation failing; did all issue the same "
              "collectives with the same sizes?)";
  }
  return what + " failed on rank " + std::to_string(rank()) + ": " + verdict;
}

bool GlooCommunicator::process_gone(const std::string& peer) {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  long pid = 0;
  char peer_host[256] = {};
  if (std::sscanf(peer.c_str(), "pid %ld on %255[^,]", &pid, peer_host) != 2 || pid <= 0) {
    return false;
  }
  if (std::string(peer_host) != host) return false;
  if (::kill(static_cast<pid_t>(pid), 0) != 0) return errno == ESRCH;
  // Killed but not yet reaped by its parent: a zombie, as gone as an exited process.
  std::FILE* stat = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (stat == nullptr) return false;
  char state = 0;
  const bool read = std::fscanf(stat, "%*d (%*[^)]) %c", &state) == 1;
  std::fclose(stat);
  return read && state == 'Z';
}

}  // namespace

CommunicatorPtr make_gloo_communicator(const GlooOptions& options) {
  return std::make_shared<GlooCommunicator>(options);
}

std::optional<GlooOptions> gloo_options_from_env() {
  const auto env = [](const char* name) -> const char* {
    const char* v = std::getenv(name);
    return v != nullptr && *v != '\0' ? v : nullptr;
  };
  const char* rank_var = "HPM_RANK";
  const char* size_var = "HPM_WORLD_SIZE";
  if (env(rank_var) == nullptr || env(size_var) == nullptr) {
    rank_var = "OMPI_COMM_WORLD_RANK";
    size_var = "OMPI_COMM_WORLD_SIZE";
    if (env(rank_var) == nullptr || env(size_var) == nullptr) return std::nullopt;
  }
  const auto integer = [&](const char* name) {
    const std::string v = env(name);
    int out = 0;
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
    if (ec != std::errc() || end != v.data() + v.size()) {
      throw std::invalid_argument(std::string(name) + "='" + v + "' is not an integer");
    }
    return out;
  };
  GlooOptions o;
  o.rank = integer(rank_var);
  o.world_size = integer(size_var);
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size) {
    throw std::invalid_argument(std::string(rank_var) + "=" + std::to_string(o.rank) + " with " +
                                size_var + "=" + std::to_string(o.world_size) +
                                " is not a rank of the group");
  }
  const char* rendezvous = env("HPM_RENDEZVOUS");
  if (rendezvous == nullptr) {
    throw std::invalid_argument(
        std::string(rank_var) + " and " + size_var +
        " are set but HPM_RENDEZVOUS (HOST:PORT or a shared directory) is not");
  }
  o.rendezvous = rendezvous;
  if (const char* host = env("HPM_HOSTNAME")) o.hostname = host;
  if (const char* t = env("HPM_TIMEOUT")) {
    char* end = nullptr;
    const double seconds = std::strtod(t, &end);
    if (end == t || *end != '\0' || !(seconds > 0) || seconds > 1e6) {
      throw std::invalid_argument(std::string("HPM_TIMEOUT='") + t +
                                  "' is not a positive number of seconds");
    }
    o.timeout = Milliseconds(static_cast<std::int64_t>(seconds * 1000.0 + 0.5));
  }
  return o;
}

}  // namespace hpm::comm
