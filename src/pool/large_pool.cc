#include "pool/large_pool.h"

#include <algorithm>
#include <bit>
#include <limits>
#include <optional>
#include <span>

#include "absl/container/inlined_vector.h"
#include "absl/types/span.h"
#include "absl/strings/str_cat.h"
#include "internal/bits.h"
#include "internal/check.h"

namespace bucketalloc::internal {
namespace {

// On the fast path each bin is scanned for the best fit up to this many entries (so an exact-size
// hit may read up to 32 entries: the lowest address among equals needs them); the slow path's full
// scan reads whole bins.
constexpr int kMaxBinScan = 32;

LargePool::StreamState& StateOf(const Segment* seg) {
  return *static_cast<LargePool::StreamState*>(seg->owner);
}

int NextNonEmpty(const LargePool::StreamState& ss, int from) {
  if (from >= kNumBins) return -1;
  for (int w = from >> 6; w < LargePool::kBitmapWords; ++w) {
    std::uint64_t bits = ss.nonempty[w];
    if (w == (from >> 6)) bits &= ~std::uint64_t{0} << (from & 63);
    if (bits != 0) return (w << 6) + std::countr_zero(bits);
  }
  return -1;
}

// The smallest size that falls in bin `bin`.
std::size_t BinLowerBound(int bin) {
  const int p = (bin >> kSubBinsLog2) + 9;
  const std::size_t sub = static_cast<std::size_t>(bin & ((1 << kSubBinsLog2) - 1));
  return (std::size_t{1} << p) + sub * (std::size_t{1} << (p - kSubBinsLog2));
}

}  // namespace

LargePool::LargePool(const PoolContext& ctx, LargePoolConfig config)
    : ctx_(ctx),
      config_(std::move(config)),
      granule_shift_(config_.granule == 0 ? 0 : std::countr_zero(config_.granule)) {}

LargePool::~LargePool() = default;  // metadata lives in the object pools

LargePool::Inactive LargePool::InactiveOf(const Segment* seg) {
  if (seg->active_blocks == 0) return {};
  return {static_cast<std::int64_t>(seg->free_bytes), seg->free_blocks};
}

void LargePool::UpdateInactiveSplit(const Inactive& before, const Segment* seg) {
  const Inactive after = InactiveOf(seg);
  if (after.bytes != before.bytes) StatAdd(ctx_.stats->inactive_split_bytes, kLargePool, after.bytes - before.bytes);
  if (after.count != before.count) StatAdd(ctx_.stats->inactive_split, kLargePool, after.count - before.count);
}

std::size_t LargePool::WholeGranules(const Block* block, std::size_t* g0, std::size_t* g1) const {
  const std::uintptr_t base = block->segment->base;
  const std::size_t lo = RoundUp(block->ptr - base, config_.granule) >> granule_shift_;
  const std::size_t hi = (block->ptr + block->size - base) >> granule_shift_;
  if (g0 != nullptr) *g0 = lo;
  if (g1 != nullptr) *g1 = hi;
  return hi > lo ? hi - lo : 0;
}

void LargePool::InsertFree(Block* block) {
  Segment* seg = block->segment;
  StreamState& ss = StateOf(seg);
  block->state = BlockState::kFree;
  seg->free_blocks += 1;
  seg->free_bytes += block->size;
  if (stitching()) free_granules_ += WholeGranules(block);
  if (seg->tier >= 0) {
    ss.tier_free[seg->tier].PushFront(block);
    return;
  }
  const int bin = BinOf(block->size);
  ss.bins[bin].PushFront(block);
  ss.nonempty[bin >> 6] |= std::uint64_t{1} << (bin & 63);
}

void LargePool::RemoveFree(Block* block) {
  Segment* seg = block->segment;
  FreeList::Unlink(block);
  seg->free_blocks -= 1;
  seg->free_bytes -= block->size;
  if (stitching()) free_granules_ -= WholeGranules(block);
  if (seg->tier >= 0) return;
  StreamState& ss = StateOf(seg);
  const int bin = BinOf(block->size);
  if (ss.bins[bin].empty()) ss.nonempty[bin >> 6] &= ~(std::uint64_t{1} << (bin & 63));
}

Block* LargePool::FindFree(StreamState& ss, std::size_t rounded, bool full_scan) {
  // PyTorch's rule: the smallest admissible block, the lowest address among equals (blocks packed
  // toward the start of their segments coalesce into whole free segments more often). Bins hold 4
  // sizes per power of two, so the best fit is in the first bin that has an admissible block; each
  // bin is scanned up to kMaxBinScan entries on the fast path, wholly with `full_scan`.
  const int max_scan = full_scan ? std::numeric_limits<int>::max() : kMaxBinScan;
  auto better = [](const Block* a, const Block* b) {
    return b == nullptr || a->size < b->size || (a->size == b->size && a->ptr < b->ptr);
  };
  const int first = BinOf(rounded);
  for (int bin = (ss.bins[first].empty() ? NextNonEmpty(ss, first + 1) : first); bin >= 0;
       bin = NextNonEmpty(ss, bin + 1)) {
    const std::size_t lower = BinLowerBound(bin);
    if (bin > first && lower > config_.max_split_size && lower - rounded > config_.max_non_split_rounding) {
      return nullptr;  // every block from here on is oversize and too large for this request
    }
    Block* best = nullptr;
    int scanned = 0;
    for (Block* b = ss.bins[bin].front(); b != nullptr && scanned < max_scan;
         b = ss.bins[bin].next(b), ++scanned) {
      if (b->size < rounded || !Admissible(b->size, rounded)) continue;
      if (better(b, best)) best = b;
    }
    if (best != nullptr) return best;
  }
  return nullptr;
}

void LargePool::Activate(Block* block) {
  Segment* seg = block->segment;
  block->state = BlockState::kAllocated;
  seg->active_blocks += 1;
  if (seg->release_node.linked()) decltype(release_order_)::Unlink(seg);
  DeviceStats& st = *ctx_.stats;
  const auto size = static_cast<std::int64_t>(block->size);
  StatAdd(st.active_bytes, kLargePool, size);
  StatAdd(st.active, kLargePool, 1);
  StatAdd(st.cached_bytes, kLargePool, -size);
}

void LargePool::Take(Block* block, std::size_t rounded, int tier) {
  Segment* seg = block->segment;
  const Inactive before = InactiveOf(seg);
  RemoveFree(block);
  if (tier < 0 && ShouldSplit(block, rounded)) {
    InsertFree(SplitBlock(block, rounded, blocks_));
    ++ctx_.stats->num_splits;
  }
  Activate(block);
  UpdateInactiveSplit(before, seg);
}

Block* LargePool::TryAllocate(StreamState& ss, std::size_t rounded, int tier, bool full_scan) {
  Block* block = tier >= 0 ? ss.tier_free[tier].front() : FindFree(ss, rounded, full_scan);
  if (block != nullptr) Take(block, rounded, tier);
  return block;
}

absl::StatusOr<Block*> LargePool::Grow(StreamState& ss, Stream stream, std::size_t bytes, std::size_t rounded,
                                       int tier) {
  BA_DCHECK(bytes >= rounded, "a segment smaller than its request");
  Segment* seg = nullptr;
  if (!stitching()) {
    absl::StatusOr<std::uintptr_t> base = ctx_.source->AllocateSegment(bytes, kLargePool);
    if (!base.ok()) return base.status();
    seg = AddSegment(ss, stream, *base, bytes, tier, {});
  } else {
    absl::StatusOr<std::uintptr_t> base = ctx_.source->ReserveRange(bytes, bytes);
    if (!base.ok()) return base.status();
    std::vector<PhysicalHandle> granules;
    if (absl::Status s = TakeGranules(bytes / config_.granule, &granules); !s.ok()) {
      ReleaseGranules(&granules);
      ctx_.source->ReleaseRange(*base, bytes);
      return s;
    }
    absl::StatusOr<Segment*> made = MapNewSegment(ss, stream, *base, bytes, tier, std::move(granules));
    if (!made.ok()) return made.status();
    seg = *made;
  }
  // The new segment serves the request it was made for, whatever the admission rules for cached
  // blocks would say.
  Take(seg->first, rounded, tier);
  return seg->first;
}

Segment* LargePool::AddSegment(StreamState& ss, Stream stream, std::uintptr_t base, std::size_t bytes, int tier,
                               std::vector<PhysicalHandle> granules) {
  Segment* seg = segment_meta_.New();
  seg->base = base;
  seg->size = bytes;
  seg->stream = stream;
  seg->owner = &ss;
  seg->tier = tier;
  const std::size_t g = granules.empty() ? bytes : config_.granule;
  const std::size_t n = granules.empty() ? 1 : granules.size();
  BA_DCHECK(granules.empty() || n * g == bytes, "a segment's granules do not cover it");
  std::size_t mapped = 0;
  Block* prev = nullptr;
  for (std::size_t i = 0; i < n;) {
    const bool hole = !granules.empty() && granules[i] == 0;
    std::size_t j = i + 1;
    while (j < n && (granules[j] == 0) == hole) ++j;
    Block* block = blocks_.New();
    block->ptr = base + i * g;
    block->size = (j - i) * g;
    block->segment = seg;
    block->prev = prev;
    block->free_since = *ctx_.clock;
    (prev == nullptr ? seg->first : prev->next) = block;
    if (hole) {
      block->state = BlockState::kUnmapped;
    } else {
      InsertFree(block);
      mapped += block->size;
    }
    prev = block;
    i = j;
  }
  if (!granules.empty()) granules_.emplace(seg, std::move(granules));
  segments_.insert(seg);
  seg->free_since = *ctx_.clock;
  release_order_.PushBack(seg);
  StatAdd(ctx_.stats->cached_bytes, kLargePool, static_cast<std::int64_t>(mapped));
  if (bytes > config_.max_split_size) ctx_.stats->oversize_segments.Add(1);
  return seg;
}

void LargePool::DropSegment(Segment* seg) {
  BA_DCHECK(seg->active_blocks == 0 && seg->free_blocks == 0, "dropping a segment that holds blocks");
  if (seg->release_node.linked()) decltype(release_order_)::Unlink(seg);
  if (seg->size > config_.max_split_size) ctx_.stats->oversize_segments.Add(-1);
  for (Block* b = seg->first; b != nullptr;) {
    Block* next = b->next;
    blocks_.Delete(b);
    b = next;
  }
  if (stitching()) {
    granules_.erase(seg);
    ctx_.source->ReleaseRange(seg->base, seg->size);
  }
  segments_.erase(seg);
  segment_meta_.Delete(seg);
}

absl::Status LargePool::TakeGranules(std::size_t n, std::vector<PhysicalHandle>* out) {
  while (out->size() < n && !spare_.empty()) {
    out->push_back(spare_.back());
    spare_.pop_back();
    StatAdd(ctx_.stats->cached_bytes, kLargePool, -static_cast<std::int64_t>(config_.granule));
  }
  while (out->size() < n) {
    absl::StatusOr<PhysicalHandle> h = ctx_.source->CreateGranule();
    if (!h.ok()) return h.status();
    out->push_back(*h);
  }
  return absl::OkStatus();
}

absl::StatusOr<Segment*> LargePool::MapNewSegment(StreamState& ss, Stream stream, std::uintptr_t base,
                                                  std::size_t bytes, int tier,
                                                  std::vector<PhysicalHandle> granules) {
  std::size_t mapped = 0;
  absl::Status s;
  for (; mapped < granules.size(); ++mapped) {
    s = ctx_.source->MapGranule(base + mapped * config_.granule, granules[mapped]);
    if (!s.ok()) break;
  }
  if (s.ok()) return AddSegment(ss, stream, base, bytes, tier, std::move(granules));
  std::vector<PhysicalHandle> unmapped(granules.begin() + static_cast<std::ptrdiff_t>(mapped), granules.end());
  ReleaseGranules(&unmapped);
  if (mapped == 0) {
    ctx_.source->ReleaseRange(base, bytes);
  } else {
    // The mapped prefix is cached memory like any other (a plain segment: a tier segment has no holes).
    std::fill(granules.begin() + static_cast<std::ptrdiff_t>(mapped), granules.end(), PhysicalHandle{0});
    AddSegment(ss, stream, base, bytes, -1, std::move(granules));
  }
  return s;
}

absl::Status LargePool::UnmapRun(Block* block, std::size_t g0, std::size_t g1, std::vector<PhysicalHandle>* out) {
  Segment* seg = block->segment;
  const std::size_t g = config_.granule;
  BA_DCHECK(block->state == BlockState::kFree && seg->base + g0 * g >= block->ptr &&
                seg->base + g1 * g <= block->ptr + block->size,
            "unmapping granules that are not wholly inside a free block");
  std::vector<PhysicalHandle>& handles = granules_[seg];
  absl::Status s;
  std::size_t end = g0;
  for (; end < g1; ++end) {
    s = ctx_.source->UnmapGranule(seg->base + end * g);
    if (!s.ok()) break;
    out->push_back(handles[end]);
    handles[end] = 0;
  }
  if (end == g0) return s;
  // Carve the hole out of the block: [free rest][hole][free rest], holes merged with holes.
  const Inactive before = InactiveOf(seg);
  RemoveFree(block);
  // A tier block that loses some of its granules is no longer a tier block: what stays of it is
  // plain free memory (the tier list would hand it out at the tier's size).
  seg->tier = -1;
  const std::uintptr_t lo = seg->base + g0 * g, hi = seg->base + end * g;
  if (block->ptr < lo) {
    Block* mid = SplitBlock(block, lo - block->ptr, blocks_);
    InsertFree(block);
    block = mid;
  }
  if (block->ptr + block->size > hi) InsertFree(SplitBlock(block, hi - block->ptr, blocks_));
  block->state = BlockState::kUnmapped;
  StatAdd(ctx_.stats->cached_bytes, kLargePool, -static_cast<std::int64_t>(block->size));
  for (Block* neighbour : {block->prev, block->next}) {
    if (neighbour != nullptr && neighbour->state == BlockState::kUnmapped) block = MergeBlocks(block, neighbour, blocks_);
  }
  UpdateInactiveSplit(before, seg);
  return s;
}

void LargePool::AddSpare(PhysicalHandle handle) {
  spare_.push_back(handle);
  StatAdd(ctx_.stats->cached_bytes, kLargePool, static_cast<std::int64_t>(config_.granule));
}

void LargePool::ReleaseGranules(std::vector<PhysicalHandle>* handles) {
  for (PhysicalHandle h : *handles) {
    if (ctx_.source->ReleaseGranule(h)) {
      ++ctx_.stats->num_granules_released;
    } else {
      AddSpare(h);
    }
  }
  handles->clear();
}

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
      if (!pick.has_value() || (covers && (runs[*pick].granules() < want - got ||
                                           runs[i].granules() < runs[*pick].granules()))) {
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

absl::StatusOr<Block*> LargePool::Stitch(StreamState& ss, Stream stream, std::size_t rounded, int tier) {
  BA_CHECK(stitching(), "Stitch without virtual memory");
  const std::size_t bytes = RoundUp(rounded, config_.granule);
  const std::size_t n = bytes >> granule_shift_;
  // Stitch runs after a grow of `bytes` failed. With headroom for all of it, the device refused
  // (another process holds memory), not the cap: then no granule is created, all of them move.
  std::size_t headroom = ctx_.source->Headroom();
  if (headroom >= bytes) headroom = 0;
  const std::size_t own = spare_.size() + (headroom >> granule_shift_);
  const std::size_t want = n > own ? n - own : 0;
  if (free_granules_ < want) {
    return absl::ResourceExhaustedError(absl::StrCat("bucketalloc: stitching ", bytes, " bytes needs ", want,
                                                     " granules of free blocks but only ", free_granules_,
                                                     " are free"));
  }
  std::vector<Run> runs;
  for (Segment* seg : segments_) {
    for (Block* b = seg->first; b != nullptr && want > 0; b = b->next) {
      std::size_t g0 = 0, g1 = 0;
      if (b->state == BlockState::kFree && WholeGranules(b, &g0, &g1) > 0) runs.push_back(Run{b->free_since, b->ptr, b, g0, g1});
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
          "bucketalloc: stitching ", bytes, " bytes needs ", want, " granules of free blocks; ", free_granules_,
          " are free", waits.error().ok() ? "" : absl::StrCat(", but some on streams that could not be synchronized: ",
                                                               waits.error().message())));
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
    s = UnmapRun(r.block, r.g0, r.g1, &granules);
    if (!s.ok()) break;
  }
  for (Segment* seg : touched) {
    if (seg->active_blocks == 0 && seg->free_blocks == 0) DropSegment(seg);  // all hole now
  }
  const std::size_t stitched = granules.size();
  if (s.ok()) s = TakeGranules(n, &granules);
  if (s.ok() && granules.size() > n) {
    // A whole tier block gave more than needed: the surplus goes back to the device.
    std::vector<PhysicalHandle> surplus(granules.begin() + static_cast<std::ptrdiff_t>(n), granules.end());
    granules.resize(n);
    ReleaseGranules(&surplus);
  }
  if (!s.ok()) {
    ReleaseGranules(&granules);
    ctx_.source->ReleaseRange(*base, bytes);
    return s;
  }
  absl::StatusOr<Segment*> seg = MapNewSegment(ss, stream, *base, bytes, tier, std::move(granules));
  if (!seg.ok()) return seg.status();
  ++ctx_.stats->num_stitches;
  ctx_.stats->num_granules_stitched += static_cast<std::int64_t>(std::min(stitched, n));
  Take((*seg)->first, rounded, tier);
  return (*seg)->first;
}

void LargePool::Return(Block* block) {
  Segment* seg = block->segment;
  const Inactive before = InactiveOf(seg);
  DeviceStats& st = *ctx_.stats;
  const auto size = static_cast<std::int64_t>(block->size);
  StatAdd(st.active_bytes, kLargePool, -size);
  StatAdd(st.active, kLargePool, -1);
  StatAdd(st.cached_bytes, kLargePool, size);
  seg->active_blocks -= 1;
  block->state = BlockState::kFree;
  for (Block* neighbour : {block->prev, block->next}) {
    if (neighbour != nullptr && neighbour->state == BlockState::kFree) {
      RemoveFree(neighbour);
      block = MergeBlocks(block, neighbour, blocks_);
      ++st.num_merges;
    }
  }
  block->free_since = *ctx_.clock;
  InsertFree(block);
  if (seg->active_blocks == 0) {
    seg->free_since = *ctx_.clock;
    release_order_.PushBack(seg);
  }
  UpdateInactiveSplit(before, seg);
}

std::uint64_t LargePool::OldestFree() const {
  const Segment* s = release_order_.front();
  return s == nullptr ? std::numeric_limits<std::uint64_t>::max() : s->free_since;
}

bool LargePool::ReleaseSegment(Segment* seg) {
  BA_CHECK(seg->active_blocks == 0, "releasing a segment that is not wholly free");
  if (!stitching()) {
    Block* block = seg->first;
    BA_CHECK(block->next == nullptr && block->state == BlockState::kFree, "releasing a split segment");
    if (!ctx_.source->ReleaseSegment(seg->base, seg->size, kLargePool)) return false;  // stays cached
    RemoveFree(block);
    StatAdd(ctx_.stats->cached_bytes, kLargePool, -static_cast<std::int64_t>(seg->size));
    DropSegment(seg);
    return true;
  }
  // Its stream must have passed the last use of its blocks before they are unmapped. Its free
  // blocks lie between holes or the segment's ends, so they are whole granules.
  if (!ctx_.source->SynchronizeStream(seg->stream).ok()) {
    ++ctx_.stats->num_device_free_failures;
    return false;
  }
  std::vector<PhysicalHandle> handles;
  absl::Status s;
  while (s.ok() && seg->free_blocks > 0) {
    Block* b = seg->first;
    while (b->state != BlockState::kFree) b = b->next;
    std::size_t g0 = 0, g1 = 0;
    WholeGranules(b, &g0, &g1);  // all of it: its neighbours are holes or the segment's ends
    s = UnmapRun(b, g0, g1, &handles);
  }
  ReleaseGranules(&handles);
  if (!s.ok()) {
    ++ctx_.stats->num_device_free_failures;
    return false;
  }
  DropSegment(seg);
  return true;
}

std::size_t LargePool::ReleaseOldest() {
  Segment* seg = release_order_.front();
  if (seg == nullptr) return 0;
  const std::size_t bytes = MappedBytes(*seg);
  return ReleaseSegment(seg) ? bytes : 0;
}

std::size_t LargePool::ReleaseFree(std::size_t target) {
  std::size_t released = 0;
  while (released < target) {
    const std::size_t n = ReleaseOldest();
    if (n == 0) break;
    released += n;
  }
  if (stitching() && target == std::numeric_limits<std::size_t>::max()) ReleaseFreeGranules();
  return released;
}

void LargePool::ReleaseFreeGranules() {
  if (free_granules_ == 0 && spare_.empty()) return;
  std::vector<PhysicalHandle> handles;
  handles.swap(spare_);
  StatAdd(ctx_.stats->cached_bytes, kLargePool, -static_cast<std::int64_t>(handles.size() * config_.granule));
  // The segments left (partly used ones, and wholly free ones whose release failed): their free
  // blocks' whole granules, once the segment's stream has passed their last use.
  std::vector<Segment*> partly(segments_.begin(), segments_.end());
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
      if (WholeGranules(b, &g0, &g1) > 0 && !UnmapRun(b, g0, g1, &handles).ok()) break;
    }
    // A wholly free segment whose release failed part-way may be all hole now.
    if (seg->active_blocks == 0 && seg->free_blocks == 0) DropSegment(seg);
  }
  ReleaseGranules(&handles);
}

std::size_t LargePool::MappedBytes(const Segment& seg) const {
  std::size_t holes = 0;
  for (const Block* b = seg.first; b != nullptr; b = b->next) holes += b->state == BlockState::kUnmapped ? b->size : 0;
  return seg.size - holes;
}

std::size_t LargePool::largest_free_block() const {
  std::size_t largest = 0;
  for (const Segment* seg : segments_) {
    for (const Block* b = seg->first; b != nullptr; b = b->next) {
      if (b->state == BlockState::kFree) largest = std::max(largest, b->size);
    }
  }
  return largest;
}

void LargePool::Fragmentation(PoolFragmentation* out, std::vector<TierUsage>* tiers) const {
  tiers->assign(config_.tiers.size(), TierUsage{});
  for (std::size_t t = 0; t < config_.tiers.size(); ++t) {
    (*tiers)[t].tier_bytes = static_cast<std::int64_t>(config_.tiers[t]);
  }
  for (const Segment* seg : segments_) {
    for (const Block* b = seg->first; b != nullptr; b = b->next) {
      if (b->state == BlockState::kUnmapped) continue;
      if (seg->tier >= 0) {
        (b->state == BlockState::kFree ? (*tiers)[seg->tier].cached : (*tiers)[seg->tier].in_use) += 1;
      }
      if (b->state != BlockState::kFree) continue;
      const auto size = static_cast<std::int64_t>(b->size);
      const int bin = std::min(Log2Floor(b->size), kHistogramBins - 1);
      out->free_count[bin] += 1;
      out->free_bytes[bin] += size;
      out->total_free += size;
      out->largest_free = std::max(out->largest_free, size);
    }
  }
}

absl::Status LargePool::CheckInvariants(std::int64_t active_blocks) const {
  auto fail = [](const Segment* seg, absl::string_view what) {
    return absl::InternalError(absl::StrCat("large pool: segment ", absl::Hex(seg->base), " (",
                                            seg->size, " bytes): ", what));
  };
  std::int64_t active = 0;
  std::int64_t in_order = 0;
  for (const Segment* s = release_order_.front(); s != nullptr; s = release_order_.next(s)) ++in_order;
  std::int64_t wholly_free = 0;
  for (const Segment* seg : segments_) {
    if (seg->first == nullptr || seg->first->ptr != seg->base || seg->first->prev != nullptr) {
      return fail(seg, "its first block does not start it");
    }
    std::uintptr_t expect = seg->base;
    std::int32_t seg_active = 0, seg_free = 0;
    std::size_t seg_free_bytes = 0;
    int blocks = 0;
    const std::vector<PhysicalHandle>* handles = nullptr;
    if (stitching()) {
      auto it = granules_.find(seg);
      if (it == granules_.end() || it->second.size() * config_.granule != seg->size) {
        return fail(seg, "its granule table does not cover it");
      }
      handles = &it->second;
    } else if (granules_.contains(seg)) {
      return fail(seg, "it has granules without stitching");
    }
    for (const Block* b = seg->first; b != nullptr; b = b->next) {
      ++blocks;
      if (b->segment != seg) return fail(seg, "a block points to another segment");
      if (b->ptr != expect || b->size == 0) return fail(seg, "its blocks do not tile it");
      if (b->next != nullptr && b->next->prev != b) return fail(seg, "broken neighbour links");
      expect += b->size;
      const bool hole = b->state == BlockState::kUnmapped;
      if (handles != nullptr) {
        // A hole is whole granules with no physical memory; every other block lies on mapped ones.
        const std::size_t g = config_.granule;
        if (hole && ((b->ptr - seg->base) % g != 0 || b->size % g != 0)) return fail(seg, "a hole is not granule-aligned");
        for (std::size_t i = (b->ptr - seg->base) / g; i < (b->ptr + b->size - seg->base + g - 1) / g; ++i) {
          if (((*handles)[i] == 0) != hole) return fail(seg, "a granule's mapping does not match its block");
        }
      }
      if (hole) {
        if (handles == nullptr) return fail(seg, "a hole in a segment without stitching");
        if (b->free_node.linked()) return fail(seg, "a hole is in a free list");
        if (b->next != nullptr && b->next->state == BlockState::kUnmapped) return fail(seg, "two neighbouring holes");
      } else if (b->state == BlockState::kFree) {
        ++seg_free;
        seg_free_bytes += b->size;
        if (!b->free_node.linked()) return fail(seg, "a free block is in no free list");
        if (b->next != nullptr && b->next->state == BlockState::kFree) {
          return fail(seg, "two neighbouring free blocks were not coalesced");
        }
      } else {
        ++seg_active;
        if (b->free_node.linked()) return fail(seg, "an active block is in a free list");
      }
    }
    if (expect != seg->base + seg->size) return fail(seg, "its blocks do not reach its end");
    if (seg_active != seg->active_blocks || seg_free != seg->free_blocks ||
        seg_free_bytes != seg->free_bytes) {
      return fail(seg, "its block counts are wrong");
    }
    if (seg->tier >= 0 && blocks != 1) return fail(seg, "a tier segment was split");
    if (seg_active + seg_free == 0) return fail(seg, "it is all hole but was not released");
    if ((seg->active_blocks == 0) != seg->release_node.linked()) {
      return fail(seg, "release-order membership does not match its active blocks");
    }
    wholly_free += seg->active_blocks == 0;
    active += seg_active;
  }
  if (wholly_free != in_order) return absl::InternalError("large pool: release order is inconsistent");
  if (granules_.size() != (stitching() ? segments_.size() : 0)) {
    return absl::InternalError("large pool: a granule table belongs to no segment");
  }
  for (PhysicalHandle h : spare_) {
    if (h == 0) return absl::InternalError("large pool: a spare granule has no handle");
  }
  std::size_t whole = 0;
  for (const Segment* seg : segments_) {
    for (const Block* b = seg->first; b != nullptr && stitching(); b = b->next) {
      whole += b->state == BlockState::kFree ? WholeGranules(b) : 0;
    }
  }
  if (whole != free_granules_) {
    return absl::InternalError(absl::StrCat("large pool: free blocks hold ", whole, " whole granules but ",
                                            free_granules_, " are counted"));
  }
  if (active != active_blocks) {
    return absl::InternalError(absl::StrCat("large pool: segments hold ", active,
                                            " active blocks but ", active_blocks, " are recorded"));
  }
  return absl::OkStatus();
}

absl::Status CheckStreamFreeLists(const LargePool::StreamState& ss, std::size_t num_tiers) {
  for (int bin = 0; bin < kNumBins; ++bin) {
    const bool bit = (ss.nonempty[bin >> 6] >> (bin & 63)) & 1;
    if (bit == ss.bins[bin].empty()) {
      return absl::InternalError(absl::StrCat("large pool: bitmap bit of bin ", bin, " is wrong"));
    }
    for (const Block* b = ss.bins[bin].front(); b != nullptr; b = ss.bins[bin].next(b)) {
      if (b->state != BlockState::kFree || BinOf(b->size) != bin || b->segment->tier >= 0 ||
          b->segment->owner != &ss) {
        return absl::InternalError(absl::StrCat("large pool: bin ", bin, " holds a block of size ",
                                                b->size, " that does not belong there"));
      }
    }
  }
  for (std::size_t t = 0; t < num_tiers; ++t) {
    for (const Block* b = ss.tier_free[t].front(); b != nullptr; b = ss.tier_free[t].next(b)) {
      if (b->state != BlockState::kFree || b->segment->tier != static_cast<int>(t)) {
        return absl::InternalError(absl::StrCat("large pool: tier ", t, " list holds a foreign block"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace bucketalloc::internal
