// Index checks that do not stop the host. A kernel that validates indices (an embedding's, a
// cross-entropy's labels) records the first bad position in a device word (atomicMin). Waiting
// for that word at the op would cost a synchronization per check, several per training step;
// instead the op registers the check with its device, and the host reads every pending word the
// next time it copies something from that device (which waits for the device anyway: a step's
// loss and metrics, at its end) and throws the first failure: the std::out_of_range the CPU throws
// at the op itself, naming the op, the position and the value. A bad index in a training step is
// thus an error at that step's end, before its update. Kernels leave what a bad index would have
// read or written alone (a zero row, a skipped update), so nothing strays meanwhile.
//
// Each host thread reads the checks it issued (its copy waited for their kernels); another
// thread's stay pending until that thread copies something from the device.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tensor/backend/cuda/runtime.h"

namespace hpm::cuda {

// A check's device word, held by the op that launches the check's kernel: until the op is done
// with it (this object destroyed, after the launch), no other thread's wait for a free word takes
// the word back, which would read it clear before the kernel could write it and lose the failure.
class IndexCheck {
 public:
  IndexCheck(Context& c, int word) : c_(&c), word_(word) {}
  ~IndexCheck();
  IndexCheck(const IndexCheck&) = delete;
  IndexCheck& operator=(const IndexCheck&) = delete;
  unsigned long long* word() const { return c_->check_words + word_; }

 private:
  Context* c_;
  int word_;
};

// A word (all ones: clear) for a new check on context `c`, which the kernel lowers to the first bad
// position of `values` (I64 on the device); describe(position, value) makes the message. With
// kMaxChecks pending, the launched ones are read first (a wait).
IndexCheck defer_index_check(
    Context& c, const Tensor& values,
    std::function<std::string(std::int64_t position, std::int64_t value)> describe);

// Reads and clears the calling thread's pending checks on `c`, whose stream has run everything
// the thread issued (after its synchronous copy to the host); throws std::out_of_range for the
// first that failed.
void raise_failed_checks(Context& c);

// A pending check as a read begun for the host sees it (host_reads.cpp): the read copies every
// check word behind the values it reads, and judges these checks when it is waited for.
struct CheckRef {
  std::uint64_t id;
  int word;
};
// The checks the calling thread issued on `c` that no read has settled yet.
std::vector<CheckRef> checks_of_this_thread(Context& c);
// Frees those of `refs` still pending, judged by `words` (Context::kMaxChecks words copied after
// their kernels ran); throws std::out_of_range for the first that failed, as raise_failed_checks.
void settle_checks(Context& c, const std::vector<CheckRef>& refs, const unsigned long long* words);

}  // namespace hpm::cuda
