// Stream: an ordered queue of work on one device, and Event: a point in it. Ops are issued to
// their device's stream and return before the work is done on devices that run asynchronously
// (a GPU); the host waits only where it must read a result (Tensor::item, a copy to the host).
// The CPU's stream runs everything inline: issuing is doing, so its events are always complete.
#pragma once
#include <memory>

#include "hpm/tensor/device_id.h"

namespace hpm {

class Event {
 public:
  virtual ~Event() = default;
  // Blocks the host until the work recorded before this event is done.
  virtual void synchronize() = 0;
  virtual bool ready() const = 0;
  // Seconds from `earlier` (of the same stream) to this event, both complete; both must come from
  // Stream::record_timed (std::logic_error otherwise).
  virtual double seconds_since(const Event& earlier) const;
};

class Stream {
 public:
  virtual ~Stream() = default;
  virtual DeviceId device() const = 0;
  // Blocks the host until everything issued so far is done.
  virtual void synchronize() = 0;
  // A point after everything issued so far.
  virtual std::shared_ptr<Event> record() = 0;
  // The same, with a timestamp for Event::seconds_since (a GPU's timed events cost more).
  virtual std::shared_ptr<Event> record_timed() { return record(); }
  // Work issued to this stream from now on starts after `event` (of any stream of the device).
  virtual void wait(const Event& event) = 0;
};

// The stream of a device whose ops complete when they return (the CPU).
class InlineStream final : public Stream {
 public:
  explicit InlineStream(DeviceId device) : device_(device) {}
  DeviceId device() const override { return device_; }
  void synchronize() override {}
  std::shared_ptr<Event> record() override;  // timed: the host's clock when recorded
  void wait(const Event&) override {}

 private:
  DeviceId device_;
};

}  // namespace hpm
