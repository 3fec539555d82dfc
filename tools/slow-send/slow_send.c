/* librankscope-slow-send.so: a slow link for one process, for
 * scripts/gpu-check.sh on machines where no tc or network namespace can
 * slow one (LD_PRELOAD it into a rank). Each send() of more than 4 KiB is
 * paced to the rate, in MB/s, written in the file that
 * RANKSCOPE_SLOW_SEND_FILE names: the call returns after the time the bytes
 * it sent take at that rate. A missing or empty file, or 0, is full speed.
 * The file is read again at most every 50 ms per thread. NCCL's socket
 * transport sends with send(): its proxy then waits that long on the
 * network (SendWait), as on a slow link. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

static double rate_mb_per_s(void) {
  static __thread double rate;
  static __thread struct timespec read_at;
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  if ((now.tv_sec - read_at.tv_sec) * 1e9 + (double)(now.tv_nsec - read_at.tv_nsec) < 50e6) return rate;
  read_at = now;
  rate = 0;
  const char* path = getenv("RANKSCOPE_SLOW_SEND_FILE");
  FILE* file = path ? fopen(path, "re") : NULL;
  if (file) {
    if (fscanf(file, "%lf", &rate) != 1 || rate < 0) rate = 0;
    fclose(file);
  }
  return rate;
}

ssize_t send(int fd, const void* buf, size_t len, int flags) {
  static ssize_t (*real_send)(int, const void*, size_t, int);
  if (!real_send) real_send = (ssize_t(*)(int, const void*, size_t, int))dlsym(RTLD_NEXT, "send");
  ssize_t sent = real_send(fd, buf, len, flags);
  if (sent > 4096) {
    double rate = rate_mb_per_s();
    if (rate > 0) {
      double seconds = (double)sent / (rate * 1e6);
      struct timespec pause = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
      nanosleep(&pause, NULL);
    }
  }
  return sent;
}
