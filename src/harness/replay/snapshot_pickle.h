// src/harness/replay/snapshot_pickle.h — reads a PyTorch memory snapshot pickle (layer L5, the benchmark
// harness): the file torch.cuda.memory._dump_snapshot() writes (Python's pickle of the snapshot dict,
// reference/pytorch.md §4.2), or torch's own C++ pickler (_memory_snapshot_pickled), as JSON.
//
// Owns: `ParsePlainPickle`, a reader of the plain-data subset of Python's pickle format, protocols 0
// to 5: None, booleans, integers, floats, strings and bytes, lists, tuples (as lists), dicts (keys
// that are not strings become their JSON text), the memo (PUT/GET, MEMOIZE: shared references stay
// shared) and protocol 4's framing. Every opcode that names or calls code (GLOBAL, STACK_GLOBAL,
// REDUCE, BUILD, INST, OBJ, NEWOBJ, EXT*, PERSID) is refused before anything of the file is used,
// as tools/import_torch_snapshot.py's restricted unpickler refuses them: a memory snapshot holds
// only plain data, so a file that needs them is not one, or is hostile.
// Limits: nesting at most kMaxPickleDepth deep; a container that holds itself, shared references
// that expand to more than 16 values per byte of the input, and a length beyond the end of the
// input are errors.
// Thread-safety: none needed (a function of its input).
#ifndef BUCKETALLOC_HARNESS_REPLAY_SNAPSHOT_PICKLE_H_
#define BUCKETALLOC_HARNESS_REPLAY_SNAPSHOT_PICKLE_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace bucketalloc::harness {

inline constexpr int kMaxPickleDepth = 256;

// True when `bytes` starts as a pickle of protocol 2 or later does (the PROTO opcode; what
// _dump_snapshot writes is protocol 4 or 5). Protocols 0 and 1 have no mark of their own: their
// bytes are read by ParsePlainPickle when a caller knows them to be a pickle.
bool LooksLikePickle(absl::string_view bytes);

// The plain data of a pickle. InvalidArgument names the opcode and its offset: one that would run
// code ("refusing to load module.name"), one this reader does not know, a truncated or malformed
// input, or data nested too deep.
absl::StatusOr<nlohmann::json> ParsePlainPickle(absl::string_view bytes, absl::string_view source = "pickle");

// A memory snapshot's pickle as the snapshot's JSON: ParsePlainPickle's data, which must be a dict
// with "device_traces" (InvalidArgument naming `source` and `accepted` otherwise), with an empty
// "segments" list added when it has none.
absl::StatusOr<nlohmann::json> ParseSnapshotPickle(absl::string_view bytes, absl::string_view source,
                                                   absl::string_view accepted);

}  // namespace bucketalloc::harness

#endif  // BUCKETALLOC_HARNESS_REPLAY_SNAPSHOT_PICKLE_H_
