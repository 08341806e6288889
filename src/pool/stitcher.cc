// src/pool/stitcher.cc — the choice of runs, stream waits, the stitch, and giving back free
// granules (pool/stitcher.h).
#include "pool/stitcher.h"

#include <algorithm>
#include <bit>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "internal/bits.h"
#include "internal/check.h"

namespace bucketalloc::internal {
namespace {

// A run of whole granules [g0, g1) inside a free block, and its age.
struct Run {
  std::uint64_t age;
  std::uintptr_t ptr;
  Block* block;
  std::size_t g0, g1;
  std::size_t granules() const { return g1 - g0; }
  bool tier() const { return block->segment->tier >= 0; }
  Stream stream() const { return block->segment->stream; }
};

template <typename V, typename T>
bool Contains(const V& v, const T& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// Synchronizes each stream once, before the first unmap of its blocks' granules, and remembers
// the ones that could not be synchronized (their blocks' granules must stay) and the last error.
class StreamWaits {
 public:
  explicit StreamWaits(MemorySource* source) : source_(source) {}
  // True when the work queued on `stream` has completed (waiting for it on the first call).
  bool Passed(Stream stream) {
    if (Contains(passed_, stream)) return true;
    if (Contains(failed_, stream)) return false;
    absl::Status s = source_->SynchronizeStream(stream);
    if (s.ok()) {
      passed_.push_back(stream);
      return true;
    }
    failed_.push_back(stream);
    error_ = std::move(s);
    return false;
  }
  absl::Span<const Stream> failed() const { return failed_; }
  const absl::Status& error() const { return error_; }

 private:
  MemorySource* source_;
  absl::InlinedVector<Stream, 4> passed_, failed_;
  absl::Status error_;
};

// Chooses `want` granules from `runs` (oldest first), skipping the runs on `failed` streams, into
// `chosen`; false when there are not enough. A plain run gives its top granules, as many as still
// needed; a tier block goes whole (tier segments are never split), so it is taken in the first
// pass only when all of it is needed, and otherwise at the end: the smallest that covers the rest.
bool ChooseRuns(const std::vector<Run>& runs, std::size_t want, absl::Span<const Stream> failed,
                std::vector<Run>* chosen) {
  chosen->clear();
  std::vector<bool> used(runs.size());
  std::size_t got = 0;
  for (std::size_t i = 0; i < runs.size() && got < want; ++i) {
    Run r = runs[i];
    if (Contains(failed, r.stream()) || (r.tier() && r.granules() > want - got)) continue;
    if (!r.tier()) r.g0 = r.g1 - std::min(r.granules(), want - got);
    got += r.granules();
    chosen->push_back(r);
    used[i] = true;
  }
  while (got < want) {
    std::optional<std::size_t> pick;
    for (std::size_t i = 0; i < runs.size(); ++i) {
      if (used[i] || !runs[i].tier() || Contains(failed, runs[i].stream())) continue;
      const bool covers = runs[i].granules() >= want - got;
      if (!pick.has_value() ||
          (covers && (runs[*pick].granules() < want - got || runs[i].granules() < runs[*pick].granules()))) {
        pick = i;
      }
    }
    if (!pick.has_value()) return false;
    used[*pick] = true;
    got += runs[*pick].granules();
    chosen->push_back(runs[*pick]);
  }
  return true;
}

}  // namespace

Stitcher::Stitcher(const PoolContext& ctx, VirtualBacking* backing)
    : ctx_(ctx), backing_(backing), granule_(backing->granule()), shift_(std::countr_zero(granule_)) {}

absl::StatusOr<Block*> Stitcher::Stitch(LargePool& pool, LargePool::StreamState& ss, Stream stream, std::size_t rounded,
                                        int tier) {
  const std::size_t bytes = RoundUp(rounded, granule_);
  const std::size_t n = bytes >> shift_;
  // Stitch runs after a grow of `bytes` failed. With headroom for all of it, the device refused
  // (another process holds memory), not the cap: then no granule is created, all of them move.
  std::size_t headroom = ctx_.source->Headroom();
  if (headroom >= bytes) headroom = 0;
  const std::size_t own = backing_->spares() + (headroom >> shift_);
  const std::size_t want = n > own ? n - own : 0;
  const std::size_t free_granules = pool.free_granules();
  if (free_granules < want) {
    return absl::ResourceExhaustedError(absl::StrCat("bucketalloc: stitching ", bytes, " bytes needs ", want,
                                                     " granules of free blocks but only ", free_granules, " are free"));
  }
  std::vector<Run> runs;
  for (Segment* seg : pool.segments()) {
    for (Block* b = seg->first; b != nullptr && want > 0; b = b->next) {
      std::size_t g0 = 0, g1 = 0;
      if (b->state == BlockState::kFree && pool.WholeGranules(b, &g0, &g1) > 0) {
        runs.push_back(Run{b->free_since, b->ptr, b, g0, g1});
      }
    }
  }
  std::sort(runs.begin(), runs.end(),
            [](const Run& a, const Run& b) { return a.age != b.age ? a.age < b.age : a.ptr < b.ptr; });
  // The chosen runs' streams must have passed their last use before anything is unmapped; a
  // stream that cannot be synchronized keeps its blocks' granules, and the choice is made again.
  StreamWaits waits(ctx_.source);
  std::vector<Run> chosen;
  for (;;) {
    if (!ChooseRuns(runs, want, waits.failed(), &chosen)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "bucketalloc: stitching ", bytes, " bytes needs ", want, " granules of free blocks; ", free_granules,
          " are free",
          waits.error().ok()
              ? ""
              : absl::StrCat(", but some on streams that could not be synchronized: ", waits.error().message())));
    }
    if (std::all_of(chosen.begin(), chosen.end(), [&](const Run& r) { return waits.Passed(r.stream()); })) break;
  }
  absl::InlinedVector<Segment*, 8> touched;
  for (const Run& r : chosen) {
    if (!Contains(touched, r.block->segment)) touched.push_back(r.block->segment);
  }
  absl::StatusOr<std::uintptr_t> base = ctx_.source->ReserveRange(bytes, 0);
  if (!base.ok()) return base.status();
  std::vector<PhysicalHandle> granules;
  absl::Status s;
  for (const Run& r : chosen) {
    s = backing_->UnmapRun(pool, r.block, r.g0, r.g1, &granules);
    if (!s.ok()) break;
  }
  for (Segment* seg : touched) {
    if (seg->active_blocks == 0 && seg->free_blocks == 0) pool.DropSegment(seg);  // all hole now
  }
  const std::size_t stitched = granules.size();
  if (s.ok()) s = backing_->TakeGranules(n, &granules);
  if (s.ok() && granules.size() > n) {
    // A whole tier block gave more than needed: the surplus goes back to the device.
    std::vector<PhysicalHandle> surplus(granules.begin() + static_cast<std::ptrdiff_t>(n), granules.end());
    granules.resize(n);
    backing_->ReleaseGranules(&surplus);
  }
  if (!s.ok()) {
    backing_->ReleaseGranules(&granules);
    ctx_.source->ReleaseRange(*base, bytes);
    return s;
  }
  absl::StatusOr<Segment*> seg = backing_->MapNewSegment(pool, ss, stream, *base, bytes, tier, std::move(granules));
  if (!seg.ok()) return seg.status();
  ctx_.stats->Count(&DeviceStats::num_stitches);
  ctx_.stats->Count(&DeviceStats::num_granules_stitched, static_cast<std::int64_t>(std::min(stitched, n)));
  pool.Take((*seg)->first, rounded, tier);
  return (*seg)->first;
}

void Stitcher::ReleaseFreeGranules(LargePool& pool) {
  if (pool.free_granules() == 0 && backing_->spares() == 0) return;
  std::vector<PhysicalHandle> handles = backing_->TakeSpares();
  // The segments left (partly used ones, and wholly free ones whose release failed): their free
  // blocks' whole granules, once the segment's stream has passed their last use.
  std::vector<Segment*> partly(pool.segments().begin(), pool.segments().end());
  std::sort(partly.begin(), partly.end(), [](const Segment* a, const Segment* b) { return a->base < b->base; });
  StreamWaits waits(ctx_.source);
  for (Segment* seg : partly) {
    if (seg->free_blocks == 0 || !waits.Passed(seg->stream)) continue;
    // Carving a block changes only it and the holes beside it, so the others stay valid.
    absl::InlinedVector<Block*, 8> free_blocks;
    for (Block* b = seg->first; b != nullptr; b = b->next) {
      if (b->state == BlockState::kFree) free_blocks.push_back(b);
    }
    for (Block* b : free_blocks) {
      std::size_t g0 = 0, g1 = 0;
      if (pool.WholeGranules(b, &g0, &g1) > 0 && !backing_->UnmapRun(pool, b, g0, g1, &handles).ok()) break;
    }
    // A wholly free segment whose release failed part-way may be all hole now.
    if (seg->active_blocks == 0 && seg->free_blocks == 0) pool.DropSegment(seg);
  }
  backing_->ReleaseGranules(&handles);
}

}  // namespace bucketalloc::internal
