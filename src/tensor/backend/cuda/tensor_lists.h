// The packing of a multi-tensor kernel's tensors into lists passed by value as its argument (the
// Adam step, the squared norm, the bf16 copies): a list holds up to kCapacity tensors, each cut
// into blocks of kChunk elements, and says where each tensor's blocks start, so that block b of a
// launch finds its tensor and chunk. Host code, for the launchers and their emulated tests.
#pragma once
#include <cstdint>

namespace hpm::cuda {

// Packs tensors into Lists (n[t], first_block[t], count, and the op's pointers, which set(list, t)
// stores) as a launcher walks them, handing each full list, and the last, to launch(list, blocks):
// at most kCapacity tensors and 2^30 blocks a list. An empty tensor is skipped.
template <typename List, int kCapacity, std::int64_t kChunk>
class TensorListPacker {
 public:
  template <typename Set, typename Launch>
  void add(std::int64_t n, Set&& set, Launch&& launch) {
    if (n == 0) return;
    const auto blocks = static_cast<int>((n + kChunk - 1) / kChunk);
    if (l_.count == kCapacity || l_.first_block[l_.count] > (1 << 30) - blocks) flush(launch);
    const int t = l_.count;
    set(l_, t);
    l_.n[t] = n;
    l_.first_block[t + 1] = l_.first_block[t] + blocks;
    l_.count = t + 1;
  }
  template <typename Launch>
  void flush(Launch&& launch) {
    if (l_.count == 0) return;
    launch(l_, static_cast<unsigned>(l_.first_block[l_.count]));
    l_ = List{};
  }

 private:
  List l_{};
};

}  // namespace hpm::cuda
