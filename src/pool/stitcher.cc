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

}  // namespace

Stitcher::Stitcher(const PoolContext& ctx, VirtualBacking* backing)
    : ctx_(ctx), backing_(backing), granule_(backing->granule()), shift_(std::countr_zero(granule_)) {}

absl::StatusOr<Block*> Stitcher::Stitch(LargePool& pool, LargeStreamState& ss, Stream stream, std::size_t rounded,
                                        int tier) {
  const std::size_t bytes = RoundUp(rounded, granule_);
  // Stitch runs after a grow of `bytes` failed. With headroom for all of it, the device refused
  // (another process holds memory), not the cap: then nothing is created, all of it moves.
  std::size_t headroom = ctx_.source->Headroom() & ~(granule_ - 1);
  if (headroom >= bytes) headroom = 0;
  // A plain segment is granule pieces (pool/virtual_backing.h): a larger piece is not mapped into
  // it, whether a spare or moved. A tier segment holds one block, and takes pieces of any size.
  const std::size_t max_piece = tier >= 0 ? bytes : granule_;
  const std::size_t spares = backing_->SpareBytesWithin(bytes - headroom, max_piece);
  const std::size_t want = bytes - headroom - spares;
  // The units a stitch may take: the whole pieces of free blocks (a walk; too few of them and the
  // choice below refuses, naming the bytes, before any stream wait or backend call).
  std::vector<Unit> units;
  std::size_t movable = 0;
  for (Segment* seg : pool.segments()) {
    for (Block* b = seg->first; b != nullptr && want > 0; b = b->next) {
      std::size_t first = 0, last = 0;
      if (b->state != BlockState::kFree) continue;
      const std::size_t whole = backing_->WholePieces(b, &first, &last);
      if (whole == 0) continue;
      movable += whole;
      absl::Span<const Piece> table = backing_->pieces(seg);
      if (seg->tier >= 0) {
        bool coarse = false;
        for (std::size_t i = first; i < last; ++i) coarse = coarse || (table[i].n << shift_) > max_piece;
        units.push_back(Unit{b->free_since, b->ptr, b, first, last, whole, coarse});
        continue;
      }
      // A plain block's pieces one by one, its top ones first (its start stays where it is).
      for (std::size_t i = last; i-- > first;) {
        const std::size_t piece = table[i].n << shift_;
        units.push_back(
            Unit{b->free_since, seg->base + (table[i].g0 << shift_), b, i, i + 1, piece, piece > max_piece});
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
  StreamWaits waits(ctx_.source);
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
  absl::InlinedVector<Segment*, 8> touched;
  for (const Unit& u : runs) {
    if (!Contains(touched, u.block->segment)) touched.push_back(u.block->segment);
  }
  absl::StatusOr<std::uintptr_t> base = ctx_.source->ReserveRange(bytes, 0);
  if (!base.ok()) return base.status();
  std::vector<PhysicalPiece> moved;
  absl::Status s;
  for (const Unit& u : runs) {
    // Its block: a run's block may have been carved by a run above it (MakeHole keeps the block
    // object for the part below the hole, where the runs below lie).
    s = backing_->UnmapPieces(pool, u.block, u.first, u.last, &moved);
    if (!s.ok()) break;
  }
  for (Segment* seg : touched) {
    if (seg->active_blocks == 0 && seg->free_blocks == 0) pool.DropSegment(seg);  // all hole now
  }
  // What moves: pieces while they fit (a plain segment's: granules); a piece past what is needed,
  // or larger than a granule for a plain segment (a tier block's), goes back to the device, and
  // what is needed of it is created anew with the rest, in granules for a plain segment.
  std::vector<PhysicalPiece> pieces, surplus;
  std::size_t rest = bytes;
  backing_->TakeSpares(&rest, max_piece, &pieces);
  std::size_t stitched = 0;
  for (const PhysicalPiece& p : moved) {
    if (p.bytes <= std::min(rest, max_piece)) {
      pieces.push_back(p);
      rest -= p.bytes;
      stitched += p.bytes;
    } else {
      surplus.push_back(p);
    }
  }
  backing_->ReleasePieces(&surplus);
  if (s.ok() && rest > 0) s = backing_->Create(rest, max_piece, &pieces);
  if (!s.ok()) {
    backing_->ReleasePieces(&pieces);
    ctx_.source->ReleaseRange(*base, bytes);
    return s;
  }
  absl::StatusOr<Segment*> seg = backing_->MapNewSegment(pool, ss, stream, *base, bytes, tier, std::move(pieces));
  if (!seg.ok()) return seg.status();
  ctx_.stats->Count(&DeviceStats::num_stitches);
  ctx_.stats->Count(&DeviceStats::num_granules_stitched, static_cast<std::int64_t>(stitched >> shift_));
  pool.Take((*seg)->first, rounded, tier);
  return (*seg)->first;
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
