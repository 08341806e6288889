// src/harness/replay/trace.cc — RMM replay-log CSV reading and writing.
#include "harness/replay/trace.h"

#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bucketalloc/allocator.h"

namespace bucketalloc::harness {
namespace {

constexpr absl::string_view kHeader = "Thread,Time,Action,Pointer,Size,Stream";

// Parses a pointer or stream: "0x..." hex, "(nil)", or decimal.
bool ParseAddress(absl::string_view s, std::uint64_t* out) {
  s = absl::StripAsciiWhitespace(s);
  if (s == "(nil)" || s == "0" || s == "nullptr") {
    *out = 0;
    return true;
  }
  if (absl::StartsWith(s, "0x") || absl::StartsWith(s, "0X")) {
    s.remove_prefix(2);
    return !s.empty() && absl::SimpleHexAtoi(s, out);
  }
  return absl::SimpleAtoi(s, out);
}

absl::Status LineError(absl::string_view source, int line, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(source, ":", line, ": ", what));
}

}  // namespace

std::string Excerpt(absl::string_view text, std::size_t max_bytes) {
  if (text.size() <= max_bytes) return absl::CHexEscape(text);
  return absl::StrCat(absl::CHexEscape(text.substr(0, max_bytes)), "...");
}

absl::Status CheckEventSize(const TraceEvent& e, absl::string_view source) {
  if (e.size <= kMaxRequestBytes) return absl::OkStatus();
  return LineError(source, e.line,
                   absl::StrCat("Size ", e.size, " is larger than any allocator accepts; accepted: 0 to ",
                                kMaxRequestBytes, " (kMaxRequestBytes, 64 TiB)"));
}

absl::Status CheckTrace(const Trace& trace, absl::string_view source) {
  for (const TraceEvent& e : trace.events) {
    if (absl::Status s = CheckEventSize(e, source); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<Trace> ParseTrace(absl::string_view text, absl::string_view source) {
  Trace trace;
  int line_number = 0;
  bool header_seen = false;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripTrailingAsciiWhitespace(line);
    if (line.empty()) continue;
    if (!header_seen) {
      if (absl::StripAsciiWhitespace(line) != kHeader) {
        return LineError(source, line_number,
                         absl::StrCat("expected the header \"", kHeader, "\" (RMM's replay-log CSV), found \"",
                                      Excerpt(line), "\""));
      }
      header_seen = true;
      continue;
    }
    std::vector<absl::string_view> f = absl::StrSplit(line, ',');
    if (f.size() != 6) {
      return LineError(source, line_number, absl::StrCat("has ", f.size(), " fields; accepted: 6 (", kHeader, ")"));
    }
    TraceEvent e;
    e.line = line_number;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(f[0]), &e.thread) && !ParseAddress(f[0], &e.thread)) {
      return LineError(source, line_number, absl::StrCat("Thread \"", Excerpt(f[0]), "\" is not an integer"));
    }
    e.time = std::string(absl::StripAsciiWhitespace(f[1]));
    const absl::string_view action = absl::StripAsciiWhitespace(f[2]);
    if (action == "allocate") {
      e.action = TraceAction::kAllocate;
    } else if (action == "free") {
      e.action = TraceAction::kFree;
    } else if (action == "allocate failure") {
      e.action = TraceAction::kAllocateFailure;
    } else {
      return LineError(
          source, line_number,
          absl::StrCat("Action \"", Excerpt(action), "\" is unknown; accepted: allocate, free, allocate failure"));
    }
    if (!ParseAddress(f[3], &e.pointer)) {
      return LineError(
          source, line_number,
          absl::StrCat("Pointer \"", Excerpt(f[3]), "\" is not an address; accepted: 0x-hex, decimal or (nil)"));
    }
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(f[4]), &e.size)) {
      return LineError(source, line_number, absl::StrCat("Size \"", Excerpt(f[4]), "\" is not a non-negative integer"));
    }
    if (absl::Status s = CheckEventSize(e, source); !s.ok()) return s;
    if (!ParseAddress(f[5], &e.stream)) {
      return LineError(
          source, line_number,
          absl::StrCat("Stream \"", Excerpt(f[5]), "\" is not a stream; accepted: 0x-hex, decimal or (nil)"));
    }
    if (e.action != TraceAction::kAllocateFailure && e.pointer == 0) {
      return LineError(source, line_number, "Pointer is null; only an \"allocate failure\" has no pointer");
    }
    trace.events.push_back(std::move(e));
  }
  if (!header_seen) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": empty; expected the header \"", kHeader, "\""));
  }
  return trace;
}

absl::StatusOr<std::string> ReadTextFile(const std::string& path, absl::string_view what) {
  std::string text;
  std::error_code directory_error;
  if (std::filesystem::is_directory(path, directory_error)) {  // opens, and reads as empty
    return absl::InvalidArgumentError(absl::StrCat(path, " is a directory; accepted: a file, ", what));
  }
  if (absl::EndsWith(path, ".gz")) {
    gzFile f = gzopen(path.c_str(), "rb");
    if (f == nullptr) return absl::NotFoundError(absl::StrCat(path, ": cannot open ", what));
    char buf[1 << 16];
    int n;
    while ((n = gzread(f, buf, sizeof buf)) > 0) text.append(buf, static_cast<std::size_t>(n));
    const bool failed = n < 0;
    gzclose(f);
    if (failed) return absl::DataLossError(absl::StrCat(path, ": not a valid gzip file"));
    return text;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open ", what));
  // Read in place, into a string of the file's size where it has one (a copy through a stream
  // buffer held the bytes twice); a pipe or a file that grows is read to its end.
  std::error_code error;
  const std::uintmax_t size =
      std::filesystem::is_regular_file(path, error) ? std::filesystem::file_size(path, error) : 0;
  if (!error && size > 0) text.reserve(static_cast<std::size_t>(size));
  char buf[1 << 16];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) text.append(buf, static_cast<std::size_t>(in.gcount()));
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": reading ", what, " failed"));
  return text;
}

absl::StatusOr<Trace> ReadTraceFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadTextFile(path, "the trace");
  if (!text.ok()) return text.status();
  return ParseTrace(*text, path);
}

std::string FormatTrace(const Trace& trace) {
  std::string out = absl::StrCat(kHeader, "\n");
  for (const TraceEvent& e : trace.events) {
    const char* action = e.action == TraceAction::kAllocate ? "allocate"
                         : e.action == TraceAction::kFree   ? "free"
                                                            : "allocate failure";
    const std::string pointer = e.pointer == 0 ? "(nil)" : absl::StrCat("0x", absl::Hex(e.pointer));
    absl::StrAppend(&out, e.thread, ",", e.time.empty() ? "00:00:00.000000" : e.time, ",", action, ",", pointer, ",",
                    e.size, ",0x", absl::Hex(e.stream), "\n");
  }
  return out;
}

absl::Status WriteWholeFile(const std::string& path, absl::string_view text, absl::string_view what) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return absl::ErrnoToStatus(errno, absl::StrCat(path, ": cannot open it to write ", what));
  const bool written = std::fwrite(text.data(), 1, text.size(), f) == text.size() && std::fflush(f) == 0;
  const int write_errno = errno;
  const bool closed = std::fclose(f) == 0;  // the last buffered bytes go out here: its error counts too
  if (!written || !closed) {
    return absl::ErrnoToStatus(written ? errno : write_errno, absl::StrCat(path, ": writing ", what, " failed"));
  }
  return absl::OkStatus();
}

absl::Status WriteTraceFile(const Trace& trace, const std::string& path) {
  return WriteWholeFile(path, FormatTrace(trace), "the trace");
}

}  // namespace bucketalloc::harness
