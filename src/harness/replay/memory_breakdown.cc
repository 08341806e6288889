// src/harness/replay/memory_breakdown.cc — counting where the bytes are (harness/replay/memory_breakdown.h).
#include "harness/replay/memory_breakdown.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace bucketalloc::harness {
namespace {

// The free bytes of one large-pool span: (in units shared with a live block, in units of none).
std::pair<std::size_t, std::size_t> FreeOfSpan(const MemorySpan& span) {
  std::size_t shared = 0, whole = 0;
  if (span.unit == 0) {
    const bool any_live = std::any_of(span.blocks.begin(), span.blocks.end(), [](const auto& b) { return b.live; });
    for (const MemorySpan::Block& b : span.blocks) {
      if (!b.live) (any_live ? shared : whole) += b.size;
    }
    return {shared, whole};
  }
  // Blocks tile the span, so a unit wholly inside a free block holds no live byte: only the units at
  // a free block's two ends can, and they hold one iff a live block begins or ends in them.
  const std::size_t u = span.unit;
  absl::flat_hash_set<std::uintptr_t> live_units;
  for (const MemorySpan::Block& b : span.blocks) {
    if (!b.live || b.size == 0) continue;
    live_units.insert(b.ptr / u);
    live_units.insert((b.ptr + b.size - 1) / u);
  }
  for (const MemorySpan::Block& b : span.blocks) {
    if (b.live || b.size == 0) continue;
    const std::uintptr_t end = b.ptr + b.size;
    const std::uintptr_t first = b.ptr / u, last = (end - 1) / u;
    auto bytes_in = [&](std::uintptr_t unit) {
      return std::min<std::uintptr_t>(end, (unit + 1) * u) - std::max<std::uintptr_t>(b.ptr, unit * u);
    };
    std::size_t in_shared = 0;
    if (live_units.contains(first)) in_shared += bytes_in(first);
    if (last != first && live_units.contains(last)) in_shared += bytes_in(last);
    shared += in_shared;
    whole += b.size - in_shared;
  }
  return {shared, whole};
}

double Over(std::size_t part, std::size_t peak_live) {
  return peak_live == 0 ? 0.0 : static_cast<double>(part) / static_cast<double>(peak_live);
}

}  // namespace

MemoryBreakdown BreakDown(absl::Span<const MemorySpan> spans, std::size_t reserved) {
  MemoryBreakdown m;
  m.reserved = reserved;
  std::size_t described = 0;
  for (const MemorySpan& span : spans) {
    described += span.size;
    for (const MemorySpan::Block& b : span.blocks) {
      if (!b.live) {
        if (span.small_pool) m.free_small_pool += b.size;
        continue;
      }
      const std::size_t asked = std::min(b.requested, b.size);
      m.live_requested += asked;
      m.live_rounding += b.size - asked;
    }
    if (!span.small_pool) {
      const auto [shared, whole] = FreeOfSpan(span);
      m.free_shared_with_live += shared;
      m.free_whole_units += whole;
    }
  }
  m.other = reserved - std::min(reserved, described);
  return m;
}

std::string MemoryBreakdown::ToJson(std::size_t peak_live) const {
  const std::pair<const char*, std::size_t> parts[] = {
      {"live_requested", live_requested},     {"live_rounding", live_rounding},
      {"free_small_pool", free_small_pool},   {"free_shared_with_live", free_shared_with_live},
      {"free_whole_units", free_whole_units}, {"other", other}};
  nlohmann::ordered_json j = {{"reserved_bytes", reserved}};
  for (const auto& [name, bytes] : parts) j[absl::StrCat(name, "_bytes")] = bytes;
  j["over_peak_live"] = nlohmann::ordered_json::object();
  j["over_peak_live"]["reserved"] = Over(reserved, peak_live);
  for (const auto& [name, bytes] : parts) j["over_peak_live"][name] = Over(bytes, peak_live);
  return j.dump();
}

std::string MemoryBreakdown::Text(std::size_t peak_live) const {
  return absl::StrFormat(
      "live %.4f, rounding %.4f, free: small pool %.4f, shared with live %.4f, whole units %.4f, other %.4f",
      Over(live_requested, peak_live), Over(live_rounding, peak_live), Over(free_small_pool, peak_live),
      Over(free_shared_with_live, peak_live), Over(free_whole_units, peak_live), Over(other, peak_live));
}

}  // namespace bucketalloc::harness
