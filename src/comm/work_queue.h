// WorkQueue: one background thread that runs a communicator's collectives in the order they were
// issued (every rank issues them in the same order, so the queues advance in lockstep), as
// PyTorch's ProcessGroupGloo does. Each job finishes its Work with its result.
#pragma once
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "hpm/comm/communicator.h"

namespace hpm::comm {

class WorkQueue {
 public:
  explicit WorkQueue(std::string thread_name);
  ~WorkQueue();  // runs what is queued, then joins
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  // Queues `job`; the returned Work completes when it returns, or fails with what it throws
  // (anything not a CommError is wrapped in one, prefixed with `what`).
  WorkPtr submit(std::string what, std::function<void()> job);

 private:
  void run();

  std::string name_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<WorkPtr, std::function<void()>>> jobs_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace hpm::comm
