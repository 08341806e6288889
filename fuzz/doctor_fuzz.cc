// fuzz/doctor_fuzz.cc — the doctor's input and verdicts (src/harness/operations/doctor_input.cc, doctor.cc), on
// any bytes (the timeline reader alone: fuzz/timeline_fuzz.cc):
//   - the doctor's input, the bytes as a file (a timeline, a snapshot or an RMM trace, replayed on a
//     64 MiB simulated card): it reads, with samples, or fails with an error that names the file;
//   - what reads gets verdicts for every device it holds, each with evidence and a lever, as text,
//     JSON (which parses) and a page, and never "healthy" for a device whose samples show more
//     memory held than reserved.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "bucketalloc/timeline.h"
#include "fuzz_util.h"
#include "harness/operations/doctor.h"
#include "nlohmann/json.hpp"

namespace {

using bucketalloc::TimelineSample;
using bucketalloc::fuzz::Broken;
using bucketalloc::harness::Verdict;

std::string g_path;  // the input as a file (one per process: libFuzzer runs inputs one at a time)

void CheckVerdicts(const std::vector<TimelineSample>& samples) {
  const std::vector<Verdict> verdicts = bucketalloc::harness::DiagnoseAll(samples);
  std::set<int> devices, judged;
  for (const TimelineSample& s : samples) devices.insert(s.device);
  for (const Verdict& v : verdicts) {
    judged.insert(v.device);
    if (v.evidence.empty() || v.lever.empty()) Broken("a verdict has evidence and a lever");
  }
  if (devices != judged) Broken("every device of the samples gets a verdict, and no other");
  for (const TimelineSample& s : samples) {
    if (s.allocated_bytes <= s.reserved_bytes && s.cached_bytes <= s.reserved_bytes) continue;
    for (const Verdict& v : verdicts) {
      if (v.device == s.device && v.verdict == bucketalloc::harness::Finding::kHealthy)
        Broken("a sample above its reserved memory is not healthy");
    }
  }
  const nlohmann::json j = nlohmann::json::parse(bucketalloc::harness::VerdictsToJson(verdicts), nullptr, false);
  if (!j.is_object() || !j.contains("verdicts")) Broken("the verdicts' JSON parses");
  (void)bucketalloc::harness::VerdictsToText(verdicts);
  if (samples.size() <= 2000) (void)bucketalloc::harness::DoctorHtml(verdicts, samples, "fuzz");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  char name[] = "/tmp/bucketalloc_doctor_fuzz_XXXXXX";
  const int fd = mkstemp(name);
  if (fd < 0) Broken("a temporary file for the doctor's input");
  close(fd);
  g_path = name;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // The doctor's input, from a file.
  std::FILE* f = std::fopen(g_path.c_str(), "wb");
  if (f == nullptr) Broken("writing the doctor's input");
  if (size > 0 && std::fwrite(data, 1, size, f) != size) Broken("writing the doctor's input");
  std::fclose(f);
  bucketalloc::harness::DoctorOptions options;
  options.capacity = std::size_t{64} << 20;
  absl::StatusOr<bucketalloc::harness::DoctorInput> in = bucketalloc::harness::ReadDoctorInput(g_path, options);
  if (!in.ok()) {
    if (!absl::StrContains(in.status().message(), g_path)) {
      Broken("the doctor's error names the file", in.status().ToString());
    }
    return 0;
  }
  if (in->samples.empty()) Broken("what the doctor reads has samples");
  CheckVerdicts(in->samples);
  return 0;
}
