#include "bucketalloc/options.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

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
  ExpectError("max_split_size_mb:32,large_segment_size_mb:64", "max_split_size_mb", "32");
  ExpectError("roundup_power2_divisions:3", "roundup_power2_divisions", "3");
  ExpectError("roundup_power2_divisions:[3:2]", "roundup_power2_divisions", "bad interval '3'");
  ExpectError("roundup_power2_divisions:[256:3]", "roundup_power2_divisions", "bad division '3'");
  ExpectError("roundup_power2_divisions:[256]", "roundup_power2_divisions", "[256]");
  ExpectError("roundup_power2_divisions:4294967296", "roundup_power2_divisions", "4294967296");
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
                                "'max_split_size_mb': bad value '32' (segments shared by requests "
                                "under 10 MiB must stay splittable); accepted: a whole number of MiB >= "
                                "large_segment_size_mb"))
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

// Sets the three variables OptionsFromEnv reads (nullopt: unset) for one test, and restores them.
class ConfEnvironment {
 public:
  ConfEnvironment(std::optional<std::string> bucketalloc, std::optional<std::string> pytorch_cuda,
                  std::optional<std::string> pytorch) {
    for (const char* name : kNames) {
      const char* v = std::getenv(name);
      saved_.push_back(v == nullptr ? std::nullopt : std::optional<std::string>(v));
    }
    Set(kNames[0], bucketalloc);
    Set(kNames[1], pytorch_cuda);
    Set(kNames[2], pytorch);
  }
  ~ConfEnvironment() {
    for (int i = 0; i < 3; ++i) Set(kNames[i], saved_[i]);
  }

 private:
  static constexpr const char* kNames[3] = {"BUCKETALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"};
  static void Set(const char* name, const std::optional<std::string>& value) {
    if (value.has_value()) {
      setenv(name, value->c_str(), 1);
    } else {
      unsetenv(name);
    }
  }
  std::vector<std::optional<std::string>> saved_;
};

TEST(OptionsTest, EnvironmentVariable) {
  ConfEnvironment env(std::nullopt, std::nullopt, std::nullopt);
  setenv("BUCKETALLOC_CONF", "backend:sim,capacity:1GiB", 1);
  absl::StatusOr<Options> o = OptionsFromEnv();
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->capacity, kGiB);
  setenv("BUCKETALLOC_CONF", "capacity:-", 1);
  EXPECT_FALSE(OptionsFromEnv().ok());
  unsetenv("BUCKETALLOC_CONF");
  EXPECT_TRUE(OptionsFromEnv().ok());
}

// BUCKETALLOC_CONF when set (even empty), else PyTorch's variables in torch 2.15's own order:
// PYTORCH_CUDA_ALLOC_CONF before PYTORCH_ALLOC_CONF (c10's AcceleratorAllocatorConfig::instance()).
TEST(OptionsTest, EnvironmentPrecedenceFollowsTorch) {
  {
    ConfEnvironment env(std::nullopt, std::nullopt, "backend:sim,max_split_size_mb:100");
    const OptionsSource source = OptionsSourceFromEnv();
    EXPECT_EQ(source.variable, "PYTORCH_ALLOC_CONF");
    EXPECT_EQ(source.text, "backend:sim,max_split_size_mb:100");
    EXPECT_TRUE(source.ignored.empty());
    EXPECT_TRUE(source.FromPyTorch());
    absl::StatusOr<Options> o = OptionsFromEnv();
    ASSERT_TRUE(o.ok()) << o.status();
    EXPECT_EQ(o->max_split_size, 100 * kMiB);
  }
  {
    ConfEnvironment env(std::nullopt, "backend:sim,max_split_size_mb:200", "backend:sim,max_split_size_mb:100");
    const OptionsSource source = OptionsSourceFromEnv();
    EXPECT_EQ(source.variable, "PYTORCH_CUDA_ALLOC_CONF");
    EXPECT_EQ(source.ignored, (std::vector<std::string>{"PYTORCH_ALLOC_CONF"}));
    testing::internal::CaptureStderr();
    absl::StatusOr<Options> o = OptionsFromEnv();
    const std::string err = testing::internal::GetCapturedStderr();
    ASSERT_TRUE(o.ok()) << o.status();
    EXPECT_EQ(o->max_split_size, 200 * kMiB);
    EXPECT_TRUE(absl::StrContains(err, "bucketalloc: options from PYTORCH_CUDA_ALLOC_CONF; PYTORCH_ALLOC_CONF ignored"))
        << err;
  }
  {
    ConfEnvironment env("backend:sim,capacity:1GiB", "max_split_size_mb:200", "max_split_size_mb:100");
    const OptionsSource source = OptionsSourceFromEnv();
    EXPECT_EQ(source.variable, "BUCKETALLOC_CONF");
    EXPECT_FALSE(source.FromPyTorch());
    EXPECT_EQ(source.ignored, (std::vector<std::string>{"PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"}));
    testing::internal::CaptureStderr();
    absl::StatusOr<Options> o = OptionsFromEnv();
    absl::StatusOr<Options> again = OptionsFromEnv();
    const std::string err = testing::internal::GetCapturedStderr();
    ASSERT_TRUE(o.ok()) << o.status();
    EXPECT_EQ(o->capacity, kGiB);
    EXPECT_EQ(o->max_split_size, kUnlimited);  // the PyTorch variables are not read at all
    const std::string notice =
        "bucketalloc: options from BUCKETALLOC_CONF; PYTORCH_CUDA_ALLOC_CONF and PYTORCH_ALLOC_CONF ignored "
        "(BUCKETALLOC_CONF wins over PyTorch's variables)\n";
    EXPECT_EQ(err, notice);  // once per process, however often the options are read
  }
  {
    // An empty BUCKETALLOC_CONF is set: the defaults, and PyTorch's variable stays torch's alone.
    ConfEnvironment env("", std::nullopt, "no_such_key:1");
    EXPECT_EQ(OptionsSourceFromEnv().variable, "BUCKETALLOC_CONF");
    testing::internal::CaptureStderr();
    absl::StatusOr<Options> o = OptionsFromEnv();
    testing::internal::GetCapturedStderr();
    ASSERT_TRUE(o.ok()) << o.status();
    EXPECT_EQ(FormatOptions(*o), FormatOptions(Options()));
  }
  {
    ConfEnvironment env(std::nullopt, std::nullopt, std::nullopt);
    const OptionsSource source = OptionsSourceFromEnv();
    EXPECT_TRUE(source.variable.empty());
    EXPECT_FALSE(source.FromPyTorch());
    EXPECT_TRUE(OptionsFromEnv().ok());
  }
}

// In PyTorch's variables the pinned_* keys are torch's pinned host-memory allocator's: skipped, with
// a notice; bucketalloc's own keys are accepted too; an error names the variable.
TEST(OptionsTest, PyTorchVariableIsReadAsTorchReadsIt) {
  {
    ConfEnvironment env(std::nullopt, std::nullopt,
                        "expandable_segments:True,pinned_use_background_threads:True,per_process_memory_fraction:0.5,"
                        "pinned_num_register_threads:8,backend:native,capacity:4GiB");
    testing::internal::CaptureStderr();
    absl::StatusOr<Options> o = OptionsFromEnv();
    const std::string err = testing::internal::GetCapturedStderr();
    ASSERT_TRUE(o.ok()) << o.status();
    EXPECT_TRUE(o->expandable_segments);
    EXPECT_EQ(o->DeviceBackend(), "vmm");
    EXPECT_DOUBLE_EQ(o->memory_fraction, 0.5);
    EXPECT_EQ(o->capacity, 4 * kGiB);
    EXPECT_TRUE(absl::StrContains(err,
                                  "bucketalloc: options from PYTORCH_ALLOC_CONF; pinned_use_background_threads, "
                                  "pinned_num_register_threads skipped: torch's pinned host-memory allocator"))
        << err;
  }
  {
    ConfEnvironment env(std::nullopt, "backend:cudaMallocAsync", std::nullopt);
    absl::StatusOr<Options> o = OptionsFromEnv();
    ASSERT_FALSE(o.ok());
    const std::string msg(o.status().message());
    EXPECT_TRUE(absl::StrContains(msg, "option 'backend': bad value 'cudaMallocAsync' (PyTorch's cudaMallocAsync"))
        << msg;
    EXPECT_TRUE(absl::StrContains(msg, "(in PYTORCH_CUDA_ALLOC_CONF, which bucketalloc reads when BUCKETALLOC_CONF"))
        << msg;
  }
  {
    // In bucketalloc's own variable a pinned key is refused by name, with the reason.
    ConfEnvironment env("pinned_use_background_threads:True", std::nullopt, std::nullopt);
    absl::StatusOr<Options> o = OptionsFromEnv();
    ASSERT_FALSE(o.ok());
    EXPECT_TRUE(absl::StrContains(o.status().message(),
                                  "option 'pinned_use_background_threads' (value 'True') is refused: a setting of "
                                  "torch's pinned (page-locked host) memory allocator"))
        << o.status();
  }
}

// PyTorch 2.15's keys (c10/core/AllocatorConfig.cpp, c10/cuda/CUDAAllocatorConfig.cpp), each with a
// value torch accepts: honoured, or refused by name with the reason (never "unknown").
TEST(OptionsTest, EveryPyTorch215KeyIsHonouredOrRefusedByName) {
  struct Case {
    const char* key;
    const char* value;  // a value torch 2.15 accepts
    bool accepted;      // in BUCKETALLOC_CONF
    const char* why;    // the refusal says (accepted: empty)
  };
  const Case cases[] = {
      {"large_segment_size_mb", "32", true, ""},
      {"max_split_size_mb", "64", true, ""},
      {"max_non_split_rounding_mb", "64", true, ""},
      {"garbage_collection_threshold", "0.8", true, ""},
      {"roundup_power2_divisions", "[256:1,512:2,1024:4,>:8]", true, ""},
      {"expandable_segments", "True", true, ""},
      {"pinned_use_background_threads", "True", false, "pinned (page-locked host) memory"},
      {"pinned_max_round_threshold_mb", "64", false, "pinned (page-locked host) memory"},
      {"pinned_max_cached_size_mb", "64", false, "pinned (page-locked host) memory"},
      {"backend", "native", true, ""},
      {"backend", "cudaMallocAsync", false, "stream-ordered pool"},
      {"release_lock_on_cudamalloc", "False", true, ""},
      {"release_lock_on_cudamalloc", "True", false, "holds its device lock while the backend allocates"},
      {"release_lock_on_hipmalloc", "True", false, "holds its device lock while the backend allocates"},
      {"pinned_use_cuda_host_register", "True", false, "pinned (page-locked host) memory"},
      {"pinned_use_hip_host_register", "True", false, "pinned (page-locked host) memory"},
      {"pinned_num_register_threads", "8", false, "pinned (page-locked host) memory"},
      {"pinned_reserve_segment_size_mb", "8", false, "pinned (page-locked host) memory"},
      {"pinned_free_catch_all", "True", false, "pinned (page-locked host) memory"},
      {"graph_capture_record_stream_reuse", "False", true, ""},
      {"graph_capture_record_stream_reuse", "True", false, "reuse decided by the graph's topology is not implemented"},
      {"per_process_memory_fraction", "0.5", true, ""},
      {"per_process_memory_fraction", "0", false, "a cap of 0 would refuse every allocation"},
      {"throw_on_cudamalloc_oom", "True", true, ""},
      {"throw_on_cudamalloc_oom", "False", true, ""},
      {"expandable_segments_reserve", "0.5", false, "sizes its virtual-memory address space itself"},
      {"expandable_segments_reserve", "40G", false, "sizes its virtual-memory address space itself"},
      {"expandable_segments_reserve_by_class", "[capture:0.25,workspace:40G]", false,
       "sizes its virtual-memory address space itself"},
  };
  const std::string table = PyTorchKeysMarkdownTable();
  for (const Case& c : cases) {
    const std::string conf = absl::StrCat(c.key, ":", c.value);
    absl::StatusOr<Options> o = ParseOptions(conf);
    EXPECT_EQ(o.ok(), c.accepted) << conf << ": " << o.status();
    EXPECT_TRUE(absl::StrContains(table, absl::StrCat("| `", c.key, "` |"))) << c.key << " is not in the table";
    if (c.accepted) continue;
    const std::string msg(o.status().message());
    EXPECT_TRUE(absl::StrContains(msg, absl::StrCat("option '", c.key, "'"))) << msg;
    EXPECT_TRUE(absl::StrContains(msg, c.value)) << msg;
    EXPECT_TRUE(absl::StrContains(msg, c.why)) << msg;
    EXPECT_FALSE(absl::StrContains(msg, "is unknown")) << msg;
  }
  // A pinned_* key torch 2.15 does not have yet is a host setting too; any other key stays unknown.
  EXPECT_TRUE(absl::StrContains(ParseOptions("pinned_future_knob:1").status().message(), "is refused: a setting of"));
  absl::StatusOr<Options> unknown = ParseOptions("expandable_segments_handle_type:posix_fd");
  EXPECT_TRUE(absl::StrContains(unknown.status().message(), "is unknown; accepted keys: backend, "))
      << unknown.status();
}

TEST(OptionsTest, PyTorchKeysOfTheCap) {
  absl::StatusOr<Options> o = ParseOptions("per_process_memory_fraction:0.25");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_DOUBLE_EQ(o->memory_fraction, 0.25);
  EXPECT_TRUE(IsDeviceOption("per_process_memory_fraction"));
  // The dump names the cap once, as memory_fraction, and reads back the same.
  EXPECT_FALSE(absl::StrContains(FormatOptions(*o), "per_process_memory_fraction"));
  EXPECT_DOUBLE_EQ(ParseOptions(FormatOptions(*o))->memory_fraction, 0.25);
  // Both names of the one cap: refused, naming both.
  absl::StatusOr<Options> both = ParseOptions("memory_fraction:0.5,per_process_memory_fraction:0.5");
  ASSERT_FALSE(both.ok());
  EXPECT_TRUE(absl::StrContains(both.status().message(),
                                "option 'per_process_memory_fraction' (value '0.5') sets what 'memory_fraction' "
                                "(value '0.5') sets: give one of them"))
      << both.status();
  EXPECT_FALSE(ParseOptions("per_process_memory_fraction:0.5,memory_fraction:0.7").ok());
  EXPECT_TRUE(ParseOptions("memory_fraction:0.5,memory_fraction:0.7").ok());  // one key given twice: the last
  // A range error names the key as given.
  ExpectError("per_process_memory_fraction:1.5", "per_process_memory_fraction", "1.5");
  ExpectError("memory_fraction:0", "memory_fraction", "a cap of 0 would refuse every allocation");

  for (const char* v : {"True", "true", "1"}) {
    absl::StatusOr<Options> t = ParseOptions(absl::StrCat("throw_on_cudamalloc_oom:", v));
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_TRUE(t->throw_on_cudamalloc_oom);
    EXPECT_TRUE(ParseOptions(FormatOptions(*t))->throw_on_cudamalloc_oom);
  }
  EXPECT_FALSE(ParseOptions("throw_on_cudamalloc_oom:False")->throw_on_cudamalloc_oom);
  EXPECT_FALSE(Options().throw_on_cudamalloc_oom);
  ExpectError("throw_on_cudamalloc_oom:maybe", "throw_on_cudamalloc_oom", "maybe");
}

TEST(OptionsTest, PyTorchKeysAtTheirDefaultOnlyAndBackends) {
  for (const char* conf : {"graph_capture_record_stream_reuse:False", "graph_capture_record_stream_reuse:false",
                           "release_lock_on_cudamalloc:0", "release_lock_on_hipmalloc:False"}) {
    absl::StatusOr<Options> o = ParseOptions(conf);
    ASSERT_TRUE(o.ok()) << conf << ": " << o.status();
    EXPECT_EQ(FormatOptions(*o), FormatOptions(Options())) << conf;  // nothing changes
  }
  ExpectError("graph_capture_record_stream_reuse:True", "graph_capture_record_stream_reuse", "True");
  ExpectError("release_lock_on_cudamalloc:maybe", "release_lock_on_cudamalloc", "maybe");
  absl::StatusOr<Options> native = ParseOptions("backend:native");
  ASSERT_TRUE(native.ok()) << native.status();
  EXPECT_EQ(native->backend, "cuda");
  EXPECT_EQ(ParseOptions("backend:native,expandable_segments:True")->DeviceBackend(), "vmm");
  ExpectError("backend:cudaMallocAsync", "backend", "cudaMallocAsync");
}

// roundup_power2_divisions as torch 2.15 reads it (AcceleratorAllocatorConfig::parseRoundUpPower2Divisions).
TEST(OptionsTest, RoundupDivisionsReadAsTorchReadsThem) {
  using Divisions = std::vector<std::uint32_t>;
  auto divisions = [](const char* value) -> std::optional<Divisions> {
    absl::StatusOr<Options> o = ParseOptions(absl::StrCat("roundup_power2_divisions:", value));
    if (!o.ok()) return std::nullopt;
    return o->roundup_power2_divisions;
  };
  // A key sets its own interval, the first key also every interval below it; '>' every interval
  // after the last key; the rest keep 0.
  EXPECT_EQ(divisions("[1:2,64:4]"), (Divisions{2, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(divisions("[4:2,>:8]"), (Divisions{2, 2, 2, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8}));
  EXPECT_EQ(divisions("[>:8]"), (Divisions{0, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8}));
  // Keys need not ascend: a later key overrides its interval only.
  EXPECT_EQ(divisions("[512:2,256:1]"), (Divisions{2, 2, 2, 2, 2, 2, 2, 2, 1, 2, 0, 0, 0, 0, 0, 0}));
  // Keys past 32 GiB are the last interval; divisions above 1024 are taken, as torch takes them.
  EXPECT_EQ(divisions("[65536:4096]")->back(), 4096u);
  EXPECT_EQ(divisions("2048"), Divisions(16, 2048));
  EXPECT_EQ(divisions("[]"), Divisions(16, 0));
  // Whatever the list, the dump reads back the same intervals.
  for (const char* value : {"[1:2,64:4]", "[>:8]", "[512:2,256:1]", "[65536:4096]", "[2:0,>:1]"}) {
    absl::StatusOr<Options> o = ParseOptions(absl::StrCat("roundup_power2_divisions:", value));
    ASSERT_TRUE(o.ok()) << value << ": " << o.status();
    EXPECT_EQ(ParseOptions(FormatOptions(*o))->roundup_power2_divisions, o->roundup_power2_divisions) << value;
  }
}

// max_split_size_mb's limit is torch's: at least large_segment_size_mb, not a fixed 20.
TEST(OptionsTest, MaxSplitSizeAtLeastTheLargeSegment) {
  absl::StatusOr<Options> o = ParseOptions("large_segment_size_mb:12,max_split_size_mb:12");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->max_split_size, 12 * kMiB);
  ExpectError("max_split_size_mb:16", "max_split_size_mb", "16");
  ExpectError("large_segment_size_mb:11", "large_segment_size_mb", "11");  // torch takes it; granules do not
}

// As in torch 2.15, a CONF that sets large_segment_size_mb and not max_non_split_rounding_mb sets
// the rounding to the segment size; given, the rounding is kept, in either order.
TEST(OptionsTest, NonSplitRoundingFollowsTheLargeSegment) {
  EXPECT_EQ(ParseOptions("large_segment_size_mb:12,max_split_size_mb:12")->max_non_split_rounding, 12 * kMiB);
  EXPECT_EQ(ParseOptions("large_segment_size_mb:64")->max_non_split_rounding, 64 * kMiB);
  EXPECT_EQ(ParseOptions("large_segment_size_mb:64,max_non_split_rounding_mb:100")->max_non_split_rounding, 100 * kMiB);
  EXPECT_EQ(ParseOptions("max_non_split_rounding_mb:4,large_segment_size_mb:64")->max_non_split_rounding, 4 * kMiB);
  EXPECT_EQ(ParseOptions("max_split_size_mb:64")->max_non_split_rounding, 20 * kMiB);
  // The dump names both, so it reads back the same whatever the rule.
  absl::StatusOr<Options> o = ParseOptions("large_segment_size_mb:64,max_non_split_rounding_mb:8");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(ParseOptions(FormatOptions(*o))->max_non_split_rounding, 8 * kMiB);
}

TEST(OptionsTest, DocsEmbedTheGeneratedTable) {
  std::ifstream in(std::string(BUCKETALLOC_SOURCE_DIR) + "/docs/configuration.md");
  ASSERT_TRUE(in.good()) << "docs/configuration.md is missing";
  std::stringstream doc;
  doc << in.rdbuf();
  EXPECT_TRUE(absl::StrContains(doc.str(), OptionsMarkdownTable()))
      << "docs/configuration.md is out of date; regenerate the table with bucketalloc_options_doc:\n"
      << OptionsMarkdownTable();
  EXPECT_TRUE(absl::StrContains(doc.str(), PyTorchKeysMarkdownTable()))
      << "docs/configuration.md's table of PyTorch's keys is out of date; it is:\n"
      << PyTorchKeysMarkdownTable();
  EXPECT_TRUE(absl::StrContains(doc.str(), EnvVariablesMarkdownTable()))
      << "docs/configuration.md's table of environment variables is out of date; regenerate it with "
         "bucketalloc_options_doc --environment:\n"
      << EnvVariablesMarkdownTable();
}

std::size_t CountOccurrences(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

TEST(OptionsTest, EveryEnvironmentVariableIsReadThroughTheTable) {
  // The table names each variable once, and a dump shows exactly the ones set.
  std::set<std::string> names;
  for (const EnvVariable& v : EnvVariables()) EXPECT_TRUE(names.insert(v.name).second) << v.name;
  EXPECT_TRUE(names.contains(kConfVariable));
  ASSERT_EQ(setenv("BUCKETALLOC_VERBOSE", "1", 1), 0);
  EXPECT_STREQ(ReadEnv("BUCKETALLOC_VERBOSE"), "1");
  EXPECT_TRUE(absl::StrContains(DumpEnv(), "BUCKETALLOC_VERBOSE=1\n")) << DumpEnv();
  ASSERT_EQ(unsetenv("BUCKETALLOC_VERBOSE"), 0);
  EXPECT_EQ(ReadEnv("BUCKETALLOC_VERBOSE"), nullptr);
  EXPECT_FALSE(absl::StrContains(DumpEnv(), "BUCKETALLOC_VERBOSE"));
  EXPECT_EQ(ReadEnv("BUCKETALLOC_NOT_A_VARIABLE"), nullptr) << "a name outside the table is never read";
  // No source file reads the environment except through ReadEnv (the table's one reader), and every
  // name passed to ReadEnv is a row.
  for (const char* dir : {"src", "plugins", "cuda"}) {
    for (const auto& entry :
         std::filesystem::recursive_directory_iterator(std::string(BUCKETALLOC_SOURCE_DIR) + "/" + dir)) {
      const std::string path = entry.path().string();
      if (!absl::EndsWith(path, ".cc") && !absl::EndsWith(path, ".h")) continue;
      std::ifstream in(path);
      std::stringstream text;
      text << in.rdbuf();
      const bool reader = absl::EndsWith(path, "src/frontend/core/options.cc");
      const std::size_t getenvs = CountOccurrences(text.str(), "getenv(");
      EXPECT_EQ(getenvs, reader ? 2u : 0u) << path << " reads the environment outside ReadEnv";
      const std::string call = "ReadEnv(\"";
      for (std::size_t at = text.str().find(call); at != std::string::npos; at = text.str().find(call, at + 1)) {
        const std::size_t start = at + call.size();
        const std::string name = text.str().substr(start, text.str().find('"', start) - start);
        EXPECT_TRUE(names.contains(name)) << path << " reads " << name << ", which is not in EnvVariables()";
      }
    }
  }
}

}  // namespace
}  // namespace bucketalloc
