// src/harness/replay/driver_meter.h — who pays for a replay's driver calls, and when (layer L5).
//
// Owns: `DriverMeter`, which prices every driver call a replay's allocator makes (a CostModel) and
// tells the calls a request waits for from those done off its path, and those made while reserved
// memory grows to its peak from those after; `MeterBackend`, the backend decorator that reports each
// call to it; and `DriverTime`, the figures (the JSON's "driver_time").
//
// A request is one allocation or free of the trace: a call the replay's thread makes between
// BeginRequest and EndRequest is on that request's path. A call made outside a request (the
// allocator's construction, or a thread of the allocator's own) is background. Calls after Stop()
// (the allocator's teardown, which a service never reaches) are not counted.
// A synchronization is a cudaFree (it synchronizes the device; its stall is part of its price) or an
// explicit stream, event or device synchronization (priced as the profile's `synchronize`): what an
// allocator pays to unmap or release memory that queued work may still use.
// Thread-safety: Charge may be called from any thread (a mutex); the rest from the replay's thread.
//
// Example:
//   DriverMeter meter(costs);
//   std::unique_ptr<Backend> b = MeterBackend(std::move(backend), &meter);
//   meter.BeginRequest(); ...Allocate through b...; meter.EndRequest();
//   DriverTime t = meter.Summary();
#ifndef BUCKETALLOC_HARNESS_REPLAY_DRIVER_METER_H_
#define BUCKETALLOC_HARNESS_REPLAY_DRIVER_METER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bucketalloc/backend.h"
#include "harness/replay/driver_costs.h"
#include "nlohmann/json.hpp"

namespace bucketalloc::harness {

// What a replay's driver calls cost under a profile (the JSON's "driver_time").
struct DriverTime {
  std::string profile;
  double total_ms = 0.0;         // every call, priced
  double request_path_ms = 0.0;  // the calls requests waited for (inside an allocation or free)
  double background_ms = 0.0;    // the calls made off any request's path
  double warmup_ms = 0.0;        // until the first event after which reserved bytes are at their peak (included)
  double steady_ms = 0.0;        // after it
  // Over the requests that called the driver: the 99th percentile and the most one waited.
  double p99_request_us = 0.0;
  double max_request_us = 0.0;
  std::uint64_t requests_calling_driver = 0;
  std::uint64_t synchronizations = 0;         // cudaFree calls and explicit synchronizations
  std::uint64_t steady_synchronizations = 0;  // of them, after the warmup
  nlohmann::ordered_json ToJson() const;
};

class DriverMeter {
 public:
  explicit DriverMeter(CostModel costs) : costs_(std::move(costs)) {}
  DriverMeter(const DriverMeter&) = delete;
  DriverMeter& operator=(const DriverMeter&) = delete;

  const CostModel& costs() const { return costs_; }
  // One call of `bytes` (MeterBackend's); `synchronizes`: it waits for queued work.
  void Charge(DriverCall call, std::size_t bytes, bool synchronizes = false);
  // A request of the trace starts on this thread; EndRequest ends it and returns whether it called
  // the driver (any call, a free one included).
  void BeginRequest();
  bool EndRequest();
  // The reserved bytes after an event (the replay tells it after every event that called the
  // driver: reserved memory changes only through the driver): the warmup ends at their peak.
  void NoteReserved(std::size_t reserved);
  // Calls from now on are not counted.
  void Stop();
  DriverTime Summary() const;

 private:
  struct Totals {
    double request_us = 0.0;
    double background_us = 0.0;
    std::uint64_t synchronizations = 0;
  };
  const CostModel costs_;
  mutable std::mutex mu_;
  bool stopped_ = false;
  bool in_request_ = false;
  std::thread::id request_thread_;
  double request_us_ = 0.0;          // of the request now running
  std::uint64_t request_calls_ = 0;  // of the request now running
  Totals totals_;
  Totals at_peak_;  // totals_ when reserved bytes last reached a new peak
  std::size_t peak_reserved_ = 0;
  std::vector<double> request_costs_;  // one per request that called the driver, in microseconds
};

// `inner`, with every memory call and synchronization reported to `meter` (which must outlive it).
// Events, queries and IPC are passed through unpriced. As every Backend, it is called under its
// device's lock (bucketalloc/backend.h): its handle sizes and MapRun's counter deltas rely on that.
std::unique_ptr<Backend> MeterBackend(std::unique_ptr<Backend> inner, DriverMeter* meter);

}  // namespace bucketalloc::harness

#endif  // BUCKETALLOC_HARNESS_REPLAY_DRIVER_METER_H_
