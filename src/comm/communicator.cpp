#include "hpm/comm/communicator.h"

#include <algorithm>
#include <stdexcept>

namespace hpm::comm {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAverage:
      return "average";
    case ReduceOp::kMax:
      return "max";
  }
  return "?";
}

const char* algorithm_name(Algorithm a) {
  switch (a) {
    case Algorithm::kAuto:
      return "auto";
    case Algorithm::kDirect:
      return "direct";
    case Algorithm::kRing:
      return "ring";
    case Algorithm::kRecursiveDoubling:
      return "recursive_doubling";
  }
  return "?";
}

Algorithm algorithm_from_name(const std::string& name) {
  if (name == "auto") return Algorithm::kAuto;
  if (name == "direct") return Algorithm::kDirect;
  if (name == "ring") return Algorithm::kRing;
  if (name == "recursive_doubling" || name == "halving_doubling")
    return Algorithm::kRecursiveDoubling;
  throw std::invalid_argument("unknown all-reduce algorithm '" + name +
                              "' (expected auto, direct, ring or recursive_doubling)");
}

void Work::wait(Milliseconds timeout) {
  timeout = std::min(timeout, limit_);
  if (!wait_for(timeout)) {
    throw CommError(what_ + ": not complete after " + std::to_string(timeout.count()) + " ms");
  }
}

bool Work::wait_for(Milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (timeout == Milliseconds::max()) {
    cv_.wait(lock, [&] { return done_; });
  } else if (!cv_.wait_for(lock, timeout, [&] { return done_; })) {
    return false;
  }
  if (failed_) throw CommError(error_);
  return true;
}

bool Work::completed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

void Work::finish(std::exception_ptr error) {
  // Keep the message, not the exception object: waiters on other threads each throw their own
  // copy, so no exception object is shared between threads.
  std::string message;
  if (error) {
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      message = e.what();
    } catch (...) {
      message = what_ + ": unknown error";
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    failed_ = error != nullptr;
    error_ = std::move(message);
  }
  cv_.notify_all();
}

void Communicator::check_buffer(const Tensor& t, const char* what) {
  if (!t.defined()) throw std::invalid_argument(std::string(what) + ": undefined tensor");
  if (t.dtype() != DType::F32) {
    throw std::invalid_argument(std::string(what) + ": only float32 tensors are supported");
  }
}

void Communicator::check_bytes(const Tensor& t, const char* what) {
  if (!t.defined()) throw std::invalid_argument(std::string(what) + ": undefined tensor");
  if (!t.device().is_host()) {
    throw std::invalid_argument(std::string(what) + ": a tensor on " + t.device().id().str() +
                                "; this communicator moves host memory");
  }
}

void Communicator::check_same_dtype(const Tensor& a, const Tensor& b, const char* what) {
  if (a.dtype() != b.dtype()) {
    throw std::invalid_argument(std::string(what) + ": input " + dtype_name(a.dtype()) +
                                " and output " + dtype_name(b.dtype()) + " differ");
  }
}

void Communicator::check_allreduce_buffer(const Tensor& t, const char* what) {
  if (!t.defined()) throw std::invalid_argument(std::string(what) + ": undefined tensor");
  if (t.dtype() != DType::F32 && t.dtype() != DType::BF16) {
    throw std::invalid_argument(std::string(what) +
                                ": only float32 and bfloat16 tensors are supported");
  }
}

}  // namespace hpm::comm
