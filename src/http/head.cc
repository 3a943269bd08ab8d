#include "spindle/http/head.h"

namespace spindle::http {

void RequestHead::clear() {
  method = {};
  target = {};
  authority = {};
  minor_version = 1;
  headers.clear();
  content_length.reset();
  chunked = false;
  keep_alive = true;
  expect_continue = false;
  protocol = {};
}

void ResponseHead::clear() {
  status = 0;
  reason = {};
  minor_version = 1;
  headers.clear();
  content_length.reset();
  chunked = false;
  framing = {};
  keep_alive = true;
}

}  // namespace spindle::http
