// A probe module (torch.utils.cpp_extension) that drives the allocator torch holds
// (c10::cuda::CUDACachingAllocator::get(), bucketalloc's native allocator after
// bucketalloc_torch.enable()) through torch's own C++ entry points, the way torch's CUDA code and
// libraries call them, without a driver: raw_alloc_with_stream/raw_delete, allocate and the DataPtr's
// deleter, cacheInfo (cuDNN), recordHistory with torch's CapturedTraceback recorder (what
// torch.cuda.memory._record_memory_history installs, whose Python binding needs a driver),
// createOrIncrefPool/getPoolUseCount (at::cuda::MemPool), emptyCache of one pool, trace trackers,
// OOM-rejection observers and CUDA IPC. Errors propagate as torch's bindings propagate them
// (c10::OutOfMemoryError -> torch.cuda.OutOfMemoryError).
#include <torch/extension.h>

#include <atomic>
#include <mutex>
#include <unordered_map>

#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>
#include <torch/csrc/profiler/combined_traceback.h>

namespace {

namespace cca = c10::cuda::CUDACachingAllocator;

cudaStream_t AsStream(std::uint64_t s) { return reinterpret_cast<cudaStream_t>(s); }
void* AsPtr(std::uint64_t p) { return reinterpret_cast<void*>(p); }
std::uint64_t AsInt(const void* p) { return reinterpret_cast<std::uint64_t>(p); }

std::mutex g_mu;
std::unordered_map<std::uint64_t, c10::DataPtr> g_data_ptrs;                         // allocate()'s, by address
std::unordered_map<std::uint64_t, c10::intrusive_ptr<c10::StorageImpl>> g_storages;  // by StorageImpl*
std::atomic<int> g_trace_entries{0};
std::atomic<int> g_rejections{0};

// torch's own recorder of Python and C++ stacks (torch/csrc/cuda/memory_snapshot.cpp's gather).
std::shared_ptr<c10::GatheredContext> GatherPython() { return torch::CapturedTraceback::gather(true, true, false); }

// A MemPool's own allocator, as vLLM's sleep mode builds one (torch.cuda.memory.CUDAPluggableAllocator
// over C functions): host memory stands for the device's here, and it serves device 0, the simulated
// device (torch's raw_alloc_with_stream asks cudaGetDevice first, which needs a driver).
std::atomic<int> g_host_allocs{0};
std::atomic<int> g_host_frees{0};
// A block the next host allocation frees through torch's allocator, as a MemPool allocator running
// Python may (its garbage collection frees a tensor inside raw_alloc).
std::atomic<void*> g_free_in_alloc{nullptr};
class HostPoolAllocator final : public torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator {
 public:
  HostPoolAllocator()
      : CUDAPluggableAllocator(
            [](size_t size, int, cudaStream_t) {
              if (void* p = g_free_in_alloc.exchange(nullptr)) cca::raw_delete(p);
              ++g_host_allocs;
              return std::aligned_alloc(2 << 20, size);
            },
            [](void* p, size_t, int, cudaStream_t) {
              ++g_host_frees;
              std::free(p);
            }) {}
  void* raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) override { return malloc(nbytes, 0, stream); }
};
std::shared_ptr<HostPoolAllocator> g_host_allocator;

cca::RecordContext When(const std::string& when) {
  if (when == "all") return cca::RecordContext::ALL;
  if (when == "alloc") return cca::RecordContext::ALLOC;
  if (when == "state") return cca::RecordContext::STATE;
  return cca::RecordContext::NEVER;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("name", [] { return cca::get()->name(); });
  m.def("malloc", [](std::uint64_t size, std::uint64_t stream) {
    return AsInt(cca::raw_alloc_with_stream(size, AsStream(stream)));
  });
  m.def("free", [](std::uint64_t ptr) { cca::raw_delete(AsPtr(ptr)); });
  // Allocator::allocate, the path of every tensor: a DataPtr whose deleter frees the block.
  m.def("allocate", [](std::uint64_t size) {
    c10::DataPtr p = cca::get()->allocate(size);
    TORCH_CHECK(p.get_deleter() == cca::get()->raw_deleter(), "the DataPtr's deleter is not the raw deleter");
    const std::uint64_t address = AsInt(p.get());
    std::lock_guard<std::mutex> lock(g_mu);
    g_data_ptrs.emplace(address, std::move(p));
    return address;
  });
  m.def("release", [](std::uint64_t address) {
    c10::DataPtr p;
    {
      std::lock_guard<std::mutex> lock(g_mu);
      auto it = g_data_ptrs.find(address);
      TORCH_CHECK(it != g_data_ptrs.end(), "not allocated by allocate()");
      p = std::move(it->second);
      g_data_ptrs.erase(it);
    }
  });
  // Storages as torch's tensors hold them (what cudagraph trees passes to setCheckpointPoolState as
  // StorageImpl* ints): one that owns its block (allocated through Allocator::allocate), and one
  // that points at a block without owning it (cudagraph trees' outputs of a replay).
  m.def("make_storage", [](std::uint64_t size) {
    c10::DataPtr p = cca::get()->allocate(size);
    const std::uint64_t data = AsInt(p.get());
    auto storage = c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), size, std::move(p),
                                                         cca::get(), false);
    const std::uint64_t id = AsInt(storage.get());
    std::lock_guard<std::mutex> lock(g_mu);
    g_storages.emplace(id, std::move(storage));
    return py::make_tuple(id, data);
  });
  m.def("make_unowned_storage", [](std::uint64_t ptr, std::uint64_t size) {
    auto storage = c10::make_intrusive<c10::StorageImpl>(
        c10::StorageImpl::use_byte_size_t(), size, c10::DataPtr(AsPtr(ptr), c10::Device(c10::DeviceType::CUDA, 0)),
        nullptr, false);
    const std::uint64_t id = AsInt(storage.get());
    std::lock_guard<std::mutex> lock(g_mu);
    g_storages.emplace(id, std::move(storage));
    return id;
  });
  m.def("storage_owns", [](std::uint64_t id) {
    std::lock_guard<std::mutex> lock(g_mu);
    return g_storages.at(id)->data_ptr().get_deleter() == cca::get()->raw_deleter();
  });
  m.def("drop_storage", [](std::uint64_t id) {
    c10::intrusive_ptr<c10::StorageImpl> storage;
    {
      std::lock_guard<std::mutex> lock(g_mu);
      storage = std::move(g_storages.at(id));
      g_storages.erase(id);
    }
  });
  m.def("cache_info", [](int device, std::uint64_t initial) {
    size_t largest = initial;
    cca::cacheInfo(static_cast<c10::DeviceIndex>(device), &largest);
    return static_cast<std::uint64_t>(largest);
  });
  m.def("record_history", [](bool enabled, const std::string& when, std::uint64_t max_entries) {
    cca::recordHistory(enabled, enabled ? &GatherPython : nullptr, max_entries, When(when), false, {});
  });
  m.def("is_history_enabled", [] { return cca::isHistoryEnabled(); });
  // What torch's record_function callbacks pass while history is recorded.
  m.def("record_annotation", [](const std::string& name, const std::string& stage) {
    cca::recordAnnotation({{"name", name}, {"stage", stage}});
  });
  m.def("create_or_incref_pool", [](int device, std::uint64_t a, std::uint64_t b) {
    cca::createOrIncrefPool(static_cast<c10::DeviceIndex>(device), {a, b});
  });
  // MemPool(allocator): createOrIncrefPool with an allocator of its own (torch.cuda.MemPool's
  // constructor needs a driver for the current device).
  m.def("create_pool_with_host_allocator", [](int device, std::uint64_t a, std::uint64_t b) {
    if (g_host_allocator == nullptr) g_host_allocator = std::make_shared<HostPoolAllocator>();
    cca::createOrIncrefPool(static_cast<c10::DeviceIndex>(device), {a, b}, g_host_allocator);
  });
  // (segments allocated, freed, references to the allocator other than the probe's)
  m.def("host_segments", [] {
    return std::make_tuple(g_host_allocs.load(), g_host_frees.load(),
                           g_host_allocator == nullptr ? 0 : static_cast<int>(g_host_allocator.use_count()) - 1);
  });
  m.def("free_in_next_host_alloc", [](std::uint64_t ptr) { g_free_in_alloc = AsPtr(ptr); });
  m.def("set_no_split", [](int device, std::uint64_t a, std::uint64_t b) {
    cca::setNoSplit(static_cast<c10::DeviceIndex>(device), {a, b});
  });
  m.def("pool_use_count", [](int device, std::uint64_t a, std::uint64_t b) {
    return cca::getPoolUseCount(static_cast<c10::DeviceIndex>(device), {a, b});
  });
  m.def("empty_cache", [](std::uint64_t a, std::uint64_t b) { cca::emptyCache({a, b}); });
  m.def("set_use_on_oom", [](int device, std::uint64_t a, std::uint64_t b, bool on) {
    cca::setUseOnOOM(static_cast<c10::DeviceIndex>(device), {a, b}, on);
  });
  m.def("attach_trace_tracker",
        [] { cca::attachAllocatorTraceTracker([](const cca::TraceEntry&) { ++g_trace_entries; }); });
  m.def("trace_entries", [] { return g_trace_entries.load(); });
  // What torch._C._cuda_attach_out_of_memory_observer attaches (its binding needs a driver first).
  m.def("attach_oom_observer", [](py::function f) {
    auto* kept = new py::function(std::move(f));  // lives as long as the allocator
    cca::attachOutOfMemoryObserver([kept](int64_t device, size_t alloc, size_t total, size_t free) {
      py::gil_scoped_acquire gil;
      (*kept)(device, alloc, total, free);
    });
  });
  m.def("attach_oom_rejection_observer",
        [] { cca::attachOomRejectionObserver([](int64_t, size_t, size_t, size_t) { ++g_rejections; }); });
  m.def("rejections", [] { return g_rejections.load(); });
  m.def("share_ipc_handle", [](std::uint64_t ptr) {
    cca::ShareableHandle h = cca::shareIpcHandle(AsPtr(ptr));
    return py::make_tuple(h.offset, py::bytes(h.handle));
  });
  m.def("get_ipc_dev_ptr", [](py::bytes handle) { return AsInt(cca::getIpcDevPtr(std::string(handle)).get()); });
  m.def("base_allocation", [](std::uint64_t ptr) {
    size_t size = 0;
    void* base = cca::get()->getBaseAllocation(AsPtr(ptr), &size);
    return py::make_tuple(AsInt(base), static_cast<std::uint64_t>(size));
  });
  // allocateWithAddress (no Python binding): a block of `size` at `addr` in the device's own pools.
  m.def("allocate_with_address", [](std::uint64_t size, std::uint64_t addr) {
    c10::DataPtr p = cca::allocateWithAddress(size, AsPtr(addr));
    TORCH_CHECK(p.get_deleter() == cca::get()->raw_deleter(), "the DataPtr's deleter is not the raw deleter");
    const std::uint64_t address = AsInt(p.get());
    std::lock_guard<std::mutex> lock(g_mu);
    g_data_ptrs.emplace(address, std::move(p));
    return address;
  });
  m.def("memory_fraction", [](int device) { return cca::getMemoryFraction(static_cast<c10::DeviceIndex>(device)); });
}
