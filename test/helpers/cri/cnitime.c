/*
 * A timing shim for CNI plugins, for the CRI benchmark (scripts/bench/lib/cri-bench.ts): copied
 * into the benchmark's own CNI bin dir under each plugin's name (bridge, portmap, mesh-cni...),
 * it runs the real plugin of that name from the `real/` dir beside it with the same argv, stdin,
 * stdout, stderr and environment, and appends one line per call to ../cni-calls.log:
 *   <plugin> <CNI_COMMAND> <CNI_CONTAINERID> <start ns> <end ns> <exit code>
 * on CLOCK_MONOTONIC (which node's process.hrtime also reads), then exits with the plugin's code.
 * It adds one fork + exec of a small static program per plugin call, to every network alike.
 */
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long long now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

int main(int argc, char **argv) {
  (void)argc;
  char self[PATH_MAX], real[PATH_MAX + 64], log[PATH_MAX + 64];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return 127;
  self[n] = 0;
  char *slash = strrchr(self, '/');
  if (!slash) return 127;
  *slash = 0;
  snprintf(real, sizeof real, "%s/real/%s", self, slash + 1);
  snprintf(log, sizeof log, "%s/../cni-calls.log", self);

  long long start = now_ns();
  pid_t pid = fork();
  if (pid < 0) return 127;
  if (pid == 0) {
    argv[0] = real;
    execv(real, argv);
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
  }
  long long end = now_ns();
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);

  const char *cmd = getenv("CNI_COMMAND"), *id = getenv("CNI_CONTAINERID");
  char line[512];
  int len = snprintf(line, sizeof line, "%s %s %s %lld %lld %d\n", slash + 1, cmd && *cmd ? cmd : "-",
                     id && *id ? id : "-", start, end, code);
  int fd = open(log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
  if (fd >= 0) {
    /* one write of a short line: O_APPEND keeps concurrent calls' lines whole */
    if (write(fd, line, (size_t)len) < 0) {
    }
    close(fd);
  }
  return code;
}
