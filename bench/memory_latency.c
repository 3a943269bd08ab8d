// What a cold read costs on this machine, by how much memory is being read: one cache line in
// each of N pages, visited in a random order (each read's address comes from the read before,
// so none overlaps the next), on 4 KiB pages and on 2 MiB pages (transparent huge pages,
// MADV_HUGEPAGE). A gateway holding a thousand requests in flight touches each one's state
// once per turn of its life in an order much like that; the curve says from what amount of
// such state a touch stops being a cache hit, and what a TLB miss adds to it.
//
//   memory_latency            (about 10 s, up to 512 MiB mapped; prints a line per size)
//
// The lines are spread one per page so that the 4 KiB-page figure includes a TLB miss once the
// pages outnumber the TLB's entries; with huge pages the same lines sit in 512 times fewer
// pages. docs/performance.md, "Where a thousand requests in flight cost", has what it found.
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

enum { kPage = 4096, kLine = 64, kHuge = 2 << 20 };

static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

// A xorshift generator: the same order on every run.
static uint64_t next_random(uint64_t* state) {
  uint64_t x = *state;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return *state = x;
}

// Nanoseconds a read, chasing `lines` lines (one per page, at a random offset in it) in a
// random cycle, on huge pages or not. Negative on failure.
static double chase(size_t lines, int huge) {
  const size_t size = lines * kPage;
  char* mapped =
      mmap(NULL, size + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapped == MAP_FAILED) return -1;
  char* base = (char*)(((uintptr_t)mapped + kHuge - 1) & ~(uintptr_t)(kHuge - 1));
  madvise(base, size, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  memset(base, 0, size);
  size_t* order = malloc(lines * sizeof *order);
  if (order == NULL) return -1;
  uint64_t state = 0x9e3779b97f4a7c15u;
  for (size_t i = 0; i < lines; ++i) {
    order[i] = i * kPage + (next_random(&state) % (kPage / kLine)) * kLine;
  }
  for (size_t i = lines - 1; i > 0; --i) {  // a random cycle through every line
    size_t j = next_random(&state) % (i + 1);
    size_t t = order[i];
    order[i] = order[j];
    order[j] = t;
  }
  for (size_t i = 0; i < lines; ++i) {
    *(char**)(base + order[i]) = base + order[(i + 1) % lines];
  }
  char* p = base + order[0];
  free(order);
  // (The empty asm makes each read's result one the compiler must produce.)
  for (size_t i = 0; i < 2 * lines; ++i) {  // warm: every line, twice
    p = *(char**)p;
    __asm__ volatile("" : "+r"(p));
  }
  const size_t reads = 4000000;
  double start = now_ns();
  for (size_t i = 0; i < reads; ++i) {
    p = *(char**)p;
    __asm__ volatile("" : "+r"(p));
  }
  double took = now_ns() - start;
  munmap(mapped, size + kHuge);
  return took / (double)reads;
}

int main(void) {
  static const size_t kKiB[] = {64, 128, 256, 512, 768, 1024, 1536, 2048, 3072, 4096, 8192};
  printf("lines read, one per page, random order: ns a read\n");
  printf("%10s %10s %12s %12s\n", "lines", "of data", "4 KiB pages", "2 MiB pages");
  for (size_t i = 0; i < sizeof kKiB / sizeof kKiB[0]; ++i) {
    const size_t lines = kKiB[i] * 1024 / kLine;
    double small = chase(lines, 0), huge = chase(lines, 1);
    if (small < 0 || huge < 0) {
      fprintf(stderr, "memory_latency: cannot map %zu MiB\n", lines * kPage >> 20);
      return 1;
    }
    printf("%10zu %7zu KiB %9.1f ns %9.1f ns\n", lines, kKiB[i], small, huge);
    fflush(stdout);
  }
  return 0;
}
