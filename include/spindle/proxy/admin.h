#pragma once
/// The admin listener's routes: /metrics (Prometheus text), /healthz, /ready, /config.

#include <functional>
#include <string>

#include "spindle/client/exchange.h"
#include "spindle/proxy/gateway.h"
#include "spindle/proxy/metrics.h"
#include "spindle/server/router.h"

namespace spindle::proxy {

/// Where the admin routes read what they show. Every function is called on a worker, from
/// the handler's fiber.
struct AdminSources {
  Metrics* metrics = nullptr;
  Gateways* gateways = nullptr;
  http::UpstreamConnections* connections = nullptr;
  /// False while the process drains (then /ready answers 503).
  std::function<bool()> ready;
  /// The configuration in force, secrets redacted.
  std::function<std::string()> config_text;
  /// More of /metrics, already in the text format (the process's own gauges and counters).
  std::function<std::string()> more_metrics;
};

/// GET /metrics: the request and upstream series, then per target of the gateway in force
/// its health (1 healthy, 0 not) and its pooled connections (open and idle, over the
/// workers), then `more_metrics`. GET /healthz: 200 while the process runs. GET /ready: 200,
/// or 503 while draining. GET /config: the configuration in force (YAML, secrets redacted).
http::Router admin_router(AdminSources sources);

}  // namespace spindle::proxy
