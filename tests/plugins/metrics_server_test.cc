// The /metrics endpoint (plugins/common/metrics_server.cc): what GET /metrics, other paths and
// other methods get; a client that sends nothing does not stop the next one; addresses refused
// with what is accepted; the server stops when destroyed.
#include "plugins/common/metrics_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace bucketalloc::plugins {
namespace {

// Connects to 127.0.0.1:port, sends `request` and returns everything the server answers.
std::string Exchange(int port, const std::string& request) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return "connect failed";
  }
  send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = recv(fd, buf, sizeof buf, 0)) > 0;) out.append(buf, static_cast<std::size_t>(n));
  close(fd);
  return out;
}

TEST(MetricsServerTest, ServesTheRenderedTextAtMetrics) {
  std::atomic<int> renders{0};
  absl::StatusOr<std::unique_ptr<MetricsServer>> s = MetricsServer::Start("127.0.0.1:0", [&] {
    ++renders;
    return std::string("# TYPE bucketalloc_x gauge\nbucketalloc_x{device=\"0\"} 1\n");
  });
  ASSERT_TRUE(s.ok()) << s.status();
  const int port = (*s)->port();
  ASSERT_GT(port, 0);
  const std::string ok = Exchange(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_TRUE(absl::StartsWith(ok, "HTTP/1.1 200 OK\r\n")) << ok;
  EXPECT_TRUE(absl::StrContains(ok, "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n")) << ok;
  EXPECT_TRUE(absl::StrContains(ok, "Content-Length: 55\r\n")) << ok;
  EXPECT_TRUE(absl::EndsWith(ok, "\r\n\r\n# TYPE bucketalloc_x gauge\nbucketalloc_x{device=\"0\"} 1\n")) << ok;
  EXPECT_TRUE(absl::StartsWith(Exchange(port, "GET /metrics?name[]=x HTTP/1.1\r\n\r\n"), "HTTP/1.1 200"));
  const std::string head = Exchange(port, "HEAD /metrics HTTP/1.1\r\n\r\n");
  EXPECT_TRUE(absl::EndsWith(head, "\r\n\r\n")) << "no body for HEAD: " << head;
  EXPECT_TRUE(absl::StartsWith(Exchange(port, "GET /other HTTP/1.1\r\n\r\n"), "HTTP/1.1 404 Not Found"));
  EXPECT_TRUE(absl::StartsWith(Exchange(port, "POST /metrics HTTP/1.1\r\n\r\n"), "HTTP/1.1 405"));
  EXPECT_EQ(renders.load(), 3) << "only GET and HEAD of /metrics render";
}

TEST(MetricsServerTest, ASilentClientIsDroppedAndTheNextIsServed) {
  absl::StatusOr<std::unique_ptr<MetricsServer>> s = MetricsServer::Start("127.0.0.1:0", [] { return "x\n"; });
  ASSERT_TRUE(s.ok()) << s.status();
  const int silent = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>((*s)->port()));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(silent, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  // Served after the silent one times out (2 s).
  EXPECT_TRUE(absl::StartsWith(Exchange((*s)->port(), "GET /metrics HTTP/1.0\r\n\r\n"), "HTTP/1.1 200"));
  close(silent);
}

TEST(MetricsServerTest, BadAddressesAreRefusedWithWhatIsAccepted) {
  for (const char* addr : {"", "9400", "host", "127.0.0.1:", "127.0.0.1:http", "127.0.0.1:70000", "[::1:9400"}) {
    absl::StatusOr<std::unique_ptr<MetricsServer>> s = MetricsServer::Start(addr, [] { return ""; });
    ASSERT_FALSE(s.ok()) << addr;
    EXPECT_TRUE(absl::IsInvalidArgument(s.status())) << addr << ": " << s.status();
    EXPECT_TRUE(absl::StrContains(s.status().message(), "accepted: HOST:PORT or [IPv6]:PORT")) << s.status();
  }
  absl::StatusOr<std::unique_ptr<MetricsServer>> s = MetricsServer::Start("127.0.0.1:0", [] { return ""; });
  ASSERT_TRUE(s.ok());
  absl::StatusOr<std::unique_ptr<MetricsServer>> again =
      MetricsServer::Start(absl::StrCat("127.0.0.1:", (*s)->port()), [] { return ""; });
  EXPECT_TRUE(absl::IsUnavailable(again.status())) << again.status();
  EXPECT_TRUE(absl::StrContains(again.status().message(), "in use")) << again.status();
}

TEST(MetricsServerTest, DestroyingItStopsServing) {
  int port = 0;
  {
    absl::StatusOr<std::unique_ptr<MetricsServer>> s = MetricsServer::Start("127.0.0.1:0", [] { return "x\n"; });
    ASSERT_TRUE(s.ok());
    port = (*s)->port();
  }
  EXPECT_EQ(Exchange(port, "GET /metrics HTTP/1.1\r\n\r\n"), "connect failed");
}

}  // namespace
}  // namespace bucketalloc::plugins
