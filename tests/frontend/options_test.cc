#include "bucketalloc/options.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"

namespace bucketalloc {
namespace {

TEST(OptionsTest, DefaultsMatchPyTorch) {
  const Options o;
  EXPECT_EQ(o.backend, "cuda");
  EXPECT_TRUE(o.backend_settings.empty());
  EXPECT_EQ(o.small_pool_limit, kMiB);
  EXPECT_EQ(o.max_split_size, kUnlimited);
  EXPECT_EQ(o.max_non_split_rounding, 20 * kMiB);
  EXPECT_EQ(o.large_segment_size, 20 * kMiB);
  EXPECT_TRUE(o.tiers.empty());
  EXPECT_TRUE(ValidateOptions(o).ok());
}

TEST(OptionsTest, ParsesEveryKind) {
  absl::StatusOr<Options> o = ParseOptions(
      " backend:sim, capacity:8GiB ,memory_fraction:0.9,garbage_collection_threshold:0.8,"
      "small_pool_limit:512KiB,max_split_size_mb:256,max_non_split_rounding_mb:64,large_segment_size_mb:32,"
      "roundup_power2_divisions:[256:1,512:2,1024:4,>:8],tiers_tokens:[512,1024,2048,4096],"
      "bytes_per_token:131072,tier_min_fill:0.25,sim_total_memory:80GiB,sim_memory:unbacked,sim_devices:2,"
      "sim_fail_nth_alloc:3,sim_fail_fraction:0.1,sim_seed:9,debug_check_invariants:true");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->backend, "sim");
  EXPECT_EQ(o->capacity, 8 * kGiB);
  EXPECT_DOUBLE_EQ(o->memory_fraction, 0.9);
  EXPECT_DOUBLE_EQ(o->garbage_collection_threshold, 0.8);
  EXPECT_EQ(o->small_pool_limit, 512 * kKiB);
  EXPECT_EQ(o->max_split_size, 256 * kMiB);
  EXPECT_EQ(o->max_non_split_rounding, 64 * kMiB);
  EXPECT_EQ(o->large_segment_size, 32 * kMiB);
  // Intervals: 1 MiB..256 MiB -> 1, 512 MiB -> 2, 1 GiB -> 4, above -> 8.
  EXPECT_EQ(o->roundup_power2_divisions[0], 1u);
  EXPECT_EQ(o->roundup_power2_divisions[8], 1u);
  EXPECT_EQ(o->roundup_power2_divisions[9], 2u);
  EXPECT_EQ(o->roundup_power2_divisions[10], 4u);
  EXPECT_EQ(o->roundup_power2_divisions[15], 8u);
  EXPECT_EQ(o->ResolvedTiers(2 * kMiB), (std::vector<std::size_t>{64 * kMiB, 128 * kMiB, 256 * kMiB, 512 * kMiB}));
  EXPECT_DOUBLE_EQ(o->tier_min_fill, 0.25);
  // The simulated device's keys are its own (the backend registry's sim row), kept canonical (a
  // number as the shortest text that reads back as the same double).
  EXPECT_EQ(o->backend_settings, (BackendSettings{{"sim_devices", "2"},
                                                  {"sim_fail_fraction", "0.1"},
                                                  {"sim_fail_nth_alloc", "3"},
                                                  {"sim_memory", "unbacked"},
                                                  {"sim_seed", "9"},
                                                  {"sim_total_memory", "80GiB"}}));
  EXPECT_TRUE(o->debug_check_invariants);
  // The dump parses back to the same options.
  absl::StatusOr<Options> again = ParseOptions(FormatOptions(*o));
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << FormatOptions(*o);
  EXPECT_EQ(FormatOptions(*again), FormatOptions(*o));
}

TEST(OptionsTest, SizesAndTiersInBytes) {
  EXPECT_EQ(*ParseSize("123"), 123u);
  EXPECT_EQ(*ParseSize("64KiB"), 64 * kKiB);
  EXPECT_EQ(*ParseSize("20mb"), 20 * kMiB);
  EXPECT_EQ(*ParseSize("1.5GiB"), kGiB + kGiB / 2);
  EXPECT_FALSE(ParseSize("12 parsecs").ok());
  EXPECT_FALSE(ParseSize("-3").ok());
  absl::StatusOr<Options> o = ParseOptions("tiers:[100MiB,64MiB,65MiB]");
  ASSERT_TRUE(o.ok()) << o.status();
  // Rounded up to the 2 MiB granularity, sorted, duplicates removed.
  EXPECT_EQ(o->ResolvedTiers(2 * kMiB), (std::vector<std::size_t>{64 * kMiB, 66 * kMiB, 100 * kMiB}));
  EXPECT_EQ(ParseOptions("roundup_power2_divisions:4")->roundup_power2_divisions[3], 4u);
}

TEST(OptionsTest, ANumberOfABackendKeyKeepsEveryDigit) {
  absl::StatusOr<Options> o = ParseOptions("backend:sim,sim_fail_fraction:0.1234567");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->backend_settings.at("sim_fail_fraction"), "0.1234567");
  EXPECT_TRUE(absl::StrContains(FormatOptions(*o), "sim_fail_fraction:0.1234567"));
}

TEST(OptionsTest, StitchingIsBackendVmmOrPyTorchsExpandableSegments) {
  EXPECT_FALSE(ParseOptions("")->Stitching());
  absl::StatusOr<Options> vmm = ParseOptions("backend:vmm");
  ASSERT_TRUE(vmm.ok()) << vmm.status();
  EXPECT_EQ(vmm->backend, "vmm");
  EXPECT_EQ(vmm->DeviceBackend(), "vmm");
  EXPECT_TRUE(vmm->Stitching());
  absl::StatusOr<Options> alias = ParseOptions("expandable_segments:True");  // PyTorch's spelling
  ASSERT_TRUE(alias.ok()) << alias.status();
  EXPECT_TRUE(alias->expandable_segments);
  EXPECT_TRUE(alias->Stitching());
  EXPECT_TRUE(ParseOptions("backend:sim,expandable_segments:true")->Stitching());
  EXPECT_FALSE(ParseOptions("expandable_segments:False")->Stitching());
  // The dump parses back to the same choice.
  EXPECT_EQ(ParseOptions(FormatOptions(*vmm))->backend, "vmm");
  // expandable_segments asks the backend registry which backend stitches in cuda's place.
  EXPECT_EQ(alias->DeviceBackend(), "vmm");
  EXPECT_EQ(ParseOptions("backend:sim,expandable_segments:true")->DeviceBackend(), "sim");
  EXPECT_EQ(ParseOptions("")->DeviceBackend(), "cuda");
  EXPECT_TRUE(ParseOptions(FormatOptions(*alias))->expandable_segments);
}

// Every error names the key, the value and what is accepted.
void ExpectError(absl::string_view conf, absl::string_view key, absl::string_view value) {
  absl::StatusOr<Options> o = ParseOptions(conf);
  ASSERT_FALSE(o.ok()) << conf;
  EXPECT_TRUE(absl::IsInvalidArgument(o.status()));
  const std::string msg(o.status().message());
  EXPECT_TRUE(absl::StrContains(msg, absl::StrCat("option '", key, "': bad value '"))) << msg;
  EXPECT_TRUE(absl::StrContains(msg, value)) << msg;
  EXPECT_TRUE(absl::StrContains(msg, "accepted")) << msg;
}

TEST(OptionsTest, BadInputIsAClearError) {
  ExpectError("expandable_segments:maybe", "expandable_segments", "maybe");
  ExpectError("backend:rocm", "backend", "rocm");
  ExpectError("capacity:lots", "capacity", "lots");
  ExpectError("memory_fraction:1.5", "memory_fraction", "1.5");
  ExpectError("memory_fraction:0", "memory_fraction", "0");
  ExpectError("garbage_collection_threshold:1", "garbage_collection_threshold", "1");
  ExpectError("max_split_size_mb:10", "max_split_size_mb", "10");
  ExpectError("max_split_size_mb:abc", "max_split_size_mb", "abc");
  ExpectError("small_pool_limit:4MiB", "small_pool_limit", "4MiB");
  ExpectError("large_segment_size_mb:3", "large_segment_size_mb", "3");
  ExpectError("max_split_size_mb:32,large_segment_size_mb:64", "large_segment_size_mb", "64");
  ExpectError("roundup_power2_divisions:3", "roundup_power2_divisions", "3");
  ExpectError("roundup_power2_divisions:[512:2,256:1]", "roundup_power2_divisions", "[512:2,256:1]");
  ExpectError("tiers:[64MiB,x]", "tiers", "x");
  ExpectError("tiers_tokens:[512,-1]", "tiers_tokens", "-1");
  ExpectError("tiers_tokens:[512]", "bytes_per_token", "0");
  ExpectError("tiers:[512KiB]", "tiers", "512KiB");
  ExpectError("tier_min_fill:0", "tier_min_fill", "0");
  ExpectError("sim_memory:virtual", "sim_memory", "virtual");
  ExpectError("sim_devices:0", "sim_devices", "0");
  ExpectError("sim_total_memory:3MiB", "sim_total_memory", "3MiB");
  ExpectError("debug_check_invariants:maybe", "debug_check_invariants", "maybe");
  ExpectError("sim_fail_fraction:2", "sim_fail_fraction", "2");
  ExpectError("sim_total_memory:3145728", "sim_total_memory", "3MiB");  // the value as the dump writes it
  // Syntax is read key by key, ranges once everything is read: an unknown key after an
  // out-of-range one is named first, as is a bad key before a range of a later row.
  EXPECT_TRUE(absl::StrContains(ParseOptions("sim_total_memory:3MiB,foo:1").status().message(), "'foo'"));
  ExpectError("memory_fraction:2,sim_total_memory:3MiB", "memory_fraction", "2");
  // A range check says why where it has a reason.
  absl::StatusOr<Options> seg = ParseOptions("max_split_size_mb:32,large_segment_size_mb:63");
  EXPECT_TRUE(absl::StrContains(seg.status().message(), "must stay splittable")) << seg.status();
  ExpectError("sim_seed:-1", "sim_seed", "-1");
  // Values that once truncated, wrapped or gave a cap of 0 (every allocation failing).
  ExpectError("sim_devices:4294967297", "sim_devices", "4294967297");
  ExpectError("sim_devices:99999999999999999999", "sim_devices", "99999999999999999999");
  ExpectError("tiers_tokens:[2305843009213693953],bytes_per_token:64MiB", "tiers", "tiers_tokens x bytes_per_token");
  ExpectError("tiers_tokens:[18446744073709551615],bytes_per_token:1", "tiers_tokens", "18446744073709551615");
  ExpectError("tiers:[64MiB,128MiB],tiers_tokens:[1],bytes_per_token:1MiB", "tiers",
              "either tiers or tiers_tokens, not both");
  ExpectError("capacity:1", "capacity", "1");
  ExpectError("capacity:1MiB", "capacity", "1MiB");
  EXPECT_TRUE(ParseOptions("capacity:0").ok());
  EXPECT_TRUE(ParseOptions("capacity:2MiB").ok());
  EXPECT_FALSE(ParseOptions("capacity").ok());             // no value
  EXPECT_FALSE(ParseOptions("tiers:[64MiB,128MiB").ok());  // unbalanced
}

// What FormatOptions prints configures the same options again, digit for digit: numbers were
// printed with 6 significant digits (0.9999999 came back as 1, which is refused; 0.12345678 as
// 0.123457, a different fraction taken for "the same configuration").
TEST(OptionsTest, ThePrintedConfigurationParsesToTheSameOptions) {
  for (const char* conf :
       {"garbage_collection_threshold:0.9999999", "memory_fraction:0.12345678", "memory_fraction:1e-300",
        "tier_min_fill:0.30000000000000004", "memory_fraction:0.1,garbage_collection_threshold:0.6,tier_min_fill:0.7",
        "tiers_tokens:[3,5,7],bytes_per_token:3MiB", "capacity:3GiB,sim_total_memory:1026MiB",
        "roundup_power2_divisions:[1:2,64:4,>:8]", "sim_fail_fraction:0.123456789012"}) {
    absl::StatusOr<Options> o = ParseOptions(conf);
    ASSERT_TRUE(o.ok()) << conf << ": " << o.status();
    const std::string printed = FormatOptions(*o);
    absl::StatusOr<Options> again = ParseOptions(printed);
    ASSERT_TRUE(again.ok()) << printed << ": " << again.status();
    EXPECT_EQ(FormatOptions(*again), printed);
    EXPECT_EQ(again->memory_fraction, o->memory_fraction) << printed;
    EXPECT_EQ(again->garbage_collection_threshold, o->garbage_collection_threshold) << printed;
    EXPECT_EQ(again->tier_min_fill, o->tier_min_fill) << printed;
  }
  EXPECT_TRUE(
      absl::StrContains(FormatOptions(*ParseOptions("memory_fraction:0.12345678")), "memory_fraction:0.12345678,"));
}

// A value set by hand in the C++ struct is checked by its row as a parsed one is.
TEST(OptionsTest, ValidateChecksHandSetFields) {
  Options o;
  o.backend = "tpu";
  absl::Status s = ValidateOptions(o);
  EXPECT_TRUE(absl::StrContains(s.message(), "option 'backend': bad value 'tpu'; accepted: sim, cuda or vmm")) << s;
  o = Options();
  o.backend_settings["sim_memory"] = "virtual";
  s = ValidateOptions(o);
  EXPECT_TRUE(absl::StrContains(s.message(), "option 'sim_memory': bad value 'virtual'; accepted: backed or unbacked"))
      << s;
  o = Options();
  o.backend_settings["sim_colour"] = "blue";
  s = ValidateOptions(o);
  EXPECT_TRUE(absl::StrContains(s.message(), "'sim_colour' (value 'blue') in backend_settings is unknown")) << s;
  o = Options();
  o.max_split_size = 32 * kMiB;
  o.large_segment_size = 64 * kMiB;
  s = ValidateOptions(o);
  EXPECT_TRUE(absl::StrContains(s.message(),
                                "'large_segment_size_mb': bad value '64' (segments shared by requests "
                                "under 10 MiB must stay splittable); accepted: an even whole number"))
      << s;
  // Parse errors and validation errors of a key name the same accepted values.
  absl::StatusOr<Options> p = ParseOptions("small_pool_limit:lots");
  absl::StatusOr<Options> v = ParseOptions("small_pool_limit:4MiB");
  ASSERT_FALSE(p.ok());
  ASSERT_FALSE(v.ok());
  EXPECT_TRUE(absl::StrContains(p.status().message(), "accepted: a size from 512 to 1MiB")) << p.status();
  EXPECT_TRUE(absl::StrContains(v.status().message(), "accepted: a size from 512 to 1MiB")) << v.status();
}

// What the harness asks of the table: the CONF's settings, and which keys choose the device.
TEST(OptionsTest, SplitsSettingsAndNamesDeviceKeys) {
  absl::StatusOr<std::vector<OptionSetting>> s = SplitOptions(" tiers:[64MiB, 128MiB] ,backend:vmm");
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->size(), 2u);
  EXPECT_EQ((*s)[0].key, "tiers");
  EXPECT_EQ((*s)[0].value, "[64MiB, 128MiB]");
  EXPECT_EQ((*s)[1].key, "backend");
  EXPECT_EQ((*s)[1].value, "vmm");
  EXPECT_FALSE(SplitOptions("capacity").ok());
  EXPECT_FALSE(SplitOptions("tiers:[1").ok());
  for (const char* key : {"backend", "capacity", "memory_fraction", "sim_total_memory", "sim_seed"}) {
    EXPECT_TRUE(IsDeviceOption(key)) << key;
  }
  for (const char* key : {"expandable_segments", "tiers", "max_split_size_mb", "no_such_key"}) {
    EXPECT_FALSE(IsDeviceOption(key)) << key;
  }
  EXPECT_EQ(*SplitOptionList("a,b:[1,2], ,c"), (std::vector<std::string>{"a", "b:[1,2]", "c"}));
}

TEST(OptionsTest, EnvironmentVariable) {
  setenv("BUCKETALLOC_CONF", "backend:sim,capacity:1GiB", 1);
  absl::StatusOr<Options> o = OptionsFromEnv();
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->capacity, kGiB);
  setenv("BUCKETALLOC_CONF", "capacity:-", 1);
  EXPECT_FALSE(OptionsFromEnv().ok());
  unsetenv("BUCKETALLOC_CONF");
  EXPECT_TRUE(OptionsFromEnv().ok());
}

TEST(OptionsTest, DocsEmbedTheGeneratedTable) {
  std::ifstream in(std::string(BUCKETALLOC_SOURCE_DIR) + "/docs/configuration.md");
  ASSERT_TRUE(in.good()) << "docs/configuration.md is missing";
  std::stringstream doc;
  doc << in.rdbuf();
  EXPECT_TRUE(absl::StrContains(doc.str(), OptionsMarkdownTable()))
      << "docs/configuration.md is out of date; regenerate the table with bucketalloc_options_doc:\n"
      << OptionsMarkdownTable();
}

}  // namespace
}  // namespace bucketalloc
