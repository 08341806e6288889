// tests/cuda_double/cuda_double.h — the controls of the CUDA test double (tests/cuda_double/cuda_double.cc).
//
// The double is a shared library, libcuda.so.1 by its SONAME, that exports the CUDA driver functions
// bucketalloc calls (served as well through cuGetProcAddress_v2 and the runtime's
// cudaGetDriverEntryPointByVersion) and the CUDA runtime functions a program and the LD_PRELOAD shim
// call. Its devices live in host memory: a device pointer is a host address, so fake kernels (below)
// read and write it. Every call checks CUDA's documented rules (the table `kRules` in the .cc, each
// row citing its header line); a broken rule returns the error CUDA documents AND is recorded as a
// violation, which a correct client never causes. Tests assert cudadouble_violation_count() == 0.
//
// Configuration (read once, at the first call): CUDA_DOUBLE_DEVICES (default 2),
// CUDA_DOUBLE_DEVICE_MEMORY (bytes per device, default 4 GiB), CUDA_DOUBLE_DRIVER_VERSION (e.g.
// 12020 or 13000, the default), CUDA_DOUBLE_PEER_ACCESS (1: devices can access each other, the
// default; 0: not), CUDA_DOUBLE_REPORT=stderr (print the violations at exit).
//
// Execution model: work queued on a stream (fake kernels, event records, waits) runs only when
// something requires it: synchronizing the stream, an event, the context or the device; querying
// them (a query of unfinished work returns "not ready" once and lets the work run, so polling
// makes progress); or a dependency (the legacy stream's implicit synchronization with blocking
// streams, cuStreamWaitEvent). Work is never run earlier than CUDA allows, so a block reused before
// the work that used it has run shows as corrupted data (cudadouble_corruptions()).
#ifndef BUCKETALLOC_TESTS_CUDA_DOUBLE_CUDA_DOUBLE_H_
#define BUCKETALLOC_TESTS_CUDA_DOUBLE_CUDA_DOUBLE_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Rule violations recorded so far (each one line: "<rule>: <call>: <detail> [<source>]").
int cudadouble_violation_count(void);
// All violation lines, joined by '\n' (valid until the next call into the double).
const char* cudadouble_violations(void);
void cudadouble_clear_violations(void);
// A label put in front of every violation recorded from now on (e.g. the running test's name).
void cudadouble_set_label(const char* label);

// How many times a primary context was created on `device` (0 or more; a context that is released
// to zero references and retained again counts again).
int cudadouble_contexts_created(int device);
// Physical bytes in use on `device` (cuMemAlloc'd plus cuMemCreate'd, rounded to the granularity).
size_t cudadouble_used_bytes(int device);
// Whether the devices have POSIX file descriptor handles (default 1): with 0, cuMemCreate refuses
// requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR with CUDA_ERROR_NOT_SUPPORTED (a
// device property, not a violation) and CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED
// is 0, as on a device or driver without them.
void cudadouble_set_posix_fd_handles(int supported);
// How many times the driver function `name` was called (counted: "cuMemMap", "cuMemSetAccess",
// "cuMemCreate", "cuMemRelease", "cuMemUnmap", "cuMemAddressReserve", "cuMemAddressFree",
// "cuMemExportToShareableHandle", "cuMemImportFromShareableHandle").
uint64_t cudadouble_calls(const char* name);
// Work items queued on any stream that have not run yet.
int cudadouble_pending_work(void);

// Fake kernels, queued on `stream` (a cudaStream_t/CUstream handle, 0 for the legacy stream) of the
// current context. Return a cudaError_t (0 on success). When they run they check that every byte
// of [ptr, ptr + bytes) is device memory the stream's device may access (allocated and, for
// virtual memory, mapped with access set for that device); a kernel on memory it may not access is
// a violation and touches nothing.
int cudadouble_fill(void* stream, void* ptr, size_t bytes, uint8_t value);
// Counts, when it runs, one corruption if any byte of the range is not `value`.
int cudadouble_expect(void* stream, const void* ptr, size_t bytes, uint8_t value);
// Kernels whose data was not what they expected.
uint64_t cudadouble_corruptions(void);
// What the first corrupted kernel found ("" when none was).
const char* cudadouble_first_corruption(void);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // BUCKETALLOC_TESTS_CUDA_DOUBLE_CUDA_DOUBLE_H_
