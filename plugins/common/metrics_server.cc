// plugins/common/metrics_server.cc — the /metrics endpoint (plugins/common/metrics_server.h).
#include "plugins/common/metrics_server.h"

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "bucketalloc/metrics.h"

namespace bucketalloc::plugins {
namespace {

constexpr int kReadTimeoutMs = 2000;      // a client that sends nothing for this long is dropped
constexpr int kRequestDeadlineMs = 5000;  // nor may its request take longer in all
constexpr std::size_t kMaxRequestBytes = 8192;

absl::Status BadAddress(absl::string_view addr, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("bucketalloc: metrics address \"", addr, "\" ", why,
                                                 "; accepted: HOST:PORT or [IPv6]:PORT, e.g. 127.0.0.1:9400 "
                                                 "(port 0 to 65535; 0 picks a free one)"));
}

// Splits "HOST:PORT" / "[V6]:PORT".
absl::Status SplitAddress(absl::string_view addr, std::string* host, std::string* port) {
  std::size_t colon = addr.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) return BadAddress(addr, "has no HOST:PORT form");
  absl::string_view h = addr.substr(0, colon);
  if (absl::StartsWith(h, "[")) {
    if (!absl::EndsWith(h, "]") || h.size() < 3) return BadAddress(addr, "has an unclosed [IPv6] host");
    h = h.substr(1, h.size() - 2);
  }
  int number = 0;
  const absl::string_view p = addr.substr(colon + 1);
  if (!absl::SimpleAtoi(p, &number) || number < 0 || number > 65535) {
    return BadAddress(addr, "has no port number");
  }
  *host = std::string(h);
  *port = std::string(p);
  return absl::OkStatus();
}

bool SendAll(int fd, absl::string_view data) {
  while (!data.empty()) {
    const ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(absl::string_view addr,
                                                                    std::function<std::string()> render) {
  std::string host, port;
  if (absl::Status s = SplitAddress(addr, &host, &port); !s.ok()) return s;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (int e = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); e != 0) {
    return BadAddress(addr, absl::StrCat("does not resolve (", gai_strerror(e), ")"));
  }
  std::string error = "no address to bind";
  int fd = -1;
  for (addrinfo* ai = found; ai != nullptr && fd < 0; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      error = std::strerror(errno);
      continue;
    }
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 16) != 0) {
      error = std::strerror(errno);
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("bucketalloc: cannot serve metrics on ", addr, ": ", error));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  const int bound_port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                                           : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return std::unique_ptr<MetricsServer>(new MetricsServer(fd, bound_port, std::move(render)));
}

MetricsServer::MetricsServer(int fd, int port, std::function<std::string()> render)
    : fd_(fd), port_(port), render_(std::move(render)), thread_([this] { Serve(); }) {}

MetricsServer::~MetricsServer() {
  stopping_.store(true);
  shutdown(fd_, SHUT_RDWR);  // wakes the accept
  thread_.join();
  close(fd_);
}

void MetricsServer::Serve() {
  while (!stopping_.load()) {
    const int client = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) {
      if (stopping_.load()) return;
      if (errno == EINTR || errno == ECONNABORTED || errno == EMFILE || errno == ENFILE) continue;
      return;  // the socket is gone: nothing more to serve
    }
    Answer(client);
    close(client);
  }
}

void MetricsServer::Answer(int client) {
  // A client that does not read the answer is dropped too (2 s per send).
  const timeval send_timeout{kReadTimeoutMs / 1000, 0};
  setsockopt(client, SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof send_timeout);
  // The request head, up to its blank line; the body of a GET is nothing.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kRequestDeadlineMs);
  std::string request;
  char buf[1024];
  while (request.size() < kMaxRequestBytes && request.find("\r\n\r\n") == std::string::npos &&
         request.find("\n\n") == std::string::npos) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd p{client, POLLIN, 0};
    if (left.count() <= 0 || poll(&p, 1, static_cast<int>(std::min<std::int64_t>(left.count(), kReadTimeoutMs))) <= 0) {
      return;  // a silent or slow client: dropped
    }
    const ssize_t n = recv(client, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    request.append(buf, static_cast<std::size_t>(n));
  }
  const std::vector<absl::string_view> line =
      absl::StrSplit(absl::string_view(request).substr(0, request.find_first_of("\r\n")), ' ');
  std::string status = "200 OK", type = kPrometheusContentType, body;
  const absl::string_view path = line.size() >= 2 ? line[1] : "";
  const absl::string_view bare = path.substr(0, path.find('?'));
  if (line.size() < 3 || (line[0] != "GET" && line[0] != "HEAD")) {
    status = "405 Method Not Allowed";
    type = "text/plain; charset=utf-8";
    body = "bucketalloc: only GET /metrics is served\n";
  } else if (bare != "/metrics" && bare != "/") {
    status = "404 Not Found";
    type = "text/plain; charset=utf-8";
    body = absl::StrCat("bucketalloc: no ", bare, " here; the metrics are at /metrics\n");
  } else {
    body = render_();
  }
  std::string head = absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", type, "\r\nContent-Length: ", body.size(),
                                  "\r\nConnection: close\r\n\r\n");
  if (SendAll(client, head) && line.size() >= 1 && line[0] != "HEAD") SendAll(client, body);
}

void StartMetricsServerFromEnv(const Allocator* allocator, const char* who) {
  const char* addr = std::getenv("BUCKETALLOC_METRICS_ADDR");
  if (addr == nullptr || allocator == nullptr) return;
  static const bool started = [&] {
    auto report = [&](absl::string_view why) {
      std::fprintf(stderr, "%s: BUCKETALLOC_METRICS_ADDR=%s: %s; metrics are not served (nothing else changes)\n", who,
                   addr, std::string(absl::StripPrefix(why, "bucketalloc: ")).c_str());
      return false;
    };
    try {
      absl::StatusOr<std::unique_ptr<MetricsServer>> server =
          MetricsServer::Start(addr, [allocator] { return MetricsToPrometheus(allocator->Metrics()); });
      if (!server.ok()) return report(server.status().message());
      // Lives as long as the process, as the allocator does. A child of fork has no server thread:
      // it closes the socket, so that the port is free again when the parent ends.
      static int listening = -1;
      listening = (*server)->fd();
      pthread_atfork(nullptr, nullptr, [] { close(listening); });
      server->release();
      return true;
    } catch (const std::exception& e) {  // no thread or no memory for it
      return report(e.what());
    }
  }();
  (void)started;
}

}  // namespace bucketalloc::plugins
