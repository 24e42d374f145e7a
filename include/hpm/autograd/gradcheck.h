// One gradient-check harness for every differentiable op: analytic gradients from backward()
// against central finite differences. Adding an op to ops.cpp means adding it to op_names() and
// a case to tests/autograd/gradcheck_test.cpp; a test fails while any op is left unchecked.
#pragma once
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "hpm/tensor/tensor.h"

namespace hpm::autograd {

struct GradcheckOptions {
  float eps = 5e-3f;   // finite-difference step
  float atol = 2e-3f;  // |analytic - numeric| <= atol + rtol * |numeric|
  float rtol = 2e-2f;
};

struct GradcheckResult {
  bool ok = true;
  std::string message;  // the first mismatch: input, element, both values
  float max_abs_error = 0.0f;
};

// fn maps the inputs to one output; the scalar checked is sum(output * w) for a fixed random w,
// so every output element contributes. Inputs that do not require grad are held constant.
GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                          const std::vector<Tensor>& inputs, const GradcheckOptions& options = {});

// Names of every node type the ops create, and of those some gradcheck has exercised so far.
const std::vector<std::string>& op_names();
const std::set<std::string>& gradcheck_covered();

}  // namespace hpm::autograd
