/*
 * The sandbox ("pause") process of the CRI tests' and benchmarks' own image (cri-containerd.ts
 * compiles it with gcc -static and packs it as an image, so nothing comes from a registry).
 * It holds the pod's namespaces open: it sleeps until SIGTERM or SIGINT (the runtime's stop) and
 * reaps any child it inherits as the pod's PID 1.
 */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_stop(int sig) {
  (void)sig;
  _exit(0);
}

static void on_child(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(void) {
  struct sigaction stop = {0}, child = {0};
  stop.sa_handler = on_stop;
  child.sa_handler = on_child;
  child.sa_flags = SA_NOCLDSTOP | SA_RESTART;
  if (sigaction(SIGTERM, &stop, NULL) || sigaction(SIGINT, &stop, NULL) || sigaction(SIGCHLD, &child, NULL)) return 1;
  for (;;) pause();
}
