// Cutting a Sequential into pipeline chunks. A pipeline runs at the pace of its slowest stage, so
// the cut should balance time; memory bounds it (a stage holds its parameters, their gradients and
// the activations of the micro-batches in flight). As in GPipe and torchgpipe's balance_by_time,
// each layer is profiled on a sample micro-batch, then contiguous blocks are chosen.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "hpm/nn/module.h"
#include "hpm/pipeline/simulator.h"

namespace hpm::pipeline {

struct LayerCost {
  std::string name;                  // "3: Conv2d"
  double forward_s = 0;              // median over repeats, one micro-batch
  double backward_s = 0;             // the whole backward: B and W
  double weight_s = 0;               // its weight-gradient part (W)
  std::size_t parameter_bytes = 0;   // parameters and buffers
  std::size_t activation_bytes = 0;  // kept from forward to backward (incl. the output)
};

// Runs each layer on the output of the previous one, `repeats` times, starting from `sample` (one
// micro-batch of inputs). Times forward and backward separately; activation bytes come from the
// Device's accounting. A layer identical to an earlier one (type, parameter and buffer shapes,
// input and output shapes: a transformer's blocks) takes that one's measured cost.
std::vector<LayerCost> profile_layers(const nn::Sequential& model, const Tensor& sample,
                                      int repeats = 5);

enum class PartitionMethod {
  kUniform,     // equal numbers of layers
  kParameters,  // balance parameter bytes
  kBalanced,    // minimize the slowest part's forward + backward time (dynamic program), within
                // a memory limit if one is given
};
// "uniform", "parameters", "balanced" (also "time"); throws std::invalid_argument.
PartitionMethod partition_from_name(const std::string& name);
const char* partition_name(PartitionMethod m);

struct Partition {
  std::vector<int> boundaries;  // parts + 1 cut points, 0 ... layers
  std::vector<double> time_s;   // per part: forward + backward of one micro-batch
  std::vector<std::size_t> parameter_bytes, activation_bytes;
  double imbalance = 1;  // slowest part's time over the mean
};

// `memory_limit`: a part's parameter bytes * 2 (gradients) + activation bytes * `in_flight` must
// fit (kBalanced only; ignored when 0). Throws std::invalid_argument when there are fewer layers
// than parts, or when no cut fits the limit (naming the smallest limit that would).
Partition partition(const std::vector<LayerCost>& layers, int parts, PartitionMethod method,
                    std::size_t memory_limit = 0, int in_flight = 1);

// What the simulator needs of each chunk of a cut: its layers' profiled times and activation
// bytes added up; resident bytes are the parameters and their gradients, as a stage's Device
// counts them (optimizer state stays on the host device).
std::vector<ChunkCost> chunk_costs(const std::vector<LayerCost>& layers,
                                   const std::vector<int>& boundaries);

// A table of the parts: layers, time, share, parameters, activations; then the imbalance.
std::string describe(const Partition& p, const std::vector<LayerCost>& layers);

}  // namespace hpm::pipeline
