// plugins/common/metrics_server.h — the /metrics endpoint of the C ABI library and the LD_PRELOAD
// shim (layer L5): BUCKETALLOC_METRICS_ADDR=HOST:PORT serves the allocator's Prometheus metrics
// (bucketalloc/metrics.h) over HTTP for a C host or a CUDA program that has no metrics server of
// its own (a Python server exposes them through prometheus_client instead: bucketalloc_torch).
//
// Owns: `MetricsServer`, one listening socket and the thread that answers it: GET /metrics (or /)
// gets the text with Prometheus's content type, anything else 404 or 405. Requests are answered
// one at a time; a client that sends nothing for 2 s, takes more than 5 s to send its request or
// does not read the answer for 2 s is dropped. The thread renders from copies taken under each
// device's lock (the fragmentation report walks the device's blocks meanwhile, so an allocation
// may wait that long); nothing runs on the allocation path itself.
// `StartMetricsServerFromEnv` starts the process's one server; a bad address or a failed bind is
// printed once on stderr and changes nothing else (the allocator serves as before).
// Thread-safety: Start and the destructor from one thread; the server thread only renders and
// writes. fork(2): the child has no server thread and closes the process server's socket (and it
// is close-on-exec).
//
// Example:
//   absl::StatusOr<std::unique_ptr<MetricsServer>> s =
//       MetricsServer::Start("127.0.0.1:0", [&] { return MetricsToPrometheus(a->Metrics()); });
//   int port = (*s)->port();   // curl http://127.0.0.1:<port>/metrics
#ifndef BUCKETALLOC_PLUGINS_COMMON_METRICS_SERVER_H_
#define BUCKETALLOC_PLUGINS_COMMON_METRICS_SERVER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "bucketalloc/allocator.h"

namespace bucketalloc::plugins {

class MetricsServer {
 public:
  // Listens on `addr` ("HOST:PORT", "[IPv6]:PORT"; port 0 picks a free one) and answers with
  // `render()`. InvalidArgument naming what is accepted for a bad address; Unavailable when the
  // socket cannot be bound (the port is taken, the host is not this machine's).
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(absl::string_view addr,
                                                              std::function<std::string()> render);
  ~MetricsServer();  // stops the thread and closes the socket
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  int port() const { return port_; }
  int fd() const { return fd_; }  // the listening socket

 private:
  MetricsServer(int fd, int port, std::function<std::string()> render);
  void Serve();
  void Answer(int client);

  const int fd_;
  const int port_;
  const std::function<std::string()> render_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

// When BUCKETALLOC_METRICS_ADDR is set, starts (once per process) the server of `allocator`'s
// metrics, which lives as long as the process; `who` names the library in the one line printed
// when it cannot start ("bucketalloc", "bucketalloc preload"; a bad address, a taken port, no
// thread); nothing else changes then.
void StartMetricsServerFromEnv(const Allocator* allocator, const char* who);

}  // namespace bucketalloc::plugins

#endif  // BUCKETALLOC_PLUGINS_COMMON_METRICS_SERVER_H_
