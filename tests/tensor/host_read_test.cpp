// HostRead: values read as they were when the read began, whatever later ops do to them; a wait
// counted as one for the device only when nothing was issued after the read began (on a GPU, the
// wait then drains the device); tensors of two devices refused. The GPU's own reads (pinned slots,
// index checks judged by the read that follows them) are tests/cuda's.
#include "hpm/tensor/host_read.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "common/twin_device.h"
#include "hpm/tensor/kernels.h"

namespace hpm {
namespace {

TEST(HostRead, ReadsTheValuesAsTheyWereWhenItBegan) {
  for (Device* device : {&Device::cpu(), &testing::twin_device()}) {
    SCOPED_TRACE(device->id().str());
    Tensor loss = Tensor::scalar(2.5f).to(*device);
    Tensor counts = Tensor::from_i64(std::vector<std::int64_t>{3, 4}, {2}).to(*device);
    HostRead read({loss, counts});
    kernels::scale_(loss, 10.0f);  // issued after: not what the read holds
    const std::vector<Tensor>& host = read.wait();
    ASSERT_EQ(host.size(), 2u);
    EXPECT_EQ(host[0].device().id(), Device::cpu().id());
    EXPECT_EQ(*host[0].data<float>(), 2.5f);
    EXPECT_EQ(host[1].to_vector_i64(), (std::vector<std::int64_t>{3, 4}));
    EXPECT_EQ(&read.wait(), &host) << "a second wait returns the same values";
    EXPECT_EQ(loss.item(), 25.0f);
  }
}

TEST(HostRead, AWaitCountsForTheDeviceOnlyWhenNothingFollowedTheRead) {
  Tensor x = Tensor::ones({4});
  kernels::scale_(x, 2.0f);
  const std::uint64_t before = host_waits_on_this_thread();
  HostRead overlapped({x});
  kernels::scale_(x, 3.0f);  // the device's next work: the read's wait need not wait for it
  overlapped.wait();
  EXPECT_EQ(host_waits_on_this_thread(), before);
  HostRead last({x});
  last.wait();  // nothing after it: on a GPU this waits for everything issued
  EXPECT_EQ(host_waits_on_this_thread(), before + 1);
  (void)x.to_vector();  // nothing issued since
  EXPECT_EQ(host_waits_on_this_thread(), before + 1);
}

TEST(HostRead, TensorsOfTwoDevicesAreRefused) {
  try {
    HostRead read({Tensor::ones({1}), Tensor::ones({1}).to(testing::twin_device())});
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("private:0"), std::string::npos) << e.what();
  }
  HostRead none(std::vector<Tensor>{});
  EXPECT_TRUE(none.empty());
  EXPECT_TRUE(none.wait().empty());
}

}  // namespace
}  // namespace hpm
