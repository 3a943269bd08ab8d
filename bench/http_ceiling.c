/* The ceiling for HTTP benchmarks on this machine: a single-threaded edge-triggered epoll
 * server that parses nothing. It counts request ends ("\r\n\r\n") and answers each with one
 * fixed response, batched into one write. No real server can do less per request.
 * Usage: http_ceiling PORT (binds 127.0.0.1). */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

static const char kResponse[] =
    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 13\r\n\r\nHello, World!";

struct conn {
  int fd;
  unsigned tail; /* the last bytes seen, to find "\r\n\r\n" across reads */
};

/* The request ends ("\r\n\r\n") in in[0, n), the first three bytes with the last ones of
 * the previous read; past them at the speed of memchr over the LFs (a byte at a time, a
 * browser's 700 bytes of fields cost this loop more than a real parser spends on them). */
static size_t count_ends(struct conn* c, const char* in, size_t n) {
  size_t ends = 0;
  for (size_t i = 0; i < n && i < 3; ++i) {
    c->tail = (c->tail << 8) | (unsigned char)in[i];
    if (c->tail == 0x0d0a0d0a) ++ends;
  }
  const char* end = in + n;
  for (const char* p = in + 3; p < end && (p = memchr(p, '\n', (size_t)(end - p))) != NULL; ++p) {
    if (p[-1] == '\r' && p[-2] == '\n' && p[-3] == '\r') ++ends;
  }
  if (n >= 4) {
    c->tail = (unsigned)(unsigned char)end[-4] << 24 | (unsigned)(unsigned char)end[-3] << 16 |
              (unsigned)(unsigned char)end[-2] << 8 | (unsigned char)end[-1];
  }
  return ends;
}

static void serve(struct conn* c) {
  static char in[65536];
  static char out[64 * (sizeof kResponse - 1)];
  for (;;) {
    ssize_t n = recv(c->fd, in, sizeof in, 0);
    if (n == 0 || (n < 0 && errno != EAGAIN)) {
      close(c->fd);
      free(c);
      return;
    }
    if (n < 0) return;
    size_t responses = count_ends(c, in, (size_t)n);
    while (responses > 0) {
      size_t batch = responses > 64 ? 64 : responses;
      for (size_t i = 0; i < batch; ++i) {
        memcpy(out + i * (sizeof kResponse - 1), kResponse, sizeof kResponse - 1);
      }
      if (send(c->fd, out, batch * (sizeof kResponse - 1), MSG_NOSIGNAL) < 0) break;
      responses -= batch;
    }
  }
}

int main(int argc, char** argv) {
  int port = argc > 1 ? atoi(argv[1]) : 7002;
  int listener = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  int one = 1;
  setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((unsigned short)port)};
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(listener, (struct sockaddr*)&addr, sizeof addr) != 0 || listen(listener, 4096) != 0) {
    perror("http_ceiling: bind/listen");
    return 1;
  }
  int ep = epoll_create1(0);
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
  epoll_ctl(ep, EPOLL_CTL_ADD, listener, &ev);
  printf("http_ceiling: listening on 127.0.0.1:%d\n", port);
  fflush(stdout);
  struct epoll_event events[256];
  for (;;) {
    int n = epoll_wait(ep, events, 256, -1);
    for (int i = 0; i < n; ++i) {
      struct conn* c = events[i].data.ptr;
      if (c != NULL) {
        serve(c);
        continue;
      }
      int fd;
      while ((fd = accept4(listener, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        struct conn* nc = calloc(1, sizeof *nc);
        nc->fd = fd;
        struct epoll_event cev = {.events = EPOLLIN | EPOLLRDHUP | EPOLLET, .data.ptr = nc};
        epoll_ctl(ep, EPOLL_CTL_ADD, fd, &cev);
      }
    }
  }
}
