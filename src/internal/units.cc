// src/internal/units.cc — sizes as text (bucketalloc/units.h).
#include "bucketalloc/units.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace bucketalloc {

absl::StatusOr<std::size_t> ParseSize(absl::string_view text) {
  absl::string_view t = absl::StripAsciiWhitespace(text);
  std::size_t split = 0;
  while (split < t.size() && (std::isdigit(static_cast<unsigned char>(t[split])) || t[split] == '.')) ++split;
  const absl::string_view number = t.substr(0, split);
  const std::string unit = absl::AsciiStrToLower(absl::StripAsciiWhitespace(t.substr(split)));
  double multiplier;
  if (unit.empty() || unit == "b")
    multiplier = 1;
  else if (unit == "k" || unit == "kb" || unit == "kib")
    multiplier = static_cast<double>(kKiB);
  else if (unit == "m" || unit == "mb" || unit == "mib")
    multiplier = static_cast<double>(kMiB);
  else if (unit == "g" || unit == "gb" || unit == "gib")
    multiplier = static_cast<double>(kGiB);
  else if (unit == "t" || unit == "tb" || unit == "tib")
    multiplier = static_cast<double>(kGiB) * 1024;
  else
    return absl::InvalidArgumentError(absl::StrCat("size '", text, "': unknown unit '", unit, "'"));
  double value;
  if (number.empty() || !absl::SimpleAtod(number, &value) || value < 0) {
    return absl::InvalidArgumentError(absl::StrCat("size '", text, "' is not a non-negative number"));
  }
  const double bytes = std::ceil(value * multiplier);
  if (bytes >= 18446744073709551615.0) {
    return absl::InvalidArgumentError(absl::StrCat("size '", text, "' is too large"));
  }
  return static_cast<std::size_t>(bytes);
}

std::string FormatBytes(std::size_t bytes) {
  if (bytes == kUnlimited) return "unlimited";
  const double b = static_cast<double>(bytes);
  if (bytes >= kGiB) return absl::StrFormat("%.2f GiB", b / static_cast<double>(kGiB));
  if (bytes >= kMiB) return absl::StrFormat("%.2f MiB", b / static_cast<double>(kMiB));
  if (bytes >= kKiB) return absl::StrFormat("%.2f KiB", b / static_cast<double>(kKiB));
  return absl::StrCat(bytes, " B");
}

std::string SizeText(std::size_t bytes) {
  if (bytes == kUnlimited) return "unlimited";
  for (auto [unit, name] : {std::pair{kGiB, "GiB"}, std::pair{kMiB, "MiB"}, std::pair{kKiB, "KiB"}}) {
    if (bytes != 0 && bytes % unit == 0) return absl::StrCat(bytes / unit, name);
  }
  return absl::StrCat(bytes);
}

std::string NumberText(double value) {
  char text[32];  // the longest shortest-round-trip double is 24 characters
  const std::to_chars_result r = std::to_chars(text, text + sizeof text, value);
  return std::string(text, r.ptr);
}

}  // namespace bucketalloc
