#include "spindle/proxy/metrics.h"

#include <fmt/format.h>

#include <algorithm>

#include "spindle/fiber/worker.h"
#include "spindle/sync/wait_group.h"

namespace spindle::proxy {

void Histogram::observe(double seconds) {
  // The first bucket whose bound is not below `seconds` (std::lower_bound's), found from the
  // smallest: most requests take less than the first bound, one compare.
  std::size_t at = 0;
  while (at < kLatencyBuckets.size() && kLatencyBuckets[at] < seconds) ++at;
  ++buckets[at];
  sum += seconds;
  ++count;
}

void Histogram::add(const Histogram& other) {
  for (std::size_t i = 0; i < buckets.size(); ++i) buckets[i] += other.buckets[i];
  sum += other.sum;
  count += other.count;
}

Metrics::Metrics(Runtime& runtime) : runtime_(runtime) {
  for (std::size_t i = 0; i < runtime.size(); ++i) shards_.push_back(std::make_unique<Shard>());
}

std::uint32_t Metrics::request_series(std::string_view server, std::string_view route) {
  std::lock_guard guard(lock_);
  auto key = std::pair<std::string, std::string>(server, route);
  auto [it, added] =
      request_ids_.try_emplace(key, static_cast<std::uint32_t>(request_labels_.size()));
  if (added) request_labels_.push_back(std::move(key));
  return it->second;
}

std::uint32_t Metrics::upstream_series(std::string_view service) {
  std::lock_guard guard(lock_);
  auto [it, added] = upstream_ids_.try_emplace(std::string(service),
                                               static_cast<std::uint32_t>(upstream_labels_.size()));
  if (added) upstream_labels_.emplace_back(service);
  return it->second;
}

Metrics::Shard& Metrics::shard() { return *shards_[Worker::current()->index()]; }

void Metrics::record_request(std::uint32_t series, int status, double seconds) {
  Shard& s = shard();
  if (series >= s.requests.size()) s.requests.resize(series + 1);
  RequestStats& stats = s.requests[series];
  ++stats.by_class[static_cast<std::size_t>(std::clamp(status / 100, 1, 5) - 1)];
  stats.latency.observe(seconds);
}

void Metrics::record_upstream(std::uint32_t series, double connect_seconds,
                              double first_byte_seconds) {
  Shard& s = shard();
  if (series >= s.upstreams.size()) s.upstreams.resize(series + 1);
  UpstreamStats& stats = s.upstreams[series];
  stats.connect.observe(connect_seconds);
  stats.first_byte.observe(first_byte_seconds);
}

void Metrics::record_retry(std::uint32_t series) {
  Shard& s = shard();
  if (series >= s.upstreams.size()) s.upstreams.resize(series + 1);
  ++s.upstreams[series].retries;
}

void Metrics::record_retry_denied(std::uint32_t series) {
  Shard& s = shard();
  if (series >= s.upstreams.size()) s.upstreams.resize(series + 1);
  ++s.upstreams[series].retries_denied;
}

void Metrics::record_resend(std::uint32_t series) {
  Shard& s = shard();
  if (series >= s.upstreams.size()) s.upstreams.resize(series + 1);
  ++s.upstreams[series].resent;
}

void Metrics::record_ejection(std::uint32_t series, bool withheld) {
  Shard& s = shard();
  if (series >= s.upstreams.size()) s.upstreams.resize(series + 1);
  ++(withheld ? s.upstreams[series].ejections_withheld : s.upstreams[series].ejections);
}

void Metrics::record_panic(std::uint32_t series) {
  Shard& s = shard();
  if (series >= s.upstreams.size()) s.upstreams.resize(series + 1);
  ++s.upstreams[series].panics;
}

void Metrics::record_mirror_skipped(std::uint32_t series) {
  Shard& s = shard();
  if (series >= s.upstreams.size()) s.upstreams.resize(series + 1);
  ++s.upstreams[series].mirrors_skipped;
}

const Metrics::UpstreamCounter Metrics::kUpstreamCounters[] = {
    {"spindle_upstream_retries_total",
     "Attempts sent again to another target (each spends the retry budget), by service.",
     &UpstreamStats::retries},
    {"spindle_upstream_retries_denied_total",
     "Attempts that could have been sent again but the retry budget was spent, by service.",
     &UpstreamStats::retries_denied},
    {"spindle_upstream_resent_total",
     "Requests sent again because an HTTP/2 upstream closing a connection turned their "
     "stream away unprocessed (GOAWAY), by service: not retries.",
     &UpstreamStats::resent},
    {"spindle_upstream_ejections_total", "Targets passive health checks took out, by service.",
     &UpstreamStats::ejections},
    {"spindle_upstream_ejections_withheld_total",
     "Ejections due but not made, because max_ejection_percent of the targets were out, by "
     "service.",
     &UpstreamStats::ejections_withheld},
    {"spindle_upstream_panic_total",
     "Requests sent with fewer healthy targets than the panic threshold (spread over all "
     "targets), by service.",
     &UpstreamStats::panics},
    {"spindle_mirror_skipped_total",
     "Mirror copies not sent because the request's body could not go along (streamed to the "
     "primary, chunked, over 64 KiB, or awaiting 100-continue), by the mirror's service.",
     &UpstreamStats::mirrors_skipped},
};

Metrics::Shard Metrics::gather() {
  // Each worker copies its own shard: nobody else touches it.
  std::vector<Shard> copies(shards_.size());
  WaitGroup copied;
  for (std::size_t i = 0; i < shards_.size(); ++i) {
    copied.add();
    runtime_.worker(i).post([this, i, &copies, &copied] {
      copies[i].requests = shards_[i]->requests;
      copies[i].upstreams = shards_[i]->upstreams;
      copied.done();
    });
  }
  // Not cancellable: the posted copies write into `copies` until they are done.
  (void)copied.wait(Deadline::never(), kNotCancellable);
  Shard total;
  for (const Shard& s : copies) {
    total.requests.resize(std::max(total.requests.size(), s.requests.size()));
    total.upstreams.resize(std::max(total.upstreams.size(), s.upstreams.size()));
    for (std::size_t i = 0; i < s.requests.size(); ++i) {
      for (std::size_t c = 0; c < 5; ++c)
        total.requests[i].by_class[c] += s.requests[i].by_class[c];
      total.requests[i].latency.add(s.requests[i].latency);
    }
    for (std::size_t i = 0; i < s.upstreams.size(); ++i) {
      UpstreamStats& sum = total.upstreams[i];
      const UpstreamStats& add = s.upstreams[i];
      sum.connect.add(add.connect);
      sum.first_byte.add(add.first_byte);
      for (const UpstreamCounter& counter : kUpstreamCounters) {
        sum.*counter.value += add.*counter.value;
      }
    }
  }
  return total;
}

std::string Metrics::expose() {
  Shard total = gather();
  std::vector<std::pair<std::string, std::string>> request_labels;
  std::vector<std::string> upstream_labels;
  {
    std::lock_guard guard(lock_);
    request_labels = request_labels_;
    upstream_labels = upstream_labels_;
  }
  auto request_label = [&](std::size_t i) {
    return fmt::format("server=\"{}\",route=\"{}\"", prometheus::escape(request_labels[i].first),
                       prometheus::escape(request_labels[i].second));
  };
  std::string out;
  using namespace prometheus;
  family(out, "spindle_requests_total", "counter",
         "Requests answered, by server, route (\"\" when no route took it) and status class.");
  for (std::size_t i = 0; i < total.requests.size(); ++i) {
    for (std::size_t c = 0; c < 5; ++c) {
      if (total.requests[i].by_class[c] == 0) continue;
      sample(out, "spindle_requests_total",
             fmt::format("{},code=\"{}xx\"", request_label(i), c + 1),
             static_cast<double>(total.requests[i].by_class[c]));
    }
  }
  family(out, "spindle_request_duration_seconds", "histogram",
         "Time from a request's head to its response's head, by server and route.");
  for (std::size_t i = 0; i < total.requests.size(); ++i) {
    if (total.requests[i].latency.count == 0) continue;
    histogram(out, "spindle_request_duration_seconds", request_label(i), total.requests[i].latency);
  }
  auto service_label = [&](std::size_t i) {
    return fmt::format("service=\"{}\"", prometheus::escape(upstream_labels[i]));
  };
  for (auto [name, help, times] :
       {std::tuple{"spindle_upstream_connect_seconds",
                   "Time to connect to an upstream target (0 for a pooled connection), by service.",
                   &UpstreamStats::connect},
        std::tuple{"spindle_upstream_first_byte_seconds",
                   "Time from sending a request upstream to the first byte of its answer, by "
                   "service.",
                   &UpstreamStats::first_byte}}) {
    family(out, name, "histogram", help);
    for (std::size_t i = 0; i < total.upstreams.size(); ++i) {
      if ((total.upstreams[i].*times).count == 0) continue;
      histogram(out, name, service_label(i), total.upstreams[i].*times);
    }
  }
  for (const UpstreamCounter& counter : kUpstreamCounters) {
    family(out, counter.name, "counter", counter.help);
    for (std::size_t i = 0; i < total.upstreams.size(); ++i) {
      sample(out, counter.name, service_label(i),
             static_cast<double>(total.upstreams[i].*counter.value));
    }
  }
  return out;
}

// ---- the text format -------------------------------------------------------------------------

std::string prometheus::escape(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

void prometheus::family(std::string& out, std::string_view name, std::string_view type,
                        std::string_view help) {
  fmt::format_to(std::back_inserter(out), "# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

void prometheus::sample(std::string& out, std::string_view name, std::string_view labels,
                        double value) {
  if (labels.empty()) {
    fmt::format_to(std::back_inserter(out), "{} {}\n", name, value);
  } else {
    fmt::format_to(std::back_inserter(out), "{}{{{}}} {}\n", name, labels, value);
  }
}

void prometheus::histogram(std::string& out, std::string_view name, std::string_view labels,
                           const Histogram& h) {
  std::uint64_t cumulative = 0;
  std::string sep = labels.empty() ? "" : ",";
  for (std::size_t i = 0; i < h.buckets.size(); ++i) {
    cumulative += h.buckets[i];
    std::string le = i < kLatencyBuckets.size() ? fmt::format("{}", kLatencyBuckets[i]) : "+Inf";
    fmt::format_to(std::back_inserter(out), "{}_bucket{{{}{}le=\"{}\"}} {}\n", name, labels, sep,
                   le, cumulative);
  }
  sample(out, fmt::format("{}_sum", name), labels, h.sum);
  sample(out, fmt::format("{}_count", name), labels, static_cast<double>(h.count));
}

}  // namespace spindle::proxy
