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

// What a stitch can move as one: a piece wholly inside a plain free block, or all the pieces of a
// free tier block (a tier block moves whole: its list hands out whole tier blocks only), and the
// age of its block.
struct Unit {
  std::uint64_t age;
  std::uintptr_t ptr;  // its first byte
  Block* block;
  std::size_t first, last;  // pieces [first, last) of the block's segment
  std::size_t bytes;
  bool coarse;  // it holds a piece larger than the stitch maps as it is
  bool tier() const { return block->segment->tier >= 0; }
  Stream stream() const { return block->segment->stream; }
};

template <typename V, typename T>
bool Contains(const V& v, const T& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// Synchronizes each stream once, before the first unmap of its blocks' pieces, and remembers the
// ones that could not be synchronized (their blocks' pieces must stay) and the last error.
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

// Chooses units worth `want` bytes from `units` (oldest first), skipping those on `failed`
// streams, into `chosen`; false when there are not enough. A unit that fits in what is still
// needed, and whose pieces can be mapped as they are (not `coarse`), is taken in age order; then,
// while more is needed, the smallest unit that covers the rest, or else the largest (a coarse
// unit's pieces and a surplus go back to the device, and what is needed of them is created anew).
bool ChooseUnits(const std::vector<Unit>& units, std::size_t want, absl::Span<const Stream> failed,
                 std::vector<Unit>* chosen) {
  chosen->clear();
  std::vector<bool> used(units.size());
  std::size_t got = 0;
  for (std::size_t i = 0; i < units.size() && got < want; ++i) {
    if (units[i].coarse || Contains(failed, units[i].stream()) || units[i].bytes > want - got) continue;
    got += units[i].bytes;
    chosen->push_back(units[i]);
    used[i] = true;
  }
  while (got < want) {
    std::optional<std::size_t> pick;
    for (std::size_t i = 0; i < units.size(); ++i) {
      if (used[i] || Contains(failed, units[i].stream())) continue;
      if (!pick.has_value()) {
        pick = i;
        continue;
      }
      const std::size_t need = want - got, a = units[i].bytes, b = units[*pick].bytes;
      const bool covers = a >= need, pick_covers = b >= need;
      if ((covers && (!pick_covers || a < b)) || (!covers && !pick_covers && a > b)) pick = i;
    }
    if (!pick.has_value()) return false;
    used[*pick] = true;
    got += units[*pick].bytes;
    chosen->push_back(units[*pick]);
  }
  return true;
}

// True when a free block of `pool` holds a whole granule (a walk that stops at the first).
bool AnyFreeWholeGranule(const LargePool& pool, const VirtualBacking& backing) {
  for (const Segment* seg : pool.segments()) {
    if (seg->free_blocks == 0) continue;
    for (const Block* b = seg->first; b != nullptr; b = b->next) {
      if (b->state == BlockState::kFree && backing.WholeGranules(b) > 0) return true;
    }
  }
  return false;
}

// The blocks and segment a stitch must leave as they are: the destination's free neighbours (they
// join the new memory) and its segment (it is mapped into, never dropped).
struct Keep {
  const Block* before = nullptr;
  const Block* after = nullptr;
  const Segment* segment = nullptr;
};

// The free pieces a stitch of `bytes` takes to move `want` bytes: the units of free blocks (not
// `keep`'s), chosen oldest first (ChooseUnits), after their streams have passed their last use,
// as runs (a block's units side by side: one unmap call), highest first. ResourceExhausted, having
// changed nothing, when too few can move.
absl::StatusOr<std::vector<Unit>> ChooseRuns(LargePool& pool, const VirtualBacking& backing, MemorySource* source,
                                             std::size_t bytes, std::size_t want, std::size_t max_piece,
                                             const Keep& keep) {
  const int shift = std::countr_zero(backing.granule());
  // The units a stitch may take: the whole pieces of free blocks (a walk; too few of them and the
  // choice below refuses, naming the bytes, before any stream wait or backend call).
  std::vector<Unit> units;
  std::size_t movable = 0;
  for (Segment* seg : pool.segments()) {
    for (Block* b = seg->first; b != nullptr && want > 0; b = b->next) {
      std::size_t first = 0, last = 0;
      if (b->state != BlockState::kFree || b == keep.before || b == keep.after) continue;
      const std::size_t whole = backing.WholePieces(b, &first, &last);
      if (whole == 0) continue;
      movable += whole;
      absl::Span<const Piece> table = backing.pieces(seg);
      if (seg->tier >= 0) {
        bool coarse = false;
        for (std::size_t i = first; i < last; ++i) coarse = coarse || (table[i].n << shift) > max_piece;
        units.push_back(Unit{b->free_since, b->ptr, b, first, last, whole, coarse});
        continue;
      }
      // A plain block's pieces one by one, its top ones first (its start stays where it is).
      for (std::size_t i = last; i-- > first;) {
        const std::size_t piece = table[i].n << shift;
        units.push_back(Unit{b->free_since, seg->base + (table[i].g0 << shift), b, i, i + 1, piece, piece > max_piece});
      }
    }
  }
  // Oldest first; among equals the lowest block, and in a block its top pieces first.
  std::stable_sort(units.begin(), units.end(), [](const Unit& a, const Unit& b) {
    if (a.age != b.age) return a.age < b.age;
    if (a.block != b.block) return a.block->ptr < b.block->ptr;
    return a.ptr > b.ptr;
  });
  // The chosen units' streams must have passed their last use before anything is unmapped; a
  // stream that cannot be synchronized keeps its blocks' pieces, and the choice is made again.
  StreamWaits waits(source);
  std::vector<Unit> chosen;
  for (;;) {
    if (!ChooseUnits(units, want, waits.failed(), &chosen)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "bucketalloc: stitching ", bytes, " bytes needs ", want, " bytes of free pieces; ", movable,
          " bytes are free in whole pieces",
          waits.error().ok()
              ? ""
              : absl::StrCat(", but some on streams that could not be synchronized: ", waits.error().message())));
    }
    if (std::all_of(chosen.begin(), chosen.end(), [&](const Unit& u) { return waits.Passed(u.stream()); })) break;
  }
  // Unmapping a unit changes the piece indices after it in its segment: the highest first. Units of
  // one block side by side are one run, one unmap call.
  std::sort(chosen.begin(), chosen.end(), [](const Unit& a, const Unit& b) { return a.ptr > b.ptr; });
  std::vector<Unit> runs;
  for (const Unit& u : chosen) {
    if (!runs.empty() && runs.back().block == u.block && u.last == runs.back().first) {
      runs.back().first = u.first;
      runs.back().ptr = u.ptr;
      runs.back().bytes += u.bytes;
    } else {
      runs.push_back(u);
    }
  }
  return runs;
}

// Unmaps `runs` (ChooseRuns) into holes, appending their pieces to `moved`, until one fails (its
// error); a segment left all hole is dropped, but `keep`'s.
absl::Status UnmapRuns(LargePool& pool, VirtualBacking& backing, const std::vector<Unit>& runs, const Keep& keep,
                       std::vector<PhysicalPiece>* moved) {
  absl::InlinedVector<Segment*, 8> touched;
  for (const Unit& u : runs) {
    if (!Contains(touched, u.block->segment)) touched.push_back(u.block->segment);
  }
  absl::Status s;
  for (const Unit& u : runs) {
    // Its block: a run's block may have been carved by a run above it (MakeHole keeps the block
    // object for the part below the hole, where the runs below lie).
    s = backing.UnmapPieces(pool, u.block, u.first, u.last, moved);
    if (!s.ok()) break;
  }
  for (Segment* seg : touched) {
    if (seg != keep.segment && seg->active_blocks == 0 && seg->free_blocks == 0) pool.DropSegment(seg);  // all hole
  }
  return s;
}

// Where a plain request's new memory goes: `bytes` of `hole`, its first (beside the free block
// before it) or its last (beside the one after it), which with those free bytes hold the request.
struct Destination {
  Block* hole = nullptr;
  Keep keep;
  std::size_t bytes = 0;
  bool at_end = false;  // the last `bytes` of the hole, beside the free block after it
  // The request, whole granules, starts at lo() (a granule) rather than in the free block before:
  // the free bytes there would save it no granule, and it shares none with its neighbours.
  bool aligned = false;
  std::uintptr_t lo() const { return at_end ? hole->ptr + hole->size - bytes : hole->ptr; }
};

// The lowest hole of `stream`'s plain segments that holds `rounded` with the free bytes beside it,
// as PyTorch's expandable segments map pages at the lowest address that fits, after the free block
// before them: in it, the fewest granules: its first after the free block before it, or its last
// before the free block after it, or all of it between both; nullopt when no hole holds it. (The
// hole that needs the fewest granules anywhere was measured too: 0.0007 x peak live more on
// mooncake Llama growth, docs/vmm.md.)
std::optional<Destination> FindHole(const LargePool& pool, const VirtualBacking& backing, Stream stream,
                                    std::size_t rounded) {
  const std::size_t granule = backing.granule();
  std::optional<Destination> best;
  for (Segment* seg : pool.segments()) {
    if (seg->stream != stream || seg->tier >= 0 || seg->active_blocks + seg->free_blocks == 0) continue;
    if (backing.Unusable(seg)) continue;
    for (Block* b = seg->first; b != nullptr; b = b->next) {
      if (b->state != BlockState::kUnmapped) continue;
      Block* before = b->prev != nullptr && b->prev->state == BlockState::kFree ? b->prev : nullptr;
      Block* after = b->next != nullptr && b->next->state == BlockState::kFree ? b->next : nullptr;
      const std::size_t head = before != nullptr ? before->size : 0;
      const std::size_t tail = after != nullptr ? after->size : 0;
      // A free block that holds it alone is the cache's business (best fit said no).
      if (head >= rounded || tail >= rounded || head + b->size + tail < rounded) continue;
      std::size_t need = b->size;
      bool at_end = false, aligned = false;
      if (head + b->size >= rounded) {
        need = RoundUp(rounded - head, granule);
        aligned = rounded % granule == 0 && need == rounded;
      }
      if (tail + b->size >= rounded && RoundUp(rounded - tail, granule) < need) {
        need = RoundUp(rounded - tail, granule);
        at_end = true;
        aligned = false;  // carved from the start of the granules it maps: on a granule already
      }
      if (!best.has_value() || b->ptr < best->hole->ptr) {
        best = Destination{b, Keep{before, after, seg}, need, at_end, aligned};
      }
      break;  // the segment's lowest; blocks are in address order
    }
  }
  return best;
}

}  // namespace

Stitcher::Stitcher(const PoolContext& ctx, VirtualBacking* backing)
    : ctx_(ctx), backing_(backing), granule_(backing->granule()), shift_(std::countr_zero(granule_)) {}

absl::StatusOr<Block*> Stitcher::Stitch(LargePool& pool, LargeStreamState& ss, Stream stream, std::size_t rounded,
                                        int tier) {
  const std::size_t bytes = RoundUp(rounded, granule_);
  // A plain segment is granule pieces (pool/virtual_backing.h): a larger piece is not mapped into
  // it, whether a spare or moved. A tier segment holds one block, and takes pieces of any size.
  const std::size_t max_piece = tier >= 0 ? bytes : granule_;
  absl::StatusOr<std::vector<Unit>> runs =
      ChooseRuns(pool, *backing_, ctx_.source, bytes, BytesToMove(bytes, max_piece), max_piece, Keep{});
  if (!runs.ok()) return runs.status();
  absl::StatusOr<std::uintptr_t> base = ctx_.source->ReserveRange(bytes, 0, backing_->pool_index());
  if (!base.ok()) return base.status();
  std::vector<PhysicalPiece> moved;
  absl::Status s = UnmapRuns(pool, *backing_, *runs, Keep{}, &moved);
  std::vector<PhysicalPiece> pieces;
  std::size_t stitched = 0;
  s = Gather(bytes, max_piece, std::move(s), std::move(moved), &pieces, &stitched);
  if (!s.ok()) {
    ctx_.source->ReleaseRange(*base, bytes);
    return s;
  }
  absl::StatusOr<Segment*> seg = backing_->MapNewSegment(pool, ss, stream, *base, bytes, tier, std::move(pieces));
  if (!seg.ok()) return seg.status();
  CountStitch(stitched);
  pool.Take((*seg)->first, rounded, tier);
  return (*seg)->first;
}

std::size_t Stitcher::BytesToMove(std::size_t bytes, std::size_t max_piece) const {
  // With headroom for all of it the device refused (another process holds memory), not the cap:
  // then nothing is created, all of it moves.
  std::size_t headroom = ctx_.source->Headroom() & ~(granule_ - 1);
  if (headroom >= bytes) headroom = 0;
  return bytes - headroom - backing_->SpareBytesWithin(bytes - headroom, max_piece);
}

void Stitcher::CountStitch(std::size_t stitched) {
  ctx_.stats->Count(&DeviceStats::num_stitches);
  ctx_.stats->Count(&DeviceStats::num_granules_stitched, static_cast<std::int64_t>(stitched >> shift_));
}

absl::Status Stitcher::Gather(std::size_t bytes, std::size_t max_piece, absl::Status unmapped,
                              std::vector<PhysicalPiece> moved, std::vector<PhysicalPiece>* pieces,
                              std::size_t* stitched) {
  // What moves: pieces while they fit (a plain segment's: granules); a piece past what is needed,
  // or larger than a granule for a plain segment (a tier block's), goes back to the device, and
  // what is needed of it is created anew with the rest, in granules for a plain segment.
  std::vector<PhysicalPiece> surplus;
  std::size_t rest = bytes;
  const std::size_t first = pieces->size();
  backing_->TakeSpares(&rest, max_piece, pieces);
  const std::size_t spares = pieces->size() - first;  // (*pieces)[first, first + spares) were spares
  for (const PhysicalPiece& p : moved) {
    if (p.bytes <= std::min(rest, max_piece)) {
      pieces->push_back(p);
      rest -= p.bytes;
      *stitched += p.bytes;
    } else {
      surplus.push_back(p);
    }
  }
  backing_->ReleasePieces(&surplus);
  absl::Status s = std::move(unmapped);
  if (s.ok() && rest > 0) s = backing_->Create(rest, max_piece, pieces);
  if (!s.ok()) backing_->GiveBackAfterFailure(pieces, first, spares);
  return s;
}

absl::StatusOr<Block*> Stitcher::Extend(LargePool& pool, LargeStreamState& ss, Stream stream, std::size_t rounded,
                                        bool at_cap) {
  // Garbage collection first (a grow's, as for a new range): it may release free blocks.
  if (!at_cap) ctx_.source->CollectFor(RoundUp(rounded, granule_));
  std::optional<Destination> to = FindHole(pool, *backing_, stream, rounded);
  // Else a new segment, its first granules mapped for the request and the rest a hole that later
  // grows fill.
  const std::size_t bytes = to.has_value() ? to->bytes : RoundUp(rounded, granule_);
  const Keep keep = to.has_value() ? to->keep : Keep{};
  // A grow creates what the spares leave (its failure is the source's, as a new segment's); at the
  // cap, after a grow failed, moved pieces make up the rest.
  std::optional<std::vector<Unit>> runs;
  if (at_cap) {
    absl::StatusOr<std::vector<Unit>> chosen =
        ChooseRuns(pool, *backing_, ctx_.source, bytes, BytesToMove(bytes, granule_), granule_, keep);
    if (!chosen.ok()) return chosen.status();
    runs = std::move(*chosen);
  }
  // A new segment's range, reserved before anything is unmapped: the cap's size, or just the
  // request's granules when that much address space cannot be had.
  std::optional<std::uintptr_t> base;
  std::size_t range = bytes;
  if (!to.has_value()) {
    range = std::max(bytes, ctx_.source->GrowableRangeBytes() & ~(granule_ - 1));
    absl::StatusOr<std::uintptr_t> reserved = ctx_.source->ReserveRange(range, 0, backing_->pool_index());
    if (!reserved.ok() && range > bytes) {
      range = bytes;
      reserved = ctx_.source->ReserveRange(range, 0, backing_->pool_index());
    }
    if (!reserved.ok()) return reserved.status();
    base = *reserved;
  }
  std::vector<PhysicalPiece> moved;
  absl::Status unmapped;
  if (runs.has_value()) unmapped = UnmapRuns(pool, *backing_, *runs, keep, &moved);
  std::vector<PhysicalPiece> pieces;
  std::size_t stitched = 0;
  // Away from the cap, what is created is the grow's pieces (fewer calls); at the cap, granules: what
  // moves stays movable granule by granule.
  const std::size_t piece = at_cap ? granule_ : backing_->grow_piece();
  if (absl::Status s = Gather(bytes, piece, std::move(unmapped), std::move(moved), &pieces, &stitched); !s.ok()) {
    if (base.has_value()) ctx_.source->ReleaseRange(*base, range);
    return s;
  }
  Block* block = nullptr;
  bool carved = false;
  if (base.has_value()) {
    absl::StatusOr<Segment*> seg =
        backing_->MapNewSegment(pool, ss, stream, *base, range, /*tier=*/-1, std::move(pieces), bytes);
    if (!seg.ok()) return seg.status();
    block = (*seg)->first;
  } else {
    const std::uintptr_t lo = to->lo();
    absl::StatusOr<Block*> filled = backing_->MapIntoHole(pool, to->hole, lo, std::move(pieces));
    if (!filled.ok()) return filled.status();
    block = *filled;
    if (to->aligned && block->ptr < lo) {
      absl::StatusOr<LargePool::Handle> h = pool.TakeAt(lo, rounded, stream);
      BA_CHECK(h.ok(), "the granules just mapped do not hold the request");
      block = h->block;
      carved = true;
    }
  }
  if (at_cap) CountStitch(stitched);
  if (!carved) pool.Take(block, rounded, /*tier=*/-1);
  return block;
}

void Stitcher::ReleaseFreeGranules(LargePool& pool) {
  // Nothing to give back: no spare and no whole granule inside a free block (then no stream is
  // synchronized).
  if (backing_->spare_bytes() == 0 && !AnyFreeWholeGranule(pool, *backing_)) return;
  std::vector<PhysicalPiece> pieces = backing_->TakeAllSpares();
  // The segments left (partly used ones, and wholly free ones whose release failed): their free
  // blocks' whole pieces, once the segment's stream has passed their last use.
  std::vector<Segment*> partly(pool.segments().begin(), pool.segments().end());
  std::sort(partly.begin(), partly.end(), [](const Segment* a, const Segment* b) { return a->base < b->base; });
  StreamWaits waits(ctx_.source);
  for (Segment* seg : partly) {
    if (seg->free_blocks == 0 || !waits.Passed(seg->stream)) continue;
    // Carving a block changes only it and the holes beside it, so the others stay valid; their
    // piece indices shift, so each is looked up when its turn comes.
    absl::InlinedVector<Block*, 8> free_blocks;
    for (Block* b = seg->first; b != nullptr; b = b->next) {
      if (b->state == BlockState::kFree) free_blocks.push_back(b);
    }
    for (Block* b : free_blocks) {
      std::size_t first = 0, last = 0;
      if (backing_->WholePieces(b, &first, &last) > 0 && !backing_->UnmapPieces(pool, b, first, last, &pieces).ok()) {
        break;
      }
    }
    // A wholly free segment whose release failed part-way may be all hole now.
    if (seg->active_blocks == 0 && seg->free_blocks == 0) pool.DropSegment(seg);
  }
  backing_->ReleasePieces(&pieces);
}

}  // namespace bucketalloc::internal
