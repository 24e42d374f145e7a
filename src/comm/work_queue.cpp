#include "comm/work_queue.h"

#include "hpm/trace/trace.h"

namespace hpm::comm {

WorkQueue::WorkQueue(std::string thread_name) : name_(std::move(thread_name)) {
  thread_ = std::thread([this] { run(); });
}

WorkQueue::~WorkQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

WorkPtr WorkQueue::submit(std::string what, std::function<void()> job) {
  auto work = std::make_shared<Work>(std::move(what));
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.emplace_back(work, std::move(job));
  }
  cv_.notify_one();
  return work;
}

void WorkQueue::run() {
  trace::name_thread(name_);
  for (;;) {
    std::pair<WorkPtr, std::function<void()>> item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      item = std::move(jobs_.front());
      jobs_.pop_front();
    }
    try {
      item.second();
      item.first->finish();
    } catch (const CommError&) {
      item.first->finish(std::current_exception());
    } catch (const std::exception& e) {
      item.first->finish(std::make_exception_ptr(CommError(item.first->what() + ": " + e.what())));
    }
  }
}

}  // namespace hpm::comm
