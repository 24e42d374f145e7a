#include "hpm/distribute/ps/coordinator.h"

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "distribute/ps/rpc.h"
#include "hpm/distribute/ps/checkpoint.h"
#include "hpm/io/atomic_file.h"

namespace hpm::distribute::ps {

using Clock = std::chrono::steady_clock;

namespace {

WorkerReport from_proto(const rpc::WorkerStats& s) {
  WorkerReport r;
  r.worker = s.worker();
  r.steps = s.steps();
  r.seconds = s.seconds();
  r.staleness_histogram.assign(s.staleness_histogram().begin(), s.staleness_histogram().end());
  r.pull_ms_p50 = s.pull_ms_p50();
  r.pull_ms_p99 = s.pull_ms_p99();
  r.push_ms_p50 = s.push_ms_p50();
  r.push_ms_p99 = s.push_ms_p99();
  r.failed_tasks = s.failed_tasks();
  return r;
}

}  // namespace

// ---- scheduling state and the Next RPC ----------------------------------------------------------

class Coordinator::Service final : public rpc::Coordinator::Service {
  // Nested, not in the file's anonymous namespace: a member's type must not have internal linkage
  // when the file is compiled inside a unity batch (-Wsubobject-linkage).
  struct WorkerState {
    std::int64_t incarnation = 0;  // 0: never seen
    Clock::time_point last_seen;
    bool alive = false;
    std::int64_t clock = 0;  // tasks done since it (re)joined, for SSP
    bool told_done = false;
    WorkerReport stats;
  };

 public:
  Service(const Cluster& cluster, const CoordinatorOptions& o)
      : cluster_(cluster),
        o_(o),
        parts_(o.mode == Mode::kSync ? cluster.workers : 1),
        total_(o.epochs * o.tasks_per_epoch),
        workers_(static_cast<std::size_t>(cluster.workers)) {
    if (o.tasks_per_epoch < 1 || o.tasks_per_epoch % parts_ != 0)
      throw PsError("tasks_per_epoch must be a positive multiple of the parts per step");
    reset_progress(0, {});
  }

  grpc::Status Next(grpc::ServerContext* ctx, const rpc::NextRequest* req,
                    rpc::NextReply* reply) override {
    if (grpc::Status s = check_token(ctx, cluster_.security.token); !s.ok()) return s;
    const int w = req->worker();
    if (w < 0 || w >= cluster_.workers) {
      return {grpc::StatusCode::INVALID_ARGUMENT, "Next: worker " + std::to_string(w) +
                                                      " not in [0, " +
                                                      std::to_string(cluster_.workers) + ")"};
    }
    std::unique_lock lock(mu_);
    WorkerState& ws = workers_[static_cast<std::size_t>(w)];
    if (ws.incarnation != req->incarnation()) {
      if (ws.incarnation != 0) {
        const auto n = release(w);
        rescheduled_ += n;
        log("worker " + std::to_string(w) + " restarted (new incarnation): " + std::to_string(n) +
            " of its task(s) rescheduled; it rejoins");
      }
      ws.incarnation = req->incarnation();
      ws.alive = false;
    }
    if (!ws.alive) {
      ws.clock = min_live_clock(w);
      ws.alive = true;
    }
    ws.last_seen = Clock::now();
    if (req->has_stats()) ws.stats = from_proto(req->stats());
    if (req->done_task() >= 0) done(w, *req);
    for (int round = 0; round < 2; ++round) {
      if (dispatch(w, reply)) return grpc::Status::OK;
      cv_.wait_for(lock, std::chrono::milliseconds(100));
    }
    reply->set_kind(rpc::NextReply::WAIT);
    return grpc::Status::OK;
  }

  // -- used by the coordinator's loop (all under mu_) --
  void reset_progress(std::int64_t next, const std::vector<std::int64_t>& redo) {
    next_ = next;
    redo_.assign(redo.begin(), redo.end());
    inflight_.clear();
    done_.assign(static_cast<std::size_t>(total_), 0);
    epoch_done_.assign(static_cast<std::size_t>(o_.epochs), 0);
    epoch_loss_.assign(static_cast<std::size_t>(o_.epochs), {0, 0, 0});
    done_count_ = 0;
    for (std::int64_t t = 0; t < next; ++t) {
      if (std::find(redo.begin(), redo.end(), t) != redo.end()) continue;
      done_[static_cast<std::size_t>(t)] = 1;
      ++done_count_;
      ++epoch_done_[static_cast<std::size_t>(t / o_.tasks_per_epoch)];
    }
    frontier_ = 0;
    advance_frontier();
    next_eval_ = 0;
    while (next_eval_ < o_.epochs &&
           epoch_done_[static_cast<std::size_t>(next_eval_)] == o_.tasks_per_epoch)
      ++next_eval_;
    const std::int64_t every =
        o_.checkpoint_every_tasks > 0 ? o_.checkpoint_every_tasks : o_.tasks_per_epoch;
    next_ckpt_ = (done_count_ / every + 1) * every;
    ckpt_due_ = ckpt_pause_ = false;
  }

  // Tasks of workers silent for longer than the heartbeat timeout go back to the queue.
  void check_heartbeats() {
    const auto now = Clock::now();
    for (int w = 0; w < cluster_.workers; ++w) {
      WorkerState& ws = workers_[static_cast<std::size_t>(w)];
      if (!ws.alive || now - ws.last_seen < o_.heartbeat_timeout) continue;
      ws.alive = false;
      const auto n = release(w);
      rescheduled_ += n;
      log("worker " + std::to_string(w) + " silent for " +
          std::to_string(std::chrono::duration<double>(now - ws.last_seen).count()).substr(0, 4) +
          " s: " + std::to_string(n) + " in-flight task(s) rescheduled on the others");
      cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  const Cluster cluster_;
  const CoordinatorOptions o_;
  const int parts_;
  const std::int64_t total_;
  bool ready_ = false, hard_pause_ = false, ckpt_due_ = false, ckpt_pause_ = false;
  bool finished_ = false;
  bool started_ = false;
  Clock::time_point first_task_;
  Clock::time_point start_deadline_;  // when the first task was handed out: the clock's zero
  std::int64_t next_ = 0, frontier_ = 0, done_count_ = 0, next_eval_ = 0, next_ckpt_ = 0;
  std::deque<std::int64_t> redo_;
  std::map<std::int64_t, int> inflight_;
  std::vector<char> done_;
  std::vector<std::int64_t> epoch_done_;
  struct LossSums {
    double loss;
    std::int64_t correct, samples;
  };
  std::vector<LossSums> epoch_loss_;
  std::vector<WorkerState> workers_;
  std::int64_t rescheduled_ = 0, failed_ = 0, duplicate_done_ = 0;

  void log(const std::string& line) {
    if (o_.log) {
      o_.log(line);
    } else {
      std::fprintf(stderr, "coordinator: %s\n", line.c_str());
      std::fflush(stderr);
    }
  }

 private:
  std::int64_t release(int w) {
    std::int64_t n = 0;
    for (auto it = inflight_.begin(); it != inflight_.end();) {
      if (it->second == w) {
        redo_.push_front(it->first);
        it = inflight_.erase(it);
        ++n;
      } else {
        ++it;
      }
    }
    return n;
  }

  std::int64_t min_live_clock(int except) const {
    std::int64_t m = -1;
    for (int v = 0; v < cluster_.workers; ++v) {
      const WorkerState& s = workers_[static_cast<std::size_t>(v)];
      if (v == except || !s.alive) continue;
      m = m < 0 ? s.clock : std::min(m, s.clock);
    }
    return std::max<std::int64_t>(m, 0);
  }

  void advance_frontier() {
    while (frontier_ < total_ && done_[static_cast<std::size_t>(frontier_)]) ++frontier_;
  }

  void done(int w, const rpc::NextRequest& req) {
    const std::int64_t t = req.done_task();
    const auto it = inflight_.find(t);
    const bool mine = it != inflight_.end() && it->second == w;
    if (req.failed()) {
      if (mine) {
        inflight_.erase(it);
        redo_.push_front(t);
        ++failed_;
        cv_.notify_all();
      }
      return;
    }
    if (mine) inflight_.erase(it);
    if (t >= total_) return;
    if (done_[static_cast<std::size_t>(t)]) {
      ++duplicate_done_;
      return;
    }
    done_[static_cast<std::size_t>(t)] = 1;
    ++done_count_;
    const auto e = static_cast<std::size_t>(t / o_.tasks_per_epoch);
    ++epoch_done_[e];
    epoch_loss_[e].loss += req.loss_sum();
    epoch_loss_[e].correct += req.correct();
    epoch_loss_[e].samples += req.samples();
    ++workers_[static_cast<std::size_t>(w)].clock;
    if (auto r = std::find(redo_.begin(), redo_.end(), t); r != redo_.end()) redo_.erase(r);
    advance_frontier();
    if (!o_.checkpoint_dir.empty() && done_count_ >= next_ckpt_) ckpt_due_ = true;
    cv_.notify_all();
  }

  bool dispatch(int w, rpc::NextReply* reply) {
    WorkerState& ws = workers_[static_cast<std::size_t>(w)];
    if (finished_) {
      ws.told_done = true;
      reply->set_kind(rpc::NextReply::DONE);
      return true;
    }
    if (!ready_ || hard_pause_) return false;
    if (!started_) {  // all workers start together (up to ps_wait for one that never comes)
      bool all = true;
      for (const auto& v : workers_) all = all && v.incarnation != 0;
      if (!all && Clock::now() < start_deadline_) return false;
    }
    if (o_.mode == Mode::kSsp && ws.clock - min_live_clock(w) > o_.staleness) return false;
    std::int64_t t = -1;
    if (!redo_.empty()) {
      t = redo_.front();
      redo_.pop_front();
    } else if (next_ < total_) {
      if (ckpt_due_ && next_ % parts_ == 0) {
        ckpt_pause_ = true;
        return false;
      }
      if (o_.mode == Mode::kSync && frontier_ < (next_ / parts_) * parts_) return false;
      // An epoch's evaluation reads the variables as that epoch left them: the next epoch's
      // first task waits until the coordinator has pulled them (next_eval_ moves past it then).
      if (next_ % o_.tasks_per_epoch == 0 && next_ / o_.tasks_per_epoch > next_eval_) return false;
      t = next_++;
    } else {
      return false;
    }
    inflight_[t] = w;
    if (!started_) {
      started_ = true;
      first_task_ = Clock::now();
    }
    const std::int64_t epoch = t / o_.tasks_per_epoch;
    reply->set_kind(rpc::NextReply::RUN);
    reply->set_task(t);
    reply->set_epoch(epoch);
    reply->set_batch(t % o_.tasks_per_epoch);
    reply->set_part(static_cast<int>(t % parts_));
    reply->set_parts(parts_);
    reply->set_step(t / parts_);
    reply->set_lr(o_.lr ? o_.lr(epoch) : o_.optimizer.lr);
    return true;
  }
};

// ---- the coordinator's loop -------------------------------------------------------------------

struct Coordinator::Impl {
  Cluster cluster;
  CoordinatorOptions o;
  nn::NamedTensors vars, initial;
  std::unique_ptr<PsClient> client;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  std::vector<std::int64_t> incarnations;
  CoordinatorReport report;
  Clock::time_point start;

  std::string latest() const {
    const std::string f = o.checkpoint_dir + "/latest";
    if (o.checkpoint_dir.empty() || !std::filesystem::exists(f)) return "";
    std::string name = io::read_file(f);
    while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
    return o.checkpoint_dir + "/" + name;
  }

  // Every shard from `dir` (checksums verified), or the initial variables when dir is empty.
  // Returns (next task, tasks to redo).
  std::pair<std::int64_t, std::vector<std::int64_t>> load_shards(const std::string& dir,
                                                                 int parts) {
    if (dir.empty()) {
      client->init(initial, o.optimizer, o.mode == Mode::kSync ? parts : 0,
                   std::vector<std::int64_t>(cluster.ps.size(), 0));
      return {0, {}};
    }
    const PsCheckpoint c = read_ps_checkpoint(dir);
    // The shards' versions count this job's steps only if it counts them as the writer did: a sync
    // job continued with more workers took every push of the next epoch for a duplicate (and
    // dropped it, reporting success), with fewer it refused them all.
    const auto differs = [&](const std::string& what, const std::string& then,
                             const std::string& now) {
      throw PsError("checkpoint " + dir + " was written by a job with " + what + " " + then +
                    ", this job has " + now +
                    ": continuing would count its steps differently and drop or refuse updates; "
                    "continue with the same settings, or start in another checkpoint_dir");
    };
    if (!c.mode.empty() && c.mode != mode_name(o.mode)) differs("mode", c.mode, mode_name(o.mode));
    if (c.parts > 0 && c.parts != parts) {
      differs("steps of", std::to_string(c.parts) + " parts (its sync workers)",
              std::to_string(parts));
    }
    if (c.tasks_per_epoch > 0 && c.tasks_per_epoch != o.tasks_per_epoch) {
      differs("epochs of", std::to_string(c.tasks_per_epoch) + " tasks (batches)",
              std::to_string(o.tasks_per_epoch) + " (another batch size or data set?)");
    }
    if (c.versions.size() != cluster.ps.size()) {
      throw PsError("checkpoint " + dir + " has " + std::to_string(c.versions.size()) +
                    " shards, the cluster " + std::to_string(cluster.ps.size()) +
                    " parameter-server tasks");
    }
    nn::NamedTensors restored;
    for (const auto& [name, t] : initial) {
      const auto it = c.variables.find(name);
      if (it == c.variables.end())
        throw PsError("checkpoint " + dir + " has no variable '" + name + "'");
      restored.emplace_back(name, it->second);
    }
    client->init(restored, o.optimizer, o.mode == Mode::kSync ? parts : 0, c.versions,
                 c.optimizer_state);
    return {c.next_task, c.redo};
  }

  void save_checkpoint(std::int64_t next, const std::vector<std::int64_t>& redo) {
    const int parts = o.mode == Mode::kSync ? cluster.workers : 1;  // as the scheduler's
    char name[32];
    std::snprintf(name, sizeof name, "ckpt-%010lld", static_cast<long long>(next));
    const std::string dir = o.checkpoint_dir + "/" + name;
    io::ensure_directory(dir);
    const std::vector<ShardSave> saved = client->save(dir);
    nlohmann::json m{{"next_task", next},
                     {"redo", redo},
                     {"mode", mode_name(o.mode)},
                     {"parts", parts},
                     {"tasks_per_epoch", o.tasks_per_epoch},
                     {"metadata", o.metadata}};
    m["shards"] = nlohmann::json::array();
    for (const auto& s : saved) {
      m["shards"].push_back({{"file", std::filesystem::path(s.file).filename().string()},
                             {"crc32c", s.crc32c},
                             {"version", s.version}});
    }
    io::write_file_atomic(dir + "/manifest.json", m.dump(2) + "\n");
    const std::string previous = std::filesystem::path(latest()).filename().string();
    io::write_file_atomic(o.checkpoint_dir + "/latest", std::string(name) + "\n");
    ++report.checkpoints;
    // Keep the previous one too, until the next is complete. Compared by name: the paths the
    // listing gives differ in spelling from those built here ("ps/" + "/ckpt-..." is not the
    // listing's "ps/ckpt-..."), and a comparison of paths deleted the new one and the previous.
    // Only a ckpt-<digits> directory a job made, and only what it holds, by name (hpm deletes only
    // files it wrote).
    const auto is_ckpt_name = [](const std::string& n) {
      return n.size() > 5 && n.rfind("ckpt-", 0) == 0 &&
             n.find_first_not_of("0123456789", 5) == std::string::npos;
    };
    for (const auto& e : std::filesystem::directory_iterator(o.checkpoint_dir)) {
      const std::string n = e.path().filename().string();
      if (e.is_directory() && !e.is_symlink() && is_ckpt_name(n) && n != name && n != previous &&
          std::filesystem::exists(e.path() / "manifest.json"))
        remove_ps_checkpoint(e.path().string());
    }
  }

  // Waits until every task answers; PsError naming those that do not within o.ps_wait.
  std::vector<ShardStatus> wait_for_shards() {
    const auto deadline = Clock::now() + o.ps_wait;
    for (;;) {
      std::vector<ShardStatus> st = client->status(std::chrono::milliseconds(1000));
      std::string missing;
      for (const auto& s : st) {
        // A refused token is refused again: waiting would only hide it as "unreachable".
        if (s.refused) {
          throw PsError(
              "authentication failed: a parameter-server task refused the "
              "coordinator's token (" +
              s.error +
              "); every process of the job needs the same token ([cluster] token_file "
              "or HPM_PS_TOKEN)");
        }
        if (!s.reachable) missing += (missing.empty() ? "" : "; ") + s.error;
      }
      if (missing.empty()) return st;
      if (Clock::now() > deadline) {
        throw PsError("parameter-server tasks unreachable for " +
                      std::to_string(o.ps_wait.count() / 1000) + " s: " + missing);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  }

  void remember_incarnations() {
    incarnations.clear();
    for (const auto& s : wait_for_shards()) incarnations.push_back(s.incarnation);
  }
};

Coordinator::Coordinator(const Cluster& cluster, const CoordinatorOptions& options,
                         nn::NamedTensors vars, const std::string& address)
    : service_(std::make_unique<Service>(cluster, options)), impl_(std::make_unique<Impl>()) {
  impl_->cluster = cluster;
  impl_->o = options;
  impl_->vars = std::move(vars);
  std::vector<std::string> names;
  std::vector<std::int64_t> numels;
  for (const auto& [name, t] : impl_->vars) {
    names.push_back(name);
    numels.push_back(t.numel());
    impl_->initial.emplace_back(name, t.clone());
  }
  impl_->client = std::make_unique<PsClient>(cluster, names, numels);
  impl_->server = start_server(cluster, address, {service_.get()}, &impl_->port);
}

Coordinator::~Coordinator() {
  impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
}

int Coordinator::port() const { return impl_->port; }

CoordinatorReport Coordinator::run() {
  Impl& m = *impl_;
  Service& s = *service_;
  m.start = Clock::now();
  m.wait_for_shards();
  {
    const std::string dir = m.latest();
    auto [next, redo] = m.load_shards(dir, s.parts_);
    m.remember_incarnations();
    std::lock_guard lock(s.mu_);
    s.reset_progress(next, redo);
    if (!dir.empty()) {
      m.report.restored_from = dir;
      s.log("continuing from checkpoint " + dir + " (task " + std::to_string(next) + " of " +
            std::to_string(s.total_) + ")");
    }
    s.ready_ = true;
    s.start_deadline_ = Clock::now() + m.o.ps_wait;
    s.cv_.notify_all();
  }
  auto last_health = Clock::now();
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::unique_lock lock(s.mu_);
    s.check_heartbeats();
    // A consistent point: nothing in flight, the queue drained up to a step boundary.
    bool suspect = false;  // a call to the parameter servers failed: check them now
    if (s.ckpt_pause_ && s.inflight_.empty() && s.redo_.empty()) {
      const std::int64_t next = s.next_;
      lock.unlock();
      try {
        m.save_checkpoint(next, {});
      } catch (const std::exception& e) {
        s.log(std::string("checkpoint at task ") + std::to_string(next) + " failed: " + e.what());
        suspect = true;
      }
      lock.lock();
      s.ckpt_due_ = s.ckpt_pause_ = false;
      const std::int64_t every =
          m.o.checkpoint_every_tasks > 0 ? m.o.checkpoint_every_tasks : m.o.tasks_per_epoch;
      s.next_ckpt_ = (s.done_count_ / every + 1) * every;
      s.cv_.notify_all();
    }
    if (s.next_eval_ < m.o.epochs &&
        s.epoch_done_[static_cast<std::size_t>(s.next_eval_)] == m.o.tasks_per_epoch) {
      EpochReport e;
      e.epoch = s.next_eval_;  // advanced once pulled: until then the next epoch waits (dispatch)
      const auto& sums = s.epoch_loss_[static_cast<std::size_t>(e.epoch)];
      e.train_loss = sums.samples > 0 ? sums.loss / static_cast<double>(sums.samples) : 0;
      e.train_accuracy = sums.samples > 0
                             ? static_cast<double>(sums.correct) / static_cast<double>(sums.samples)
                             : 0;
      e.seconds = std::chrono::duration<double>(Clock::now() - s.first_task_).count();
      lock.unlock();
      bool pulled = true;
      try {
        m.client->pull(m.vars);
      } catch (const PsError& err) {
        s.log(std::string("evaluation of epoch ") + std::to_string(e.epoch + 1) +
              " postponed: " + err.what());
        pulled = false;
        suspect = true;
      }
      if (pulled) {
        if (m.o.on_epoch) m.o.on_epoch(e);
        m.report.epochs.push_back(e);
      }
      lock.lock();
      if (pulled) {
        ++s.next_eval_;
        s.cv_.notify_all();
      }
    }
    if (s.done_count_ == s.total_ && s.next_eval_ == m.o.epochs) {
      if (!m.o.checkpoint_dir.empty()) {  // the end state, for a job that asks for more epochs
        lock.unlock();
        m.save_checkpoint(s.total_, {});
        lock.lock();
      }
      s.finished_ = true;
      s.cv_.notify_all();
      m.report.seconds = std::chrono::duration<double>(Clock::now() - s.first_task_).count();
      break;
    }
    if (!suspect && Clock::now() - last_health < std::chrono::milliseconds(500)) continue;
    lock.unlock();
    last_health = Clock::now();
    std::string lost;
    const auto st = m.client->status(std::chrono::milliseconds(1000));
    for (std::size_t t = 0; t < st.size() && lost.empty(); ++t) {
      if (!st[t].reachable) {
        lost = "task " + std::to_string(t) + " unreachable (" + st[t].error + ")";
      } else if (st[t].incarnation != m.incarnations[t] || !st[t].initialized) {
        lost = "task " + std::to_string(t) + " at " + m.cluster.ps[t] + " restarted empty";
      }
    }
    if (lost.empty()) continue;
    s.log("parameter server lost: " + lost + "; workers paused");
    {
      std::lock_guard l(s.mu_);
      s.hard_pause_ = true;
    }
    m.wait_for_shards();
    // Let in-flight tasks finish or fail (their pushes to the lost task fail within the deadline).
    for (;;) {
      std::lock_guard l(s.mu_);
      s.check_heartbeats();
      if (s.inflight_.empty()) break;
      s.cv_.notify_all();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    const std::string dir = m.latest();
    auto [next, redo] = m.load_shards(dir, s.parts_);
    m.remember_incarnations();
    ++m.report.ps_restores;
    std::lock_guard l(s.mu_);
    const std::int64_t lost_tasks = s.done_count_ - (next - static_cast<std::int64_t>(redo.size()));
    s.reset_progress(next, redo);
    s.hard_pause_ = false;
    s.log("restored all " + std::to_string(m.cluster.ps.size()) + " shards from " +
          (dir.empty() ? std::string("the initial variables (no checkpoint yet)") : dir) +
          " at task " + std::to_string(next) + "; " + std::to_string(lost_tasks) +
          " completed task(s) will run again");
    // Epochs already reported stay reported.
    s.next_eval_ =
        std::max<std::int64_t>(s.next_eval_, static_cast<std::int64_t>(m.report.epochs.size()));
    s.cv_.notify_all();
  }
  // Until every worker has heard DONE (one that never came, or went silent, is waited for up to
  // the heartbeat timeout), so none is left calling a coordinator that is gone.
  const auto deadline = Clock::now() + m.o.heartbeat_timeout;
  for (;;) {
    {
      std::lock_guard lock(s.mu_);
      s.check_heartbeats();
      bool all = true;
      for (const auto& w : s.workers_)
        all = all && (w.told_done || (w.incarnation != 0 && !w.alive));
      if (all || Clock::now() > deadline) {
        m.report.tasks = s.total_;
        m.report.rescheduled = s.rescheduled_;
        m.report.failed = s.failed_;
        m.report.duplicate_done = s.duplicate_done_;
        for (const auto& w : s.workers_) m.report.workers.push_back(w.stats);
        break;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (m.o.shutdown_servers) m.client->shutdown();
  return m.report;
}

}  // namespace hpm::distribute::ps
