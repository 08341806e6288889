// src/frontend/observability/snapshot_json.cc — the memory snapshot in the JSON layout of
// torch.cuda.memory._snapshot().
#include "bucketalloc/snapshot.h"

#include "bucketalloc/options.h"
#include "nlohmann/json.hpp"

namespace bucketalloc {

absl::string_view BlockStateName(BlockSnapshotState state) {
  switch (state) {
    case BlockSnapshotState::kActiveAllocated:
      return "active_allocated";
    case BlockSnapshotState::kActivePendingFree:
      return "active_pending_free";
    case BlockSnapshotState::kInactive:
      return "inactive";
  }
  return "inactive";
}

absl::string_view TraceActionName(TraceAction action) {
  switch (action) {
    case TraceAction::kAlloc:
      return "alloc";
    case TraceAction::kFreeRequested:
      return "free_requested";
    case TraceAction::kFreeCompleted:
      return "free_completed";
    case TraceAction::kSegmentAlloc:
      return "segment_alloc";
    case TraceAction::kSegmentFree:
      return "segment_free";
    case TraceAction::kSegmentMap:
      return "segment_map";
    case TraceAction::kSegmentUnmap:
      return "segment_unmap";
    case TraceAction::kOom:
      return "oom";
  }
  return "alloc";
}

namespace {

using Json = nlohmann::ordered_json;

std::string Str(absl::string_view s) { return std::string(s); }

}  // namespace

// The frames of an active block or a trace entry: bucketalloc records no stack, and says so in
// one frame, where PyTorch's memory_viz would otherwise claim the block "was allocated before
// _record_history was enabled".
Json NoStackFrames() {
  return Json::array(
      {{{"name", "<bucketalloc recorded no stack for this allocation>"}, {"filename", "<bucketalloc>"}, {"line", 0}}});
}

std::string SnapshotToJson(const MemorySnapshot& snapshot) {
  Json segments = Json::array();
  for (const SegmentSnapshot& s : snapshot.segments) {
    Json blocks = Json::array();
    for (const BlockSnapshot& b : s.blocks) {
      blocks.push_back({{"address", b.address},
                        {"size", b.size},
                        {"requested_size", b.requested_size},
                        {"state", Str(BlockStateName(b.state))},
                        {"frames", b.state == BlockSnapshotState::kInactive ? Json::array() : NoStackFrames()}});
    }
    Json segment = {{"device", s.device},
                    {"address", s.address},
                    {"total_size", s.total_size},
                    {"allocated_size", s.allocated_size},
                    {"active_size", s.active_size},
                    {"requested_size", s.requested_size},
                    {"stream", s.stream},
                    {"segment_type", s.small ? "small" : "large"},
                    {"segment_pool_id", Json::array({s.pool_id.first, s.pool_id.second})},
                    {"is_expandable", s.expandable},
                    {"tier", s.tier},
                    {"frames", Json::array()},
                    {"blocks", std::move(blocks)}};
    if (!s.tenant.empty()) segment["tenant"] = s.tenant;
    segments.push_back(std::move(segment));
  }
  Json traces = Json::array();
  for (const std::vector<TraceEntry>& device : snapshot.device_traces) {
    Json entries = Json::array();
    for (const TraceEntry& e : device) {
      Json j = {{"action", Str(TraceActionName(e.action))}};
      if (e.action == TraceAction::kOom) {
        j["device_free"] = e.device_free;
      } else {
        j["addr"] = e.addr;
      }
      j["size"] = e.size;
      j["stream"] = e.stream;
      j["time_us"] = e.time_us;
      j["pool_id"] = Json::array({e.pool.first, e.pool.second});
      j["frames"] = NoStackFrames();
      entries.push_back(std::move(j));
    }
    traces.push_back(std::move(entries));
  }
  const bool unlimited = snapshot.max_split_size == kUnlimited;
  Json settings = {
      {"BUCKETALLOC_CONF", snapshot.settings},
      {"max_split_size", unlimited ? std::int64_t{-1} : static_cast<std::int64_t>(snapshot.max_split_size)},
      {"garbage_collection_threshold", snapshot.garbage_collection_threshold},
      {"expandable_segments", false},
      {"release_lock_on_cudamalloc", false}};
  return Json{{"segments", std::move(segments)},
              {"device_traces", std::move(traces)},
              {"allocator_settings", std::move(settings)}}
      .dump();
}

}  // namespace bucketalloc
