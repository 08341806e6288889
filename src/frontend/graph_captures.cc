// src/frontend/graph_captures.cc — captures and graph pools (frontend/graph_captures.h).
#include "frontend/graph_captures.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace bucketalloc::internal {

std::uint16_t GraphCaptures::TagFor(Stream stream) const {
  for (auto it = captures_.rbegin(); it != captures_.rend(); ++it) {
    if (it->filter(stream)) return it->tag;
  }
  return 0;
}

absl::StatusOr<std::uint16_t> GraphCaptures::Find(GraphPoolId id, absl::string_view what, int device) const {
  for (std::size_t tag = 1; tag < pools_.size(); ++tag) {
    if (!pools_[tag].released && pools_[tag].id == id) return static_cast<std::uint16_t>(tag);
  }
  return absl::NotFoundError(absl::StrCat("bucketalloc: ", what, " graph pool (", id.first, ", ", id.second,
                                          ") on device ", device, ": no such pool is open (no BeginCapture for it)"));
}

absl::Status GraphCaptures::Begin(GraphPoolId id, CaptureFilter filter, int device) {
  if (!filter) {
    return absl::InvalidArgumentError(absl::StrCat("bucketalloc: BeginCapture on device ", device,
                                                   " needs a stream filter; accepted: a callable that is true for "
                                                   "the capturing stream(s)"));
  }
  absl::StatusOr<std::uint16_t> tag = Find(id, "begin capture into", device);
  if (!tag.ok()) {
    // A new pool: reuse a forgotten slot (released, no blocks), else append one.
    std::size_t slot = 1;
    while (slot < pools_.size() && !(pools_[slot].released && pools_[slot].blocks == 0)) ++slot;
    if (slot == pools_.size()) {
      if (slot > std::numeric_limits<std::uint16_t>::max()) {
        return absl::ResourceExhaustedError(absl::StrCat("bucketalloc: device ", device, " already has ", slot - 1,
                                                         " open graph pools; release some (graph reset) first"));
      }
      pools_.emplace_back();
    }
    pools_[slot] = GraphPool{id, false, 0};
    tag = static_cast<std::uint16_t>(slot);
  }
  captures_.push_back(ActiveCapture{*tag, std::move(filter)});
  return absl::OkStatus();
}

absl::Status GraphCaptures::End(GraphPoolId id, int device) {
  absl::StatusOr<std::uint16_t> tag = Find(id, "end capture into", device);
  if (!tag.ok()) return tag.status();
  auto it = std::find_if(captures_.rbegin(), captures_.rend(), [&](const ActiveCapture& c) { return c.tag == *tag; });
  if (it == captures_.rend()) {
    return absl::FailedPreconditionError(absl::StrCat("bucketalloc: end capture into graph pool (", id.first, ", ",
                                                      id.second, ") on device ", device,
                                                      ": no capture into it is running"));
  }
  captures_.erase(std::next(it).base());
  return absl::OkStatus();
}

absl::StatusOr<bool> GraphCaptures::Release(GraphPoolId id, int device) {
  absl::StatusOr<std::uint16_t> tag = Find(id, "release", device);
  if (!tag.ok()) return false;  // a pool that never captured on this device
  if (Capturing(*tag)) {
    return absl::FailedPreconditionError(absl::StrCat("bucketalloc: release of graph pool (", id.first, ", ", id.second,
                                                      ") on device ", device, ": a capture into it is running"));
  }
  pools_[*tag].released = true;
  return true;
}

bool GraphCaptures::Capturing(std::uint16_t tag) const {
  return std::any_of(captures_.begin(), captures_.end(), [&](const ActiveCapture& c) { return c.tag == tag; });
}

absl::Status GraphCaptures::CheckInvariants(const std::vector<std::int64_t>& blocks_per_tag) const {
  if (blocks_per_tag.size() != pools_.size()) return absl::InternalError("graph pools: a block carries an unknown tag");
  for (const ActiveCapture& c : captures_) {
    if (c.tag == 0 || c.tag >= pools_.size()) return absl::InternalError("graph pools: a capture has no graph pool");
    if (pools_[c.tag].released) return absl::InternalError("a released graph pool is capturing");
  }
  for (std::size_t tag = 1; tag < pools_.size(); ++tag) {
    const GraphPool& g = pools_[tag];
    if (g.blocks != blocks_per_tag[tag]) {
      return absl::InternalError(
          absl::StrCat("graph pool ", tag, " counts ", g.blocks, " blocks but ", blocks_per_tag[tag], " carry it"));
    }
  }
  return absl::OkStatus();
}

}  // namespace bucketalloc::internal
