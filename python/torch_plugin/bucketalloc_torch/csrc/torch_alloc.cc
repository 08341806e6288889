// bucketalloc_torch/csrc/torch_alloc.cc — the alloc and free functions PyTorch's
// CUDAPluggableAllocator calls, compiled against the installed torch (bucketalloc_torch/_torch_ext.py
// builds and caches it), so that an out-of-memory failure is PyTorch's own c10::OutOfMemoryError:
// Python sees torch.cuda.OutOfMemoryError, and C++ code that catches it (cuDNN's algorithm search,
// accelerate's batch-size search through Python) treats it as an OOM.
//
// It calls libbucketalloc.so through the function pointers bucketalloc_torch_init is given (the
// process's one loaded copy), so it links nothing of bucketalloc's.
//
// While bucketalloc_torch_record_stacks(1) is on, every allocation it serves records the Python
// stack of the calling thread (as torch's record_memory_history(stacks="python") does), kept per
// address until the address is allocated again; bucketalloc_torch_stacks() returns them as a dict
// for the snapshot.
#include <Python.h>
#include <frameobject.h>
#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <c10/util/Exception.h>

namespace {

using TryMallocFn = int (*)(ssize_t, int, void*, void**);
using FreeFn = void (*)(void*, ssize_t, int, void*);
using LastErrorFn = const char* (*)();

TryMallocFn g_try_malloc = nullptr;
FreeFn g_free = nullptr;
LastErrorFn g_last_error = nullptr;

struct Frame {
  std::string filename;
  std::string name;
  int line = 0;
};
constexpr int kMaxFrames = 64;
std::atomic<bool> g_record_stacks{false};
std::mutex g_stacks_mu;
std::unordered_map<std::uintptr_t, std::vector<Frame>>* g_stacks = nullptr;  // guarded by g_stacks_mu; leaked

std::string Utf8(PyObject* text) {
  const char* s = text != nullptr ? PyUnicode_AsUTF8(text) : nullptr;
  if (s == nullptr) {
    PyErr_Clear();
    return "??";
  }
  return s;
}

// The calling thread's Python stack, innermost frame first (empty outside Python).
std::vector<Frame> PythonStack() {
  std::vector<Frame> frames;
  if (!Py_IsInitialized()) return frames;
  const PyGILState_STATE gil = PyGILState_Ensure();
  PyFrameObject* f = PyEval_GetFrame();  // borrowed
  Py_XINCREF(f);
  while (f != nullptr && static_cast<int>(frames.size()) < kMaxFrames) {
    PyCodeObject* code = PyFrame_GetCode(f);
    frames.push_back(Frame{Utf8(code->co_filename), Utf8(code->co_name), PyFrame_GetLineNumber(f)});
    Py_DECREF(code);
    PyFrameObject* back = PyFrame_GetBack(f);
    Py_DECREF(f);
    f = back;
  }
  Py_XDECREF(f);
  PyGILState_Release(gil);
  return frames;
}

void RecordStack(void* ptr) {
  std::vector<Frame> frames = PythonStack();
  std::lock_guard<std::mutex> lock(g_stacks_mu);
  if (g_stacks == nullptr) g_stacks = new std::unordered_map<std::uintptr_t, std::vector<Frame>>;
  (*g_stacks)[reinterpret_cast<std::uintptr_t>(ptr)] = std::move(frames);
}

}  // namespace

extern "C" {

// Given the library's bucketalloc_try_malloc, bucketalloc_free and bucketalloc_last_error.
__attribute__((visibility("default"))) void bucketalloc_torch_init(void* try_malloc, void* free_fn, void* last_error) {
  g_try_malloc = reinterpret_cast<TryMallocFn>(try_malloc);
  g_free = reinterpret_cast<FreeFn>(free_fn);
  g_last_error = reinterpret_cast<LastErrorFn>(last_error);
}

// PyTorch's MallocFuncType: void*(size_t, int, cudaStream_t).
__attribute__((visibility("default"))) void* bucketalloc_torch_malloc(ssize_t size, int device, void* stream) {
  TORCH_CHECK(g_try_malloc != nullptr,
              "bucketalloc_torch: the alloc function was not initialized "
              "(bucketalloc_torch.enable() calls bucketalloc_torch_init first)");
  void* p = nullptr;
  const int rc = g_try_malloc(size, device, stream, &p);
  if (rc == 0) {
    if (p != nullptr && g_record_stacks.load(std::memory_order_relaxed)) [[unlikely]]
      RecordStack(p);
    return p;
  }
  const std::string message = g_last_error();
  if (rc == 1) throw c10::OutOfMemoryError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, message);
  throw c10::Error({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, message);
}

// Turns the recording of Python stacks on (clearing what was recorded) or off.
__attribute__((visibility("default"))) void bucketalloc_torch_record_stacks(int on) {
  std::lock_guard<std::mutex> lock(g_stacks_mu);
  if (on != 0 && g_stacks != nullptr) g_stacks->clear();
  g_record_stacks.store(on != 0);
}

// The recorded stacks, {address: [{"filename", "line", "name"}, ...]} (innermost frame first); a
// new reference. Called with the GIL held (through ctypes.PyDLL).
__attribute__((visibility("default"))) PyObject* bucketalloc_torch_stacks() {
  PyObject* result = PyDict_New();
  if (result == nullptr) return nullptr;
  std::lock_guard<std::mutex> lock(g_stacks_mu);
  if (g_stacks == nullptr) return result;
  for (const auto& [address, frames] : *g_stacks) {
    PyObject* list = PyList_New(static_cast<Py_ssize_t>(frames.size()));
    for (std::size_t i = 0; i < frames.size(); ++i) {
      PyObject* frame = Py_BuildValue("{s:s,s:i,s:s}", "filename", frames[i].filename.c_str(), "line", frames[i].line,
                                      "name", frames[i].name.c_str());
      PyList_SET_ITEM(list, static_cast<Py_ssize_t>(i), frame);
    }
    PyObject* key = PyLong_FromUnsignedLongLong(address);
    PyDict_SetItem(result, key, list);
    Py_DECREF(key);
    Py_DECREF(list);
  }
  return result;
}

// PyTorch's FreeFuncType: void(void*, size_t, int, cudaStream_t).
__attribute__((visibility("default"))) void bucketalloc_torch_free(void* ptr, ssize_t size, int device, void* stream) {
  if (g_free != nullptr) g_free(ptr, size, device, stream);
}

}  // extern "C"
