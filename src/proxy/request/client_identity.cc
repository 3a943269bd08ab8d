#include "client_identity.h"

#include <algorithm>

namespace spindle::proxy::detail {
namespace {

// Where a request keeps its client once derived (not logged: their names start with '_').
constexpr std::string_view kClientAttribute = "_client";
constexpr std::string_view kForwardedForAttribute = "_forwarded_for";

bool is_trusted(const std::vector<Cidr>& trusted, const Address& address) {
  return std::ranges::any_of(trusted, [&](const Cidr& cidr) { return cidr.contains(address); });
}

}  // namespace

bool client_is_the_peer(const http::RequestContext& context, const std::vector<Cidr>& trusted) {
  if (context.peer == nullptr || context.peer->family() == Address::Family::kUnix) return true;
  return !context.peer->is_v4_mapped() && !is_trusted(trusted, *context.peer);
}

ClientIdentity identify_client(const http::Request& request, const std::vector<Cidr>& trusted) {
  const http::RequestContext& context = request.context();
  ClientIdentity client;
  if (client_is_the_peer(context, trusted)) {  // most peers: their address is all there is
    client.text = std::string(context.remote);
    client.forwarded_for = client.text;
    return client;
  }
  // An IPv4-mapped peer, or a trusted one. The hops from this gateway outwards: the peer first.
  Address peer = context.peer->unmapped();
  if (!is_trusted(trusted, peer)) {
    client.text = peer.host_text();
    client.forwarded_for = client.text;
    return client;
  }
  std::vector<Address> hops{peer};
  {
    std::vector<std::string_view> entries;
    for (const http::Field& f : request.headers()) {
      if (f.token != &http::token::kXForwardedFor) continue;
      http::for_each_list_item(f.value, [&](std::string_view item) { entries.push_back(item); });
    }
    for (auto entry = entries.rbegin(); entry != entries.rend(); ++entry) {
      auto address = Address::parse_host(*entry);
      if (!address) break;  // not an address: the hop that wrote it is the client
      hops.push_back(*address);
      if (!is_trusted(trusted, *address)) break;
    }
  }
  client.text = hops.back().host_text();
  for (auto hop = hops.rbegin(); hop != hops.rend(); ++hop) {
    if (!client.forwarded_for.empty()) client.forwarded_for += ", ";
    client.forwarded_for += hop->host_text();
  }
  return client;
}

void note_client(http::Request& request, const ServerConfig& server) {
  if (client_is_the_peer(request.context(), server.trusted_proxies)) return;
  if (!request.attribute(kClientAttribute).empty()) return;
  ClientIdentity client = identify_client(request, server.trusted_proxies);
  request.set_attribute(kClientAttribute, client.text);
  request.set_attribute(kForwardedForAttribute, client.forwarded_for);
}

std::string_view client_text(const http::Request& request) {
  std::string_view noted = request.attribute(kClientAttribute);
  return noted.empty() ? request.context().remote : noted;
}

std::string_view noted_forwarded_for(const http::Request& request) {
  return request.attribute(kForwardedForAttribute);
}

}  // namespace spindle::proxy::detail
