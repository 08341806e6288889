// src/backend/registry.cc — the table of backends (src/backend/registry.h).
#include "backend/registry.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace bucketalloc::internal {
namespace {

// One line per backend; the order is the order of the docs and of "accepted" texts.
const BackendEntry* const kRegistry[] = {&kSimBackendEntry, &kCudaBackendEntry, &kVmmBackendEntry};

}  // namespace

absl::Span<const BackendEntry* const> Backends() { return kRegistry; }

const BackendEntry* FindBackend(absl::string_view name) {
  for (const BackendEntry* e : kRegistry) {
    if (name == e->name) return e;
  }
  return nullptr;
}

std::string BackendNamesText() {
  std::vector<absl::string_view> names;
  for (const BackendEntry* e : kRegistry) names.push_back(e->name);
  if (names.size() == 1) return std::string(names[0]);
  const absl::string_view last = names.back();
  names.pop_back();
  return absl::StrCat(absl::StrJoin(names, ", "), " or ", last);
}

const BackendOptionSpec* FindBackendOption(absl::string_view key) {
  for (const BackendEntry* e : kRegistry) {
    for (const BackendOptionSpec& spec : e->options) {
      if (key == spec.name) return &spec;
    }
  }
  return nullptr;
}

}  // namespace bucketalloc::internal
