#pragma once
/// What the gateway counts for the admin listener's /metrics: requests by server, route and
/// status class with their latency, and per service the upstream connect and first-byte times
/// and the retries. Written in the Prometheus text format by our own small writer (Debian has
/// no Prometheus client for C++).
///
/// Each worker counts into its own shard, without locks or atomics; a scrape asks every worker
/// for a copy of its shard (through post()) and adds them up. A series is known by a small
/// number handed out (under a lock, off the request path) when a configuration is built, so
/// the request path indexes a vector; the numbers outlive configurations, so counters never
/// go back to zero on a reload.

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "spindle/fiber/runtime.h"

namespace spindle::proxy {

/// Upper bounds of the latency histograms' buckets, in seconds (+Inf comes after).
inline constexpr std::array<double, 13> kLatencyBuckets = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};

/// A latency histogram: counts per bucket (not cumulative; the last is +Inf), sum and count.
struct Histogram {
  std::array<std::uint64_t, kLatencyBuckets.size() + 1> buckets{};
  double sum = 0;
  std::uint64_t count = 0;
  void observe(double seconds);
  void add(const Histogram& other);
};

class Metrics {
 public:
  explicit Metrics(Runtime& runtime);

  /// The number of the request series of (server, route); "" for requests no route took.
  /// Made on first use. Call off the request path (building a configuration).
  std::uint32_t request_series(std::string_view server, std::string_view route);
  /// The number of the upstream series of service `service`.
  std::uint32_t upstream_series(std::string_view service);

  /// A request answered with `status` after `seconds`. Worker threads only.
  void record_request(std::uint32_t series, int status, double seconds);
  /// An upstream answered: the time to connect (0 for a pooled connection) and to the first
  /// byte of its answer. Worker threads only.
  void record_upstream(std::uint32_t series, double connect_seconds, double first_byte_seconds);
  /// An attempt sent again (a retry spent from the budget). Worker threads only.
  void record_retry(std::uint32_t series);
  /// An attempt that could have been sent again, but the retry budget was spent. Worker
  /// threads only.
  void record_retry_denied(std::uint32_t series);
  /// A request sent again because an HTTP/2 upstream turned its stream away unprocessed as it
  /// closed a connection (above GOAWAY's last stream): not a retry. Worker threads only.
  void record_resend(std::uint32_t series);
  /// Passive checks ejected a target, or (`withheld`) would have but for max_ejection_percent.
  /// Worker threads only.
  void record_ejection(std::uint32_t series, bool withheld);
  /// A target was picked among all, healthy or not: fewer than the panic threshold were
  /// healthy. Worker threads only.
  void record_panic(std::uint32_t series);
  /// A mirror copy to this service was not sent because the request's body could not go
  /// along (streamed to the primary, chunked, too large, or awaiting 100-continue). Worker
  /// threads only.
  void record_mirror_skipped(std::uint32_t series);

  /// The counted series in the Prometheus text format. From a fiber of the runtime (it waits
  /// for each worker's shard).
  std::string expose();

 private:
  struct RequestStats {
    std::array<std::uint64_t, 5> by_class{};  // 1xx .. 5xx
    Histogram latency;
  };
  struct UpstreamStats {
    Histogram connect, first_byte;
    std::uint64_t retries = 0;
    std::uint64_t retries_denied = 0;
    std::uint64_t resent = 0;
    std::uint64_t ejections = 0;
    std::uint64_t ejections_withheld = 0;
    std::uint64_t panics = 0;
    std::uint64_t mirrors_skipped = 0;
  };
  /// An upstream counter /metrics shows, with its member of UpstreamStats.
  struct UpstreamCounter {
    const char* name;
    const char* help;
    std::uint64_t UpstreamStats::*value;
  };
  /// Every one: the one list both the sum over the workers and the text take.
  static const UpstreamCounter kUpstreamCounters[];
  struct alignas(64) Shard {
    std::vector<RequestStats> requests;
    std::vector<UpstreamStats> upstreams;
  };
  Shard& shard();
  /// Every worker's shard summed (each copies its own, on its own thread; this waits).
  Shard gather();

  Runtime& runtime_;
  std::vector<std::unique_ptr<Shard>> shards_;
  /// The series' labels by number, and their numbers by labels.
  std::mutex lock_;
  std::vector<std::pair<std::string, std::string>> request_labels_;
  std::map<std::pair<std::string, std::string>, std::uint32_t, std::less<>> request_ids_;
  std::vector<std::string> upstream_labels_;
  std::map<std::string, std::uint32_t, std::less<>> upstream_ids_;
};

/// Writing the Prometheus text format (version 0.0.4).
namespace prometheus {
/// `value` as a label value: backslash, double quote and newline escaped.
std::string escape(std::string_view value);
/// The "# HELP" and "# TYPE" lines of a family.
void family(std::string& out, std::string_view name, std::string_view type, std::string_view help);
/// One sample line: name{labels} value. `labels` is already written: a="x",b="y" (or "").
void sample(std::string& out, std::string_view name, std::string_view labels, double value);
/// A histogram's _bucket, _sum and _count lines.
void histogram(std::string& out, std::string_view name, std::string_view labels,
               const Histogram& h);
}  // namespace prometheus

}  // namespace spindle::proxy
