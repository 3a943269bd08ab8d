#include "spindle/proxy/admin.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "spindle/fiber/worker.h"
#include "spindle/io/timer_queue.h"
#include "spindle/sync/wait_group.h"

namespace spindle::proxy {
namespace {

constexpr std::string_view kTextFormat = "text/plain; version=0.0.4; charset=utf-8";

// Per target of `gateway`: its health, its pooled connections and the requests waiting for one
// of them, summed over the workers (each worker counts its own pool).
std::string target_metrics(Runtime& runtime, const Gateway& gateway,
                           http::UpstreamConnections& connections) {
  std::vector<const Gateway::Target*> targets;
  std::vector<const Gateway::Upstream*> owners;
  for (const Gateway::Upstream& u : gateway.upstreams()) {
    for (const Gateway::Target& t : u.targets) {
      targets.push_back(&t);
      owners.push_back(&u);
    }
  }
  std::vector<std::size_t> open(targets.size()), idle(targets.size()), waiting(targets.size());
  std::mutex lock;
  WaitGroup counted;
  for (std::size_t w = 0; w < runtime.size(); ++w) {
    counted.add();
    runtime.worker(w).post([&] {
      for (std::size_t i = 0; i < targets.size(); ++i) {
        std::size_t o = connections.open_connections(targets[i]->endpoint);
        std::size_t d = connections.idle(targets[i]->endpoint);
        std::size_t q = connections.waiting(targets[i]->endpoint);
        std::lock_guard guard(lock);
        open[i] += o;
        idle[i] += d;
        waiting[i] += q;
      }
      counted.done();
    });
  }
  // Not cancellable: the posted counts write into `open`, `idle` and `waiting` until they are
  // done.
  (void)counted.wait(Deadline::never(), kNotCancellable);

  std::string out;
  using namespace prometheus;
  auto labels = [&](std::size_t i) {
    // An upstream spoken to with several TLS settings has its targets once per variant:
    // the services of each tell them apart.
    std::string services =
        owners[i]->variants > 1
            ? fmt::format(",services=\"{}\"",
                          escape(fmt::format("{}", fmt::join(owners[i]->services, ","))))
            : std::string();
    return fmt::format("upstream=\"{}\",target=\"{}\"{}", escape(owners[i]->config->name),
                       escape(targets[i]->label), services);
  };
  family(out, "spindle_upstream_target_healthy", "gauge",
         "1 if the target takes requests (not ejected, not failing its health checks), else 0.");
  auto now = coarse_now();
  for (std::size_t i = 0; i < targets.size(); ++i) {
    sample(out, "spindle_upstream_target_healthy", labels(i),
           targets[i]->health->healthy(now) ? 1 : 0);
  }
  family(out, "spindle_upstream_connections", "gauge",
         "Connections to a target, open (busy or idle) and idle, over all workers.");
  for (std::size_t i = 0; i < targets.size(); ++i) {
    sample(out, "spindle_upstream_connections", labels(i) + ",state=\"open\"",
           static_cast<double>(open[i]));
    sample(out, "spindle_upstream_connections", labels(i) + ",state=\"idle\"",
           static_cast<double>(idle[i]));
  }
  family(out, "spindle_upstream_requests_waiting", "gauge",
         "Requests waiting for one of a target's limits.max_connections, over all workers.");
  for (std::size_t i = 0; i < targets.size(); ++i) {
    sample(out, "spindle_upstream_requests_waiting", labels(i), static_cast<double>(waiting[i]));
  }
  return out;
}

}  // namespace

http::Router admin_router(AdminSources sources) {
  http::Router router;
  auto shared = std::make_shared<AdminSources>(std::move(sources));
  router.get("/healthz", [](http::Request&) { return http::Response::text("ok\n"); });
  router.get("/ready", [shared](http::Request&) {
    if (shared->ready && !shared->ready()) {
      return http::Response(503, "draining\n", "text/plain");
    }
    return http::Response::text("ready\n");
  });
  router.get("/config", [shared](http::Request&) {
    return http::Response(200, shared->config_text ? shared->config_text() : "",
                          "application/yaml");
  });
  router.get("/metrics", [shared](http::Request&) {
    std::string out = shared->metrics ? shared->metrics->expose() : "";
    if (shared->gateways != nullptr && shared->connections != nullptr) {
      if (std::shared_ptr<Gateway> gateway = shared->gateways->current()) {
        out += target_metrics(shared->gateways->runtime(), *gateway, *shared->connections);
      }
    }
    if (shared->more_metrics) out += shared->more_metrics();
    return http::Response(200, std::move(out), kTextFormat);
  });
  return router;
}

}  // namespace spindle::proxy
