// A probe module (torch.utils.cpp_extension) that drives PyTorch's own CUDAPluggableAllocator object
// (the current allocator, after bucketalloc_torch.enable()) the way torch's CUDA code does, without
// a driver: CUDAPluggableAllocator::malloc (what allocate() calls after asking for the device and
// stream), raw_delete, and the CUDAGraph / MemPool pool hooks. Errors propagate as torch's bindings
// propagate them (c10::OutOfMemoryError -> torch.cuda.OutOfMemoryError).
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>
#include <torch/extension.h>

namespace {

torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator& Current() {
  auto current = torch::cuda::CUDAPluggableAllocator::getCurrentAllocator();
  TORCH_CHECK(current != nullptr && current->name() == "pluggable", "the current allocator is not pluggable");
  return *static_cast<torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator*>(current.get());
}

cudaStream_t AsStream(std::uint64_t s) { return reinterpret_cast<cudaStream_t>(s); }

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("malloc", [](std::uint64_t size, int device, std::uint64_t stream) {
    return reinterpret_cast<std::uint64_t>(
        Current().malloc(size, static_cast<c10::DeviceIndex>(device), AsStream(stream)));
  });
  m.def("free", [](std::uint64_t ptr) { Current().raw_delete(reinterpret_cast<void*>(ptr)); });
  // CUDAGraph::capture_begin's call: the filter accepts the capturing stream.
  m.def("begin_allocate_to_pool", [](int device, std::uint64_t a, std::uint64_t b, std::uint64_t stream) {
    Current().beginAllocateToPool(static_cast<c10::DeviceIndex>(device), {a, b},
                                  [s = AsStream(stream)](cudaStream_t x) { return x == s; });
  });
  m.def("end_allocate_to_pool", [](int device, std::uint64_t a, std::uint64_t b) {
    Current().endAllocateToPool(static_cast<c10::DeviceIndex>(device), {a, b});
  });
  m.def("release_pool", [](int device, std::uint64_t a, std::uint64_t b) {
    Current().releasePool(static_cast<c10::DeviceIndex>(device), {a, b});
  });
  // What at::cuda::MemPool's constructor calls on the current allocator.
  m.def("create_or_incref_pool", [](int device, std::uint64_t a, std::uint64_t b) {
    Current().createOrIncrefPool(static_cast<c10::DeviceIndex>(device), {a, b}, nullptr);
  });
}
