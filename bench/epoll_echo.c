#define _GNU_SOURCE
/* The baseline for spindle's echo: a plain single-threaded, edge-triggered epoll echo server
 * in C, as small as such a server gets. Usage: epoll_echo PORT (binds 127.0.0.1). */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_EVENTS 256
#define BUFFER 16384

struct conn {
  int fd;
  size_t pending; /* bytes read but not yet written back */
  size_t offset;
  char data[BUFFER];
};

/* Writes what is pending; returns -1 if the connection failed. */
static int flush(struct conn* c) {
  while (c->pending > 0) {
    ssize_t n = send(c->fd, c->data + c->offset, c->pending, MSG_NOSIGNAL);
    if (n < 0) return (errno == EAGAIN) ? 0 : -1;
    c->offset += (size_t)n;
    c->pending -= (size_t)n;
  }
  c->offset = 0;
  return 0;
}

/* Echoes until the socket has nothing more or the output must wait; -1 on close/error.
 * Only what the event asks for: no recv on a bare EPOLLOUT, no send with nothing pending. */
static int serve(struct conn* c, unsigned events) {
  if (c->pending > 0 && flush(c) < 0) return -1;
  if (!(events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))) return 0;
  while (c->pending == 0) {
    ssize_t n = recv(c->fd, c->data, BUFFER, 0);
    if (n == 0) return -1;
    if (n < 0) return (errno == EAGAIN) ? 0 : -1;
    c->pending = (size_t)n;
    c->offset = 0;
    if (flush(c) < 0) return -1;
  }
  return 0;
}

int main(int argc, char** argv) {
  int port = argc > 1 ? atoi(argv[1]) : 7001;
  int listener = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  int one = 1;
  setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((unsigned short)port)};
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(listener, (struct sockaddr*)&addr, sizeof addr) != 0 || listen(listener, 1024) != 0) {
    perror("epoll_echo: bind/listen");
    return 1;
  }
  int ep = epoll_create1(0);
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
  epoll_ctl(ep, EPOLL_CTL_ADD, listener, &ev);
  printf("epoll_echo: listening on 127.0.0.1:%d\n", port);
  fflush(stdout);

  struct epoll_event events[MAX_EVENTS];
  for (;;) {
    int n = epoll_wait(ep, events, MAX_EVENTS, -1);
    for (int i = 0; i < n; ++i) {
      struct conn* c = events[i].data.ptr;
      if (c == NULL) {
        int fd;
        while ((fd = accept4(listener, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
          setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          struct conn* nc = calloc(1, sizeof *nc);
          nc->fd = fd;
          struct epoll_event cev = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET,
                                    .data.ptr = nc};
          epoll_ctl(ep, EPOLL_CTL_ADD, fd, &cev);
        }
        continue;
      }
      if (serve(c, events[i].events) < 0) {
        close(c->fd);
        free(c);
      }
    }
  }
}
