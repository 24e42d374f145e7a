#include "hpm/train/restart_callbacks.h"

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

namespace hpm::train {

namespace {

class FaultInjector : public Callback {
 public:
  FaultInjector(std::int64_t step, int sig) : step_(step), sig_(sig) {}
  void on_batch_end(Trainer&, const BatchLogs& b) override {
    if (b.global_step != step_) return;
    std::fprintf(stderr, "hpm: fault injection: %s to this worker after global step %lld\n",
                 sig_ == SIGKILL ? "SIGKILL" : "SIGTERM", static_cast<long long>(step_));
    std::fflush(nullptr);
    std::raise(sig_);
  }

 private:
  std::int64_t step_;
  int sig_;
};

}  // namespace

void BackupRestoreReport::on_backup_restored(Trainer& t, const std::string& dir,
                                             const std::vector<std::string>& skipped) {
  for (const auto& s : skipped)
    std::fprintf(stderr, "hpm: warning: unusable backup skipped: %s\n", s.c_str());
  const auto& st = t.state();
  std::fprintf(stderr,
               "hpm: continuing from backup %s (epoch %lld, step %lld of it, global step %lld)\n",
               dir.c_str(), static_cast<long long>(st.epoch + 1),
               static_cast<long long>(st.step_in_epoch), static_cast<long long>(st.global_step));
}

std::shared_ptr<Callback> fault_injector_from_env(int worker_rank) {
  const char* spec = std::getenv("HPM_FAULT_AT_STEP");
  if (spec == nullptr || *spec == '\0') return nullptr;
  const char* restart = std::getenv("HPM_RESTART");
  if (restart != nullptr && std::string(restart) != "0") return nullptr;
  const std::string s(spec);
  const auto first = s.find(':');
  const auto second = first == std::string::npos ? first : s.find(':', first + 1);
  const std::string signal = second == std::string::npos ? "KILL" : s.substr(second + 1);
  if (first == std::string::npos || (signal != "KILL" && signal != "TERM")) {
    throw std::invalid_argument("HPM_FAULT_AT_STEP must be RANK:STEP or RANK:STEP:TERM, got '" + s +
                                "'");
  }
  if (std::stoi(s.substr(0, first)) != worker_rank) return nullptr;
  return std::make_shared<FaultInjector>(std::stoll(s.substr(first + 1, second - first - 1)),
                                         signal == "KILL" ? SIGKILL : SIGTERM);
}

}  // namespace hpm::train
