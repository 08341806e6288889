// fuzz/ops_fuzz.cc — operation sequences over the C ABI (plugins/c_abi/c_abi.cc) on the simulated
// device: malloc, free, record_stream, empty_cache, set_memory_fraction, captures into private
// pools, stream work. Each input byte string is a program; after every operation the live blocks
// must not overlap and keep the bytes written into them, and at the end (everything freed, the
// pools released, the cache emptied) no byte is still allocated or reserved. The invariants are
// checked every 16 operations and at the end (checking after every slow-path event, as the debug
// option does, made a run 20 times slower). The configuration is BUCKETALLOC_FUZZ_CONF (CI runs the
// default, stitching, and tenants). With tenants ("tenants:[...]" in it) three more operations run:
// the thread's tenant (a configured one, "default", or an unknown name, which must be refused), a
// tenant's cap raised or lowered (below what it holds live too; a cap out of range must be refused),
// and a stream bound to a tenant; the invariants then include each tenant's (its blocks in its own
// pools, its bytes adding up to the device's).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "bucketalloc/bucketalloc.h"
#include "fuzz_util.h"
#include "nlohmann/json.hpp"

namespace {

using bucketalloc::fuzz::Broken;

cudaStream_t StreamOf(int i) {
  return i == 0 ? nullptr : reinterpret_cast<cudaStream_t>(static_cast<std::uintptr_t>(0x1000 + i));
}

struct Held {
  void* p;
  ssize_t size;
  int stream;
  std::uint8_t mark;
};

// The program's bytes, read one at a time (0 past the end).
class Reader {
 public:
  Reader(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  bool more() const { return at_ < size_; }
  std::uint8_t byte() { return at_ < size_ ? data_[at_++] : 0; }
  std::uint32_t u16() { return static_cast<std::uint32_t>(byte()) << 8 | byte(); }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t at_ = 0;
};

nlohmann::json Stats() {
  std::string buf(1 << 16, '\0');
  const ssize_t n = bucketalloc_stats_json(0, buf.data(), buf.size());
  if (n < 0 || static_cast<std::size_t>(n) >= buf.size()) Broken("stats_json", bucketalloc_last_error());
  buf.resize(static_cast<std::size_t>(n));
  return nlohmann::json::parse(buf);
}

// A size: mostly small-pool sizes, some large, a few up to 40 MiB.
ssize_t SizeOf(Reader& r) {
  const std::uint32_t v = r.u16();
  switch (v % 4) {
    case 0:
    case 1:
      return 1 + v % 65536;  // up to 64 KiB
    case 2:
      return 1 + static_cast<ssize_t>(v) * 128;  // up to 8 MiB
    default:
      return 1 + static_cast<ssize_t>(v % 64) * (640 << 10) + v % 4096;  // up to 40 MiB
  }
}

void CheckInvariants(const char* when) {
  if (bucketalloc_check_invariants(0) != 0) Broken(when, bucketalloc_last_error());
}

// The configured tenants' names (empty without tenants), from the configuration's text.
std::vector<std::string> g_tenants;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* conf = std::getenv("BUCKETALLOC_FUZZ_CONF");
  if (conf == nullptr) conf = "backend:sim,capacity:96MiB,sim_total_memory:256MiB";
  if (bucketalloc_configure(conf) != 0) Broken("configure", bucketalloc_last_error());
  // tenants:[NAME:SIZE,...]: the names, for the tenant operations.
  if (const char* list = std::strstr(conf, "tenants:[")) {
    const std::string inside(list + 9, std::strcspn(list + 9, "]"));
    for (std::size_t at = 0; at < inside.size();) {
      const std::size_t comma = std::min(inside.find(',', at), inside.size());
      const std::string item = inside.substr(at, comma - at);
      g_tenants.push_back(item.substr(0, item.find(':')));
      at = comma + 1;
    }
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Reader r(data, size);
  std::vector<Held> held;
  std::map<std::uintptr_t, std::uintptr_t> ranges;  // live block start -> end
  std::uint8_t next_mark = 1;
  unsigned long long capturing_pool = 0;  // the capture running (0: none)
  std::vector<unsigned long long> pools;  // begun and not released
  const int kCaptureStream = 7;
  for (int ops = 0; r.more() && ops < 2000; ++ops) {
    if (ops % 16 == 15) CheckInvariants("the invariants after 16 operations");
    switch (r.byte() % (g_tenants.empty() ? 9 : 12)) {
      case 0:
      case 1: {  // malloc
        const ssize_t n = SizeOf(r);
        const int stream = capturing_pool != 0 && r.byte() % 2 ? kCaptureStream : r.byte() % 4;
        void* p = bucketalloc_malloc(n, 0, StreamOf(stream));
        if (p == nullptr) break;  // out of memory (or a capture miss): the allocator said why
        const auto start = reinterpret_cast<std::uintptr_t>(p), end = start + static_cast<std::uintptr_t>(n);
        auto after = ranges.lower_bound(start);
        if ((after != ranges.end() && after->first < end) ||
            (after != ranges.begin() && std::prev(after)->second > start)) {
          Broken("a new block overlaps a live one");
        }
        ranges.emplace(start, end);
        const std::uint8_t mark = next_mark++;
        static_cast<std::uint8_t*>(p)[0] = mark;
        static_cast<std::uint8_t*>(p)[n - 1] = mark;
        held.push_back({p, n, stream, mark});
        break;
      }
      case 2: {  // free
        if (held.empty()) break;
        const std::size_t i = r.byte() % held.size();
        const Held h = held[i];
        const auto* bytes = static_cast<const std::uint8_t*>(h.p);
        if (bytes[0] != h.mark || bytes[h.size - 1] != h.mark) Broken("a live block's bytes changed");
        const std::string error_before = bucketalloc_last_error();  // the last failed call's, kept
        bucketalloc_free(h.p, h.size, 0, StreamOf(h.stream));
        if (error_before != bucketalloc_last_error()) Broken("a valid free failed", bucketalloc_last_error());
        ranges.erase(reinterpret_cast<std::uintptr_t>(h.p));
        held[i] = held.back();
        held.pop_back();
        break;
      }
      case 3:  // record_stream on another stream, with work queued on it
        if (held.empty()) break;
        {
          const int other = 1 + r.byte() % 3;
          bucketalloc_sim_enqueue_work(0, StreamOf(other));
          bucketalloc_record_stream(held[r.byte() % held.size()].p, StreamOf(other));
        }
        break;
      case 4:  // a stream's work completes
        bucketalloc_sim_complete_work(0, StreamOf(r.byte() % 4));
        break;
      case 5:
        bucketalloc_empty_cache();  // refused during a capture, with a message
        break;
      case 6:  // a cap from 1/64 to all of the device (a cap under a granule is refused)
        bucketalloc_set_memory_fraction((r.byte() % 64 + 1) / 64.0, 0);
        break;
      case 7:  // a capture begins, or the running one ends
        if (capturing_pool == 0) {
          const unsigned long long pool = 1 + r.byte() % 4;
          if (bucketalloc_capture_begin(0, pool, StreamOf(kCaptureStream)) == 0) {
            bucketalloc_sim_set_capturing(0, StreamOf(kCaptureStream), 1);
            capturing_pool = pool;
            pools.push_back(pool);
          }
        } else {
          bucketalloc_sim_set_capturing(0, StreamOf(kCaptureStream), 0);
          if (bucketalloc_capture_end(0, capturing_pool) != 0) Broken("capture_end", bucketalloc_last_error());
          capturing_pool = 0;
        }
        break;
      case 9: {  // the thread's tenant: a configured one, "default", or an unknown name (refused)
        const std::size_t pick = r.byte() % (g_tenants.size() + 2);
        const std::string name = pick < g_tenants.size() ? g_tenants[pick] : pick == g_tenants.size() ? "default" : "x";
        const int rc = bucketalloc_set_thread_tenant(name.c_str());
        if ((rc == 0) != (name != "x")) Broken("set_thread_tenant accepts exactly the tenants", name);
        break;
      }
      case 10: {  // a tenant's cap: 2 MiB to 64 MiB (below what it holds, too), or 0 (refused)
        const std::string& name = g_tenants[r.byte() % g_tenants.size()];
        const std::size_t mib = r.byte() % 33;
        const int rc = bucketalloc_set_tenant_cap(name.c_str(), mib * 2 * (std::size_t{1} << 20));
        if (mib == 0 && rc == 0) Broken("a cap of 0 bytes is refused", name);
        // During a capture, lowering below what the tenant reserves is refused: not a failure.
        if (mib != 0 && rc != 0 && capturing_pool == 0) Broken("set_tenant_cap", bucketalloc_last_error());
        break;
      }
      case 11: {  // a stream bound to a tenant, or unbound ("default")
        const std::size_t pick = r.byte() % (g_tenants.size() + 1);
        const std::string name = pick < g_tenants.size() ? g_tenants[pick] : "default";
        if (bucketalloc_bind_stream(StreamOf(r.byte() % 4), name.c_str()) != 0) {
          Broken("bind_stream", bucketalloc_last_error());
        }
        break;
      }
      default:  // a graph is reset: its pool released
        if (!pools.empty() && capturing_pool == 0) {
          const std::size_t i = r.byte() % pools.size();
          if (bucketalloc_release_pool(0, pools[i]) != 0) Broken("release_pool", bucketalloc_last_error());
          pools.erase(pools.begin() + static_cast<std::ptrdiff_t>(i));
        }
        break;
    }
  }
  if (capturing_pool != 0) {
    bucketalloc_sim_set_capturing(0, StreamOf(kCaptureStream), 0);
    if (bucketalloc_capture_end(0, capturing_pool) != 0) Broken("capture_end at the end", bucketalloc_last_error());
  }
  for (const Held& h : held) {
    const auto* bytes = static_cast<const std::uint8_t*>(h.p);
    if (bytes[0] != h.mark || bytes[h.size - 1] != h.mark) Broken("a live block's bytes changed");
    bucketalloc_free(h.p, h.size, 0, StreamOf(h.stream));
  }
  for (unsigned long long pool : pools) bucketalloc_release_pool(0, pool);
  for (int s = 0; s < 8; ++s) bucketalloc_sim_complete_work(0, StreamOf(s));
  bucketalloc_set_memory_fraction(1.0, 0);
  bucketalloc_empty_cache();
  CheckInvariants("the invariants at the end");
  const nlohmann::json stats = Stats();
  for (const char* key : {"allocated_bytes.all.current", "active_bytes.all.current", "requested_bytes.all.current",
                          "reserved_bytes.all.current"}) {
    if (stats[key] != 0) Broken("everything freed and released", std::string(key) + " = " + stats[key].dump());
  }
  return 0;
}
