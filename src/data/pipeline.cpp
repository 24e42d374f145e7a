#include "hpm/data/pipeline.h"

#include <stdexcept>

#include "hpm/data/image.h"

namespace hpm::data {

Element augment_element(Element e, const std::vector<AugmentOp>& ops) {
  // e = (image, label, seed)
  Generator gen(static_cast<std::uint64_t>(e[2].data<std::int64_t>()[0]));
  Tensor image = e[0];
  for (const AugmentOp& op : ops) {
    if (op.op == "random_crop") {
      image = random_crop(image, op.padding, op.height, op.width, gen);
    } else if (op.op == "random_flip") {
      image = random_flip_left_right(image, gen);
    } else if (op.op == "normalize") {
      image = normalize(image, op.mean, op.std);
    } else if (op.op == "resize") {
      image = resize_bilinear(image, op.height, op.width);
    }
  }
  return {image, e[1]};
}

Dataset build_pipeline(const LabelledData& data, const PipelineSpec& spec) {
  for (const AugmentOp& op : spec.augment) {
    if (op.op != "random_crop" && op.op != "random_flip" && op.op != "normalize" && op.op != "resize") {
      throw std::invalid_argument("unknown augmentation op '" + op.op +
                                  "' (known: random_crop, random_flip, normalize, resize)");
    }
    if ((op.op == "random_crop" || op.op == "resize") && (op.height <= 0 || op.width <= 0)) {
      throw std::invalid_argument(op.op + " needs a positive size");
    }
    if (op.op == "normalize" && (op.mean.empty() || op.std.empty())) {
      throw std::invalid_argument("normalize needs mean and std");
    }
  }
  Dataset d = Dataset::from_tensor_slices({data.inputs, data.labels});
  if (spec.cache) d = d.cache();
  if (spec.shuffle_buffer != 0) {
    d = d.shuffle(spec.shuffle_buffer < 0 ? std::max<std::int64_t>(1, data.size()) : spec.shuffle_buffer,
                  spec.seed);
  }
  if (!spec.augment.empty()) {
    const std::vector<AugmentOp> ops = spec.augment;
    d = Dataset::zip({d, Dataset::random(spec.seed)})
            .map([ops](Element e) { return augment_element(std::move(e), ops); },
                 MapOptions{spec.parallel_calls, spec.deterministic});
  }
  d = d.batch(spec.batch_size, spec.drop_remainder);
  if (spec.prefetch != 0) d = d.prefetch(spec.prefetch);
  return d;
}

}  // namespace hpm::data
