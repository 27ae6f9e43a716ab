// The few Unix socket calls Node's `net` cannot make for ZDS (the agent <-> ztunnel socket):
// SOCK_SEQPACKET listen/accept/connect, one datagram per sendmsg/recvmsg, SCM_RIGHTS fd passing,
// and readiness through the event loop's own uv_poll, so nothing blocks it. Every socket is
// nonblocking: a call that would block returns -EAGAIN and src/ambient/seqpacket.ts waits for
// readiness (watch) and calls again. Errors are returned as -errno numbers, never thrown, so the
// TS module builds one kind of Error (with `code`, as Node's) for all of them.
//
// And one ioctl for src/podnetns/userns.ts, which Node cannot make either: NS_GET_USERNS, the user
// namespace owning a pod's netns (a `hostUsers: false` pod's own). It lives in this addon, not a
// second one, so the agent ships and loads one native file (docs/plugin.md "User-namespaced pods").
//
// Built by scripts/native.ts with cc against node-api-headers (N-API, ABI-stable across Node
// versions) and libuv's uv.h (ABI-stable within libuv 1.x); every napi_* and uv_* symbol is
// resolved from the node process when the addon loads.

#define _GNU_SOURCE
#define NAPI_VERSION 8
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h> // fchmod
#include <sys/un.h>
#include <unistd.h>
#include <node_api.h>
#include <uv.h>

// The most fds one received message may carry; more comes back as MSG_CTRUNC (and ztunnel's
// protocol sends exactly one). The kernel's own limit per message (SCM_MAX_FD) is 253.
#define RECV_MAX_FDS 16
#define SEND_MAX_FDS 253

#define CHECK(call)                                                                                                    \
  do {                                                                                                                 \
    if ((call) != napi_ok) {                                                                                           \
      napi_throw_error(env, NULL, "seqpacket addon: " #call " failed");                                                \
      return NULL;                                                                                                     \
    }                                                                                                                  \
  } while (0)

static napi_value make_int(napi_env env, int64_t v) {
  napi_value out;
  if (napi_create_int64(env, v, &out) != napi_ok) return NULL;
  return out;
}

// out[i] = v; 1 on success.
static int set_int(napi_env env, napi_value out, uint32_t i, int64_t v) {
  napi_value n = make_int(env, v);
  return n != NULL && napi_set_element(env, out, i, n) == napi_ok;
}

static int get_args(napi_env env, napi_callback_info info, size_t want, napi_value *argv) {
  size_t argc = want;
  if (napi_get_cb_info(env, info, &argc, argv, NULL, NULL) != napi_ok || argc < want) {
    napi_throw_type_error(env, NULL, "seqpacket addon: missing arguments");
    return -1;
  }
  return 0;
}

static int get_int(napi_env env, napi_value v, int32_t *out) {
  if (napi_get_value_int32(env, v, out) != napi_ok) {
    napi_throw_type_error(env, NULL, "seqpacket addon: expected a number");
    return -1;
  }
  return 0;
}

// A path argument into a sockaddr_un: 0, -errno (-ENAMETOOLONG when it does not fit sun_path's
// 108 bytes), or 1 when it threw (not a string).
static int get_addr(napi_env env, napi_value v, struct sockaddr_un *addr) {
  size_t len = 0;
  memset(addr, 0, sizeof(*addr));
  addr->sun_family = AF_UNIX;
  if (napi_get_value_string_utf8(env, v, NULL, 0, &len) != napi_ok) {
    napi_throw_type_error(env, NULL, "seqpacket addon: expected a path string");
    return 1;
  }
  if (len == 0) return -EINVAL;
  if (len >= sizeof(addr->sun_path)) return -ENAMETOOLONG;
  napi_get_value_string_utf8(env, v, addr->sun_path, sizeof(addr->sun_path), &len);
  if (strlen(addr->sun_path) != len) return -EINVAL; // a NUL inside the path
  return 0;
}

// socket() -> fd | -errno
static napi_value js_socket(napi_env env, napi_callback_info info) {
  (void)info;
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  return make_int(env, fd < 0 ? -errno : fd);
}

// bind(fd, path, mode) -> 0 | -errno. The socket inode's mode is set before bind, and Linux
// creates the file with that mode less the umask: the path never exists with wider permissions
// (the TS adds back what the umask took, with a chmod).
static napi_value js_bind(napi_env env, napi_callback_info info) {
  napi_value argv[3];
  int32_t fd, mode;
  struct sockaddr_un addr;
  if (get_args(env, info, 3, argv) || get_int(env, argv[0], &fd) || get_int(env, argv[2], &mode)) return NULL;
  int r = get_addr(env, argv[1], &addr);
  if (r != 0) return r > 0 ? NULL : make_int(env, r);
  if (fchmod(fd, (mode_t)mode) < 0) return make_int(env, -errno);
  return make_int(env, bind(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0 ? -errno : 0);
}

// listen(fd, backlog) -> 0 | -errno
static napi_value js_listen(napi_env env, napi_callback_info info) {
  napi_value argv[2];
  int32_t fd, backlog;
  if (get_args(env, info, 2, argv) || get_int(env, argv[0], &fd) || get_int(env, argv[1], &backlog)) return NULL;
  return make_int(env, listen(fd, backlog) < 0 ? -errno : 0);
}

// accept(fd) -> new fd (nonblocking, close-on-exec) | -errno
static napi_value js_accept(napi_env env, napi_callback_info info) {
  napi_value argv[1];
  int32_t fd;
  if (get_args(env, info, 1, argv) || get_int(env, argv[0], &fd)) return NULL;
  int c = accept4(fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
  return make_int(env, c < 0 ? -errno : c);
}

// connect(fd, path) -> 0 | -errno (a Unix socket connects at once or fails; -EAGAIN: backlog full)
static napi_value js_connect(napi_env env, napi_callback_info info) {
  napi_value argv[2];
  int32_t fd;
  struct sockaddr_un addr;
  if (get_args(env, info, 2, argv) || get_int(env, argv[0], &fd)) return NULL;
  int r = get_addr(env, argv[1], &addr);
  if (r != 0) return r > 0 ? NULL : make_int(env, r);
  return make_int(env, connect(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0 ? -errno : 0);
}

// send(fd, data: Buffer, fds: number[]) -> bytes sent | -errno. One datagram, all or nothing;
// MSG_NOSIGNAL: a closed peer is -EPIPE, not a SIGPIPE that kills the agent.
static napi_value js_send(napi_env env, napi_callback_info info) {
  napi_value argv[3];
  int32_t fd;
  void *data;
  size_t len;
  uint32_t nfds;
  if (get_args(env, info, 3, argv) || get_int(env, argv[0], &fd)) return NULL;
  CHECK(napi_get_buffer_info(env, argv[1], &data, &len));
  CHECK(napi_get_array_length(env, argv[2], &nfds));
  if (nfds > SEND_MAX_FDS) return make_int(env, -EINVAL);

  union {
    char buf[CMSG_SPACE(sizeof(int) * SEND_MAX_FDS)];
    struct cmsghdr align;
  } control;
  memset(&control, 0, sizeof(control));
  struct iovec iov = {.iov_base = data, .iov_len = len};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
  if (nfds > 0) {
    msg.msg_control = control.buf;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
    struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
    int *out = (int *)CMSG_DATA(cmsg);
    for (uint32_t i = 0; i < nfds; i++) {
      napi_value el;
      int32_t v;
      CHECK(napi_get_element(env, argv[2], i, &el));
      if (get_int(env, el, &v)) return NULL;
      memcpy(out + i, &v, sizeof(v));
    }
  }
  ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
  return make_int(env, n < 0 ? -errno : n);
}

// recv(fd, into: Buffer) -> [bytes, msg_flags, ...fds] | -errno. The fds are close-on-exec
// (MSG_CMSG_CLOEXEC). When the message or its fds did not fit (MSG_TRUNC, MSG_CTRUNC) the fds
// that came are closed here and none are returned: the caller refuses the message, and nothing
// it refuses can leak.
static napi_value js_recv(napi_env env, napi_callback_info info) {
  napi_value argv[2];
  int32_t fd;
  void *data;
  size_t len;
  if (get_args(env, info, 2, argv) || get_int(env, argv[0], &fd)) return NULL;
  CHECK(napi_get_buffer_info(env, argv[1], &data, &len));

  union {
    char buf[CMSG_SPACE(sizeof(int) * RECV_MAX_FDS)];
    struct cmsghdr align;
  } control;
  struct iovec iov = {.iov_base = data, .iov_len = len};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
                       .msg_controllen = sizeof(control.buf)};
  ssize_t n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  if (n < 0) return make_int(env, -errno);

  int fds[RECV_MAX_FDS];
  size_t nfds = 0;
  for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c != NULL; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count && nfds < RECV_MAX_FDS; i++) memcpy(&fds[nfds++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
  }
  if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
    for (size_t i = 0; i < nfds; i++) close(fds[i]);
    nfds = 0;
  }

  // The fds are ours until JS holds their numbers: if the answer cannot be made (no memory), they
  // are closed here, or nothing would ever close them.
  napi_value out;
  int ok = napi_create_array_with_length(env, 2 + nfds, &out) == napi_ok && set_int(env, out, 0, n) &&
           set_int(env, out, 1, msg.msg_flags);
  for (size_t i = 0; ok && i < nfds; i++) ok = set_int(env, out, (uint32_t)(2 + i), fds[i]);
  if (!ok) {
    for (size_t i = 0; i < nfds; i++) close(fds[i]);
    napi_throw_error(env, NULL, "seqpacket addon: cannot hand a received message to JS (its fds were closed)");
    return NULL;
  }
  return out;
}

// close(fd) -> 0 | -errno
static napi_value js_close(napi_env env, napi_callback_info info) {
  napi_value argv[1];
  int32_t fd;
  if (get_args(env, info, 1, argv) || get_int(env, argv[0], &fd)) return NULL;
  return make_int(env, close(fd) < 0 ? -errno : 0);
}

// _IO(0xb7, 0x1) of <linux/nsfs.h>, spelled out: that header is not in every libc's set.
#define MESH_NS_GET_USERNS _IO(0xb7, 0x1)

// nsGetUserns(fd) -> fd of the user namespace owning the namespace `fd` names (close-on-exec: the
// kernel opens it so) | -errno (-ENOTTY before Linux 4.9, -EPERM when that user namespace is
// outside ours).
static napi_value js_ns_get_userns(napi_env env, napi_callback_info info) {
  napi_value argv[1];
  int32_t fd;
  if (get_args(env, info, 1, argv) || get_int(env, argv[0], &fd)) return NULL;
  int r = ioctl(fd, MESH_NS_GET_USERNS);
  return make_int(env, r < 0 ? -errno : r);
}

// Readiness. One watch per fd for its whole life (libuv allows one active poll handle per fd),
// its events changed with setEvents; 0 stops it, and a stopped watch keeps no event loop alive.
// The JS handle is an external; the struct is freed once both libuv has closed the handle and the
// external was collected, so a stale handle used again is a no-op, never a use after free.
typedef struct {
  uv_poll_t poll; // first: libuv hands back &poll
  napi_env env;
  napi_ref callback;
  napi_async_context async;
  int closing;
  int uv_closed;
  int finalized;
} watch_t;

static void watch_maybe_free(watch_t *w) {
  if (w->uv_closed && w->finalized) free(w);
}

static void on_poll(uv_poll_t *handle, int status, int events) {
  watch_t *w = (watch_t *)handle;
  if (w->closing) return;
  napi_env env = w->env;
  napi_handle_scope scope;
  if (napi_open_handle_scope(env, &scope) != napi_ok) return;
  napi_value cb, global, result, argv[2];
  // napi_make_callback runs the microtasks (promise reactions) after the callback, as any Node
  // callback; its receiver must be an object, so it is the global.
  if (napi_get_reference_value(env, w->callback, &cb) == napi_ok && napi_get_global(env, &global) == napi_ok &&
      napi_create_int32(env, status, &argv[0]) == napi_ok && napi_create_int32(env, events, &argv[1]) == napi_ok) {
    if (napi_make_callback(env, w->async, global, cb, 2, argv, &result) == napi_pending_exception) {
      napi_value err;
      napi_get_and_clear_last_exception(env, &err);
      napi_fatal_exception(env, err);
    }
  }
  napi_close_handle_scope(env, scope);
}

static void on_close(uv_handle_t *handle) {
  watch_t *w = (watch_t *)handle;
  napi_delete_reference(w->env, w->callback);
  napi_async_destroy(w->env, w->async);
  w->uv_closed = 1;
  watch_maybe_free(w);
}

static void on_finalize(napi_env env, void *data, void *hint) {
  (void)env;
  (void)hint;
  watch_t *w = data;
  w->finalized = 1;
  watch_maybe_free(w);
}

static int get_watch(napi_env env, napi_value v, watch_t **out) {
  if (napi_get_value_external(env, v, (void **)out) != napi_ok) {
    napi_throw_type_error(env, NULL, "seqpacket addon: expected a watch handle");
    return -1;
  }
  return 0;
}

// watch(fd, events, callback(status, events)) -> handle (events: READABLE|WRITABLE; 0 idle)
static napi_value js_watch(napi_env env, napi_callback_info info) {
  napi_value argv[3], name, resource, handle;
  int32_t fd, events;
  uv_loop_t *loop;
  if (get_args(env, info, 3, argv) || get_int(env, argv[0], &fd) || get_int(env, argv[1], &events)) return NULL;
  CHECK(napi_get_uv_event_loop(env, &loop));
  watch_t *w = calloc(1, sizeof(*w));
  if (w == NULL) {
    napi_throw_error(env, "ENOMEM", "seqpacket addon: out of memory");
    return NULL;
  }
  w->env = env;
  int r = uv_poll_init(loop, &w->poll, fd);
  if (r < 0) {
    free(w);
    return make_int(env, r); // libuv's codes are -errno on Linux
  }
  if (napi_create_reference(env, argv[2], 1, &w->callback) != napi_ok ||
      napi_create_string_utf8(env, "mesh-cni:seqpacket", NAPI_AUTO_LENGTH, &name) != napi_ok ||
      napi_create_object(env, &resource) != napi_ok || napi_async_init(env, resource, name, &w->async) != napi_ok ||
      napi_create_external(env, w, on_finalize, NULL, &handle) != napi_ok) {
    // A watch half made: let libuv forget the handle, then free it in on_close.
    w->closing = 1;
    w->finalized = 1;
    uv_close((uv_handle_t *)&w->poll, on_close);
    napi_throw_error(env, NULL, "seqpacket addon: cannot create a watch");
    return NULL;
  }
  if (events != 0 && (r = uv_poll_start(&w->poll, events, on_poll)) < 0) {
    w->closing = 1;
    uv_close((uv_handle_t *)&w->poll, on_close);
    return make_int(env, r);
  }
  return handle;
}

// setEvents(handle, events) -> 0 | -errno
static napi_value js_set_events(napi_env env, napi_callback_info info) {
  napi_value argv[2];
  watch_t *w;
  int32_t events;
  if (get_args(env, info, 2, argv) || get_watch(env, argv[0], &w) || get_int(env, argv[1], &events)) return NULL;
  if (w->closing) return make_int(env, -EBADF);
  int r = events == 0 ? uv_poll_stop(&w->poll) : uv_poll_start(&w->poll, events, on_poll);
  return make_int(env, r);
}

// unwatch(handle): stops and closes the watch; idempotent. Call it before closing the fd.
static napi_value js_unwatch(napi_env env, napi_callback_info info) {
  napi_value argv[1];
  watch_t *w;
  if (get_args(env, info, 1, argv) || get_watch(env, argv[0], &w)) return NULL;
  if (!w->closing) {
    w->closing = 1;
    uv_poll_stop(&w->poll);
    uv_close((uv_handle_t *)&w->poll, on_close);
  }
  return make_int(env, 0);
}

NAPI_MODULE_INIT(/* napi_env env, napi_value exports */) {
  struct {
    const char *name;
    napi_callback fn;
  } fns[] = {
      {"socket", js_socket}, {"bind", js_bind},       {"listen", js_listen},       {"accept", js_accept},
      {"connect", js_connect}, {"send", js_send},     {"recv", js_recv},           {"close", js_close},
      {"watch", js_watch},   {"setEvents", js_set_events}, {"unwatch", js_unwatch},
      {"nsGetUserns", js_ns_get_userns},
  };
  for (size_t i = 0; i < sizeof(fns) / sizeof(fns[0]); i++) {
    napi_value f;
    CHECK(napi_create_function(env, fns[i].name, NAPI_AUTO_LENGTH, fns[i].fn, NULL, &f));
    CHECK(napi_set_named_property(env, exports, fns[i].name, f));
  }
  struct {
    const char *name;
    int value;
  } consts[] = {
      {"READABLE", UV_READABLE}, {"WRITABLE", UV_WRITABLE}, {"MSG_TRUNC", MSG_TRUNC},
      {"MSG_CTRUNC", MSG_CTRUNC}, {"RECV_MAX_FDS", RECV_MAX_FDS}, {"SEND_MAX_FDS", SEND_MAX_FDS},
  };
  for (size_t i = 0; i < sizeof(consts) / sizeof(consts[0]); i++)
    CHECK(napi_set_named_property(env, exports, consts[i].name, make_int(env, consts[i].value)));
  return exports;
}
