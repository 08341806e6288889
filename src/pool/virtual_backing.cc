// src/pool/virtual_backing.cc — virtual-memory segments: ranges mapped by pieces, spares, and the
// stitcher's entry points (pool/virtual_backing.h).
#include "pool/virtual_backing.h"

#include <algorithm>
#include <bit>
#include <utility>

#include "absl/strings/str_cat.h"
#include "internal/bits.h"
#include "internal/check.h"
#include "pool/large_pool.h"
#include "pool/plain_backing.h"
#include "pool/stitcher.h"

namespace bucketalloc::internal {

namespace {

std::size_t BytesOf(absl::Span<const PhysicalPiece> pieces) {
  std::size_t bytes = 0;
  for (const PhysicalPiece& p : pieces) bytes += p.bytes;
  return bytes;
}

}  // namespace

VirtualBacking::VirtualBacking(const PoolContext& ctx, PoolIndex pool, std::size_t granule, std::size_t grow_piece)
    : ctx_(ctx), pool_(pool), granule_(granule), grow_piece_(grow_piece), shift_(std::countr_zero(granule)) {
  BA_CHECK(IsPowerOfTwo(granule), "a granule is a power of two");
  BA_CHECK(grow_piece >= granule && grow_piece % granule == 0, "a grow's piece is whole granules");
  stitcher_ = std::make_unique<Stitcher>(ctx_, this);
}

VirtualBacking::~VirtualBacking() = default;

absl::StatusOr<Segment*> VirtualBacking::Grow(LargePool& pool, LargeStreamState& ss, Stream stream, std::size_t bytes,
                                              int tier) {
  absl::StatusOr<std::uintptr_t> base = ctx_.source->ReserveRange(bytes, bytes, pool_);
  if (!base.ok()) return base.status();
  std::vector<PhysicalPiece> pieces;
  // A tier segment holds one block, never split: it is one piece (three driver calls), which moves
  // whole. Other segments are split, and a piece shared by a live block and free bytes keeps them
  // from moving; away from the cap (here: a grow) the pieces are grow_piece_, fewer driver calls on
  // the request's path, and a stitch at the cap creates and moves granules (Stitcher).
  const std::size_t piece = tier >= 0 ? bytes : grow_piece_;
  std::size_t rest = bytes;
  TakeSpares(&rest, piece, &pieces);
  const std::size_t spares = pieces.size();  // pieces [0, spares) were spares
  absl::Status s = rest > 0 ? Create(rest, piece, &pieces) : absl::OkStatus();
  if (!s.ok()) {
    GiveBackAfterFailure(&pieces, 0, spares);
    ctx_.source->ReleaseRange(*base, bytes);
    return s;
  }
  return MapNewSegment(pool, ss, stream, *base, bytes, tier, std::move(pieces));
}

bool VirtualBacking::Release(LargePool& pool, Segment* seg) {
  if (!ctx_.source->SynchronizeStream(seg->stream).ok()) {
    ctx_.stats->Count(&DeviceStats::num_device_free_failures);
    return false;
  }
  std::vector<PhysicalPiece> unmapped;
  absl::Status s;
  while (s.ok() && seg->free_blocks > 0) {
    Block* b = seg->first;
    while (b->state != BlockState::kFree) b = b->next;
    std::size_t first = 0, last = 0;
    WholePieces(b, &first, &last);  // all of it: its neighbours are holes or the segment's ends
    s = UnmapPieces(pool, b, first, last, &unmapped);
  }
  ReleasePieces(&unmapped);
  if (!s.ok()) {
    ctx_.stats->Count(&DeviceStats::num_device_free_failures);
    return false;
  }
  pool.DropSegment(seg);
  return true;
}

void VirtualBacking::Forget(Segment* seg) {
  pieces_.erase(seg);
  seg->pieces = nullptr;
  if (unusable_.erase(seg) > 0) {
    ctx_.source->AbandonRange(seg->base, seg->size);  // mappings it could not undo lie in it
    return;
  }
  ctx_.source->ReleaseRange(seg->base, seg->size);
}

absl::Span<const Piece> VirtualBacking::pieces(const Segment* seg) const {
  return seg->pieces == nullptr ? absl::Span<const Piece>() : absl::Span<const Piece>(*seg->pieces);
}

std::size_t VirtualBacking::WholeGranules(const Block* block, std::size_t* g0, std::size_t* g1) const {
  const std::uintptr_t base = block->segment->base;
  const std::size_t lo = RoundUp(block->ptr - base, granule_) >> shift_;
  const std::size_t hi = (block->ptr + block->size - base) >> shift_;
  if (g0 != nullptr) *g0 = lo;
  if (g1 != nullptr) *g1 = hi;
  return hi > lo ? hi - lo : 0;
}

std::size_t VirtualBacking::WholePieces(const Block* block, std::size_t* first, std::size_t* last) const {
  std::size_t g0 = 0, g1 = 0;
  *first = *last = 0;
  if (WholeGranules(block, &g0, &g1) == 0) return 0;
  absl::Span<const Piece> table = pieces(block->segment);
  // The first piece that starts at or after g0, and every piece after it that ends by g1: a free
  // block holds no hole, so they lie side by side.
  std::size_t i = static_cast<std::size_t>(
      std::lower_bound(table.begin(), table.end(), g0, [](const Piece& p, std::size_t g) { return p.g0 < g; }) -
      table.begin());
  std::size_t j = i, bytes = 0;
  while (j < table.size() && table[j].g0 + table[j].n <= g1) bytes += table[j++].n << shift_;
  *first = i;
  *last = j;
  return bytes;
}

std::size_t VirtualBacking::MovableBytes(const LargePool& pool) const {
  std::size_t bytes = 0;
  pool.ForEachSegment([&](const Segment& seg) {
    for (const Block* b = seg.first; b != nullptr; b = b->next) {
      std::size_t first = 0, last = 0;
      if (b->state == BlockState::kFree) bytes += WholePieces(b, &first, &last);
    }
  });
  return bytes;
}

std::optional<absl::StatusOr<Block*>> VirtualBacking::ServeAtCap(LargePool& pool, LargeStreamState& ss, Stream stream,
                                                                 std::size_t rounded, int tier) {
  // No stitching during a capture: it unmaps granules, which CUDA forbids then.
  if (ctx_.source->Capturing()) return std::nullopt;
  // A plain request grows a segment in place with moved pieces, as it would with created ones.
  absl::StatusOr<Block*> stitched = tier < 0 && GrowsInPlace(pool)
                                        ? stitcher_->Extend(pool, ss, stream, rounded, /*at_cap=*/true)
                                        : stitcher_->Stitch(pool, ss, stream, rounded, tier);
  if (stitched.ok()) return stitched;
  return absl::StatusOr<Block*>(
      absl::Status(stitched.status().code(), absl::StrCat("stitching: ", stitched.status().message())));
}

void VirtualBacking::ReleaseFreeMemory(LargePool& pool) { stitcher_->ReleaseFreeGranules(pool); }

bool VirtualBacking::GrowsInPlace(const LargePool& pool) { return pool.config().max_split_size == kUnlimited; }

std::optional<absl::StatusOr<Block*>> VirtualBacking::Extend(LargePool& pool, LargeStreamState& ss, Stream stream,
                                                             std::size_t rounded) {
  if (!GrowsInPlace(pool)) return std::nullopt;
  return stitcher_->Extend(pool, ss, stream, rounded, /*at_cap=*/false);
}

absl::Status VirtualBacking::PiecesUnder(const LargePool& pool, const Block* block, std::uintptr_t* first_va,
                                         std::vector<PhysicalPiece>* out) const {
  const Segment* seg = block->segment;
  if (seg->pieces == nullptr) {
    return absl::FailedPreconditionError("bucketalloc: the block is not in a virtual-memory segment");
  }
  const std::size_t g = granule_;
  const std::size_t lo = (block->ptr - seg->base) / g;                        // its first granule
  const std::size_t hi = (block->ptr + block->size - seg->base + g - 1) / g;  // past its last
  *first_va = 0;
  for (const Piece& p : *seg->pieces) {
    if (p.g0 + p.n <= lo || p.g0 >= hi) continue;
    if (*first_va == 0) *first_va = seg->base + p.g0 * g;
    out->push_back(PhysicalPiece{p.handle, p.n * g});
  }
  return absl::OkStatus();
}

std::size_t VirtualBacking::SpareBytesWithin(std::size_t bytes, std::size_t max_piece) const {
  std::size_t taken = 0;
  for (std::size_t i = spare_.size(); i-- > 0 && taken < bytes;) {
    if (spare_[i].bytes <= std::min(max_piece, bytes - taken)) taken += spare_[i].bytes;
  }
  return taken;
}

void VirtualBacking::TakeSpares(std::size_t* bytes, std::size_t max_piece, std::vector<PhysicalPiece>* out) {
  for (std::size_t i = spare_.size(); i-- > 0 && *bytes > 0;) {
    if (spare_[i].bytes > std::min(max_piece, *bytes)) continue;
    *bytes -= spare_[i].bytes;
    spare_bytes_ -= spare_[i].bytes;
    ctx_.stats->Decrease(&DeviceStats::cached_bytes, pool_, static_cast<std::int64_t>(spare_[i].bytes));
    out->push_back(spare_[i]);
    spare_.erase(spare_.begin() + static_cast<std::ptrdiff_t>(i));
  }
}

absl::Status VirtualBacking::Create(std::size_t bytes, std::size_t piece, std::vector<PhysicalPiece>* out) {
  BA_DCHECK(bytes > 0 && bytes % granule_ == 0 && piece > 0 && piece % granule_ == 0,
            "creating memory that is not whole granules");
  for (std::size_t done = 0; done < bytes;) {
    const std::size_t n = std::min(piece, bytes - done);
    absl::StatusOr<PhysicalHandle> h = ctx_.source->CreatePhysical(n, pool_);
    if (!h.ok()) return h.status();
    out->push_back({*h, n});
    done += n;
  }
  return absl::OkStatus();
}

absl::StatusOr<Segment*> VirtualBacking::MapNewSegment(LargePool& pool, LargeStreamState& ss, Stream stream,
                                                       std::uintptr_t base, std::size_t bytes, int tier,
                                                       std::vector<PhysicalPiece> pieces, std::size_t mapped_bytes) {
  mapped_bytes = std::min(mapped_bytes, bytes);
  BA_DCHECK(BytesOf(pieces) == mapped_bytes, "a new segment's pieces do not cover it");
  std::size_t mapped = 0;
  absl::Status s = ctx_.source->MapPieces(base, pieces, &mapped);
  const absl::Span<const PhysicalPiece> done = absl::MakeConstSpan(pieces).first(mapped);
  std::vector<Piece> table = TableOf(0, done);
  if (s.ok()) {
    Segment* seg = pool.AddSegment(ss, stream, base, bytes, tier, mapped_bytes);
    AttachPieces(seg, std::move(table));
    return seg;
  }
  std::vector<PhysicalPiece> unmapped(pieces.begin() + static_cast<std::ptrdiff_t>(mapped), pieces.end());
  ReleasePieces(&unmapped);
  if (absl::IsDataLoss(s)) {
    // Pieces that could not be unmapped again: the range is never used again (their memory goes
    // back to the device when the driver lets go of the mappings).
    ctx_.source->AbandonRange(base, bytes);
  } else if (mapped == 0) {
    ctx_.source->ReleaseRange(base, bytes);
  } else {
    // The mapped prefix is cached memory like any other (a plain segment: a tier segment has no holes).
    Segment* seg = pool.AddSegment(ss, stream, base, bytes, -1, /*mapped=*/BytesOf(done));
    AttachPieces(seg, std::move(table));
  }
  return s;
}

absl::StatusOr<Block*> VirtualBacking::MapIntoHole(LargePool& pool, Block* hole, std::uintptr_t lo,
                                                   std::vector<PhysicalPiece> pieces) {
  Segment* seg = hole->segment;
  BA_DCHECK(lo >= hole->ptr && lo + BytesOf(pieces) <= hole->ptr + hole->size, "mapping outside a hole");
  std::size_t mapped = 0;
  absl::Status s = ctx_.source->MapPieces(lo, pieces, &mapped);
  const absl::Span<const PhysicalPiece> done = absl::MakeConstSpan(pieces).first(mapped);
  const std::size_t g = (lo - seg->base) >> shift_, bytes = BytesOf(done);
  std::vector<Piece>& table = *seg->pieces;
  const std::vector<Piece> added = TableOf(g, done);
  table.insert(std::lower_bound(table.begin(), table.end(), g, [](const Piece& p, std::size_t x) { return p.g0 < x; }),
               added.begin(), added.end());
  Block* block = bytes > 0 ? pool.FillHole(hole, lo, lo + bytes) : nullptr;
  if (s.ok()) return block;
  // Pieces that could not be unmapped again lie in the hole: it is never mapped again, and the
  // range never handed out again (Forget).
  if (absl::IsDataLoss(s)) unusable_.insert(seg);
  std::vector<PhysicalPiece> unmapped(pieces.begin() + static_cast<std::ptrdiff_t>(mapped), pieces.end());
  ReleasePieces(&unmapped);
  return s;
}

absl::Status VirtualBacking::UnmapPieces(LargePool& pool, Block* block, std::size_t first, std::size_t last,
                                         std::vector<PhysicalPiece>* out) {
  Segment* seg = block->segment;
  std::vector<Piece>& table = *seg->pieces;
  BA_DCHECK(first < last && last <= table.size(), "unmapping no piece");
  const std::uintptr_t lo = seg->base + (table[first].g0 << shift_);
  const std::uintptr_t hi = seg->base + ((table[last - 1].g0 + table[last - 1].n) << shift_);
  BA_DCHECK(block->state == BlockState::kFree && lo >= block->ptr && hi <= block->ptr + block->size,
            "unmapping pieces that are not wholly inside a free block");
  if (absl::Status s = ctx_.source->Unmap(lo, hi - lo); !s.ok()) return s;
  for (std::size_t i = first; i < last; ++i) out->push_back({table[i].handle, table[i].n << shift_});
  table.erase(table.begin() + static_cast<std::ptrdiff_t>(first), table.begin() + static_cast<std::ptrdiff_t>(last));
  pool.MakeHole(block, lo, hi);
  return absl::OkStatus();
}

std::vector<Piece> VirtualBacking::TableOf(std::size_t g0, absl::Span<const PhysicalPiece> mapped) const {
  std::vector<Piece> table;
  table.reserve(mapped.size());
  for (const PhysicalPiece& p : mapped) {
    table.push_back({g0, p.bytes >> shift_, p.handle});
    g0 += p.bytes >> shift_;
  }
  return table;
}

void VirtualBacking::AttachPieces(Segment* seg, std::vector<Piece> table) {
  auto owned = std::make_unique<std::vector<Piece>>(std::move(table));
  seg->pieces = owned.get();
  pieces_[seg] = std::move(owned);
}

absl::StatusOr<std::size_t> VirtualBacking::Prefetch(std::size_t spare_target, std::size_t max_create) {
  // Whole granules, never more than asked.
  const std::size_t bytes =
      std::min(spare_target > spare_bytes_ ? spare_target - spare_bytes_ : 0, max_create) & ~(granule_ - 1);
  if (bytes == 0) return 0;
  // Granules: a spare of any larger size would serve fewer requests (TakeSpares takes a spare only
  // whole, and a stitch at the cap takes granules).
  std::vector<PhysicalPiece> pieces;
  absl::Status s = Create(bytes, granule_, &pieces);
  const std::size_t created = BytesOf(pieces);
  for (const PhysicalPiece& p : pieces) AddSpare(p);
  if (!s.ok() && created == 0) return s;
  return created;
}

void VirtualBacking::GiveBackAfterFailure(std::vector<PhysicalPiece>* pieces, std::size_t first, std::size_t spares) {
  const auto begin = pieces->begin() + static_cast<std::ptrdiff_t>(first);
  const auto end = begin + static_cast<std::ptrdiff_t>(spares);
  for (auto it = begin; it != end; ++it) AddSpare(*it);
  pieces->erase(begin, end);
  ReleasePieces(pieces);
}

void VirtualBacking::AddSpare(const PhysicalPiece& piece) {
  spare_.push_back(piece);
  spare_bytes_ += piece.bytes;
  ctx_.stats->Increase(&DeviceStats::cached_bytes, pool_, static_cast<std::int64_t>(piece.bytes));
}

void VirtualBacking::ReleasePieces(std::vector<PhysicalPiece>* pieces) {
  for (const PhysicalPiece& p : *pieces) {
    if (ctx_.source->ReleasePhysical(p, pool_)) {
      ctx_.stats->Count(&DeviceStats::num_granules_released, static_cast<std::int64_t>(p.bytes >> shift_));
    } else {
      AddSpare(p);
    }
  }
  pieces->clear();
}

std::vector<PhysicalPiece> VirtualBacking::TakeAllSpares() {
  std::vector<PhysicalPiece> taken;
  taken.swap(spare_);
  ctx_.stats->Decrease(&DeviceStats::cached_bytes, pool_, static_cast<std::int64_t>(spare_bytes_));
  spare_bytes_ = 0;
  return taken;
}

absl::Status VirtualBacking::CheckInvariants(const LargePool& pool) const {
  absl::Status status;
  std::size_t segments = 0;
  pool.ForEachSegment([&](const Segment& seg) {
    ++segments;
    if (!status.ok()) return;
    auto fail = [&](absl::string_view what) {
      status = absl::InternalError(
          absl::StrCat("large pool: segment ", absl::Hex(seg.base), " (", seg.size, " bytes): ", what));
    };
    auto it = pieces_.find(&seg);
    if (it == pieces_.end() || it->second.get() != seg.pieces) return fail("it has no piece table");
    if (seg.size % granule_ != 0) return fail("it is not whole granules");
    // Which granules lie in a piece.
    const std::size_t n = seg.size >> shift_;
    std::vector<bool> mapped(n);
    std::size_t end = 0;
    for (const Piece& p : *it->second) {
      if (p.n == 0 || p.g0 < end || p.g0 + p.n > n || p.handle == 0) {
        return fail("its pieces are not ordered, overlap, leave it or have no handle");
      }
      std::fill(mapped.begin() + static_cast<std::ptrdiff_t>(p.g0),
                mapped.begin() + static_cast<std::ptrdiff_t>(p.g0 + p.n), true);
      end = p.g0 + p.n;
    }
    for (const Block* b = seg.first; b != nullptr; b = b->next) {
      // A hole is whole granules with no physical memory; every other block lies on mapped ones.
      const bool hole = b->state == BlockState::kUnmapped;
      if (hole && ((b->ptr - seg.base) % granule_ != 0 || b->size % granule_ != 0)) {
        return fail("a hole is not granule-aligned");
      }
      for (std::size_t i = (b->ptr - seg.base) >> shift_; i < (b->ptr + b->size - seg.base + granule_ - 1) >> shift_;
           ++i) {
        if (mapped[i] == hole) return fail("a granule's mapping does not match its block");
      }
    }
  });
  if (!status.ok()) return status;
  if (pieces_.size() != segments) return absl::InternalError("large pool: a piece table belongs to no segment");
  std::size_t spare = 0;
  for (const PhysicalPiece& p : spare_) {
    if (p.handle == 0 || p.bytes == 0 || p.bytes % granule_ != 0) {
      return absl::InternalError("large pool: a spare piece has no handle or is not whole granules");
    }
    spare += p.bytes;
  }
  if (spare != spare_bytes_) return absl::InternalError("large pool: the spare pieces' bytes are miscounted");
  return absl::OkStatus();
}

std::unique_ptr<SegmentBacking> MakeSegmentBacking(const PoolContext& ctx, const LargePoolConfig& config,
                                                   bool virtual_memory) {
  if (virtual_memory) return std::make_unique<VirtualBacking>(ctx, config.index, config.granularity, config.grow_piece);
  return std::make_unique<PlainBacking>(ctx.source);
}

}  // namespace bucketalloc::internal
