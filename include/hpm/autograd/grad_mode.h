// Grad mode: thread-local switch that turns graph recording off (torch.no_grad()).
#pragma once

namespace hpm::autograd {

bool grad_enabled();
void set_grad_enabled(bool on);

class NoGradGuard {
 public:
  NoGradGuard() : prev_(grad_enabled()) { set_grad_enabled(false); }
  ~NoGradGuard() { set_grad_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

}  // namespace hpm::autograd

namespace hpm {
using autograd::NoGradGuard;
}
